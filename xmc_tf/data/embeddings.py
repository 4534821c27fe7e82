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

import numpy as np

from xmc_tf.data.dataset import PathLike, XCDataset
from xmc_tf.data.xc_format import read_xc_labels

__all__ = ["read_embeddings", "load_embedding_array"]

# Preferred keys inside an .npz archive, in order.
_NPZ_KEYS = ("embeddings", "arr_0")


def load_embedding_array(path: PathLike) -> np.ndarray:
    """Loads a 2-D embedding matrix from ``.npy`` or ``.npz``.

    For ``.npz``, the array under key ``"embeddings"``, else ``"arr_0"``,
    else the only array in the archive is used.

    Args:
      path: ``.npy`` or ``.npz`` file (no pickled objects allowed).

    Returns:
      float32 C-contiguous ``[num_instances, dim]`` array.

    Raises:
      ValueError: unknown suffix; an ``.npz`` with several arrays and none of
        the known keys; an array that is not 2-D or not real numeric; a
        non-finite value (the message gives the first bad instance row,
        0-based).
    """
    name = os.fspath(path)
    if name.endswith(".npz"):
        with np.load(name, allow_pickle=False) as z:
            keys = list(z.keys())
            key = next((k for k in _NPZ_KEYS if k in keys), None)
            if key is None:
                if len(keys) != 1:
                    raise ValueError(
                        f"{name}: expected an array named 'embeddings' or "
                        f"'arr_0' or a single array, found keys {keys}")
                key = keys[0]
            arr = z[key]
    elif name.endswith(".npy"):
        arr = np.load(name, allow_pickle=False)
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
