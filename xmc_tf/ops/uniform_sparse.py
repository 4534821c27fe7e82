"""Python wrappers and gradients of the uniform-sparse ops.

Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces -- Learning with 500k Labels on a Single
Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.ops import _loader


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
        message names the entry, e.g. ``indices[3, 7] = 600``).
      xmc_tf.ops.OpLibraryError: the op library is missing or was built for
        another TensorFlow.

    >>> import numpy as np, xmc_tf
    >>> x = np.array([[1., 2., 3.]], np.float32)
    >>> idx = np.array([[0, 2], [1, 1]], np.int32)      # 2 labels, fan-in 2
    >>> w = np.array([[1., 1.], [0.5, 0.5]], np.float32)
    >>> xmc_tf.ops.uniform_sparse_matmul(x, idx, w).numpy()
    array([[4., 2.]], dtype=float32)
    """
    return _loader.load().xmc_uniform_sparse_matmul(
        features=features, indices=indices, weights=weights, name=name)


@tf.RegisterGradient("Xmc>UniformSparseMatmul")
def _uniform_sparse_matmul_grad(op, grad):
    """Gradients w.r.t. features (Algorithm 2) and weights (Algorithm 3)."""
    features, indices, weights = op.inputs
    lib = _loader.load()
    grad_features = lib.xmc_uniform_sparse_matmul_grad_features(
        backward=grad, features=features, indices=indices, weights=weights)
    grad_weights = lib.xmc_uniform_sparse_matmul_grad_weights(
        backward=grad, features=features, indices=indices)
    return grad_features, None, grad_weights
