"""GPU tests of the framework-free uniform-sparse CUDA launchers.

Checks ``XmcUniformSparse{Forward,GradFeatures,GradWeights,Grad}Gpu{F32,F16,
BF16}`` and ``XmcUniformSparseGpuWorkspaceBytes``
(``ops/uniform_sparse/*.cu.cc``, Schultheis & Babbar
Sec. 3.2-3.3, Algorithms 1-3) against a float64 NumPy reference, without
TensorFlow: the launchers are built alone with nvcc
(``tools/build_cuda_harness.py``), loaded with ``ctypes`` and fed CuPy device
arrays.  The launchers' workspace is filled with 0xff bytes (NaN floats)
before every call, so a kernel that relied on a zeroed workspace would fail.

Skipped (not failed) when CuPy or a CUDA device is missing.  Environment:

* ``XMC_CUDA_HARNESS_LIB``: a prebuilt harness library (else one is built
  into a temporary folder for the local GPU, ``--archs native``).
* ``XMC_GPU_TEST_BACKEND=numpy``: run against a *host emulation* of the
  kernels (a library exporting the same symbols that takes host pointers),
  for debugging the kernel logic on a machine without a GPU; requires
  ``XMC_CUDA_HARNESS_LIB``.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from cuda_harness import cuda_skip_reason, harness_path, import_cupy

BACKEND = os.environ.get("XMC_GPU_TEST_BACKEND", "cupy")


def _skip_reason():
    """Why these tests cannot run here, or None."""
    if BACKEND == "numpy":
        if not os.environ.get("XMC_CUDA_HARNESS_LIB"):
            return "XMC_GPU_TEST_BACKEND=numpy needs XMC_CUDA_HARNESS_LIB"
        return None
    if BACKEND != "cupy":
        return f"XMC_GPU_TEST_BACKEND={BACKEND!r}: use cupy or numpy"
    return cuda_skip_reason(cp)


cp = import_cupy() if BACKEND == "cupy" else None

SKIP_REASON = _skip_reason()
# Tests are collected and skipped one by one (not a module-level skip), so
# that `pytest tests/gpu` exits 0 on a machine without a GPU.
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None,
                                 reason=SKIP_REASON or "")]

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
# operands (4), batch, num_features, num_labels, fan_in, workspace,
# error_scratch, bad_position, stream
_ARGTYPES = [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P,
             ctypes.POINTER(_I64), _P]
_GRAD_ARGTYPES = [_P] * 6 + [_I64] * 4 + [_P, _P, ctypes.POINTER(_I64), _P]
SUFFIXES = ("F32", "F16", "BF16")
# Workspace kinds of XmcUniformSparseGpuWorkspaceBytes.
FORWARD, GRAD_FEATURES, GRAD_WEIGHTS, GRAD = 0, 1, 2, 3
INT32_MAX = np.iinfo(np.int32).max
INT32_MIN = np.iinfo(np.int32).min


# ---------------------------------------------------------------------------
# Device memory and the library.

class Device:
    """Moves arrays to/from the device the launchers read (CuPy or host)."""

    def __init__(self, stream=None):
        self.stream = stream  # a cupy.cuda.Stream or None (current stream)

    def put(self, a: np.ndarray):
        a = np.ascontiguousarray(a)
        return cp.asarray(a) if cp is not None else a.copy()

    def full(self, shape, value, dtype):
        if cp is not None:
            return cp.full(shape, value, dtype=dtype)
        return np.full(shape, value, dtype=dtype)

    def get(self, a) -> np.ndarray:
        return cp.asnumpy(a) if cp is not None else np.array(a)

    @staticmethod
    def ptr(a) -> int:
        return a.data.ptr if cp is not None else a.ctypes.data

    def stream_ptr(self) -> int:
        if cp is None:
            return 0
        stream = self.stream or cp.cuda.get_current_stream()
        return stream.ptr


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    """The harness library with argtypes set."""
    path = harness_path("XMC_CUDA_HARNESS_LIB", tmp_path_factory,
                        "libxmc_us_cuda.so")
    library = ctypes.CDLL(path)
    for suffix in SUFFIXES:
        for op in ("Forward", "GradFeatures", "GradWeights", "Grad"):
            fn = getattr(library, f"XmcUniformSparse{op}Gpu{suffix}")
            fn.argtypes = _GRAD_ARGTYPES if op == "Grad" else _ARGTYPES
            fn.restype = ctypes.c_int
    library.XmcUniformSparseGpuWorkspaceBytes.argtypes = [
        ctypes.c_int, ctypes.c_int, _I64, _I64, _I64, _I64]
    library.XmcUniformSparseGpuWorkspaceBytes.restype = _I64
    return library


@pytest.fixture(scope="module")
def dev():
    return Device()


# ---------------------------------------------------------------------------
# Value types: float32, float16 (NumPy) and bfloat16 (bit patterns).

class ValueType:
    """A launcher value type: its suffix, host encoding and rounding."""

    def __init__(self, suffix, nbytes, eps):
        self.suffix, self.nbytes, self.eps = suffix, nbytes, eps

    def encode(self, a: np.ndarray) -> np.ndarray:
        """float32 values -> the array the launcher reads."""
        a = np.asarray(a, np.float32)
        if self.suffix == "F32":
            return a
        if self.suffix == "F16":
            return a.astype(np.float16)
        u = np.ascontiguousarray(a).view(np.uint32).astype(np.uint64)
        rounded = (u + 0x7FFF + ((u >> 16) & 1)) >> 16  # nearest even
        nan = np.isnan(a)
        out = rounded.astype(np.uint16)
        out[nan] = 0x7FC0
        return out

    def decode(self, a: np.ndarray) -> np.ndarray:
        """The launcher's array -> float32 values."""
        if self.suffix == "F32":
            return np.asarray(a, np.float32)
        if self.suffix == "F16":
            return np.asarray(a).astype(np.float32)
        return (np.asarray(a).astype(np.uint32) << 16).view(np.float32)

    def round(self, a: np.ndarray) -> np.ndarray:
        """float32 values rounded to this type (as float32)."""
        return self.decode(self.encode(a))

    @property
    def storage(self):
        return {"F32": np.float32, "F16": np.float16,
                "BF16": np.uint16}[self.suffix]


