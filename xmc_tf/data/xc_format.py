"""Readers and writers for the Extreme Classification Repository formats.

The XC repo (http://manikvarma.org/downloads/XC/XMLRepository.html) ships
multi-label data sets as sparse text files. Three layouts are supported:

* **Combined file** (:func:`read_xc`, :func:`write_xc`). First line
  ``num_instances num_features num_labels``; then one line per instance::

      l1,l2,... f1:v1 f2:v2 ...

  with 0-based label ids ``l`` and feature ids ``f``. An instance without
  labels has an empty label field, so its line starts with a space; an
  instance with neither labels nor features is an empty (or blank) line.
* **Separate X/Y files** (:func:`read_xc_xy`). The features file has the
  header ``num_instances num_features`` and lines ``f1:v1 f2:v2 ...``; the
  labels file has the header ``num_instances num_labels`` and lines either
  ``l1,l2,...`` or ``l1:v1 l2:v2 ...`` (both forms are accepted, even mixed
  line by line). In the ``l:v`` form every entry with a non-zero value is a
  label (value 1.0); entries with an explicit zero value are not labels.
* **Dense embeddings** plus such a labels file: see
  :func:`xmc_tf.data.read_embeddings`.

The container :class:`~xmc_tf.data.XCDataset` is defined in
:mod:`xmc_tf.data.dataset`; named data sets and CLI specs are in
:mod:`xmc_tf.data.specs`.

A path ending in ``.gz`` is read and written with gzip transparently.

Parsing rules (all readers):

* Ids and values are parsed strictly. Malformed input -- a bad header, a
  non-integer id, an id out of ``[0, num_features)`` / ``[0, num_labels)``,
  a non-numeric or non-finite value, a token that is not ``id:value``, more
  or fewer instance lines than the header declares -- raises ``ValueError``
  whose message starts with ``"<file>, line <n>:"`` (1-based line number;
  the header is line 1). Nothing is skipped silently.
* Unsorted ids within a line are accepted and sorted. Duplicate label ids
  count once; duplicate feature ids are summed (scipy's ``sum_duplicates``).
  Explicit zero feature values are dropped from the sparse matrix.
* Whitespace-only lines after the declared ``num_instances`` lines are
  ignored; any other extra line is an error.
* Parsing is vectorised per chunk of ~16 MiB of text (``numpy.loadtxt`` on
  the id/value tokens), about 1 s per 100k Delicious-sized lines; only when a
  chunk is malformed is it bisected to find the first bad line.

Example:
    >>> import os, tempfile
    >>> import numpy as np, scipy.sparse as sp
    >>> ds = XCDataset(
    ...     features=sp.csr_matrix(np.array([[0, 2.5], [1, 0]], np.float32)),
    ...     labels=sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0]], np.float32)))
    >>> path = os.path.join(tempfile.mkdtemp(), "toy.txt.gz")
    >>> write_xc(path, ds)
    >>> back = read_xc(path)
    >>> (back.num_instances, back.num_features, back.num_labels)
    (2, 2, 3)
    >>> back.labels.indices.tolist(), back.features.data.tolist()
    ([0, 2], [2.5, 1.0])
"""

from __future__ import annotations

import gzip
import io
import os
import re

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.dataset import PathLike, XCDataset

__all__ = [
    "read_xc",
    "write_xc",
    "read_xc_xy",
    "read_xc_labels",
    "write_xc_labels",
]

# Text read per parsing chunk (bytes, approximately; whole lines).
_CHUNK_BYTES = 1 << 24


# ---------------------------------------------------------------------------
# Reading.


class _ChunkError(ValueError):
    """A chunk of lines failed to parse (the line is located later)."""


def _open_text(path: PathLike, mode: str):
    path = os.fspath(path)
    if path.endswith(".gz"):
        if "w" in mode:
            return gzip.open(path, mode, encoding="utf-8", compresslevel=6)
        return gzip.open(path, mode, encoding="utf-8")
    return open(path, mode, encoding="utf-8")


def _err(path, lineno, msg) -> ValueError:
    return ValueError(f"{os.fspath(path)}, line {lineno}: {msg}")


def _parse_header(line: str, path, names: tuple[str, ...]) -> list[int]:
    toks = line.split()
    if len(toks) != len(names) or not all(
            t.isascii() and t.isdigit() for t in toks):
        raise _err(
            path, 1, f"malformed header {line.strip()!r}: expected "
            f"{len(names)} non-negative integers '{' '.join(names)}'")
    return [int(t) for t in toks]


