"""Peak memory of every phase of one ``xmc-tf train`` job (issue 32, item 3).

What it measures
----------------
One ``xmc-tf train`` job (the CLI's own ``main``, in a child process) on a
synthetic data set shaped like Amazon-670K (670,091 labels, 135,909
features, 5.45 labels and ~76 feature tokens per instance,
``xmc_tf.data.make_synthetic``, written once as XC text files): by default
20,000 training and 2,000 test instances, ``--config=uniform_sparse`` with
``connections_per_label=32`` and one epoch, every other field at its
default (validation split 0.1, batch 64, encoder 1024, intermediate 4096,
the wide path, SET, early stopping with best weights on disk).

The child marks the job's phases by wrapping the functions that run them
(no change to the job itself):

* ``load``: reading train + test (``xmc_tf.job.inputs.read_datasets``);
* ``normalise``: the validation split and the feature normalisation
  (``prepare_splits``);
* ``head.prepare``: the head's look at the training data (label
  frequencies, the wide path's connections);
* ``build``: model, ``head.initialize``, optimizer, compile
  (``build_and_compile``);
* ``train``: ``fit`` without the phases below (the steps, SET);
* ``validation``: Keras' validation pass inside ``fit``;
* ``best-weights write`` / ``best-weights restore``: ``EarlyStopping``'s
  file of the best epoch's weights and its read-back at the end;
* ``checkpoint``: ``Checkpointer.save`` (every epoch end, and at the end);
* ``test evaluation``: P@k etc. on the test split
  (``xmc_tf.job.scoring.evaluate_model``);
* ``export: model.keras`` and ``export: SavedModel``;
* ``other``: anything outside them (start-up, imports, summaries, the
  completion marker).

At every phase boundary the child reads ``VmHWM`` of ``/proc/self/status``
(the peak RSS since the last reset) and resets it (``echo 5 >
/proc/self/clear_refs``, Linux >= 4.0), so each phase's peak is exact, not
sampled: it is the largest RSS the process had while that phase ran
(it includes what earlier phases left resident).  A phase that runs several
times (checkpoint, validation) reports its largest.  The whole process's
peak is the largest phase peak.  Without a writable ``clear_refs`` the
peaks are cumulative (the JSON says so).

The parent kills the child when its RSS passes ``--kill-gib`` (9; the
machine is shared).

Output: a table on stdout and JSON (``--out``, e.g.
``benchmarks/results/run_memory.json``; ``--label`` names the row set, and
rows of other labels already in the file are kept, so a before / after
pair lives in one file).

The child inherits the environment, so the allocator can be chosen at
launch: TensorFlow's oneDNN build keeps freed memory in its own pool (BFC)
for the life of the process; ``TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1`` hands it
back to ``malloc`` (and so to the system), and
``GLIBC_TUNABLES=glibc.malloc.hugetlb=1`` lets ``malloc`` map those blocks
with transparent huge pages, which takes back most of the page-fault cost
of a system allocator (docs/notes/scaling.md).  The JSON records these
variables.

Usage::

    python benchmarks/run_memory.py --label after \\
        --out benchmarks/results/run_memory.json
    TF_ONEDNN_USE_SYSTEM_ALLOCATOR=1 GLIBC_TUNABLES=glibc.malloc.hugetlb=1 \\
        python benchmarks/run_memory.py --label after_system_allocator \\
        --out benchmarks/results/run_memory.json
    python benchmarks/run_memory.py --train 2000 --test 200   # quicker
    python benchmarks/run_memory.py --extra=--config.model.wide_connections=0
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import shutil
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import proc_status_bytes, run_watched  # noqa: E402  (benchmarks/peers.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30

#: Amazon-670K's shape (the XC repository's statistics).
SHAPE = dict(num_labels=670_091, num_features=135_909,
             labels_per_instance=5.45, features_per_instance=76.0)

#: Phases in the order of the table.
PHASES = ("load", "normalise", "head.prepare", "build", "train", "validation",
          "best-weights write", "checkpoint", "best-weights restore",
          "test evaluation", "export: model.keras", "export: SavedModel",
          "other")


# ---------------------------------------------------------------------------
# Data.


def prepare_data(data_dir: str, num_train: int, num_test: int,
                 seed: int = 0) -> dict:
    """Writes ``670k_{num_train}_train.txt`` / ``_test.txt`` (XC format)
    into ``data_dir`` once; returns ``{"train": path, "test": path}``."""
    tag = f"670k_{num_train}"
    paths = {k: os.path.join(data_dir, f"{tag}_{k}.txt")
             for k in ("train", "test")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    from xmc_tf import data as xdata
    os.makedirs(data_dir, exist_ok=True)
    ds = xdata.make_synthetic(
        num_train + num_test, SHAPE["num_features"], SHAPE["num_labels"],
        labels_per_instance=SHAPE["labels_per_instance"],
        features_per_instance=SHAPE["features_per_instance"], seed=seed)
    for part, rows in (("train", slice(0, num_train)),
                       ("test", slice(num_train, None))):
        xdata.write_xc(paths[part], xdata.XCDataset(ds.features[rows],
                                                    ds.labels[rows]))
    return paths


# ---------------------------------------------------------------------------
# The child: the job with its phases marked.


def _status_bytes(key: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return 0


class PhaseTracker:
    """Peak RSS per phase of this process, from ``VmHWM`` reset at every
    phase boundary (``/proc/self/clear_refs``).

    Phases nest: entering one closes the enclosing phase's current segment,
    leaving it opens a new one.  ``peaks[name]`` is the largest ``VmHWM``
    (bytes) over the segments of ``name``; ``seconds[name]`` their summed
    wall time; ``calls[name]`` how often it was entered; ``rss_after``
    the RSS when it was last left.
    """

    def __init__(self, out_path: str | None = None):
        self.out_path = out_path
        self.stack = ["other"]
        self.peaks, self.seconds, self.calls, self.rss_after = {}, {}, {}, {}
        self.cpu_seconds = {}
        self._t = time.perf_counter()
        self._cpu = time.process_time()
        self._t0 = self._t
        self.trace = []  # (seconds, phase, VmRSS bytes), every 0.5 s
        threading.Thread(target=self._sample, daemon=True).start()
        try:
            self._reset()
            self.resets = True
        except OSError:
            self.resets = False

    def _sample(self):
        while True:
            self.trace.append((round(time.perf_counter() - self._t0, 2),
                               self.stack[-1], _status_bytes("VmRSS")))
            if len(self.trace) % 10 == 0:
                try:
                    self.dump()
                except (RuntimeError, ValueError):  # dicts changing
                    pass
            time.sleep(0.5)

    @staticmethod
    def _reset():
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")

    def _close_segment(self):
        name = self.stack[-1]
        now = time.perf_counter()
        self.peaks[name] = max(self.peaks.get(name, 0), _status_bytes("VmHWM"))
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        self._t = now
        cpu = time.process_time()
        self.cpu_seconds[name] = self.cpu_seconds.get(name, 0.0) + cpu - \
            self._cpu
        self._cpu = cpu
        if self.resets:
            self._reset()

    @contextlib.contextmanager
    def phase(self, name: str):
        """Attributes what runs inside to phase ``name``."""
        self._close_segment()
        self.stack.append(name)
        self.calls[name] = self.calls.get(name, 0) + 1
        try:
            yield
        finally:
            self._close_segment()
            self.rss_after[name] = _status_bytes("VmRSS")
            self.stack.pop()
            print(f"[phase] {name}: peak {self.peaks[name] / GIB:.2f} GiB, "
                  f"RSS after {self.rss_after[name] / GIB:.2f} GiB",
                  file=sys.stderr, flush=True)
            self.dump()

    def dump(self, **extra) -> None:
        """Writes what is known so far to ``out_path`` (a killed job still
        reports the phases it finished)."""
        if not self.out_path:
            return
        with open(self.out_path, "w") as f:
            json.dump({"peaks": self.peaks, "seconds": self.seconds,
                       "cpu_seconds": self.cpu_seconds,
                       "calls": self.calls, "rss_after": self.rss_after,
                       "hwm_resets": self.resets, "running": self.stack[1:],
                       "rss_trace": self.trace,
                       "process_peak_bytes": max(self.peaks.values(),
                                                 default=0), **extra},
                      f, indent=1)

    def wrap(self, owner, attr: str, name: str):
        """Replaces ``owner.attr`` (a function or method) by one that runs
        in phase ``name``."""
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            with self.phase(name):
                return fn(*args, **kwargs)
        setattr(owner, attr, wrapped)

    def result(self) -> dict:
        self._close_segment()
        return {"peaks": self.peaks, "seconds": self.seconds,
                "cpu_seconds": self.cpu_seconds, "calls": self.calls,
                "rss_after": self.rss_after,
                "hwm_resets": self.resets,
                "process_peak_bytes": max(self.peaks.values())}


def _variable_bytes(model) -> dict:
    """Bytes of the variables of each layer of ``model`` and of the
    optimizer's slots."""
    import numpy as np
    out = {}
    for layer in model.layers:
        n = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                for v in layer.weights)
        if n:
            out[layer.name] = n
    opt = getattr(model, "optimizer", None)
    if opt is not None and opt.built:
        out["optimizer"] = sum(int(np.prod(v.shape)) *
                               np.dtype(v.dtype).itemsize
                               for v in opt.variables)
    return out


