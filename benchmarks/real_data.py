"""The default model against the tree peers on every real multi-label set.

What it measures
----------------
On each real multi-label data set of ``../shared/data`` (``--datasets``):

* ``bibtex``: the bundled ``bibtex:train`` / ``bibtex:test`` (the XC-repo
  split, ``Bibtex/xc/bibtex_xcsplit_*``: 4,880 / 2,515 instances, 1,836
  binary features, 159 labels);
* ``delicious``: ``delicious:train`` / ``delicious:test`` when the package
  bundles it, else ``Delicious/xc/delicious_xcsplit_{train,test}.txt.gz``
  of ``--shared`` (the same files: 12,920 / 3,185 instances, 500 binary
  features, 983 labels);
* ``wordnet``: ``WordNetHypernyms/{train,test}.txt.gz`` of ``--shared``
  (61,585 / 20,523 instances, 36,602 tf-idf features, 10,122 labels),

these methods, trained on the train file and tested on the test file:

* ``xmc_tf``: ``configs/uniform_sparse.py`` (``--config``) at its defaults
  (``--set`` overrides), once per seed of ``--seeds`` (``config.seed``:
  initialisation, validation split, batch order), each run
  :func:`xmc_tf.job.run.train_and_evaluate` in a fresh work directory and in
  a process of its own (so that its peak RSS is its own).  A callback
  records after every epoch the wall-clock seconds since training began
  and the epoch's validation P@1 / P@3 (the 10 % validation split of the
  config): the curve "validation P@1 against time";
* ``Omikuji`` 0.5 (Parabel-like trees) and ``napkinXC PLT`` 0.7, their
  defaults (:mod:`peers`), each in a process of its own;
* ``PECOS XR-Linear`` (libpecos 1.2.8): PIFA label features, hierarchical
  k-means (``Indexer.gen``) and ``XLinearModel.train(X, Y, C=...)`` at their
  defaults, as in PECOS' README, run by the interpreter of
  ``--pecos-python`` (libpecos needs numpy<2, TensorFlow's venv numpy 2).

All peers use ``--threads`` threads (default 2) and the features as the
files hold them, except that PECOS gets every row scaled to unit l2 norm
first: Omikuji and napkinXC (``norm=True``) do that to each instance
inside, PECOS does not (on Bibtex's raw binary rows its P@1 was 52.96,
on l2 rows 63.54; WordNetHypernyms' rows are l2 already).  xmc_tf
normalises its own input (``config.data.normalize``: tf-idf for binary
files, l2 rows for tf-idf files).

Reported per data set: test P@1/3/5 and PSP@5 (percent; PSP with the
inverse propensities of the training labels, ``A``/``B`` of
``config.eval.propensity_a/_b``; every method's top-5 scored by the same
:class:`xmc_tf.metrics.XMCEvaluator`), training seconds (wall clock; ours:
``train_seconds`` of the job, i.e. ``fit`` including the validation
passes and checkpoints plus the label tree's fit and the fused scorers'
weights, less the ``--fused-curve`` evaluations this benchmark adds to
every epoch (the job's own figure is ``job_train_s``); not the data
loading, test evaluation or export;
the peers': tree building and training, not loading or prediction), peak
RSS of the method's process (``VmHWM`` of its ``/proc/PID/status``, bytes:
data, model and, for ours, TensorFlow; the job's own
``peak_memory_bytes``, from ``ru_maxrss``, is in the JSON too, but on
Linux ``ru_maxrss`` keeps the peak of the process image before ``exec``,
i.e. of this benchmark, ~0.8 GB with TensorFlow loaded, so it is an upper
bound for small jobs), and for ours the epochs run, the best
validation epoch (highest val P@3, the early-stopping monitor) and when it
ended, "time to Omikuji's P@1" (the first end of an epoch whose
validation P@1 reached Omikuji's test P@1 on that data set, seconds since
training began; None if never), the mean and standard deviation (ddof=1)
over the seeds.  The epoch times of the curve are taken before that
epoch's checkpoint is written, so the last one is a little below
``train_seconds``.

Timing: wall clock on the development machine's 2 CPU cores, usually
shared with other jobs (the load average at start and end is recorded):
upper bounds.

Measured (``results/real_data.json``, seeds 0/1/2, idle 2-core machine;
ours the three-seed mean, test P@1): WordNetHypernyms 65.78 (Omikuji 65.42,
PECOS 65.17, napkinXC 62.00; ours 313 s, Omikuji 5.5 s), Bibtex 64.12
(63.62 / 63.54 / 62.78), Delicious 70.47 (69.01 / 67.60 / 68.95); the
table and the reading are in ``docs/notes/real_data.md``.
Peers on the same files in earlier runs (``../shared/data/README.md``,
2 threads): Bibtex P@1 Omikuji 63.74, napkinXC 62.94; Delicious 67.79 /
68.95; WordNetHypernyms Omikuji 65.80, PECOS 65.15, napkinXC 61.90.

Outputs: a table per data set (stdout), ``--out`` (JSON: machine, command
line, config, per data set every run with its curve, the means, the
peers' rows) and ``--figure`` (PNG: one panel per data set, validation P@1
per epoch against seconds for each seed, each peer's test P@1 at its
training seconds).

Dependencies: the peers need ``pip install xmc_tf[bench]`` (napkinxc,
omikuji); PECOS needs a separate venv (``python -m venv venv-pecos;
venv-pecos/bin/pip install libpecos==1.2.8``, which pulls numpy<2) named by
``--pecos-python``; without that flag PECOS runs only if this interpreter
can import it, and is otherwise skipped with a note.  The figure needs
matplotlib.

Usage::

    python benchmarks/real_data.py --pecos-python ../venv-pecos/bin/python
    python benchmarks/real_data.py --datasets bibtex --seeds 0 \\
        --max-epochs 2 --out /tmp/rd.json --figure /tmp/rd.png
    python benchmarks/real_data.py --datasets bibtex,delicious \\
        --set model.input_dropout=0.2 --peers omikuji \\
        --out results/real_data_input_dropout.json \\
        --figure results/real_data_input_dropout.png

Flags: ``--datasets`` (comma-separated, default all three), ``--seeds``
(``0,1,2``), ``--config`` (a file name of ``configs/`` without ``.py``),
``--set KEY=VALUE`` (repeatable config override; VALUE a Python literal,
else a string), ``--max-epochs`` (``config.train.epochs``, for quick
checks), ``--peers`` (``omikuji,napkinxc,pecos``), ``--pecos-python``,
``--threads`` (2), ``--shared`` (``../shared``), ``--out``
(``results/real_data.json``), ``--figure`` (``results/real_data.png``),
``--workdir-root`` (keep the work directories there instead of temporary
ones).
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import multiprocessing
import os
import platform
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import peers  # noqa: E402  pylint: disable=wrong-import-position

#: Data sets of --datasets, in this order.
DATASETS = ("bibtex", "delicious", "wordnet")
#: Peers of --peers, in this order (Omikuji first: its P@1 is the target).
PEER_NAMES = ("omikuji", "napkinxc", "pecos")
PEER_LABELS = {"omikuji": "Omikuji", "napkinxc": "napkinXC PLT",
               "pecos": "PECOS XR-Linear"}
KS = (1, 3, 5)
GB = 1e9

#: Run by --pecos-python: ``DIR THREADS K``; DIR holds X_train.npz,
#: Y_train.npz, X_test.npz (scipy.sparse.save_npz); writes DIR/pecos_top.npy
#: (int64 [n, K] label ids, best first, -1 = none) and prints one line
#: ``PECOS_RESULT {json}``.
PECOS_SCRIPT = r'''
import json, os, resource, sys, time
import numpy as np
import scipy.sparse as sp
import pecos
from pecos.xmc import Indexer, LabelEmbeddingFactory
from pecos.xmc.xlinear.model import XLinearModel

d, threads, k = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
X = sp.load_npz(os.path.join(d, "X_train.npz")).tocsr().astype(np.float32)
Y = sp.load_npz(os.path.join(d, "Y_train.npz")).tocsr().astype(np.float32)
Xt = sp.load_npz(os.path.join(d, "X_test.npz")).tocsr().astype(np.float32)
for m in (X, Y, Xt):
    m.sort_indices()  # PECOS refuses unsorted rows
start = time.perf_counter()
label_feat = LabelEmbeddingFactory.create(Y, X, method="pifa",
                                          threads=threads)
chain = Indexer.gen(label_feat, indexer_type="hierarchicalkmeans",
                    threads=threads)
model = XLinearModel.train(X, Y, C=chain, threads=threads)
train_s = time.perf_counter() - start
start = time.perf_counter()
pred = model.predict(Xt, only_topk=k, threads=threads).tocsr()
predict_s = time.perf_counter() - start
n = Xt.shape[0]
ids = np.full((n, k), -1, np.int64)
for i in range(n):
    lo, hi = pred.indptr[i], pred.indptr[i + 1]
    cols, vals = pred.indices[lo:hi], pred.data[lo:hi]
    order = np.lexsort((cols, -vals))[:k]
    ids[i, :order.size] = cols[order]
path = os.path.join(d, "pecos_top.npy")
np.save(path, ids)
try:
    from importlib.metadata import version
    ver = version("libpecos")
except Exception:
    ver = getattr(pecos, "__version__", None)
# VmHWM, not ru_maxrss: the latter keeps the peak of the process image
# before exec, i.e. of the (TensorFlow-sized) benchmark that started us.
peak = None
try:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                peak = int(line.split()[1]) * 1024
except OSError:
    pass
print("PECOS_RESULT " + json.dumps({
    "topk_path": path, "train_s": train_s,
    "decode_qps": n / max(predict_s, 1e-9),
    "peak_rss_bytes": peak,
    "ru_maxrss_bytes":
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "version": ver, "num_tree_levels": len(chain)}), flush=True)
'''


class UsageError(Exception):
    """A mistake in the command line or a missing file: one line, exit 2."""


# ---------------------------------------------------------------------------
# Config
# ---------------------------------------------------------------------------


def parse_set(item: str) -> tuple[str, object]:
    """Parses one ``--set KEY=VALUE``.

    Args:
      item (str): ``KEY=VALUE``; KEY a dotted config field
        (``model.input_dropout``), VALUE a Python literal
        (:func:`ast.literal_eval`: ``0.2``, ``(512,)``, ``True``) or else
        taken as a string.

    Returns:
      ``(key, value)``.

    Raises:
      UsageError: no ``=`` or an empty key.
    """
    key, sep, raw = item.partition("=")
    key = key.strip()
    if not sep or not key:
        raise UsageError(f"--set {item!r}: expected KEY=VALUE, e.g. "
                         "model.input_dropout=0.2")
    try:
        value = ast.literal_eval(raw.strip())
    except (ValueError, SyntaxError):
        value = raw.strip()
    return key, value


def build_config(name: str, overrides=(), max_epochs: int | None = None):
    """The packaged config ``name`` with the overrides applied.

    Args:
      name (str): a packaged config (:func:`xmc_tf.config.names`).
      overrides (list of (str, object)): ``(dotted key, value)`` pairs of
        :func:`parse_set`, applied in order.
      max_epochs (int or None): sets ``config.train.epochs`` when given.

    Returns:
      The ``ml_collections.ConfigDict``.

    Raises:
      UsageError: no such config file, an unknown field, or a value of the
        wrong type.
    """
    try:
        config = peers.load_config(name)
    except ValueError as e:
        raise UsageError(f"--config {name!r}: {e}") from e
    items = list(overrides)
    if max_epochs is not None:
        items.append(("train.epochs", int(max_epochs)))
    for key, value in items:
        parts = key.split(".")
        node = config
        for i, part in enumerate(parts):
            if not hasattr(node, "keys") or part not in node:
                raise UsageError(f"--set {key}={value!r}: config {name!r} has "
                                 f"no field {'.'.join(parts[:i + 1])!r}")
            if i < len(parts) - 1:
                node = node[part]
        old = node[parts[-1]]
        try:
            node[parts[-1]] = value
        except (TypeError, ValueError, KeyError, AttributeError):
            raise UsageError(
                f"--set {key}={value!r}: a {type(value).__name__} for a "
                f"{type(old).__name__} field (now {old!r})") from None
    return config


# ---------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------


def dataset_specs(name: str, shared: str) -> tuple[str, str]:
    """The train and test specs (:func:`xmc_tf.data.load_dataset`) of a
    data set of :data:`DATASETS`.

    Args:
      name (str): ``"bibtex"``, ``"delicious"`` or ``"wordnet"``.
      shared (str): the shared folder (holding ``data/``).

    Returns:
      ``(train_spec, test_spec)``: bundled specs (``"bibtex:train"``) or
      paths of existing files.

    Raises:
      UsageError: an unknown name or a missing file.
    """
    from xmc_tf import data as xdata  # pylint: disable=import-outside-toplevel
    if name not in DATASETS:
        raise UsageError(f"--datasets: unknown data set {name!r}; expected "
                         f"some of {','.join(DATASETS)}")
    if name in xdata.BUNDLED_DATASETS:
        return f"{name}:train", f"{name}:test"
    base = os.path.join(shared, "data")
    if name == "delicious":
        paths = tuple(os.path.join(base, "Delicious", "xc",
                                   f"delicious_xcsplit_{s}.txt.gz")
                      for s in ("train", "test"))
    else:
        paths = tuple(os.path.join(base, "WordNetHypernyms", f"{s}.txt.gz")
                      for s in ("train", "test"))
    for p in paths:
        if not os.path.exists(p):
            raise UsageError(f"data set {name!r}: missing file {p} (--shared "
                             f"{shared})")
    return paths


class Split:
    """Features and labels of one split, without xmc_tf's classes (so that
    a peer's process unpickles it without importing TensorFlow).

    Args:
      features (scipy.sparse.csr_matrix): ``[n, D]`` float32.
      labels (scipy.sparse.csr_matrix): ``[n, L]``.
    """

    def __init__(self, features, labels):
        self.features = features
        self.labels = labels

    @property
    def num_instances(self) -> int:
        """Number of instances ``n``."""
        return self.features.shape[0]


# ---------------------------------------------------------------------------
# Metrics
# ---------------------------------------------------------------------------


def topk_metrics(topk_ids, labels, inv_propensities) -> dict:
    """P@1/3/5 and PSP@5 (percent) of ranked predictions, the way
    :func:`xmc_tf.job.run.train_and_evaluate` computes ours.

    Args:
      topk_ids (np.ndarray): int ``[n, >=5]`` label ids, best first, -1 =
        none.
      labels (scipy.sparse.csr_matrix): true labels ``[n, L]``.
      inv_propensities (np.ndarray): float ``[L]``, ``1 / p_l`` of the
        training labels (:func:`xmc_tf.metrics.inverse_propensities`).

    Returns:
      ``{"P@1", "P@3", "P@5", "PSP@5"}``, floats in percent.
    """
    from xmc_tf.metrics import XMCEvaluator  # pylint: disable=import-outside-toplevel
    ev = XMCEvaluator(ks=KS, inv_propensities=inv_propensities)
    ev.update(np.asarray(topk_ids), labels)
    res = ev.result()
    return {**{f"P@{k}": float(res[f"P@{k}"]) for k in KS},
            "PSP@5": float(res["PSP@5"])}


# ---------------------------------------------------------------------------
# Child processes
# ---------------------------------------------------------------------------


def _in_child(target, *args):
    """Runs ``target(conn, *args)`` in a fresh (spawned) process and returns
    what it sends, or ``{"error": ...}`` if it dies without sending."""
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=target, args=(child_conn, *args))
    proc.start()
    child_conn.close()  # so that recv() sees EOF if the child dies
    try:
        result = parent_conn.recv()
    except EOFError:
        result = None
    proc.join()
    if result is None:
        return {"error": f"the process died (exit code {proc.exitcode})"}
    return result


def _peer_child(conn, name, train, test, threads, train_path, log_path):
    """A peer of :mod:`peers` in this process (its output, e.g. Omikuji's
    progress bars, into ``log_path``); sends its row with the top-5 ids
    (``"topk"``) and this process' peak RSS."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        captured = {}

        def capture(topk_ids, labels, ks=KS):  # replaces peers.precision
            del labels, ks
            captured["topk"] = np.asarray(topk_ids)
            return {}

        peers.precision = capture
        runner = {"omikuji": peers.run_omikuji,
                  "napkinxc": peers.run_napkinxc}[name]
        row = runner(train, test, threads=threads, train_path=train_path)
        row["topk"] = captured["topk"]
        row["peak_rss_bytes"] = peers.proc_status_bytes(os.getpid())
        conn.send(row)
    except ImportError as e:
        conn.send({"error": f"not installed ({e}); pip install xmc_tf[bench]"})
    except BaseException:  # pylint: disable=broad-except
        conn.send({"error": traceback.format_exc()})


