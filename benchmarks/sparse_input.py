"""Benchmark of the sparse-input encoder: Dense + Adam vs SparseEmbeddingBag + LazyAdam.

What it measures (part 1: the encoder alone)
--------------------------------------------
The time of one training step of the first layer of an XMC network on a
sparse TF-IDF-like batch ``x`` (``tf.SparseTensor [batch, D]``, exactly
``--nnz`` distinct features per row, values uniform in (0, 1)): forward
``y = layer(x)`` (``[batch, d]``), the loss ``sum(y * u)`` with a fixed random
``u``, the gradient of the layer's weights and the optimizer update, all in
one ``tf.function`` (``jit_compile=False``).  Methods:

* ``dense+adam``: ``keras.layers.Dense(d)`` + ``keras.optimizers.Adam`` (what
  ``xmc-tf train`` does today).  Keras 3.15 computes Dense on a rank-2
  SparseTensor with ``tf.nn.embedding_lookup_sparse`` (IndexedSlices kernel
  gradient), and Adam densifies that gradient and updates all ``D x d``
  weights and both moments.
* ``dense+lazyadam``: the same layer with :class:`xmc_tf.optimizers.LazyAdam`:
  row-sparse update, but Dense reads the whole kernel every step, which
  TensorFlow copies once the variable has been updated by a scatter
  (copy-on-read mode).
* ``bag+lazyadam``: :class:`xmc_tf.layers.SparseEmbeddingBag` +
  ``LazyAdam``: reads, differentiates and updates only the rows of the
  features in the batch.
* ``bag+lazyadam-unfused``: the same with ``LazyAdam(fused=False)``: the
  row update as ``ResourceGather`` / element-wise ops / ``scatter`` instead
  of the fused ``Xmc>ResourceSparseApplyAdam`` pass.
* ``bag+adam`` (not run by default): the new layer with Keras' Adam.

Feature draws (``--dists``): ``uniform`` over ``[0, D)``, or ``zipf``: feature
``perm[r]`` with probability proportional to ``1 / (r + 1)^a``
(``--zipf-exponent``, default 1.0; a random permutation ``perm`` spreads
the frequent features over the table), a stand-in for word frequencies.  Each
row's ``--nnz`` features are distinct; the column ``uniq`` is the mean number
of distinct features per batch, which bounds the rows the lazy update touches.

Every (method, D, dist) case runs in a fresh Python process, so ``peak RSS``
(``resource.getrusage(RUSAGE_SELF).ru_maxrss`` of that process, including
TensorFlow's ~0.5 GB) is the case's own peak.  Per case: ``--batches``
different batches are generated up front and cycled; 2 warm-up steps
(tracing, and the first scatter that switches the table to copy-on-read),
then up to ``--repeats`` timed steps (fewer past ``--budget-s``); the median
and the minimum are reported.  Each step returns the loss, read with
``.numpy()``, which waits for the update (it is a control dependency).

Target (issue 10): ``bag+lazyadam`` step time at D = 500k at most 1.3x its
time at D = 50k (same d, batch, nnz and distribution).

Measured (development machine, 2 shared CPU cores, load average 4-7 while
it ran, so upper bounds; d = 512, batch 256, nnz 100; median ms per step,
``uniq`` = distinct features per batch)::

    D        dist     uniq   dense+adam  dense+lazyadam  bag+lazyadam
    50000    uniform  20078    2136          1709          1040 / 825
    50000    zipf      9935    1808           820           477 / 369
    500000   uniform  24958   11359          1923           559 / 1056
    500000   zipf     13670   12073          3175           382 / 325

(``bag+lazyadam``: full run / a second run of that method alone.)  Peak RSS
at D = 500k: 5.5 GB (dense+adam), 4.7 GB (dense+lazyadam), 3.7 GB
(bag+lazyadam: table and two moments, 1 GB each, plus TensorFlow).  Scaling
of bag+lazyadam from 50k to 500k features: 1.28 (uniform, second run; the
distinct rows per batch alone grow 1.24x) and below 1 (zipf, noise); the
full run's 0.54 for uniform shows how much the shared machine's load moves
single numbers.

Fused row update (``Xmc>ResourceSparseApplyAdam``, the default of LazyAdam
on the CPU) against the composite one (``bag+lazyadam-unfused``), the
default model's encoder shape (d = 1024, batch 64, nnz 100), one run, load
average ~1.5 (``--methods bag+lazyadam,bag+lazyadam-unfused --units 1024
--batch 64``)::

    D        dist     uniq   bag+lazyadam  bag+lazyadam-unfused
    50000    uniform   6006     76.6           110.3
    50000    zipf      3511     51.5            84.6
    500000   uniform   6361     99.0           137.8
    500000   zipf      4243     67.8           112.6

1.4-1.7x faster per encoder step; scaling 50k -> 500k 1.29 (uniform) and
1.32 (zipf, where the distinct rows per batch grow 1.21x); peak RSS at
500k 6.5 GB either way (table and two moments, 2 GB each at d = 1024).

On a faster machine (2 cores with AVX-512, idle) and with the op library
built with -fno-math-errno (the fused row update's sqrt vectorised), same
shape, all four methods, 10 steps each
(``results/sparse_input_encoder.json``)::

    D        dist     uniq   bag+lazyadam  unfused  dense+lazyadam  dense+adam
    50000    uniform   6006     10.6         31.0        40.5           196.4
    50000    zipf      3511      7.9         17.2        37.5           192.1
    500000   uniform   6361     12.5         34.0       207.3          1674.4
    500000   zipf      4243     10.5         23.9       200.0          1691.0

Scaling of bag+lazyadam 50k -> 500k: 1.17 (uniform) and 1.32 (zipf; 1.09
per distinct row); a second run of bag+lazyadam alone with 30 steps:
1.17 and 1.20.  Peak RSS at 500k: 6.7 GB (bag+lazyadam) against 10.9 GB
(dense+adam), which is 134-162x slower there.

Part 2 (``--e2e``, ``benchmarks/sparse_input_e2e.py``): the main job end to
end with each encoder on Delicious, ManNextWord and a 500k-feature set,
next to napkinXC and Omikuji; its measurements are in that file.

How to run
----------
::

    PYTHONPATH=. python benchmarks/sparse_input.py --out /tmp/sparse_input.json

Default: D in {50k, 500k}, d = 512, batch 256, nnz 100, both distributions,
three methods (12 processes, a few minutes on 2 cores; peak memory of the
``dense+adam`` case at D = 500k about 5 GB).  ``--units 1024`` doubles the
memory.  Timings on a shared machine are upper bounds: check the load average
printed in the header and at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

METHODS = ("dense+adam", "dense+lazyadam", "bag+lazyadam",
           "bag+lazyadam-unfused", "bag+adam")
DEFAULT_METHODS = "dense+adam,dense+lazyadam,bag+lazyadam,bag+lazyadam-unfused"
TARGET_RATIO = 1.3


# ---------------------------------------------------------------------------
# Data.

def feature_sampler(rng, num_features, dist, exponent):
    """Function k -> int64 [k] feature ids drawn i.i.d. from the distribution."""
    if dist == "uniform":
        return lambda k: rng.integers(0, num_features, size=k)
    if dist != "zipf":
        raise ValueError(f"unknown distribution {dist!r}")
    weights = 1.0 / np.arange(1, num_features + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    perm = rng.permutation(num_features)

    def draw(k):
        ranks = np.searchsorted(cdf, rng.random(k), side="right")
        return perm[np.minimum(ranks, num_features - 1)]

    return draw


def make_batch(rng, draw, batch, nnz, num_features):
    """(indices int64 [batch*nnz, 2] row-major, values float32, dense_shape).

    Each row holds ``nnz`` distinct features (redrawn until distinct)."""
    if nnz > num_features:
        raise ValueError("nnz must be <= num_features")
    cols = np.empty((batch, nnz), np.int64)
    for i in range(batch):
        chosen = np.unique(draw(nnz))
        while chosen.size < nnz:
            chosen = np.unique(np.concatenate([chosen, draw(nnz)]))
        if chosen.size > nnz:  # keep a random subset of the distinct draws
            chosen = np.sort(rng.choice(chosen, nnz, replace=False))
        cols[i] = chosen
    rows = np.repeat(np.arange(batch, dtype=np.int64), nnz)
    indices = np.stack([rows, cols.reshape(-1)], axis=1)
    values = rng.random(batch * nnz).astype(np.float32) + 1e-3
    return indices, values, np.array([batch, num_features], np.int64)


# ---------------------------------------------------------------------------
# One case (child process).

def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def run_case(case):
    """Runs one (method, D, dist) case; returns a JSON-serialisable dict."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import keras
    import tensorflow as tf

    from xmc_tf.layers import SparseEmbeddingBag
    from xmc_tf.optimizers import LazyAdam

    method, num_features, units = case["method"], case["D"], case["d"]
    batch, nnz = case["batch"], case["nnz"]
    rng = np.random.default_rng(case["seed"])
    draw = feature_sampler(rng, num_features, case["dist"],
                           case["zipf_exponent"])
    raw = [make_batch(rng, draw, batch, nnz, num_features)
           for _ in range(case["batches"])]
    uniq = [int(np.unique(ind[:, 1]).size) for ind, _, _ in raw]
    batches = [tf.SparseTensor(*b) for b in raw]
    del raw

    start = time.perf_counter()
    layer_kind, opt_kind = method.split("+")
    if layer_kind == "dense":
        layer = keras.layers.Dense(units)
    else:
        layer = SparseEmbeddingBag(units)
    layer.build((None, num_features))
    if opt_kind.startswith("lazyadam"):
        optimizer = LazyAdam(1e-3, fused=opt_kind != "lazyadam-unfused")
    else:
        optimizer = keras.optimizers.Adam(1e-3)
    variables = layer.trainable_variables
    optimizer.build(variables)
    upstream = tf.random.stateless_normal([batch, units], seed=[case["seed"], 7])
    upstream = upstream / batch
    setup_s = time.perf_counter() - start

    @tf.function(jit_compile=False, input_signature=[
        tf.SparseTensorSpec([batch, num_features], tf.float32)])
    def train_step(x):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) * upstream)
        grads = tape.gradient(loss, variables)
        optimizer.apply(grads, variables)
        return tf.identity(loss)

    start = time.perf_counter()
    for i in range(2):
        train_step(batches[i % len(batches)]).numpy()
    warmup_s = time.perf_counter() - start
    rss_before = peak_rss_mb()
    samples = []
    while len(samples) < case["repeats"]:
        x = batches[(len(samples) + 2) % len(batches)]
        t0 = time.perf_counter()
        train_step(x).numpy()
        samples.append(time.perf_counter() - t0)
        if sum(samples) > case["budget_s"]:
            break
    assert int(optimizer.iterations) == 2 + len(samples)
    return dict(case,
                tensorflow=tf.__version__, keras=keras.__version__,
                uniq_mean=float(np.mean(uniq)),
                step_ms_median=1e3 * statistics.median(samples),
                step_ms_min=1e3 * min(samples),
                steps_timed=len(samples),
                samples_ms=[1e3 * s for s in samples],
                setup_s=setup_s, warmup_s=warmup_s,
                peak_rss_mb=peak_rss_mb(),
                peak_rss_before_timing_mb=rss_before,
                table_mb=num_features * units * 4 / 2**20)


