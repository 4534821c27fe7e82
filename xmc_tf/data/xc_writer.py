"""The XC text writers: :func:`write_xc` (combined file) and
:func:`write_xc_labels` (labels file).

They write what the readers (:mod:`xmc_tf.data.xc_reader`) accept, in the
grammar of :mod:`xmc_tf.data.xc_format`: ``\\n``
line endings, single spaces, sorted ids, and values that read back to the
same float32.
"""

from __future__ import annotations

import gzip
import os

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.dataset import PathLike, XCDataset
from xmc_tf.data.xc_grammar import MAX_DIM

__all__ = ["write_xc", "write_xc_labels"]


def _open_text(path: PathLike, mode: str):
    """Text handle for writing (UTF-8; gzip for ``.gz``)."""
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, mode, encoding="utf-8", compresslevel=6,
                         newline="\n")
    return open(path, mode, encoding="utf-8", newline="\n")


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


def _check_dims(num_features: int | None, num_labels: int) -> None:
    for name, v in (("num_features", num_features), ("num_labels", num_labels)):
        if v is not None and v > MAX_DIM:
            raise ValueError(f"{name} = {v} exceeds 2**31 - 1 = {MAX_DIM}: "
                             "the readers use int32 ids")


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
      ValueError: a feature value is not finite, or ``num_features`` or
        ``num_labels`` exceeds ``2**31 - 1`` (the readers' bound).
    """
    x = _canonical(sp.csr_matrix(dataset.features, dtype=np.float32))
    if x.nnz and not np.isfinite(x.data).all():
        raise ValueError("write_xc: features contain non-finite values")
    y = _label_matrix(dataset.labels)
    _check_dims(x.shape[1], y.shape[1])
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

    Raises:
      ValueError: ``L`` exceeds ``2**31 - 1`` (the readers' bound).
    """
    y = _label_matrix(labels)
    _check_dims(None, y.shape[1])
    n = y.shape[0]
    with _open_text(path, "wt") as f:
        f.write(f"{n} {y.shape[1]}\n")
        for start in range(0, n, _WRITE_ROWS):
            stop = min(n, start + _WRITE_ROWS)
            f.write("".join(
                s + "\n"
                for s in _row_strings(y, start, stop, with_values=False)))
