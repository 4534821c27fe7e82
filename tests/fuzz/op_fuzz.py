"""Property-based fuzz of the custom ops, run in a child process.

Usage (what ``test_fuzz_ops.py`` runs)::

    python tests/fuzz/op_fuzz.py TARGET MAX_EXAMPLES

Each *target* checks one op family with hypothesis (seeded:
``derandomize=True``, no example database) against an independent NumPy
reference.  Before every example the process prints one ``CASE ...`` line
(flushed), and ``faulthandler`` is on, so a kernel that crashes the process
(segfault, abort) leaves the failing case as the last ``CASE`` line and a
native traceback on stderr; the parent test reports both.  Exit codes:
0 passed, 1 a property failed (hypothesis prints the shrunk example),
77 skipped (op library or op family missing), negative: killed by a
signal.

Adding a target (sampled ops, LSH ops, ...): write a function taking
``max_examples``, decorate it with ``@target("name")`` in the section
reserved for it below, import TensorFlow inside the function, and call
``skip(...)`` when the library lacks the op.  ``test_fuzz_ops.py`` picks it
up automatically.
"""

from __future__ import annotations

import faulthandler
import os
import sys

import numpy as np

TARGETS = {}

SKIP = 77


def target(name):
    """Registers ``fn(max_examples)`` as the fuzz target ``name``."""
    def register(fn):
        TARGETS[name] = fn
        return fn
    return register


class Skip(Exception):
    pass


def skip(reason):
    raise Skip(reason)


def case(name, **fields):
    """Announces the next example (the last line before a crash)."""
    text = " ".join(f"{k}={v}" for k, v in fields.items())
    print(f"CASE {name} {text}", flush=True)


def _settings(max_examples):
    from hypothesis import HealthCheck, settings
    return settings(max_examples=max_examples, derandomize=True,
                    database=None, deadline=None, print_blob=True,
                    suppress_health_check=list(HealthCheck))


def _library(op_name):
    from xmc_tf.ops import _loader
    try:
        lib = _loader.load()
    except _loader.OpLibraryError as e:
        skip(f"op library not available: {e}")
    if not hasattr(lib, op_name):
        skip(f"op library built without {op_name}")
    return lib


def _expect_rejected(call, what, contains=None, errors=None):
    """Calls ``call()`` and fails unless it raises one of ``errors``.

    Args:
      call: a no-argument callable running the op on bad input.
      what: the bad input, for the failure message.
      contains: text the error message must hold (None: any message).
      errors: exception types that count as a rejection (default:
        ``tf.errors.InvalidArgumentError`` or ``ValueError``, the latter
        from shape inference).

    Raises:
      AssertionError: ``call`` returned, or its message lacks ``contains``.
    """
    import tensorflow as tf
    if errors is None:
        errors = (tf.errors.InvalidArgumentError, ValueError)
    try:
        call()
    except errors as err:
        if contains is not None:
            assert contains in str(err), (what, contains, str(err)[:300])
    else:
        raise AssertionError(f"{what} accepted")


# ---------------------------------------------------------------------------
# Uniform-sparse ops: Xmc>UniformSparseMatmul and its two gradients.


def _us_reference(x, idx, w, g):
    """float64 references; zero backward entries contribute exactly 0 (the
    documented skip semantics of both gradients)."""
    x64, w64, g64 = (v.astype(np.float64) for v in (x, w, g))
    b, e = x.shape
    m, s = idx.shape
    with np.errstate(invalid="ignore", over="ignore"):
        gathered = x64[:, idx] if m * s else np.zeros((b, m, s))
        scores = (gathered * w64[None]).sum(axis=2) if s else np.zeros((b, m))
        nz = g64 != 0
        gw_terms = np.where(nz[:, :, None], g64[:, :, None] * gathered, 0.0)
        grad_w = gw_terms.sum(axis=0) if b else np.zeros((m, s))
        gx_terms = np.where(nz[:, :, None], g64[:, :, None] * w64[None], 0.0)
        grad_x = np.zeros((b, e))
        rows = np.broadcast_to(np.arange(b)[:, None, None], gx_terms.shape)
        cols = np.broadcast_to(idx[None], gx_terms.shape)
        np.add.at(grad_x, (rows, cols), gx_terms)
    return scores, grad_x, grad_w


