"""Benchmark of the uniform-sparse output-layer op against TensorFlow baselines.

What it measures
----------------
``xmc_tf.ops.uniform_sparse_matmul(features [b, e], indices [m, s],
weights [m, s]) -> scores [b, m]`` (Schultheis & Babbar, Sec. 3) against the
same layer stored as

* ``tf.sparse``: a ``tf.SparseTensor`` of shape ``[m, e]`` (label-major COO,
  int64 indices) used as ``transpose(sparse_dense_matmul(W, features,
  adjoint_b=True))``.  This is the faster orientation on CPU: the ``[e, m]``
  tensor with ``sparse_dense_matmul(features, W)`` was about 2x slower in the
  forward pass and 1.2x slower in the backward pass (b=256, e=512, m=100k).
* ``dense``: ``tf.matmul(features, W)`` with a dense ``[e, m]`` matrix; skipped
  when the matrix would exceed 4 GiB.

Cases: b=256, s=32 (non-zeros per label), e in {512, 32768}, m in {10k, 100k,
670k}.  Each label gets s distinct random feature indices.

For every case and representation the time of

* ``fwd``: the scores;
* ``bwd 100%``, ``bwd 10%``, ``bwd 1%``: the gradients w.r.t. the features and
  the weights (the sparse values for tf.sparse, the matrix for dense) given an
  upstream gradient with that fraction of non-zero entries at random
  positions, obtained with ``tf.GradientTape``.  None of the three gradients
  reads the forward output, so TensorFlow prunes the forward op from these
  functions: the time is the backward pass alone;
* ``f+b 100%``, ``f+b 1%``: the scores and both gradients in one call.

Every timed call is a ``tf.function`` (``jit_compile=False``) called once for
warm-up (tracing; once per function, the three upstream gradients share it)
and then ``--repeats`` times (fewer when the calls exceed
``--budget-s``); the median is reported.  Each call returns its outputs plus a
scalar read with ``.numpy()``, which forces completion.  The tf.sparse
backward is skipped when the gathers in TensorFlow's gradient of
``sparse_dense_matmul`` (two ``[nnz, b]`` float32 tensors) would exceed 8 GiB,
and a tf.sparse measurement is skipped when it is predicted (from the m=100k
case) to take more than 60 s per call.

Columns
-------
``B/nz``: bytes per structural non-zero (ours: int32 index + float32 weight =
8; COO: two int64 indices + float32 value = 20; dense: 4*e/s, the dense matrix
bytes divided by the m*s structural non-zeros).  ``MiB``: memory of the layer
parameters in that representation.  Times in milliseconds.  The speed-up table
divides a baseline's time by ours.

Ours against the memory-traffic bound: for every case and metric the bytes
our kernels must move at least, divided by the machine's bandwidth
(``benchmarks/roofline.py`` ``machine_peaks``: the best of a memcpy, a sum
and an ``a += b`` over 256 MiB, in C++, 1 thread and all; measured at the
start of the run).  Bytes (float32, int32 indices, ``m_nz`` = labels whose
upstream column has a non-zero, measured on the gradients used):

* ``fwd``: ``8 m s`` (indices, weights) ``+ 4 m s`` (the index check)
  ``+ 4 b e`` (features) ``+ 4 b m`` (scores);
* ``bwd`` (both gradients, one pass: ``Xmc>UniformSparseMatmulGrad``, the
  registered gradient): ``4 b m`` (the upstream gradient) ``+ 4 m s``
  (the index check) ``+ 8 m_nz s`` (the connections of labels with signal)
  ``+ 8 b e`` (features, grad_features) ``+ 4 m s`` (grad_weights);
* ``f+b``: the sum.

The table gives ours' time, the bound and their ratio (1 = at the bound).

The targets checked at the end: (1) forward+backward (1% and 100%) at least
20x faster than tf.sparse at m=100k, (2) ours' backward with 1% non-zero
upstream gradient at most 1/5 of that with 100%, (3) 8 bytes per structural
non-zero.

How to run
----------
Build the op library (or ``pip install .``), then::

    XMC_TF_LIBRARY_PATH=/tmp/xmc_us/_xmc_ops.so PYTHONPATH=. \\
        python benchmarks/uniform_sparse_op.py --sizes small --out /tmp/us.json

``--sizes small`` runs only the smallest case (about 10 s on a quiet 2-core
CPU, most of it the tf.sparse baseline); ``--sizes full`` all six (15-30
min).  Timings on a shared machine vary by up to 2x between
repeats: compare medians, and check the load average printed in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np
import tensorflow as tf

import xmc_tf
from xmc_tf.ops import _loader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import roofline  # noqa: E402  (benchmarks/)
from xmc_tf.layers import random_connections

BATCH = 256
FAN_IN = 32
FEATURES = (512, 32768)
LABELS = (10_000, 100_000, 670_000)
DENSITIES = (1.0, 0.1, 0.01)
DENSE_LIMIT_BYTES = 4 * 2**30
SPARSE_GRAD_LIMIT_BYTES = 8 * 2**30
SLOW_CALL_S = 60.0
METHODS = ("ours", "tf.sparse", "dense")
METRICS = ("fwd", "bwd 100%", "bwd 10%", "bwd 1%", "f+b 100%", "f+b 1%")


# ---------------------------------------------------------------------------
# Data.

def make_indices(rng, m, e, s):
    """[m, s] int32, each row s distinct sorted values in [0, e)."""
    return random_connections(m, s, e, rng)


def labels_with_signal(grads):
    """{density: number of label columns with a non-zero entry}."""
    return {d: int(tf.reduce_sum(tf.cast(tf.reduce_any(g != 0, axis=0),
                                         tf.int32)))
            for d, g in grads.items()}


def traffic_bytes(b, e, m, s, m_nz):
    """Least bytes ours moves per metric (see the module docstring);
    ``m_nz`` maps density -> labels with signal."""
    fwd = 8 * m * s + 4 * m * s + 4 * b * e + 4 * b * m
    out = {"fwd": fwd}
    for d, nz in m_nz.items():
        bwd = 4 * b * m + 4 * m * s + 8 * nz * s + 8 * b * e + 4 * m * s
        out[f"bwd {d:.0%}"] = bwd
        out[f"f+b {d:.0%}"] = fwd + bwd
    return out


def upstream_gradients(b, m, seed):
    """Upstream gradients [b, m] with 100%, 10% and 1% non-zeros."""
    full = tf.random.stateless_normal([b, m], seed=[seed, 1])
    u = tf.random.stateless_uniform([b, m], seed=[seed, 2])
    out = {}
    for d in DENSITIES:
        out[d] = full if d == 1.0 else tf.where(u < d, full, 0.0)
    return out


# ---------------------------------------------------------------------------
# The three layer representations.  Each provides forward(features, params)
# -> scores [b, m]; `params` is the trainable tensor (weights, sparse values
# or the dense matrix), the structure is captured.

def ours_forward(indices):
    def forward(x, w):
        return xmc_tf.ops.uniform_sparse_matmul(x, indices, w)
    return forward


def sparse_forward(coo_indices, shape):
    def forward(x, values):
        w = tf.SparseTensor(coo_indices, values, shape)
        return tf.transpose(tf.sparse.sparse_dense_matmul(w, x, adjoint_b=True))
    return forward


def dense_forward():
    def forward(x, w):
        return tf.matmul(x, w)
    return forward


def checksum(tensors):
    """A scalar read from every output, so .numpy() waits for all of them."""
    return tf.add_n([tf.reshape(t, [-1])[0] for t in tensors])


def make_functions(forward):
    """tf.functions: fwd(x, p), bwd(x, p, g), fwdbwd(x, p, g)."""

    @tf.function(jit_compile=False)
    def fwd(x, p):
        y = forward(x, p)
        return y, checksum([y])

    @tf.function(jit_compile=False)
    def bwd(x, p, g):
        with tf.GradientTape() as tape:
            tape.watch([x, p])
            y = forward(x, p)
        gx, gp = tape.gradient(y, [x, p], output_gradients=g)
        return gx, gp, checksum([gx, gp])

    @tf.function(jit_compile=False)
    def fwdbwd(x, p, g):
        with tf.GradientTape() as tape:
            tape.watch([x, p])
            y = forward(x, p)
        gx, gp = tape.gradient(y, [x, p], output_gradients=g)
        return y, gx, gp, checksum([y, gx, gp])

    return fwd, bwd, fwdbwd


def time_call(fn, args, repeats, budget_s, warm_up=True):
    """Seconds per call: a warm-up call, then up to `repeats` timed calls."""
    if warm_up:
        fn(*args)[-1].numpy()
    samples = []
    while len(samples) < repeats:
        start = time.perf_counter()
        out = fn(*args)
        out[-1].numpy()
        samples.append(time.perf_counter() - start)
        del out
        if sum(samples) > budget_s:
            break
    return samples


# ---------------------------------------------------------------------------
# One case.

def layer_memory(e, m, s):
    nnz = m * s
    return {
        "ours": {"bytes": nnz * (4 + 4), "bytes_per_nz": 8.0},
        "tf.sparse": {"bytes": nnz * (2 * 8 + 4), "bytes_per_nz": 20.0},
        "dense": {"bytes": e * m * 4, "bytes_per_nz": 4.0 * e / s},
    }


def run_method(forward, x, p, grads, repeats, budget_s, skip=None):
    """Timings of one representation; `skip` maps metric -> reason."""
    skip = skip or {}
    fwd, bwd, fwdbwd = make_functions(forward)
    plan = [("fwd", fwd, (x, p))]
    plan += [(f"bwd {d:.0%}", bwd, (x, p, grads[d])) for d in DENSITIES]
    plan += [(f"f+b {d:.0%}", fwdbwd, (x, p, grads[d])) for d in (1.0, 0.01)]
    result, traced = {}, set()
    for metric, fn, args in plan:
        if metric in skip:
            result[metric] = {"skipped": skip[metric]}
            continue
        # One warm-up per function: the upstream gradients share a trace.
        samples = time_call(fn, args, repeats, budget_s, fn not in traced)
        traced.add(fn)
        result[metric] = {"median_s": statistics.median(samples),
                          "samples_s": samples}
        print(f"    {metric:9s} {1e3 * result[metric]['median_s']:10.1f} ms "
              f"({len(samples)} runs)", flush=True)
    return result


def sparse_skips(e, m, previous):
    """Reasons to skip tf.sparse measurements of case (e, m), if any."""
    skips = {}
    gather_bytes = 2 * m * FAN_IN * BATCH * 4
    if gather_bytes > SPARSE_GRAD_LIMIT_BYTES:
        reason = (f"gradient gathers need {gather_bytes / 2**30:.0f} GiB")
        for metric in METRICS[1:]:
            skips[metric] = reason
    # Predict from the largest measured m with the same e (time ~ m).
    if previous is not None:
        prev_m, prev_timings = previous
        for metric in METRICS:
            t = prev_timings.get(metric, {}).get("median_s")
            if metric not in skips and t is not None:
                predicted = t * m / prev_m
                if predicted > SLOW_CALL_S:
                    skips[metric] = f"predicted {predicted:.0f} s per call"
    return skips


def run_case(e, m, repeats, budget_s, seed, sparse_previous):
    print(f"\ncase b={BATCH} e={e} s={FAN_IN} m={m}", flush=True)
    rng = np.random.default_rng(seed)
    x = tf.constant(rng.standard_normal((BATCH, e), dtype=np.float32))
    indices_np = make_indices(rng, m, e, FAN_IN)
    weights_np = (rng.standard_normal((m, FAN_IN))
                  / np.sqrt(FAN_IN)).astype(np.float32)
    grads = upstream_gradients(BATCH, m, seed)
    memory = layer_memory(e, m, FAN_IN)
    m_nz = labels_with_signal(grads)
    timings = {}

    print("  ours", flush=True)
    indices = tf.constant(indices_np)
    weights = tf.constant(weights_np)
    measured = (indices.dtype.size * int(tf.size(indices))
                + weights.dtype.size * int(tf.size(weights))) / (m * FAN_IN)
    memory["ours"]["measured_bytes_per_nz"] = measured
    timings["ours"] = run_method(ours_forward(indices), x, weights, grads,
                                 repeats, budget_s)
    del indices, weights

    print("  tf.sparse ([m, e] COO, int64 indices)", flush=True)
    rows = np.repeat(np.arange(m, dtype=np.int64), FAN_IN)
    coo = tf.constant(np.stack([rows, indices_np.ravel().astype(np.int64)], 1))
    del rows
    values = tf.constant(weights_np.ravel())
    skips = sparse_skips(e, m, sparse_previous)
    for metric, reason in skips.items():
        print(f"    {metric:9s} skipped ({reason})", flush=True)
    timings["tf.sparse"] = run_method(
        sparse_forward(coo, [m, e]), x, values, grads, repeats, budget_s,
        skips)
    del coo, values

    print("  dense tf.matmul ([e, m])", flush=True)
    dense_bytes = memory["dense"]["bytes"]
    if dense_bytes > DENSE_LIMIT_BYTES:
        reason = f"{dense_bytes / 2**30:.1f} GiB"
        print(f"    skipped ({reason})", flush=True)
        timings["dense"] = {"skipped": reason}
    else:
        dense = np.zeros((e, m), np.float32)
        dense[indices_np, np.arange(m)[:, None]] = weights_np
        dense = tf.constant(dense)
        timings["dense"] = run_method(dense_forward(), x, dense, grads,
                                      repeats, budget_s)
        del dense
    del grads
    return {"b": BATCH, "e": e, "s": FAN_IN, "m": m,
            "labels_with_signal": {f"{d:.0%}": n for d, n in m_nz.items()},
            "traffic_bytes": traffic_bytes(BATCH, e, m, FAN_IN, m_nz),
            "memory": memory, "timings": timings}


# ---------------------------------------------------------------------------
# Report.

def median(case, method, metric):
    entry = case["timings"][method]
    if "skipped" in entry:
        return None
    return entry[metric].get("median_s")


def fmt_ms(seconds):
    if seconds is None:
        return "skip"
    ms = 1e3 * seconds
    return f"{ms:.2f}" if ms < 10 else f"{ms:.1f}" if ms < 1000 else f"{ms:.0f}"


def print_tables(cases):
    head = (f"{'e':>6} {'m':>8} {'method':<10} {'B/nz':>6} {'MiB':>9} "
            + " ".join(f"{name:>9}" for name in METRICS))
    print("\nTimes (ms, median)\n" + head + "\n" + "-" * len(head))
    notes = {}  # (method, e, m, reason) -> skipped metrics
    for case in cases:
        for method in METHODS:
            mem = case["memory"][method]
            row = (f"{case['e']:>6} {case['m']:>8} {method:<10} "
                   f"{mem['bytes_per_nz']:>6g} {mem['bytes'] / 2**20:>9.1f} ")
            entry = case["timings"][method]
            if "skipped" in entry:
                row += f"skipped ({entry['skipped']})"
            else:
                row += " ".join(f"{fmt_ms(median(case, method, k)):>9}"
                                for k in METRICS)
                for k in METRICS:
                    if "skipped" in entry[k]:
                        key = (method, case["e"], case["m"],
                               entry[k]["skipped"])
                        notes.setdefault(key, []).append(k)
            print(row)
    for (method, e, m, reason), metrics in notes.items():
        print(f"  skip: {method} e={e} m={m} {', '.join(metrics)}: {reason}")

    head = (f"{'e':>6} {'m':>8} {'baseline':<10} "
            + " ".join(f"{name:>9}" for name in METRICS))
    print("\nSpeed-up of ours (baseline time / our time)\n" + head + "\n"
          + "-" * len(head))
    for case in cases:
        for method in METHODS[1:]:
            cells = []
            for k in METRICS:
                ours, base = median(case, "ours", k), median(case, method, k)
                cells.append("-" if ours is None or base is None
                             else f"{base / ours:.1f}x")
            print(f"{case['e']:>6} {case['m']:>8} {method:<10} "
                  + " ".join(f"{c:>9}" for c in cells))


def print_bound_table(cases, bandwidth_gbs):
    """Ours' time beside the memory-traffic bound of each case."""
    head = (f"{'e':>6} {'m':>8} {'':<8} "
            + " ".join(f"{name:>9}" for name in METRICS))
    print(f"\nOurs against the memory-traffic bound (bandwidth "
          f"{bandwidth_gbs:.1f} GB/s)\n" + head + "\n" + "-" * len(head))
    for case in cases:
        bound = {k: case["traffic_bytes"][k] / (bandwidth_gbs * 1e9)
                 for k in METRICS}
        ours = {k: median(case, "ours", k) for k in METRICS}
        case["bound_s"] = bound
        for label, cells in (
                ("ours ms", [fmt_ms(ours[k]) for k in METRICS]),
                ("bound ms", [fmt_ms(bound[k]) for k in METRICS]),
                ("x bound", [f"{ours[k] / bound[k]:.1f}" if ours[k] else "-"
                             for k in METRICS])):
            print(f"{case['e']:>6} {case['m']:>8} {label:<8} "
                  + " ".join(f"{c:>9}" for c in cells))