F32 = ValueType("F32", 4, 0.0)
F16 = ValueType("F16", 2, 2.0 ** -11)
BF16 = ValueType("BF16", 2, 2.0 ** -8)
TYPES = {"F32": F32, "F16": F16, "BF16": BF16}


def _launcher(lib, op, vt):
    return getattr(lib, f"XmcUniformSparse{op}Gpu{vt.suffix}")


def _workspace(lib, dev, kind, vt, dims):
    """A workspace of the queried size, filled with 0xff (NaN) bytes."""
    nbytes = lib.XmcUniformSparseGpuWorkspaceBytes(kind, vt.nbytes, *dims)
    assert nbytes >= 0
    return dev.full((max(nbytes, 1),), 0xFF, np.uint8)


def _nan_output(dev, shape, vt):
    """An output pre-filled with NaN bits (catches unwritten entries)."""
    fill = {"F32": np.nan, "F16": np.nan, "BF16": 0x7FC0}[vt.suffix]
    return dev.full(shape, fill, vt.storage)


def _call(fn, dev, inputs, outputs, dims, workspace):
    """Runs one launcher; returns (outputs as numpy, bad_position).

    Args:
      fn: ctypes launcher.
      dev: Device.
      inputs: device arrays in the launcher's argument order.
      outputs: device output arrays (pre-filled with NaN to catch unwritten
        entries).
      dims: (batch, num_features, num_labels, fan_in).
      workspace: device workspace array.
    """
    scratch = dev.full((1,), 12345, np.int64)
    bad = _I64(-7)
    err = fn(*[dev.ptr(a) for a in inputs], *[dev.ptr(a) for a in outputs],
             *dims, dev.ptr(workspace), dev.ptr(scratch), ctypes.byref(bad),
             dev.stream_ptr())
    assert err == 0, f"CUDA error {err}"
    return [dev.get(a) for a in outputs], bad.value


