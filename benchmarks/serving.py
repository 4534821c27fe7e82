"""Serving latency of exported SavedModels: portable (TensorFlow's ops) vs
the ``Xmc>`` ops.

What it measures
----------------
For each model, :func:`xmc_tf.saving.export_saved_model` writes it twice,
``portable=True`` (every ``Xmc>`` op traced to its TensorFlow formulation
inside :func:`xmc_tf.ops.stock.stock_ops`: ``tf.math.top_k``, the blocked
gather of :func:`xmc_tf.ops.uniform_sparse.uniform_sparse_matmul_stock`,
the blocked brute force of :func:`xmc_tf.ops.mach.mach_top_k_stock`) and
``portable=False`` (``Xmc>UniformSparseMatmul`` + ``Xmc>TopK``,
``Xmc>MachTopK``).  Both are loaded with ``tf.saved_model.load`` in this
process, and the time of one call of the ``serve`` signature (top ``--k``
labels, read back with ``.numpy()``) is measured at each ``--batches``
size on one fixed random dense batch: one warm-up call, then up to
``--repeats`` timed calls (fewer once a case has used ``--budget-s``);
median and minimum are reported, with the ratio of the medians
(portable / ops) and whether the two returned the same label ids.

Models (random weights, no training; dense input ``features [b, 512]``
float32 -> ``Dense(256, relu)`` -> head):

* ``us10k``, ``us670k``: :class:`xmc_tf.layers.UniformSparseDense` with
  10,000 / 670,000 labels, fan-in 32 (Schultheis & Babbar's output layer;
  670k = Amazon-670K's label count), top-k of the ``[b, m]`` scores.
* ``mach670k``: :class:`xmc_tf.layers.MachHead` with 670,000 labels, R = 16
  repetitions of B = 4096 buckets (Medini et al., NeurIPS 2019), its
  exact decoder (softmax per repetition).  With random weights the bucket
  probabilities are nearly uniform, the worst case of the op's threshold
  algorithm (it falls back to brute force), so the op's times are upper
  bounds for a trained model, while the stock decoder always scores every
  label.

Timing: wall clock (``time.perf_counter``); TensorFlow's default thread
pools.  The development machine has 2 CPU cores shared with other jobs: the
load average at the start and the end is in the JSON, and times under load
are upper bounds (compare the ratio, measured back to back).

Measured (development machine, 2 CPU cores shared with other jobs, load
average 7-9 while it ran, so upper bounds; TF 2.21; k = 5; median of 2-3
calls; ``results/serving.json``)::

    model     batch  portable ms  Xmc> ops ms  ratio  same ids
    us10k         1         6.2          1.9    3.3    yes
    us10k       256       129           30      4.4    yes
    us670k        1       370           91      4.1    yes
    us670k      256     10516         2776      3.8    yes
    mach670k      1       303          200      1.5    yes
    mach670k    256     11011        60254      0.18   yes

The stock uniform-sparse product is a gather of ``b m s`` input values
plus a reduction, where the op reads each connection once per row batch
(and, at batch 1, TensorFlow's gather of single floats is slow); MACH's
stock decoder scores every label (``b m R`` adds, vectorised over the
batch), which beats the op's per-row threshold algorithm on these
untrained, near-uniform bucket probabilities (its worst case; trained
models peak and the op prunes most labels).  The portable MACH
SavedModel's graph holds the ``[m, R]`` int32 bucket table (86 MB
``saved_model.pb`` at m = 670k, R = 16: the serve function is stored in
two traces).

Usage::

    python benchmarks/serving.py                       # all, ~5 min
    python benchmarks/serving.py --models us10k --batches 1,256 --out x.json

Output: a table on stdout and JSON in ``benchmarks/results/serving.json``
(``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
from peers import format_table  # noqa: E402

NUM_FEATURES = 512
HIDDEN = 256
FAN_IN = 32
MODELS = {
    "us10k": dict(kind="uniform_sparse", labels=10_000),
    "us670k": dict(kind="uniform_sparse", labels=670_000),
    "mach670k": dict(kind="mach", labels=670_000, buckets=4096,
                     repetitions=16),
}


def build(spec, seed=0):
    """The Keras model of a ``MODELS`` entry, random weights."""
    import keras
    from xmc_tf.layers import MachHead, UniformSparseDense
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((NUM_FEATURES,))
    hidden = keras.layers.Dense(HIDDEN, activation="relu")(inputs)
    if spec["kind"] == "uniform_sparse":
        head = UniformSparseDense(spec["labels"], FAN_IN, seed=seed,
                                  name="output")
    else:
        head = MachHead(num_labels=spec["labels"],
                        num_buckets=spec["buckets"],
                        num_repetitions=spec["repetitions"], seed=seed,
                        name="mach_head")
    return keras.Model(inputs, head(hidden))


def time_calls(fn, x, repeats, budget_s):
    """Seconds of each timed call of ``fn(features=x)`` after one warm-up;
    also the last output."""
    out = fn(features=x)
    out["label_ids"].numpy()
    times = []
    start = time.perf_counter()
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(features=x)
        out["label_ids"].numpy()
        times.append(time.perf_counter() - t0)
        if time.perf_counter() - start > budget_s:
            break
    return times, out


def run_model(name, args, rows):
    import tensorflow as tf
    from xmc_tf import saving
    from xmc_tf.ops import stock
    from tensorflow.core.protobuf import saved_model_pb2
    spec = MODELS[name]
    model = build(spec)
    with tempfile.TemporaryDirectory() as tmp:
        loaded = {}
        for variant, portable in (("portable", True), ("xmc_ops", False)):
            path = os.path.join(tmp, variant)
            t0 = time.perf_counter()
            assert saving.export_saved_model(model, path, k=args.k,
                                             portable=portable) is portable
            export_s = time.perf_counter() - t0
            proto = saved_model_pb2.SavedModel()
            with open(os.path.join(path, "saved_model.pb"), "rb") as f:
                proto.ParseFromString(f.read())
            ops = stock.custom_op_types(mg.graph_def
                                        for mg in proto.meta_graphs)
            loaded[variant] = (tf.saved_model.load(path).signatures["serve"],
                               ops, export_s,
                               os.path.getsize(os.path.join(
                                   path, "saved_model.pb")))
        rng = np.random.default_rng(1)
        for batch in args.batches:
            x = tf.constant(rng.standard_normal(
                (batch, NUM_FEATURES)).astype(np.float32))
            result = {}
            for variant, (fn, ops, export_s, pb_bytes) in loaded.items():
                times, out = time_calls(fn, x, args.repeats, args.budget_s)
                result[variant] = (times, out["label_ids"].numpy())
                rows.append({
                    "model": name, "labels": spec["labels"], "batch": batch,
                    "variant": variant, "xmc_ops": ",".join(ops) or "-",
                    "median_ms": 1e3 * statistics.median(times),
                    "min_ms": 1e3 * min(times), "calls": len(times),
                    "export_s": export_s, "saved_model_pb_bytes": pb_bytes,
                    "load_average": os.getloadavg()[0]})
                print(json.dumps(rows[-1]), flush=True)
            (tp, ids_p), (tx, ids_x) = result["portable"], result["xmc_ops"]
            rows[-2]["same_ids"] = rows[-1]["same_ids"] = bool(
                np.array_equal(ids_p, ids_x))
            rows[-2]["ratio"] = (statistics.median(tp) /
                                 statistics.median(tx))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--batches", default="1,256")
    p.add_argument("--k", type=int, default=5)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=20.0,
                   help="stop repeating a case after this many seconds")
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks",
                                                 "results", "serving.json"))
    args = p.parse_args()
    args.batches = [int(b) for b in args.batches.split(",")]
    import tensorflow as tf
    load_start = os.getloadavg()
    print(f"# tf {tf.__version__}, {os.cpu_count()} cpus, load "
          f"{load_start[0]:.2f}, {platform.processor() or platform.machine()}",
          flush=True)
    rows = []
    t0 = time.perf_counter()
    for name in args.models.split(","):
        run_model(name, args, rows)
    cols = ["model", "batch", "variant", "median_ms", "min_ms", "calls",
            "ratio", "same_ids", "xmc_ops"]
    print(format_table(rows, cols))
    result = {"benchmark": "serving", "tf_version": tf.__version__,
              "cpu_count": os.cpu_count(), "machine": platform.machine(),
              "processor": platform.processor(),
              "load_average_start": load_start,
              "load_average_end": os.getloadavg(),
              "wall_s": time.perf_counter() - t0,
              "num_features": NUM_FEATURES, "hidden": HIDDEN,
              "fan_in": FAN_IN, "k": args.k, "models": MODELS, "rows": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
