"""Sampled training benchmark: full heads vs sampled softmax vs sampled heads.

What it measures
----------------
Every method trains the same model on the same batches (``make_tf_dataset``,
seed 0) for the same number of epochs, one ``nice -n 5`` process per run, so
that the peak RSS is the method's own:

* ``full_softmax``: ``configs/dense.py`` with ``loss="softmax"`` (a
  ``keras.layers.Dense`` head scoring all m labels per row,
  :class:`xmc_tf.losses.SoftmaxCrossentropy`);
* ``full_squared_hinge``: ``configs/dense.py`` (one-vs-all squared hinge over
  all m labels);
* ``tf_sampled_softmax``: ``tf.nn.sampled_softmax_loss`` with its
  log-uniform sampler, ``--num-sampled`` classes per step shared by the
  batch, over a label-major :class:`xmc_tf.layers.LabelDense` head
  (``benchmarks/baselines.py``; what a TensorFlow user writes);
* ``uniform``: ``configs/astra.py`` with ``sampler.kind="uniform"``
  (its ``num_negatives`` = 256 uniform negatives per instance, squared
  hinge with the ``(m - |P|) / k`` importance weights);
* ``astra``: ``configs/astra.py`` (stale ANN hard negatives from a faiss
  index over the label vectors + uniform negatives, ASTRA Eq. 2 weights,
  squared hinge);
* ``lsh``: ``configs/lsh.py`` (SimHash LSH-embedding negatives, sampled
  softmax with log-Q correction).
* ``uniform_shared``, ``astra_shared``, ``lsh_shared``: the same with
  ``sampler.shared=True`` (one candidate set per batch scored by every row
  in one product; ASTRA / LSH: a pool of the rows' hard negatives and the
  batch's positives scored exactly plus ``num_uniform`` uniform draws, see
  :mod:`xmc_tf.samplers.mixture`); ``pool_uniform_shared``: the shared
  mixture without hard negatives (``num_hard=0``), an ablation;
  ``uniform_shared_2k``: 2,048 shared uniform negatives (about as many labels
  per row as ``lsh_shared`` scores).
* ``lsh_label`` / ``lsh_label_shared``: ``lsh`` / ``lsh_shared`` queried
  with the positive labels' vectors (LSH-label) instead of the instance
  embedding (LSH-embedding).

* ``in_batch``: ``configs/astra.py`` with ``sampler.kind="in_batch"`` (the
  batch's other positives as the candidates, ``num_negatives`` = the batch
  size, sampled softmax with the in-batch log-Q correction).
* ``scent``: ``configs/scent.py`` (SCENT, the batch's classes scored with
  per-instance duals), with the data set's encoder, batch, epochs and
  learning rate and the config's SCENT settings passed explicitly
  (``scent.alpha=1000``, ``correction=log_q``, ``own_term=True``).
* ``omikuji``, ``fasttext``: peers (``benchmarks/peers.py``, their defaults;
  fastText ``loss="hs"``, 5 epochs) on the same training / test files, one
  point each (training seconds, test P@k); ``--peers`` picks them.  They
  need ``pip install xmc_tf[bench]`` (fastText: the ``fasttext-wheel``
  package, if pip cannot install it the row says so).

On multi-class data (``mannextword``, ``debdoc``) every sampled method uses
the sampled softmax (``config.loss=softmax``), the loss of the full model it
is compared with.

Curves (P@k against training seconds)
-------------------------------------
Every ``xmc-tf train`` run goes through this script's worker (the same
``xmc_tf_cli.cli.main``), which adds two callbacks to the job's own
(``xmc_tf.job.fit.make_callbacks``): a clock first in the list and a recorder
last (before the checkpointer).  The recorder adds the seconds since the
previous point (the step work, the head's callbacks: index / table refreshes,
tracing) to the run's *training seconds*, then -- off the clock -- scores
``--curve-test`` random rows of the test file (every label, the head's
decoder) for P@1 / P@5, after every epoch or every ``--eval-every-steps``
steps or ``--eval-every-seconds`` training seconds (then a run's last
point may fall inside an epoch).  A run stops at the first point past ``--budget-seconds`` training
seconds (equal wall-clock) or after ``--epochs`` epochs.  The points are
written to ``curve.json`` of the run and into the result JSON
(``curve``: ``[{"step", "epoch", "train_seconds", "P@1", "P@5"}, ...]``);
the final metrics of the row are those of the job (the whole test file, or
its ``--debdoc-test`` prefix).  ``--plot`` draws, per data set, P@1 and P@5
against training seconds (one line per method, the peers as points) with
matplotlib (``pip install xmc_tf[bench]``).

Equal candidates per step (``--candidates`` C, default 256, batch b = 256):
on multi-class data every method scores one candidate set per batch, shared
by its rows, besides each row's own class.  ``tf_sampled_softmax``: C
log-uniform classes (``num_sampled``); ``uniform``: C uniform classes
(``num_negatives``); ``in_batch`` / ``scent``: the batch's distinct classes
(at most b: these cannot score more without a larger batch; C = b here);
``astra`` / ``lsh``: the shared mixture of ``num_hard=1`` hard negative per
row (ANN index / LSH tables; pooled with the batch's classes, at most 2b)
plus ``num_uniform`` = C / 2 uniform draws.  The labels scored per row are
measured (``scored_per_row``, the heads' ``sampled_fraction`` x m) and
reported next to the P@k.

The sampled heads use ``model.sampled_layer="dense"`` (a ``LabelDense``
with the full heads' parameters), so all methods train the same function
class; evaluation always scores every label.  Every run is an ``xmc-tf
train`` command line (what users run): ``tf_sampled_softmax`` passes it to
``xmc_tf_cli.cli.main`` in a worker process of this script (same parsing, data
loading, batches, callbacks, evaluation and RSS accounting) after
registering a head ``"tf_sampled_softmax"`` whose trainer is
:class:`baselines.TFSampledSoftmaxTrainer`.  The LR-halving and early-stopping
callbacks are disabled (patience 1000), so every method runs all epochs at
its config's learning rate.

Data sets (``--datasets``):

``--network=config`` (with ``--candidates=0``) drops the network, ASTRA
schedule and LSH settings below from the multi-class runs: each method
then trains with its config's own defaults (the multi-class regime's
network: encoder 512, dropout 0.5, batch 256, lr 1e-2; the configs'
sampler settings), what ``xmc-tf train --config=astra`` would run.

* ``mannextword``: ``/work/shared/data/ManNextWord`` (multi-class,
  50,000 classes), a random ``--mnw-train`` (50,000) instance subsample of
  the 400k training file (seed 0, written once to ``--work``), the full
  50k-instance test file, L2-normalised binary features; encoder
  ``SparseEmbeddingBag(128)``, no intermediate layer, no dropout, batch 256,
  ``--mnw-epochs`` (1) epoch, LazyAdam 1e-2 (the rate of
  ``benchmarks/scent.py``'s dev sweep on this data).  ASTRA uses hard
  negatives from the first step (``tau_s = 0``) with the index rebuilt four
  times per epoch (``refresh_every_steps = steps / 4``).
* ``delicious``: the ``xcsplit`` train / test files (983 labels, 19
  labels per instance); encoder 512, no intermediate layer, the configs'
  dropout 0.7, batch 128, ``--delicious-epochs`` (3) epochs, LazyAdam 1e-3.
* ``debdoc``: DebDocNextWord (``--debdoc-dir``, built by
  ``benchmarks/datasets/make_large_class.py``: next-word prediction over
  Debian documentation and dictionaries, 181k classes declared, 4 context
  words x 50k feature words), the first ``--debdoc-train`` (200,000; rows
  are in random order, 114k classes seen) training rows and the first
  ``--debdoc-test`` (20,000) test rows, the ManNextWord model and
  training settings.
* ``synthetic1m``: ``xmc_tf.data.make_synthetic`` with 1,000,000 labels,
  100,000 features, 5 labels and 32 feature tokens per instance; 1,024
  training instances (16 steps of 64) and 256 test instances, encoder 64,
  one epoch: time per step and RSS only (its P@k is meaningless).  ASTRA
  builds its index at the start of epoch 0 here (``refresh_start_epoch=0``)
  so that its steps use hard negatives.

The budgets are small because the machine is (2 cores shared with other
jobs): these are equal-budget comparisons, not converged accuracies.

Reported per run: seconds per epoch (Keras' epoch lines; the first epoch
includes tracing and, for ASTRA/LSH, the index build), seconds per step of
the last epoch, training seconds, peak RSS of the process when training
ended (``VmHWM`` at the last epoch line) and of the whole job (with
evaluation and export; ``metrics.json`` ``peak_memory_bytes``), P@1/3/5 on
the test file, and the mean number of labels scored per row in training
(``sampled_fraction * m`` of the sampled heads).  Methods whose predicted
dense-head memory exceeds ``--max-dense-gib`` are skipped at 1M labels.

Timing: wall clock on a 2-core machine shared with other jobs; runs are
``nice -n 5`` and the load average before/after every run is recorded:
times are upper bounds.

Usage::

    python benchmarks/sampled.py                       # everything
    python benchmarks/sampled.py --datasets delicious --methods uniform,astra
    python benchmarks/sampled.py --datasets synthetic1m --out /tmp/s.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import proc_status_bytes  # noqa: E402  (benchmarks/peers.py)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = "/work/shared/data"
METHODS = ("full_softmax", "full_squared_hinge", "tf_sampled_softmax",
           "uniform", "in_batch", "astra", "lsh", "scent", "lsh_label",
           "uniform_shared", "uniform_shared_2k", "astra_shared",
           "pool_uniform_shared", "lsh_shared", "lsh_label_shared")
PEER_METHODS = ("omikuji", "fasttext")
DATASETS = ("mannextword", "debdoc", "delicious", "synthetic1m")
MULTICLASS = ("mannextword", "debdoc")
GIB = 2**30
NO_SCHEDULE = ["--config.train.lr_patience=1000",
               "--config.train.early_stopping_patience=1000"]
_EPOCH = re.compile(r"^\s*(\d+)/(\d+) - (\d+)s - ([\d.]+)(ms|s)/step")


def _load():
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return None


# ---------------------------------------------------------------------------
# Data.


def _head_rows(src: str, dst: str, n: int) -> None:
    """The first ``n`` instances of the XC file ``src`` (header fixed) to
    ``dst`` (plain text; written once, atomically)."""
    import gzip
    opener = gzip.open if src.endswith(".gz") else open
    with opener(src, "rt") as f:
        total, d, m = map(int, f.readline().split())
        n = min(n, total)
        rows = [f.readline() for _ in range(n)]
    with open(dst + ".tmp", "w") as f:
        f.write(f"{n} {d} {m}\n")
        f.writelines(rows)
    os.replace(dst + ".tmp", dst)


def prepare(dataset: str, args) -> dict:
    """Paths and model/training overrides of a data set (files written once).

    Returns:
      ``{"train": path, "test": path, "num_labels": m, "overrides": [...],
      "astra": [...]}`` (``astra``: extra overrides of the ASTRA run).
    """
    from xmc_tf import data as xdata
    work = os.path.join(args.work, "data")
    # One short epoch: ASTRA's hard negatives from the start, index rebuilt
    # four times per epoch (tau_s = 0, tau_r = steps / 4).
    steps = -(-args.mnw_train // 256)
    astra_early = ["--config.sampler.refresh_start_epoch=0",
                   f"--config.sampler.refresh_every_steps={max(1, steps // 4)}"]
    os.makedirs(work, exist_ok=True)
    multiclass = ["--config.model.encoder_dims=(128,)",
                  "--config.model.intermediate_dim=0",
                  "--config.model.dropout=0.0",
                  "--config.train.batch_size=256",
                  "--config.train.learning_rate=0.01",
                  "--config.data.normalize=l2"]
    if args.network == "config":  # each config's own (regime) defaults
        multiclass, astra_early = [], []
    if dataset == "debdoc":
        paths = {}
        for part, n in (("train", args.debdoc_train),
                        ("test", args.debdoc_test)):
            paths[part] = os.path.join(work, f"debdoc_{part}_{n}.txt")
            if not os.path.exists(paths[part]):
                _head_rows(os.path.join(args.debdoc_dir, f"{part}.txt.gz"),
                           paths[part], n)
        with open(paths["train"]) as f:
            n_train, _, m = map(int, f.readline().split())
        steps = -(-n_train // 256)
        return {**paths, "dim_batch": (128, 256), "num_labels": m,
                "num_train": n_train,
                "overrides": multiclass + [
                    f"--config.train.epochs={args.epochs or 1}"],
                "sampled_loss": "softmax",
                "astra": ["--config.sampler.refresh_start_epoch=0",
                          "--config.sampler.refresh_every_steps="
                          f"{max(1, steps // 4)}"]
                if args.network == "bench" else []}
    if dataset == "mannextword":
        path = os.path.join(work, f"mnw_train_{args.mnw_train}.txt")
        if not os.path.exists(path):
            full = xdata.load_dataset(os.path.join(DATA, "ManNextWord",
                                                   "train.txt.gz"))
            rows = np.sort(np.random.default_rng(0).choice(
                full.num_instances, args.mnw_train, replace=False))
            xdata.write_xc(path + ".tmp", xdata.XCDataset(
                full.features[rows], full.labels[rows]))
            os.replace(path + ".tmp", path)
        return {"train": path, "dim_batch": (128, 256),
                "test": os.path.join(DATA, "ManNextWord", "test.txt.gz"),
                "num_labels": 50_000, "num_train": args.mnw_train,
                "overrides": multiclass + [
                    f"--config.train.epochs={args.epochs or args.mnw_epochs}"],
                "sampled_loss": "softmax",
                "astra": astra_early}
    if dataset == "delicious":
        xc = os.path.join(DATA, "Delicious", "xc")
        return {"train": os.path.join(xc, "delicious_xcsplit_train.txt.gz"),
                "test": os.path.join(xc, "delicious_xcsplit_test.txt.gz"),
                "num_labels": 983, "num_train": 12_920, "dim_batch": (512, 128),
                "overrides": ["--config.model.encoder_dims=(512,)",
                              "--config.model.intermediate_dim=0",
                              "--config.train.batch_size=128",
                              f"--config.train.epochs={args.delicious_epochs}"],
                "astra": []}
    if dataset == "synthetic1m":
        n_train, n_test = 1024, 256
        paths = {k: os.path.join(work, f"syn1m_{k}.txt")
                 for k in ("train", "test")}
        if not all(os.path.exists(p) for p in paths.values()):
            ds = xdata.make_synthetic(n_train + n_test, 100_000, 1_000_000,
                                      labels_per_instance=5.0,
                                      features_per_instance=32.0, seed=0)
            for part, rows in (("train", slice(0, n_train)),
                               ("test", slice(n_train, None))):
                xdata.write_xc(paths[part] + ".tmp", xdata.XCDataset(
                    ds.features[rows], ds.labels[rows]))
                os.replace(paths[part] + ".tmp", paths[part])
        return {**paths, "num_labels": 1_000_000, "num_train": n_train,
                "dim_batch": (64, 64),
                "overrides": ["--config.model.encoder_dims=(64,)",
                              "--config.model.intermediate_dim=0",
                              "--config.model.dropout=0.0",
                              "--config.train.batch_size=64",
                              "--config.train.epochs=1",
                              "--config.eval.batch_size=64"],
                "astra": ["--config.sampler.refresh_start_epoch=0"]}
    raise ValueError(f"unknown data set {dataset!r}; expected {DATASETS}")


# ---------------------------------------------------------------------------
# Runs.


def method_command(method: str, spec: dict, workdir: str, args) -> list[str]:
    """The command line of one run: ``xmc-tf train`` arguments run by this
    script's worker (``xmc_tf_cli.cli.main`` with the curve recorder, and the
    ``tf_sampled_softmax`` head registered)."""
    cfg = {"full_softmax": "dense", "full_squared_hinge": "dense",
           "tf_sampled_softmax": "astra", "scent": "scent"}.get(
               method, "lsh" if method.startswith("lsh") else "astra")
    over = ["--config.data.validation_fraction=0",
            f"--config.data.train={spec['train']}",
            f"--config.data.test={spec['test']}",
            "--config.train.verbose=2"] + NO_SCHEDULE + spec["overrides"]
    if method == "full_softmax":
        over.append("--config.loss=softmax")
    sampled = method in ("uniform", "astra", "uniform_shared", "astra_shared",
                         "pool_uniform_shared", "uniform_shared_2k",
                         "in_batch")
    if sampled or method.startswith("lsh") or method == "tf_sampled_softmax":
        over.append("--config.model.sampled_layer=dense")
    if sampled and spec.get("sampled_loss"):
        over.append(f"--config.loss={spec['sampled_loss']}")
    if method.startswith("uniform"):
        over.append("--config.sampler.kind=uniform")
    if method.endswith("_shared") or method == "uniform_shared_2k":
        over.append("--config.sampler.shared=True")
    if method == "uniform_shared_2k":
        over.append("--config.sampler.num_negatives=2048")
    if method.startswith("lsh_label"):
        over.append("--config.sampler.query=label")
    if method.startswith("astra") or method == "pool_uniform_shared":
        over += spec["astra"]
    if method == "pool_uniform_shared":
        over.append("--config.sampler.num_hard=0")
    if method == "in_batch":
        over += ["--config.sampler.kind=in_batch",
                 f"--config.sampler.num_negatives={spec['dim_batch'][1]}"]
    if method == "scent":  # the config's SCENT settings, explicitly
        over += ["--config.scent.variant=scent", "--config.scent.alpha=1000",
                 "--config.scent.correction=log_q",
                 "--config.scent.own_term=True",
                 "--config.scent.negatives=multiset"]
    if dataset_is_multiclass(spec) and args.candidates:
        c = int(args.candidates)
        if method in ("uniform", "uniform_shared"):
            over.append(f"--config.sampler.num_negatives={c}")
        if method in ("astra", "lsh", "astra_shared", "lsh_shared"):
            over += ["--config.sampler.num_hard=1",
                     f"--config.sampler.num_uniform={max(1, c // 2)}"]
    if method.startswith("lsh") and args.network == "bench":
        # the sampler's settings, explicitly
        over += ["--config.sampler.hash=simhash", "--config.sampler.K=0",
                 "--config.sampler.L=50",
                 "--config.sampler.rehash_every_steps=50",
                 "--config.sampler.rehash_decay=0.95"]
    if method.startswith("astra"):
        over += ["--config.sampler.index=auto", "--config.sampler.nprobe=16"]
    if method == "tf_sampled_softmax":
        over += ["--config.model.head=tf_sampled_softmax",
                 "--config.loss=softmax", "--config.set.enabled=False",
                 "--config.sampler.num_negatives="
                 f"{args.candidates or args.num_sampled}"]
    train = ["train", f"--config={os.path.join(ROOT, 'configs', cfg)}.py",
             f"--workdir={workdir}", "--overwrite"] + over
    curve = [f"--curve-out={workdir}.curve.json",
             f"--curve-test={args.curve_test}",
             f"--budget-seconds={args.budget_seconds}",
             f"--eval-every-steps={args.eval_every_steps}",
             f"--eval-every-seconds={args.eval_every_seconds}"]
    return (["nice", "-n", "5", sys.executable, os.path.abspath(__file__),
             "--worker"] + curve + train)


def dataset_is_multiclass(spec: dict) -> bool:
    """Whether the run's data set is multi-class (its sampled loss is the
    softmax)."""
    return spec.get("sampled_loss") == "softmax"


def epoch_entry(match) -> dict:
    """Steps, seconds and seconds per step of a Keras epoch line (Keras
    prints whole seconds per step from 1 s on: then epoch seconds / steps).
    """
    steps, seconds = int(match.group(2)), int(match.group(3))
    step = float(match.group(4))
    step = step / 1000 if match.group(5) == "ms" else seconds / steps
    return {"steps": steps, "seconds": seconds, "step_seconds": round(step, 4)}


def run(method: str, dataset: str, spec: dict, args) -> dict:
    """One training process; returns its row of the table."""
    workdir = os.path.join(args.work, "runs", f"{dataset}_{method}")
    cmd = method_command(method, spec, workdir, args)
    log_path = workdir + ".log"
    os.makedirs(os.path.dirname(workdir), exist_ok=True)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    row = {"dataset": dataset, "method": method,
           "num_labels": spec["num_labels"], "num_train": spec["num_train"],
           "load_before": _load(), "command": " ".join(cmd)}
    epochs, train_peak = [], None
    start = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=ROOT)
        timer = threading.Timer(args.timeout, proc.kill)
        timer.start()
        for line in proc.stdout:
            log.write(line)
            m = _EPOCH.match(line)
            if m:
                train_peak = proc_status_bytes(proc.pid)
                epochs.append(epoch_entry(m))
        rc = proc.wait()
        timer.cancel()
    if rc != 0 and time.perf_counter() - start >= args.timeout:
        row["timed_out"] = args.timeout
    row.update(returncode=rc, wall_seconds=round(time.perf_counter() - start,
                                                 1),
               load_after=_load(), epochs=epochs, train_peak_bytes=train_peak,
               log=log_path)
    if epochs:
        row["s_per_epoch"] = [e["seconds"] for e in epochs]
        row["step_seconds_last"] = epochs[-1]["step_seconds"]
    if rc != 0:
        with open(log_path) as f:
            row["error"] = f.read()[-3000:]
        print(f"  {method} failed (exit {rc}); see {log_path}", flush=True)
        return row
    with open(os.path.join(workdir, "metrics.json")) as f:
        metrics = json.load(f)
    for key in ("P@1", "P@3", "P@5", "train_seconds", "peak_memory_bytes",
                "output_layer_bytes", "model_bytes", "sampler",
                "num_test_instances"):
        if key in metrics:
            row[key] = metrics[key]
    hist = os.path.join(workdir, "history.csv")
    if os.path.exists(hist):
        with open(hist) as f:
            rows = list(csv.DictReader(f))
        if rows and rows[-1].get("sampled_fraction"):
            row["scored_per_row"] = round(float(rows[-1]["sampled_fraction"]) *
                                          spec["num_labels"], 1)
        if rows and rows[-1].get("loss"):
            row["final_loss"] = float(rows[-1]["loss"])
    if method == "tf_sampled_softmax":  # its trainer logs no fraction
        row["scored_per_row"] = 1 + (args.candidates or args.num_sampled)
    if os.path.exists(workdir + ".curve.json"):
        with open(workdir + ".curve.json") as f:
            row["curve"] = json.load(f)
        os.remove(workdir + ".curve.json")
    if not args.keep_workdirs:
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def run_peer(method: str, dataset: str, spec: dict, args) -> dict:
    """One peer (Omikuji / fastText of ``benchmarks/peers.py``) on the
    run's files: its training seconds and test P@k, one point."""
    import peers
    from xmc_tf import data as xdata
    from xmc_tf.job import preprocessing as xprep
    row = {"dataset": dataset, "method": method, "peer": True,
           "num_labels": spec["num_labels"], "num_train": spec["num_train"],
           "load_before": _load()}
    try:
        if method == "fasttext":
            import fasttext  # noqa: F401  (pip install fasttext-wheel)
        else:
            import omikuji  # noqa: F401
    except ImportError as e:
        row.update(returncode=None, error=f"not installed: {e}")
        print(f"  {method}: {row['error']}", flush=True)
        return row
    train = xdata.load_dataset(spec["train"])
    test = xdata.load_dataset(spec["test"])
    norm = xprep.fit_normalization("l2", train)
    train, test = xprep.normalize(train, norm), xprep.normalize(test, norm)
    start = time.perf_counter()
    res = peers.PEERS[method](train, test, threads=os.cpu_count() or 2,
                              train_path=spec["train"])
    row.update(returncode=0, wall_seconds=round(time.perf_counter() - start,
                                                1),
               load_after=_load(), label=res["method"],
               train_seconds=round(res["train_s"], 2),
               **{k: res[k] for k in ("P@1", "P@3", "P@5") if k in res})
    return row


