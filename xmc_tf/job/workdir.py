"""The work directory of a training run: lock, completion marker, atomic files.

Layout of ``WORKDIR`` (``xmc-tf train --workdir=WORKDIR``)::

    .lock                 advisory fcntl lock; while held: the owner's pid,
                          host, start time and command (JSON)
    config.json           the run's config
    preprocessing.npz     feature normalisation fitted on the training set
    inv_propensities.npy  PSP@k weights of the training labels
    history.csv           one row per finished epoch (rewritten from backup/)
    backup/checkpoint.npz the whole training state (xmc_tf.job.checkpoint);
                          kept until the export is complete
    model.keras           the trained model  } renamed into place
    saved_model/          TF SavedModel      } when complete
    metrics.json          written last; its ``"run"`` field (run id and the
                          fingerprints of the files above) marks the workdir
                          complete

Every file is written to a temporary sibling (``.NAME.tmp-PID``), flushed to
disk and renamed into place, so a process killed at any point leaves either
the old or the new version of a file, never a torn one.  ``metrics.json`` is
renamed last: a workdir whose ``metrics.json`` fingerprints match its model
files holds a complete run (:meth:`Workdir.check_complete`), anything else is
incomplete and is reported as such by ``xmc-tf evaluate``/``predict``.

Errors the user can fix -- a bad config, bad data, a busy, finished or
incomplete workdir, a corrupt backup -- are :class:`UserError` subclasses
(:mod:`xmc_tf.errors`); the ``xmc-tf`` command prints them
as one line (``xmc-tf: error: ...``).
"""

from __future__ import annotations

import contextlib
import datetime
import fcntl
import json
import os
import socket
import sys
import uuid

from xmc_tf.errors import (IncompleteWorkdir, WorkdirBusy, WorkdirError,
                           WorkdirFinished)
from xmc_tf.files import (fingerprint, fsync_dir, remove_path,
                          write_json_atomic)

__all__ = ["Workdir", "WorkdirLock"]


# ---------------------------------------------------------------------------
# The lock.


