"""The squared hinge's signal density in real training, and the epoch time
the zero-skipping backward of the uniform-sparse layer saves (issue 43,
item 3).

What it measures
----------------
The registered gradient of the uniform-sparse output layer
(``Xmc>UniformSparseMatmulGrad``: the gradients w.r.t. the features and the
weights in one pass) skips the zero entries of its upstream signal
``g = dloss / dscores``.  With the squared hinge, an entry is exactly zero
once its label's margin holds (a negative scored below -1, a positive above
+1), so the signal thins out as training goes (Schultheis & Babbar,
Sec. 3.3, Table 4).  This script trains the default model
(``xmc_tf.ExtremeClassifier("uniform_sparse")``: encoder 1024, intermediate
4096, 64 connections per label, the wide path, SET, squared hinge, batch
64, LazyAdam; the label tree off, no test set) and, through a Keras
callback given to the classifier (:class:`DensityCallback`), at the start
of training (epoch 0) and after every epoch:

* takes the same ``--sample-batches`` training batches every time (the
  first batches of the job's own training stream, normalised as the job
  normalises them; captured by wrapping
  ``xmc_tf.job.fit.make_datasets``, nothing in the job changed);
* runs the model on each with ``training=True`` (dropout on, as in a
  training step), takes the compiled loss (``model.loss``, the fused
  squared hinge) and ``g`` = its gradient w.r.t. the output of the
  uniform-sparse scoring layer (``xmc_tf.decoding.scoring_layer``; the
  scores are that output plus the wide path's, so ``g`` is also
  ``dloss / dscores``), and ``h`` = the layer's input (the intermediate
  features), from ``keras.Model(model.inputs, [layer.input, layer.output,
  model.outputs[0]])``;
* records the non-zero fraction of ``g`` and the fraction of labels
  (columns of ``g``) with any non-zero in the batch (:func:`signal_density`);
* times the fused backward op on these real ``(g, kernel_scale * h,
  indices, kernel)`` against the same with every zero of ``g`` replaced by
  ``1e-20`` (``tf.where(g == 0, 1e-20, g)``: what the backward costs
  without skipping), eagerly, ``--repeats`` calls each after one warm-up,
  the two alternating; the median per batch, then the mean over the
  batches;
* saved seconds per epoch = (dense-signal ms - real ms) per step x steps
  per epoch; epoch s = the epoch's wall time from ``on_epoch_begin`` to
  ``on_epoch_end`` without Keras' validation pass (the job's own
  per-step callbacks, e.g. SET, included; the first epoch includes
  tracing).

The density after epoch ``e`` is the state the next epoch starts from: the
epoch's own steps saw a density between the row before and its row.  So
the saving of epoch ``e`` is estimated from the mean of the rows ``e - 1``
and ``e`` (column ``saved s/epoch``).

Data sets (``--datasets``):

* ``bibtex``: the bundled Bibtex train split (4,880 instances, 159 labels);
* ``wordnet``: ``WordNetHypernyms/train.txt.gz`` of ``--shared``
  (61,585 instances, 10,122 labels), the first ``--wordnet-train`` rows of
  a random permutation (seed 0);
* ``670k``: synthetic data shaped like Amazon-670K (670,091 labels, 135,909
  features, 5.45 labels and 76 features per instance,
  ``xmc_tf.data.make_synthetic`` as ``benchmarks/run_memory.py``),
  ``--train-670k`` instances.

Output: a table on stdout and JSON (``--out``); rows of data sets not run
now are kept from an existing file.

Usage::

    PYTHONPATH=. python benchmarks/signal_density.py --datasets bibtex
    PYTHONPATH=. python benchmarks/signal_density.py \\
        --datasets bibtex,wordnet,670k \\
        --out benchmarks/results/signal_density.json

Timings are on whatever shares the machine: the load average is recorded.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

#: Amazon-670K's shape (as benchmarks/run_memory.py).
SHAPE_670K = dict(num_labels=670_091, num_features=135_909,
                  labels_per_instance=5.45, features_per_instance=76.0)

#: The dense-signal stand-in for a zero of g.
TINY = 1e-20


def signal_density(g) -> tuple[float, float]:
    """``(non-zero fraction of g, fraction of columns of g with a
    non-zero)`` of a ``[b, m]`` signal (tensor or array)."""
    g = np.asarray(g)
    nz = g != 0
    return float(nz.mean()), float(nz.any(axis=0).mean())


def dense_signal(g):
    """``g`` with every zero replaced by :data:`TINY` (no entry to skip)."""
    import tensorflow as tf
    return tf.where(tf.equal(g, 0), tf.constant(TINY, g.dtype), g)


def output_signal(model, layer, x, y, training=True):
    """``(g, h)`` of one batch: ``g`` = gradient of ``model.loss(y,
    scores)`` w.r.t. ``layer``'s output, ``h`` = ``layer``'s input."""
    import keras
    import tensorflow as tf
    sub = keras.Model(model.inputs,
                      [layer.input, layer.output, model.outputs[0]])
    with tf.GradientTape() as tape:
        h, z, scores = sub(x, training=training)
        loss = model.loss(y, scores)
    return tape.gradient(loss, z), h


def _time_backward(lib, g, h, indices, weights, repeats: int):
    """Median seconds of ``xmc_uniform_sparse_matmul_grad`` on ``g`` and on
    its dense stand-in, alternating, after a warm-up of each."""
    gd = dense_signal(g)
    times = {"real": [], "dense": []}

    def call(sig):
        gf, gw = lib.xmc_uniform_sparse_matmul_grad(
            backward=sig, features=h, indices=indices, weights=weights)
        float(gf[0, 0]), float(gw[0, 0])  # completion

    call(g), call(gd)
    for _ in range(repeats):
        for name, sig in (("real", g), ("dense", gd)):
            t = time.perf_counter()
            call(sig)
            times[name].append(time.perf_counter() - t)
    return statistics.median(times["real"]), statistics.median(times["dense"])


@contextlib.contextmanager
def capture_train_stream(store: dict):
    """Records the training stream the job makes (``store["train_ds"]``)
    by wrapping ``xmc_tf.job.fit.make_datasets``."""
    from xmc_tf.job import fit as xfit
    original = xfit.make_datasets

    def wrapped(*args, **kwargs):
        train_ds, val_ds = original(*args, **kwargs)
        store["train_ds"] = train_ds
        return train_ds, val_ds

    xfit.make_datasets = wrapped
    try:
        yield store
    finally:
        xfit.make_datasets = original


def _load_average():
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def _measure_point(model, layer, batches, repeats):
    """Density and backward times on the sample batches, now."""
    import keras
    from xmc_tf.ops import _loader
    lib = _loader.load()
    indices = layer.indices
    scale = float(getattr(layer, "kernel_scale", 1.0))
    rows = []
    for x, y in batches:
        g, h = output_signal(model, layer, x, y)
        h = h * scale if scale != 1.0 else h
        weights = keras.ops.cast(layer.kernel, h.dtype)
        nz, cols = signal_density(g)
        t_real, t_dense = _time_backward(lib, g, h, indices, weights, repeats)
        rows.append((nz, cols, t_real, t_dense))
    a = np.array(rows)
    return dict(nonzero_fraction=float(a[:, 0].mean()),
                labels_with_signal=float(a[:, 1].mean()),
                backward_ms_real=1e3 * float(a[:, 2].mean()),
                backward_ms_dense=1e3 * float(a[:, 3].mean()),
                per_batch=[dict(nonzero_fraction=r[0], labels_with_signal=r[1],
                                backward_ms_real=1e3 * r[2],
                                backward_ms_dense=1e3 * r[3]) for r in rows],
                load_average=_load_average())


def make_callback(store: dict, num_batches: int, repeats: int, log=print,
                  on_point=None):
    """The Keras callback measuring at train begin and every epoch end
    (rows in ``store["points"]``; ``on_point()`` after each, e.g. to save
    what a killed run has measured)."""
    import keras
    from xmc_tf import decoding

    class DensityCallback(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.layer = decoding.scoring_layer(self.model)
            self.batches = list(store["train_ds"].take(num_batches))
            store["steps_per_epoch"] = self.params.get("steps")
            store["fan_in"] = int(self.layer.indices.shape[1])
            store["points"] = []
            self._point(0, None, None)

        def on_epoch_begin(self, epoch, logs=None):
            self.t0, self.val_s = time.perf_counter(), 0.0

        def on_test_begin(self, logs=None):
            self.tv = time.perf_counter()

        def on_test_end(self, logs=None):
            self.val_s += time.perf_counter() - self.tv

        def on_epoch_end(self, epoch, logs=None):
            epoch_s = time.perf_counter() - self.t0 - self.val_s
            self._point(epoch + 1, epoch_s, self.val_s)

        def _point(self, epoch, epoch_s, val_s):
            t = time.perf_counter()
            p = _measure_point(self.model, self.layer, self.batches, repeats)
            p.update(epoch=epoch, epoch_s=epoch_s, validation_s=val_s,
                     measure_s=time.perf_counter() - t)
            store["points"].append(p)
            if on_point is not None:
                on_point()
            log(f"  epoch {epoch}: non-zero {p['nonzero_fraction']:.4%}, "
                f"labels with signal {p['labels_with_signal']:.2%}, "
                f"backward {p['backward_ms_real']:.2f} vs "
                f"{p['backward_ms_dense']:.2f} ms"
                + (f", epoch {epoch_s:.1f} s" if epoch_s else ""),
                flush=True)

    return DensityCallback()


def load_data(name: str, args):
    """The training :class:`xmc_tf.data.XCDataset` of ``name``."""
    from xmc_tf import data as xdata
    if name == "bibtex":
        return xdata.load_dataset("bibtex:train")
    if name == "wordnet":
        ds = xdata.read_xc(os.path.join(args.shared, "WordNetHypernyms",
                                        "train.txt.gz"), progress=False)
        if args.wordnet_train and args.wordnet_train < ds.num_instances:
            rows = np.random.default_rng(0).permutation(
                ds.num_instances)[:args.wordnet_train]
            rows.sort()
            ds = xdata.XCDataset(ds.features[rows], ds.labels[rows])
        return ds
    if name == "670k":
        return xdata.make_synthetic(
            args.train_670k, SHAPE_670K["num_features"],
            SHAPE_670K["num_labels"],
            labels_per_instance=SHAPE_670K["labels_per_instance"],
            features_per_instance=SHAPE_670K["features_per_instance"], seed=0)
    raise ValueError(f"unknown data set {name!r}")


def _result(name, train, epochs, store, args, t0, complete):
    """The data set's result dict from the callback's ``store``."""
    points = [dict(p) for p in store.get("points", [])]
    steps = store.get("steps_per_epoch")
    for prev, p in zip(points, points[1:]):
        saved_ms = 0.5 * ((prev["backward_ms_dense"] - prev["backward_ms_real"])
                          + (p["backward_ms_dense"] - p["backward_ms_real"]))
        p["saved_ms_per_step"] = saved_ms
        p["saved_s_per_epoch"] = saved_ms * steps / 1e3
    return dict(dataset=name, num_instances=train.num_instances,
                num_features=train.num_features, num_labels=train.num_labels,
                epochs=epochs, epochs_run=max(len(points) - 1, 0),
                complete=complete, steps_per_epoch=steps,
                fan_in=store.get("fan_in"), batch_size=64,
                sample_batches=args.sample_batches, repeats=args.repeats,
                job_s=time.perf_counter() - t0, points=points)


def run_dataset(name: str, epochs: int, args, save=None) -> dict:
    """Trains the default model on ``name`` for ``epochs`` epochs with the
    callback; returns the data set's result dict (``save(result)`` with
    the partial one after every measurement)."""
    import xmc_tf
    train = load_data(name, args)
    print(f"{name}: {train.num_instances} instances, {train.num_features} "
          f"features, {train.num_labels} labels, {epochs} epochs", flush=True)
    store = {}
    overrides = {"train.epochs": epochs, "data.train": "", "data.test": "", "tree.enabled": False,
                 "train.verbose": 2, "seed": args.seed}
    t0 = time.perf_counter()

    def on_point():
        if save is not None:
            save(_result(name, train, epochs, store, args, t0, False))

    with tempfile.TemporaryDirectory(prefix="xmc-density-") as wd, \
            capture_train_stream(store):
        clf = xmc_tf.ExtremeClassifier(
            "uniform_sparse", overrides=overrides, workdir=wd,
            callbacks=[make_callback(store, args.sample_batches,
                                     args.repeats, on_point=on_point)])
        clf.fit_datasets(train)
    return _result(name, train, epochs, store, args, t0, True)


def table(results: list[dict]) -> str:
    head = ("| data set | epoch | non-zero fraction | labels with signal | "
            "backward ms real | backward ms dense signal | saved s/epoch | "
            "epoch s |")
    lines = [head, "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for p in r["points"]:
            saved = p.get("saved_s_per_epoch")
            lines.append(
                f"| {r['dataset']} ({r['num_labels']:,} labels, "
                f"{r['num_instances']:,} inst.) | {p['epoch']} | "
                f"{100 * p['nonzero_fraction']:.2f}% | "
                f"{100 * p['labels_with_signal']:.1f}% | "
                f"{p['backward_ms_real']:.2f} | {p['backward_ms_dense']:.2f} | "
                + (f"{saved:.2f}" if saved is not None else "-") + " | "
                + (f"{p['epoch_s']:.1f}" if p["epoch_s"] else "-") + " |")
    return "\n".join(lines)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", default="bibtex,wordnet,670k")
    p.add_argument("--epochs", default="bibtex=5,wordnet=5,670k=3",
                   help="per data set, NAME=EPOCHS[,...]")
    p.add_argument("--shared", default=os.path.join(ROOT, "..", "shared",
                                                    "data"))
    p.add_argument("--wordnet-train", type=int, default=20_000)
    p.add_argument("--train-670k", type=int, default=20_000)
    p.add_argument("--sample-batches", type=int, default=8)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=os.path.join(
        ROOT, "benchmarks", "results", "signal_density.json"))
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    epochs = dict((k, int(v)) for k, v in
                  (kv.split("=") for kv in args.epochs.split(",")))
    results = []

    def save(partial=None):
        if not args.out:
            return
        import tensorflow as tf
        now = results + ([partial] if partial else [])
        names = {r["dataset"] for r in now}
        old = []
        if os.path.exists(args.out):
            with open(args.out) as f:
                old = [r for r in json.load(f).get("results", [])
                       if r["dataset"] not in names]
        doc = dict(machine=dict(platform=platform.platform(),
                                cpus=os.cpu_count(),
                                tensorflow=tf.__version__),
                   results=old + now)
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out + ".tmp", "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(args.out + ".tmp", args.out)

    for name in args.datasets.split(","):
        results.append(run_dataset(name, epochs.get(name, 5), args, save))
        save()
    print(table(results))
    if args.out:
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
