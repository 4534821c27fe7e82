"""Where a training step of the default model goes, part by part, against the machine's limit.

What it measures
----------------
Issue 57 item 1.  For each shared multi-label set (``--datasets``: Bibtex
and Delicious' ``xcsplit``, WordNetHypernyms) the job builds the default
model exactly as ``xmc-tf train --config=uniform_sparse`` does (plan,
normalisation, prior bias, wide path from the data, the compiled loss and
training metrics, LazyAdam; the phases of :mod:`xmc_tf.job.run`, the fused scorers
off: they run after training), trains it ``--warm-steps`` steps (so that the
loss signal is as sparse as in training, not at its initial state), then
times, on ``--batches`` real training batches held in memory, every part of
a step as a ``tf.function`` of its own (median over ``--repeats`` passes
over the batches, after one untimed pass for tracing):

==================  ========================================================
part                what runs
==================  ========================================================
input               the job's ``tf.data`` stream alone (``next`` of its
                    iterator: parsing, shuffling, batching the CSR rows)
encoder             ``SparseEmbeddingBag`` (+ dropout) forward and its
                    row-sparse kernel gradient (``IndexedSlices``)
intermediate        the intermediate ``Dense`` forward and both gradients
head                ``UniformSparseDense`` forward and both gradients, on
                    the real loss gradient of the batch
wide                the wide path (``UniformSparseDense`` on the sparse
                    input) forward and kernel gradient, same signal
loss                the squared hinge's value and gradient w.r.t. the scores
train_metrics       the compiled training P@1 / P@3 (a top-k per row)
optimizer           ``LazyAdam.apply`` of the step's real gradients
set                 one ``SetRewiring.rewire_now()`` per
                    ``config.set.every_n_steps`` steps (its share of a step)
train_step          ``model.train_step`` (all of the above but input and
                    SET, one graph) on the held batches
keras_fit           ``model.fit`` over the stream, per step (what an epoch
                    costs per step, Keras' loop and the input pipeline in)
==================  ========================================================

``graph_overhead = train_step - sum(parts inside it)`` and
``keras_overhead = keras_fit - train_step - set`` are reported too.

**Limits**: each part's FLOPs, DRAM bytes and row gathers (the work model
below; ``b`` batch, ``z`` stored input entries in the batch, ``D`` input
features, ``d`` encoder width, ``e`` intermediate width, ``m`` labels,
``s`` head connections per label, ``w`` wide connections per label, ``m_nz``
labels whose loss gradient column has a non-zero in the batch, ``u`` distinct
input features in the batch) divided by the machine's peaks
(``benchmarks/roofline.py``'s ``machine_peaks``: FMA GFLOP/s, bandwidth,
row gathers per second, all cores), ``limit = max(flops / fma, bytes /
bandwidth, gathers / rate)``; ``fraction = measured / limit``:

* encoder: ``4 z d`` flops, ``8 z d + 8 b d`` bytes, ``2 z`` row gathers;
* intermediate: ``6 b d e`` flops, ``12 d e + 8 b e + 8 b d`` bytes;
* head: ``2 b m s + 4 b m_nz s`` flops, ``16 m s + 12 b m + 8 b e`` bytes,
  ``m s + 2 m_nz s`` row gathers (as roofline.py's forward, grad_features,
  grad_weights);
* wide: ``4 p`` flops, ``p`` the batch's (stored entry, connection of its
  feature) pairs counted on the kept inverted index (``z w m / D`` if the
  connections were uniform; the data-chosen ones put the features of most
  instances in most labels' rows), ``16 m w + 8 b m`` bytes, ``2 p``
  row gathers (each pair reads a weight of another label's row in the
  forward and a signal entry of another label in the gradient);
* loss: ``8 b m`` flops, ``12 b m`` bytes; train_metrics: ``2 b m``
  compares, ``4 b m`` bytes;
* optimizer: ``28`` bytes per updated weight (gradient read; weight and two
  moments read and written): ``u d + d`` encoder, ``d e + e`` intermediate,
  ``m s + m`` head, ``m w + m`` wide;
* set: ``32 m s`` bytes per rewire (roofline.py), over ``every_n_steps``;
* input: ``12 z + 8 b`` bytes (the CSR batch written once).

How to run
----------
Build the op library, hold the machine alone, then::

    PYTHONPATH=. python benchmarks/step_parts.py --shared ../shared \\
        --out benchmarks/results/step_parts.json

Output: a table per data set (stdout) and the JSON of ``--out`` (the
machine's peaks, per data set the shapes, every part's median / min
seconds, limit, bound and fraction, and the load average).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

# The shared multi-label sets' train / test files under ../shared/data.
from epoch_time import SETS  # noqa: E402  (benchmarks/)

#: Parts that ``model.train_step`` runs (the rest: input, set).
STEP_PARTS = ("encoder", "intermediate", "head", "wide", "loss",
              "train_metrics", "optimizer")


def work_models(b, z, u, D, d, e, m, s, w, m_nz, set_every,
                wide_products=None):
    """FLOPs, DRAM bytes and row gathers of every part (module docstring).

    Args:
      b, z, u, D, d, e, m, s, w, m_nz: the shapes of the module docstring
        (per step; ``z``, ``u`` and ``m_nz`` are means over the batches).
      set_every: steps per SET rewire.
      wide_products: ``p`` of the module docstring (mean per batch), or
        None for the uniform ``z w m / D``.

    Returns:
      dict part -> ``{"flops", "bytes", "row_gathers"}`` (floats).
    """
    if wide_products is None:
        wide_products = z * w * m / D
    wide = dict(flops=4.0 * wide_products, bytes=16.0 * m * w + 8.0 * b * m,
                row_gathers=2.0 * wide_products) if w else None
    models = {
        "input": dict(flops=0.0, bytes=12.0 * z + 8 * b, row_gathers=0.0),
        "encoder": dict(flops=4.0 * z * d, bytes=8.0 * z * d + 8 * b * d,
                        row_gathers=2.0 * z),
        "intermediate": dict(flops=6.0 * b * d * e,
                             bytes=12.0 * d * e + 8 * b * e + 8 * b * d,
                             row_gathers=0.0),
        "head": dict(flops=2.0 * b * m * s + 4.0 * b * m_nz * s,
                     bytes=16.0 * m * s + 12 * b * m + 8 * b * e,
                     row_gathers=m * s + 2.0 * m_nz * s),
        "loss": dict(flops=8.0 * b * m, bytes=12.0 * b * m, row_gathers=0.0),
        "train_metrics": dict(flops=2.0 * b * m, bytes=4.0 * b * m,
                              row_gathers=0.0),
        "optimizer": dict(flops=10.0 * (u * d + d + d * e + e + m * s + m
                                        + (m * w + m if w else 0)),
                          bytes=28.0 * (u * d + d + d * e + e + m * s + m
                                        + (m * w + m if w else 0)),
                          row_gathers=0.0),
        "set": dict(flops=0.0, bytes=32.0 * m * s / set_every,
                    row_gathers=0.0),
    }
    if wide is not None:
        models["wide"] = wide
    return models


def _median_pass(fn, batches, repeats):
    """Median and min seconds per batch of ``fn(batch)`` over ``repeats``
    passes over ``batches`` (one untimed pass first)."""
    for batch in batches:
        _read(fn(batch))
    per_pass = []
    for _ in range(repeats):
        t = time.perf_counter()
        for batch in batches:
            _read(fn(batch))
        per_pass.append((time.perf_counter() - t) / len(batches))
    return {"median_s": statistics.median(per_pass), "min_s": min(per_pass)}


def _step_clock(skip):
    """A Keras callback: the steady seconds per step of a ``fit`` (from the
    end of batch ``skip`` to the end of the last; the start of ``fit``,
    the iterator's first shuffle buffer and tracing are not in it)."""
    import keras

    class StepClock(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.skip, self.marks = skip, []

        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 >= self.skip:
                self.marks.append((batch + 1, time.perf_counter()))

        def seconds_per_step(self):
            (b0, t0), (b1, t1) = self.marks[0], self.marks[-1]
            return (t1 - t0) / (b1 - b0)

    return StepClock()


def _read(out):
    """Waits for a result (a tensor, or a structure of them)."""
    import tensorflow as tf
    for t in tf.nest.flatten(out):
        if hasattr(t, "numpy"):
            t.numpy()


def measure(name, train, test, args, peaks):
    """Builds the default model on one data set and times its parts.

    Returns:
      dict: shapes, parts (``median_s``, ``min_s``, ``limit_s``, ``bound``,
      ``fraction`` and the work model) and the overheads.
    """
    import numpy as np
    import tensorflow as tf

    import roofline
    from xmc_tf import config as xconfig
    from xmc_tf.callbacks import SetRewiring
    from xmc_tf.job import cluster as xcluster
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import checks as xchecks
    from xmc_tf.job import run as xrun
    from xmc_tf.job.workdir import Workdir

    config = xconfig.get_config("uniform_sparse")
    config.data.train, config.data.test = train, test
    for section in ("tree", "centroids", "neighbours"):
        config[section].enabled = False
    config.train.verbose = 0
    for field in args.set:
        key, value = field.split("=", 1)
        sec, attr = key.rsplit(".", 1)
        target = config
        for part in sec.split("."):
            target = target[part]
        target[attr] = json.loads(value)
    workdir = tempfile.mkdtemp(prefix=f"step_parts_{name}_")
    job = xrun.Job(Workdir(workdir), xcluster.Cluster(None))
    planned = xrun.plan(job, xchecks.check(config, job.cluster), None)
    splits = xrun.split(job, planned)
    built = xrun.build(job, planned, splits)
    cfg = planned.config
    model, fit_model = built.model, built.fit_model
    set_cbs = [c for c in built.callbacks if isinstance(c, SetRewiring)]
    train_ds, _ = xfit.make_datasets(cfg, planned.head, splits.fit_data, None,
                                     model, job.cluster, 0)
    steps_per_epoch = -(-splits.fit_data.num_instances // cfg.train.batch_size)
    t = time.perf_counter()
    fit_model.fit(train_ds, steps_per_epoch=args.warm_steps, epochs=1,
                  verbose=0, callbacks=set_cbs)
    warm_s = time.perf_counter() - t

    it = iter(train_ds)
    batches = [next(it) for _ in range(args.batches)]
    # input: the stream alone
    t = time.perf_counter()
    n_input = 4 * args.batches
    for _ in range(n_input):
        _read(next(it))
    input_s = (time.perf_counter() - t) / n_input

    layers = {l.name: l for l in model.layers}
    enc, inter = layers["encoder_0"], layers["intermediate"]
    drop = layers.get("dropout")
    out_layer, wide_layer = layers["output"], layers.get("wide")
    loss_fn = fit_model.loss
    # the compiled training metrics' kinds, fresh (Keras keeps its own
    # inside a CompileMetrics wrapper)
    metrics = planned.head.train_metrics(built.layer)
    opt = fit_model.optimizer

    def xy(batch):
        return batch[0], batch[1]

    @tf.function(reduce_retracing=True)
    def enc_part(x):
        with tf.GradientTape() as tape:
            h = enc(x, training=True)
            if drop is not None:
                h = drop(h, training=True)
        return tape.gradient(h, enc.trainable_variables,
                             output_gradients=tf.ones_like(h))

    @tf.function(reduce_retracing=True)
    def forward_parts(x, y):
        h = enc(x, training=False)
        a = inter(h)
        scores = out_layer(a)
        if wide_layer is not None:
            scores = scores + wide_layer(x)
        with tf.GradientTape() as tape:
            tape.watch(scores)
            loss = loss_fn(y, scores)
        g = tape.gradient(loss, scores)
        return h, a, scores, g

    # The wide layer's connections per feature (the lengths of its inverted
    # index's lists; no SET rewires these batches, so once).
    fan_out = (np.bincount(wide_layer.indices.numpy().ravel(),
                           minlength=splits.fit_data.num_features)
               if wide_layer is not None else None)

    cached = []
    products = []
    nz = []
    zs, us = [], []
    for batch in batches:
        x, y = xy(batch)
        h, a, scores, g = forward_parts(x, y)
        cached.append((x, y, h, a, g, scores))
        nz.append(int(tf.math.count_nonzero(
            tf.reduce_any(tf.not_equal(g, 0.0), axis=0))))
        zs.append(int(tf.size(x.values)))
        if wide_layer is not None:
            products.append(int(fan_out[x.indices[:, 1].numpy()].sum()))
        us.append(int(tf.size(tf.unique(x.indices[:, 1])[0])))

    @tf.function(reduce_retracing=True)
    def inter_part(h):
        with tf.GradientTape() as tape:
            tape.watch(h)
            a = inter(h)
        return tape.gradient(a, [h] + inter.trainable_variables,
                             output_gradients=tf.ones_like(a))

    @tf.function(reduce_retracing=True)
    def head_part(a, g):
        with tf.GradientTape() as tape:
            tape.watch(a)
            scores = out_layer(a)
        return tape.gradient(scores, [a] + out_layer.trainable_variables,
                             output_gradients=g)

    @tf.function(reduce_retracing=True)
    def wide_part(x, g):
        with tf.GradientTape() as tape:
            scores = wide_layer(x)
        return tape.gradient(scores, wide_layer.trainable_variables,
                             output_gradients=g)

    @tf.function(reduce_retracing=True)
    def loss_part(y, scores):
        with tf.GradientTape() as tape:
            tape.watch(scores)
            loss = loss_fn(y, scores)
        return loss, tape.gradient(loss, scores)

    @tf.function(reduce_retracing=True)
    def metrics_part(y, scores):
        for metric in metrics:
            metric.update_state(y, scores)
        return [metric.result() for metric in metrics]

    @tf.function(reduce_retracing=True)
    def full_grads(x, y):
        with tf.GradientTape() as tape:
            scores = fit_model(x, training=True)
            loss = loss_fn(y, scores)
        return tape.gradient(loss, fit_model.trainable_variables)

    grads_cache = [full_grads(c[0], c[1]) for c in cached]
    variables = fit_model.trainable_variables

    @tf.function(reduce_retracing=True)
    def opt_part(grads):
        opt.apply(grads, variables)
        return opt.iterations

    @tf.function(reduce_retracing=True)
    def step_part(batch):
        return fit_model.train_step(batch)

    R = args.repeats
    measured = {}
    measured["input"] = {"median_s": input_s, "min_s": input_s}
    measured["encoder"] = _median_pass(lambda c: enc_part(c[0]), cached, R)
    measured["intermediate"] = _median_pass(lambda c: inter_part(c[2]),
                                            cached, R)
    measured["head"] = _median_pass(lambda c: head_part(c[3], c[4]),
                                    cached, R)
    if wide_layer is not None:
        measured["wide"] = _median_pass(lambda c: wide_part(c[0], c[4]),
                                        cached, R)
    pairs = [(c[1], c[5]) for c in cached]
    measured["loss"] = _median_pass(lambda p: loss_part(*p), pairs, R)
    if metrics:
        measured["train_metrics"] = _median_pass(lambda p: metrics_part(*p),
                                                 pairs, R)
    measured["optimizer"] = _median_pass(opt_part, grads_cache, R)
    every = int(cfg.set.every_n_steps)
    if set_cbs and cfg.set.enabled:
        times = []
        for _ in range(max(1, args.set_repeats)):
            t = time.perf_counter()
            set_cbs[0].rewire_now()
            times.append(time.perf_counter() - t)
        measured["set"] = {"median_s": statistics.median(times) / every,
                           "min_s": min(times) / every}
    measured["train_step"] = _median_pass(step_part, batches, R)
    n_fit = max(args.batches * 4, 100)
    clock = _step_clock(skip=20)
    fit_model.fit(train_ds, steps_per_epoch=n_fit + clock.skip, epochs=1,
                  verbose=0, callbacks=set_cbs + [clock])
    keras_s = clock.seconds_per_step()
    measured["keras_fit"] = {"median_s": keras_s, "min_s": keras_s}

    b = cfg.train.batch_size
    shapes = dict(
        b=b, z=statistics.mean(zs), u=statistics.mean(us),
        D=splits.fit_data.num_features, d=int(enc.units),
        e=int(inter.units), m=int(out_layer.units),
        s=int(out_layer.indices.shape[-1]),
        w=int(wide_layer.indices.shape[-1]) if wide_layer is not None else 0,
        m_nz=statistics.mean(nz), set_every=every,
        wide_products=statistics.mean(products) if products else 0,
        steps_per_epoch=steps_per_epoch, warm_steps=args.warm_steps,
        warm_s=warm_s)
    models = work_models(shapes["b"], shapes["z"], shapes["u"], shapes["D"],
                         shapes["d"], shapes["e"], shapes["m"], shapes["s"],
                         shapes["w"], shapes["m_nz"], every,
                         wide_products=shapes["wide_products"] or None)
    parts = {}
    for part, times in measured.items():
        row = dict(times)
        if part in models:
            lim, bound = roofline.limit_seconds(models[part], peaks)
            row.update(limit_s=lim, bound=bound,
                       fraction=times["median_s"] / lim if lim else None,
                       **models[part])
        parts[part] = row
    inside = sum(parts[p]["median_s"] for p in STEP_PARTS if p in parts)
    limit = sum(parts[p]["limit_s"] for p in STEP_PARTS + ("set", "input")
                if p in parts)
    over = {
        "parts_in_train_step_s": inside,
        "graph_overhead_s": parts["train_step"]["median_s"] - inside,
        "keras_overhead_s": (parts["keras_fit"]["median_s"]
                             - parts["train_step"]["median_s"]
                             - parts.get("set", {}).get("median_s", 0.0)),
        "step_limit_s": limit,
        "step_fraction": parts["keras_fit"]["median_s"] / limit,
    }
    return {"shapes": shapes, "parts": parts, "summary": over}


def table(name, result):
    """The result of one data set as a Markdown table."""
    sh, parts, summ = result["shapes"], result["parts"], result["summary"]
    lines = [f"{name}: b={sh['b']}, z={sh['z']:.0f} stored entries, "
             f"d={sh['d']}, e={sh['e']}, m={sh['m']}, s={sh['s']}, "
             f"w={sh['w']}, m_nz={sh['m_nz']:.0f}",
             "| part | ms | limit ms | bound | measured / limit |",
             "|---|---|---|---|---|"]
    for part, row in parts.items():
        lim = row.get("limit_s")
        lines.append("| {} | {:.2f} | {} | {} | {} |".format(
            part, 1e3 * row["median_s"],
            f"{1e3 * lim:.3f}" if lim is not None else "-",
            row.get("bound", "-"),
            f"{row['fraction']:.1f}" if row.get("fraction") else "-"))
    lines.append("graph overhead {:.2f} ms, Keras loop {:.2f} ms; step "
                 "limit {:.3f} ms, keras_fit / limit {:.1f}".format(
                     1e3 * summ["graph_overhead_s"],
                     1e3 * summ["keras_overhead_s"],
                     1e3 * summ["step_limit_s"], summ["step_fraction"]))
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shared", default="../shared")
    p.add_argument("--datasets", default="bibtex,delicious,wordnet")
    p.add_argument("--batches", type=int, default=50)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--set-repeats", type=int, default=3)
    p.add_argument("--warm-steps", type=int, default=300)
    p.add_argument("--set", action="append", default=[],
                   help="config override SECTION.FIELD=JSON (repeatable)")
    p.add_argument("--peaks", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results",
        "roofline.json"), help="a roofline.py JSON whose peaks to use, or "
        "'measure'")
    p.add_argument("--out", default="")
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import roofline
    if args.peaks == "measure":
        peaks = roofline.machine_peaks()["all"]
    else:
        with open(args.peaks) as f:
            peaks = json.load(f)["peaks"]["all"]
    load = os.getloadavg()
    results = {"peaks": peaks, "load_start": load, "argv": sys.argv,
               "datasets": {}}
    for name in args.datasets.split(","):
        train, test = (os.path.join(args.shared, "data", f)
                       for f in SETS[name])
        res = measure(name, train, test, args, peaks)
        results["datasets"][name] = res
        print(table(name, res), flush=True)
    results["load_end"] = os.getloadavg()
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
