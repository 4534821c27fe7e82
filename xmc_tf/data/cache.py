"""A binary cache of a data set: ``.npy`` arrays, memory-mapped on load.

Parsing an XC-repo text file of Amazon-670K size (490k instances, 37M
feature entries) takes minutes; the same arrays as ``.npy`` files load in
milliseconds and, memory-mapped, cost no resident memory until pages are
touched (the OS page cache holds them, shared between processes -- e.g.
the workers of a multi-worker run on one machine).  :func:`load_cached`
reads a data set spec once (with a progress bar for large files), writes
the cache, and returns the memory-mapped data set from then on;
:func:`xmc_tf.data.make_tf_dataset` streams batches from those arrays
without copying them.

Layout of a cache directory (written to a temporary name and renamed into
place when complete, :func:`xmc_tf.files.atomic_path`)::

    meta.json                 format, shapes, dtypes, source fingerprint
    labels_indptr.npy         int64 [N + 1]
    labels_indices.npy        int32 [nnz_y]   (sorted per row)
    features_indptr.npy       int64 [N + 1]   \\
    features_indices.npy      int32 [nnz_x]    } CSR features, or
    features_data.npy         float32 [nnz_x] /
    features.npy              float32 [N, D]  dense embeddings

Only the raw data set is cached (feature normalisation depends on the
training set and runs after loading).
"""

from __future__ import annotations

import json
import os

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.dataset import PathLike, XCDataset

__all__ = ["FORMAT", "load_cached", "read_cache", "source_fingerprint",
           "write_cache"]

#: ``meta.json`` ``format`` value of this layout.
FORMAT = "xmc_tf.data.cache/1"
_META = "meta.json"
_SPARSE = ("features_indptr", "features_indices", "features_data")
_DENSE = ("features",)
_LABELS = ("labels_indptr", "labels_indices")
_CHUNK = 1 << 24  # elements per write (progress granularity)


def source_fingerprint(spec: str) -> dict:
    """What identifies a data set spec's input: the spec and, for every
    file it names (``A|B`` specs name two), its size and modification time.

    Args:
      spec: a :func:`xmc_tf.data.load_dataset` spec string.

    Returns:
      ``{"spec": spec, "files": [{"path", "size", "mtime_ns"}, ...]}``
      (no files for ``synthetic:`` and bundled specs).

    Example:
        >>> source_fingerprint("synthetic:num_instances=10")["files"]
        []
    """
    files = []
    for part in str(spec).split("|"):
        if os.path.isfile(part):
            st = os.stat(part)
            files.append({"path": os.path.abspath(part), "size": st.st_size,
                          "mtime_ns": st.st_mtime_ns})
    return {"spec": str(spec), "files": files}


def _write_array(path: str, array: np.ndarray, bar, done: list) -> None:
    """Writes ``array`` as ``.npy`` in chunks (progress between them)."""
    array = np.ascontiguousarray(array)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=array.dtype,
                                    shape=array.shape)
    flat_in, flat_out = array.reshape(-1), out.reshape(-1)
    for start in range(0, flat_in.size, _CHUNK):
        stop = min(start + _CHUNK, flat_in.size)
        flat_out[start:stop] = flat_in[start:stop]
        done[0] += (stop - start) * array.itemsize
        if bar is not None:
            bar.update(done[0])
    out.flush()
    del out


