"""Dense instance embeddings (``.npy`` / ``.npz``) plus an XC labels file.

Dense-feature XMC data sets (e.g. the XC repo's precomputed embeddings, or
embeddings from a text encoder) store one float vector per instance. The
labels come from an XC-style labels file: header ``num_instances
num_labels``, then one line ``l1,l2,...`` (or ``l1:v1 l2:v2 ...``) per
instance; see :func:`xmc_tf.data.read_xc_labels`.

Example:
    >>> import os, tempfile
    >>> import numpy as np
    >>> d = tempfile.mkdtemp()
    >>> np.save(os.path.join(d, "emb.npy"), np.ones((2, 4), np.float32))
    >>> with open(os.path.join(d, "lab.txt"), "w") as f:
    ...     _ = f.write("2 5\\n0,3\\n\\n")
    >>> ds = read_embeddings(os.path.join(d, "emb.npy"),
    ...                      os.path.join(d, "lab.txt"))
    >>> ds.features.shape, ds.labels.toarray().tolist()
    ((2, 4), [[1.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 0.0]])
"""

from __future__ import annotations

import os
import zipfile

import numpy as np

from xmc_tf.data.dataset import PathLike, XCDataset
from xmc_tf.data.xc_reader import read_xc_labels

__all__ = ["read_embeddings", "load_embedding_array"]

# Preferred keys inside an .npz archive, in order.
_NPZ_KEYS = ("embeddings", "arr_0")


# Any error while decoding the content of an opened .npy / .npz file means
# a malformed file: numpy's header parser raises ValueError, SyntaxError or
# tokenize.TokenError, zipfile raises BadZipFile, zlib.error, OSError (bad
# offsets), NotImplementedError (unknown compression), RuntimeError
# ("encrypted" flag), ...  Only MemoryError (after the size check: the
# machine is short of memory) is passed through.
def _decode_error(name: str, kind: str, e: Exception) -> ValueError:
    return ValueError(f"{name}: not a valid {kind} file "
                      f"({type(e).__name__}: {e})")


def _npy_header(fp, available: int):
    """Reads the header of the .npy stream at ``fp`` and bounds its shape.

    Args:
      fp: a binary stream at the start of a .npy file or .npz member.
      available: bytes of the stream, header included.

    Raises:
      ValueError: not a .npy stream, an object dtype, or a shape whose data
        needs more bytes than follow the header, so nothing proportional to
        a forged shape is allocated.
    """
    version = np.lib.format.read_magic(fp)
    if version == (1, 0):
        shape, fortran, dtype = np.lib.format.read_array_header_1_0(fp)
    else:  # 2.0 and 3.0 share the layout (3.0: UTF-8 field names)
        shape, fortran, dtype = np.lib.format.read_array_header_2_0(fp)
    if dtype.hasobject:
        raise ValueError(f"dtype {dtype} holds Python objects (pickles are "
                         "not loaded)")
    count = 1
    for dim in shape:
        count *= int(dim)
    need = count * dtype.itemsize
    available -= fp.tell()
    if need > available:
        raise ValueError(f"the header declares shape {tuple(shape)} of "
                         f"{dtype} ({need} bytes) but only {available} bytes "
                         "of data follow it (truncated or corrupt file)")


def _load_npy(name: str):
    with open(name, "rb") as f:  # OSError: cannot be opened
        size = os.fstat(f.fileno()).st_size
        try:
            _npy_header(f, size)
            f.seek(0)
            return np.lib.format.read_array(f, allow_pickle=False)
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- see _decode_error
            raise _decode_error(name, ".npy", e) from None


