"""Candidate scoring for sampled training: scores of selected labels only.

Sampled training scores, per instance, only its positives plus ``k``
candidate negatives instead of all ``num_labels`` labels (ASTRA, Mehta et
al., Algorithm 1 steps 17-18; Sec. 5.2 (c): the matrix product is done with
the positives and the selected negatives, O(batch * log L) memory instead of
O(batch * L)).  Two output layers are covered:

* :func:`uniform_sparse_sampled_matmul`: the uniform-sparse layer of
  Schultheis & Babbar (Sec. 3.2), op ``Xmc>UniformSparseSampledMatmul`` and
  its two gradient ops (``ops/sampled/``);
* :func:`dense_sampled_matmul`: a dense layer whose kernel is stored
  label-major ``[num_labels, d]`` (:class:`xmc_tf.layers.LabelDense`), with
  ``tf.gather`` and ``tf.einsum``.

Both return the gradient w.r.t. the label parameters as a
``tf.IndexedSlices`` whose indices are the flattened candidates, so an
optimizer touches only the scored label rows (Keras' TensorFlow optimizers
apply IndexedSlices with ``scatter_*`` updates).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
# Private, but stable here: TensorFlow is pinned to one release (op ABI).
# variable_accessed() makes a GradientTape / FuncGraph watch a variable that
# an op reads through its handle, as tf.Variable.sparse_read does.
from tensorflow.python.ops import resource_variable_ops

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

__all__ = ["check_candidates", "dense_sampled_matmul", "gather_label_rows",
           "label_variable", "mask_accidental_hits",
           "uniform_sparse_sampled_matmul"]


def uniform_sparse_sampled_matmul(features, indices, weights, candidates,
                                  name=None):
    """Uniform-sparse scores of per-instance candidate labels.

    ``scores[i, j] = sum_k features[i, indices[r, k]] * weights[r, k]`` with
    ``r = candidates[i, j]``: the same value as
    ``tf.gather(uniform_sparse_matmul(features, indices, weights),
    candidates, batch_dims=1)`` at ``O(batch * num_candidates * fan_in)``
    instead of ``O(batch * num_labels * fan_in)`` cost, and without the
    ``[batch, num_labels]`` score matrix.

    Gradients (registered for ``Xmc>UniformSparseSampledMatmul`` and its
    resource-variable variant):

    * w.r.t. ``features``: dense ``[batch, num_features]``;
    * w.r.t. ``weights``: ``tf.IndexedSlices(values, indices, dense_shape)``
      with ``values [batch * num_candidates, fan_in]`` (row ``i * c + j`` is
      ``backward[i, j] * features[i, indices[candidates[i, j], :]]``),
      ``indices = reshape(candidates, [-1])`` (duplicates allowed; they are
      summed when densified) and ``dense_shape = shape(weights)`` (int64).

    Both gradient kernels skip zero entries of the back-propagated signal
    without reading the candidate's connections, weights or the features
    (Schultheis & Babbar, Sec. 3.3: the squared hinge makes most entries zero).

    Args:
      features: ``[batch, num_features]`` float32, float16 or bfloat16 (the
        input of the output layer).
      indices: ``[num_labels, fan_in]`` int32 connections, entries in
        ``[0, num_features)``.  Only the rows of candidate labels are read and
        range-checked (the gradients: only those with non-zero signal).
      weights: ``[num_labels, fan_in]``, dtype of ``features``: a tensor,
        or a ``tf.Variable`` / ``keras.Variable``, which is then read in place
        by ``Xmc>ResourceUniformSparseSampledMatmul`` (never copied whole,
        see :func:`label_variable`); the gradient goes to the variable.
      candidates: ``[batch, num_candidates]`` int32 label ids in
        ``[0, num_labels)``; may repeat within and across rows.  Padding must
        hold a valid id (mask its scores in the loss).
      name: optional op name.

    Returns:
      ``[batch, num_candidates]`` scores, dtype of ``features`` (accumulated
      in float32).  No bias, no activation.

    Raises:
      tf.errors.InvalidArgumentError: an operand is not a matrix, shapes
        disagree (``weights`` vs ``indices``, the batch of ``candidates`` vs
        ``features``), a candidate is out of range (``candidates[0, 3] = 9
        is out of range [0, 7) (num_labels)``) or an index read is out of
        range (``indices[4, 1] = 12 is out of range [0, 10) (num_features);
        label 4 is candidates[0, 2]``).  In graph mode static shape
        mismatches raise ``ValueError`` when the op is created.
      xmc_tf.errors.OpLibraryError: the op library is missing or stale.

    >>> import numpy as np, xmc_tf
    >>> x = np.array([[1., 2., 3.]], np.float32)
    >>> idx = np.array([[0, 2], [1, 1], [2, 2]], np.int32)  # 3 labels, s = 2
    >>> w = np.array([[1., 1.], [.5, .5], [1., 0.]], np.float32)
    >>> cand = np.array([[2, 0]], np.int32)
    >>> xmc_tf.ops.uniform_sparse_sampled_matmul(x, idx, w, cand).numpy()
    array([[3., 4.]], dtype=float32)
    """
    features = tf.convert_to_tensor(features)
    if stock.stock_formulations():
        return uniform_sparse_sampled_matmul_stock(features, indices, weights,
                                                   candidates, name=name)
    lib = _sampled_ops()
    variable = label_variable(weights)
    if variable is not None and variable.dtype == features.dtype:
        # Read in place: no dense read of the (copy-on-read) variable.
        resource_variable_ops.variable_accessed(variable)  # tape, FuncGraph
        return lib.xmc_resource_uniform_sparse_sampled_matmul(
            features=features, indices=indices, weights=variable.handle,
            candidates=candidates, name=name)
    return lib.xmc_uniform_sparse_sampled_matmul(
        features=features, indices=indices, weights=weights,
        candidates=candidates, name=name)


def uniform_sparse_sampled_matmul_stock(features, indices, weights,
                                        candidates, name=None):
    """:func:`uniform_sparse_sampled_matmul` in TensorFlow's ops (portable
    SavedModels, :func:`xmc_tf.ops.stock.stock_ops`): the candidates' rows
    of ``indices`` and ``weights`` gathered (``[batch, C, s]``), the
    features gathered at them, multiplied and summed (float32).  Candidates
    are range-checked (:func:`check_candidates`); the same scores up to
    float32 rounding."""
    with tf.name_scope(name or "uniform_sparse_sampled_matmul_stock"):
        features = tf.convert_to_tensor(features)
        candidates = check_candidates(tf.cast(candidates, tf.int32),
                                      tf.shape(indices)[0])
        cols = gather_label_rows(indices, candidates)  # [b, C, s]
        rows = gather_label_rows(weights, candidates, tf.float32)
        x = tf.gather(tf.cast(features, tf.float32), cols, batch_dims=1)
        return tf.cast(tf.reduce_sum(x * rows, axis=-1), features.dtype)


def label_variable(value):
    """The resource ``tf.Variable`` behind ``value``, or None.

    Label parameters that receive ``IndexedSlices`` gradients should be read
    in place (``Xmc>ResourceUniformSparseSampledMatmul``) or row by row
    (``ResourceGather``): after the first sparse update TensorFlow keeps the
    variable in copy-on-read mode, where every dense read copies all of it
    (128 MiB per read at m = 1M, s = 32).

    Args:
      value: a ``tf.Variable``, a ``keras.Variable`` of the TensorFlow
        backend, or anything else.

    Returns:
      The ``tf.Variable`` (with a ``handle``), or None for tensors, arrays
      and ``tf.distribute`` variables (read densely instead).
    """
    variable = value
    if not isinstance(variable, tf.Variable):
        # keras.Variable (TF backend) keeps its tf.Variable in `_value`;
        # `.value` may be an autocast copy.
        variable = getattr(value, "_value", None)
    if (not isinstance(variable, tf.Variable)
            or isinstance(variable, tf.distribute.DistributedValues)
            or not hasattr(variable, "handle")):
        return None
    return variable


def gather_label_rows(params, candidates, dtype=None):
    """``params[candidates]`` reading only those rows of a variable.

    Args:
      params: ``[num_labels, ...]`` variable (``tf.Variable`` /
        ``keras.Variable``: read with ``ResourceGather``) or tensor.
      candidates: integer ids, any shape, in ``[0, num_labels)`` (not checked
        here; see :func:`check_candidates`).
      dtype: cast the gathered rows to this dtype (None: keep).

    Returns:
      ``candidates.shape + params.shape[1:]``.  Its gradient w.r.t.
      ``params`` is a ``tf.IndexedSlices`` over the flattened candidates.
    """
    variable = label_variable(params)
    rows = tf.gather(variable if variable is not None else params, candidates)
    if dtype is not None and rows.dtype != tf.as_dtype(dtype):
        rows = tf.cast(rows, dtype)
    return rows


def _sampled_ops():
    """The op module, checked to hold the ops of ``ops/sampled/``."""
    lib = _loader.load()
    if not hasattr(lib, "xmc_uniform_sparse_sampled_matmul"):
        raise OpLibraryError(
            f"{_loader.library_path()} has no Xmc>UniformSparseSampledMatmul "
            "op (built before ops/sampled/ existed): rebuild the op library "
            "(`pip install .` or tools/build_ops.py)")
    return lib


@tf.RegisterGradient("Xmc>UniformSparseSampledMatmul")
def _uniform_sparse_sampled_matmul_grad(op, grad):
    """Dense gradient w.r.t. features, IndexedSlices w.r.t. weights."""
    features, indices, weights, candidates = op.inputs
    grad_features = _sampled_ops().xmc_uniform_sparse_sampled_matmul_grad_features(
        backward=grad, features=features, indices=indices, weights=weights,
        candidates=candidates)
    grad_weights = _weights_slices(grad, features, indices, candidates,
                                   tf.shape(weights, out_type=tf.int64))
    return grad_features, None, grad_weights, None


@tf.RegisterGradient("Xmc>ResourceUniformSparseSampledMatmul")
def _resource_uniform_sparse_sampled_matmul_grad(op, grad):
    """As above; the weights are read in place from the variable."""
    features, indices, handle, candidates = op.inputs
    lib = _sampled_ops()
    grad_features = lib.xmc_resource_uniform_sparse_sampled_matmul_grad_features(
        backward=grad, features=features, indices=indices, weights=handle,
        candidates=candidates)
    grad_weights = _weights_slices(
        grad, features, indices, candidates,
        tf.raw_ops.VariableShape(input=handle, out_type=tf.int64))
    return grad_features, None, grad_weights, None


def _weights_slices(grad, features, indices, candidates, dense_shape):
    """The weight gradient as IndexedSlices over the flattened candidates."""
    values = _sampled_ops().xmc_uniform_sparse_sampled_matmul_grad_weights(
        backward=grad, features=features, indices=indices,
        candidates=candidates)
    return tf.IndexedSlices(values, tf.reshape(candidates, [-1]),
                            dense_shape=dense_shape)


def check_candidates(candidates, num_labels, name="candidates"):
    """Raises InvalidArgumentError naming the first out-of-range candidate.

    ``tf.gather`` checks its indices on CPU but returns zeros for
    out-of-range ones on GPU; this check makes both devices fail alike.  It
    reads the ``[batch, num_candidates]`` ids once (cheap next to scoring
    them).  Works eagerly (checked at once) and inside ``tf.function`` (a
    ``tf.debugging.Assert`` that the returned tensor depends on).

    Args:
      candidates: integer ``[batch, num_candidates]`` label ids.
      num_labels: int or scalar tensor, m; valid ids are ``[0, m)``.
      name: how the message calls the tensor.

    Returns:
      ``candidates`` (as a tensor), after the check in graph mode.

    Raises:
      tf.errors.InvalidArgumentError: some entry is outside ``[0, m)``; the
        message gives the first one's position and value
        (``candidates[0, 1] = 7 is out of range [0, 5) (num_labels)``
        eagerly; position ``(i, j)`` and value as Assert data in a graph).

    >>> import xmc_tf
    >>> xmc_tf.ops.check_candidates([[0, 2]], 3).numpy()
    array([[0, 2]], dtype=int32)
    """
    candidates = tf.convert_to_tensor(candidates)
    num_labels = tf.cast(num_labels, candidates.dtype)
    if tf.executing_eagerly():
        ids = candidates.numpy()
        bad = np.argwhere((ids < 0) | (ids >= num_labels.numpy()))
        if bad.size:
            i, j = (int(v) for v in bad[0])
            raise tf.errors.InvalidArgumentError(
                None, None, f"{name}[{i}, {j}] = {ids[i, j]} is out of range "
                f"[0, {int(num_labels)}) (num_labels)")
        return candidates
    bad = tf.where((candidates < 0) | (candidates >= num_labels))
    first = tf.concat([bad[:1], tf.constant([[-1, -1]], tf.int64)], 0)[0]
    value = tf.concat([tf.gather_nd(candidates, bad[:1]),
                       tf.constant([-1], candidates.dtype)], 0)[0]
    check = tf.debugging.Assert(
        tf.equal(tf.size(bad), 0),
        [f"{name}[i, j] is out of range [0, num_labels): (i, j) =", first,
         "value =", value, "num_labels =", num_labels], summarize=4)
    with tf.control_dependencies([check]):
        return tf.identity(candidates)


def check_shared_candidates(candidates, num_labels):
    """:func:`check_candidates` for one id vector shared by a batch.

    Args:
      candidates: integer ``[C]`` label ids.
      num_labels: int or scalar tensor, m.

    Returns:
      int32 ``[C]`` (after the check in graph mode).

    Raises:
      tf.errors.InvalidArgumentError: some id is outside ``[0, m)``.

    >>> import xmc_tf
    >>> xmc_tf.ops.check_shared_candidates([4, 0], 5).numpy()
    array([4, 0], dtype=int32)
    """
    ids = tf.convert_to_tensor(candidates, tf.int32)
    return check_candidates(ids[None, :], num_labels)[0]


def dense_sampled_matmul(features, kernel, candidates, bias=None,
                         validate=True, name=None):
    """Dense-layer scores of per-instance candidate labels.

    ``scores[i, j] = features[i, :] . kernel[candidates[i, j], :]
    (+ bias[candidates[i, j]])``, computed as ``tf.gather`` of the candidate
    rows (``[batch, num_candidates, d]``) and ``tf.einsum``.  Equals
    ``tf.gather(features @ kernel.T + bias, candidates, batch_dims=1)``
    without the ``[batch, num_labels]`` scores.

    The kernel is label-major ``[num_labels, d]`` (row ``j`` is label ``j``'s
    classifier vector, as in :class:`xmc_tf.layers.LabelDense`), so gathering
    candidate rows is contiguous and the gradient w.r.t. ``kernel`` (and
    ``bias``) is a ``tf.IndexedSlices`` over the flattened candidates
    (``tf.gather``'s gradient): an optimizer updates only the scored rows.
    Variables (``tf.Variable``, ``keras.Variable``) are read row by row with
    ``ResourceGather``, never densely (see :func:`label_variable`); the rows
    are cast to the dtype of ``features`` (mixed precision).

    Memory: the gathered rows and their gradient are ``batch *
    num_candidates * d`` floats each (256 x 1000 x 512: 500 MiB); split the
    batch when that is too much.

    Args:
      features: ``[batch, d]`` float tensor.
      kernel: ``[num_labels, d]`` variable or tensor.
      candidates: integer ``[batch, num_candidates]`` ids in
        ``[0, num_labels)``, repeats allowed.
      bias: optional ``[num_labels]`` variable or tensor.
      validate: range-check ``candidates`` with :func:`check_candidates`
        (on GPU ``tf.gather`` would silently return zeros).
      name: optional name scope.

    Returns:
      ``[batch, num_candidates]`` logits (no activation), dtype of
      ``features``.

    Raises:
      ValueError: a static rank is not 2 (``bias``: 1).
      tf.errors.InvalidArgumentError: a candidate is out of range, or the
        batch / ``d`` of the operands disagree.

    >>> import numpy as np, xmc_tf
    >>> x = np.array([[1., 2.]], np.float32)
    >>> kernel = np.array([[1., 0.], [0., 1.], [1., 1.]], np.float32)
    >>> xmc_tf.ops.dense_sampled_matmul(x, kernel, [[2, 0]]).numpy()
    array([[3., 1.]], dtype=float32)
    """
    with tf.name_scope(name or "dense_sampled_matmul"):
        features = tf.convert_to_tensor(features)
        candidates = tf.convert_to_tensor(candidates)
        for tensor, what, rank in [(features, "features", 2),
                                   (candidates, "candidates", 2),
                                   (kernel, "kernel", 2)]:
            static_rank = tf.TensorShape(tensor.shape).rank
            if static_rank is not None and static_rank != rank:
                raise ValueError(f"{what} must have rank {rank}, got shape "
                                 f"{tensor.shape}")
        if bias is not None and tf.TensorShape(bias.shape).rank not in (None, 1):
            raise ValueError(f"bias must have rank 1, got shape {bias.shape}")
        if not candidates.dtype.is_integer:
            raise TypeError(f"candidates must be integer, got {candidates.dtype}")
        if validate:
            num_labels = tf.TensorShape(kernel.shape)[0]
            if num_labels is None:
                num_labels = tf.shape(kernel)[0]
            candidates = check_candidates(candidates, num_labels)
        rows = gather_label_rows(kernel, candidates, features.dtype)  # [b, c, d]
        scores = tf.einsum("bd,bcd->bc", features, rows)
        if bias is not None:
            scores += gather_label_rows(bias, candidates, scores.dtype)
        return scores


def mask_accidental_hits(ids, positives):
    """Bool ``[b, k]``: True where ``ids[i, j]`` is not among row i's positives.

    Args:
      ids: int32 ``[b, k]`` candidate ids, or ``[k]`` shared by all rows.
      positives: int32 ``[b, n]`` positive ids padded with -1.

    Returns:
      bool ``[b, k]``.  Cost ``O(b k n)``; fine for the tens of positives
      of XMC rows.
    """
    ids = tf.cast(ids, tf.int32)
    positives = tf.cast(positives, tf.int32)
    if ids.shape.rank == 1:
        ids = ids[None, :]
    hit = tf.reduce_any(tf.equal(ids[:, :, None], positives[:, None, :]),
                        axis=-1)
    return tf.logical_not(hit)
