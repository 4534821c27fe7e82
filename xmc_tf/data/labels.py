"""Label matrices in the forms Keras' ``fit`` takes: padded label ids.

XMC labels are held as a scipy CSR ``[num_instances, num_labels]`` 0/1
matrix (``XCDataset.labels``), a list of label-id lists, or a dense
multi-hot array.  The losses, metrics and trainers of xmc_tf read label ids
padded with -1 (``int32 [n, width]``), which never build a dense
``[n, num_labels]`` array; :func:`padded_label_ids` makes them.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

__all__ = ["padded_label_ids", "label_matrix", "is_multi_class"]


def label_matrix(labels, num_labels: int | None = None) -> sp.csr_matrix:
    """A CSR ``[n, num_labels]`` 0/1 matrix from any label form.

    Args:
      labels: scipy sparse ``[n, m]`` (entries ``!= 0`` are positives),
        dense ``[n, m]`` multi-hot (entries ``> 0``), int ``[n, w]`` label
        ids padded with negative values, int ``[n]`` one id per instance,
        or a sequence of ``n`` label-id sequences.
      num_labels: m; needed for ids (default: the largest id + 1); for a
        matrix it must equal the matrix's width when given.

    Returns:
      ``scipy.sparse.csr_matrix`` float32 with sorted, distinct column
      indices per row.

    Raises:
      ValueError: a negative ``num_labels``, an id ``>= num_labels``, or a
        matrix whose width differs from ``num_labels`` (both sizes named).

    >>> label_matrix([[2], [0, 1], []], num_labels=3).toarray()
    array([[0., 0., 1.],
           [1., 1., 0.],
           [0., 0., 0.]], dtype=float32)
    """
    if sp.issparse(labels):
        y = sp.csr_matrix(labels, dtype=np.float32)
        y.data = (y.data != 0).astype(np.float32)
        y.eliminate_zeros()
        if num_labels is not None and y.shape[1] != int(num_labels):
            raise ValueError(f"the label matrix has {y.shape[1]} columns but "
                             f"the model has {int(num_labels)} labels")
        y.sum_duplicates()
        y.sort_indices()
        return y
    if isinstance(labels, np.ndarray) or hasattr(labels, "numpy"):
        arr = np.asarray(labels)
        if arr.ndim == 2 and arr.dtype.kind in "fb":
            if num_labels is not None and arr.shape[1] != int(num_labels):
                # Float ids (a strategy's cast) are not a label matrix.
                return _from_id_rows([r[r >= 0].astype(np.int64) for r in
                                      np.rint(arr)], num_labels)
            return sp.csr_matrix((arr > 0).astype(np.float32))
        if arr.ndim == 1 and arr.dtype.kind in "iu":
            arr = arr[:, None]
        if arr.ndim == 2 and arr.dtype.kind in "iu":
            return _from_id_rows([r[r >= 0] for r in arr.astype(np.int64)],
                                 num_labels)
        if arr.dtype != object:
            raise ValueError(f"labels of shape {arr.shape} and dtype "
                             f"{arr.dtype}: expected a [n, num_labels] "
                             "matrix, padded int ids or lists of ids")
    return _from_id_rows([np.asarray(r, dtype=np.int64).reshape(-1)
                          for r in labels], num_labels)


def _from_id_rows(rows, num_labels):
    lengths = np.fromiter((len(r) for r in rows), np.int64, len(rows))
    ids = (np.concatenate(rows) if len(rows) else
           np.zeros(0, np.int64)).astype(np.int64)
    if ids.size and ids.min() < 0:
        raise ValueError(f"label id {int(ids.min())} is negative (pad with "
                         "-1 only in padded id arrays)")
    top = int(ids.max()) + 1 if ids.size else 0
    m = top if num_labels is None else int(num_labels)
    if m < 0:
        raise ValueError(f"num_labels={m} is negative")
    if top > m:
        raise ValueError(f"label id {top - 1} is out of range for "
                         f"{m} labels (ids must be in [0, {m}))")
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    y = sp.csr_matrix((np.ones(ids.size, np.float32), ids, indptr),
                      shape=(len(rows), m))
    y.sum_duplicates()
    y.data[:] = 1.0
    y.sort_indices()
    return y


def padded_label_ids(labels, num_labels: int | None = None,
                     width: int | None = None) -> np.ndarray:
    """Label ids padded with -1, ``int32 [n, width]``, from any label form.

    What :func:`xmc_tf.data.make_tf_dataset` yields per batch, for a whole
    label matrix: row ``i`` holds the sorted ids of instance ``i``'s labels,
    then -1.  Pass the result as ``y`` to ``fit`` (memory ``4 n width``
    bytes, never ``n num_labels``).

    Args:
      labels: any form :func:`label_matrix` takes (scipy CSR, multi-hot,
        padded ids, lists of ids).
      num_labels: m, checked against the ids / the matrix width when given.
      width: columns of the result (default: the most labels of a row, at
        least 1).

    Returns:
      int32 ``[n, width]``.

    Raises:
      ValueError: as :func:`label_matrix`; a row with more than ``width``
        labels.

    >>> import scipy.sparse as sp
    >>> padded_label_ids(sp.csr_matrix([[0, 1, 1], [1, 0, 0]]))
    array([[ 1,  2],
           [ 0, -1]], dtype=int32)
    """
    y = label_matrix(labels, num_labels)
    counts = np.diff(y.indptr)
    most = int(counts.max()) if counts.size else 0
    width = max(most, 1) if width is None else int(width)
    if most > width:
        raise ValueError(f"a row has {most} labels, more than width={width}")
    out = np.full((y.shape[0], width), -1, np.int32)
    rows = np.repeat(np.arange(y.shape[0]), counts)
    cols = np.arange(y.indices.size) - np.repeat(y.indptr[:-1], counts)
    out[rows, cols] = y.indices
    return out


def is_multi_class(labels) -> bool:
    """Whether training labels are multi-class: every instance has at most
    one label (and there is at least one instance).

    Args:
      labels: ``scipy.sparse`` CSR ``[n, m]`` label matrix (explicit
        entries are labels).

    Returns:
      bool.

    >>> import scipy.sparse as sp
    >>> is_multi_class(sp.identity(3, format="csr"))
    True
    >>> is_multi_class(sp.csr_matrix([[1, 1], [0, 1]]))
    False
    """
    counts = labels.indptr[1:] - labels.indptr[:-1]
    return bool(counts.size) and int(counts.max()) <= 1