def _loadtxt(text: str, **kwargs) -> np.ndarray:
    return np.loadtxt(io.StringIO(text), comments=None, ndmin=1, **kwargs)


_PAIR_DTYPE = np.dtype([("i", np.int64), ("v", np.float32)])


def _id_dtype(limit: int):
    """Smallest id dtype for ids in ``[0, limit)`` (saves memory)."""
    return np.int32 if limit <= np.iinfo(np.int32).max else np.int64


def _parse_pairs(fields: list[str], what: str, limit: int):
    """Parses whitespace-separated ``id:value`` fields, one per line.

    Returns:
      ``(counts, ids, values)``: int64 ``[len(fields)]`` tokens per field,
      int64 ``[total]`` ids and float32 ``[total]`` values.
    """
    counts = np.fromiter((f.count(":") for f in fields), dtype=np.int64,
                         count=len(fields))
    total = int(counts.sum())
    text = "\n".join(fields).replace(" ", "\n").replace("\t", "\n")
    if total == 0:
        if text.strip():
            raise _ChunkError(f"malformed {what} field")
        return (counts, np.zeros(0, _id_dtype(limit)),
                np.zeros(0, np.float32))
    arr = _loadtxt(text, delimiter=":", dtype=_PAIR_DTYPE)
    if arr.shape != (total,):
        raise _ChunkError(f"malformed {what} field")
    ids = arr["i"]
    vals = np.ascontiguousarray(arr["v"])
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        k = int(np.argmax(bad))
        raise _ChunkError(f"{what} id {ids[k]} out of range [0, {limit})")
    if not np.isfinite(vals).all():
        raise _ChunkError(f"non-finite {what} value")
    return counts, ids.astype(_id_dtype(limit)), vals


def _parse_id_lists(fields: list[str], what: str, limit: int):
    """Parses comma-separated id lists (``l1,l2,...``), one per line."""
    counts = np.fromiter((f.count(",") + 1 if f else 0 for f in fields),
                         dtype=np.int64, count=len(fields))
    total = int(counts.sum())
    if total == 0:
        return (counts, np.zeros(0, _id_dtype(limit)),
                np.zeros(0, np.float32))
    text = "\n".join([f for f in fields if f]).replace(",", "\n")
    ids = _loadtxt(text, dtype=np.int64)
    if ids.shape != (total,):
        raise _ChunkError(f"malformed {what} list")
    bad = (ids < 0) | (ids >= limit)
    if bad.any():
        k = int(np.argmax(bad))
        raise _ChunkError(f"{what} id {ids[k]} out of range [0, {limit})")
    return counts, ids.astype(_id_dtype(limit)), np.ones(total, np.float32)


def _parse_label_lines(fields: list[str], limit: int):
    """Labels-file lines: ``l1,l2,...`` or ``l1:v1 l2:v2 ...`` per line."""
    colon = [":" in f for f in fields]
    if not any(colon):
        return _parse_id_lists(fields, "label", limit)
    if all(colon):
        return _parse_pairs(fields, "label", limit)
    # Mixed forms: parse each group, then restore line order.
    idx_c = [i for i, c in enumerate(colon) if c]
    idx_l = [i for i, c in enumerate(colon) if not c]
    cnt_c, ids_c, val_c = _parse_pairs([fields[i] for i in idx_c], "label",
                                       limit)
    cnt_l, ids_l, val_l = _parse_id_lists([fields[i] for i in idx_l], "label",
                                          limit)
    counts = np.zeros(len(fields), np.int64)
    counts[idx_c] = cnt_c
    counts[idx_l] = cnt_l
    line_of = np.concatenate([np.repeat(np.asarray(idx_c, np.int64), cnt_c),
                              np.repeat(np.asarray(idx_l, np.int64), cnt_l)])
    order = np.argsort(line_of, kind="stable")
    return (counts, np.concatenate([ids_c, ids_l])[order],
            np.concatenate([val_c, val_l])[order])


