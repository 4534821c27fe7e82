"""GPU benchmark of the framework-free uniform-sparse CUDA launchers.

Times ``XmcUniformSparse{Forward,GradFeatures,GradWeights,Grad}Gpu*``
(``ops/uniform_sparse/uniform_sparse_kernels.cu.cc``; Schultheis & Babbar,
Sec. 3.2-3.3, Algorithms 1-3) through ``ctypes`` on CuPy arrays -- no
TensorFlow -- for the value types of ``--dtypes`` (float32, float16,
bfloat16; float32 accumulation), and compares them with cuSPARSE on the same
matrix (the weights as a float32 CSR ``[m, e]`` of ``s`` entries per row;
SpMM, for the forward product and the features gradient) and with a dense
float32 cuBLAS layer of the same number of labels (``cupy.matmul``).

The default problem set is issue 33's: ``m = 670k`` labels with ``s = 32``
connections per label and ``m = 2.8M`` with ``s = 96``, batch 32 and 256,
``e = 32,768`` features.

Usage (on a GPU machine; ``--help`` works anywhere)::

    python benchmarks/uniform_sparse_gpu.py --out results.json
    python benchmarks/uniform_sparse_gpu.py --quick --out quick.json
    python benchmarks/uniform_sparse_gpu.py --dtypes float32,bfloat16

Timing: CUDA events around one launcher call on the null stream, after one
warm-up call; the median of 3-20 repeats (adaptive, about
``--seconds-per-case`` per case).  A launcher call includes what a
TensorFlow op pays: initialising the 8-byte error scratch, transposing the
features into the workspace (and the features gradient back), the kernel,
copying the index-check result to the host and synchronising the stream.
The JSON is rewritten after every problem size (``"partial": true`` until
the run ends), so a killed run keeps what it measured.

Bytes model (compulsory traffic: every byte that must cross DRAM at least
once, with v = 4 or 2 bytes per value; gathers, L2 hits, the workspace and
atomics are not counted, so GB/s is an *effective* bandwidth, comparable to
the device peak):

* forward:        (4+v)*m*s (indices + weights) + v*b*e (features)
                  + v*b*m (scores)
* grad features:  v*b*m (backward) + 4*m*s (all indices, range-checked)
                  + v*A*s (weights of the A labels with any non-zero signal)
                  + v*b*e (grad_features)
* grad weights:   v*b*m (backward) + 4*m*s (indices) + v*b*e (features)
                  + v*m*s (grad_weights)

The table also gives the gather rate (forward, grad weights: feature values
multiplied per second) and the atomic rate (grad features: non-zero signal
entries times s per second).
Peak bandwidth: 2 * memory clock * bus width / 8 from the device attributes,
and a measured device-to-device copy (bytes read + written).

The cuSPARSE baseline (``cupyx.cusparse.spmm``, float32 CSR of the same
indices and weights, column indices sorted within each row, a repeated
connection summed into one entry, since SpMM takes canonical CSR only):
forward ``W @ features.T``, features gradient ``W.T @ backward.T``
(``transa``); both read the dense operand and write the result with no copy
(transposed views are F-contiguous).  The weights gradient is a sampled
dense-dense product (cuSPARSE's SDDMM), which CuPy does not wrap: not
compared.

The dense baseline multiplies features [b, e] by W [e, m] (and, for the
backward, backward @ W.T and features.T @ backward).  When W does not fit
(e * m * 4 bytes; 88 GB at m = 670k, e = 32768) a block of labels is timed
and the time is scaled by m / block ("extrapolated": true in the JSON).
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

# shapes: (num_labels m, fan_in s) pairs.
FULL = dict(batches=[32, 256], num_features=32768,
            shapes=[(670_000, 32), (2_800_000, 96)],
            densities=[1.0, 0.1, 0.01])
QUICK = dict(batches=[32, 128], num_features=4096, shapes=[(20_000, 32)],
             densities=[1.0, 0.01])
DENSE_MAX_LABELS = 131072  # labels per timed dense block

_I64 = ctypes.c_int64
_P = ctypes.c_void_p
# operands (4), batch, num_features, num_labels, fan_in, workspace,
# error_scratch, bad_position, stream
_ARGTYPES = [_P, _P, _P, _P, _I64, _I64, _I64, _I64, _P, _P,
             ctypes.POINTER(_I64), _P]
_GRAD_ARGTYPES = [_P] * 6 + [_I64] * 4 + [_P, _P, ctypes.POINTER(_I64), _P]
# dtype name -> (launcher suffix, bytes, CuPy dtype of the buffers)
DTYPES = {"float32": ("F32", 4, "float32"), "float16": ("F16", 2, "float16"),
          "bfloat16": ("BF16", 2, "uint16")}


def _int_list(text):
    return [int(float(x)) for x in text.split(",") if x]


def _float_list(text):
    return [float(x) for x in text.split(",") if x]


def problem_shapes(preset, num_labels=None, fan_ins=None):
    """The (num_labels, fan_in) pairs to run: the preset's pairs, or every
    pair of ``num_labels`` x ``fan_ins`` when either is given (the other
    then defaults to the values in the preset's pairs)."""
    if num_labels is None and fan_ins is None:
        return [tuple(shape) for shape in preset["shapes"]]
    labels = num_labels or sorted({m for m, _ in preset["shapes"]})
    fans = fan_ins or sorted({s for _, s in preset["shapes"]})
    return [(m, s) for m in labels for s in fans]


def csr_parts(xp, indices, weights):
    """The layer's weights as the parts of a CSR matrix ``[m, e]``.

    Row ``j`` holds label ``j``'s ``s`` connections: ``W[j, indices[j, k]]
    += weights[j, k]``.  Column indices are sorted within each row (what
    cuSPARSE's CSR routines expect); a duplicate connection stays a
    separate entry, which a sparse-dense product sums, as the kernels do.

    Args:
      xp: ``numpy`` or ``cupy``.
      indices: int32 ``[m, s]``, feature ids.
      weights: float32 ``[m, s]``.

    Returns:
      ``(data, column_indices, row_offsets)``: float32 ``[m * s]``, int32
      ``[m * s]``, int32 ``[m + 1]`` (``m * s`` must fit in int32).
    """
    m, s = indices.shape
    if m * s >= 2**31:
        raise ValueError(f"{m} x {s} entries do not fit int32 CSR offsets")
    order = xp.argsort(indices, axis=1)
    cols = xp.take_along_axis(indices, order, axis=1).astype(xp.int32)
    data = xp.take_along_axis(weights, order, axis=1)
    offsets = xp.arange(0, m * s + 1, s, dtype=xp.int32)
    return data.reshape(-1), cols.reshape(-1), offsets


def cusparse_baseline(bench, csr, features, backward):
    """cuSPARSE SpMM times (ms) of the forward product and the features
    gradient on the CSR ``csr`` ``[m, e]``; ``None`` where CuPy has no
    ``cupyx.cusparse.spmm``."""
    try:
        from cupyx import cusparse  # pylint: disable=import-outside-toplevel
    except ImportError:
        return None
    if not (hasattr(cusparse, "spmm") and cusparse.check_availability("spmm")):
        return None
    fwd_ms, _ = bench.time_ms(lambda: cusparse.spmm(csr, features.T))
    gf_ms, _ = bench.time_ms(
        lambda: cusparse.spmm(csr, backward.T, transa=True))
    return {"cusparse_forward_ms": fwd_ms, "cusparse_grad_features_ms": gf_ms}


def parse_args(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--out", default="uniform_sparse_gpu.json",
                        help="JSON results path (default: %(default)s)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny problem sizes (seconds), for smoke tests")
    parser.add_argument("--lib", default=os.environ.get("XMC_CUDA_HARNESS_LIB"),
                        help="prebuilt harness library (default: "
                             "$XMC_CUDA_HARNESS_LIB, else built with "
                             "tools/build_cuda_harness.py --archs native)")
    parser.add_argument("--batches", type=_int_list, default=None,
                        help="comma-separated batch sizes (overrides preset)")
    parser.add_argument("--num-features", type=int, default=None)
    parser.add_argument("--fan-ins", type=_int_list, default=None,
                        help="comma-separated connections per label; with "
                             "--num-labels, every pair is run (default: the "
                             "preset's (m, s) pairs)")
    parser.add_argument("--num-labels", type=_int_list, default=None)
    parser.add_argument("--densities", type=_float_list, default=None,
                        help="fractions of non-zero backward entries")
    parser.add_argument("--seconds-per-case", type=float, default=0.5,
                        help="timing budget per case (default: %(default)s)")
    parser.add_argument("--max-minutes", type=float, default=8.0,
                        help="start no new problem size after this many "
                             "minutes (default: %(default)s); the JSON then "
                             "says truncated")
    parser.add_argument("--no-dense", action="store_true",
                        help="skip the dense cuBLAS baseline")
    parser.add_argument("--no-cusparse", action="store_true",
                        help="skip the cuSPARSE (CSR SpMM) baseline")
    parser.add_argument("--dtypes", default="float32",
                        help="comma-separated value types: float32, float16, "
                             "bfloat16 (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def load_library(path):
    """Loads (building if needed) the harness library; sets argtypes."""
    if not path:
        sys.path.insert(0, os.path.join(ROOT, "tools"))
        import build_cuda_harness  # pylint: disable=import-outside-toplevel
        path = build_cuda_harness.build(
            os.path.join(tempfile.mkdtemp(prefix="xmc_bench_"),
                         "libxmc_uniform_sparse_cuda.so"), archs="native")
    lib = ctypes.CDLL(path)
    for suffix, _, _ in DTYPES.values():
        for op in ("Forward", "GradFeatures", "GradWeights", "Grad"):
            fn = getattr(lib, f"XmcUniformSparse{op}Gpu{suffix}")
            fn.argtypes = _GRAD_ARGTYPES if op == "Grad" else _ARGTYPES
            fn.restype = ctypes.c_int
    lib.XmcUniformSparseGpuWorkspaceBytes.argtypes = [
        ctypes.c_int, ctypes.c_int, _I64, _I64, _I64, _I64]
    lib.XmcUniformSparseGpuWorkspaceBytes.restype = _I64
    return lib, path


class Bench:
    """Timing and device helpers; holds the CuPy module."""

    def __init__(self, cp, seconds_per_case):
        self.cp = cp
        self.seconds = seconds_per_case

    def time_ms(self, fn):
        """Median milliseconds of fn() over adaptive repeats (CUDA events)."""
        cp = self.cp
        t0 = time.perf_counter()
        fn()  # warm-up
        cp.cuda.Device().synchronize()
        first = time.perf_counter() - t0
        repeats = int(min(20, max(3, self.seconds / max(first, 1e-6))))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        times = []
        for _ in range(repeats):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(cp.cuda.get_elapsed_time(start, end))
        times.sort()
        return times[len(times) // 2], repeats

    def device_info(self):
        cp = self.cp
        dev = cp.cuda.Device()
        props = cp.cuda.runtime.getDeviceProperties(dev.id)
        name = props["name"]
        name = name.decode() if isinstance(name, bytes) else name
        clock_khz = props.get("memoryClockRate")
        bus_bits = props.get("memoryBusWidth")
        try:  # removed from cudaDeviceProp in CUDA 13; attributes remain
            clock_khz = clock_khz or cp.cuda.runtime.deviceGetAttribute(
                36, dev.id)  # cudaDevAttrMemoryClockRate
            bus_bits = bus_bits or cp.cuda.runtime.deviceGetAttribute(
                37, dev.id)  # cudaDevAttrGlobalMemoryBusWidth
        except Exception:  # pylint: disable=broad-except
            pass
        peak = (2 * clock_khz * 1e3 * bus_bits / 8 / 1e9
                if clock_khz and bus_bits else None)
        # Measured device-to-device copy: 1 GiB read + 1 GiB written.
        n = (1 << 30) // 4
        a = cp.ones(n, cp.float32)
        b = cp.empty_like(a)
        ms, _ = self.time_ms(lambda: b.__setitem__(Ellipsis, a))
        copy_gbs = 2 * n * 4 / (ms * 1e-3) / 1e9
        del a, b
        cp.get_default_memory_pool().free_all_blocks()
        return {
            "name": name,
            "compute_capability": dev.compute_capability,
            "multiprocessors": props.get("multiProcessorCount"),
            "l2_bytes": props.get("l2CacheSize"),
            "memory_bytes": props.get("totalGlobalMem"),
            "peak_bandwidth_gbs": peak,
            "copy_bandwidth_gbs": copy_gbs,
            "cupy": cp.__version__,
            "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
            "tf32": os.environ.get("CUPY_TF32", "0"),
        }

    def free_bytes(self):
        self.cp.get_default_memory_pool().free_all_blocks()
        return self.cp.cuda.runtime.memGetInfo()[0]


def call(fn, *args):
    """Calls a launcher with (operands..., dims..., workspace, scratch);
    raises on a CUDA error or an index error."""
    bad = _I64(-1)
    err = fn(*args, ctypes.byref(bad), 0)
    if err != 0:
        raise RuntimeError(f"CUDA error {err}")
    if bad.value != -1:
        raise RuntimeError(f"index check failed at {bad.value}")


def to_storage(cp, a, dtype):
    """float32 CuPy array -> the launcher's storage of `dtype` (float16, or
    bfloat16 as uint16 bits rounded to nearest even)."""
    if dtype == "float16":
        return a.astype(cp.float16)
    u = a.view(cp.uint32).astype(cp.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(cp.uint16)


def fill_backward(cp, out, density, rng_rows=None):
    """Fills out [b, m] with N(0, 1) values, a `density` fraction non-zero."""
    b, m = out.shape
    rows = max(1, min(b, rng_rows or (64 << 20) // max(m, 1)))
    for r0 in range(0, b, rows):
        r1 = min(b, r0 + rows)
        vals = cp.random.standard_normal((r1 - r0, m), dtype=cp.float32)
        if density < 1.0:
            keep = cp.random.random((r1 - r0, m), dtype=cp.float32) < density
            vals = cp.where(keep, vals, cp.float32(0))
        out[r0:r1] = vals
        del vals


def dense_baseline(bench, b, e, m, free):
    """Dense fp32 cuBLAS layer of m labels: forward and backward ms."""
    cp = bench.cp
    per_label = (e + 2 * b) * 4  # W column + scores column + backward column
    block = min(m, DENSE_MAX_LABELS, int(0.4 * free) // per_label)
    if block < min(m, 1024):
        return None
    feats = cp.random.standard_normal((b, e), dtype=cp.float32)
    w = cp.random.standard_normal((e, block), dtype=cp.float32)
    back = cp.random.standard_normal((b, block), dtype=cp.float32)
    fwd_ms, _ = bench.time_ms(lambda: cp.matmul(feats, w))
    bwd_ms, _ = bench.time_ms(
        lambda: (cp.matmul(back, w.T), cp.matmul(feats.T, back)))
    scale = m / block
    del feats, w, back
    cp.get_default_memory_pool().free_all_blocks()
    return {"dense_labels_timed": block, "extrapolated": block < m,
            "dense_forward_ms": fwd_ms * scale,
            "dense_backward_ms": bwd_ms * scale}


def run(args):
    import cupy as cp  # pylint: disable=import-outside-toplevel
    import cupyx.scipy.sparse  # pylint: disable=import-outside-toplevel

    preset = dict(QUICK if args.quick else FULL)
    for key in ("batches", "num_features", "densities"):
        if getattr(args, key) is not None:
            preset[key] = getattr(args, key)
    preset["shapes"] = problem_shapes(preset, args.num_labels, args.fan_ins)
    bench = Bench(cp, args.seconds_per_case)
    lib, lib_path = load_library(args.lib)
    info = bench.device_info()
    peak = info["peak_bandwidth_gbs"] or info["copy_bandwidth_gbs"]
    print(f"# {info['name']}: peak {info['peak_bandwidth_gbs']} GB/s "
          f"(attributes), copy {info['copy_bandwidth_gbs']:.0f} GB/s "
          f"(measured); library {lib_path}", flush=True)
    cp.random.seed(args.seed)
    e = preset["num_features"]
    rows = []
    truncated = []  # problem sizes skipped for --max-minutes
    t_start = time.time()
    header = (f"{'m':>8} {'s':>3} {'b':>5} {'type':<8} {'kernel':<13} "
              f"{'dens':>5} "
              f"{'ms':>9} {'GB/s':>7} {'%peak':>6} {'rate':>14} "
              f"{'cuSPARSE ms':>11} {'x cuSP':>7} "
              f"{'dense ms':>10} {'x dense':>8}")
    print(header, flush=True)

    def report(row):
        rows.append(row)
        dense = row.get("dense_ms")
        if "ggathers_per_s" in row:
            rate = "%.1f Ggath/s" % row["ggathers_per_s"]
        elif "gatomics_per_s" in row:
            rate = "%.1f Gatom/s" % row["gatomics_per_s"]
        else:
            rate = ""
        gbs = "%7.0f %5.0f%%" % (row["gbs"], 100 * row["gbs"] / peak) \
            if "gbs" in row else " " * 14
        dense_txt = "" if dense is None else "%.2f" % dense
        ratio = "" if dense is None else "%.1f" % (dense / row["ms"])
        cus = row.get("cusparse_ms")
        cus_txt = "" if cus is None else "%.3f" % cus
        cus_ratio = "" if cus is None else "%.2f" % (cus / row["ms"])
        print(f"{row['num_labels']:>8} {row['fan_in']:>3} {row['batch']:>5} "
              f"{row['dtype']:<8} {row['kernel']:<13} "
              f"{str(row.get('density', '')):>5} "
              f"{row['ms']:>9.3f} {gbs} {rate:>14} {cus_txt:>11} "
              f"{cus_ratio:>7} {dense_txt:>10} {ratio:>8}", flush=True)

    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    for name in dtypes:
        if name not in DTYPES:
            raise SystemExit(f"--dtypes: unknown value type {name!r}")
    partial = dict(device=info, library=lib_path, rows=rows)

    def save():  # after every problem size, so a killed run keeps its rows
        if args.out:
            with open(args.out, "w") as f:
                json.dump(dict(partial, truncated=truncated, partial=True), f,
                          indent=1, default=str)

    for m, s in preset["shapes"]:
        if time.time() - t_start > 60 * args.max_minutes:
            truncated.append(dict(num_labels=m, fan_in=s))
            continue
        # indices, weights, grad_weights (+ the CSR copy and the
        # argsort's int64 order while it is built)
        need_static = m * s * (12 if args.no_cusparse else 28)
        if bench.free_bytes() < need_static * 1.2:
            print(f"# skip m={m} s={s}: not enough GPU memory", flush=True)
            continue
        indices = cp.random.randint(0, e, size=(m, s), dtype=cp.int32)
        weights32 = cp.random.standard_normal((m, s), dtype=cp.float32)
        scratch = cp.empty(1, cp.int64)
        csr = None
        if not args.no_cusparse:
            csr = cupyx.scipy.sparse.csr_matrix(
                csr_parts(cp, indices, weights32), shape=(m, e))
            # SpMM takes a canonical CSR only: a repeated connection
            # becomes one entry holding the sum (the same product).
            csr.sum_duplicates()
            cp.get_default_memory_pool().free_all_blocks()
        for b in preset["batches"]:
            if time.time() - t_start > 60 * args.max_minutes:
                truncated.append(dict(num_labels=m, fan_in=s, batch=b))
                continue
            need = b * m * 4 + 4 * b * e * 4
            if bench.free_bytes() < need * 1.2:
                print(f"# skip m={m} s={s} b={b}: not enough GPU memory",
                      flush=True)
                continue
            dense = (None if args.no_dense else
                     dense_baseline(bench, b, e, m, bench.free_bytes()))
            features32 = cp.random.standard_normal((b, e), dtype=cp.float32)
            big32 = cp.empty((b, m), cp.float32)  # scores, then backward
            cus = None
            if csr is not None:  # values of big32 do not matter to SpMM
                cus = cusparse_baseline(bench, csr, features32, big32)
                cp.get_default_memory_pool().free_all_blocks()
            for dtype in dtypes:
                suffix, vbytes, storage = DTYPES[dtype]
                fn = {op: getattr(lib, f"XmcUniformSparse{op}Gpu{suffix}")
                      for op in ("Forward", "GradFeatures", "GradWeights",
                                 "Grad")}
                as_t = (lambda a: a) if dtype == "float32" else (
                    lambda a, dt=dtype: to_storage(cp, a, dt))
                features, weights = as_t(features32), as_t(weights32)
                big = cp.empty((b, m), storage)
                grad_f = cp.empty((b, e), storage)
                grad_w = cp.empty((m, s), storage)
                ws_bytes = max(lib.XmcUniformSparseGpuWorkspaceBytes(
                    kind, vbytes, b, e, m, s) for kind in range(4))
                workspace = cp.empty(max(ws_bytes, 1), cp.uint8)
                dims = (b, e, m, s)
                ws, sc = workspace.data.ptr, scratch.data.ptr
                base = dict(num_labels=m, fan_in=s, batch=b, num_features=e,
                            dtype=dtype, workspace_bytes=ws_bytes)

                ms, reps = bench.time_ms(lambda: call(
                    fn["Forward"], features.data.ptr, indices.data.ptr,
                    weights.data.ptr, big.data.ptr, *dims, ws, sc))
                nbytes = (4 + vbytes) * m * s + vbytes * (b * e + b * m)
                report(dict(base, kernel="forward", ms=ms, repeats=reps,
                            bytes=nbytes, gbs=nbytes / ms / 1e6,
                            ggathers_per_s=b * m * s / ms / 1e6,
                            cusparse_ms=(cus and dtype == "float32" and
                                         cus["cusparse_forward_ms"]) or None,
                            dense_ms=dense and dense["dense_forward_ms"],
                            dense=dense))
                for density in preset["densities"]:
                    fill_backward(cp, big32, density)
                    big[...] = as_t(big32)
                    nnz = int(cp.count_nonzero(big32))
                    active = int(cp.count_nonzero(cp.any(big32 != 0, axis=0)))
                    ms, reps = bench.time_ms(lambda: call(
                        fn["GradFeatures"], big.data.ptr, indices.data.ptr,
                        weights.data.ptr, grad_f.data.ptr, *dims, ws, sc))
                    nbytes = (vbytes * b * m + 4 * m * s + vbytes * active * s
                              + vbytes * b * e)
                    report(dict(base, kernel="grad_features", density=density,
                                nnz=nnz, active_labels=active, ms=ms,
                                repeats=reps, bytes=nbytes,
                                gbs=nbytes / ms / 1e6,
                                gatomics_per_s=nnz * s / ms / 1e6,
                                cusparse_ms=(cus and dtype == "float32" and
                                             cus["cusparse_grad_features_ms"])
                                or None))
                    gf_ms = ms
                    ms, reps = bench.time_ms(lambda: call(
                        fn["GradWeights"], big.data.ptr, features.data.ptr,
                        indices.data.ptr, grad_w.data.ptr, *dims, ws, sc))
                    nbytes = vbytes * b * m + (4 + vbytes) * m * s + \
                        vbytes * b * e
                    report(dict(base, kernel="grad_weights", density=density,
                                nnz=nnz, ms=ms, repeats=reps, bytes=nbytes,
                                gbs=nbytes / ms / 1e6,
                                ggathers_per_s=nnz * s / ms / 1e6))
                    report(dict(base, kernel="backward", density=density,
                                ms=gf_ms + ms,
                                dense_ms=dense and dense["dense_backward_ms"]))
                    ms, reps = bench.time_ms(lambda: call(
                        fn["Grad"], big.data.ptr, features.data.ptr,
                        indices.data.ptr, weights.data.ptr, grad_f.data.ptr,
                        grad_w.data.ptr, *dims, ws, sc))
                    report(dict(base, kernel="grad_fused", density=density,
                                ms=ms, repeats=reps,
                                dense_ms=dense and dense["dense_backward_ms"]))
                del features, weights, big, grad_f, grad_w, workspace
                cp.get_default_memory_pool().free_all_blocks()
            del features32, big32
            cp.get_default_memory_pool().free_all_blocks()
            save()
        del indices, weights32, scratch, csr
        cp.get_default_memory_pool().free_all_blocks()
    return {"device": info, "library": lib_path, "preset": preset,
            "quick": args.quick, "python": platform.python_version(),
            "bytes_model": __doc__[__doc__.index("Bytes model"):
                                   __doc__.index("The table also")].strip(),
            "note": "kernel 'backward' = grad_features + grad_weights (separate "
                    "launchers), 'grad_fused' = both from one launcher; "
                    "compared with the dense backward (both gradients); "
                    "x dense = dense_ms / ms; x cuSP = cusparse_ms / ms "
                    "(cuSPARSE CSR SpMM on the same matrix; forward and "
                    "grad_features only)",
            "truncated": truncated, "rows": rows}


def main(argv=None):
    args = parse_args(argv)
    start = time.time()
    results = run(args)
    results["wall_seconds"] = time.time() - start
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1, default=str)
    if results["truncated"]:
        print(f"# --max-minutes reached; not run: {results['truncated']}")
    print(f"# wrote {args.out} ({results['wall_seconds']:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