def make_curve_callback(tree=None):
    """A Keras callback that records the validation curve.

    Args:
      tree: None, or ``(tree_layer, val_data, batch_size)``: a
        :class:`xmc_tf.layers.LabelTreeScores` fit before training on the
        job's fit split and the job's normalised validation split; then
        every epoch also records ``val_P@1_fused``: the validation P@1 of
        ``network + weight * tree`` at the weight the job would choose
        after that epoch (:func:`xmc_tf.shortlist.fusion.choose_fusion_weights`
        on the union of both parts' best labels,
        :func:`xmc_tf.shortlist.fusion.exact_blocks`), i.e. of the model a
        run stopped there would export.  Its evaluation time is left out of
        ``wall_s``.

    Returns:
      A ``keras.callbacks.Callback`` whose ``curve`` attribute is a list
      with one dict per finished epoch: ``epoch`` (1-based), ``wall_s``
      (float, wall-clock seconds since ``on_train_begin``, taken when the
      job's own epoch-end callbacks have run), ``val_P@1`` / ``val_P@3``
      (float percent, None without a validation split), ``loss`` and, with
      ``tree``, ``val_P@1_fused`` / ``tree_weight``.
    """
    import keras  # pylint: disable=import-outside-toplevel

    class ValidationCurve(keras.callbacks.Callback):
        """Validation P@1/P@3 and wall-clock seconds after each epoch."""

        def __init__(self):
            super().__init__()
            self.curve = []
            self._start = None
            self._paused = 0.0

        def on_train_begin(self, logs=None):
            self._start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            logs = logs or {}

            def pct(key):
                v = logs.get(key)
                return None if v is None else 100.0 * float(v)

            now = time.perf_counter()
            point = {
                "epoch": epoch + 1,
                "wall_s": now - self._start - self._paused,
                "val_P@1": pct("val_precision_at_1"),
                "val_P@3": pct("val_precision_at_3"),
                "loss": (None if logs.get("loss") is None
                         else float(logs["loss"]))}
            if tree is not None:
                # pylint: disable=import-outside-toplevel
                from xmc_tf import decoding
                from xmc_tf.job import finalize as xfinalize
                from xmc_tf.job.scorers.tree import MULTI_LABEL_WEIGHTS
                from xmc_tf.layers import FusedScores
                from xmc_tf.shortlist import fusion
                layer, val_data, batch = tree
                model = decoding.inference_model(self.model)
                fused = FusedScores(model, [layer], [1.0])
                scores = fusion.ShortlistScores.collect(fusion.exact_blocks(
                    fused, ((x, part.labels) for part, x in
                            xfinalize.row_blocks(val_data, batch))))
                part = fusion.FusionPart("tree", (layer.name,),
                                         MULTI_LABEL_WEIGHTS)
                choice = fusion.choose_fusion_weights(scores, [part],
                                                      (1, 3, 5))
                weight = choice.weight["tree"]
                point["val_P@1_fused"] = choice.tables["tree"][weight][1]
                point["tree_weight"] = weight
                self._paused += time.perf_counter() - now
            self.curve.append(point)

        @property
        def paused_s(self) -> float:
            """Seconds spent on the fused evaluations (left out of
            ``wall_s``, and of the run's ``train_s``)."""
            return self._paused

    return ValidationCurve()