def write_cache(dataset: XCDataset, directory: PathLike, *,
                source: dict | None = None, progress: bool = False) -> str:
    """Writes ``dataset`` as ``.npy`` arrays into ``directory`` (atomically).

    Args:
      dataset: the :class:`XCDataset` (CSR or dense features).
      directory: the cache directory; an existing one is replaced.
      source: what the data set was read from (stored in ``meta.json``,
        compared by :func:`load_cached`), e.g. :func:`source_fingerprint`.
      progress: show a ``keras.utils.Progbar`` over the bytes written.

    Returns:
      ``directory`` as a string.

    Raises:
      OSError: the directory cannot be written.

    Example:
        >>> import tempfile, os
        >>> from xmc_tf.data import load_bundled
        >>> d = os.path.join(tempfile.mkdtemp(), "bibtex")
        >>> _ = write_cache(load_bundled("bibtex", "test"), d)
        >>> read_cache(d).features.shape
        (2515, 1836)
    """
    from xmc_tf.files import atomic_path
    directory = os.fspath(directory)
    y = dataset.labels
    if not y.has_canonical_format:
        y = y.copy()
        y.sum_duplicates()
    arrays = {"labels_indptr": y.indptr.astype(np.int64, copy=False),
              "labels_indices": y.indices.astype(np.int32, copy=False)}
    if dataset.is_sparse:
        x = dataset.features
        if not x.has_canonical_format:
            x = x.copy()
            x.sum_duplicates()
        arrays.update(features_indptr=x.indptr.astype(np.int64, copy=False),
                      features_indices=x.indices.astype(np.int32, copy=False),
                      features_data=x.data.astype(np.float32, copy=False))
    else:
        arrays["features"] = np.asarray(dataset.features, dtype=np.float32)
    total = sum(a.nbytes for a in arrays.values())
    bar = None
    if progress:
        from keras.utils import Progbar
        print(f"writing the data cache {directory} ({total / 2**20:.0f} MiB)",
              flush=True)
        bar = Progbar(max(total, 1), unit_name="byte")
    meta = {"format": FORMAT, "num_instances": dataset.num_instances,
            "num_features": dataset.num_features,
            "num_labels": dataset.num_labels, "sparse": dataset.is_sparse,
            "source": source,
            "arrays": {k: {"dtype": a.dtype.str, "shape": list(a.shape)}
                       for k, a in arrays.items()}}
    parent = os.path.dirname(os.path.abspath(directory))
    os.makedirs(parent, exist_ok=True)
    done = [0]
    with atomic_path(directory) as tmp:
        os.makedirs(tmp)
        for name, array in arrays.items():
            _write_array(os.path.join(tmp, name + ".npy"), array, bar, done)
        with open(os.path.join(tmp, _META), "w") as f:
            json.dump(meta, f, indent=1)
    if bar is not None:
        bar.update(max(total, 1), finalize=True)
    return directory


def _bad(directory, msg) -> ValueError:
    return ValueError(f"data cache {directory}: {msg}")


def read_cache(directory: PathLike, *, mmap: bool = True) -> XCDataset:
    """Loads a cache written by :func:`write_cache`.

    Args:
      directory: the cache directory.
      mmap: memory-map the arrays (read-only, ``numpy.load(mmap_mode="r")``);
        ``False`` reads them into memory.

    Returns:
      An :class:`XCDataset` whose CSR arrays (or dense features) are the
      (memory-mapped) arrays of the cache.  Memory-mapped arrays are
      read-only: normalise features into a new matrix
      (:func:`xmc_tf.data.normalize_features` does).

    Raises:
      ValueError: a missing or inconsistent file (wrong format, dtype or
        shape, row pointers that are not monotone or do not end at the
        number of entries, an id outside ``[0, num_features)`` /
        ``[0, num_labels)``); the message names the directory.
      OSError: the directory cannot be read.
    """
    directory = os.fspath(directory)
    try:
        with open(os.path.join(directory, _META)) as f:
            meta = json.load(f)
    except FileNotFoundError:
        raise _bad(directory, f"no {_META} (not a cache, or an interrupted "
                   "write)") from None
    except json.JSONDecodeError as e:
        raise _bad(directory, f"unreadable {_META}: {e}") from None
    if meta.get("format") != FORMAT:
        raise _bad(directory, f"format {meta.get('format')!r}, expected "
                   f"{FORMAT!r}")
    n, d, m = (int(meta["num_instances"]), int(meta["num_features"]),
               int(meta["num_labels"]))
    names = _LABELS + (_SPARSE if meta["sparse"] else _DENSE)
    arrays = {}
    for name in names:
        path = os.path.join(directory, name + ".npy")
        try:
            a = np.load(path, mmap_mode="r" if mmap else None,
                        allow_pickle=False)
        except (OSError, ValueError) as e:
            raise _bad(directory, f"{name}.npy: {e}") from None
        want = meta["arrays"].get(name, {})
        if (a.dtype.str != want.get("dtype") or
                list(a.shape) != want.get("shape")):
            raise _bad(directory, f"{name}.npy is {a.dtype.str} "
                       f"{list(a.shape)}, meta.json says {want}")
        arrays[name] = a

    def csr(prefix, num_cols, data):
        indptr, indices = arrays[prefix + "_indptr"], arrays[prefix + "_indices"]
        if indptr.shape != (n + 1,) or indptr[0] != 0 or (
                indptr[-1] != indices.shape[0]) or np.any(np.diff(indptr) < 0):
            raise _bad(directory, f"{prefix}_indptr is not a row pointer "
                       f"array of {n} rows over {indices.shape[0]} entries")
        for start in range(0, indices.shape[0], _CHUNK):
            part = indices[start:start + _CHUNK]
            if part.size and (part.min() < 0 or part.max() >= num_cols):
                raise _bad(directory, f"{prefix}_indices holds an id outside "
                           f"[0, {num_cols})")
        if data is None:
            data = np.ones(indices.shape[0], np.float32)
        mat = sp.csr_matrix((data, indices, indptr), shape=(n, num_cols),
                            copy=False)
        mat.has_sorted_indices = True  # written canonical
        mat.has_canonical_format = True
        return mat

    labels = csr("labels", m, None)
    if meta["sparse"]:
        if arrays["features_data"].shape != arrays["features_indices"].shape:
            raise _bad(directory, "features_data and features_indices differ "
                       "in length")
        features = csr("features", d, arrays["features_data"])
    else:
        features = arrays["features"]
        if features.shape != (n, d):
            raise _bad(directory, f"features.npy is {list(features.shape)}, "
                       f"expected [{n}, {d}]")
    return XCDataset(features=features, labels=labels)