def _parse_chunk(lines: list[str], kind: str, num_features: int,
                 num_labels: int):
    """Parses a list of instance lines.

    Args:
      lines: raw lines (with or without the newline).
      kind: ``"xc"`` (``labels features``), ``"x"`` (features only) or
        ``"y"`` (labels only).

    Returns:
      ``(labels, features)``, each ``None`` or ``(counts, ids, values)``.

    Raises:
      ValueError: the chunk holds a malformed line (not located).
    """
    stripped = [ln.rstrip() for ln in lines]
    labels = features = None
    if kind == "xc":
        parts = [s.partition(" ") for s in stripped]
        labels = _parse_id_lists([p[0] for p in parts], "label", num_labels)
        features = _parse_pairs([p[2] for p in parts], "feature",
                                num_features)
    elif kind == "x":
        features = _parse_pairs(stripped, "feature", num_features)
    elif kind == "y":
        labels = _parse_label_lines(stripped, num_labels)
    else:
        raise AssertionError(kind)
    return labels, features


_INT_RE = re.compile(r"\+?\d+|-\d+")


def _check_int(tok: str, what: str, limit: int) -> str | None:
    if not _INT_RE.fullmatch(tok):
        return f"non-integer {what} id {tok!r}"
    v = int(tok)
    if not 0 <= v < limit:
        return f"{what} id {v} out of range [0, {limit})"
    return None


def _check_pairs(field: str, what: str, limit: int) -> str | None:
    for tok in field.split():
        i, sep, v = tok.partition(":")
        if not sep or ":" in v or not i or not v:
            return (f"malformed {what} token {tok!r}: expected "
                    f"'{what}_id:value'")
        msg = _check_int(i, what, limit)
        if msg:
            return msg
        try:
            with np.errstate(over="ignore"):
                fv = np.float32(float(v))
        except ValueError:
            return f"non-numeric {what} value {v!r} in {tok!r}"
        if not np.isfinite(fv):
            return f"non-finite {what} value {v!r} in {tok!r} (float32)"
    return None


def _check_id_list(field: str, what: str, limit: int) -> str | None:
    if not field:
        return None
    for tok in field.split(","):
        if ":" in tok:
            return (f"label field {field!r} contains ':' -- a line without "
                    "labels must start with a space")
        msg = _check_int(tok.strip(), what, limit)
        if msg:
            return msg
    return None


def _diagnose_line(line: str, kind: str, num_features: int,
                   num_labels: int) -> str | None:
    """Human-readable reason why one line is malformed (None if unsure)."""
    s = line.rstrip()
    if kind == "xc":
        lab, _, feat = s.partition(" ")
        if any(c.isspace() for c in lab):
            return ("the label field must end at the first space (found "
                    "other whitespace in it)")
        return (_check_id_list(lab, "label", num_labels) or
                _check_pairs(feat, "feature", num_features))
    if kind == "x":
        return _check_pairs(s, "feature", num_features)
    if ":" in s:
        return _check_pairs(s, "label", num_labels)
    if s and (" " in s or "\t" in s):
        return (f"malformed label list {s!r}: expected 'l1,l2,...' or "
                "'l1:v1 l2:v2 ...'")
    return _check_id_list(s, "label", num_labels)


def _locate_error(lines, kind, num_features, num_labels, first_lineno, path,
                  chunk_error):
    """Bisects a failing chunk to the first bad line; returns a ValueError."""
    lo, hi = 0, len(lines)  # lines[:lo] parse, lines[:hi] fail
    while hi - lo > 1:
        mid = (lo + hi) // 2
        try:
            _parse_chunk(lines[:mid], kind, num_features, num_labels)
            lo = mid
        except ValueError:
            hi = mid
    bad = hi - 1
    line = lines[bad]
    msg = _diagnose_line(line, kind, num_features, num_labels)
    if msg is None:
        try:
            _parse_chunk([line], kind, num_features, num_labels)
        except ValueError as e:
            msg = str(e)
        else:  # Should not happen: report the chunk-level failure.
            msg = f"malformed input near here ({chunk_error})"
    text = line.rstrip("\r\n")
    if len(text) > 80:
        text = text[:77] + "..."
    return _err(path, first_lineno + bad, f"{msg}; line: {text!r}")