def fit_tree_for_curve(config):
    """The label tree the job would fit, fit before training for the
    fused curve (:func:`make_curve_callback`); None when the job's
    ``config.tree`` leaves it off.

    Returns:
      ``((tree_layer, val_data, batch_size), fit_seconds)`` or
      ``(None, 0.0)``.
    """
    # pylint: disable=import-outside-toplevel
    from xmc_tf.job import heads as xheads
    from xmc_tf.job import plan as xplan
    from xmc_tf.job import scorers as xscorers
    from xmc_tf.job import inputs as xinputs
    from xmc_tf.job import preprocessing as xprep
    from xmc_tf.layers import LabelTreeScores
    from xmc_tf.shortlist import fit_label_tree
    train = xprep.load_spec(config.data.train, "config.data.train")
    with tempfile.TemporaryDirectory() as tmp:
        fit, val, _ = xinputs.prepare_splits(config, train, tmp)
    head = xheads.get_head(config)
    on, _ = xscorers.get("tree").plan(config, head, xplan.summarize(train),
                                      val is not None)
    if not on:
        return None, 0.0
    start = time.perf_counter()
    tc = config.tree
    tree = fit_label_tree(
        fit.features, fit.labels, leaf_size=tc.leaf_size, c=float(tc.c),
        tol=float(tc.tol), threshold=float(tc.threshold), seed=config.seed)
    seconds = time.perf_counter() - start
    return (LabelTreeScores.from_tree(tree), val,
            config.eval.batch_size), seconds


