"""Python wrappers and gradients of the uniform-sparse ops.

Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces -- Learning with 500k Labels on a Single
Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.
`uniform_sparse_matmul_sparse_input` applies the same layer to a sparse input
batch through the inverted index of its connections.

Inside :func:`xmc_tf.ops.stock.stock_ops` (portable SavedModels,
:func:`xmc_tf.saving.export_saved_model`), both forward products trace to
TensorFlow's own ops instead (:func:`uniform_sparse_matmul_stock`): the
same scores up to float32 rounding, with no ``Xmc>`` op.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.ops import _loader, stock

#: Gathered elements per block of labels in the stock formulation
#: (:func:`uniform_sparse_matmul_stock`): 4 MiB of float32, so a block
#: stays in the cache between the gather and the reduction.
STOCK_BLOCK_ELEMENTS = 1 << 20
#: Below this batch size the stock formulation multiplies and sums
#: (``reduce_sum``); from it on, one small matrix product per label
#: (``BatchMatMul``), faster there (benchmarks/serving.py).
_STOCK_MATMUL_BATCH = 16


def uniform_sparse_matmul(features, indices, weights, name=None):
    """Scores of a uniformly sparse output layer (Algorithm 1).

    ``scores[i, j] = sum_k features[i, indices[j, k]] * weights[j, k]``: every
    label ``j`` has exactly ``fan_in`` incoming connections.

    The connection matrices are label-major, ``[num_labels, fan_in]`` (the
    paper's Fig. 1c stores the transpose): one label's connections are
    contiguous, so a CPU thread reads them in one cache line and a GPU warp in
    one coalesced load, SET rewiring operates on rows, and the matrices shard
    by label.  Storage is 8 bytes per structural non-zero (int32 index and
    float32 weight), against 20 for a ``tf.SparseTensor`` (two int64 indices).

    The gradients skip zero entries of the back-propagated signal without
    reading the operands they would multiply (Sec. 3.3, implicit negative
    mining): with the squared hinge most entries are zero.

    Inside :func:`xmc_tf.ops.stock.stock_ops` this is
    :func:`uniform_sparse_matmul_stock` (TensorFlow's ops only).

    Args:
      features: ``[batch, num_features]`` float32, float16 or bfloat16.
      indices: ``[num_labels, fan_in]`` int32, entries in
        ``[0, num_features)``.
      weights: ``[num_labels, fan_in]``, same dtype as ``features``.
      name: optional op name.

    Returns:
      ``[batch, num_labels]`` scores, dtype of ``features`` (accumulated in
      float32).

    Raises:
      tf.errors.InvalidArgumentError: an operand is not a matrix, ``weights``
        and ``indices`` differ in shape, or an index is out of range (the
        message names the entry, e.g. ``indices[3, 7] = 600``).  The forward
        checks every index; the gradients (on the CPU) the rows of the
        labels with a non-zero signal, the only ones they read, and name
        the smallest bad position among those.
      xmc_tf.errors.OpLibraryError: the op library is missing or was built for
        another TensorFlow.

    >>> import numpy as np, xmc_tf
    >>> x = np.array([[1., 2., 3.]], np.float32)
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)      # 2 labels, fan-in 2
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> xmc_tf.ops.uniform_sparse_matmul(x, idx, w).numpy()
    array([[4., 2.]], dtype=float32)
    """
    if stock.stock_formulations():
        return uniform_sparse_matmul_stock(features, indices, weights,
                                           name=name)
    return _loader.load().xmc_uniform_sparse_matmul(
        features=features, indices=indices, weights=weights, name=name)


def _checked_weights(indices, weights):
    """``weights`` after checking that its shape equals ``indices``' ``[m,
    s]``: now where the static shapes say it, else when the graph runs.

    Raises:
      ValueError: the static shapes differ.
    """
    if not indices.shape.is_compatible_with(weights.shape):
        raise ValueError(f"weights shape {weights.shape} must equal "
                         f"indices shape {indices.shape} ([m, s])")
    if indices.shape.is_fully_defined() and weights.shape.is_fully_defined():
        return weights
    with tf.control_dependencies([tf.debugging.assert_equal(
            tf.shape(indices), tf.shape(weights),
            message="weights shape must equal indices shape")]):
        return tf.identity(weights)


def uniform_sparse_matmul_stock(features, indices, weights, name=None):
    """`uniform_sparse_matmul` in TensorFlow's own ops (no ``Xmc>`` op).

    ``scores[i, j] = sum_k features[i, indices[j, k]] * weights[j, k]``
    (Schultheis & Babbar, Algorithm 1), for SavedModels that load without
    xmc_tf (:func:`xmc_tf.saving.export_saved_model`).  The labels are
    scored in blocks (a ``tf.while_loop``) of about
    :data:`STOCK_BLOCK_ELEMENTS` / (fan-in * batch) labels each: the
    block's inputs are gathered as rows of the transposed batch
    (``tf.gather(features^T, indices[block])``, ``[L, s, batch]``) and
    reduced with the block's weights (multiply and ``reduce_sum`` below a
    batch of 16, a ``[1, s] x [s, batch]`` ``BatchMatMul`` per label
    from it on), so no ``[batch, m, s]`` tensor exists (22 GB at
    ``m = 670k``, ``s = 32``, batch 256).  Time ``O(batch m s)``, like the
    op; extra memory ``O(batch (m + e))`` plus one block.

    Numerics: inputs are cast to float32, products and sums are float32
    (as the op's CPU kernels accumulate), the result is cast back to the
    dtype of ``features`` (mixed precision: float16/bfloat16 in and out).
    The summation order differs from the op's: scores agree up to float32
    rounding, not bitwise.  Differentiable (TensorFlow's gradients).

    Args:
      features: ``[batch, e]`` float32, float16 or bfloat16.
      indices: ``[m, s]`` int32 (a variable is read once), entries in
        ``[0, e)``; repeats within a row add up.
      weights: ``[m, s]`` float (cast to float32).
      name: optional name scope.

    Returns:
      ``[batch, m]`` scores, dtype of ``features``.

    Raises:
      ValueError: ``weights`` and ``indices`` of statically different
        shapes, or an operand that is not a matrix.
      tf.errors.InvalidArgumentError: (at run time) an index out of
        ``[0, e)`` (on the CPU: ``tf.gather`` names it), or shapes that
        differ.

    >>> import numpy as np
    >>> x = np.array([[1., 2., 3.]], np.float32)
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> uniform_sparse_matmul_stock(x, idx, w).numpy()
    array([[4., 2.]], dtype=float32)
    """
    with tf.name_scope(name or "uniform_sparse_matmul_stock"):
        features = tf.convert_to_tensor(features)
        indices = tf.convert_to_tensor(indices, tf.int32)
        weights = tf.cast(tf.convert_to_tensor(weights), tf.float32)
        if features.shape.rank not in (None, 2) or \
                indices.shape.rank not in (None, 2):
            raise ValueError("features [batch, e] and indices [m, s] must be "
                             f"matrices, got {features.shape} and "
                             f"{indices.shape}")
        weights = _checked_weights(indices, weights)
        dtype = features.dtype
        x_t = tf.transpose(tf.cast(features, tf.float32))  # [e, b]
        batch = tf.shape(x_t)[1]
        m, s = tf.shape(indices)[0], tf.shape(indices)[1]
        block = tf.maximum(1, STOCK_BLOCK_ELEMENTS //
                           tf.maximum(1, s * batch))
        block = tf.minimum(block, tf.maximum(m, 1))
        num_blocks = (m + block - 1) // block
        small_batch = batch < _STOCK_MATMUL_BATCH

        def body(i, parts):
            lo = i * block
            hi = tf.minimum(m, lo + block)
            gathered = tf.gather(x_t, indices[lo:hi])  # [L, s, b]
            w = weights[lo:hi]                           # [L, s]
            part = tf.cond(
                small_batch,
                lambda: tf.reduce_sum(gathered * w[:, :, None], axis=1),
                lambda: tf.matmul(w[:, None, :], gathered)[:, 0, :])
            return i + 1, parts.write(i, part)

        parts = tf.TensorArray(tf.float32, size=num_blocks, infer_shape=False,
                               element_shape=tf.TensorShape([None, None]))
        _, parts = tf.while_loop(lambda i, _: i < num_blocks, body,
                                 [tf.constant(0), parts])
        scores = tf.transpose(tf.reshape(parts.concat(), [m, batch]))
        scores.set_shape([features.shape[0], indices.shape[0]])
        return tf.cast(scores, dtype)


@tf.RegisterGradient("Xmc>UniformSparseMatmul")
def _uniform_sparse_matmul_grad(op, grad):
    """Gradients w.r.t. features (Algorithm 2) and weights (Algorithm 3),
    from one pass over ``grad`` (``Xmc>UniformSparseMatmulGrad``)."""
    features, indices, weights = op.inputs
    grad_features, grad_weights = _loader.load().xmc_uniform_sparse_matmul_grad(
        backward=grad, features=features, indices=indices, weights=weights)
    return grad_features, None, grad_weights


def uniform_sparse_grad_apply(backward, features, indices, weights, state,
                              alpha, rule="sgd", kahan=False, beta_1=0.9,
                              beta_2=0.999, epsilon=1e-7, lazy=True,
                              name=None):
    """The features gradient and the weights' optimizer step, in one op.

    Returns ``grad_features[i, indices[j, k]] += backward[i, j] *
    weights[j, k]`` (Algorithm 2 of Schultheis & Babbar, with the weights
    before the step) and, in place, steps every label ``j`` with a non-zero
    ``backward[:, j]`` along its gradient ``g[j, k] = sum_i backward[i, j] *
    features[i, indices[j, k]]`` (Algorithm 3): ``rule="sgd"``: ``w -= alpha
    * g``; ``rule="adam"``: ``m += (g - m)(1 - beta_1)``, ``v += (g^2 - v)(1
    - beta_2)``, ``w -= alpha m / (sqrt(v) + epsilon)`` (Kingma & Ba,
    Algorithm 1 per row, the bias correction folded into ``alpha``).  With
    ``kahan`` the step is added with Kahan's compensated summation (a
    compensation ``c`` per weight carries what the store in the weights'
    dtype rounded off), so a bfloat16 weight keeps steps far below its
    precision (ELMO, Zhang et al., ICML 2025, trains its classifier so).
    With ``lazy`` labels without signal keep weights and state (a "lazy"
    update; with the squared hinge their gradient is 0); without it (Adam)
    they take the step of a zero gradient (the moments decay, the weights
    move along ``m``: ``keras.optimizers.Adam`` on the dense gradient), a
    pass over all ``m s`` weights and moments.  The ``[m, s]`` weights gradient
    never exists: memory is the ``[b, e]`` output and a few KiB per thread.
    Arithmetic in float32 (op ``Xmc>UniformSparseGradApply``; CPU only).

    Args:
      backward: ``[b, m]`` float32 or bfloat16, the loss's gradient w.r.t.
        the scores.
      features: ``[b, e]``, ``backward``'s dtype.
      indices: ``[m, s]`` int32.
      weights: a resource ``tf.Variable`` ``[m, s]`` of ``features``' dtype.
      state: list of variables of ``weights``' shape and dtype: ``[c]``
        with ``kahan``, then ``[m, v]`` with ``rule="adam"``.
      alpha: float32 scalar, the step size (see above).
      rule: ``"sgd"`` or ``"adam"``.
      kahan: compensated summation (one more state variable).
      beta_1, beta_2, epsilon: Adam's (unused by sgd).
      lazy: step only the labels with signal (Adam; SGD is lazy anyway).
      name: optional op name.

    Returns:
      ``[b, e]`` grad_features, ``features``' dtype.

    Raises:
      tf.errors.InvalidArgumentError: shapes, dtypes or the number of state
        variables that do not match, two operands that are one variable, or
        an index out of range in the row of a label with signal (the message
        names the smallest such position; nothing is written then).
      tf.errors.FailedPreconditionError: an uninitialised variable.
      xmc_tf.errors.OpLibraryError: the op library lacks the op.

    >>> import numpy as np, tensorflow as tf
    >>> w = tf.Variable([[1.0, 2.0]])
    >>> gx = uniform_sparse_grad_apply(
    ...     np.array([[0.5]], np.float32), np.array([[1.0, 3.0, 0.0]], np.float32),
    ...     np.array([[0, 1]], np.int32), w, [], 0.1)
    >>> gx.numpy().tolist(), [round(float(v), 3) for v in w.numpy()[0]]
    ([[0.5, 1.0, 0.0]], [0.95, 1.85])
    """
    variables = [v.handle if hasattr(v, "handle") else v for v in state]
    handle = weights.handle if hasattr(weights, "handle") else weights
    return _loader.load().xmc_uniform_sparse_grad_apply(
        backward=backward, features=features,
        indices=tf.convert_to_tensor(indices, tf.int32), weights=handle,
        state=variables, alpha=tf.cast(alpha, tf.float32),
        one_minus_beta1=tf.cast(1.0 - beta_1, tf.float32),
        one_minus_beta2=tf.cast(1.0 - beta_2, tf.float32),
        epsilon=tf.cast(epsilon, tf.float32), rule=rule, kahan=bool(kahan),
        lazy=bool(lazy), name=name)


tf.no_gradient("Xmc>UniformSparseGradApply")

_INT32_MAX = 2**31 - 1


def uniform_sparse_inverted_index(indices, num_features, name=None):
    """Inverted index (CSR of the transpose) of uniform-sparse connections.

    A counting sort of the flat positions ``p = j * s + k`` by their feature
    ``indices[j, k]``: the positions connected to feature ``f`` are
    ``entries[offsets[f]:offsets[f + 1]]``, in increasing ``p`` (label ``p //
    s``).  ``O(m s + D)`` time and memory, multi-threaded.  The index depends
    on ``indices`` only: a caller whose connections rarely change (SET
    rewiring) can keep it and pass it to `uniform_sparse_matmul_sparse_input`.

    Args:
      indices: ``[m, s]`` int32, entries in ``[0, num_features)``.
      num_features: int or scalar int64 tensor ``D >= 0``.
      name: optional op name.

    Returns:
      ``(offsets, entries)``: ``[D + 1]`` int64 and ``[m s]`` int32 (int64
      when ``m s`` does not fit int32 or is not statically known).

    Raises:
      tf.errors.InvalidArgumentError: an index out of ``[0, D)`` (the message
        names the entry, e.g. ``indices[3, 7] = 600``) or ``D < 0``.

    >>> import numpy as np, xmc_tf
    >>> offsets, entries = xmc_tf.ops.uniform_sparse_inverted_index(
    ...     np.array([[0, 2], [1, 1]], np.int32), 3)
    >>> offsets.numpy().tolist(), entries.numpy().tolist()
    ([0, 1, 3, 4], [0, 2, 3, 1])
    """
    indices = tf.convert_to_tensor(indices, tf.int32)
    num_connections = indices.shape.num_elements()
    narrow = num_connections is not None and num_connections <= _INT32_MAX
    return _loader.load().xmc_uniform_sparse_inverted_index(
        indices=indices, num_features=tf.cast(num_features, tf.int64),
        Tidx=tf.int32 if narrow else tf.int64, name=name)


def uniform_sparse_matmul_sparse_input(sp_input, indices, weights, name=None,
                                       inverted_index=None):
    """Uniform-sparse layer scores on a sparse input batch (no densifying).

    The same scores as ``uniform_sparse_matmul(tf.sparse.to_dense(sp_input),
    indices, weights)`` (up to float32 rounding), for the layer used as a
    per-label sparse linear classifier directly on sparse (tf-idf) input
    features: ``scores[i, j] = sum_k x[i, indices[j, k]] * weights[j, k]``.

    Instead of gathering ``x[i, indices[j, k]]`` for every label (``b * m *
    s`` multiply-adds, nearly all against zeros), the connections are
    traversed feature by feature: ``Xmc>UniformSparseInvertedIndex`` sorts
    the flat positions ``p = j * s + k`` by feature (CSR of the transposed
    connection matrix, ``O(m s + D)``), and
    ``Xmc>UniformSparseMatmulSparseInput`` adds ``v * weights_flat[p]`` to
    ``scores[i, p // s]`` for every stored entry ``(i, f, v)`` and every
    position ``p`` connected to ``f``.  Cost: ``O(b m)`` to zero the output
    plus one multiply-add per (stored entry, connected position) pair, about
    ``nnz * m * s / D``; no ``[b, D]`` dense batch is materialised.  The
    gradient w.r.t. ``weights``
    (``Xmc>UniformSparseMatmulSparseInputGradWeights``) groups the batch's
    entries by feature and costs the same; there is no gradient w.r.t. the
    input (``sp_input`` is data: its gradient is ``None``), nor w.r.t.
    ``indices``.

    Repeated ``(i, f)`` entries of ``sp_input`` add up (``tf.sparse.to_dense``
    would reject them); the order of the entries does not matter.  Only
    stored entries form products: an inf/NaN weight reaches only the rows
    that store a value (even an explicit 0) for its feature, where the dense
    path would spread ``0 * inf = NaN`` to every row.

    float32 only.  CPU kernels only: under a GPU device scope TensorFlow
    places these ops on the CPU (soft placement).  Source: Schultheis &
    Babbar's uniform-sparse layer (Sec. 3.1-3.3), applied to sparse inputs
    with the transposed (inverted) traversal.

    Inside :func:`xmc_tf.ops.stock.stock_ops` (portable SavedModels) the
    batch is made dense instead (``tf.scatter_nd``, repeated entries adding
    up; ``b e`` floats) and scored by :func:`uniform_sparse_matmul_stock`
    (``b m s`` multiply-adds, TensorFlow's ops only; ``inverted_index`` is
    not used).  Same scores up to float32 rounding for finite weights (a
    non-finite weight reaches every row there, as on the dense path).

    Args:
      sp_input: ``tf.SparseTensor`` ``[b, D]`` float32, the input batch.
      indices: ``[m, s]`` int32, entries in ``[0, D)``.
      weights: ``[m, s]`` float32.
      name: optional name scope.
      inverted_index: optional ``(offsets, entries)`` of ``indices`` from
        `uniform_sparse_inverted_index` with ``D`` features (e.g. kept while
        the connections do not change: building it is a sort of the ``m s``
        connections, often the largest part of the op's time); built from
        ``indices`` when None.

    Returns:
      ``[b, m]`` float32 scores.

    Raises:
      tf.errors.InvalidArgumentError: an index out of ``[0, D)`` (the
        message names the entry, e.g. ``indices[3, 7] = 600``), a
        ``sp_input`` entry whose row or column is out of range, a bad
        ``inverted_index`` where the batch reads it (the sizes, and the
        lists of the features the batch stores; a kept index is not
        re-read whole in every call), ``weights``
        and ``indices`` of different shapes not known statically, or a
        non-float32 dtype (from the ops' type attributes; in graph
        construction this surfaces as a ``TypeError`` instead).
      ValueError: ``weights`` and ``indices`` of statically different
        shapes, or ``sp_input`` not of rank 2.
      xmc_tf.errors.OpLibraryError: the op library is missing or was built for
        another TensorFlow.

    >>> import numpy as np, tensorflow as tf, xmc_tf
    >>> x = tf.sparse.from_dense(np.array([[1., 0., 3.]], np.float32))
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)      # 2 labels, fan-in 2
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> xmc_tf.ops.uniform_sparse_matmul_sparse_input(x, idx, w).numpy()
    array([[4., 0.]], dtype=float32)
    """
    with tf.name_scope(name or "uniform_sparse_matmul_sparse_input"):
        if not isinstance(sp_input, tf.SparseTensor):
            sp_input = tf.SparseTensor.from_value(sp_input)
        if sp_input.shape.rank not in (None, 2):
            raise ValueError("sp_input must be a [batch, num_features] "
                             f"SparseTensor, got shape {sp_input.shape}")
        if stock.stock_formulations():
            # Repeated (i, f) entries add up, as in the op.
            dense = tf.scatter_nd(tf.cast(sp_input.indices, tf.int64),
                                  sp_input.values,
                                  tf.cast(sp_input.dense_shape, tf.int64))
            if sp_input.shape.rank == 2:
                dense.set_shape(sp_input.shape)
            return uniform_sparse_matmul_stock(dense, indices, weights)
        lib = _loader.load()
        weights = tf.convert_to_tensor(weights)
        indices = tf.convert_to_tensor(indices, tf.int32)
        # The ops see only m * s through the index: check [m, s] here.
        weights = _checked_weights(indices, weights)
        dense_shape = tf.cast(sp_input.dense_shape, tf.int64)
        if inverted_index is None:
            inverted_index = uniform_sparse_inverted_index(indices,
                                                           dense_shape[-1])
        offsets, entries = inverted_index
        coords = tf.cast(sp_input.indices, tf.int64)
        scores = lib.xmc_uniform_sparse_matmul_sparse_input(
            rows=coords[:, 0], cols=coords[:, 1], values=sp_input.values,
            batch_size=dense_shape[0], offsets=offsets, entries=entries,
            weights=weights)
        if sp_input.shape.rank == 2:
            scores.set_shape([sp_input.shape[0], None])
        return scores


tf.no_gradient("Xmc>UniformSparseInvertedIndex")


@tf.RegisterGradient("Xmc>UniformSparseMatmulSparseInput")
def _uniform_sparse_matmul_sparse_input_grad(op, grad):
    """Gradient w.r.t. weights only; rows, cols and values are input data,
    batch_size and the inverted index integers: all None."""
    rows, cols, values, _, offsets, entries, weights = op.inputs
    lib = _loader.load()
    grad_weights = lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
        backward=grad, rows=rows, cols=cols, values=values, offsets=offsets,
        entries=entries, weights=weights)
    return None, None, None, None, None, None, grad_weights


tf.no_gradient("Xmc>SetRewire")


def _has_op(python_name: str) -> bool:
    """Whether the op library has the op of this wrapper name; False when
    the library is missing, stale or fails to load."""
    try:
        return hasattr(_loader.load(), python_name)
    except Exception:  # OpLibraryError, or a library that fails to load
        return False


def set_rewire_supported() -> bool:
    """Whether the op library has ``Xmc>SetRewire``.

    Returns:
      bool; False when the library is missing, stale or lacks the op.
    """
    return _has_op("xmc_set_rewire")


def set_rewire(indices, weights, num_moved, num_features, seed, name=None):
    """One SET prune/regrow step of uniform-sparse connections (op).

    Per label ``j``: the ``num_moved`` connections of smallest
    ``|weights[j, k]|`` (ties: lower ``k`` first; NaN counts as larger
    than every number) are removed and as many sources are drawn uniformly,
    distinct, among those the label was not connected to before (when
    ``num_features - fan_in >= num_moved``), else among those it is not
    connected to after the removal: the contract of
    :func:`xmc_tf.callbacks.rewiring.rewire`, in one multi-threaded pass of
    ``O(num_labels * fan_in)`` (op ``Xmc>SetRewire``).  The draws depend on
    ``seed`` only (a counter-based generator keyed by seed and label), not
    on the number of threads.  CPU only.

    Source: Mocanu et al., SET (Nature Communications 2018), applied to the
    output layer by Schultheis & Babbar, Sec. 2 and 4.1.

    Args:
      indices: ``[m, s]`` int32, entries in ``[0, num_features)``.
      weights: ``[m, s]`` float32 or bfloat16 (other dtypes are cast to
        float32).
      num_moved: int ``n``, ``0 <= n <= s`` (an op attribute).
      num_features: int ``e``, ``s <= e < 2^31``.
      seed: two int64 values.
      name: optional op name.

    Returns:
      ``(new_indices, positions)``: ``[m, s]`` int32 (``indices`` with the
      moved positions replaced) and ``[m, n]`` int64 (the moved positions,
      sorted per row).

    Raises:
      tf.errors.InvalidArgumentError: shapes, an index out of range (the
        message names the entry), ``n > s`` or ``e < s``.
      xmc_tf.errors.OpLibraryError: the op library is missing or stale.

    >>> import numpy as np, xmc_tf
    >>> new, pos = xmc_tf.ops.uniform_sparse.set_rewire(
    ...     np.array([[0, 1, 2]], np.int32), np.array([[0.5, -0.1, 2.0]],
    ...     np.float32), 1, 10, [1, 2])
    >>> pos.numpy().tolist(), int(new[0, 1]) not in (0, 1, 2)
    ([[1]], True)
    """
    return _loader.load().xmc_set_rewire(
        indices=tf.convert_to_tensor(indices, tf.int32),
        weights=_set_weights(weights),
        num_features=tf.cast(num_features, tf.int64),
        seed=tf.cast(tf.convert_to_tensor(seed), tf.int64),
        num_moved=int(num_moved), name=name)


def resource_set_rewire_supported() -> bool:
    """Whether the op library has ``Xmc>ResourceSetRewire``.

    Returns:
      bool; False when the library is missing, stale or lacks the op.
    """
    return _has_op("xmc_resource_set_rewire")


def resource_set_rewire(indices, weights, state, num_moved, num_features,
                        seed, name=None):
    """:func:`set_rewire` written into the variables (op
    ``Xmc>ResourceSetRewire``).

    The same new connections as ``set_rewire(indices, weights, num_moved,
    num_features, seed)``; the ``indices`` variable's rows are rewritten in
    place, and the moved positions of ``weights`` and of every variable in
    ``state`` (optimizer slots, a fused update's state) are set to zero.
    No ``[m, s]`` buffer is allocated: at 2.8M labels and fan-in 96 the
    tensor path holds a new ``[m, s]`` int32 index (1 GiB), the ``[m, n]``
    positions, an ``[m, s]`` mask and one ``[m, s]`` copy per variable
    reset.  Source: Mocanu et al., SET (2018); Schultheis & Babbar,
    Sec. 4.1.  CPU only.

    Args:
      indices: int32 resource variable ``[m, s]``, entries in ``[0, e)``.
      weights: float32 or bfloat16 resource variable ``[m, s]``.
      state: list of resource variables ``[m, s]`` (any dtype).
      num_moved: int ``n``, ``0 <= n <= s``.
      num_features: int ``e``, ``s <= e < 2^31``.
      seed: two int64 values (as :func:`set_rewire`).
      name: optional op name.

    Returns:
      ``(moved, pruned_abs_sum)``: int64 scalar ``m n`` and the float64 sum
      of the pruned ``|weights|``.

    Raises:
      tf.errors.InvalidArgumentError: shapes or dtypes that do not match,
        two operands that are one variable, an index out of range (the
        message names the first; nothing is written), ``n > s`` or
        ``e < s``.
      xmc_tf.errors.OpLibraryError: the op library is missing or stale.

    >>> import numpy as np, tensorflow as tf
    >>> idx = tf.Variable(np.array([[0, 1, 2]], np.int32))
    >>> w = tf.Variable(np.array([[0.5, -0.1, 2.0]], np.float32))
    >>> moved, pruned = resource_set_rewire(idx, w, [], 1, 10, [1, 2])
    >>> int(moved), round(float(pruned), 3), w.numpy()[0].tolist()
    (1, 0.1, [0.5, 0.0, 2.0])
    """
    def handle(v):
        return v.handle if hasattr(v, "handle") else v
    return _loader.load().xmc_resource_set_rewire(
        indices=handle(indices), weights=handle(weights),
        state=[handle(v) for v in state],
        num_features=tf.cast(num_features, tf.int64),
        seed=tf.cast(tf.convert_to_tensor(seed), tf.int64),
        num_moved=int(num_moved), T=weights.dtype, name=name)


def _set_weights(weights):
    """``weights`` as the ``Xmc>SetRewire`` operand: float32 or bfloat16 as
    they are, other dtypes cast to float32."""
    weights = tf.convert_to_tensor(weights)
    if weights.dtype in (tf.float32, tf.bfloat16):
        return weights
    return tf.cast(weights, tf.float32)
