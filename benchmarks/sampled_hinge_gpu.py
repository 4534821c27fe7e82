"""GPU benchmark of the sampled-scoring and squared-hinge CUDA launchers.

Times, through ``ctypes`` on CuPy arrays (no TensorFlow):

* ``XmcSampled{Forward,GradFeatures,GradWeights}GpuF32``
  (``ops/sampled/sampled_kernels.cu.cc``): the uniform-sparse layer scored
  on ``c`` candidate labels per instance (Schultheis & Babbar Sec. 3.2-3.3;
  ASTRA, Mehta et al., Algorithm 1), with the candidate ids drawn uniformly;
* ``XmcSquaredHingeLoss{,Grad}GpuF32`` (``ops/hinge/hinge_kernels.cu.cc``):
  the one-vs-all squared hinge of Schultheis & Babbar Sec. 2, eq. 2, from
  ``n`` padded positive label ids per instance, beside the same loss written
  with CuPy element-wise kernels on a dense 0/1 target (what a Keras user
  gets from ``tf.keras.losses.SquaredHinge``: one full [b, m] target
  matrix).

Usage (on a GPU machine; ``--help`` works anywhere)::

    python benchmarks/sampled_hinge_gpu.py --out sampled_hinge_gpu.json

Timing as in ``benchmarks/uniform_sparse_gpu.py`` (CUDA events, median of
adaptive repeats, the launcher's index-check copy and synchronisation
included).  Bytes model (compulsory DRAM traffic, v = 4 bytes):

* sampled forward:  4*b*c (candidates) + 8*b*c*s (the candidates' label
  rows: indices + weights) + v*b*e (features) + v*b*c (scores)
* sampled grad features: 4*b*c + v*b*c (backward) + 8*nnz*s (rows of the
  non-zero entries) + v*b*e (grad_features)
* sampled grad weights: 4*b*c + v*b*c + 4*nnz*s (indices) + v*b*e
  + v*b*c*s (grad values)
* hinge loss: v*b*m (scores) + 4*b*n (labels) + v*b; gradient: 2*v*b*m
  + 4*b*n + v*b

The sampled rows are gathered (one 128-byte line per label row at s = 32),
so their GB/s is an effective bandwidth.  The harness libraries are built
with ``tools/build_cuda_harness.py`` (``--archs native``) unless
``--sampled-lib`` / ``--hinge-lib`` name prebuilt ones.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from uniform_sparse_gpu import Bench  # noqa: E402

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
_SAMPLED_ARGTYPES = [_P, _P, _P, _P, _P, _I64, _I64, _I64, _I64, _I64, _P,
                     ctypes.POINTER(_I64), _P]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--out", default="sampled_hinge_gpu.json")
    parser.add_argument("--sampled-lib", default=os.environ.get(
        "XMC_SAMPLED_CUDA_LIB"))
    parser.add_argument("--hinge-lib", default=os.environ.get(
        "XMC_HINGE_CUDA_LIB"))
    parser.add_argument("--num-labels", type=int, default=670_000)
    parser.add_argument("--num-features", type=int, default=32768)
    parser.add_argument("--fan-in", type=int, default=32)
    parser.add_argument("--batches", default="32,256,1024")
    parser.add_argument("--candidates", default="256,2048")
    parser.add_argument("--positives", type=int, default=5,
                        help="label ids per instance for the hinge (n)")
    parser.add_argument("--density", type=float, default=0.1,
                        help="non-zero fraction of the sampled backward")
    parser.add_argument("--seconds-per-case", type=float, default=0.3)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def _library(path, source, name):
    if not path:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import build_cuda_harness  # pylint: disable=import-outside-toplevel
        path = build_cuda_harness.build(
            os.path.join(tempfile.mkdtemp(prefix="xmc_bench_"), name),
            archs="native", sources=(source,), verbose=False)
    return ctypes.CDLL(path), path


def _checked(err, bad):
    if err != 0:
        raise RuntimeError(f"CUDA error {err}")
    if any(v != -1 for v in bad):
        raise RuntimeError(f"range check failed: {list(bad)}")


def run(args):
    import cupy as cp  # pylint: disable=import-outside-toplevel

    bench = Bench(cp, args.seconds_per_case)
    info = bench.device_info()
    peak = info["peak_bandwidth_gbs"] or info["copy_bandwidth_gbs"]
    sampled, sampled_path = _library(
        args.sampled_lib, os.path.join("ops", "sampled",
                                       "sampled_kernels.cu.cc"),
        "libxmc_sampled.so")
    hinge, hinge_path = _library(
        args.hinge_lib, os.path.join("ops", "hinge", "hinge_kernels.cu.cc"),
        "libxmc_hinge.so")
    for name in ("XmcSampledForwardGpuF32", "XmcSampledGradFeaturesGpuF32",
                 "XmcSampledGradWeightsGpuF32"):
        getattr(sampled, name).argtypes = _SAMPLED_ARGTYPES
        getattr(sampled, name).restype = ctypes.c_int
    hinge.XmcSquaredHingeLossScratchFloats.argtypes = [_I64, _I64]
    hinge.XmcSquaredHingeLossScratchFloats.restype = _I64
    hinge.XmcSquaredHingeLossGpuF32.argtypes = [
        _P, _P, ctypes.c_int, _P, _I64, _I64, _I64, ctypes.c_float, _P, _P,
        ctypes.POINTER(_I64), _P]
    hinge.XmcSquaredHingeLossGradGpuF32.argtypes = [
        _P, _P, ctypes.c_int, _P, _P, _I64, _I64, _I64, ctypes.c_float, _P,
        ctypes.POINTER(_I64), _P]
    hinge.XmcSquaredHingeLossGpuF32.restype = ctypes.c_int
    hinge.XmcSquaredHingeLossGradGpuF32.restype = ctypes.c_int
    print(f"# {info['name']}: peak {info['peak_bandwidth_gbs']} GB/s, copy "
          f"{info['copy_bandwidth_gbs']:.0f} GB/s", flush=True)
    print(f"{'kernel':<22} {'b':>5} {'c|n':>5} {'ms':>9} {'GB/s':>7} "
          f"{'%peak':>6} {'baseline ms':>11}", flush=True)
    rows = []

    def report(row):
        rows.append(row)
        base = row.get("baseline_ms")
        print(f"{row['kernel']:<22} {row['batch']:>5} {row['width']:>5} "
              f"{row['ms']:>9.3f} {row['gbs']:>7.0f} "
              f"{100 * row['gbs'] / peak:>5.0f}% "
              f"{'' if base is None else '%.3f' % base:>11}", flush=True)

    cp.random.seed(args.seed)
    m, e, s = args.num_labels, args.num_features, args.fan_in
    indices = cp.random.randint(0, e, size=(m, s), dtype=cp.int32)
    weights = cp.random.standard_normal((m, s), dtype=cp.float32)
    scratch = cp.empty(2, cp.int64)
    batches = [int(x) for x in args.batches.split(",") if x]
    widths = [int(x) for x in args.candidates.split(",") if x]
    for b in batches:
        features = cp.random.standard_normal((b, e), dtype=cp.float32)
        grad_f = cp.empty((b, e), cp.float32)
        for c in widths:
            cand = cp.random.randint(0, m, size=(b, c), dtype=cp.int32)
            scores = cp.empty((b, c), cp.float32)
            back = cp.random.standard_normal((b, c), dtype=cp.float32)
            back *= cp.random.random((b, c), dtype=cp.float32) < args.density
            nnz = int(cp.count_nonzero(back))
            grad_v = cp.empty((b * c, s), cp.float32)
            bad = (_I64 * 2)()
            dims = (b, e, m, s, c)
            base = dict(batch=b, width=c, num_labels=m, num_features=e,
                        fan_in=s, density=args.density, nnz=nnz)

            def call(fn, *ptrs):
                _checked(fn(*ptrs, *dims, scratch.data.ptr, bad, 0), bad)

            ms, reps = bench.time_ms(lambda: call(
                sampled.XmcSampledForwardGpuF32, features.data.ptr,
                indices.data.ptr, weights.data.ptr, cand.data.ptr,
                scores.data.ptr))
            nbytes = 4 * b * c + 8 * b * c * s + 4 * b * e + 4 * b * c
            report(dict(base, kernel="sampled_forward", ms=ms, repeats=reps,
                        bytes=nbytes, gbs=nbytes / ms / 1e6))
            ms, reps = bench.time_ms(lambda: call(
                sampled.XmcSampledGradFeaturesGpuF32, back.data.ptr,
                indices.data.ptr, weights.data.ptr, cand.data.ptr,
                grad_f.data.ptr))
            nbytes = 8 * b * c + 8 * nnz * s + 4 * b * e
            report(dict(base, kernel="sampled_grad_features", ms=ms,
                        repeats=reps, bytes=nbytes, gbs=nbytes / ms / 1e6))
            ms, reps = bench.time_ms(lambda: call(
                sampled.XmcSampledGradWeightsGpuF32, back.data.ptr,
                features.data.ptr, indices.data.ptr, cand.data.ptr,
                grad_v.data.ptr))
            nbytes = 8 * b * c + 4 * nnz * s + 4 * b * e + 4 * b * c * s
            report(dict(base, kernel="sampled_grad_weights", ms=ms,
                        repeats=reps, bytes=nbytes, gbs=nbytes / ms / 1e6))
            del cand, scores, back, grad_v
        del features, grad_f
        cp.get_default_memory_pool().free_all_blocks()
    del indices, weights

    n = args.positives
    for b in batches:
        scores = cp.random.standard_normal((b, m), dtype=cp.float32)
        labels = cp.random.randint(0, m, size=(b, n), dtype=cp.int32)
        loss = cp.empty((b,), cp.float32)
        grad = cp.empty((b, m), cp.float32)
        upstream = cp.ones((b,), cp.float32)
        partial = cp.empty(
            (hinge.XmcSquaredHingeLossScratchFloats(b, m),), cp.float32)
        bad = _I64(-1)
        # Baseline: the same loss and gradient from a dense 0/1 target
        # (+1 / -1 signs), CuPy element-wise + reduction kernels.
        signs = cp.full((b, m), -1.0, cp.float32)
        signs[cp.arange(b)[:, None], labels] = 1.0

        def dense_loss():
            return (cp.maximum(1.0 - signs * scores, 0.0) ** 2).sum(axis=1)

        def dense_grad():
            return -2.0 * signs * cp.maximum(1.0 - signs * scores, 0.0) * \
                upstream[:, None]

        def hinge_loss():
            err = hinge.XmcSquaredHingeLossGpuF32(
                scores.data.ptr, labels.data.ptr, 0, loss.data.ptr, b, m, n,
                1.0, partial.data.ptr, scratch.data.ptr, ctypes.byref(bad), 0)
            _checked(err, [bad.value])

        def hinge_grad():
            err = hinge.XmcSquaredHingeLossGradGpuF32(
                scores.data.ptr, labels.data.ptr, 0, upstream.data.ptr,
                grad.data.ptr, b, m, n, 1.0, scratch.data.ptr,
                ctypes.byref(bad), 0)
            _checked(err, [bad.value])

        hinge_loss()
        want = dense_loss()
        rel = float(cp.abs(loss - want).max() / cp.abs(want).max())
        base = dict(batch=b, width=n, num_labels=m, max_rel_diff=rel)
        ms, reps = bench.time_ms(hinge_loss)
        dense_ms, _ = bench.time_ms(dense_loss)
        nbytes = 4 * b * m + 4 * b * n + 4 * b
        report(dict(base, kernel="hinge_loss", ms=ms, repeats=reps,
                    bytes=nbytes, gbs=nbytes / ms / 1e6,
                    baseline_ms=dense_ms))
        ms, reps = bench.time_ms(hinge_grad)
        dense_ms, _ = bench.time_ms(dense_grad)
        nbytes = 8 * b * m + 4 * b * n + 4 * b
        report(dict(base, kernel="hinge_grad", ms=ms, repeats=reps,
                    bytes=nbytes, gbs=nbytes / ms / 1e6,
                    baseline_ms=dense_ms))
        del scores, labels, loss, grad, partial, signs
        cp.get_default_memory_pool().free_all_blocks()
    return {"device": info, "libraries": [sampled_path, hinge_path],
            "config": vars(args), "python": platform.python_version(),
            "note": "baseline_ms (hinge rows): the same loss / gradient with "
                    "CuPy element-wise kernels on a dense +1/-1 target",
            "rows": rows}


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    results = run(args)
    results["wall_seconds"] = time.time() - start
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    print(f"# wrote {args.out} ({results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