def _ours_child(conn, config_name, overrides, max_epochs, train_spec,
                test_spec, seed, workdir, fused_curve=False):
    """One :func:`xmc_tf.job.run.train_and_evaluate` run in this process;
    sends ``{"metrics", "curve"}`` or ``{"error"}``."""
    try:
        config = build_config(config_name, overrides, max_epochs)
        config.data.train = train_spec
        config.data.test = test_spec
        config.seed = int(seed)
        from xmc_tf.errors import UserError  # pylint: disable=import-outside-toplevel
        tree, tree_s = (fit_tree_for_curve(config) if fused_curve
                        else (None, 0.0))
        curve = make_curve_callback(tree)
        from xmc_tf.job import run as xrun  # pylint: disable=import-outside-toplevel
        try:
            metrics = xrun.train_and_evaluate(
                config, workdir, overwrite=True, callbacks=[curve])
        except UserError as e:
            conn.send({"error": f"{type(e).__name__}: {e}",
                       "curve": curve.curve})
            return
        conn.send({"metrics": metrics, "curve": curve.curve,
                   "tree_s": tree_s if tree is not None else None,
                   "curve_eval_s": curve.paused_s,
                   "vmhwm_bytes": peers.proc_status_bytes(os.getpid())})
    except BaseException:  # pylint: disable=broad-except
        conn.send({"error": traceback.format_exc()})


# ---------------------------------------------------------------------------
# Runners
# ---------------------------------------------------------------------------


