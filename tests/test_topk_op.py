"""Tests of Xmc>TopK (ops/topk/) and its wrapper xmc_tf.ops.topk.top_k.

References: an independent NumPy ranking (``np.lexsort`` on NaN flag,
negated value, column id: larger value first, ties by the lower id, NaN
last) and ``tf.math.top_k`` (identical values and ids on rows without NaN).
"""

import numpy as np
import pytest
import tensorflow as tf

from op_requirements import needs_ops
from xmc_tf.ops import _loader
from xmc_tf.ops import topk as topk_module
from xmc_tf.ops.topk import top_k, top_k_supported

pytestmark = needs_ops("xmc_top_k")


def np_top_k(x, k):
    """(values, ids) of the k best of each row: larger first, ties by the
    lower id, NaN below every number."""
    x = np.asarray(x, np.float32)
    ids = np.empty((x.shape[0], k), np.int64)
    for i, row in enumerate(x):
        nan = np.isnan(row)
        neg = np.where(nan, 0.0, -row.astype(np.float64))
        order = np.lexsort((np.arange(row.size), neg, nan))
        ids[i] = order[:k]
    return np.take_along_axis(x, ids, axis=1), ids


def op(x, k):
    values, indices = _loader.load().xmc_top_k(tf.constant(x, tf.float32), k=k)
    return values.numpy(), indices.numpy()


def assert_matches(x, k, with_tf=True):
    values, ids = op(x, k)
    ref_values, ref_ids = np_top_k(x, k)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(values, ref_values)  # NaN == NaN here
    assert ids.dtype == np.int32 and values.dtype == np.float32
    if with_tf:
        ref = tf.math.top_k(tf.constant(x, tf.float32), k)
        np.testing.assert_array_equal(ids, ref.indices.numpy())
        np.testing.assert_array_equal(values, ref.values.numpy())


def _cases(rng, b, m):
    """Random and adversarial rows [b, m] (no NaN)."""
    yield "normal", rng.standard_normal((b, m)).astype(np.float32)
    yield "few values (ties)", rng.integers(0, 3, (b, m)).astype(np.float32)
    yield "all equal", np.full((b, m), 0.25, np.float32)
    yield "all -inf", np.full((b, m), -np.inf, np.float32)
    yield "increasing", np.tile(np.arange(m, dtype=np.float32), (b, 1))
    yield "decreasing", np.tile(-np.arange(m, dtype=np.float32), (b, 1))
    yield "+-0", np.where(rng.random((b, m)) < 0.5, -0.0, 0.0).astype(
        np.float32)
    inf = rng.standard_normal((b, m)).astype(np.float32)
    inf[rng.random((b, m)) < 0.3] = -np.inf
    inf[rng.random((b, m)) < 0.01] = np.inf
    yield "+-inf mixed", inf
    late = np.full((b, m), -1.0, np.float32)
    late[:, -1] = 1.0  # the best entry last (a chunk's tail)
    yield "best last", late


@pytest.mark.parametrize("m", [1, 7, 63, 64, 65, 1000, 5000])
def test_matches_numpy_and_tf_math_top_k(m):
    rng = np.random.default_rng(m)
    ks = sorted({0, 1, min(m, 5), min(m, 64), min(m, 100), m - 1, m} - {-1})
    for name, x in _cases(rng, 3, m):
        for k in ks:
            try:
                assert_matches(x, k)
            except AssertionError as e:
                raise AssertionError(f"case {name!r}, m={m}, k={k}") from e


def test_rows_split_into_chunks():
    # One row of 200k scores: several (row, chunk) units, merged per row;
    # a tie straddling chunk boundaries, and k above a 64-score group.
    rng = np.random.default_rng(1)
    m = 200_003
    for name, x in _cases(rng, 1, m):
        for k in (1, 5, 300):
            try:
                assert_matches(x, k)
            except AssertionError as e:
                raise AssertionError(f"case {name!r}, k={k}") from e
    x = np.zeros((2, m), np.float32)
    x[:, [5, 70_000, 140_000, 199_999]] = 1.0
    assert_matches(x, 3)
    assert_matches(rng.standard_normal((2, m)).astype(np.float32), m)