def _read_sparse_text(path: PathLike, kind: str):
    """Reads one XC-style file.

    Returns:
      ``(header, labels, features)`` where ``header`` is the list of header
      integers and ``labels``/``features`` are ``(counts, ids, values)`` over
      all instances, or ``None`` when the file kind has no such field.
    """
    names = {"xc": ("num_instances", "num_features", "num_labels"),
             "x": ("num_instances", "num_features"),
             "y": ("num_instances", "num_labels")}[kind]
    try:
        with _open_text(path, "rt") as f:
            header_line = f.readline()
            if not header_line:
                raise _err(path, 1, "empty file; expected the header '" +
                           " ".join(names) + "'")
            header = _parse_header(header_line, path, names)
            num_instances = header[0]
            num_features = header[1] if kind in ("xc", "x") else 0
            num_labels = header[-1] if kind in ("xc", "y") else 0
            lab_parts, feat_parts = [], []
            n_read = 0          # instance lines consumed
            next_lineno = 2     # 1-based line number of the next line read
            while True:
                lines = f.readlines(_CHUNK_BYTES)
                if not lines:
                    break
                take = max(0, min(len(lines), num_instances - n_read))
                for j in range(take, len(lines)):
                    if lines[j].strip():
                        raise _err(
                            path, next_lineno + j,
                            f"more instance lines than the {num_instances} "
                            "declared in the header")
                body = lines[:take]
                if body:
                    try:
                        lab, feat = _parse_chunk(body, kind, num_features,
                                                 num_labels)
                    except ValueError as e:
                        raise _locate_error(body, kind, num_features,
                                            num_labels, next_lineno, path,
                                            e) from None
                    if lab is not None:
                        lab_parts.append(lab)
                    if feat is not None:
                        feat_parts.append(feat)
                n_read += take
                next_lineno += len(lines)
            if n_read < num_instances:
                raise _err(
                    path, next_lineno,
                    f"unexpected end of file: the header declares "
                    f"{num_instances} instances but only {n_read} lines "
                    "follow it")
    except UnicodeDecodeError as e:
        raise ValueError(f"{os.fspath(path)}: not a UTF-8 text file ({e})"
                         ) from None
    except (gzip.BadGzipFile, EOFError) as e:
        raise ValueError(f"{os.fspath(path)}: corrupt or truncated gzip "
                         f"file ({e})") from None

    def _cat(parts):
        if not parts:
            return (np.zeros(num_instances, np.int64), np.zeros(0, np.int32),
                    np.zeros(0, np.float32))
        return tuple(np.concatenate(p) for p in zip(*parts))

    labels = _cat(lab_parts) if kind in ("xc", "y") else None
    features = _cat(feat_parts) if kind in ("xc", "x") else None
    return header, labels, features


def _to_csr(parsed, num_cols: int, binary: bool) -> sp.csr_matrix:
    counts, ids, vals = parsed
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    m = sp.csr_matrix((vals.astype(np.float32, copy=False), ids, indptr),
                      shape=(len(counts), num_cols))
    m.sum_duplicates()  # sorts indices; merges duplicates
    m.eliminate_zeros()
    if binary:
        m.data[:] = 1.0
    return m


def read_xc(path: PathLike) -> XCDataset:
    """Reads a combined XC repo file (``N D L`` header, ``labels features``).

    Args:
      path: file path; a ``.gz`` suffix means gzip.

    Returns:
      An :class:`XCDataset` with float32 CSR ``features`` ``[N, D]`` (sorted
      indices, explicit zeros dropped, duplicates summed) and float32 CSR
      ``labels`` ``[N, L]`` of 1.0 entries.

    Raises:
      ValueError: malformed input; the message starts with
        ``"<path>, line <n>:"`` (1-based, header = line 1).
      OSError: the file cannot be opened.

    Example:
        >>> ds = load_bundled("bibtex", "train")   # wraps read_xc
        >>> ds.features.shape, ds.labels.shape
        ((4880, 1836), (4880, 159))
    """
    header, labels, features = _read_sparse_text(path, "xc")
    _, num_features, num_labels = header
    return XCDataset(features=_to_csr(features, num_features, binary=False),
                     labels=_to_csr(labels, num_labels, binary=True))


def read_xc_labels(path: PathLike) -> sp.csr_matrix:
    """Reads an XC labels file (header ``N L``; ``l1,l2`` or ``l:v`` lines).

    Args:
      path: file path; a ``.gz`` suffix means gzip.

    Returns:
      float32 CSR ``[N, L]`` with 1.0 entries and sorted indices. In the
      ``l:v`` form, entries with value 0 are not labels.

    Raises:
      ValueError: malformed input (message names the file and line).
    """
    header, labels, _ = _read_sparse_text(path, "y")
    return _to_csr(labels, header[1], binary=True)


