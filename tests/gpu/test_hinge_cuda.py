"""GPU tests of the framework-free fused squared-hinge CUDA launchers.

Checks ``XmcSquaredHingeLossGpuF32`` and ``XmcSquaredHingeLossGradGpuF32``
(``ops/hinge/hinge_kernels.cu.cc``; the one-vs-all squared hinge of
Schultheis & Babbar, Sec. 2 eq. 2, from padded label ids) against a float64
NumPy reference, without TensorFlow: the launchers are built alone with nvcc
(``tools/build_cuda_harness.py``), loaded with ``ctypes`` and fed CuPy
device arrays.  Skipped (not failed) without CuPy or a CUDA device.
``XMC_HINGE_CUDA_LIB`` names a prebuilt harness library.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np
import pytest

from cuda_harness import ROOT, cuda_skip_reason, harness_path, import_cupy

SOURCE = os.path.join("ops", "hinge", "hinge_kernels.cu.cc")
sys.path.insert(0, os.path.join(ROOT, "tests"))
from hinge_reference import squared_hinge_reference  # noqa: E402

cp = import_cupy()
SKIP_REASON = cuda_skip_reason(cp)
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(SKIP_REASON is not None,
                                 reason=SKIP_REASON or "")]

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
_F = ctypes.c_float


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    path = harness_path("XMC_HINGE_CUDA_LIB", tmp_path_factory, "libxmc_hinge.so",
                        sources=(SOURCE,))
    library = ctypes.CDLL(path)
    library.XmcSquaredHingeLossScratchFloats.argtypes = [_I64, _I64]
    library.XmcSquaredHingeLossScratchFloats.restype = _I64
    library.XmcSquaredHingeLossGpuF32.argtypes = [
        _P, _P, ctypes.c_int, _P, _I64, _I64, _I64, _F, _P, _P,
        ctypes.POINTER(_I64), _P]
    library.XmcSquaredHingeLossGradGpuF32.argtypes = [
        _P, _P, ctypes.c_int, _P, _P, _I64, _I64, _I64, _F, _P,
        ctypes.POINTER(_I64), _P]
    for name in ("XmcSquaredHingeLossGpuF32", "XmcSquaredHingeLossGradGpuF32"):
        getattr(library, name).restype = ctypes.c_int
    return library


def launch(lib, scores, labels, margin, upstream):
    """Returns (loss, grad, bad_loss, bad_grad)."""
    b, m = scores.shape
    n = labels.shape[1]
    x, ids, up = (cp.asarray(np.ascontiguousarray(a))
                  for a in (scores, labels, upstream))
    is64 = int(labels.dtype == np.int64)
    loss = cp.full((b,), np.nan, np.float32)
    grad = cp.full((b, m), np.nan, np.float32)
    partial = cp.empty(
        (lib.XmcSquaredHingeLossScratchFloats(b, m),), np.float32)
    scratch = cp.full((1,), 777, np.int64)
    stream = cp.cuda.get_current_stream().ptr
    bad_loss, bad_grad = _I64(-7), _I64(-7)
    err = lib.XmcSquaredHingeLossGpuF32(
        x.data.ptr, ids.data.ptr, is64, loss.data.ptr, b, m, n, margin,
        partial.data.ptr, scratch.data.ptr, ctypes.byref(bad_loss), stream)
    assert err == 0, f"CUDA error {err}"
    err = lib.XmcSquaredHingeLossGradGpuF32(
        x.data.ptr, ids.data.ptr, is64, up.data.ptr, grad.data.ptr, b, m, n,
        margin, scratch.data.ptr, ctypes.byref(bad_grad), stream)
    assert err == 0, f"CUDA error {err}"
    return cp.asnumpy(loss), cp.asnumpy(grad), bad_loss.value, bad_grad.value


@pytest.mark.parametrize("b,m,n", [(1, 1, 1), (5, 37, 4), (3, 20000, 9),
                                   (2, 670091, 30)])
@pytest.mark.parametrize("margin", [1.0, 0.5])
@pytest.mark.parametrize("id_dtype", [np.int32, np.int64])
def test_matches_numpy(lib, b, m, n, margin, id_dtype):
    rng = np.random.default_rng(b + m + n)
    scores = rng.normal(scale=1.5, size=(b, m)).astype(np.float32)
    labels = rng.integers(-1, m, (b, n)).astype(id_dtype)
    if n >= 2:
        labels[:, 1] = labels[:, 0]  # repeated ids count once
    upstream = rng.normal(size=b).astype(np.float32)
    loss, grad, bad_l, bad_g = launch(lib, scores, labels, margin, upstream)
    want_loss, want_grad = squared_hinge_reference(scores, labels, margin,
                                                   upstream)
    assert bad_l == -1 and bad_g == -1
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(grad, want_grad, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(grad == 0, want_grad == 0)


def test_bad_ids_are_reported(lib):
    scores = np.zeros((2, 5), np.float32)
    labels = np.array([[0, 5], [-2, 1]], np.int64)
    _, _, bad_l, bad_g = launch(lib, scores, labels, 1.0,
                                np.ones(2, np.float32))
    assert bad_l == 1 and bad_g == 1  # labels[0, 1]: the smallest position
