"""GPU tests of the framework-free uniform-sparse CUDA launchers (float32).

Checks ``XmcUniformSparse{Forward,GradFeatures,GradWeights}GpuF32``
(``ops/uniform_sparse/uniform_sparse_kernels.cu.cc``, Schultheis & Babbar
Sec. 3.2-3.3, Algorithms 1-3) against a float64 NumPy reference, without
TensorFlow: the launchers are built alone with nvcc
(``tools/build_cuda_harness.py``), loaded with ``ctypes`` and fed CuPy device
arrays.

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
_ARGTYPES = [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _P,
             ctypes.POINTER(_I64), _P]
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
    for name in ("XmcUniformSparseForwardGpuF32",
                 "XmcUniformSparseGradFeaturesGpuF32",
                 "XmcUniformSparseGradWeightsGpuF32"):
        fn = getattr(library, name)
        fn.argtypes = _ARGTYPES
        fn.restype = ctypes.c_int
    return library


@pytest.fixture(scope="module")
def dev():
    return Device()


def _call(fn, dev, inputs, out, dims):
    """Runs one launcher; returns (output as numpy, bad_position).

    Args:
      fn: ctypes launcher.
      dev: Device.
      inputs: three device arrays in the launcher's argument order.
      out: device output array (pre-filled with NaN to catch unwritten
        entries).
      dims: (batch, num_features, num_labels, fan_in).
    """
    scratch = dev.full((1,), 12345, np.int64)
    bad = _I64(-7)
    err = fn(*[dev.ptr(a) for a in inputs], dev.ptr(out), *dims,
             dev.ptr(scratch), ctypes.byref(bad), dev.stream_ptr())
    assert err == 0, f"CUDA error {err}"
    return dev.get(out), bad.value


def forward(lib, dev, features, indices, weights):
    b, e = features.shape
    m, s = indices.shape
    out = dev.full((b, m), np.nan, np.float32)
    return _call(lib.XmcUniformSparseForwardGpuF32, dev,
                 [dev.put(features), dev.put(indices), dev.put(weights)], out,
                 (b, e, m, s))


def grad_features(lib, dev, backward, indices, weights, num_features):
    b, m = backward.shape
    s = indices.shape[1]
    out = dev.full((b, num_features), np.nan, np.float32)
    return _call(lib.XmcUniformSparseGradFeaturesGpuF32, dev,
                 [dev.put(backward), dev.put(indices), dev.put(weights)], out,
                 (b, num_features, m, s))


def grad_weights(lib, dev, backward, features, indices):
    b, e = features.shape
    m, s = indices.shape
    out = dev.full((m, s), np.nan, np.float32)
    return _call(lib.XmcUniformSparseGradWeightsGpuF32, dev,
                 [dev.put(backward), dev.put(features), dev.put(indices)], out,
                 (b, e, m, s))


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


def assert_close(got, want, terms):
    """float32 accumulation of `terms` products of N(0, 1) values."""
    tol = 2e-5 * max(1.0, float(terms)) ** 0.5 + 1e-6
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=tol)


def check_all(lib, dev, features, indices, weights, backward):
    b, e = features.shape
    m, s = indices.shape
    scores, grad_f, grad_w = reference(features, indices, weights, backward)

    got, bad = forward(lib, dev, features, indices, weights)
    assert bad == -1
    assert_close(got, scores, s)

    got, bad = grad_features(lib, dev, backward, indices, weights, e)
    assert bad == -1
    assert_close(got, grad_f, m * s / max(e, 1) + s)

    got, bad = grad_weights(lib, dev, backward, features, indices)
    assert bad == -1
    assert_close(got, grad_w, b)


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
    # Reported even where the signal is zero (density 0): every index of
    # the layer is checked, as on the CPU.
    assert grad_features(lib, dev, backward, indices, weights, e)[1] == first
    assert grad_weights(lib, dev, backward, features, indices)[1] == first


@pytest.mark.parametrize("b", [0, 1, 300])
def test_out_of_range_single_entry(lib, dev, b):
    rng = np.random.default_rng(5)
    e, m, s = 16, 1, 1
    features, indices, weights, backward = make_problem(rng, b, e, m, s, 1.0)
    indices[0, 0] = e
    assert forward(lib, dev, features, indices, weights)[1] == 0
    assert grad_features(lib, dev, backward, indices, weights, e)[1] == 0
    assert grad_weights(lib, dev, backward, features, indices)[1] == 0


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
    big = cp.full((b, m), np.nan, np.float32)
    fwd = lib.XmcUniformSparseForwardGpuF32
    scratch = cp.zeros(1, np.int64)
    bad = _I64()
    assert fwd(f_d.data.ptr, i_d.data.ptr, w_d.data.ptr, big.data.ptr, b, e,
               m, s, scratch.data.ptr, ctypes.byref(bad), 0) == 0
    assert bad.value == -1
    rows = [0, 1074, b - 1]  # rows 1074 and up start past 2^31 elements
    want = features[rows][:, indices[:, 0]] * weights[:, 0]
    np.testing.assert_allclose(cp.asnumpy(big[rows]), want, rtol=1e-6)

    # Gradients with a backward signal in the rows past 2^31 elements only.
    big.fill(0)
    big[rows[1:]] = 1.0
    grad_f = cp.full((b, e), np.nan, np.float32)
    assert lib.XmcUniformSparseGradFeaturesGpuF32(
        big.data.ptr, i_d.data.ptr, w_d.data.ptr, grad_f.data.ptr, b, e, m, s,
        scratch.data.ptr, ctypes.byref(bad), 0) == 0
    dense = dense_weights(indices, weights, e)
    want_f = np.zeros((b, e))
    want_f[rows[1:]] = dense.sum(axis=0)
    np.testing.assert_allclose(cp.asnumpy(grad_f), want_f, rtol=1e-3,
                               atol=1.0)  # 250k float32 atomic adds each
    grad_w = cp.full((m, s), np.nan, np.float32)
    assert lib.XmcUniformSparseGradWeightsGpuF32(
        big.data.ptr, f_d.data.ptr, i_d.data.ptr, grad_w.data.ptr, b, e, m, s,
        scratch.data.ptr, ctypes.byref(bad), 0) == 0
    want_w = features[rows[1:]][:, indices[:, 0]].sum(axis=0)[:, None]
    np.testing.assert_allclose(cp.asnumpy(grad_w), want_w, rtol=1e-5,
                               atol=1e-5)