def read_xc_xy(features_path: PathLike, labels_path: PathLike) -> XCDataset:
    """Reads the separate-file XC variant: an X (features) and a Y file.

    Args:
      features_path: header ``num_instances num_features``, then one line
        ``f1:v1 f2:v2 ...`` per instance (an empty line: no features).
      labels_path: header ``num_instances num_labels``, then one line
        ``l1,l2,...`` or ``l1:v1 l2:v2 ...`` per instance.

    Returns:
      An :class:`XCDataset` (CSR float32 features and 1.0-valued labels).

    Raises:
      ValueError: malformed input in either file (file name and line in the
        message), or the two headers disagree on ``num_instances``.
    """
    xh, _, features = _read_sparse_text(features_path, "x")
    labels = read_xc_labels(labels_path)
    if labels.shape[0] != xh[0]:
        raise ValueError(
            f"{os.fspath(features_path)} has {xh[0]} instances but "
            f"{os.fspath(labels_path)} has {labels.shape[0]}")
    return XCDataset(features=_to_csr(features, xh[1], binary=False),
                     labels=labels)


# ---------------------------------------------------------------------------
# Writing.


def _canonical(m: sp.csr_matrix) -> sp.csr_matrix:
    if not m.has_canonical_format:
        m = m.copy()
        m.sum_duplicates()
    return m


def _row_strings(m: sp.csr_matrix, start: int, stop: int,
                 with_values: bool) -> list[str]:
    """Rows ``start:stop`` as ``id:value`` (or comma-separated id) strings.

    Values use ``{:.9g}``: 9 significant digits always read back to the same
    float32, and integral values print without a decimal point ("1").
    """
    a, b = int(m.indptr[start]), int(m.indptr[stop])
    ids = m.indices[a:b].tolist()
    if with_values:
        vals = m.data[a:b].astype(np.float64).tolist()
        toks = list(map("{}:{:.9g}".format, ids, vals))
        sep = " "
    else:
        toks = list(map(str, ids))
        sep = ","
    ptr = (m.indptr[start:stop + 1] - a).tolist()
    return [sep.join(toks[p:q]) for p, q in zip(ptr[:-1], ptr[1:])]


_WRITE_ROWS = 65536


def _label_matrix(labels) -> sp.csr_matrix:
    y = _canonical(sp.csr_matrix(labels))
    if y.nnz and not y.data.all():
        y = y.copy()
        y.eliminate_zeros()
    return y


def write_xc(path: PathLike, dataset: XCDataset) -> None:
    """Writes a combined XC repo file (``N D L`` header, then instances).

    Feature values are written with 9 significant digits (``{:.9g}``), which
    reads back to the same float32 (integers print as ``1``, ``2``; 0.1f
    prints as ``0.100000001``). Dense
    (embedding) features are written as sparse rows of their non-zeros.
    Every non-zero label entry is written as a label.

    Args:
      path: output path; a ``.gz`` suffix means gzip.
      dataset: the :class:`XCDataset` to write.

    Raises:
      ValueError: a feature value is not finite.
    """
    x = _canonical(sp.csr_matrix(dataset.features, dtype=np.float32))
    if x.nnz and not np.isfinite(x.data).all():
        raise ValueError("write_xc: features contain non-finite values")
    y = _label_matrix(dataset.labels)
    n = dataset.num_instances
    with _open_text(path, "wt") as f:
        f.write(f"{n} {x.shape[1]} {y.shape[1]}\n")
        for start in range(0, n, _WRITE_ROWS):
            stop = min(n, start + _WRITE_ROWS)
            labs = _row_strings(y, start, stop, with_values=False)
            feats = _row_strings(x, start, stop, with_values=True)
            f.write("".join(f"{a} {b}\n" for a, b in zip(labs, feats)))


def write_xc_labels(path: PathLike, labels) -> None:
    """Writes an XC labels file: header ``N L``, then ``l1,l2,...`` lines.

    Args:
      path: output path; a ``.gz`` suffix means gzip.
      labels: ``[N, L]`` scipy sparse matrix or array; non-zeros are labels.
    """
    y = _label_matrix(labels)
    n = y.shape[0]
    with _open_text(path, "wt") as f:
        f.write(f"{n} {y.shape[1]}\n")
        for start in range(0, n, _WRITE_ROWS):
            stop = min(n, start + _WRITE_ROWS)
            f.write("".join(
                s + "\n"
                for s in _row_strings(y, start, stop, with_values=False)))