def _us_terms_scale(x, idx, w, g):
    """Per-output sums of |terms| (float64): rounding-error scales."""
    ax, aw, ag = (np.abs(v.astype(np.float64)) for v in (x, w, g))
    return _us_reference(ax, idx, aw, ag)


_U32 = 2.0 ** -24


def _assert_close(got, want, scale, out_eps, n_terms, what):
    """Same NaN/+-inf pattern; finite entries within the float32
    accumulation bound ``n_terms * u * sum|terms|`` plus the rounding of
    the output to its dtype (``out_eps * |want|``)."""
    got = np.asarray(got, np.float64)
    assert got.shape == want.shape, (what, got.shape, want.shape)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want),
                                  err_msg=f"{what}: NaN pattern")
    np.testing.assert_array_equal(np.isposinf(got), np.isposinf(want),
                                  err_msg=f"{what}: +inf pattern")
    np.testing.assert_array_equal(np.isneginf(got), np.isneginf(want),
                                  err_msg=f"{what}: -inf pattern")
    fin = np.isfinite(want)
    sc = np.where(np.isfinite(scale[fin]), scale[fin], 0.0)
    rel, absolute = out_eps
    tol = (rel * np.abs(want[fin]) + (n_terms + 2) * _U32 * sc + absolute +
           2.0 ** -149)
    err = np.abs(got[fin] - want[fin])
    assert (err <= tol).all(), (
        f"{what}: error {err.max()} > tolerance at flat index "
        f"{int(np.argmax(err - tol))}")