def run_in_child(case, timeout_s):
    """Runs `case` in a fresh interpreter (own peak RSS); dict or error dict."""
    cmd = [sys.executable, os.path.abspath(__file__), "--_case",
           json.dumps(case)]
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=timeout_s, env=env, check=False)
    except subprocess.TimeoutExpired:
        return dict(case, error=f"timed out after {timeout_s} s")
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    return dict(case, error=f"exit {proc.returncode}: "
                f"{proc.stderr.strip().splitlines()[-1:]}")


# ---------------------------------------------------------------------------
# Report.

def fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_table(results):
    header = (f"{'method':<16}{'D':>9}{'d':>6}{'dist':>9}{'uniq':>8}"
              f"{'step ms':>10}{'min ms':>9}{'steps':>7}{'peak RSS MB':>13}"
              f"{'table MB':>10}")
    print(header)
    print("-" * len(header))
    for r in results:
        if "error" in r:
            print(f"{r['method']:<16}{r['D']:>9}{r['d']:>6}{r['dist']:>9}  "
                  f"ERROR {r['error']}")
            continue
        print(f"{r['method']:<16}{r['D']:>9}{r['d']:>6}{r['dist']:>9}"
              f"{r['uniq_mean']:>8.0f}{r['step_ms_median']:>10.1f}"
              f"{r['step_ms_min']:>9.1f}{r['steps_timed']:>7}"
              f"{r['peak_rss_mb']:>13.0f}{r['table_mb']:>10.0f}")