def predicted_dense_gib(spec: dict, dim: int = 128, batch: int = 256) -> float:
    """Rough peak of a dense head: kernel + dense gradient + 2 Adam slots
    (4 x m x d float32) and ~6 [batch, m] float32 activations, + 1 GiB."""
    m = spec["num_labels"]
    return (4 * m * dim * 4 + 6 * batch * m * 4) / GIB + 1.0


def available_gib():
    """``MemAvailable`` of ``/proc/meminfo`` (GiB), None if unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024 / GIB
    except OSError:
        return None
    return None


# ---------------------------------------------------------------------------
# Worker: tf.nn.sampled_softmax_loss through xmc_tf.job.run.


def worker(argv):
    """``--worker xmc-tf-args...``: ``xmc-tf train`` (``xmc_tf_cli.cli.main``)
    with a head ``"tf_sampled_softmax"`` registered first, whose trainer is
    :class:`baselines.TFSampledSoftmaxTrainer` over the sampled head's
    ``LabelDense`` layer; ``config.sampler.num_negatives`` classes per step.

    Returns:
      The CLI's exit status.
    """
    from xmc_tf_cli import cli
    from xmc_tf.job import heads as xheads
    from xmc_tf.job.heads.base import Head
    from xmc_tf.job.heads.sampled import SampledHead
    sys.path.insert(0, HERE)
    from baselines import TFSampledSoftmaxTrainer

    @xheads.register
    class TFSampledSoftmaxHead(SampledHead):  # pylint: disable=unused-variable
        """A LabelDense head trained by ``tf.nn.sampled_softmax_loss``."""

        name = "tf_sampled_softmax"
        losses = ("softmax",)

        def training_model(self, model, layer):
            return TFSampledSoftmaxTrainer(
                model, self.config.sampler.num_negatives,
                seed=self.config.seed, name=f"{model.name}_trainer")

        def callbacks(self, layer, val_data):
            return Head.callbacks(self, layer, val_data)

        def results(self, layer):
            return {"sampler": "log_uniform_candidate_sampler(num_sampled="
                               f"{self.config.sampler.num_negatives})"}

    curve_opts, rest = {}, []
    for a in argv:
        if a.startswith(("--curve-out=", "--curve-test=", "--budget-seconds=",
                         "--eval-every-steps=", "--eval-every-seconds=")):
            key, value = a[2:].split("=", 1)
            curve_opts[key.replace("-", "_")] = value
        elif a != "--worker":
            rest.append(a)
    if curve_opts.get("curve_out"):
        install_curve(curve_opts["curve_out"],
                      int(curve_opts.get("curve_test", 10_000)),
                      float(curve_opts.get("budget_seconds", 0) or 0),
                      int(curve_opts.get("eval_every_steps", 0) or 0),
                      float(curve_opts.get("eval_every_seconds", 0) or 0))
    return cli.main(["xmc-tf"] + rest)


def install_curve(out: str, test_rows: int, budget: float,
                  every_steps: int, every_seconds: float = 0.0) -> None:
    """Adds the curve clock (first) and recorder (last) to the callbacks
    of ``xmc_tf.job.fit.make_callbacks`` in this process (see the module
    docstring, "Curves").

    Args:
      out: JSON file of the points (rewritten at every point).
      test_rows: random rows of the test file scored at every point.
      budget: training seconds after which the run stops (0: none).
      every_steps: a point every this many steps (0: every epoch).
      every_seconds: a point every this many training seconds (0: every
        epoch; with ``every_steps``, whichever comes first).
    """
    import keras
    from xmc_tf import data as xdata
    from xmc_tf.job import preprocessing as xprep
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import inputs as xinputs
    from xmc_tf import decoding
    from xmc_tf.callbacks import TopKEvaluation

    state = {}
    prepare_splits = xinputs.prepare_splits
    make_callbacks = xfit.make_callbacks

    def prepare_splits_hook(config, train, workdir):
        fit, val, norm = prepare_splits(config, train, workdir)
        state["norm"] = norm
        return fit, val, norm

    class Clock(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            state["t0"] = time.perf_counter()

    class Recorder(keras.callbacks.Callback):
        def __init__(self, head, config):
            super().__init__()
            test = xdata.load_dataset(config.data.test)
            if test.num_instances > test_rows:
                rows = np.sort(np.random.default_rng(0).choice(
                    test.num_instances, test_rows, replace=False))
                test = xinputs.subset(test, rows)
            test = xprep.normalize(test, state["norm"])
            self.eval = TopKEvaluation(test, ks=(1, 5), prefix="",
                                       batch_size=config.eval.batch_size,
                                       decoder=decoding.top_k_function)
            self.points, self.seconds, self.step, self.epoch = [], 0.0, 0, 0
            self.stopped = False

        def set_model(self, model):
            super().set_model(model)
            self.eval.set_model(model)

        def point(self):
            self.seconds += time.perf_counter() - state["t0"]
            p = self.eval.evaluate()
            self.points.append({
                "step": self.step, "epoch": self.epoch,
                "train_seconds": round(self.seconds, 2),
                "P@1": round(100 * p["precision_at_1"], 3),
                "P@5": round(100 * p["precision_at_5"], 3)})
            with open(out + ".tmp", "w") as f:
                json.dump(self.points, f)
            os.replace(out + ".tmp", out)
            print(f"curve: {self.points[-1]}", flush=True)
            if budget and self.seconds >= budget:
                self.model.stop_training = self.stopped = True
            state["t0"] = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            self.step += 1
            due = every_steps and self.step % every_steps == 0
            if every_seconds and not due:
                now = self.seconds + time.perf_counter() - state["t0"]
                last = self.points[-1]["train_seconds"] if self.points else 0
                due = now - last >= every_seconds
            if due:
                self.point()

        def on_epoch_end(self, epoch, logs=None):
            self.epoch = epoch + 1
            if not self.stopped and not every_seconds and (
                    not every_steps or self.step % every_steps):
                self.point()

    def make_callbacks_hook(config, workdir, head, layer, val_data,
                            cluster=None):
        cbs = make_callbacks(config, workdir, head, layer, val_data, cluster)
        return [Clock()] + cbs + [Recorder(head, config)]

    xinputs.prepare_splits = prepare_splits_hook
    xfit.make_callbacks = make_callbacks_hook


# ---------------------------------------------------------------------------
# Report.


def _fmt(v, nd=2):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.{nd}f}"
    return str(v)


def table(rows: list[dict]) -> str:
    cols = ["dataset", "method", "s/epoch", "s/step", "train s",
            "train GiB", "job GiB", "scored/row", "P@1", "P@3", "P@5"]
    out = []
    for r in rows:
        if r.get("skipped"):
            out.append([r["dataset"], r["method"], "skipped: " + r["skipped"]]
                       + [""] * 8)
            continue
        if r.get("peer") and r.get("returncode") is None:
            out.append([r["dataset"], r["method"], r.get("error", "")[:60]]
                       + [""] * 8)
            continue
        train_s = (r["curve"][-1]["train_seconds"] if r.get("curve")
                   else r.get("train_seconds"))
        spe = r.get("s_per_epoch") or []
        out.append([
            r["dataset"], r["method"],
            "/".join(str(s) for s in spe) or "-",
            _fmt(r.get("step_seconds_last"), 3), _fmt(train_s, 1),
            _fmt(r["train_peak_bytes"] / GIB if r.get("train_peak_bytes")
                 else None),
            _fmt(r["peak_memory_bytes"] / GIB if r.get("peak_memory_bytes")
                 else None),
            _fmt(r.get("scored_per_row"), 1),
            _fmt(r.get("P@1")), _fmt(r.get("P@3")), _fmt(r.get("P@5"))]
            if r.get("returncode") == 0 else
            [r["dataset"], r["method"],
             f"timed out after {r['timed_out']} s" if r.get("timed_out")
             else f"failed ({r.get('returncode')})"] + [""] * 8)
    widths = [max(len(c), *(len(str(x[i])) for x in out))
              for i, c in enumerate(cols)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(str(x).ljust(w) for x, w in zip(r, widths))
              for r in out]
    return "\n".join(lines)


def at_time(curve: list[dict], seconds: float, key: str = "P@1"):
    """``key`` of the last curve point at or before ``seconds`` of
    training (None if the first point comes later)."""
    best = None
    for point in curve:
        if point["train_seconds"] <= seconds + 1e-9:
            best = point[key]
    return best


def equal_time(rows: list[dict]) -> dict:
    """Per data set, P@1 / P@5 of every curve at the same training seconds:
    the last point by ``t`` = the smallest final training seconds of the
    data set's curves (the longest time every method reached).

    Returns:
      ``{dataset: {"seconds": t, "methods": {method: {"P@1", "P@5",
      "final_seconds"}}}}``.
    """
    out = {}
    for dataset in {r["dataset"] for r in rows}:
        curves = {r["method"]: r["curve"] for r in rows
                  if r["dataset"] == dataset and r.get("curve")}
        if not curves:
            continue
        t = min(c[-1]["train_seconds"] for c in curves.values())
        out[dataset] = {"seconds": t, "methods": {
            m: {"P@1": at_time(c, t), "P@5": at_time(c, t, "P@5"),
                "final_seconds": c[-1]["train_seconds"]}
            for m, c in curves.items()}}
    return out


def equal_time_table(eq: dict) -> str:
    """The :func:`equal_time` summary as text."""
    lines = []
    for dataset, d in sorted(eq.items()):
        lines.append(f"{dataset}: P@1 / P@5 (curve test rows) after "
                     f"{d['seconds']:.0f} s of training")
        for m, v in d["methods"].items():
            lines.append(f"  {m:20s} {_fmt(v['P@1'])} / {_fmt(v['P@5'])}  "
                         f"(curve ends at {v['final_seconds']:.0f} s)")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    """P@1 and P@5 against training seconds, one row of two panels per data
    set: a line per method's curve, a marker per peer (training seconds,
    test P@k)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    datasets = [d for d in DATASETS if any(
        r["dataset"] == d and (r.get("curve") or r.get("peer"))
        for r in rows)]
    if not datasets:
        return
    fig, axes = plt.subplots(len(datasets), 2, squeeze=False,
                             figsize=(11, 4.2 * len(datasets)))
    for i, dataset in enumerate(datasets):
        for j, key in enumerate(("P@1", "P@5")):
            ax = axes[i][j]
            for r in rows:
                if r["dataset"] != dataset:
                    continue
                if r.get("curve"):
                    c = r["curve"]
                    ax.plot([0] + [p["train_seconds"] for p in c],
                            [0] + [p[key] for p in c], marker=".",
                            label=f"{r['method']} "
                                  f"({_fmt(r.get('scored_per_row'), 0)}/row)")
                elif r.get("peer") and r.get(key) is not None:
                    ax.scatter([r["train_seconds"]], [r[key]], marker="*",
                               s=120, zorder=3,
                               label=r.get("label", r["method"]))
            ax.set_title(f"{dataset}: {key} against training seconds")
            ax.set_xlabel("training seconds (2 shared CPU cores)")
            ax.set_ylabel(f"test {key} (%)")
            ax.grid(alpha=0.3)
            if j == 0:
                ax.legend(fontsize=7)
    fig.tight_layout()
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _sort(rows):
    order = {(d, m): i for i, (d, m) in enumerate(
        (d, m) for d in DATASETS for m in PEER_METHODS + METHODS)}
    return sorted(rows, key=lambda r: order.get((r["dataset"], r["method"]),
                                                1e9))