def child(args) -> None:
    """Runs ``xmc-tf train`` in this process with the phases marked and
    writes the tracker's result to ``args.phases_out``."""
    tracker = PhaseTracker(args.phases_out)
    import keras

    from xmc_tf import saving
    from xmc_tf_cli import cli
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import inputs as xinputs
    from xmc_tf.job import run as xrun
    from xmc_tf.callbacks import schedules
    from xmc_tf.job import checkpoint as xckpt
    from xmc_tf.job.heads import dense as xdense

    sizes = {}
    for owner, attr, name in (
            (xinputs, "read_datasets", "load"),
            (xinputs, "prepare_splits", "normalise"),
            (xdense.LabelWiseHead, "prepare", "head.prepare"),
            (keras.Model, "evaluate", "validation"),
            (schedules.EarlyStopping, "_write_best", "best-weights write"),
            (schedules.EarlyStopping, "on_train_end", "best-weights restore"),
            (xckpt.Checkpointer, "save", "checkpoint"),
            (xrun, "evaluate_model", "test evaluation"),
            (saving, "export_saved_model", "export: SavedModel")):
        tracker.wrap(owner, attr, name)
    build = xfit.build_and_compile

    def build_and_compile(*a, **k):
        with tracker.phase("build"):
            out = build(*a, **k)
        sizes["model"] = out[0]
        return out
    xfit.build_and_compile = build_and_compile
    fit = keras.Model.fit

    def fit_marked(self, *a, **k):
        with tracker.phase("train"):
            out = fit(self, *a, **k)
        sizes["variables"] = _variable_bytes(self)
        return out
    keras.Model.fit = fit_marked
    save = keras.Model.save

    def save_marked(self, *a, **k):
        with tracker.phase("export: model.keras"):
            return save(self, *a, **k)
    keras.Model.save = save_marked

    argv = ["xmc-tf", "train", f"--config={args.config}",
            f"--workdir={args.workdir}", "--overwrite",
            f"--config.data.train={args.train_path}",
            f"--config.data.test={args.test_path}",
            f"--config.model.connections_per_label={args.fan_in}",
            f"--config.train.epochs={args.epochs}"] + list(args.extra)
    start = time.perf_counter()
    rc = cli.main(argv)
    result = tracker.result()
    result.update(returncode=rc, total_seconds=time.perf_counter() - start,
                  argv=argv, variable_bytes=sizes.get("variables", {}))
    metrics_path = os.path.join(args.workdir, "metrics.json")
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            metrics = json.load(f)
        result["metrics"] = {k: v for k, v in metrics.items()
                             if not isinstance(v, dict)}
    tracker.dump(**{k: v for k, v in result.items()
                    if k not in ("peaks", "seconds", "cpu_seconds", "calls",
                                 "rss_after",
                                 "hwm_resets", "process_peak_bytes")})