def summarize(results, features):
    """Scaling ratios and speed-ups; the target check."""
    ok = {(r["method"], r["D"], r["dist"]): r for r in results
          if "error" not in r}
    small, large = min(features), max(features)
    summary = {"scaling": [], "speedup": [], "target_met": None}
    checks = []
    for (method, d_, dist), r in sorted(ok.items()):
        if d_ != small or (method, large, dist) not in ok:
            continue
        ratio = ok[(method, large, dist)]["step_ms_median"] / r["step_ms_median"]
        summary["scaling"].append({"method": method, "dist": dist,
                                   "D_small": small, "D_large": large,
                                   "ratio": ratio})
        if method == "bag+lazyadam":
            checks.append(ratio <= TARGET_RATIO)
    for (method, d_, dist), r in sorted(ok.items()):
        if method == "bag+lazyadam":
            continue
        new = ok.get(("bag+lazyadam", d_, dist))
        if new is not None:
            summary["speedup"].append({
                "baseline": method, "D": d_, "dist": dist,
                "speedup": r["step_ms_median"] / new["step_ms_median"]})
    if checks:
        summary["target_met"] = all(checks)
    print(f"\nstep time at D={large} / step time at D={small} "
          f"(target for bag+lazyadam: <= {TARGET_RATIO}):")
    for s in summary["scaling"]:
        print(f"  {s['method']:<16}{s['dist']:>9}  {s['ratio']:.2f}")
    print("\nspeed-up of bag+lazyadam over the baselines (median step time):")
    for s in summary["speedup"]:
        print(f"  vs {s['baseline']:<16} D={s['D']:<8} {s['dist']:>8}  "
              f"{s['speedup']:.1f}x")
    print(f"\ntarget met: {summary['target_met']}")
    return summary


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--features", default="50000,500000",
                        help="comma-separated D values")
    parser.add_argument("--units", type=int, default=512, help="d")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--nnz", type=int, default=100,
                        help="distinct features per row")
    parser.add_argument("--dists", default="uniform,zipf")
    parser.add_argument("--zipf-exponent", type=float, default=1.0)
    parser.add_argument("--methods", default=DEFAULT_METHODS,
                        help=f"comma-separated, from {', '.join(METHODS)}")
    parser.add_argument("--batches", type=int, default=6,
                        help="distinct batches per case (cycled)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--budget-s", type=float, default=30.0,
                        help="stop timing a case after this many seconds")
    parser.add_argument("--case-timeout-s", type=float, default=600.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write results as JSON")
    parser.add_argument("--e2e", action="store_true",
                        help="run part 2 instead (the main job end to end, "
                             "benchmarks/sparse_input_e2e.py; its flags follow)")
    parser.add_argument("--_case", default=None, help=argparse.SUPPRESS)
    args, rest = parser.parse_known_args(argv)
    if args.e2e:
        import sparse_input_e2e  # pylint: disable=import-outside-toplevel
        return sparse_input_e2e.main(
            rest + (["--out", args.out] if args.out else []))
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")

    if args._case is not None:
        print("RESULT " + json.dumps(run_case(json.loads(args._case))),
              flush=True)
        return 0

    features = [int(v) for v in args.features.split(",")]
    methods = args.methods.split(",")
    for m in methods:
        if m not in METHODS:
            parser.error(f"unknown method {m!r}")
    dists = args.dists.split(",")
    print(f"sparse-input encoder step: batch {args.batch}, nnz/row {args.nnz}, "
          f"d {args.units}, D {features}, dists {dists}; "
          f"{os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
          flush=True)
    results = []
    total = time.perf_counter()
    for num_features in features:
        for dist in dists:
            for method in methods:
                case = {"method": method, "D": num_features, "d": args.units,
                        "batch": args.batch, "nnz": args.nnz, "dist": dist,
                        "zipf_exponent": args.zipf_exponent,
                        "batches": args.batches, "repeats": args.repeats,
                        "budget_s": args.budget_s, "seed": args.seed}
                result = run_in_child(case, args.case_timeout_s)
                results.append(result)
                done = ("ERROR " + result["error"] if "error" in result else
                        f"{result['step_ms_median']:.1f} ms/step")
                print(f"  {method:<16} D={num_features:<8} {dist:<8} {done}",
                      flush=True)
    total = time.perf_counter() - total
    print()
    print_table(results)
    summary = summarize(results, features)
    print(f"load average at end {os.getloadavg()[0]:.1f}; total {total:.0f} s")
    if args.out:
        report = {
            "benchmark": "sparse_input",
            "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine(),
            "load_average_at_end": os.getloadavg()[0],
            "args": {k: v for k, v in vars(args).items() if k != "_case"},
            "cases": results,
            "summary": summary,
            "total_s": total,
        }
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