@target("uniform_sparse")
def fuzz_uniform_sparse(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    import tensorflow as tf

    lib = _library("xmc_uniform_sparse_matmul")
    settings = _settings(max_examples)
    # dtype -> (TF dtype, output rounding: half an ulp relative, and half
    # the subnormal spacing absolute)
    # (float32 and bfloat16 results below 2^-126 may be flushed to zero:
    # TensorFlow's CPU kernels run with flush-to-zero.)
    dtypes = {"float32": (tf.float32, (2.0 ** -24, 2.0 ** -126)),
              "float16": (tf.float16, (2.0 ** -11, 2.0 ** -25)),
              "bfloat16": (tf.bfloat16, (2.0 ** -8, 2.0 ** -126))}

    def run(x, idx, w, g, dtype):
        xt, wt, gt = (tf.cast(tf.constant(v), dtype) for v in (x, w, g))
        it = tf.constant(idx, tf.int32)
        y = lib.xmc_uniform_sparse_matmul(features=xt, indices=it,
                                          weights=wt)
        gx = lib.xmc_uniform_sparse_matmul_grad_features(
            backward=gt, features=xt, indices=it, weights=wt)
        gw = lib.xmc_uniform_sparse_matmul_grad_weights(
            backward=gt, features=xt, indices=it)
        for t in (y, gx, gw):
            assert t.dtype == dtype
        return [tf.cast(t, tf.float64).numpy() for t in (y, gx, gw)]

    shapes = st.one_of(
        st.tuples(st.integers(0, 40), st.integers(1, 50), st.integers(0, 60),
                  st.integers(0, 12)),
        # b < 2 threads and >= 4096 labels: label-chunked features gradient.
        st.tuples(st.integers(1, 3), st.integers(1, 20),
                  st.integers(4096, 4400), st.integers(1, 3)),
        # many instances: transposed-features weight gradient paths.
        st.tuples(st.integers(60, 300), st.integers(1, 30),
                  st.integers(1, 40), st.integers(1, 6)))

    @settings
    @given(shape=shapes, dtype=st.sampled_from(sorted(dtypes)),
           density=st.sampled_from([0.0, 0.01, 0.2, 0.6, 0.9, 1.0]),
           special=st.sampled_from(["none", "nonfinite", "nonfinite",
                                    "ties"]),
           seed=st.integers(0, 2**31 - 1))
    def matmul_and_gradients(shape, dtype, density, special, seed):
        b, e, m, s = shape
        case("uniform_sparse.values", b=b, e=e, m=m, s=s, dtype=dtype,
             density=density, special=special, seed=seed)
        rng = np.random.default_rng(seed)
        tf_dtype, eps = dtypes[dtype]
        x = rng.normal(size=(b, e)).astype(np.float32)
        w = rng.normal(size=(m, s)).astype(np.float32)
        g = rng.normal(size=(b, m)).astype(np.float32)
        if special == "ties":  # small integers: sums are exact
            x, w, g = (np.round(v * 2) for v in (x, w, g))
        g[rng.random((b, m)) >= density] = 0.0
        idx = rng.integers(0, e, size=(m, s)).astype(np.int32)
        if special == "nonfinite":  # also against zero backward entries
            for arr in (x, w):
                k = rng.integers(1, 4)
                if arr.size:
                    flat = arr.reshape(-1)
                    flat[rng.integers(0, arr.size, k)] = rng.choice(
                        [np.inf, -np.inf, np.nan], k)
        # The reference sees the inputs rounded to the op's dtype.
        x, w, g = (tf.cast(tf.cast(v, tf_dtype), tf.float32).numpy()
                   for v in (x, w, g))
        got = run(x, idx, w, g, tf_dtype)
        want = _us_reference(x, idx, w, g)
        scale = _us_terms_scale(x, idx, w, g)
        lengths = (s, m * s, b)  # reduction lengths of the three outputs
        for name, gv, wv, sv, n in zip(("scores", "grad_features",
                                        "grad_weights"), got, want, scale,
                                       lengths):
            _assert_close(gv, wv, sv, eps, n, name)
        if density == 0.0:
            assert not got[1].any() and not got[2].any()

    @settings
    @given(e=st.integers(0, 20), m=st.integers(1, 30), s=st.integers(1, 6),
           b=st.integers(0, 5), nbad=st.integers(1, 4),
           seed=st.integers(0, 2**31 - 1),
           values=st.lists(st.sampled_from(
               [-1, -2**31, 2**31 - 1, "e", "e+1", -7]), min_size=4,
               max_size=4))
    def bad_indices(e, m, s, b, nbad, seed, values):
        case("uniform_sparse.bad_indices", e=e, m=m, s=s, b=b, nbad=nbad,
             seed=seed, values=values)
        rng = np.random.default_rng(seed)
        idx = (rng.integers(0, e, size=(m, s)) if e else
               np.zeros((m, s), np.int64))
        pos = rng.choice(m * s, size=min(nbad, m * s), replace=False)
        for p, v in zip(pos, values):
            idx.reshape(-1)[p] = {"e": e, "e+1": e + 1}.get(v, v)
        idx = idx.astype(np.int32)
        bad = np.flatnonzero((idx.reshape(-1) < 0) | (idx.reshape(-1) >= e))
        assert bad.size  # e == 0: every index is out of range
        first = int(bad[0])
        j, k = divmod(first, s)
        want = f"indices[{j}, {k}] = {int(idx.reshape(-1)[first])} "
        x = tf.zeros((b, e))
        w = tf.ones((m, s))
        g = tf.ones((b, m))
        calls = {
            "forward": lambda: lib.xmc_uniform_sparse_matmul(
                features=x, indices=idx, weights=w),
            "grad_features": lambda: lib.xmc_uniform_sparse_matmul_grad_features(
                backward=g, features=x, indices=idx, weights=w),
            "grad_weights": lambda: lib.xmc_uniform_sparse_matmul_grad_weights(
                backward=g, features=x, indices=idx),
        }
        for name, call in calls.items():
            _expect_rejected(call, f"{name}: out-of-range {want}",
                             contains=want,
                             errors=tf.errors.InvalidArgumentError)

    @settings
    @given(kind=st.sampled_from(["weights_shape", "backward_rows",
                                 "backward_cols", "rank", "dtype_mix",
                                 "dtype_f64", "indices_float"]),
           seed=st.integers(0, 2**31 - 1))
    def bad_shapes_and_dtypes(kind, seed):
        case("uniform_sparse.bad_args", kind=kind, seed=seed)
        rng = np.random.default_rng(seed)
        b, e, m, s = (int(v) for v in rng.integers(1, 6, 4))
        x = tf.zeros((b, e))
        idx = tf.zeros((m, s), tf.int32)
        w = tf.ones((m, s))
        g = tf.ones((b, m))
        if kind == "weights_shape":
            w = tf.ones((m + 1, s))
        elif kind == "backward_rows":
            g = tf.ones((b + 1, m))
        elif kind == "backward_cols":
            g = tf.ones((b, m + 1))
        elif kind == "rank":
            x = tf.zeros((b, e, 1))
        elif kind == "dtype_mix":
            w = tf.ones((m, s), tf.float16)
        elif kind == "dtype_f64":
            x, w, g = (tf.cast(v, tf.float64) for v in (x, w, g))
        elif kind == "indices_float":
            idx = tf.zeros((m, s))
        errors = (tf.errors.InvalidArgumentError, TypeError, ValueError,
                  tf.errors.NotFoundError)
        calls = [
            lambda: lib.xmc_uniform_sparse_matmul(features=x, indices=idx,
                                                  weights=w),
            lambda: lib.xmc_uniform_sparse_matmul_grad_features(
                backward=g, features=x, indices=idx, weights=w),
            lambda: lib.xmc_uniform_sparse_matmul_grad_weights(
                backward=g, features=x, indices=idx),
        ]
        raised = 0
        for call in calls:
            try:
                call()
            except errors:
                raised += 1
        # Every op that receives the bad operand rejects it.
        expected = {"weights_shape": 2, "backward_rows": 2,
                    "backward_cols": 2, "rank": 3, "dtype_mix": 2,
                    "dtype_f64": 3, "indices_float": 3}[kind]
        assert raised == expected, (kind, raised)

    matmul_and_gradients()
    bad_indices()
    bad_shapes_and_dtypes()


# ---------------------------------------------------------------------------
# MACH decoder: Xmc>MachTopK (threshold, threshold without fallback, brute
# force) against NumPy, bit for bit.


def _ftz(a):
    """Flush subnormal float32 values to zero: TensorFlow runs CPU kernels
    with flush-to-zero and denormals-are-zero set."""
    a = np.array(a, np.float32, copy=True)
    a[np.abs(a) < np.finfo(np.float32).tiny] = 0.0
    return a


def _mach_reference(probs, hashing, k):
    """float32 scores summed in repetition order (like the kernel, with
    flush-to-zero), ranked by (score desc, id asc)."""
    R = probs.shape[1]
    probs = _ftz(probs)
    h = hashing.buckets_numpy(np.arange(hashing.num_labels))
    scores = np.zeros((probs.shape[0], hashing.num_labels), np.float32)
    with np.errstate(over="ignore", invalid="ignore"):
        for r in range(R):
            scores = _ftz(scores + probs[:, r, h[:, r]])
        scores = _ftz(scores / np.float32(R))
    ids = np.empty((probs.shape[0], k), np.int64)
    for i in range(probs.shape[0]):
        ids[i] = np.lexsort((np.arange(hashing.num_labels), -scores[i]))[:k]
    return ids, np.take_along_axis(scores, ids, axis=1)


@target("mach")
def fuzz_mach(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    import tensorflow as tf

    lib = _library("xmc_mach_top_k")
    from xmc_tf.ops.mach import MachHashing, mach_top_k
    settings = _settings(max_examples)

    def probabilities(rng, mode, shape, hashing):
        b, R, B = shape
        if mode == "uniform":
            return rng.random(shape, dtype=np.float32)
        if mode == "ties":
            return (rng.integers(0, 3, shape) / 2).astype(np.float32)
        if mode == "constant":
            return np.full(shape, rng.choice([0.0, 0.125, -1.0]), np.float32)
        if mode == "logits":
            return rng.normal(0, 3, shape).astype(np.float32)
        if mode == "overflow":  # float partial sums overflow to +-inf
            return rng.choice(np.array([3e38, -3e38, 2e38, 3.4e38, -3.4e38,
                                        1.0, 0.0], np.float32), shape)
        if mode == "subnormal":
            return (rng.integers(0, 8, shape) * 1e-45).astype(np.float32)
        if mode == "peaked":
            logits = rng.normal(0, 1, shape).astype(np.float32)
            rel = rng.integers(0, hashing.num_labels, (b, 3))
            hb = hashing.buckets_numpy(rel)
            for t in range(3):
                for r in range(R):
                    logits[np.arange(b), r, hb[:, t, r]] += 6 - t
            ex = np.exp(logits - logits.max(-1, keepdims=True))
            return (ex / ex.sum(-1, keepdims=True)).astype(np.float32)
        raise AssertionError(mode)

    @settings
    @given(m=st.one_of(st.integers(1, 300), st.integers(300, 5000),
                       st.integers(20000, 40000)),
           R=st.integers(1, 8), B=st.integers(1, 64), b=st.integers(0, 5),
           kfrac=st.floats(0, 1), prime=st.sampled_from([2**31 - 1, 10007,
                                                         1000003]),
           mode=st.sampled_from(["uniform", "ties", "constant", "logits",
                                 "overflow", "subnormal", "peaked"]),
           seed=st.integers(0, 2**31 - 1))
    def top_k_matches_reference(m, R, B, b, kfrac, prime, mode, seed):
        m = min(m, prime)
        B = min(B, prime)
        k = max(1, min(m, 1 + int(kfrac * min(m, 40))))
        case("mach.top_k", m=m, R=R, B=B, b=b, k=k, prime=prime, mode=mode,
             seed=seed)
        rng = np.random.default_rng(seed)
        h = MachHashing.random(m, B, R, seed=seed, prime=prime)
        probs = probabilities(rng, mode, (b, R, B), h)
        ref_ids, ref_scores = _mach_reference(probs, h, k)
        for kw in (dict(method="threshold"),
                   dict(method="threshold", brute_force_fallback=False),
                   dict(method="brute_force")):
            ids, scores = mach_top_k(probs, k, h, **kw)
            np.testing.assert_array_equal(ids.numpy(), ref_ids, err_msg=kw)
            np.testing.assert_array_equal(scores.numpy(), ref_scores,
                                          err_msg=kw)

    @settings
    @given(bad=st.sampled_from([np.nan, np.inf, -np.inf]),
           b=st.integers(1, 4), R=st.integers(1, 4), B=st.integers(1, 16),
           method=st.sampled_from(["threshold", "brute_force"]),
           seed=st.integers(0, 2**31 - 1))
    def non_finite_rejected(bad, b, R, B, method, seed):
        case("mach.non_finite", bad=bad, b=b, R=R, B=B, method=method,
             seed=seed)
        rng = np.random.default_rng(seed)
        probs = rng.random((b, R, B), dtype=np.float32)
        row = int(rng.integers(0, b))
        probs[row, rng.integers(0, R), rng.integers(0, B)] = bad
        h = MachHashing.random(5000, B, R, seed=seed)
        _expect_rejected(lambda: mach_top_k(probs, 3, h, method=method),
                         "non-finite probs",
                         contains=f"probs[{row}] contains a NaN",
                         errors=tf.errors.InvalidArgumentError)

    @settings
    @given(attr=st.sampled_from(["k", "hash_a", "hash_b", "prime",
                                 "num_labels", "shape_R", "shape_B"]),
           seed=st.integers(0, 2**31 - 1))
    def bad_attributes(attr, seed):
        case("mach.bad_attrs", attr=attr, seed=seed)
        rng = np.random.default_rng(seed)
        R, B, m = int(rng.integers(1, 5)), int(rng.integers(1, 9)), 100
        attrs = dict(k=2, num_labels=m, num_buckets=B,
                     hash_a=[3] * R, hash_b=[1] * R, prime=2**31 - 1,
                     method=str(rng.choice(["threshold", "brute_force"])))
        shape = [2, R, B]
        if attr == "k":
            attrs["k"] = m + int(rng.integers(1, 5))
        elif attr == "hash_a":
            attrs["hash_a"] = [0] * R
        elif attr == "hash_b":
            attrs["hash_b"] = [-1] * R
        elif attr == "prime":
            attrs["prime"] = int(rng.choice([1, 1000, 2**31 + 11]))
        elif attr == "num_labels":
            attrs.update(num_labels=200, prime=101)
        elif attr == "shape_R":
            shape[1] += 1
        else:
            shape[2] += 1
        _expect_rejected(lambda: lib.xmc_mach_top_k(tf.zeros(shape), **attrs),
                         f"bad {attr}")

    top_k_matches_reference()
    non_finite_rejected()
    bad_attributes()


# ---------------------------------------------------------------------------
# Row-sparse optimizer ops (ops/optimizers/): Xmc>ResourceSparseApplyAdam
# against a NumPy transcription, in the variable's dtype.


def _adam_rows_reference(w, m, v, alpha, omb1, omb2, eps, g, ids):
    """Adam on rows ``ids`` (float arrays of one dtype, flush-to-zero)."""
    w, m, v = w.copy(), m.copy(), v.copy()
    t = w.dtype.type
    for r, i in enumerate(ids):
        m[i] = m[i] + (g[r] - m[i]) * t(omb1)
        v[i] = v[i] + (g[r] * g[r] - v[i]) * t(omb2)
        w[i] = w[i] - (m[i] * t(alpha)) / (np.sqrt(v[i]) + t(eps))
    if w.dtype == np.float32:
        w, m, v = _ftz(w), _ftz(m), _ftz(v)
    return w, m, v


@target("optimizers")
def fuzz_optimizers(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    settings = _settings(max_examples)
    lib = _library("xmc_resource_sparse_apply_adam")
    import tensorflow as tf

    @settings
    @given(n=st.integers(1, 40), row=st.lists(st.integers(0, 5), max_size=2),
           dtype=st.sampled_from(["float32", "float64"]),
           index_dtype=st.sampled_from(["int32", "int64"]),
           steps=st.integers(1, 3), data=st.data())
    def matches_reference(n, row, dtype, index_dtype, steps, data):
        case("optimizers.adam", n=n, row=row, dtype=dtype,
             index_dtype=index_dtype, steps=steps)
        rng = np.random.default_rng(n * 31 + len(row))
        shape = (n,) + tuple(row)
        w0, m0 = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
        v0 = rng.random(shape).astype(dtype)
        w, m, v = (tf.Variable(a) for a in (w0, m0, v0))
        want = (w0, m0, v0)
        for _ in range(steps):
            ids = np.array(data.draw(st.permutations(range(n)))[
                :data.draw(st.integers(0, n))], index_dtype)
            g = rng.standard_normal((len(ids),) + tuple(row)).astype(dtype)
            alpha = float(data.draw(st.floats(1e-4, 1.0)))
            lib.xmc_resource_sparse_apply_adam(
                var=w.handle, m=m.handle, v=v.handle,
                alpha=tf.constant(alpha, dtype),
                one_minus_beta1=tf.constant(0.1, dtype),
                one_minus_beta2=tf.constant(0.001, dtype),
                epsilon=tf.constant(1e-7, dtype), grad=g, indices=ids)
            want = _adam_rows_reference(*want, np.array(alpha, dtype),
                                        np.array(0.1, dtype),
                                        np.array(0.001, dtype),
                                        np.array(1e-7, dtype), g, ids)
        for got, exp in zip((w, m, v), want):
            np.testing.assert_allclose(got.numpy(), exp, rtol=1e-6,
                                       atol=1e-30)

    @settings
    @given(kind=st.sampled_from(["high", "negative", "duplicate",
                                 "grad_rows", "grad_width", "m_shape",
                                 "grad_dtype", "alias", "alpha_vector"]))
    def bad_inputs_rejected_before_any_write(kind):
        case("optimizers.bad", kind=kind)
        n, d = 6, 3
        w0 = np.arange(n * d, dtype=np.float32).reshape(n, d)
        w = tf.Variable(w0)
        m = tf.Variable(np.zeros((n + (kind == "m_shape"), d), np.float32))
        v = tf.Variable(np.zeros((n, d), np.float32))
        ids = {"high": [0, n], "negative": [1, -1],
               "duplicate": [2, 4, 2]}.get(kind, [0, 5])
        g = np.ones((len(ids) + (kind == "grad_rows"),
                     d + (kind == "grad_width")),
                    np.float64 if kind == "grad_dtype" else np.float32)
        args = dict(var=w.handle, m=(w if kind == "alias" else m).handle,
                    v=v.handle,
                    alpha=tf.constant([0.1] * (1 + (kind == "alpha_vector"))
                                      if kind == "alpha_vector" else 0.1),
                    one_minus_beta1=tf.constant(0.1),
                    one_minus_beta2=tf.constant(0.001),
                    epsilon=tf.constant(1e-7), grad=g,
                    indices=np.array(ids, np.int32))
        if kind == "grad_dtype":
            args.update({k: tf.cast(args[k], tf.float64) for k in (
                "alpha", "one_minus_beta1", "one_minus_beta2", "epsilon")})
        _expect_rejected(lambda: lib.xmc_resource_sparse_apply_adam(**args),
                         f"bad {kind}")
        np.testing.assert_array_equal(w.numpy(), w0)
        assert not m.numpy().any() and not v.numpy().any(), kind

    @settings
    @given(shape=st.lists(st.integers(0, 7), max_size=3),
           dtype=st.sampled_from(["float32", "float64"]),
           bad=st.sampled_from(["", "grad_shape", "alias"]))
    def dense_matches_reference(shape, dtype, bad):
        case("optimizers.dense", shape=shape, dtype=dtype, bad=bad)
        rng = np.random.default_rng(len(shape) * 7 + sum(shape))
        w0, m0 = (rng.standard_normal(shape).astype(dtype) for _ in range(2))
        v0 = rng.random(shape).astype(dtype)
        w, m, v = (tf.Variable(a) for a in (w0, m0, v0))
        g = rng.standard_normal(shape + [1] * (bad == "grad_shape"))
        args = dict(var=w.handle, m=(w if bad == "alias" else m).handle,
                    v=v.handle, alpha=tf.constant(0.05, dtype),
                    one_minus_beta1=tf.constant(0.1, dtype),
                    one_minus_beta2=tf.constant(0.001, dtype),
                    epsilon=tf.constant(1e-7, dtype), grad=g.astype(dtype))
        if bad:
            _expect_rejected(lambda: lib.xmc_resource_apply_adam(**args),
                             f"bad {bad}")
            np.testing.assert_array_equal(w.numpy(), w0)
            return
        lib.xmc_resource_apply_adam(**args)
        flat = [a.reshape(1, -1) for a in (w0, m0, v0)]
        want = _adam_rows_reference(
            *flat, np.array(0.05, dtype), np.array(0.1, dtype),
            np.array(0.001, dtype), np.array(1e-7, dtype),
            g.astype(dtype).reshape(1, -1), [0])
        for got, exp in zip((w, m, v), want):
            np.testing.assert_allclose(got.numpy().reshape(1, -1), exp,
                                       rtol=1e-6, atol=1e-30)

    matches_reference()
    bad_inputs_rejected_before_any_write()
    dense_matches_reference()


# ---------------------------------------------------------------------------
# Embedding-bag ops (ops/embedding_bag/): Xmc>EmbeddingBag and its table
# gradient against NumPy loops over the entries.


@target("embedding_bag")
def fuzz_embedding_bag(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    settings = _settings(max_examples)
    lib = _library("xmc_embedding_bag")

    @settings
    @given(batch=st.integers(0, 9), u=st.integers(0, 9), d=st.integers(0, 17),
           nnz=st.integers(0, 60), dtype=st.sampled_from(["float32",
                                                          "float64"]),
           bad=st.sampled_from(["", "", "row", "position", "length"]))
    def matches_numpy(batch, u, d, nnz, dtype, bad):
        case("embedding_bag", batch=batch, u=u, d=d, nnz=nnz, dtype=dtype,
             bad=bad)
        rng = np.random.default_rng(batch * 1000 + u * 100 + nnz)
        if batch == 0 or u == 0:
            nnz = 0
        rows = rng.integers(0, max(batch, 1), nnz)
        positions = rng.integers(0, max(u, 1), nnz)
        weights = rng.standard_normal(nnz).astype(dtype)
        table = rng.standard_normal((u, d)).astype(dtype)
        backward = rng.standard_normal((batch, d)).astype(dtype)
        if bad == "row":  # entry (batch, 0): row out of range
            rows, positions = np.append(rows, batch), np.append(positions, 0)
        elif bad == "position":  # entry (0, u): position out of range
            rows, positions = np.append(rows, 0), np.append(positions, u)
        if bad:  # one more weight (and, for "length", nothing else)
            weights = np.append(weights, 1.0).astype(dtype)
        args = dict(rows=rows.astype(np.int64),
                    positions=positions.astype(np.int64), weights=weights)
        if bad:
            for call in (
                    lambda: lib.xmc_embedding_bag(
                        table=table, batch_size=np.int64(batch), **args),
                    lambda: lib.xmc_embedding_bag_grad_table(
                        backward=backward, num_table_rows=np.int64(u),
                        **args)):
                _expect_rejected(call, f"bad {bad}")
            return
        out = lib.xmc_embedding_bag(table=table, batch_size=np.int64(batch),
                                    **args).numpy()
        grad = lib.xmc_embedding_bag_grad_table(
            backward=backward, num_table_rows=np.int64(u), **args).numpy()
        want_out = np.zeros((batch, d))
        want_grad = np.zeros((u, d))
        for r, p, w in zip(rows, positions, weights):
            want_out[r] += float(w) * table[p]
            want_grad[p] += float(w) * backward[r]
        tol = 1e-5 if dtype == "float32" else 1e-12
        np.testing.assert_allclose(out, want_out, rtol=tol, atol=tol)
        np.testing.assert_allclose(grad, want_grad, rtol=tol, atol=tol)

    matches_numpy()


# ---------------------------------------------------------------------------
# Sampled ops (ops/sampled/): targets go here, e.g. @target("sampled").


# ---------------------------------------------------------------------------
# LSH ops (ops/lsh/): targets go here, e.g. @target("lsh").


def main(argv):
    faulthandler.enable()
    if len(argv) != 3 or argv[1] not in TARGETS:
        print(f"usage: {argv[0]} {{{','.join(sorted(TARGETS))}}} "
              "MAX_EXAMPLES", file=sys.stderr)
        return 2
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    try:
        TARGETS[argv[1]](int(argv[2]))
    except Skip as e:
        print(f"SKIP {e}", flush=True)
        return SKIP
    print("PASSED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