def load_cached(spec: str, cache_dir: PathLike, *, progress="auto",
                mmap: bool = True) -> XCDataset:
    """The data set of ``spec``, from its cache when the cache is current.

    On the first call (or when the spec or one of its files changed:
    :func:`source_fingerprint`) the spec is read with
    :func:`xmc_tf.data.load_dataset` (XC files show a progress bar from
    100,000 instances on), written to ``cache_dir`` (:func:`write_cache`)
    and loaded back memory-mapped; later calls only load it.

    Args:
      spec: a :func:`xmc_tf.data.load_dataset` spec.
      cache_dir: the cache directory of this spec (e.g.
        ``WORKDIR/cache/train``).
      progress: ``"auto"``, ``True`` or ``False``: progress bars while
        reading XC files (see :func:`xmc_tf.data.read_xc`) and writing the
        cache (``"auto"``: when the file is large).
      mmap: as for :func:`read_cache`.

    Returns:
      The :class:`XCDataset` (memory-mapped arrays when ``mmap``).

    Raises:
      ValueError: a malformed spec or file, or an inconsistent cache.
      OSError: a file cannot be read or the cache cannot be written.

    Example:
        >>> import tempfile, os
        >>> d = os.path.join(tempfile.mkdtemp(), "syn")
        >>> spec = "synthetic:num_instances=50,num_features=20,num_labels=9"
        >>> load_cached(spec, d).num_labels, os.path.isdir(d)
        (9, True)
    """
    from xmc_tf.data import specs, xc_reader
    cache_dir = os.fspath(cache_dir)
    source = source_fingerprint(spec)
    try:
        with open(os.path.join(cache_dir, _META)) as f:
            current = json.load(f).get("source") == source
    except (OSError, ValueError):
        current = False
    if not current:
        first, sep, second = spec.partition("|")
        if os.path.isfile(spec) and not spec.endswith((".npy", ".npz")):
            dataset = xc_reader.read_xc(spec, progress=progress)
        elif (sep and os.path.isfile(first) and
              not first.endswith((".npy", ".npz"))):
            dataset = xc_reader.read_xc_xy(first, second, progress=progress)
        else:
            dataset = specs.load_dataset(spec)
        big = dataset.num_instances >= xc_reader.PROGRESS_MIN_INSTANCES
        write_cache(dataset, cache_dir, source=source,
                    progress=progress is True or (progress == "auto" and big))
        del dataset
    return read_cache(cache_dir, mmap=mmap)