def run_ours(name: str, train_spec: str, test_spec: str, seed: int, args,
             overrides, omikuji_p1: float | None) -> dict:
    """One xmc_tf run (own process, fresh work directory).

    Args:
      name (str): data set name (for the work directory's name).
      train_spec, test_spec (str): ``config.data.train`` / ``.test``.
      seed (int): ``config.seed``.
      args (argparse.Namespace): ``config``, ``max_epochs``,
        ``workdir_root``.
      overrides (list of (str, object)): ``--set`` pairs.
      omikuji_p1 (float or None): Omikuji's test P@1 (percent) on this data
        set, the target of ``time_to_omikuji_p1_s``.

    Returns:
      The run's row: ``seed``, test ``P@1/3/5``, ``PSP@5`` (percent),
      ``train_s`` (s), ``epochs``, ``peak_rss_bytes`` (the job's
      ``peak_memory_bytes``), ``vmhwm_bytes`` (the process' own peak RSS,
      bytes), ``best_val``
      (``{"epoch", "wall_s", "val_P@1", "val_P@3"}`` at the highest val
      P@3, or None), ``time_to_omikuji_p1_s`` / ``epoch_to_omikuji_p1``
      (None if never or no target), ``curve`` (see
      :func:`make_curve_callback`), ``job_wall_s`` (the whole process,
      s), ``workdir``, ``metrics`` (the job's metrics dict); or ``seed``,
      ``error``.
    """
    if args.workdir_root:
        os.makedirs(args.workdir_root, exist_ok=True)
        workdir = tempfile.mkdtemp(prefix=f"{name}_seed{seed}_",
                                   dir=args.workdir_root)
        tmp = None
    else:
        tmp = tempfile.TemporaryDirectory(prefix=f"real_data_{name}_")
        workdir = tmp.name
    start = time.perf_counter()
    try:
        res = _in_child(_ours_child, args.config, overrides, args.max_epochs,
                        train_spec, test_spec, seed, workdir,
                        getattr(args, "fused_curve", False))
    finally:
        job_wall = time.perf_counter() - start
        if tmp is not None:
            tmp.cleanup()
    row = {"seed": seed, "job_wall_s": job_wall,
           "workdir": workdir if tmp is None else None}
    if "error" in res:
        row.update(error=res["error"], curve=res.get("curve", []))
        return row
    m, curve = res["metrics"], res["curve"]
    row.update({k: m.get(k) for k in ("P@1", "P@3", "P@5", "PSP@5")})
    # The job's train_seconds hold the fused curve's own evaluations (run
    # in its epoch-end callback): they are this benchmark's, not training.
    curve_eval_s = float(res.get("curve_eval_s") or 0.0)
    job_train_s = m.get("train_seconds")
    row.update(train_s=(None if job_train_s is None
                        else job_train_s - curve_eval_s),
               job_train_s=job_train_s, curve_eval_s=curve_eval_s,
               epochs=m.get("epochs"),
               peak_rss_bytes=m.get("peak_memory_bytes"),
               vmhwm_bytes=res.get("vmhwm_bytes"), curve=curve)
    row.update(summarize_curve(curve, omikuji_p1, res.get("tree_s")))
    row["metrics"] = {k: v for k, v in m.items() if not isinstance(v, dict)}
    return row


def summarize_curve(curve, target_p1: float | None,
                    tree_s: float | None = None) -> dict:
    """The best validation epoch and the time to a P@1 target.

    Args:
      curve (list of dict): :func:`make_curve_callback`'s ``curve``.
      target_p1 (float or None): P@1 in percent (Omikuji's test P@1).
      tree_s (float or None): seconds the label tree took to fit, when the
        curve has ``val_P@1_fused``.

    Returns:
      ``{"best_val": {"epoch", "wall_s", "val_P@1", "val_P@3"} or None,
      "time_to_omikuji_p1_s": float or None, "epoch_to_omikuji_p1": int or
      None}``, plus with ``tree_s`` ``"tree_s"``,
      ``"time_to_omikuji_p1_fused_s"`` (the tree's seconds + the end of the
      first epoch whose fused validation P@1 reached the target) and
      ``"epoch_to_omikuji_p1_fused"``; the best epoch is the first with the
      highest val P@3 (the early-stopping monitor).
    """
    with_val = [c for c in curve if c.get("val_P@3") is not None]
    best = None
    if with_val:
        b = max(with_val, key=lambda c: c["val_P@3"])  # first of the max
        best = {k: b[k] for k in ("epoch", "wall_s", "val_P@1", "val_P@3")}

    def first(key):
        if target_p1 is None:
            return None
        return next((c for c in curve if c.get(key) is not None
                     and c[key] >= target_p1), None)
    reached = first("val_P@1")
    out = {"best_val": best,
           "time_to_omikuji_p1_s": reached["wall_s"] if reached else None,
           "epoch_to_omikuji_p1": reached["epoch"] if reached else None}
    if tree_s is not None:
        fused = first("val_P@1_fused")
        out.update(tree_s=tree_s,
                   time_to_omikuji_p1_fused_s=(tree_s + fused["wall_s"]
                                               if fused else None),
                   epoch_to_omikuji_p1_fused=fused["epoch"] if fused
                   else None)
    return out


def run_tree_peer(name: str, train: Split, test: Split, train_path: str,
                  threads: int, inv_prop) -> dict:
    """Omikuji or napkinXC (:mod:`peers`) in a process of its own.

    Args:
      name (str): ``"omikuji"`` or ``"napkinxc"``.
      train, test (Split): the data as the files hold it.
      train_path (str): the training set as an XC file (Omikuji reads it).
      threads (int): CPU threads.
      inv_prop (np.ndarray): inverse propensities ``[L]`` for PSP@5.

    Returns:
      ``{"method", "P@1", "P@3", "P@5", "PSP@5", "train_s",
      "decode_qps", "peak_rss_bytes"}`` (percent, seconds, queries per
      second, bytes: the child's VmHWM) or ``{"method", "error"}``.
    """
    with tempfile.TemporaryDirectory(prefix="real_data_peer_") as tmp:
        log = os.path.join(tmp, "log.txt")
        res = _in_child(_peer_child, name, train, test, threads, train_path,
                        log)
        row = {"method": PEER_LABELS[name]}
        if "error" in res:
            with open(log, errors="replace") as f:
                tail = f.read()[-300:].strip()
            row["error"] = res["error"] + (f" (its output ends: {tail})"
                                           if tail else "")
            return row
    topk = res.pop("topk")
    res.pop("method", None)
    row.update(topk_metrics(topk, test.labels, inv_prop))
    row.update(res)
    return row


def l2_rows(matrix):
    """``matrix`` (CSR) with every non-empty row scaled to unit l2 norm:
    what Omikuji and napkinXC (``norm=True``) do to each instance inside,
    and PECOS does not.

    Args:
      matrix (scipy.sparse.csr_matrix): ``[n, D]`` features.

    Returns:
      A new float32 CSR matrix with sorted indices.
    """
    import scipy.sparse as sp  # pylint: disable=import-outside-toplevel
    m = sp.csr_matrix(matrix, dtype=np.float32, copy=True)
    sq = np.asarray(m.multiply(m).sum(axis=1), dtype=np.float64).ravel()
    scale = np.ones_like(sq)
    scale[sq > 0] = 1.0 / np.sqrt(sq[sq > 0])
    m.data *= np.repeat(scale, np.diff(m.indptr)).astype(np.float32)
    m.sort_indices()
    return m