# ---------------------------------------------------------------------------
# The parent.


def run(args) -> dict:
    """Prepares the data, runs the child, returns the result dict."""
    paths = prepare_data(args.data_dir, args.train, args.test)
    os.makedirs(args.scratch, exist_ok=True)
    phases_out = os.path.join(args.scratch, f"phases_{os.getpid()}.json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child",
           "--phases-out", phases_out, "--config", args.config,
           "--workdir", os.path.join(args.scratch, "workdir"),
           "--train-path", paths["train"], "--test-path", paths["test"],
           "--fan-in", str(args.fan_in), "--epochs", str(args.epochs)] + [
               f"--extra={e}" for e in args.extra]
    log_path = os.path.join(args.scratch, "child.log")
    load0 = os.getloadavg()[0]
    rc, killed = run_watched(cmd, log_path, ROOT, args.kill_gib * GIB)
    result = {"label": args.label, "num_train": args.train,
              "num_test": args.test, **SHAPE, "fan_in": args.fan_in,
              "epochs": args.epochs, "config": args.config,
              "extra": list(args.extra), "child_returncode": rc,
              "load_average": [load0, os.getloadavg()[0]],
              "cpus": os.cpu_count(), "log": log_path,
              "env": {k: os.environ.get(k) for k in (
                  "TF_ENABLE_ONEDNN_OPTS", "TF_ONEDNN_USE_SYSTEM_ALLOCATOR",
                  "GLIBC_TUNABLES") if k in os.environ}}
    if killed:
        result["killed_at_rss_bytes"] = killed
    if not args.keep_workdir:  # 2-4 GB of model files at 670k
        shutil.rmtree(os.path.join(args.scratch, "workdir"),
                      ignore_errors=True)
    if os.path.exists(phases_out):
        with open(phases_out) as f:
            result.update(json.load(f))
        os.remove(phases_out)
    else:
        with open(log_path) as f:
            result["error"] = f.read()[-3000:]
    return result


