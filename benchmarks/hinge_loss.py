"""Squared hinge + gradient: the fused op vs the dense Keras computation.

What it measures
----------------
Issue 32 item 2.  ``xmc_tf.losses.SquaredHinge`` on label ids, value and
gradient w.r.t. the ``[b, m]`` scores through ``tf.GradientTape`` inside a
``tf.function`` (``jit_compile=False``), as in a training step:

* ``dense``: the computation before ``ops/hinge/`` (``dense_targets`` builds
  multi-hot ``[b, m]`` targets, then signs, margins, relu, square, and TF's
  autodiff of that chain): ``SquaredHinge``'s parent ``__call__``, which is
  what the loss still runs for multi-hot targets or without the op;
* ``fused``: ``SquaredHinge`` as it is now: ``Xmc>SquaredHingeLoss`` and
  ``Xmc>SquaredHingeLossGrad``, one pass each.

Shapes: Amazon-670K-like ``[32, 670,091]`` (5.45 labels per instance:
n = 16 padded ids), Amazon-3M-like ``[32, 2,812,281]`` (36 labels: n = 64)
and WordNetHypernyms-like ``[64, 10,122]`` (n = 8).  Scores start near the
squared hinge's prior bias (``-margin - 0.3`` plus noise, sd 0.3), so
about 84% of the gradient entries are exact zeros.  The two methods are timed
interleaved (dense, fused, dense, ...) in one process, ``--repeats`` times
each after a warm-up; reported: the median (and min) in ms.

Bandwidth bound: the fused op must read the scores twice (loss pass, grad
pass) and write the gradient once: ``12 b m`` bytes (the ids are
negligible).  The stream bandwidth is measured here (the best of a
single-thread NumPy copy of 512 MiB and TensorFlow's multi-threaded
element-wise ``x * 1.0`` of the same size, each counted as read + write);
``bound = 12 b m / bandwidth``.

``--head`` (default on) also times the head at 670k labels, forward and
backward: intermediate 32,768 -> ``UniformSparseDense`` (670,091 labels,
s = 32, prior bias), loss + gradients w.r.t. the layer's variables and
input: the "1.1 s of a 2.3 s step" of ``docs/notes/scaling.md``, before/after.

How to run
----------
Build the op library, then::

    PYTHONPATH=. python benchmarks/hinge_loss.py

JSON goes to ``benchmarks/results/hinge_loss.json`` (``--out``).  On a
shared machine timings are upper bounds: the header prints the load
average.  Peak memory is a few GiB at 2.8M labels (the dense path's
``[b, m]`` temporaries, 360 MB each).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = [("amazon670k", 32, 670_091, 16), ("amazon3m", 32, 2_812_281, 64),
          ("wordnet", 64, 10_122, 8)]


def _ids(rng, b, m, n):
    ids = np.full((b, n), -1, np.int32)
    for i in range(b):
        k = int(rng.integers(1, n + 1))
        ids[i, :k] = rng.integers(0, m, k)
    return ids


def stream_bandwidth(tf, mib=512, repeats=5):
    """Bytes per second of a large copy (read + write), best of two ways."""
    a = np.ones(mib * 2 ** 18, np.float32)
    b = np.empty_like(a)
    np_times = []
    for _ in range(repeats):
        t = time.perf_counter()
        np.copyto(b, a)
        np_times.append(time.perf_counter() - t)
    x = tf.constant(a)
    factor = tf.constant(1.0)  # an input, so grappler cannot fold x * 1
    scale = tf.function(lambda v, f: v * f)
    scale(x, factor)
    tf_times = []
    for _ in range(repeats):
        t = time.perf_counter()
        y = scale(x, factor)
        float(y[0].numpy())
        tf_times.append(time.perf_counter() - t)
        del y
    nbytes = 2 * a.nbytes
    return {"numpy_copy_gbs": nbytes / min(np_times) / 1e9,
            "tf_elementwise_gbs": nbytes / min(tf_times) / 1e9}


def _timed(fn, repeats_out, *args):
    t = time.perf_counter()
    out = fn(*args)
    float(out.numpy())
    repeats_out.append(time.perf_counter() - t)


def loss_benchmark(tf, name, b, m, n, repeats, bandwidth, margin=1.0):
    from xmc_tf.losses import SquaredHinge
    from xmc_tf.losses.hinge import _MultiLabelLoss
    rng = np.random.default_rng(0)
    scores = tf.constant(
        (-margin - 0.3 + 0.3 * rng.standard_normal((b, m))).astype(
            np.float32))
    ids = tf.constant(_ids(rng, b, m, n))
    loss = SquaredHinge(margin=margin)

    def run(call):
        @tf.function(jit_compile=False)
        def step(y, s):
            with tf.GradientTape() as tape:
                tape.watch(s)
                value = call(y, s)
            grad = tape.gradient(value, s)
            # consume the gradient (a checksum) so nothing is pruned
            return value + 0.0 * tf.reduce_sum(grad[:, :1])
        return step

    methods = {
        "dense": run(lambda y, s: _MultiLabelLoss.__call__(loss, y, s)),
        "fused": run(lambda y, s: loss(y, s)),
    }
    got = {k: float(f(ids, scores).numpy()) for k, f in methods.items()}
    times = {k: [] for k in methods}
    for _ in range(repeats):
        for k, f in methods.items():
            _timed(f, times[k], ids, scores)
    zeros = None
    with tf.GradientTape() as tape:
        tape.watch(scores)
        value = loss(ids, scores)
    zeros = float(tf.reduce_mean(
        tf.cast(tape.gradient(value, scores) == 0, tf.float32)))
    nbytes = 12 * b * m
    row = {"name": name, "batch": b, "labels": m, "ids_per_row": n,
           "loss_dense": got["dense"], "loss_fused": got["fused"],
           "grad_zero_fraction": zeros, "bytes_moved_fused": nbytes,
           "bound_ms": nbytes / bandwidth * 1e3, "repeats": repeats}
    for k, ts in times.items():
        row[f"{k}_median_ms"] = statistics.median(ts) * 1e3
        row[f"{k}_min_ms"] = min(ts) * 1e3
    row["speedup"] = row["dense_median_ms"] / row["fused_median_ms"]
    return row


def head_benchmark(tf, repeats, b=32, m=670_091, e=32_768, s=32):
    """Forward + backward of the 670k uniform-sparse head with the loss."""
    import keras
    from xmc_tf.layers import UniformSparseDense
    from xmc_tf.losses import SquaredHinge
    from xmc_tf.losses.hinge import _MultiLabelLoss
    rng = np.random.default_rng(1)
    loss = SquaredHinge()
    layer = UniformSparseDense(m, connections_per_label=s,
                               bias_initializer=loss.bias_initializer(),
                               seed=0)
    layer.build((None, e))
    x = tf.constant(np.maximum(rng.standard_normal((b, e)), 0).astype(
        np.float32) * 0.05)
    ids = tf.constant(_ids(rng, b, m, 16))

    def run(call):
        @tf.function(jit_compile=False)
        def step(y, inputs):
            with tf.GradientTape() as tape:
                tape.watch(inputs)
                value = call(y, layer(inputs))
            grads = tape.gradient(value, [inputs] + layer.trainable_variables)
            return value + 0.0 * tf.add_n(
                [tf.reduce_sum(tf.reshape(tf.convert_to_tensor(g), [-1])[:1])
                 for g in grads])
        return step

    methods = {
        "dense": run(lambda y, p: _MultiLabelLoss.__call__(loss, y, p)),
        "fused": run(lambda y, p: loss(y, p)),
    }
    for f in methods.values():
        f(ids, x)
    times = {k: [] for k in methods}
    for _ in range(repeats):
        for k, f in methods.items():
            _timed(f, times[k], ids, x)
    del keras
    row = {"name": "head_670k_fwd_bwd", "batch": b, "labels": m,
           "input_width": e, "fan_in": s, "repeats": repeats}
    for k, ts in times.items():
        row[f"{k}_median_ms"] = statistics.median(ts) * 1e3
        row[f"{k}_min_ms"] = min(ts) * 1e3
    row["speedup"] = row["dense_median_ms"] / row["fused_median_ms"]
    return row


def table(rows, bw):
    lines = [f"stream bandwidth: {bw['used_gbs']:.1f} GB/s (numpy copy "
             f"{bw['numpy_copy_gbs']:.1f}, TF element-wise "
             f"{bw['tf_elementwise_gbs']:.1f})",
             f"{'case':<20}{'b':>4}{'m':>10}{'dense ms':>11}{'fused ms':>11}"
             f"{'speed-up':>10}{'bound ms':>10}{'zeros':>7}"]
    for r in rows:
        bound = f"{r['bound_ms']:.1f}" if "bound_ms" in r else "-"
        zeros = (f"{r['grad_zero_fraction']:.2f}"
                 if "grad_zero_fraction" in r else "-")
        lines.append(
            f"{r['name']:<20}{r['batch']:>4}{r['labels']:>10}"
            f"{r['dense_median_ms']:>11.1f}{r['fused_median_ms']:>11.1f}"
            f"{r['speedup']:>9.1f}x{bound:>10}{zeros:>7}")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--head-repeats", type=int, default=5)
    p.add_argument("--no-head", dest="head", action="store_false")
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES))
    p.add_argument("--out", default=os.path.join(ROOT, "benchmarks",
                                                 "results", "hinge_loss.json"))
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    from xmc_tf.ops import squared_hinge_loss_supported
    if not squared_hinge_loss_supported():
        raise SystemExit("the op library lacks Xmc>SquaredHingeLoss: build it")
    print(f"# {platform.node()} cpus={os.cpu_count()} "
          f"load={os.getloadavg()} tf={tf.__version__}", flush=True)
    bw = stream_bandwidth(tf)
    bw["used_gbs"] = max(bw["numpy_copy_gbs"], bw["tf_elementwise_gbs"])
    rows = []
    wanted = set(args.shapes.split(","))
    for name, b, m, n in SHAPES:
        if name in wanted:
            rows.append(loss_benchmark(tf, name, b, m, n, args.repeats,
                                       bw["used_gbs"] * 1e9))
            print(json.dumps(rows[-1]), flush=True)
    if args.head:
        rows.append(head_benchmark(tf, args.head_repeats))
        print(json.dumps(rows[-1]), flush=True)
    print(table(rows, bw))
    result = {"bandwidth": bw, "rows": rows, "cpus": os.cpu_count(),
              "load_average_at_start": os.getloadavg(),
              "tf_version": tf.__version__}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