def _process_start_ticks(pid: int) -> int | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux), to
    tell a live owner from a new process that reuses its pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode(errors="replace")
        return int(stat.rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def _pid_alive(pid: int, start_ticks) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    ticks = _process_start_ticks(pid)
    return start_ticks is None or ticks is None or ticks == start_ticks


def _describe(owner: dict) -> str:
    return (f"pid {owner.get('pid', '?')} on {owner.get('host', '?')}, "
            f"started {owner.get('started', '?')}: "
            f"{owner.get('command', '?')!s}")


class WorkdirLock:
    """Advisory exclusive lock of a work directory (``WORKDIR/.lock``).

    ``fcntl.flock`` on ``WORKDIR/.lock``: the kernel releases it when the
    owner exits, however it dies.  While held, the file records the owner
    (pid, host, start time, command line) so that a second ``xmc-tf train``
    on the same workdir fails with a message naming it.  A lock can be
    *stale* -- held although its owner is gone (an orphaned child process
    that inherited the descriptor, a lock left on a network file system) --
    and ``force=True`` takes such a lock over; a lock whose owner is alive
    on this host is never taken over.

    Args:
      workdir: the work directory (created if missing).
      force: take over a stale lock, or one owned by a process on another
        host (whose liveness cannot be checked).

    Raises (from :meth:`acquire` / ``with``):
      WorkdirBusy: the lock is held (message names the owner and, for a
        stale lock, says to pass ``--force``).

    >>> import tempfile
    >>> with WorkdirLock(tempfile.mkdtemp()) as lock:
    ...     lock.owner["pid"] == os.getpid()
    True
    """

    FILE = ".lock"

    def __init__(self, workdir: str, force: bool = False):
        self.workdir = workdir
        self.path = os.path.join(workdir, self.FILE)
        self.force = force
        self.owner: dict = {}
        self.previous_owner: dict | None = None
        self._fd = None

    @staticmethod
    def _read(fd) -> dict:
        try:
            os.lseek(fd, 0, os.SEEK_SET)
            raw = os.read(fd, 1 << 16)
            return json.loads(raw) if raw.strip() else {}
        except (OSError, ValueError):
            return {}

    def read_owner(self) -> dict | None:
        """The owner recorded in the lock file if the lock is held now,
        else None (does not take the lock)."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except OSError:
            return None
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                return self._read(fd) or {"pid": "?"}
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None
        finally:
            os.close(fd)

    def acquire(self, _retry: bool = True) -> "WorkdirLock":
        """Takes the lock (non-blocking); see the class docstring."""
        os.makedirs(self.workdir, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = self._read(fd)
            os.close(fd)
            return self._held(owner, _retry)
        except OSError as e:  # e.g. ENOLCK: no locks on this file system
            os.close(fd)
            raise WorkdirError(f"cannot lock {self.path}: {e.strerror}") from e
        # Free: a non-empty record is a previous owner that died holding it.
        self.previous_owner = self._read(fd) or None
        self.owner = {
            "pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.datetime.now().astimezone().isoformat(
                timespec="seconds"),
            "start_ticks": _process_start_ticks(os.getpid()),
            "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.lseek(fd, 0, os.SEEK_SET)
        os.write(fd, json.dumps(self.owner).encode())
        os.fsync(fd)
        self._fd = fd
        return self

    def _held(self, owner: dict, retry: bool):
        here = owner.get("host") == socket.gethostname()
        pid = owner.get("pid")
        alive = (isinstance(pid, int) and here and
                 _pid_alive(pid, owner.get("start_ticks")))
        if not owner or alive:
            what = _describe(owner) if owner else "a process"
            raise WorkdirBusy(
                f"workdir {self.workdir} is in use by a running xmc-tf "
                f"({what}); wait for it to finish or pass another --workdir")
        if not self.force:
            why = ("whose owner is no longer running" if here else
                   "owned by a process on another host")
            raise WorkdirBusy(
                f"workdir {self.workdir} has a lock {why} ({_describe(owner)}); "
                "if that run is gone, pass --force to take the lock over")
        if not retry:
            raise WorkdirBusy(f"workdir {self.workdir}: another process took "
                              "the lock over at the same time")
        # Take over: a new lock file (the stale holder keeps a lock on the
        # unlinked one, which nobody opens any more).
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
        self.acquire(_retry=False)
        self.previous_owner = owner
        return self

    def release(self) -> None:
        """Clears the owner record and releases the lock (idempotent)."""
        if self._fd is None:
            return
        try:
            os.ftruncate(self._fd, 0)
        except OSError:
            pass
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc):
        self.release()


# ---------------------------------------------------------------------------
# The work directory.


class Workdir:
    """Paths and state of a work directory (see the module docstring).

    Args:
      path: the directory (need not exist yet).

    >>> import tempfile
    >>> Workdir(tempfile.mkdtemp()).completion() is None
    True
    """

    MODEL = "model.keras"
    SAVED_MODEL = "saved_model"
    METRICS = "metrics.json"
    BACKUP = "backup"
    HISTORY = "history.csv"
    CONFIG = "config.json"
    #: Files the exported model needs, fingerprinted in metrics.json.
    PREPROCESSING = "preprocessing.npz"
    INV_PROPENSITIES = "inv_propensities.npy"
    ARTIFACTS = (MODEL, SAVED_MODEL, PREPROCESSING, INV_PROPENSITIES)

    def __init__(self, path: str):
        self.path = os.fspath(path)

    def file(self, name: str) -> str:
        """``WORKDIR/name``."""
        return os.path.join(self.path, name)

    @property
    def backup_dir(self) -> str:
        return self.file(self.BACKUP)

    def lock(self, force: bool = False) -> WorkdirLock:
        """A :class:`WorkdirLock` of this directory (use with ``with``)."""
        return WorkdirLock(self.path, force=force)

    # -- completion -----------------------------------------------------------

    def completion(self) -> dict | None:
        """The ``"run"`` marker of ``metrics.json``, or None when the file is
        missing, unreadable or written without a marker."""
        try:
            with open(self.file(self.METRICS)) as f:
                metrics = json.load(f)
        except (OSError, ValueError):
            return None
        run = metrics.get("run") if isinstance(metrics, dict) else None
        return run if isinstance(run, dict) and run.get("complete") else None

    def check_complete(self) -> dict:
        """Verifies that the workdir holds a complete run; returns its
        ``metrics.json``.

        Raises:
          IncompleteWorkdir: no ``metrics.json`` with a completion marker, or
            a model file whose fingerprint differs from the one recorded
            (the message says what to do).
        """
        run = self.completion()
        if run is None:
            busy = WorkdirLock(self.path).read_owner()
            if not os.path.isdir(self.path):
                why = "does not exist"
            elif busy:
                why = f"is being trained now ({_describe(busy)})"
            elif os.path.isdir(self.backup_dir):
                why = ("holds an unfinished run; rerun its `xmc-tf train` "
                       f"command to resume from {self.backup_dir}")
            elif os.path.exists(self.file(self.METRICS)):
                why = (f"has a {self.METRICS} without completion marker "
                       "(written by an older xmc_tf?): retrain with `xmc-tf "
                       "train ... --overwrite`, or load its model unchecked "
                       "with xmc_tf.job.artifacts.load_model(WORKDIR, verify=False)")
            else:
                why = (f"holds no finished run ({self.METRICS} with a "
                       "completion marker is missing)")
            raise IncompleteWorkdir(f"workdir {self.path} {why}")
        for name, expected in sorted(run.get("fingerprints", {}).items()):
            try:
                got = fingerprint(self.file(name))
            except OSError:
                got = "missing"
            if got != expected:
                raise IncompleteWorkdir(
                    f"{self.file(name)} does not belong to the run recorded "
                    f"in {self.file(self.METRICS)} (fingerprint {got[:20]} "
                    f"!= {expected[:20]}): retrain with `xmc-tf train "
                    f"--workdir={self.path} --overwrite ...`")
        with open(self.file(self.METRICS)) as f:
            return json.load(f)

    def mark_complete(self, results: dict, run_id: str, **extra) -> dict:
        """Writes ``metrics.json`` (atomically, last) with the completion
        marker ``"run": {"complete": true, "id", "finished", "fingerprints",
        ...extra}`` over ``ARTIFACTS``; returns the written dict."""
        fingerprints = {name: fingerprint(self.file(name))
                        for name in self.ARTIFACTS
                        if os.path.exists(self.file(name))}
        out = dict(results)
        out["run"] = dict(
            complete=True, id=run_id,
            finished=datetime.datetime.now().astimezone().isoformat(
                timespec="seconds"),
            fingerprints=fingerprints, **extra)
        write_json_atomic(self.file(self.METRICS), out)
        return out

    # -- training ---------------------------------------------------------------

    def clean_leftovers(self) -> None:
        """Removes temporaries of killed writers (``.NAME.tmp-PID``,
        ``.NAME.old-PID``); call with the lock held."""
        for root in (self.path, self.backup_dir):
            if not os.path.isdir(root):
                continue
            for name in os.listdir(root):
                if name.startswith(".") and (".tmp-" in name or
                                             ".old-" in name):
                    remove_path(os.path.join(root, name))

    def prepare_training(self, overwrite: bool = False) -> None:
        """Checks that ``train`` may run here; call with the lock held.

        A finished workdir (one with ``metrics.json``, which is written
        last) is refused unless ``overwrite``; with
        ``overwrite`` the completion marker is removed first (so the old
        model can no longer pass for a complete run), then the backup and
        the old results.

        Raises:
          WorkdirFinished: a complete run is here and not ``overwrite`` (the
            message names ``xmc-tf evaluate``, ``--workdir`` and
            ``--overwrite``).
        """
        os.makedirs(self.path, exist_ok=True)
        self.clean_leftovers()
        run = self.completion()
        # metrics.json is written last: with or without marker (an older
        # xmc_tf), it means the run here finished.
        if os.path.exists(self.file(self.METRICS)) and not overwrite:
            when = f" (finished {run.get('finished', '?')})" if run else ""
            raise WorkdirFinished(
                f"workdir {self.path} already holds a finished run{when}; "
                f"evaluate it with `xmc-tf evaluate --workdir={self.path} "
                "--data=...`, train into another --workdir, or pass "
                "--overwrite (from Python: overwrite=True) to retrain here")
        if overwrite:
            for name in (self.METRICS, self.BACKUP, self.HISTORY, self.MODEL,
                         self.SAVED_MODEL):
                remove_path(self.file(name))
            fsync_dir(self.path)

    @staticmethod
    def new_run_id() -> str:
        """A fresh run id (``YYYYmmdd-HHMMSS-xxxxxx``)."""
        return (datetime.datetime.now().strftime("%Y%m%d-%H%M%S-") +
                uuid.uuid4().hex[:6])