def run_pecos(python: str, train: Split, test: Split, threads: int,
              inv_prop) -> dict:
    """PECOS XR-Linear through ``python`` (:data:`PECOS_SCRIPT`).

    Args:
      python (str): an interpreter that can ``import pecos``.
      train, test (Split): the data as the files hold it.
      threads (int): CPU threads.
      inv_prop (np.ndarray): inverse propensities ``[L]`` for PSP@5.

    Returns:
      As :func:`run_tree_peer`, plus ``version``.
    """
    import scipy.sparse as sp  # pylint: disable=import-outside-toplevel
    row = {"method": PEER_LABELS["pecos"]}
    with tempfile.TemporaryDirectory(prefix="real_data_pecos_") as tmp:
        for fname, m in (("X_train", l2_rows(train.features)),
                         ("Y_train", train.labels),
                         ("X_test", l2_rows(test.features))):
            sp.save_npz(os.path.join(tmp, f"{fname}.npz"),
                        sp.csr_matrix(m, dtype=np.float32))
        proc = subprocess.run(
            [python, "-c", PECOS_SCRIPT, tmp, str(threads), str(max(KS))],
            capture_output=True, text=True, check=False)
        lines = [l for l in proc.stdout.splitlines()
                 if l.startswith("PECOS_RESULT ")]
        if proc.returncode or not lines:
            tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            row["error"] = f"exit code {proc.returncode}: {tail}"
            return row
        res = json.loads(lines[-1][len("PECOS_RESULT "):])
        topk = np.load(res.pop("topk_path"))
    row.update(topk_metrics(topk, test.labels, inv_prop))
    row.update(res)
    return row


def check_pecos_python(python: str | None) -> tuple[str | None, str]:
    """The interpreter that runs PECOS, or None and why not.

    Args:
      python (str or None): ``--pecos-python``.

    Returns:
      ``(interpreter or None, reason)``.

    Raises:
      UsageError: ``python`` given but missing or unable to import pecos.
    """
    if python is None:
        if importlib.util.find_spec("pecos") is not None:
            return sys.executable, ""
        return None, ("pecos is not importable here and --pecos-python is "
                      "not given (libpecos needs numpy<2: install it in its "
                      "own venv and pass its python)")
    if not os.path.exists(python):
        raise UsageError(f"--pecos-python {python}: no such file")
    proc = subprocess.run([python, "-c", "import pecos"], capture_output=True,
                          text=True, check=False)
    if proc.returncode:
        last = (proc.stderr.strip().splitlines() or ["?"])[-1]
        raise UsageError(f"--pecos-python {python}: cannot import pecos "
                         f"({last})")
    return python, ""


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def mean_std(runs) -> tuple[dict, dict]:
    """Mean and standard deviation (ddof=1; None for one run) over the
    successful runs of P@1/3/5, PSP@5 and train_s."""
    ok = [r for r in runs if "error" not in r]
    mean, std = {}, {}
    for key in ("P@1", "P@3", "P@5", "PSP@5", "train_s"):
        vals = [r[key] for r in ok if r.get(key) is not None]
        mean[key] = float(np.mean(vals)) if vals else None
        std[key] = float(np.std(vals, ddof=1)) if len(vals) > 1 else None
    mean["num_runs"] = std["num_runs"] = len(ok)
    return mean, std


TABLE_COLS = ["method", "seed", "P@1", "P@3", "P@5", "PSP@5", "train_s",
              "peak RSS GB", "epochs", "best val ep", "t to Omikuji P@1 s",
              "t fused s"]


def table_rows(entry: dict) -> list[dict]:
    """The table lines of one data set's JSON entry."""
    rows = []
    for r in entry["runs"]:
        line = {"method": entry["method"], "seed": r["seed"]}
        if "error" in r:
            line["method"] += " ERROR"
        else:
            line.update({k: r.get(k) for k in ("P@1", "P@3", "P@5", "PSP@5",
                                                "train_s", "epochs")})
            peak = r.get("vmhwm_bytes") or r.get("peak_rss_bytes")
            if peak:
                line["peak RSS GB"] = peak / GB
            if r.get("best_val"):
                line["best val ep"] = r["best_val"]["epoch"]
            line["t to Omikuji P@1 s"] = r.get("time_to_omikuji_p1_s")
            line["t fused s"] = r.get("time_to_omikuji_p1_fused_s")
        rows.append(line)
    if len(entry["runs"]) > 1:
        seeds = ",".join(str(r["seed"]) for r in entry["runs"]
                         if "error" not in r)
        for what in ("mean", "std"):
            rows.append({"method": f"{entry['method']} {what}", "seed": seeds,
                         **{k: v for k, v in entry[what].items()
                            if k != "num_runs"}})
    for p in entry["peers"]:
        line = {"method": p["method"]}
        if "error" in p or "skipped" in p:
            line["method"] += " SKIPPED" if "skipped" in p else " ERROR"
        else:
            line.update({k: p.get(k) for k in ("P@1", "P@3", "P@5", "PSP@5",
                                                "train_s")})
            if p.get("peak_rss_bytes"):
                line["peak RSS GB"] = p["peak_rss_bytes"] / GB
        rows.append(line)
    return rows


def print_dataset(name: str, entry: dict) -> None:
    """Prints one data set's table and the peers' errors."""
    print(f"\n== {name} (train {entry['train']}, test {entry['test']})")
    print(peers.format_table(table_rows(entry), TABLE_COLS))
    for r in entry["runs"]:
        if "error" in r:
            print(f"  {entry['method']} seed {r['seed']}: {r['error']}")
    for p in entry["peers"]:
        if "error" in p or "skipped" in p:
            print(f"  {p['method']}: {p.get('error') or p.get('skipped')}")
    if entry.get("omikuji_p1") is not None:
        print(f"  (t to Omikuji P@1: first epoch end with val P@1 >= "
              f"Omikuji's test P@1 {entry['omikuji_p1']:.2f}, seconds since "
              f"training began)")
    sys.stdout.flush()