def forward(lib, dev, features, indices, weights, vt=F32):
    b, e = features.shape
    m, s = indices.shape
    dims = (b, e, m, s)
    out = _nan_output(dev, (b, m), vt)
    (got,), bad = _call(
        _launcher(lib, "Forward", vt), dev,
        [dev.put(vt.encode(features)), dev.put(indices),
         dev.put(vt.encode(weights))], [out], dims,
        _workspace(lib, dev, FORWARD, vt, dims))
    return vt.decode(got), bad


def grad_features(lib, dev, backward, indices, weights, num_features, vt=F32):
    b, m = backward.shape
    s = indices.shape[1]
    dims = (b, num_features, m, s)
    out = _nan_output(dev, (b, num_features), vt)
    (got,), bad = _call(
        _launcher(lib, "GradFeatures", vt), dev,
        [dev.put(vt.encode(backward)), dev.put(indices),
         dev.put(vt.encode(weights))], [out], dims,
        _workspace(lib, dev, GRAD_FEATURES, vt, dims))
    return vt.decode(got), bad


def grad_weights(lib, dev, backward, features, indices, vt=F32):
    b, e = features.shape
    m, s = indices.shape
    dims = (b, e, m, s)
    out = _nan_output(dev, (m, s), vt)
    (got,), bad = _call(
        _launcher(lib, "GradWeights", vt), dev,
        [dev.put(vt.encode(backward)), dev.put(vt.encode(features)),
         dev.put(indices)], [out], dims,
        _workspace(lib, dev, GRAD_WEIGHTS, vt, dims))
    return vt.decode(got), bad


def grads(lib, dev, backward, features, indices, weights, vt=F32):
    """Both gradients from XmcUniformSparseGradGpu*: ((gf, gw), bad)."""
    b, e = features.shape
    m, s = indices.shape
    dims = (b, e, m, s)
    outs = [_nan_output(dev, (b, e), vt), _nan_output(dev, (m, s), vt)]
    (gf, gw), bad = _call(
        _launcher(lib, "Grad", vt), dev,
        [dev.put(vt.encode(backward)), dev.put(vt.encode(features)),
         dev.put(indices), dev.put(vt.encode(weights))], outs, dims,
        _workspace(lib, dev, GRAD, vt, dims))
    return (vt.decode(gf), vt.decode(gw)), bad


# ---------------------------------------------------------------------------
# Reference (float64) and data.

def dense_weights(indices, weights, num_features):
    """[m, e] float64 matrix of the uniform-sparse layer (duplicates add)."""
    m, s = indices.shape
    w = np.zeros((m, num_features))
    np.add.at(w, (np.repeat(np.arange(m), s), indices.ravel()),
              weights.ravel().astype(np.float64))
    return w


def reference(features, indices, weights, backward):
    """Returns (scores, grad_features, grad_weights) in float64."""
    f = features.astype(np.float64)
    g = backward.astype(np.float64)
    w = dense_weights(indices, weights, f.shape[1])
    scores = f @ w.T
    grad_f = g @ w
    # grad_w[j, k] = sum_i g[i, j] * f[i, indices[j, k]]
    grad_w = np.einsum("ij,ijk->jk", g, f[:, indices]) if f.size else \
        np.zeros(indices.shape)
    return scores, grad_f, grad_w


def make_problem(rng, b, e, m, s, density=0.1):
    features = rng.standard_normal((b, e)).astype(np.float32)
    indices = rng.integers(0, max(e, 1), size=(m, s)).astype(np.int32)
    weights = rng.standard_normal((m, s)).astype(np.float32)
    backward = make_backward(rng, b, m, density)
    return features, indices, weights, backward


def make_backward(rng, b, m, density):
    values = rng.standard_normal((b, m)).astype(np.float32)
    if density >= 1.0:
        values[values == 0] = 1.0
        return values
    return np.where(rng.random((b, m)) < density, values, 0).astype(np.float32)