def table(result: dict) -> str:
    """The per-phase table (GiB, seconds) of one result."""
    peaks = result.get("peaks", {})
    lines = ["| phase | peak RSS GiB | RSS after GiB | seconds | CPU s | "
             "calls |", "|---|---|---|---|---|---|"]
    for name in PHASES:
        if name not in peaks:
            continue
        rss = result["rss_after"].get(name)
        lines.append(
            f"| {name} | {peaks[name] / GIB:.2f} | "
            f"{'-' if rss is None else f'{rss / GIB:.2f}'} | "
            f"{result['seconds'][name]:.1f} | "
            f"{result.get('cpu_seconds', {}).get(name, 0):.1f} | "
            f"{result['calls'].get(name, '-')} |")
    for name in result.get("running", []) if result.get(
            "killed_at_rss_bytes") else []:
        lines.append(f"| {name} (killed) | > "
                     f"{result['killed_at_rss_bytes'] / GIB:.2f} | | | | |")
    if peaks:
        killed = result.get("killed_at_rss_bytes")
        whole = (f"> {killed / GIB:.2f} (killed)" if killed else
                 f"{result['process_peak_bytes'] / GIB:.2f}")
        seconds = result.get("total_seconds")
        lines.append(f"| **whole process** | **{whole}** | | "
                     f"{'-' if seconds is None else f'{seconds:.1f}'} | | |")
    return "\n".join(lines)


def main(argv=None):
    """Runs the benchmark (or, with ``--child``, the job in this process);
    prints the table and writes ``--out``.

    Args:
      argv: command-line arguments (default ``sys.argv[1:]``).
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--train", type=int, default=20_000,
                   help="training instances (the validation split is 0.1 "
                        "of them)")
    p.add_argument("--test", type=int, default=2_000)
    p.add_argument("--fan-in", type=int, default=32)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--config", default="uniform_sparse")
    p.add_argument("--extra", action="append", default=[],
                   help="one more xmc-tf train flag, e.g. "
                        "--extra=--config.model.wide_connections=0")
    p.add_argument("--data-dir", default="/tmp/xmc_tf_run_memory/data")
    p.add_argument("--scratch", default="/tmp/xmc_tf_run_memory/run")
    p.add_argument("--keep-workdir", action="store_true",
                   help="keep the job's workdir (model files) in --scratch")
    p.add_argument("--kill-gib", type=float, default=9.0,
                   help="kill the job when its RSS passes this")
    p.add_argument("--label", default="run")
    p.add_argument("--out", default=None,
                   help="JSON file; rows of other labels in it are kept")
    # The child's arguments.
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--phases-out", help=argparse.SUPPRESS)
    p.add_argument("--workdir", help=argparse.SUPPRESS)
    p.add_argument("--train-path", help=argparse.SUPPRESS)
    p.add_argument("--test-path", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return
    result = run(args)
    print(table(result))
    if "metrics" in result:
        m = result["metrics"]
        print(f"P@1 {m.get('P@1', float('nan')):.2f}  P@5 "
              f"{m.get('P@5', float('nan')):.2f}  train_seconds "
              f"{m.get('train_seconds')}  metrics.json peak_memory_bytes "
              f"{m.get('peak_memory_bytes', 0) / GIB:.2f} GiB (ru_maxrss "
              "since the last reset: not the process's peak here)")
    for name, n in sorted(result.get("variable_bytes", {}).items(),
                          key=lambda kv: -kv[1]):
        print(f"  variables {name}: {n / 1e6:,.0f} MB")
    if result.get("error") or result.get("killed_at_rss_bytes"):
        print(json.dumps({k: result.get(k) for k in
                          ("child_returncode", "killed_at_rss_bytes",
                           "error")}, indent=1))
    if args.out:
        doc = {}
        if os.path.exists(args.out):
            with open(args.out) as f:
                doc = json.load(f)  # its other keys (description) are kept
        doc["runs"] = [r for r in doc.get("runs", [])
                       if r.get("label") != args.label] + [result]
        with open(args.out, "w") as f:
            json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