def _load_npz(name: str):
    with open(name, "rb") as f:  # OSError: cannot be opened
        try:
            with zipfile.ZipFile(f) as z:
                infos = {i.filename[:-4] if i.filename.endswith(".npy")
                         else i.filename: i for i in z.infolist()}
                keys = list(infos)
                key = next((k for k in _NPZ_KEYS if k in keys), None)
                if key is None:
                    if len(keys) != 1:
                        raise _NpzKeyError(
                            f"{name}: expected an array named 'embeddings' "
                            f"or 'arr_0' or a single array, found keys "
                            f"{keys}")
                    key = keys[0]
                info = infos[key]
                # Uncompressed size as stored, bounded by what the stored
                # bytes can inflate to (deflate expands at most 1032x).
                available = info.file_size
                if info.compress_type != zipfile.ZIP_STORED:
                    available = min(available, 1032 * info.compress_size)
                with z.open(info) as member:
                    _npy_header(member, available)
                with z.open(info) as member:
                    return np.lib.format.read_array(member,
                                                    allow_pickle=False)
        except _NpzKeyError as e:
            raise ValueError(str(e)) from None
        except MemoryError:
            raise
        except Exception as e:  # noqa: BLE001 -- see _decode_error
            raise _decode_error(name, ".npz", e) from None


class _NpzKeyError(Exception):
    pass


def load_embedding_array(path: PathLike) -> np.ndarray:
    """Loads a 2-D embedding matrix from ``.npy`` or ``.npz``.

    For ``.npz``, the array under key ``"embeddings"``, else ``"arr_0"``,
    else the only array in the archive is used.  The ``.npy`` header's shape
    is checked against the bytes that follow it before anything is
    allocated.

    Args:
      path: ``.npy`` or ``.npz`` file (no pickled objects allowed).

    Returns:
      float32 C-contiguous ``[num_instances, dim]`` array.

    Raises:
      ValueError: every malformed input, with a message starting with
        ``"<path>:"``: unknown suffix; a corrupt, truncated or non-NumPy
        file; a header whose shape needs more bytes than the file holds; an
        ``.npz`` with several arrays and none of the known keys; an array
        that is not 2-D or not real numeric; a non-finite value (the
        message gives the first bad instance row, 0-based).
      OSError: the file cannot be opened.
    """
    name = os.fspath(path)
    if name.endswith(".npz"):
        arr = _load_npz(name)
    elif name.endswith(".npy"):
        arr = _load_npy(name)
    else:
        raise ValueError(f"{name}: embeddings must be a .npy or .npz file")
    if arr.ndim != 2:
        raise ValueError(f"{name}: embeddings must be 2-D [num_instances, "
                         f"dim], got shape {arr.shape}")
    if not (np.issubdtype(arr.dtype, np.floating) or
            np.issubdtype(arr.dtype, np.integer) or arr.dtype == np.bool_):
        raise ValueError(f"{name}: embeddings must be real numbers, got "
                         f"dtype {arr.dtype}")
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    finite = np.isfinite(arr)
    if not finite.all():
        row = int(np.argmin(finite.all(axis=1)))
        raise ValueError(f"{name}: non-finite embedding value in row {row} "
                         "(0-based instance index)")
    return arr


def read_embeddings(embeddings_path: PathLike,
                    labels_path: PathLike) -> XCDataset:
    """Reads dense embeddings plus an XC labels file into an XCDataset.

    Args:
      embeddings_path: ``.npy`` or ``.npz`` with a ``[N, D]`` real array (see
        :func:`load_embedding_array` for the ``.npz`` key rule).
      labels_path: XC labels file with header ``N L`` (``.gz`` allowed).

    Returns:
      :class:`XCDataset` with ``features`` a float32 ``np.ndarray [N, D]``
      and ``labels`` a float32 CSR ``[N, L]`` of 1.0 entries.

    Raises:
      ValueError: a malformed embeddings or labels file (the message names
        the file and, for the labels file, the 1-based line), or the two
        files disagree on ``N``.
    """
    features = load_embedding_array(embeddings_path)
    labels = read_xc_labels(labels_path)
    if labels.shape[0] != features.shape[0]:
        raise ValueError(
            f"{os.fspath(embeddings_path)} has {features.shape[0]} rows but "
            f"{os.fspath(labels_path)} declares {labels.shape[0]} instances")
    return XCDataset(features=features, labels=labels)