def assert_close(got, want, terms, vt=F32):
    """float32 accumulation of `terms` products of N(0, 1) values, then one
    rounding to the value type."""
    tol = 2e-5 * max(1.0, float(terms)) ** 0.5 + 1e-6
    rtol = 1e-4 + 2 * vt.eps
    np.testing.assert_allclose(got, want, rtol=rtol,
                               atol=tol + 2 * vt.eps * max(1.0, terms) ** 0.5)


def check_all(lib, dev, features, indices, weights, backward, vt=F32):
    b, e = features.shape
    m, s = indices.shape
    # The reference sees the inputs as the launcher does (rounded to vt).
    features, weights, backward = (vt.round(a) for a in
                                   (features, weights, backward))
    scores, grad_f, grad_w = reference(features, indices, weights, backward)
    gf_terms = m * s / max(e, 1) + s

    got, bad = forward(lib, dev, features, indices, weights, vt)
    assert bad == -1
    assert_close(got, scores, s, vt)

    got, bad = grad_features(lib, dev, backward, indices, weights, e, vt)
    assert bad == -1
    assert_close(got, grad_f, gf_terms, vt)

    got, bad = grad_weights(lib, dev, backward, features, indices, vt)
    assert bad == -1
    assert_close(got, grad_w, b, vt)

    (got_f, got_w), bad = grads(lib, dev, backward, features, indices,
                                weights, vt)
    assert bad == -1
    assert_close(got_f, grad_f, gf_terms, vt)
    assert_close(got_w, grad_w, b, vt)


# ---------------------------------------------------------------------------
# Tests.

SHAPES = [  # (batch, num_features, num_labels, fan_in)
    (1, 1, 1, 1),
    (1, 17, 33, 1),       # b = 1, s = 1, m not a multiple of 32
    (3, 50, 100, 7),
    (2, 1000, 31, 2),     # fewer labels than a warp
    (37, 300, 1000, 32),
    (70, 257, 65, 64),
    (5, 64, 40, 100),     # fan_in > 64: forward stages connections in chunks
    (9, 4, 45, 32),       # e = 4 < s: many duplicate indices per label
    (130, 33, 31, 3),     # tiny m * s, larger batch: batch split over grid.y
    (300, 2048, 97, 16),
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "b%d_e%d_m%d_s%d" % s)
@pytest.mark.parametrize("density", [1.0, 0.1, 0.01])
def test_matches_reference(lib, dev, shape, density):
    rng = np.random.default_rng(hash((shape, density)) % 2**32)
    check_all(lib, dev, *make_problem(rng, *shape, density=density))


@pytest.mark.parametrize("shape", [(4, 64, 100, 32), (64, 500, 300, 8),
                                   (300, 100, 70, 64)])
def test_all_zero_backward(lib, dev, shape):
    rng = np.random.default_rng(1)
    b, e, m, s = shape
    features, indices, weights, _ = make_problem(rng, *shape)
    backward = np.zeros((b, m), np.float32)
    got, bad = grad_features(lib, dev, backward, indices, weights, e)
    assert bad == -1
    np.testing.assert_array_equal(got, 0)
    got, bad = grad_weights(lib, dev, backward, features, indices)
    assert bad == -1
    np.testing.assert_array_equal(got, 0)
    (got_f, got_w), bad = grads(lib, dev, backward, features, indices,
                                weights)
    assert bad == -1
    np.testing.assert_array_equal(got_f, 0)
    np.testing.assert_array_equal(got_w, 0)


def test_warp_sparse_backward(lib, dev):
    """Whole 32-label groups without signal next to groups with some."""
    rng = np.random.default_rng(2)
    b, e, m, s = 20, 300, 200, 33
    features, indices, weights, backward = make_problem(rng, b, e, m, s, 0.3)
    backward[:, 32:96] = 0     # two full warps of labels silent
    backward[3, :] = 0         # one instance silent
    backward[5, 100] = 2.5     # a single non-zero in a silent region
    backward[5, 101:128] = 0
    check_all(lib, dev, features, indices, weights, backward)


def test_zero_weights_still_read_through(lib, dev):
    """A zero weight is not a zero signal: only backward == 0 is skipped."""
    rng = np.random.default_rng(3)
    features, indices, weights, backward = make_problem(rng, 8, 40, 50, 5, 0.5)
    weights[::2] = 0
    check_all(lib, dev, features, indices, weights, backward)


