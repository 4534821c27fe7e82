"""Atomic files: every file written to a temporary sibling, flushed and
renamed into place, so that a process killed at any point leaves the old or
the new version of a file, never a torn one.

Used by the job's work directory (:mod:`xmc_tf.job.workdir`), the training
checkpoint, the best-weights files of :class:`xmc_tf.callbacks.EarlyStopping`
and the data cache (:mod:`xmc_tf.data.cache`).
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil

__all__ = ["atomic_path", "write_json_atomic", "write_bytes_atomic",
           "replace_dir", "fingerprint", "discard_hint", "remove_path",
           "fsync_dir"]


def fsync_dir(path: str) -> None:
    """Flushes the directory entry of ``path`` to disk (where the file
    system can)."""
    try:
        fd = os.open(path or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some file systems cannot fsync a directory
        pass
    finally:
        os.close(fd)


def _fsync_tree(path: str) -> None:
    """Flushes a file, or every file and directory under `path`, to disk."""
    if os.path.isdir(path):
        for root, _, files in os.walk(path):
            for name in files:
                _fsync_tree(os.path.join(root, name))
            fsync_dir(root)
        return
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def _temp_sibling(path: str, tag: str = "tmp") -> str:
    """``DIR/.NAME.TAG-PID.EXT`` beside ``path``, keeping the extension (Keras
    insists on ``.keras``)."""
    directory, name = os.path.split(path)
    stem, ext = os.path.splitext(name)
    return os.path.join(directory, f".{stem}.{tag}-{os.getpid()}{ext}")


def remove_path(path: str) -> None:
    """Deletes a file or a directory tree; nothing if absent."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.remove(path)


@contextlib.contextmanager
def atomic_path(path: str):
    """Yields a temporary path beside ``path``; renames it to ``path`` on
    success.

    Write the file (or directory) at the yielded path; when the block exits
    without an exception it is flushed to disk (``fsync``) and renamed over
    ``path`` (``os.replace`` for a file, :func:`replace_dir` for a
    directory), so readers see the old or the new version, never a torn
    one.  On an exception the temporary is removed and ``path`` is left as
    it was.

    Args:
      path: the destination file or directory.

    Yields:
      ``str``: ``DIR/.NAME.tmp-PID.EXT``, not existing yet.

    Raises:
      OSError: the rename failed (e.g. no space left).

    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with atomic_path(os.path.join(d, "a.txt")) as tmp:
    ...     _ = open(tmp, "w").write("new")
    >>> open(os.path.join(d, "a.txt")).read()
    'new'
    """
    tmp = _temp_sibling(path)
    remove_path(tmp)
    try:
        yield tmp
        if not os.path.lexists(tmp):
            raise FileNotFoundError(errno.ENOENT, "nothing was written", tmp)
        _fsync_tree(tmp)
        if os.path.isdir(tmp):
            replace_dir(tmp, path)
        else:
            os.replace(tmp, path)
            fsync_dir(os.path.dirname(path))
    except BaseException:
        remove_path(tmp)
        raise


def replace_dir(new: str, path: str) -> None:
    """Puts directory ``new`` at ``path``, replacing a directory there.

    POSIX cannot rename a directory over a non-empty one, so the old one is
    first renamed aside (``.NAME.old-PID``), then ``new`` renamed in, then
    the old one deleted: a kill in between leaves ``path`` absent (never a
    mix of old and new files); :meth:`Workdir.clean_leftovers` removes the
    aside copy.

    Args:
      new: an existing directory on the same file system as ``path``.
      path: the destination.
    """
    old = None
    if os.path.lexists(path):
        old = _temp_sibling(path, "old")
        remove_path(old)
        os.replace(path, old)
    os.replace(new, path)
    fsync_dir(os.path.dirname(path))
    if old is not None:
        remove_path(old)


def write_bytes_atomic(path: str, data: bytes) -> None:
    """Writes ``data`` to ``path`` atomically (see :func:`atomic_path`)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(data)


def write_json_atomic(path: str, obj) -> None:
    """Writes ``obj`` as indented, key-sorted JSON to ``path`` atomically."""
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True)
                              + "\n").encode())


def fingerprint(path: str) -> str:
    """``"sha256:HEX"`` of a file, or of a directory tree (sorted relative
    paths and the contents of its files).

    Raises:
      OSError: ``path`` cannot be read.
    """
    def file_digest(name):
        h = hashlib.sha256()
        with open(name, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    if not os.path.isdir(path):
        if not os.path.exists(path):
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT),
                                    path)
        return "sha256:" + file_digest(path)
    h = hashlib.sha256()
    for root, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            full = os.path.join(root, name)
            rel = os.path.relpath(full, path).replace(os.sep, "/")
            h.update(f"{rel}\0{file_digest(full)}\n".encode())
    return "sha256:" + h.hexdigest()



def discard_hint(directory: str) -> str:
    """How to discard the backup ``directory`` of a workdir, for the end of
    an error message about it: ``rm -r`` it, or ``--overwrite`` (which also
    discards the workdir's results).

    Args:
      directory: the backup directory (``WORKDIR/backup``).

    Returns:
      ``"discard it with `rm -r DIR` to start over (or rerun with
      --overwrite, which also discards WORKDIR's results)"``.
    """
    workdir = os.path.dirname(os.path.abspath(directory))
    return (f"discard it with `rm -r {directory}` to start over (or rerun "
            f"with --overwrite, which also discards {workdir}'s results)")