def check_targets(cases):
    targets = []
    # (1) forward+backward vs tf.sparse at m=100k.
    details, met = [], True
    at_100k = [c for c in cases if c["m"] == 100_000]
    for case in at_100k:
        for k in ("f+b 1%", "f+b 100%"):
            ours, base = median(case, "ours", k), median(case, "tf.sparse", k)
            if ours is None or base is None:
                met = False
                details.append(f"e={case['e']} {k}: not measured")
                continue
            details.append(f"e={case['e']} {k}: {base / ours:.1f}x")
            met &= base / ours >= 20.0
    targets.append({
        "target": "forward+backward (1% and 100%) >= 20x faster than "
                  "tf.sparse at m=100k",
        "met": met if at_100k else None, "details": details})
    # (2) backward at 1% <= 1/5 of backward at 100%.
    details, met = [], True
    for case in cases:
        ratio = median(case, "ours", "bwd 1%") / median(case, "ours",
                                                        "bwd 100%")
        details.append(f"e={case['e']} m={case['m']}: {ratio:.3f}")
        met &= ratio <= 0.2
    targets.append({"target": "backward at 1% non-zero <= 1/5 of backward "
                              "at 100%", "met": met, "details": details})
    # (3) memory per structural non-zero.
    measured = {c["memory"]["ours"]["measured_bytes_per_nz"] for c in cases}
    targets.append({"target": "8 bytes per structural non-zero",
                    "met": measured == {8.0},
                    "details": [f"measured {sorted(measured)} B"]})

    print("\nTargets")
    for t in targets:
        status = {True: "MET", False: "NOT MET",
                  None: "n/a (needs --sizes target or full)"}[t["met"]]
        print(f"  [{status}] {t['target']}: " + "; ".join(t["details"]))
    return targets


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes",
                        choices=("small", "issue43", "target", "full"),
                        default="small",
                        help="small: b=256 e=512 m=10k only; issue43: "
                             "e=512 m=100k only; target: the "
                             "m=100k cases the speed-up target is defined on; "
                             "full: all cases")
    parser.add_argument("--repeats", type=int, default=None,
                        help="timed calls per measurement after warm-up "
                             "(default 3 for small, 5 for full)")
    parser.add_argument("--budget-s", type=float, default=30.0,
                        help="stop repeating a measurement after this many "
                             "seconds (at least one timed call)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write results as JSON")
    args = parser.parse_args(argv)
    if args.repeats is None:
        args.repeats = 3 if args.sizes == "small" else 5

    if args.sizes == "small":
        grid = [(FEATURES[0], LABELS[0])]
    elif args.sizes == "issue43":
        grid = [(FEATURES[0], 100_000)]
    elif args.sizes == "target":
        grid = [(e, 100_000) for e in FEATURES]
    else:
        grid = [(e, m) for e in FEATURES for m in LABELS]
    print(f"TensorFlow {tf.__version__}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}, "
          f"library {_loader.library_path()}")
    peaks = roofline.machine_peaks(copy_mib=256, repeats=3)["all"]
    print(f"bandwidth {peaks['bandwidth_gbs']:.1f} GB/s (best of copy, read, "
          f"add; benchmarks/roofline.py)")
    started = time.perf_counter()
    cases, sparse_previous = [], {}
    for e, m in grid:
        case = run_case(e, m, args.repeats, args.budget_s, args.seed,
                        sparse_previous.get(e))
        cases.append(case)
        if "skipped" not in case["timings"]["tf.sparse"]:
            sparse_previous[e] = (m, case["timings"]["tf.sparse"])
    print_tables(cases)
    print_bound_table(cases, peaks["bandwidth_gbs"])
    targets = check_targets(cases)
    total = time.perf_counter() - started
    print(f"\ntotal {total:.1f} s")

    if args.out:
        report = {
            "benchmark": "uniform_sparse_op",
            "tensorflow": tf.__version__,
            "cpus": os.cpu_count(),
            "load_average_at_end": os.getloadavg()[0],
            "machine": platform.processor() or platform.machine(),
            "args": vars(args),
            "sparse_orientation": "[m, e] COO, transpose(sparse_dense_matmul("
                                  "W, features, adjoint_b=True))",
            "machine_peaks": peaks,
            "cases": cases,
            "targets": targets,
            "total_s": total,
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(main())