BAD_VALUES = [-1, INT32_MIN, 40, 41, INT32_MAX]  # e = 40 in the test below


@pytest.mark.parametrize("bad_value", BAD_VALUES)
@pytest.mark.parametrize("density", [1.0, 0.0])
def test_out_of_range_index_is_reported(lib, dev, bad_value, density):
    rng = np.random.default_rng(4)
    b, e, m, s = 6, 40, 70, 9
    features, indices, weights, backward = make_problem(rng, b, e, m, s,
                                                        density)
    positions = [(65, 8), (33, 4), (40, 0)]   # flat 593, 301, 360
    for j, k in positions:
        indices[j, k] = bad_value
    first = min(j * s + k for j, k in positions)
    assert forward(lib, dev, features, indices, weights)[1] == first
    # Reported even where the signal is zero (density 0): the launchers
    # check every index of the layer (the CPU gradients only the rows of
    # the labels with signal, the ones they read).
    assert grad_features(lib, dev, backward, indices, weights, e)[1] == first
    assert grad_weights(lib, dev, backward, features, indices)[1] == first
    assert grads(lib, dev, backward, features, indices, weights)[1] == first


@pytest.mark.parametrize("b", [0, 1, 300])
def test_out_of_range_single_entry(lib, dev, b):
    rng = np.random.default_rng(5)
    e, m, s = 16, 1, 1
    features, indices, weights, backward = make_problem(rng, b, e, m, s, 1.0)
    indices[0, 0] = e
    assert forward(lib, dev, features, indices, weights)[1] == 0
    assert grad_features(lib, dev, backward, indices, weights, e)[1] == 0
    assert grad_weights(lib, dev, backward, features, indices)[1] == 0
    assert grads(lib, dev, backward, features, indices, weights)[1] == 0


ZERO_SHAPES = [(0, 5, 7, 3), (4, 5, 0, 3), (4, 5, 7, 0), (0, 0, 0, 0),
               (4, 0, 7, 0), (0, 5, 0, 0), (3, 5, 0, 0)]


@pytest.mark.parametrize("shape", ZERO_SHAPES,
                         ids=lambda s: "b%d_e%d_m%d_s%d" % s)
def test_zero_size(lib, dev, shape):
    rng = np.random.default_rng(6)
    check_all(lib, dev, *make_problem(rng, *shape, density=0.5))


def test_zero_features_with_connections_is_out_of_range(lib, dev):
    """e = 0 but s > 0: every index is out of range; position 0 is first."""
    b, e, m, s = 3, 0, 5, 2
    features = np.zeros((b, e), np.float32)
    indices = np.zeros((m, s), np.int32)
    weights = np.ones((m, s), np.float32)
    backward = np.ones((b, m), np.float32)
    assert forward(lib, dev, features, indices, weights)[1] == 0
    assert grad_features(lib, dev, backward, indices, weights, e)[1] == 0
    assert grad_weights(lib, dev, backward, features, indices)[1] == 0
    assert grads(lib, dev, backward, features, indices, weights)[1] == 0


def test_repeated_calls_reset_error(lib, dev):
    """A clean call after a failing one reports -1 (scratch re-initialised)."""
    rng = np.random.default_rng(7)
    features, indices, weights, backward = make_problem(rng, 4, 20, 40, 4)
    bad_indices = indices.copy()
    bad_indices[10, 1] = -5
    assert forward(lib, dev, features, bad_indices, weights)[1] == 41
    check_all(lib, dev, features, indices, weights, backward)


@pytest.mark.skipif(cp is None, reason="needs CuPy streams")
def test_non_default_stream(lib):
    rng = np.random.default_rng(8)
    with cp.cuda.Stream(non_blocking=True) as stream:
        check_all(lib, Device(stream), *make_problem(rng, 33, 100, 90, 16))