def plot(result: dict, path: str) -> None:
    """One panel per data set: validation P@1 per epoch against wall-clock
    seconds for every seed of ours (solid: the deep model; dashed: fused
    with the label tree, shifted by the tree's fit time), each peer's test
    P@1 at its training seconds.

    Args:
      result (dict): the JSON document of :func:`main`.
      path (str): the PNG to write.
    """
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    from matplotlib.ticker import FuncFormatter  # pylint: disable=import-outside-toplevel
    names = list(result["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(6.0 * len(names), 6.2),
                             squeeze=False)
    markers = {"Omikuji": "s", "napkinXC PLT": "^", "PECOS XR-Linear": "D"}
    labels = []  # (axes, peers): their names are placed once laid out
    for ax, name in zip(axes[0], names):
        entry = result["datasets"][name]
        for r in entry["runs"]:
            pts = [(c["wall_s"], c["val_P@1"]) for c in r.get("curve", [])
                   if c.get("val_P@1") is not None]
            if not pts:
                continue
            line, = ax.plot(*zip(*pts), "o-", ms=3, lw=1.2,
                            label=f"{entry['method']} seed {r['seed']}: "
                                  "val P@1 per epoch")
            fused = [(r["tree_s"] + c["wall_s"], c["val_P@1_fused"])
                     for c in r.get("curve", [])
                     if c.get("val_P@1_fused") is not None
                     and r.get("tree_s") is not None]
            if fused:
                ax.plot(*zip(*fused), "o--", ms=3, lw=1.0,
                        color=line.get_color(),
                        label=f"seed {r['seed']}: with the label tree "
                              "(its fit time added)")
            if r.get("P@1") is not None and r.get("train_s"):
                ax.plot([r["train_s"]], [r["P@1"]], "*", ms=11, mfc="none",
                        color=line.get_color(),
                        label=f"seed {r['seed']}: test P@1 at its end")
        shown = [p for p in entry["peers"]
                 if p.get("P@1") is not None and p.get("train_s")]
        for p in shown:
            ax.plot([p["train_s"]], [p["P@1"]], markers.get(p["method"], "o"),
                    color="k", ms=7,
                    label=f"{p['method']}: test P@1 {p['P@1']:.2f}")
        labels.append((ax, shown))
        if entry.get("omikuji_p1") is not None:
            ax.axhline(entry["omikuji_p1"], color="grey", lw=0.8, ls=":")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(
            lambda v, _, ax=ax: _minor_tick_label(v, ax.get_xlim())))
        ax.tick_params(axis="x", which="minor", labelsize=7)
        ax.set_xlabel("wall-clock seconds since training began (log)")
        ax.set_ylabel("P@1 (%): xmc_tf validation per epoch; peers test")
        ax.set_title(f"{name} (train {entry['num_train']:,}, "
                     f"{entry['num_labels']:,} labels)", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13),
                  ncol=2)
    machine = result["machine"]
    load = machine.get("loadavg_start") or [float("nan")]
    fig.suptitle(f"P@1 against training seconds ({machine['cpu_count']} CPUs,"
                 f" load average {load[0]:.1f} at start)", fontsize=9)
    fig.tight_layout()
    for ax, shown in labels:
        _label_points(ax, shown)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _label_points(ax, shown, fontsize=7.0) -> None:
    """Writes each peer's name right of its marker, moving a name down
    where it would overlap the one above it (the peers' points often lie
    close together)."""
    step = 1.3 * fontsize * ax.figure.dpi / 72.0  # pixels between lines
    last = None
    for p in sorted(shown, key=lambda p: -p["P@1"]):
        y = ax.transData.transform((p["train_s"], p["P@1"]))[1]
        text_y = y if last is None else min(y, last - step)
        last = text_y
        ax.annotate(p["method"], (p["train_s"], p["P@1"]),
                    textcoords="offset points", va="center", fontsize=fontsize,
                    xytext=(7, (text_y - y) * 72.0 / ax.figure.dpi))


def _minor_tick_label(value: float, xlim) -> str:
    """A log axis' minor tick label: all of them over a decade or so, only
    2 and 5 up to three decades, none beyond."""
    decades = np.log10(max(xlim[1], 1e-30) / max(xlim[0], 1e-30))
    mantissa = round(value / 10 ** np.floor(np.log10(value)))
    if decades <= 1.5 or (decades <= 3 and mantissa in (2, 5)):
        return f"{value:g}"
    return ""