def merge(paths, out):
    """Writes the rows of several result files (later files win) to ``out``
    and prints the table."""
    result = {"machine": {}, "parts": [], "rows": []}
    rows = {}
    for path in paths:
        with open(path) as f:
            part = json.load(f)
        result["parts"].append({"file": os.path.basename(path),
                                "machine": part["machine"],
                                "args": part["args"]})
        for r in part["rows"]:
            rows[(r["dataset"], r["method"])] = r
    result["machine"] = result["parts"][0]["machine"]
    result["rows"] = _sort(rows.values())
    with open(out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(table(result["rows"]))
    print(f"wrote {out}")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        sys.exit(worker(argv[1:]))
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--datasets", default=",".join(DATASETS))
    p.add_argument("--methods", default=",".join(METHODS))
    p.add_argument("--work", default="/tmp/xmc_sampled_bench")
    p.add_argument("--mnw-train", type=int, default=50_000)
    p.add_argument("--mnw-epochs", type=int, default=1)
    p.add_argument("--network", choices=("bench", "config"), default="bench",
                   help="multi-class data sets: 'bench' = the shared small "
                        "network and settings of the module docstring; "
                        "'config' = each config's own defaults (its "
                        "regime's network, ASTRA / LSH sampler settings); "
                        "pair it with --candidates=0")
    p.add_argument("--max-train", type=int, default=None,
                   help="training instances of mannextword and debdoc "
                        "(sets --mnw-train and --debdoc-train)")
    p.add_argument("--debdoc-dir", default="/work/runs/corpus/DebDocNextWord",
                   help="output of benchmarks/datasets/make_large_class.py")
    p.add_argument("--debdoc-train", type=int, default=200_000)
    p.add_argument("--debdoc-test", type=int, default=20_000)
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs of the multi-class runs (default: "
                        "--mnw-epochs; debdoc 1)")
    p.add_argument("--budget-seconds", type=float, default=0,
                   help="stop a run at the first curve point past this many "
                        "training seconds (0: run all epochs)")
    p.add_argument("--eval-every-steps", type=int, default=0,
                   help="a curve point every this many steps (0: per epoch)")
    p.add_argument("--eval-every-seconds", type=float, default=0,
                   help="a curve point every this many training seconds "
                        "(0: per epoch / --eval-every-steps)")
    p.add_argument("--curve-test", type=int, default=10_000,
                   help="test rows scored at every curve point")
    p.add_argument("--candidates", type=int, default=256,
                   help="candidates per step on multi-class data (module "
                        "docstring; 0: each method's config)")
    p.add_argument("--peers", default="",
                   help="comma-separated peers run as points: "
                        + ",".join(PEER_METHODS))
    p.add_argument("--plot", default=os.path.join(HERE, "results",
                                                  "sampled_curves.png"),
                   help="figure of P@1 / P@5 against training seconds "
                        "('' for none; needs matplotlib)")
    p.add_argument("--delicious-epochs", type=int, default=3)
    p.add_argument("--num-sampled", type=int, default=256,
                   help="tf.nn.sampled_softmax_loss classes per step")
    p.add_argument("--max-dense-gib", type=float, default=4.0,
                   help="skip dense heads predicted to need more")
    p.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "sampled.json"))
    p.add_argument("--keep-workdirs", action="store_true")
    p.add_argument("--timeout", type=float, default=900,
                   help="seconds after which a run is killed (recorded)")
    p.add_argument("--merge", nargs="+", default=None, metavar="JSON",
                   help="only merge the rows of these result files into "
                        "--out (runs split over several processes)")
    args = p.parse_args(argv)
    if args.max_train:
        args.mnw_train = args.debdoc_train = args.max_train
    if args.merge:
        return merge(args.merge, args.out)
    methods = [m for m in args.methods.split(",") if m]
    datasets = [d for d in args.datasets.split(",") if d]
    peer_methods = [m for m in args.peers.split(",") if m]
    for m in methods:
        if m not in METHODS:
            p.error(f"unknown method {m!r}; expected {METHODS}")
    for m in peer_methods:
        if m not in PEER_METHODS:
            p.error(f"unknown peer {m!r}; expected {PEER_METHODS}")
    for d in datasets:
        if d not in DATASETS:
            p.error(f"unknown data set {d!r}; expected {DATASETS}")
    if args.plot:
        try:
            import matplotlib  # noqa: F401
        except ImportError:
            p.error("--plot needs matplotlib (pip install xmc_tf[bench]); "
                    "--plot '' draws none")
    import tensorflow as tf
    result = {"machine": {"platform": platform.platform(),
                          "cpus": os.cpu_count(), "tensorflow": tf.__version__,
                          "loadavg_start": _load()},
              "args": vars(args), "rows": []}
    if os.path.exists(args.out):  # keep rows of other data sets / methods
        with open(args.out) as f:
            old = json.load(f)
        result["rows"] = [r for r in old.get("rows", [])
                          if (r["dataset"], r["method"]) not in
                          {(d, m) for d in datasets
                           for m in methods + peer_methods}]
    for dataset in datasets:
        spec = prepare(dataset, args)
        for method in peer_methods:
            print(f"== {dataset} / {method}", flush=True)
            result["rows"].append(run_peer(method, dataset, spec, args))
            print(table([result["rows"][-1]]), flush=True)
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)
        for method in methods:
            print(f"== {dataset} / {method}", flush=True)
            need = predicted_dense_gib(spec, *spec["dim_batch"])
            avail = available_gib()
            if method.startswith("full_") and (
                    need > args.max_dense_gib or
                    (avail is not None and need > avail - 1.0)):
                # The machine is shared: never risk the OOM killer.
                row = {"dataset": dataset, "method": method,
                       "num_labels": spec["num_labels"],
                       "skipped": f"predicted {need:.1f} GiB, limit "
                                  f"{args.max_dense_gib} GiB, available "
                                  f"{avail:.1f} GiB"}
            else:
                row = run(method, dataset, spec, args)
            result["rows"].append(row)
            print(table([row]), flush=True)
            os.makedirs(os.path.dirname(args.out), exist_ok=True)
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=str)
    result["machine"]["loadavg_end"] = _load()
    result["rows"] = _sort(result["rows"])
    print()
    print(table(result["rows"]))
    print(f"\nload average start/end: {result['machine']['loadavg_start']} / "
          f"{result['machine']['loadavg_end']}")
    result["equal_time"] = equal_time(result["rows"])
    print(equal_time_table(result["equal_time"]))
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1, default=str)
    print(f"wrote {args.out}")
    if args.plot:
        plot(result["rows"], args.plot)
        print(f"wrote {args.plot}")


if __name__ == "__main__":
    main()