@pytest.mark.skipif(cp is None, reason="needs a large GPU")
def test_int64_offsets(lib, dev):
    """batch * num_labels > 2^31: offsets must be computed in int64."""
    b, e, m, s = 1100, 8, 2_000_000, 1
    need = 2 * b * m * 4 + (1 << 30)
    if cp.cuda.runtime.memGetInfo()[0] < need:
        pytest.skip(f"needs {need / 2**30:.0f} GiB of free GPU memory")
    rng = np.random.default_rng(9)
    features = rng.standard_normal((b, e)).astype(np.float32)
    indices = rng.integers(0, e, (m, s)).astype(np.int32)
    weights = rng.standard_normal((m, s)).astype(np.float32)
    f_d, i_d, w_d = dev.put(features), dev.put(indices), dev.put(weights)
    dims = (b, e, m, s)
    big = cp.full((b, m), np.nan, np.float32)
    scratch = cp.zeros(1, np.int64)
    bad = _I64()

    def run(op, kind, *arrays):
        ws = _workspace(lib, dev, kind, F32, dims)
        assert getattr(lib, f"XmcUniformSparse{op}GpuF32")(
            *[a.data.ptr for a in arrays], *dims, ws.data.ptr,
            scratch.data.ptr, ctypes.byref(bad), 0) == 0
        assert bad.value == -1

    run("Forward", FORWARD, f_d, i_d, w_d, big)
    rows = [0, 1074, b - 1]  # rows 1074 and up start past 2^31 elements
    want = features[rows][:, indices[:, 0]] * weights[:, 0]
    np.testing.assert_allclose(cp.asnumpy(big[rows]), want, rtol=1e-6)

    # Gradients with a backward signal in the rows past 2^31 elements only.
    big.fill(0)
    big[rows[1:]] = 1.0
    grad_f = cp.full((b, e), np.nan, np.float32)
    run("GradFeatures", GRAD_FEATURES, big, i_d, w_d, grad_f)
    dense = dense_weights(indices, weights, e)
    want_f = np.zeros((b, e))
    want_f[rows[1:]] = dense.sum(axis=0)
    np.testing.assert_allclose(cp.asnumpy(grad_f), want_f, rtol=1e-3,
                               atol=1.0)  # 250k float32 atomic adds each
    grad_w = cp.full((m, s), np.nan, np.float32)
    run("GradWeights", GRAD_WEIGHTS, big, f_d, i_d, grad_w)
    want_w = features[rows[1:]][:, indices[:, 0]].sum(axis=0)[:, None]
    np.testing.assert_allclose(cp.asnumpy(grad_w), want_w, rtol=1e-5,
                               atol=1e-5)


# ---------------------------------------------------------------------------
# 16-bit value types, the fused gradient, the workspace and non-finite
# values under a zero signal.

TYPE_SHAPES = [  # (batch, num_features, num_labels, fan_in)
    (1, 17, 33, 1),
    (37, 300, 1000, 32),
    (5, 64, 40, 100),      # fan_in > 32: connections in chunks of 32
    (130, 33, 31, 3),      # small m: instance tiles split over grid.y
    (300, 2048, 97, 16),   # batch > 256: several instance tiles
]


@pytest.mark.parametrize("suffix", ["F16", "BF16"])
@pytest.mark.parametrize("shape", TYPE_SHAPES,
                         ids=lambda s: "b%d_e%d_m%d_s%d" % s)
