"""GPU tests of the framework-free sampled-scoring CUDA launchers (float32).

Checks ``XmcSampled{Forward,GradFeatures,GradWeights}GpuF32``
(``ops/sampled/sampled_kernels.cu.cc``; the uniform-sparse layer of
Schultheis & Babbar scored on per-instance candidates, ASTRA Algorithm 1)
against a float64 NumPy reference, without TensorFlow: the launchers are
built alone with nvcc (``tools/build_cuda_harness.py``), loaded with
``ctypes`` and fed CuPy device arrays.  Skipped (not failed) without CuPy or
a CUDA device.  ``XMC_SAMPLED_CUDA_LIB`` names a prebuilt harness library.
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from cuda_harness import cuda_skip_reason, harness_path, import_cupy

SOURCE = os.path.join("ops", "sampled", "sampled_kernels.cu.cc")

cp = import_cupy()
SKIP_REASON = cuda_skip_reason(cp)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None,
                                 reason=SKIP_REASON or "")]

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
_ARGTYPES = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _P,
             ctypes.POINTER(_I64), _P]
NAMES = ("XmcSampledForwardGpuF32", "XmcSampledGradFeaturesGpuF32",
         "XmcSampledGradWeightsGpuF32")


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path = harness_path("XMC_SAMPLED_CUDA_LIB", tmp_path_factory, "libxmc_sampled.so",
                        sources=(SOURCE,))
    library = ctypes.CDLL(path)
    for name in NAMES:
        getattr(library, name).argtypes = _ARGTYPES
        getattr(library, name).restype = ctypes.c_int
    return library


def _run(fn, inputs, out_shape, dims):
    """Calls a launcher; returns (output, bad_positions)."""
    arrays = [cp.asarray(np.ascontiguousarray(a)) for a in inputs]
    out = cp.full(out_shape, np.nan, np.float32)
    scratch = cp.full((2,), 777, np.int64)
    bad = (_I64 * 2)(-7, -7)
    err = fn(*[a.data.ptr for a in arrays], out.data.ptr, *dims,
             scratch.data.ptr, bad, cp.cuda.get_current_stream().ptr)
    assert err == 0, f"CUDA error {err}"
    return cp.asnumpy(out), (bad[0], bad[1])


def launch_all(lib, x, idx, w, cand, g):
    (b, e), (m, s), c = x.shape, idx.shape, cand.shape[1]
    dims = (b, e, m, s, c)
    y = _run(lib.XmcSampledForwardGpuF32, [x, idx, w, cand], (b, c), dims)
    gx = _run(lib.XmcSampledGradFeaturesGpuF32, [g, idx, w, cand], (b, e),
              dims)
    gv = _run(lib.XmcSampledGradWeightsGpuF32, [g, x, idx, cand], (b * c, s),
              dims)
    return y, gx, gv


def reference(x, idx, w, cand, g):
    x, w, g = (a.astype(np.float64) for a in (x, w, g))
    b, c = cand.shape
    rows = idx[cand]
    inst = np.broadcast_to(np.arange(b)[:, None, None], rows.shape)
    gathered = x[inst, rows]
    scores = np.einsum("bcs,bcs->bc", gathered, w[cand])
    grad_x = np.zeros_like(x)
    np.add.at(grad_x, (inst, rows), g[:, :, None] * w[cand])
    return scores, grad_x, (g[:, :, None] * gathered).reshape(b * c, -1)


def make(rng, b, e, m, s, c, density=1.0):
    x = rng.standard_normal((b, e)).astype(np.float32)
    idx = rng.integers(0, e, (m, s)).astype(np.int32)
    w = rng.standard_normal((m, s)).astype(np.float32)
    cand = rng.integers(0, m, (b, c)).astype(np.int32)
    g = rng.standard_normal((b, c)).astype(np.float32)
    g[rng.random((b, c)) >= density] = 0.0
    return x, idx, w, cand, g


@pytest.mark.parametrize("b,e,m,s,c,density", [
    (7, 60, 300, 7, 13, 1.0), (5, 20, 33, 1, 4, 1.0), (4, 50, 40, 32, 9, 0.5),
    (4, 50, 40, 70, 9, 0.5), (64, 512, 5000, 32, 200, 0.05),
    (3, 40, 30, 8, 10, 0.0)])
def test_matches_reference(lib, b, e, m, s, c, density):
    rng = np.random.default_rng(b * 1000 + s)
    x, idx, w, cand, g = make(rng, b, e, m, s, c, density)
    cand[1] = cand[0]  # duplicate candidates across rows
    results = launch_all(lib, x, idx, w, cand, g)
    for (got, bad), ref in zip(results, reference(x, idx, w, cand, g)):
        assert bad == (-1, -1)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4)


def test_bad_candidate_and_index_are_reported(lib):
    rng = np.random.default_rng(1)
    x, idx, w, cand, g = make(rng, 3, 10, 6, 4, 5)
    bad_cand = cand.copy()
    bad_cand[1, 3] = 6
    bad_cand[2, 0] = -1
    for _, bad in launch_all(lib, x, idx, w, bad_cand, g):
        assert bad[0] == 1 * 5 + 3
    cand[:] = 2
    bad_idx = idx.copy()
    bad_idx[2, 3] = 10
    bad_idx[2, 1] = -5
    for _, bad in launch_all(lib, x, bad_idx, w, cand, g):
        assert bad == (-1, 2 * 4 + 1)
    # Zero signal: the gradients do not read (or report) the row.
    results = launch_all(lib, x, bad_idx, w, cand, np.zeros_like(g))
    assert results[0][1] == (-1, 9)
    assert results[1][1] == (-1, -1) and not results[1][0].any()
    assert results[2][1] == (-1, -1) and not results[2][0].any()


def test_empty_sizes(lib):
    rng = np.random.default_rng(2)
    for b, m, s, c in [(0, 5, 3, 4), (3, 5, 3, 0), (3, 5, 0, 4)]:
        x, idx, w, cand, g = make(rng, b, 6, m, s, c)
        (y, b0), (gx, b1), (gv, b2) = launch_all(lib, x, idx, w, cand, g)
        assert b0 == b1 == b2 == (-1, -1)
        assert not y.any() and not gx.any() and not gv.any()
