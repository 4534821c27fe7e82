"""What ``tf.distribute.MirroredStrategy`` costs on one CPU machine, ours
against a stock Keras head.

What it measures
----------------
One small multi-label problem (``make_synthetic``: ``--rows`` instances,
2,000 features, 500 labels, tf-idf rows), one model (sparse input, a
64-unit ReLU ``Dense``, then a head), batch 256, Adam.  Each case runs in a
fresh interpreter (logical devices must be set before TensorFlow starts):

* ``strategy``: ``none`` (the default strategy, one device) or
  ``mirrored`` (``MirroredStrategy`` over two logical CPUs of the one
  physical CPU, so both replicas share its cores);
* ``head``: ``uniform_sparse`` (``UniformSparseDense(500, 16)`` and the
  squared hinge), ``dense`` (a stock ``keras.layers.Dense(500)`` with the
  same loss: the strategy's own cost without any op of ours) or
  ``sampled`` (``SampledTrainer`` over a ``LabelDense`` head with 32
  uniform negatives);
* ``input``: ``arrays`` (scipy CSR features and labels given to ``fit``:
  Keras' own adapter) or ``tf_data`` (:func:`xmc_tf.data.make_tf_dataset`).

A model under ``mirrored`` is a :class:`xmc_tf.models.DistributedModel`
(a trainer lists the mixin already).  The seconds are those of
``--epochs`` epochs after a first, traced epoch; each case's ratio is its
time over the same head and input without a strategy.

Usage::

    python benchmarks/mirrored.py --out benchmarks/results/mirrored.json

Output: a line per case on stdout and the JSON of ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CASE = r"""
import json, sys, time
import tensorflow as tf
strategy_name, head, input_form, rows, epochs = sys.argv[1:6]
rows, epochs = int(rows), int(epochs)
if strategy_name == "mirrored":
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
import xmc_tf
from xmc_tf import data as xdata

data = xdata.make_synthetic(rows, 2000, 500, labels_per_instance=3, seed=0)
x, _ = xdata.normalize_features(data.features, "tfidf")
strategy = (tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
            if strategy_name == "mirrored" else tf.distribute.get_strategy())
keras.utils.set_random_seed(0)
with strategy.scope():
    inputs = keras.Input((2000,), sparse=True)
    hidden = keras.layers.Dense(64, activation="relu")(inputs)
    if head == "uniform_sparse":
        scores = xmc_tf.layers.UniformSparseDense(500, 16)(hidden)
    elif head == "dense":
        scores = keras.layers.Dense(500)(hidden)
    else:
        scores = xmc_tf.layers.LabelDense(500)(hidden)
    if head == "sampled":
        model = xmc_tf.models.SampledTrainer(
            keras.Model(inputs, scores),
            xmc_tf.samplers.UniformNegativeSampler(500, 32))
        model.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1)])
    else:
        cls = (xmc_tf.models.DistributedModel if strategy_name == "mirrored"
               else keras.Model)
        model = cls(inputs, scores)
        model.compile("adam", loss=xmc_tf.losses.SquaredHinge(),
                      metrics=[xmc_tf.metrics.PrecisionAtK(1)],
                      jit_compile=False)
if input_form == "tf_data":
    fit_args = (xdata.make_tf_dataset(xdata.XCDataset(x, data.labels), 256),)
    fit_kwargs = {}
else:
    fit_args, fit_kwargs = (x, data.labels), {"batch_size": 256}
model.fit(*fit_args, epochs=1, verbose=0, **fit_kwargs)  # traced
start = time.perf_counter()
history = model.fit(*fit_args, epochs=epochs, verbose=0, **fit_kwargs)
seconds = time.perf_counter() - start
print("RESULT " + json.dumps({
    "seconds": seconds, "replicas": strategy.num_replicas_in_sync,
    "train_precision_at_1": float(history.history["precision_at_1"][-1])}))
"""


def run_case(strategy: str, head: str, input_form: str, rows: int,
             epochs: int) -> dict:
    """One case in a fresh interpreter: ``{"seconds", "replicas",
    "train_precision_at_1"}``.

    Raises:
      RuntimeError: the case's interpreter failed (its output's tail).
    """
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _CASE, strategy, head,
                           input_form, str(rows), str(epochs)],
                          capture_output=True, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise RuntimeError(f"{strategy}/{head}/{input_form} failed:\n"
                       + (proc.stdout + proc.stderr)[-3000:])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=8000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    results = []
    for head in ("uniform_sparse", "dense", "sampled"):
        for input_form in ("arrays", "tf_data"):
            if head == "sampled" and input_form == "tf_data":
                continue  # a trainer takes what fit takes; arrays suffice
            base = None
            for strategy in ("none", "mirrored"):
                r = run_case(strategy, head, input_form, args.rows,
                             args.epochs)
                r.update(strategy=strategy, head=head, input=input_form)
                base = r["seconds"] if strategy == "none" else base
                r["ratio_to_one_device"] = r["seconds"] / base
                results.append(r)
                print(f"{head:15s} {input_form:8s} {strategy:9s} "
                      f"{r['seconds']:6.2f} s  x{r['ratio_to_one_device']:.2f}"
                      f"  train P@1 {r['train_precision_at_1']:.3f}",
                      flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": args.rows, "epochs": args.epochs,
                       "cpu_count": os.cpu_count(),
                       "load_average": os.getloadavg(),
                       "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