@pytest.mark.parametrize("density", [1.0, 0.05])
def test_value_types_match_reference(lib, dev, suffix, shape, density):
    rng = np.random.default_rng(hash((shape, density, suffix)) % 2**32)
    check_all(lib, dev, *make_problem(rng, *shape, density=density),
              vt=TYPES[suffix])


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_many_labels_and_instance_tiles(lib, dev, suffix):
    """Enough label tiles that the grid is not split over instances, and
    more than one instance tile: the weights gradient accumulates across
    tiles in one block (in float for 16-bit types)."""
    rng = np.random.default_rng(10)
    check_all(lib, dev, *make_problem(rng, 600, 96, 40_000, 3, density=0.3),
              vt=TYPES[suffix])


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_zero_signal_ignores_non_finite_values(lib, dev, suffix):
    """A zero backward[i, j] contributes exactly 0 (no read of the feature or
    weight behind it): inf / NaN there leave both gradients finite, as on
    the CPU."""
    vt = TYPES[suffix]
    rng = np.random.default_rng(11)
    b, e, m, s = 40, 64, 70, 8
    features, indices, weights, backward = make_problem(rng, b, e, m, s, 0.5)
    backward[7, :] = 0
    features[7, :] = np.inf         # instance 7 has no signal
    features[9, 3] = np.nan
    backward[9, :] = 0              # nor instance 9
    backward[:, 11] = 0
    weights[11, :] = np.nan         # label 11 has no signal
    features, weights, backward = (vt.round(a) for a in
                                   (features, weights, backward))
    clean_f = np.where(np.isfinite(features), features, 0)
    clean_w = np.where(np.isfinite(weights), weights, 0)
    _, want_f, want_w = reference(clean_f, indices, clean_w, backward)
    got_f, bad = grad_features(lib, dev, backward, indices, weights, e, vt)
    assert bad == -1
    assert_close(got_f, want_f, m * s / e + s, vt)
    got_w, bad = grad_weights(lib, dev, backward, features, indices, vt)
    assert bad == -1
    assert_close(got_w, want_w, b, vt)
    (got_f, got_w), bad = grads(lib, dev, backward, features, indices,
                                weights, vt)
    assert bad == -1
    assert_close(got_f, want_f, m * s / e + s, vt)
    assert_close(got_w, want_w, b, vt)


@pytest.mark.parametrize("suffix", SUFFIXES)
def test_value_types_report_bad_index(lib, dev, suffix):
    vt = TYPES[suffix]
    rng = np.random.default_rng(12)
    b, e, m, s = 6, 40, 70, 9
    features, indices, weights, backward = make_problem(rng, b, e, m, s, 0.0)
    indices[33, 4] = e
    indices[65, 8] = -1
    first = 33 * s + 4
    assert forward(lib, dev, features, indices, weights, vt)[1] == first
    assert grad_features(lib, dev, backward, indices, weights, e,
                         vt)[1] == first
    assert grad_weights(lib, dev, backward, features, indices, vt)[1] == first
    assert grads(lib, dev, backward, features, indices, weights,
                 vt)[1] == first


@pytest.mark.parametrize("suffix", ["F32", "BF16"])
def test_both_gradients_beyond_half_the_l2(lib, dev, suffix):
    """features_t + the features gradient (256 x 32768 x (4 + v) bytes, 50
    MiB or more) exceed half the L2 of current GPUs: the launcher of both
    gradients then runs one kernel per gradient; same results."""
    rng = np.random.default_rng(13)
    check_all(lib, dev, *make_problem(rng, 256, 32768, 300, 8, density=0.2),
              vt=TYPES[suffix])


def test_workspace_bytes(lib):
    """The documented layout: features_t [e, ld] (value type), the features
    gradient [e, ld] (float), a float [m, s] accumulator for 16-bit weights
    gradients; ld = batch rounded up to 32; parts 256-byte aligned."""
    query = lib.XmcUniformSparseGpuWorkspaceBytes
    b, e, m, s = 33, 100, 7, 5
    ld = 64
    align = lambda x: -(-x // 256) * 256  # noqa: E731
    assert query(FORWARD, 4, b, e, m, s) == align(e * ld * 4)
    assert query(FORWARD, 2, b, e, m, s) == align(e * ld * 2)
    assert query(GRAD_FEATURES, 4, b, e, m, s) == align(e * ld * 4)
    assert query(GRAD_WEIGHTS, 4, b, e, m, s) == align(e * ld * 4)
    assert query(GRAD_WEIGHTS, 2, b, e, m, s) == (align(e * ld * 2) +
                                                  align(m * s * 4))
    assert query(GRAD, 2, b, e, m, s) == (align(e * ld * 2) +
                                          align(e * ld * 4) +
                                          align(m * s * 4))
    for bad_args in [(4, 4, b, e, m, s), (0, 3, b, e, m, s),
                     (0, 4, -1, e, m, s), (1, 4, b, e, m, -2)]:
        assert query(*bad_args) == -1
