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

# The NumPy references of the LSH ops, shared with tests/test_lsh_op.py.
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from hinge_reference import squared_hinge_reference  # noqa: E402
from lsh_reference import (ref_codes_from_values,  # noqa: E402
                           ref_dwta_values, ref_tables)

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
    from xmc_tf.errors import OpLibraryError
    from xmc_tf.ops import _loader
    try:
        lib = _loader.load()
    except OpLibraryError as e:
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
        is_bad = (idx < 0) | (idx >= e)
        assert is_bad.any()  # e == 0: every index is out of range
        # The gradients read (and check) the labels with a non-zero signal
        # only: some columns of the signal are zero.
        g = np.ones((b, m), np.float32)
        g[:, rng.random(m) < 0.3] = 0.0
        read = np.broadcast_to(g.any(axis=0)[:, None], idx.shape)

        def first_bad(where):
            flat = np.flatnonzero(where)
            if not flat.size:
                return None
            j, k = divmod(int(flat[0]), s)
            return f"indices[{j}, {k}] = {int(idx[j, k])} "

        want, want_read = first_bad(is_bad), first_bad(is_bad & read)
        x = tf.zeros((b, e))
        w = tf.ones((m, s))
        calls = {
            "forward": lambda: lib.xmc_uniform_sparse_matmul(
                features=x, indices=idx, weights=w),
            "grad_features": lambda: lib.xmc_uniform_sparse_matmul_grad_features(
                backward=g, features=x, indices=idx, weights=w),
            "grad_weights": lambda: lib.xmc_uniform_sparse_matmul_grad_weights(
                backward=g, features=x, indices=idx),
        }
        for name, call in calls.items():
            first = want if name == "forward" else want_read
            if first is None:  # no bad index is read
                call()
                continue
            _expect_rejected(call, f"{name}: out-of-range {first}",
                             contains=first,
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
# Uniform-sparse layer on sparse input: Xmc>UniformSparseInvertedIndex,
# Xmc>UniformSparseMatmulSparseInput and its weight gradient against NumPy
# (products only for stored entries, duplicates summed, zero backward
# entries contribute exactly 0).


@target("uniform_sparse_sparse_input")
def fuzz_uniform_sparse_sparse_input(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    import tensorflow as tf

    lib = _library("xmc_uniform_sparse_matmul_sparse_input")
    settings = _settings(max_examples)

    @settings
    @given(b=st.integers(0, 20), e=st.integers(1, 80), m=st.integers(0, 50),
           s=st.integers(0, 8), nnz=st.integers(0, 120),
           tidx=st.sampled_from(["int32", "int64"]),
           density=st.sampled_from([0.0, 0.1, 0.5, 1.0]),
           special=st.sampled_from(["none", "nonfinite"]),
           bad=st.sampled_from(["", "", "", "row", "col", "index", "entry",
                                "offsets"]),
           seed=st.integers(0, 2**31 - 1))
    def matches_numpy(b, e, m, s, nnz, tidx, density, special, bad, seed):
        case("uniform_sparse_sparse_input", b=b, e=e, m=m, s=s, nnz=nnz,
             tidx=tidx, density=density, special=special, bad=bad,
             seed=seed)
        rng = np.random.default_rng(seed)
        nnz = nnz if b else 0
        # Unordered entries with repeats (they add up).
        rows = rng.integers(0, max(b, 1), nnz).astype(np.int64)
        cols = rng.integers(0, e, nnz).astype(np.int64)
        vals = rng.normal(size=nnz).astype(np.float32)
        idx = rng.integers(0, e, size=(m, s)).astype(np.int32)
        w = rng.normal(size=(m, s)).astype(np.float32)
        g = rng.normal(size=(b, m)).astype(np.float32)
        g[rng.random((b, m)) >= density] = 0.0
        if special == "nonfinite":
            for arr in (vals, w):
                if arr.size:
                    k = rng.integers(1, 3)
                    arr.reshape(-1)[rng.integers(0, arr.size, k)] = \
                        rng.choice([np.inf, -np.inf, np.nan], k)
        n = m * s
        dtype = getattr(tf, tidx)
        if bad == "index" and n:
            idx.reshape(-1)[rng.integers(0, n)] = rng.choice([-1, e])
            first = int(np.flatnonzero((idx < 0) | (idx >= e))[0])
            _expect_rejected(
                lambda: lib.xmc_uniform_sparse_inverted_index(
                    indices=idx, num_features=np.int64(e), Tidx=dtype),
                "bad index", f"indices[{first // s}, {first % s}] = ",
                tf.errors.InvalidArgumentError)
            return
        offsets, entries = lib.xmc_uniform_sparse_inverted_index(
            indices=idx, num_features=np.int64(e), Tidx=dtype)
        flat = idx.reshape(-1)
        np.testing.assert_array_equal(
            offsets.numpy(), np.concatenate(
                [[0], np.cumsum(np.bincount(flat, minlength=e))]))
        np.testing.assert_array_equal(entries.numpy(),
                                      np.argsort(flat, kind="stable"))
        assert entries.dtype == dtype
        offsets, entries = offsets.numpy(), entries.numpy()
        want = None
        if bad == "row" and b:
            rows[rng.integers(0, nnz)] = b if nnz else 0
            want = "rows[" if nnz else None
        elif bad == "col" and nnz:
            cols[rng.integers(0, nnz)] = e
            want = "cols["
        elif bad == "entry" and n:
            q = int(rng.integers(0, n))
            entries[q] = n
            # Rejected where the batch reads that list (the kernels check
            # the lists of the features the batch stores); else the case
            # goes on: the result is the reference's.
            feature = int(np.searchsorted(offsets, q, side="right") - 1)
            want = "entries[" if np.isin(feature, cols) else None
        elif bad == "offsets":
            offsets[-1] += 1
            want = "offsets["
        args = dict(rows=rows, cols=cols, values=vals, offsets=offsets,
                    entries=entries)

        def forward():
            return lib.xmc_uniform_sparse_matmul_sparse_input(
                batch_size=np.int64(b), weights=w, **args)

        def grad_weights():
            return lib.xmc_uniform_sparse_matmul_sparse_input_grad_weights(
                backward=g, weights=w, **args)

        if want is not None:
            for call in (forward, grad_weights):
                _expect_rejected(call, f"bad {bad}", want,
                                 tf.errors.InvalidArgumentError)
            return
        pos = np.arange(n)
        hit = cols[:, None] == flat[None, :]  # [nnz, n]: entry meets p
        with np.errstate(invalid="ignore", over="ignore"):
            v64, w64, g64 = (a.astype(np.float64) for a in (vals, w, g))

            def reference(v64, w64, g64):
                terms = np.where(hit, v64[:, None] * w64.reshape(-1)[None],
                                 0.0)
                scores = np.zeros((b, m))
                np.add.at(scores, (np.broadcast_to(rows[:, None], hit.shape),
                                   np.broadcast_to(pos // max(s, 1),
                                                   hit.shape)), terms)
                back = g64[rows][:, pos // max(s, 1)] if n else \
                    np.zeros((nnz, 0))
                gterms = np.where(hit & (back != 0), v64[:, None] * back,
                                  0.0)
                return scores, gterms.sum(axis=0).reshape(m, s)

            want_scores, want_grad = reference(v64, w64, g64)
            scale_scores, scale_grad = reference(np.abs(v64), np.abs(w64),
                                                 np.abs(g64))
        got_scores = forward().numpy()
        got_grad = grad_weights().numpy()
        eps = (2.0 ** -24, 2.0 ** -126)
        _assert_close(got_scores, want_scores, scale_scores, eps, nnz,
                      "scores")
        _assert_close(got_grad, want_grad, scale_grad, eps, nnz,
                      "grad_weights")

    matches_numpy()


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
# Fused squared hinge (ops/hinge/): Xmc>SquaredHingeLoss and its gradient
# against float64 NumPy over the multi-hot targets (repeated ids count once),
# exact zeros of the gradient where the margin holds, and rejection of bad
# ids / shapes with InvalidArgument.


@target("hinge")
def fuzz_hinge(max_examples):
    from hypothesis import given
    from hypothesis import strategies as st
    settings = _settings(max_examples)
    lib = _library("xmc_squared_hinge_loss")

    @settings
    @given(b=st.integers(0, 5), m=st.sampled_from([0, 1, 2, 7, 33, 16385]),
           n=st.integers(0, 6), margin=st.sampled_from([1.0, 0.5, 0.0, 2.5]),
           id_dtype=st.sampled_from(["int32", "int64"]),
           seed=st.integers(0, 2 ** 16),
           bad=st.sampled_from(["", "", "", "high", "low", "batch",
                                "upstream"]))
    def matches_numpy(b, m, n, margin, id_dtype, seed, bad):
        case("hinge", b=b, m=m, n=n, margin=margin, id_dtype=id_dtype,
             seed=seed, bad=bad)
        rng = np.random.default_rng(seed)
        # scores on a grid of quarters: many exactly at +-margin (kinks)
        scores = (rng.integers(-12, 13, (b, m)) / 4).astype(np.float32)
        labels = rng.integers(-1, max(m, 1), (b, n)) if m else np.full(
            (b, n), -1)
        labels = labels.astype(id_dtype)
        upstream = rng.normal(size=b).astype(np.float32)
        if bad:
            if bad in ("high", "low") and b * n == 0:
                b, n = 1, 1
                scores = np.zeros((1, m), np.float32)
                upstream = np.ones(1, np.float32)
            if bad == "high":
                labels = np.zeros((b, n), id_dtype)
                labels[b - 1, n - 1] = m
            elif bad == "low":
                labels = np.zeros((b, n), id_dtype) if m else np.full(
                    (b, n), -1, id_dtype)
                labels[0, 0] = int(rng.choice([-2, -(2 ** 31)]))
            elif bad == "batch":
                labels = np.full((b + 1, n), -1, id_dtype)
            else:
                upstream = np.ones(b + 1, np.float32)
            calls = [lambda: lib.xmc_squared_hinge_loss_grad(
                scores=scores, labels=labels, upstream=upstream,
                margin=margin)]
            if bad != "upstream":
                calls.append(lambda: lib.xmc_squared_hinge_loss(
                    scores=scores, labels=labels, margin=margin))
            for call in calls:
                _expect_rejected(call, f"hinge bad {bad}")
            return
        loss = lib.xmc_squared_hinge_loss(scores=scores, labels=labels,
                                          margin=margin).numpy()
        grad = lib.xmc_squared_hinge_loss_grad(
            scores=scores, labels=labels, upstream=upstream,
            margin=margin).numpy()
        want_loss, want_grad = squared_hinge_reference(
            scores, labels, margin, upstream)
        assert loss.shape == (b,) and grad.shape == (b, m)
        np.testing.assert_allclose(loss, want_loss, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(grad == 0, want_grad == 0)

    matches_numpy()


# ---------------------------------------------------------------------------
# Sampled ops (ops/sampled/): targets go here, e.g. @target("sampled").


# ---------------------------------------------------------------------------
# LSH ops (ops/lsh/): Xmc>LshSimHash(Sparse), Xmc>LshDwtaHash(Sparse),
# Xmc>LshBuildTables, Xmc>LshUpdateTables, Xmc>LshQuery and
# Xmc>LshSparseCosine against NumPy references (the documented hash
# layout, a stable argsort, set unions, float64 cosines), and rejection of
# bad input (ids, codes, attributes and sums out of range) with
# InvalidArgument naming the offending argument.

def _densify32(indices, weights, e):
    """float32 rows with duplicates summed in input order (as the ops)."""
    x = np.zeros((indices.shape[0], e), np.float32)
    with np.errstate(over="ignore"):
        for i in range(indices.shape[0]):
            np.add.at(x[i], indices[i], weights[i])
    return x


def _sparse_rows(rng, shape, e, scale):
    """indices / weights of sparse rows: duplicate indices, exact zeros,
    cancelling duplicates, values scaled by ``scale`` (no subnormals)."""
    s = shape[-1]
    indices = rng.integers(0, e, shape).astype(np.int32)
    fmax = float(np.finfo(np.float32).max)
    weights = np.clip(rng.normal(size=shape) * scale, -fmax,
                      fmax).astype(np.float32)
    if s >= 2:
        dup = rng.random(shape[:-1]) < 0.5
        indices[..., 1] = np.where(dup, indices[..., 0], indices[..., 1])
        cancel = rng.random(shape[:-1]) < 0.2
        weights[..., 1] = np.where(dup & cancel, -weights[..., 0],
                                   weights[..., 1])
    weights[rng.random(shape) < 0.15] = 0.0
    return indices, weights


def _relabel(rng, e, big):
    """An injective map of [0, e) into [0, big) (big >= e), as an array."""
    if big <= 4 * e:
        return rng.permutation(big)[:e].astype(np.int64)
    out = set()
    while len(out) < e:
        out.update(int(v) for v in rng.integers(0, big, e - len(out)))
    return rng.permutation(np.array(sorted(out), np.int64))


@target("lsh")
def fuzz_lsh(max_examples):
    from hypothesis import example, given
    from hypothesis import strategies as st
    import tensorflow as tf

    _library("xmc_lsh_query")
    from xmc_tf.ops import lsh
    try:  # a scratch allocation per coordinate of 2^31 features (a
        # regression) fails in this process instead of exhausting the machine
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
    except (ImportError, ValueError, OSError):
        pass
    settings = _settings(max_examples)
    IAE = tf.errors.InvalidArgumentError
    U24 = 2.0 ** -24

    @settings
    @given(kind=st.sampled_from(["simhash", "dwta"]), n=st.integers(0, 6),
           d=st.integers(1, 24), K=st.integers(1, 6), L=st.integers(1, 4),
           log_w=st.integers(1, 3), bucket_bits=st.sampled_from([4, 16, 24]),
           mode=st.sampled_from(["ints", "gauss", "relu"]),
           big=st.sampled_from([0, 2**22 + 3, 2**31 - 1]),
           seed=st.integers(0, 2**31 - 1))
    def hashes_match_reference(kind, n, d, K, L, log_w, bucket_bits, mode,
                               big, seed):
        case("lsh.hashes", kind=kind, n=n, d=d, K=K, L=L, log_w=log_w,
             bucket_bits=bucket_bits, mode=mode, big=big, seed=seed)
        rng = np.random.default_rng(seed)
        w = 2 ** log_w
        if mode == "ints":  # exact float32 sums: bit-exact SimHash
            x = rng.integers(-3, 4, (n, d)).astype(np.float32)
        else:
            x = rng.normal(size=(n, d)).astype(np.float32)
        if mode == "relu":
            x[x < 0.4] = 0.0
        s = int(rng.integers(1, 6))
        idx, wts = _sparse_rows(rng, (n, s), d, 1.0)
        if mode == "ints":
            wts = np.round(wts * 2)
        dense_of_sparse = _densify32(idx, wts, d)
        if kind == "simhash":
            proj = (rng.integers(-3, 4, (d, K * L)) if mode == "ints" else
                    rng.normal(size=(d, K * L))).astype(np.float32)
            got = lsh.lsh_simhash(x, proj, K, bucket_bits).numpy()
            got_sp = lsh.lsh_simhash_sparse(idx, wts, proj, K,
                                            bucket_bits).numpy()
            want_sp_dense = lsh.lsh_simhash(dense_of_sparse, proj, K,
                                            bucket_bits).numpy()
            # The sparse path is bit-identical to the densified rows.
            np.testing.assert_array_equal(got_sp, want_sp_dense)
            for xs, codes in ((x, got), (dense_of_sparse, got_sp)):
                p = xs.astype(np.float64) @ proj.astype(np.float64)
                want = ref_codes_from_values((p > 0).astype(np.int64), K,
                                             1, bucket_bits)
                # float32 accumulation may flip a bit only where |p| is
                # within the rounding bound of its terms (never for ints).
                bound = (np.abs(xs).astype(np.float64) @
                         np.abs(proj).astype(np.float64)) * (d + 2) * U24
                shaky = (np.abs(p) <= bound).reshape(n, L, K).any(-1)
                if mode == "ints":
                    shaky[:] = False
                assert codes.shape == (n, L), codes.shape
                bad = (codes != want) & ~shaky
                assert not bad.any(), (np.argwhere(bad)[:3], codes, want)
            return
        bins = rng.integers(0, d, (K * L, w)).astype(np.int32)
        got = lsh.lsh_dwta_hash(x, bins, K, bucket_bits, seed=seed).numpy()
        want = ref_codes_from_values(ref_dwta_values(x, bins, seed), K,
                                     log_w, bucket_bits)
        np.testing.assert_array_equal(got, want)
        got_sp = lsh.lsh_dwta_hash_sparse(idx, wts, bins, d, K, bucket_bits,
                                          seed=seed).numpy()
        want_sp = ref_codes_from_values(
            ref_dwta_values(dense_of_sparse, bins, seed), K, log_w,
            bucket_bits)
        np.testing.assert_array_equal(got_sp, want_sp)
        if big:
            # Coordinates relabelled injectively into a huge space: same
            # codes (through the compact inverse map when bins are sparse).
            f = _relabel(rng, d, big)
            got_big = lsh.lsh_dwta_hash_sparse(
                f[idx].astype(np.int32), wts, f[bins].astype(np.int32), big,
                K, bucket_bits, seed=seed).numpy()
            np.testing.assert_array_equal(got_big, want_sp)

    @settings
    @given(m=st.integers(0, 60), L=st.integers(0, 4), B=st.integers(1, 9),
           r=st.integers(0, 12), q=st.integers(1, 3), b=st.integers(0, 4),
           k=st.integers(1, 40), count=st.booleans(),
           seed=st.integers(0, 2**31 - 1))
    def tables_match_reference(m, L, B, r, q, b, k, count, seed):
        case("lsh.tables", m=m, L=L, B=B, r=r, q=q, b=b, k=k, count=count,
             seed=seed)
        rng = np.random.default_rng(seed)
        codes = rng.integers(0, B, (m, L)).astype(np.int32)
        off, lab = lsh.lsh_build_tables(codes, B)
        want_off, want_lab = ref_tables(codes, B)
        np.testing.assert_array_equal(off.numpy(), want_off)
        np.testing.assert_array_equal(lab.numpy(), want_lab)
        # Update (repeated rows: the last wins) == rebuild.
        rows = rng.integers(0, m, r).astype(np.int32) if m else \
            np.zeros(0, np.int32)
        new = rng.integers(0, B, (len(rows), L)).astype(np.int32)
        o2, l2, c2 = lsh.lsh_update_tables(off, lab, codes, rows, new)
        expect = codes.copy()
        for row, c in zip(rows, new):
            expect[row] = c
        want_off, want_lab = ref_tables(expect, B)
        np.testing.assert_array_equal(c2.numpy(), expect)
        np.testing.assert_array_equal(o2.numpy(), want_off)
        np.testing.assert_array_equal(l2.numpy(), want_lab)
        # Query against the set union of the probed buckets.
        qc = rng.integers(-1, B, (b, q, L)).astype(np.int32)
        res = lsh.lsh_query(o2, l2, c2, qc, k, step=seed, seed=7,
                            count_collisions=count)
        ids, valid = res.ids.numpy(), res.valid.numpy()
        for i in range(b):
            union, total = set(), 0
            for qq in range(q):
                for l in range(L):
                    c = qc[i, qq, l]
                    if c >= 0:
                        bucket = want_lab[l, want_off[l, c]:want_off[l, c + 1]]
                        total += len(bucket)
                        union.update(bucket.tolist())
            nv = int(valid[i].sum())
            assert valid[i, :nv].all() and not valid[i, nv:].any()
            got = ids[i, :nv].tolist()
            assert len(set(got)) == nv and set(got) <= union
            assert (ids[i, nv:] == 0).all()
            assert int(res.probed[i]) == total
            if total <= k:
                assert set(got) == union and float(res.rate[i]) == 1.0
            else:
                assert abs(float(res.rate[i]) - k / total) <= 1e-6 * k / total
            coll = res.collisions.numpy()[i]
            for t, j in enumerate(got):
                want = (sum(int(expect[j, l] == qc[i, qq, l])
                            for qq in range(q) for l in range(L))
                        if count else 0)
                assert coll[t] == want, (i, j, coll[t], want)
            assert not coll[nv:].any()

    @settings
    @given(batch=st.integers(0, 3), k=st.integers(0, 4), n=st.integers(0, 3),
           sa=st.integers(0, 5), sb=st.integers(0, 5), e=st.integers(1, 12),
           scale=st.sampled_from([1.0, 1e30, 3e38, 1e-30]),
           big=st.sampled_from([0, 2**22 + 1, 2**31 - 1]),
           seed=st.integers(0, 2**31 - 1))
    def cosine_matches_reference(batch, k, n, sa, sb, e, scale, big, seed):
        case("lsh.cosine", batch=batch, k=k, n=n, sa=sa, sb=sb, e=e,
             scale=scale, big=big, seed=seed)
        rng = np.random.default_rng(seed)
        ai, aw = _sparse_rows(rng, (batch, k, sa), e, scale)
        bi, bw = _sparse_rows(rng, (batch, n, sb), e, scale)
        aw, bw = _ftz(aw), _ftz(bw)  # the kernels read subnormals as 0
        if scale == 3e38:  # duplicates overflow float32, not float64
            aw[np.abs(aw) > 0] = np.float32(3e38)
        if big:
            f = _relabel(rng, e, big)
            ai_, bi_, e_ = f[ai].astype(np.int32), f[bi].astype(np.int32), big
        else:
            ai_, bi_, e_ = ai, bi, e
        got = lsh.lsh_sparse_cosine(ai_, aw, bi_, bw, e_).numpy()
        assert got.shape == (batch, k, n), got.shape
        for i in range(batch):
            xa = np.zeros((k, e))
            xb = np.zeros((n, e))
            for j in range(k):
                np.add.at(xa[j], ai[i, j], aw[i, j].astype(np.float64))
            for p in range(n):
                np.add.at(xb[p], bi[i, p], bw[i, p].astype(np.float64))
            na, nb = np.linalg.norm(xa, axis=1), np.linalg.norm(xb, axis=1)
            den = na[:, None] * nb[None, :]
            with np.errstate(invalid="ignore", divide="ignore"):
                want = np.where(den > 0, (xa @ xb.T) / den, 0.0)
            assert np.isfinite(got[i]).all(), got[i]
            tol = U24 + 4 * (sa + sb + 2) * 2.0 ** -52
            err = np.abs(got[i] - want)
            assert (err <= tol * np.maximum(np.abs(want), 1.0)).all(), (
                i, got[i], want)

    bad_kinds = ["update_label_range", "update_label_repeat",
                 "update_code_range", "update_row_range",
                 "update_row_code_range", "query_code_range",
                 "query_label_codes", "build_code_range",
                 "build_num_buckets", "dwta_num_features",
                 "cosine_num_features", "sparse_sum_overflow",
                 "cosine_index_range", "dwta_index_range"]

    def every_kind(fn):
        """Explicit examples: each kind, eagerly and in a graph."""
        for kind in bad_kinds:
            for graph in (False, True):
                fn = example(kind=kind, graph=graph, seed=1)(fn)
        return fn

    @settings
    @every_kind
    @given(kind=st.sampled_from(bad_kinds), graph=st.booleans(),
           seed=st.integers(0, 2**31 - 1))
    def bad_input_rejected(kind, graph, seed):
        case("lsh.bad", kind=kind, graph=graph, seed=seed)
        rng = np.random.default_rng(seed)
        m, L, B = int(rng.integers(1, 30)), int(rng.integers(1, 4)), \
            int(rng.integers(1, 9))
        codes = rng.integers(0, B, (m, L)).astype(np.int32)
        off, lab = (t.numpy() for t in lsh.lsh_build_tables(codes, B))
        rows = rng.integers(0, m, 3).astype(np.int32)
        new = rng.integers(0, B, (3, L)).astype(np.int32)
        out_of = [-1, -7, -2**31, 2**31 - 1]
        errors = IAE

        def call(fn, *args):
            """fn(*args), eagerly or inside a tf.function."""
            if not graph:
                return fn(*args)
            return tf.function(fn)(*args)

        if kind == "update_label_range":
            l, t = int(rng.integers(0, L)), int(rng.integers(0, m))
            v = int(rng.choice(out_of + [m, m + 100]))
            lab[l, t] = v
            bad_l = int(np.flatnonzero((lab[l:] < 0) | (lab[l:] >= m))[0])
            l2, t2 = l + bad_l // m, bad_l % m  # first bad in scan order
            want = f"labels[{l2}, {t2}] = {lab[l2, t2]} is not in [0, {m})"
            fn = lambda: call(lsh.lsh_update_tables, off, lab, codes, rows,
                              new)
        elif kind == "update_label_repeat":
            if m < 2:
                return
            l = int(rng.integers(0, L))
            t, u = rng.choice(m, 2, replace=False)
            lab[l, t] = lab[l, u]
            seen, pos = set(), None
            for pos, v in enumerate(lab[l].tolist()):
                if v in seen:
                    break
                seen.add(v)
            want = (f"labels[{l}, {pos}] = {lab[l, pos]} repeats an earlier "
                    f"label id: labels[{l}] must be a permutation")
            fn = lambda: call(lsh.lsh_update_tables, off, lab, codes, rows,
                              new)
        elif kind == "update_code_range":
            j, l = int(rng.integers(0, m)), int(rng.integers(0, L))
            v = int(rng.choice(out_of + [B, B + 5]))
            codes[j, l] = v
            # The moved labels' old codes are checked first, then all.
            moved = sorted(set(rows.tolist()))
            first = next((r for r in moved if (codes[r] != np.clip(
                codes[r], 0, B - 1)).any()), None)
            jj = first if first is not None else j
            ll = int(np.flatnonzero((codes[jj] < 0) | (codes[jj] >= B))[0])
            want = f"codes[{jj}, {ll}] = {codes[jj, ll]} is not in [0, {B})"
            fn = lambda: call(lsh.lsh_update_tables, off, lab, codes, rows,
                              new)
        elif kind == "update_row_range":
            i = int(rng.integers(0, 3))
            rows[i] = int(rng.choice(out_of + [m]))
            i = int(np.flatnonzero((rows < 0) | (rows >= m))[0])
            want = f"rows[{i}] = {rows[i]} is not in [0, {m})"
            fn = lambda: call(lsh.lsh_update_tables, off, lab, codes, rows,
                              new)
        elif kind == "update_row_code_range":
            i, l = int(rng.integers(0, 3)), int(rng.integers(0, L))
            new[i, l] = int(rng.choice(out_of + [B]))
            want = f"row_codes[{i}, {l}] = {new[i, l]} is not in [0, {B})"
            fn = lambda: call(lsh.lsh_update_tables, off, lab, codes, rows,
                              new)
        elif kind == "query_code_range":
            qc = codes[:2][:, None, :].copy()
            i, l = int(rng.integers(0, len(qc))), int(rng.integers(0, L))
            qc[i, 0, l] = int(rng.choice([-2, -7, -2**31, B, 2**31 - 1]))
            first = int(np.flatnonzero((qc.reshape(-1) < -1) |
                                       (qc.reshape(-1) >= B))[0])
            i, l = divmod(first, L)
            want = f"query_codes[{i}, 0, {l}] = {qc[i, 0, l]} is not -1"
            fn = lambda: call(lsh.lsh_query, off, lab, codes, qc, 5)
        elif kind == "query_label_codes":
            qc = codes[:1][:, None, :].copy()  # probes label 0's buckets
            bad_codes = codes.copy()
            v = int(rng.choice(out_of + [B, B + 5]))
            bad_codes[0, int(rng.integers(0, L))] = v
            k = L * m  # >= the probed entries: label 0 is read
            # Unread (no collision counts): accepted, as documented.
            call(lambda *a: lsh.lsh_query(*a, count_collisions=False).ids,
                 off, lab, bad_codes, qc, k)
            want = f"] = {v} is not in [0, {B}) (num_buckets; read for"
            fn = lambda: call(lambda *a: lsh.lsh_query(*a).ids, off, lab,
                              bad_codes, qc, k)
        elif kind == "build_code_range":
            j, l = int(rng.integers(0, m)), int(rng.integers(0, L))
            codes[j, l] = int(rng.choice(out_of + [B]))
            first = int(np.flatnonzero((codes.reshape(-1) < 0) |
                                       (codes.reshape(-1) >= B))[0])
            j, l = divmod(first, L)
            want = f"codes[{j}, {l}] = {codes[j, l]} is not in [0, {B})"
            fn = lambda: call(lambda c: lsh.lsh_build_tables(c, B), codes)
        elif kind == "build_num_buckets":
            nb = int(rng.choice([2**24 + 1, 2**31, 2**40, 2**63 - 1]))
            shape = (int(rng.integers(0, 6)), int(rng.integers(0, 3)))
            want = f"num_buckets must be in [1, 2^24]"
            # In a graph the shape function rejects it: ValueError.
            errors = (ValueError,) if graph else IAE
            fn = lambda: call(lambda c: lsh.lsh_build_tables(c, nb),
                              np.zeros(shape, np.int32))
        elif kind in ("dwta_num_features", "cosine_num_features"):
            nf = int(rng.choice([2**31, 2**40, 2**63 - 1]))
            want = f"num_features must be in [1, 2^31 - 1]"
            idx = np.array([[1]], np.int32)
            if kind == "dwta_num_features":
                bins = lsh.dwta_bins(16, 4, 4)
                fn = lambda: call(lambda i: lsh.lsh_dwta_hash_sparse(
                    i, np.ones((1, 1), np.float32), bins, nf, 2), idx)
            else:
                fn = lambda: call(lambda i: lsh.lsh_sparse_cosine(
                    i[None], np.ones((1, 1, 1), np.float32), i[None],
                    np.ones((1, 1, 1), np.float32), nf), idx)
        elif kind == "sparse_sum_overflow":
            n, s, e = int(rng.integers(1, 4)), int(rng.integers(2, 5)), 8
            idx = rng.integers(0, e, (n, s)).astype(np.int32)
            wts = rng.normal(size=(n, s)).astype(np.float32)
            i = int(rng.integers(0, n))
            idx[i, 1] = idx[i, 0]
            wts[i, :2] = np.float32(rng.choice([3e38, -3e38]))
            dense = _densify32(idx, wts, e)
            i = int(np.flatnonzero(~np.isfinite(dense).all(1))[0])
            want = f"weights[{i}]: the weights of index"
            if rng.random() < 0.5:
                proj = rng.normal(size=(e, 4)).astype(np.float32)
                fn = lambda: call(lambda a, b: lsh.lsh_simhash_sparse(
                    a, b, proj, 2), idx, wts)
            else:
                bins = lsh.dwta_bins(e, 4, 4)
                fn = lambda: call(lambda a, b: lsh.lsh_dwta_hash_sparse(
                    a, b, bins, e, 2), idx, wts)
        elif kind == "cosine_index_range":
            e = int(rng.integers(1, 9))
            ai = rng.integers(0, e, (2, 3, 2)).astype(np.int32)
            v = int(rng.choice(out_of + [e]))
            ai[1, 2, 1] = v
            first = int(np.flatnonzero((ai.reshape(-1) < 0) |
                                       (ai.reshape(-1) >= e))[0])
            want = (f"a_indices[{first // 6}, {first // 2 % 3}, "
                    f"{first % 2}] = {v} is not in [0, {e})")
            fn = lambda: call(lambda a: lsh.lsh_sparse_cosine(
                a, np.ones((2, 3, 2), np.float32), np.zeros((2, 1, 1),
                                                            np.int32),
                np.ones((2, 1, 1), np.float32), e), ai)
        else:  # dwta_index_range
            e = int(rng.integers(4, 9))
            idx = rng.integers(0, e, (3, 2)).astype(np.int32)
            idx[2, 1] = int(rng.choice(out_of + [e]))
            first = int(np.flatnonzero((idx.reshape(-1) < 0) |
                                       (idx.reshape(-1) >= e))[0])
            want = (f"indices[{first // 2}, {first % 2}] = "
                    f"{idx.reshape(-1)[first]} is not in [0, {e})")
            bins = lsh.dwta_bins(e, 4, 4)
            fn = lambda: call(lambda a: lsh.lsh_dwta_hash_sparse(
                a, np.ones((3, 2), np.float32), bins, e, 2), idx)
        _expect_rejected(fn, f"lsh {kind} (graph={graph})", contains=want,
                         errors=errors)

    hashes_match_reference()
    tables_match_reference()
    cosine_matches_reference()
    bad_input_rejected()


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
