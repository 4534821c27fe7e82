"""NumPy reference of the one-vs-all squared hinge from padded label ids.

Shared by tests/test_hinge_op.py, the ``hinge`` fuzz target
(tests/fuzz/op_fuzz.py) and tests/gpu/test_hinge_cuda.py (NumPy only: the
GPU tests run without TensorFlow).
"""

import numpy as np


def squared_hinge_reference(scores, labels, margin, upstream=None):
    """float64 ``(loss [b], grad [b, m])`` from the multi-hot targets.

    ``labels`` ``[b, n]`` ids, negative = padding, a repeated id counts
    once; ``grad = -2 s relu(margin - s scores) * upstream[:, None]``
    (upstream defaults to ones).
    """
    b, m = scores.shape
    y = np.zeros((b, m))
    for i, row in enumerate(labels):
        for j in row:
            if j >= 0:
                y[i, j] = 1.0
    s = 2.0 * y - 1.0
    h = np.maximum(margin - s * scores.astype(np.float64), 0.0)
    up = np.ones(b) if upstream is None else np.asarray(upstream, np.float64)
    return (h ** 2).sum(axis=1), -2.0 * s * h * up[:, None]