def machine_info() -> dict:
    """Platform, CPUs, Python and library versions, load average now."""
    from importlib import metadata  # pylint: disable=import-outside-toplevel
    versions = {}
    for pkg in ("tensorflow", "tensorflow-cpu", "keras", "numpy", "omikuji",
                "napkinxc"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            pass
    return {"platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpu_count": os.cpu_count(), "python": platform.python_version(),
            "versions": versions, "loadavg_start": list(os.getloadavg())}


def _json_default(o):
    if isinstance(o, np.integer):
        return int(o)
    if isinstance(o, np.floating):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    return str(o)


def write_json(result: dict, path: str) -> None:
    """Writes ``result`` to ``path`` (via a temporary file)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(result, f, indent=1, default=_json_default)
    os.replace(tmp, path)


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def _csv(text: str) -> list[str]:
    return [t.strip() for t in text.split(",") if t.strip()]


def run(args) -> int:
    """The benchmark; see the module docstring.  Returns the exit code."""
    names = _csv(args.datasets)
    if not names:
        raise UsageError("--datasets is empty")
    for n in names:
        if n not in DATASETS:
            raise UsageError(f"--datasets: unknown data set {n!r}; expected "
                             f"some of {','.join(DATASETS)}")
    peer_names = _csv(args.peers)
    for p in peer_names:
        if p not in PEER_NAMES:
            raise UsageError(f"--peers: unknown peer {p!r}; expected some of "
                             f"{','.join(PEER_NAMES)}")
    peer_names = [p for p in PEER_NAMES if p in peer_names]
    try:
        seeds = [int(s) for s in _csv(args.seeds)]
    except ValueError:
        raise UsageError(f"--seeds {args.seeds!r}: expected integers like "
                         "0,1,2") from None
    if not seeds:
        raise UsageError("--seeds is empty")
    if args.max_epochs is not None and args.max_epochs < 1:
        raise UsageError(f"--max-epochs {args.max_epochs}: must be >= 1")
    if args.threads < 1:
        raise UsageError(f"--threads {args.threads}: must be >= 1")
    overrides = [parse_set(s) for s in args.set]
    config = build_config(args.config, overrides, args.max_epochs)
    pecos_python, pecos_why = (check_pecos_python(args.pecos_python)
                               if "pecos" in peer_names else (None, ""))

    from xmc_tf import data as xdata  # pylint: disable=import-outside-toplevel
    from xmc_tf import metrics as xmetrics  # pylint: disable=import-outside-toplevel
    from xmc_tf.errors import UserError  # pylint: disable=import-outside-toplevel
    from xmc_tf.job import checks as xchecks  # pylint: disable=import-outside-toplevel
    try:
        xchecks.check_config(config)
    except UserError as e:
        raise UsageError(f"config {args.config!r}: {e}") from None
    specs = {n: dataset_specs(n, args.shared) for n in names}

    method = "xmc_tf " + args.config + "".join(
        f" {k}={v!r}" for k, v in overrides)
    result = {"benchmark": "real_data", "machine": machine_info(),
              "command": " ".join([sys.executable] + sys.argv),
              "args": vars(args), "method": method,
              "config": json.loads(config.to_json_best_effort()),
              "overrides": [[k, v] for k, v in overrides],
              "datasets": {}}
    print(f"real data: {names}, {method}, seeds {seeds}, peers {peer_names};"
          f" {os.cpu_count()} CPUs, load average "
          f"{result['machine']['loadavg_start'][0]:.1f}", flush=True)
    if "pecos" in peer_names and pecos_python is None:
        print(f"PECOS skipped: {pecos_why}", flush=True)
    failed = False
    for name in names:
        train_spec, test_spec = specs[name]
        try:
            train_ds = xdata.load_dataset(train_spec)
            test_ds = xdata.load_dataset(test_spec)
        except (OSError, ValueError) as e:
            raise UsageError(f"data set {name!r}: {' '.join(str(e).split())}"
                             ) from None
        inv_prop = xmetrics.inverse_propensities(
            train_ds.labels, A=config.eval.propensity_a,
            B=config.eval.propensity_b)
        train = Split(train_ds.features, train_ds.labels)
        test = Split(test_ds.features, test_ds.labels)
        entry = {"train": train_spec, "test": test_spec, "method": method,
                 "num_train": train.num_instances,
                 "num_test": test.num_instances,
                 "num_features": train_ds.num_features,
                 "num_labels": train_ds.num_labels, "peers": [], "runs": []}
        result["datasets"][name] = entry
        with tempfile.TemporaryDirectory(prefix="real_data_xc_") as tmp:
            train_path = train_spec
            if not os.path.exists(train_path):  # bundled: write the file
                train_path = os.path.join(tmp, f"{name}_train.txt")
                xdata.write_xc(train_path, train_ds)
            for p in peer_names:
                if p != "pecos" or pecos_python:
                    print(f"{name}: {PEER_LABELS[p]} ...", flush=True)
                if p == "pecos":
                    row = (run_pecos(pecos_python, train, test, args.threads,
                                     inv_prop) if pecos_python else
                           {"method": PEER_LABELS[p], "skipped": pecos_why})
                else:
                    row = run_tree_peer(p, train, test, train_path,
                                        args.threads, inv_prop)
                failed |= "error" in row
                entry["peers"].append(row)
        del train_ds, test_ds, train, test
        omikuji = next((p for p in entry["peers"]
                        if p["method"] == "Omikuji" and "P@1" in p), None)
        entry["omikuji_p1"] = omikuji["P@1"] if omikuji else None
        for seed in seeds:
            print(f"{name}: {method} seed {seed} ...", flush=True)
            row = run_ours(name, train_spec, test_spec, seed, args, overrides,
                           entry["omikuji_p1"])
            failed |= "error" in row
            entry["runs"].append(row)
        entry["mean"], entry["std"] = mean_std(entry["runs"])
        print_dataset(name, entry)
        result["machine"]["loadavg_end"] = list(os.getloadavg())
        if args.out:
            write_json(result, args.out)
    print(f"\nload average at end {result['machine']['loadavg_end'][0]:.1f}")
    if args.out:
        print(f"wrote {args.out}")
    if args.figure:
        plot(result, args.figure)
        print(f"wrote {args.figure}")
    return 1 if failed else 0


def main(argv=None) -> int:
    """Parses the flags, runs the benchmark; prints tables, writes JSON and
    the figure.  Returns 0, 1 (a run failed) or 2 (a usage error)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS),
                        help="comma-separated, of " + ",".join(DATASETS))
    parser.add_argument("--seeds", default="0,1,2",
                        help="config.seed of the xmc_tf runs, one run each")
    parser.add_argument("--config", default="uniform_sparse",
                        help="a packaged config (xmc_tf.config.names())")
    parser.add_argument("--set", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="config override, e.g. model.input_dropout=0.2 "
                             "(VALUE a Python literal, else a string; "
                             "repeatable)")
    parser.add_argument("--fused-curve", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="also record each epoch's validation P@1 of the "
                        "model fused with the label tree (fit before "
                        "training in the run's process; its time is added "
                        "to the time to Omikuji's P@1)")
    parser.add_argument("--max-epochs", type=int, default=None,
                        help="config.train.epochs (quick checks; default: "
                             "the config's, with early stopping)")
    parser.add_argument("--peers", default=",".join(PEER_NAMES),
                        help="comma-separated, of " + ",".join(PEER_NAMES))
    parser.add_argument("--pecos-python", default=None, metavar="PATH",
                        help="a python that can import pecos (libpecos "
                             "1.2.8, in a venv of its own: it needs "
                             "numpy<2)")
    parser.add_argument("--threads", type=int, default=2,
                        help="CPU threads of every peer")
    parser.add_argument("--shared",
                        default=os.path.normpath(
                            os.path.join(peers.REPO, "..", "shared")),
                        help="the shared folder holding data/ (default "
                             "../shared of the repository)")
    parser.add_argument("--out",
                        default=os.path.join(HERE, "results",
                                             "real_data.json"),
                        help="JSON results ('' for none)")
    parser.add_argument("--figure",
                        default=os.path.join(HERE, "results", "real_data.png"),
                        help="PNG figure ('' for none)")
    parser.add_argument("--workdir-root", default=None,
                        help="keep each run's work directory under here "
                             "(default: temporary, deleted after the run)")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as e:
        print(f"real_data.py: error: {e}", file=sys.stderr, flush=True)
        return 2


if __name__ == "__main__":
    sys.exit(main())