@pytest.mark.parametrize("dtype", [tf.float16, tf.bfloat16])
@pytest.mark.parametrize("m", [7, 65, 5000, 200_003])
def test_half_and_bfloat16_rank_like_their_float32_values(dtype, m):
    """float16 / bfloat16 scores (CPU): the ids of the NumPy ranking of
    their float32 values (exact), the values in the scores' dtype, and the
    same as tf.math.top_k in that dtype; rounding makes many ties."""
    rng = np.random.default_rng(m + 11)
    for name, x in _cases(rng, 2, m):
        narrow = tf.cast(tf.constant(x), dtype)
        wide = tf.cast(narrow, tf.float32).numpy()
        for k in sorted({0, 1, min(m, 5), min(m, 100), m}):
            values, ids = _loader.load().xmc_top_k(narrow, k=k)
            assert values.dtype == dtype and ids.dtype == tf.int32
            ref_values, ref_ids = np_top_k(wide, k)
            try:
                np.testing.assert_array_equal(ids.numpy(), ref_ids)
                np.testing.assert_array_equal(
                    tf.cast(values, tf.float32).numpy(), ref_values)
                ref = tf.math.top_k(narrow, k)
                np.testing.assert_array_equal(ids.numpy(),
                                              ref.indices.numpy())
                np.testing.assert_array_equal(
                    tf.cast(values, tf.float32).numpy(),
                    tf.cast(ref.values, tf.float32).numpy())
            except AssertionError as e:
                raise AssertionError(f"case {name!r}, m={m}, k={k}") from e
    # The wrapper runs the op for these dtypes too.
    narrow = tf.cast(tf.constant(rng.standard_normal((3, m))), dtype)
    got = top_k(narrow, min(m, 4))
    values, ids = _loader.load().xmc_top_k(narrow, k=min(m, 4))
    assert got.values.dtype == dtype
    np.testing.assert_array_equal(got.indices.numpy(), ids.numpy())


def test_nan_ranks_below_every_number():
    x = np.array([[1.0, np.nan, 3.0, -np.inf, np.nan, 2.0]], np.float32)
    values, ids = op(x, 6)
    assert ids.tolist() == [[2, 5, 0, 3, 1, 4]]
    np.testing.assert_array_equal(values, [[3, 2, 1, -np.inf, np.nan, np.nan]])
    rng = np.random.default_rng(2)
    for m in (10, 1000, 100_000):
        y = rng.standard_normal((2, m)).astype(np.float32)
        y[rng.random((2, m)) < 0.2] = np.nan
        y[0, :7] = np.nan  # NaNs in the first k: a NaN threshold at first
        for k in (1, 5, min(m, 70)):
            assert_matches(y, k, with_tf=False)
    assert_matches(np.full((2, 300), np.nan, np.float32), 5, with_tf=False)


def test_invalid_arguments_fail_cleanly():
    lib = _loader.load()
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError),
                       match="exceeds"):
        lib.xmc_top_k(tf.zeros([2, 3]), k=4)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        lib.xmc_top_k(tf.zeros([2, 3, 4]), k=1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        lib.xmc_top_k(tf.zeros([3]), k=1)
    with pytest.raises((tf.errors.InvalidArgumentError, ValueError)):
        lib.xmc_top_k(tf.zeros([2, 3]), k=-1)

    @tf.function(input_signature=[tf.TensorSpec([None, None], tf.float32)])
    def unknown_width(x):  # k > m only known at run time: the kernel checks
        return lib.xmc_top_k(x, k=4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="exceeds"):
        unknown_width(tf.zeros([2, 3]))
    empty = lib.xmc_top_k(tf.zeros([0, 5]), k=2)
    assert empty.values.shape == (0, 2) and empty.indices.shape == (0, 2)


def test_wrapper_shapes_and_fallbacks(monkeypatch):
    assert top_k_supported()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 3, 50)).astype(np.float32)
    values, ids = top_k(x, 4)  # rank 3: rows are the leading axes
    ref = tf.math.top_k(x, 4)
    assert values.shape == (2, 3, 4)
    np.testing.assert_array_equal(ids.numpy(), ref.indices.numpy())
    values, ids = top_k(x[0, 0], 4)  # rank 1
    np.testing.assert_array_equal(ids.numpy(), ref.indices.numpy()[0, 0])

    @tf.function(input_signature=[tf.TensorSpec([None, 50], tf.float32)])
    def traced(s):
        out = top_k(s, 5)
        assert out.indices.shape.as_list() == [None, 5]
        return out
    np.testing.assert_array_equal(traced(x[0]).indices.numpy(),
                                  tf.math.top_k(x[0], 5).indices.numpy())
    # float64 and a tensor k go to tf.math.top_k; so does a missing op.
    x64 = x[0].astype(np.float64)
    assert top_k(x64, 2).values.dtype == tf.float64
    np.testing.assert_array_equal(top_k(x[0], tf.constant(2)).indices.numpy(),
                                  tf.math.top_k(x[0], 2).indices.numpy())
    monkeypatch.setattr(topk_module, "top_k_supported", lambda: False)
    np.testing.assert_array_equal(top_k(x[0], 3).indices.numpy(),
                                  tf.math.top_k(x[0], 3).indices.numpy())
    with pytest.raises(ValueError, match="scalar"):
        top_k(tf.constant(1.0), 1)


def test_wrapper_checks_k_at_trace_time():
    with pytest.raises(ValueError, match=r"k=6 must be in \[0, m=5\]"):
        top_k(tf.zeros([2, 5]), 6)


def test_xla_compiled_functions_use_tf_math_top_k():
    # XLA cannot compile custom ops: a jit_compile=True function (a Keras
    # model compiled with jit_compile=True and a P@k metric) gets
    # tf.math.top_k, with the same result.
    x = np.random.default_rng(4).standard_normal((3, 40)).astype(np.float32)
    compiled = tf.function(lambda s: top_k(s, 5), jit_compile=True)
    np.testing.assert_array_equal(compiled(x).indices.numpy(),
                                  np_top_k(x, 5)[1])
