"""Helpers shared by the GPU tests: CuPy, why the tests would skip, and the
framework-free CUDA harness library (``tools/build_cuda_harness.py``)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))


def import_cupy():
    """The ``cupy`` module, or None when it is not installed or broken."""
    try:
        import cupy  # pylint: disable=import-error,import-outside-toplevel
    except Exception:  # pylint: disable=broad-except
        return None
    return cupy


def cuda_skip_reason(cp) -> str | None:
    """Why CUDA tests cannot run with the CuPy module ``cp`` (None if they
    can): CuPy missing, no device, or no driver."""
    if cp is None:
        return "CuPy is not installed"
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception:  # no driver  # pylint: disable=broad-except
        return "no CUDA device (no driver)"
    return None


def harness_path(env_var: str, tmp_path_factory, name: str,
                 sources=None) -> str:
    """The harness library's path: ``$env_var`` when set, else one built
    now with nvcc for this machine's GPU (``sources``: the ``.cu.cc`` files,
    relative to the repository; None: the builder's default).  Skips the
    calling test when it cannot be built."""
    path = os.environ.get(env_var)
    if path:
        return path
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    try:
        import build_cuda_harness  # pylint: disable=import-outside-toplevel
        out = tmp_path_factory.mktemp("harness") / name
        kwargs = {} if sources is None else {"sources": tuple(sources)}
        return build_cuda_harness.build(str(out), archs="native",
                                        verbose=False, **kwargs)
    except RuntimeError as e:
        pytest.skip(f"cannot build the CUDA harness: {e}")
    finally:
        sys.path.pop(0)
