"""Whole training epochs at Amazon-670K size, extrapolated to 490k instances.

What it measures
----------------
Issue 32, item 4: the time of one full epoch of ``xmc-tf train`` on an
Amazon-670K-shaped training set (490,449 instances in the real set), with
the uniform-sparse head and with the sampled head, and the evaluation time
per 1,000 test instances.

* **Data**: one synthetic draw shaped like Amazon-670K (670,091 labels,
  135,909 features, 5.45 labels and ~76 feature tokens per instance;
  ``xmc_tf.data.make_synthetic``, as ``benchmarks/scale.py`` and
  ``benchmarks/run_memory.py``), written once as XC files: the largest
  training split and ``--test`` test instances.  The training split of
  fraction ``f`` is the first ``round(f * 490,449)`` instances of it
  (``--fractions``, default 0.05, 0.1 and 0.2).
* **Runs**: one ``xmc-tf train`` job per (head, fraction) -- the CLI's own
  ``main`` in a child process -- with the packaged config's defaults, except
  ``validation_fraction=0`` (the epoch is the training pass alone; the
  per-epoch validation costs what the evaluation below costs per instance)
  and the epochs (``--epochs``, 1; the sampled head 2, see below):

  - ``uniform_sparse``: ``configs/uniform_sparse.py`` (batch 64, encoder
    1024, intermediate 4096, s = 64, the wide path capped at 64 MiB, SET
    every 1,000 steps, LazyAdam, squared hinge);
  - ``sampled``: ``configs/astra.py`` (the same encoder and intermediate,
    uniform-sparse ``sampled_layer``; 32 hard negatives from a faiss IVF
    index over the label vectors and 256 uniform ones per instance,
    squared hinge on the candidates).  Its first epoch draws uniform
    negatives only (``refresh_start_epoch=1``); from the second on, every
    epoch starts with an index refresh.  The steady-state epoch is the
    second, which is what is reported (the first is in the JSON).

  A callback appended to the job's own (``xmc_tf.job.fit.make_callbacks``)
  records the wall time of every epoch (``on_epoch_begin`` ->
  ``on_epoch_end``, after the head's own epoch-end callbacks) and of every
  step; the sampled head's index refresh runs in an earlier callback's
  ``on_epoch_begin`` and is added from the epoch's logs
  (:func:`epoch_total`); the job's phases (loading, building, checkpoint per epoch, test
  evaluation, export) are timed by wrapping the functions that run them.
* **Linearity**: epoch seconds against training instances, a least-squares
  line ``a + b N`` over the fractions, its largest relative residual, and
  its value at 490,449 instances (extrapolated, not measured).  The
  steady-state step time (median over the epoch's steps) is also compared
  across sizes: the same step at every size is what makes the epoch linear.
* **Evaluation**: the job's test evaluation (``xmc_tf.job.run.
  evaluate_model``: every label scored, top-5 per instance, P@k / nDCG /
  PSP) in seconds per 1,000 test instances.

Timing: wall clock on the 2-core development machine, shared with other
jobs; run it under ``flock -x /work/runs/timing.lock`` (the load average
is recorded per run).  Peak RSS of each job is recorded too.

Usage::

    flock -x /work/runs/timing.lock python benchmarks/epoch.py \\
        --data-dir /work/runs/epoch/data --scratch /work/runs/epoch/scratch
    python benchmarks/epoch.py --fractions 0.002 --test 200 --out /tmp/e.json
    # the same job with tf.math.top_k (metrics, evaluation), added to the file
    python benchmarks/epoch.py --heads uniform_sparse --fractions 0.1 \
        --tf-top-k --merge

Output: a table on stdout and JSON (``--out``, default
``benchmarks/results/epoch.json``).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import proc_status_bytes, run_watched  # noqa: E402  (benchmarks/peers.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30

#: Amazon-670K (the XC repository's statistics; 490,449 training instances).
SHAPE = dict(num_labels=670_091, num_features=135_909,
             labels_per_instance=5.45, features_per_instance=76.0)
FULL_TRAIN = 490_449

#: head -> (packaged config, extra overrides, epochs run, epoch reported).
HEADS = {
    "uniform_sparse": ("uniform_sparse", [], 1, 0),
    "sampled": ("astra", [], 2, 1),
}


# ---------------------------------------------------------------------------
# Data.


def prepare_data(data_dir: str, sizes: list[int], num_test: int,
                 seed: int = 0) -> dict:
    """Writes ``670k_train_{n}.txt`` for every ``n`` in ``sizes`` (prefixes
    of one draw) and ``670k_test_{num_test}.txt`` once; returns
    ``{"train": {n: path}, "test": path}``."""
    paths = {"train": {n: os.path.join(data_dir, f"670k_train_{n}.txt")
                       for n in sizes},
             "test": os.path.join(data_dir, f"670k_test_{num_test}.txt")}
    if (all(os.path.exists(p) for p in paths["train"].values())
            and os.path.exists(paths["test"])):
        return paths
    from xmc_tf import data as xdata
    os.makedirs(data_dir, exist_ok=True)
    largest = max(sizes)
    start = time.perf_counter()
    ds = xdata.make_synthetic(
        largest + num_test, SHAPE["num_features"], SHAPE["num_labels"],
        labels_per_instance=SHAPE["labels_per_instance"],
        features_per_instance=SHAPE["features_per_instance"], seed=seed)
    for n in sizes:
        xdata.write_xc(paths["train"][n], xdata.XCDataset(
            ds.features[:n], ds.labels[:n]))
    xdata.write_xc(paths["test"], xdata.XCDataset(
        ds.features[largest:], ds.labels[largest:]))
    print(f"data written in {time.perf_counter() - start:.0f} s",
          flush=True)
    return paths


# ---------------------------------------------------------------------------
# The child: one job, its epochs and phases timed.


def child(args) -> None:
    """Runs ``xmc-tf train`` in this process and writes the timings to
    ``args.result``."""
    import keras
    import numpy as np

    from xmc_tf_cli import cli
    from xmc_tf.job import checkpoint as xckpt
    from xmc_tf import saving
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import inputs as xinputs
    from xmc_tf.job import run as xrun

    phases: dict = {}
    epochs: list = []

    def timed(owner, attr, name):
        fn = getattr(owner, attr)

        @functools.wraps(fn)
        def wrapped(*a, **k):
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                phases.setdefault(name, []).append(
                    time.perf_counter() - start)
        setattr(owner, attr, wrapped)

    for owner, attr, name in (
            (xinputs, "read_datasets", "load"),
            (xinputs, "prepare_splits", "normalise"),
            (xfit, "build_and_compile", "build"),
            (xckpt.Checkpointer, "save", "checkpoint"),
            (xrun, "evaluate_model", "test evaluation"),
            (saving, "export_saved_model", "export: SavedModel"),
            (keras.Model, "save", "export: model.keras")):
        timed(owner, attr, name)

    class EpochTimer(keras.callbacks.Callback):
        """Wall time of every epoch and step (appended after the job's own
        callbacks, before the checkpointer)."""

        def on_epoch_begin(self, epoch, logs=None):
            self._t0 = self._t = time.perf_counter()
            self._cpu0 = time.process_time()
            self._steps = []

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            self._steps.append(now - self._t)
            self._t = now

        def on_epoch_end(self, epoch, logs=None):
            steps = np.asarray(self._steps)
            epochs.append({
                "epoch": int(epoch),
                "seconds": time.perf_counter() - self._t0,
                "cpu_seconds": time.process_time() - self._cpu0,
                "steps": int(steps.size),
                "step_median_s": float(np.median(steps)),
                "step_mean_s": float(steps.mean()),
                "first_step_s": float(steps[0]),
                "slowest_steps_s": sorted(steps.tolist())[-3:],
                "index_refresh_seconds": float(
                    (logs or {}).get("index_refresh_seconds", 0.0)),
                "loss": float(np.ravel((logs or {}).get("loss", np.nan))[0]),
                "peak_rss_bytes": proc_status_bytes(os.getpid(), "VmHWM"),
            })
            print(f"[epoch] {epoch}: {epochs[-1]['seconds']:.1f} s, "
                  f"{steps.size} steps, median step "
                  f"{epochs[-1]['step_median_s'] * 1e3:.0f} ms",
                  file=sys.stderr, flush=True)

    if args.tf_top_k:  # the path before Xmc>TopK, for comparison
        from xmc_tf.ops import topk as xtopk
        xtopk.top_k_supported = lambda: False

    make = xfit.make_callbacks

    def make_callbacks(*a, **k):
        return make(*a, **k) + [EpochTimer()]
    xfit.make_callbacks = make_callbacks

    argv = ["xmc-tf", "train", f"--config={args.config}",
            f"--workdir={args.workdir}", "--overwrite",
            f"--config.data.train={args.train_path}",
            f"--config.data.test={args.test_path}",
            "--config.data.validation_fraction=0",
            f"--config.train.epochs={args.epochs}"] + list(args.extra)
    start = time.perf_counter()
    rc = cli.main(argv)
    result = {"returncode": rc, "argv": argv, "epochs": epochs,
              "phases": phases,
              "total_seconds": time.perf_counter() - start,
              "process_peak_bytes": proc_status_bytes(os.getpid(), "VmHWM")}
    metrics_path = os.path.join(args.workdir, "metrics.json")
    if os.path.exists(metrics_path):
        with open(metrics_path) as f:
            result["metrics"] = {k: v for k, v in json.load(f).items()
                                 if not isinstance(v, dict)}
    with open(args.result, "w") as f:
        json.dump(result, f, indent=1)


# ---------------------------------------------------------------------------
# The parent.


def run_one(head: str, n_train: int, paths: dict, args) -> dict:
    """One job (a child process); returns its row."""
    config, extra, num_epochs, reported = HEADS[head]
    name = f"{head}_{n_train}"
    workdir = os.path.join(args.scratch, name)
    result_path = os.path.join(args.scratch, name + ".json")
    if args.tf_top_k:
        name += "_tf_top_k"
        workdir += "_tf_top_k"
        result_path = os.path.join(args.scratch, name + ".json")
    cmd = [sys.executable, os.path.abspath(__file__), "--child",
           "--config", config, "--workdir", workdir,
           "--train-path", paths["train"][n_train],
           "--test-path", paths["test"], "--epochs", str(num_epochs),
           "--result", result_path] + [f"--extra={e}" for e in extra] + (
               ["--tf-top-k"] if args.tf_top_k else [])
    log_path = os.path.join(args.scratch, name + ".log")
    load0 = os.getloadavg()
    print(f"{name}: running (log {log_path})", flush=True)
    rc, killed = run_watched(cmd, log_path, ROOT, args.kill_gib * GIB,
                             poll_s=0.5)
    row = {"head": head, "config": config, "extra": extra,
           "top_k": "tf.math.top_k" if args.tf_top_k else "xmc_tf.ops.topk",
           "num_train": n_train, "fraction_of_full": n_train / FULL_TRAIN,
           "epochs_run": num_epochs, "epoch_reported": reported,
           "child_returncode": rc, "load_average_before": load0,
           "load_average_after": os.getloadavg(), "log": log_path}
    if killed:
        row["killed_at_rss_bytes"] = killed
    shutil.rmtree(workdir, ignore_errors=True)  # 1-2 GB of model files
    if not os.path.exists(result_path):
        with open(log_path) as f:
            row["error"] = f.read()[-3000:]
        return row
    with open(result_path) as f:
        res = json.load(f)
    os.remove(result_path)
    row.update(res)
    if len(res["epochs"]) > reported:
        ep = res["epochs"][reported]
        row["epoch_seconds"] = ep["seconds"]
        row["step_median_s"] = ep["step_median_s"]
        row["steps"] = ep["steps"]
        row["checkpoint_seconds"] = (res["phases"].get("checkpoint") or
                                     [None])[reported]
    ev = res["phases"].get("test evaluation")
    if ev:
        row["eval_seconds"] = ev[0]
        row["eval_seconds_per_1k"] = ev[0] / args.test * 1000
    return row


def epoch_total(row: dict) -> float | None:
    """Seconds of the reported epoch with its index refresh: the refresh
    runs in ``RefreshIndex.on_epoch_begin``, before the timer's own
    ``on_epoch_begin`` (it comes later in the callback list), so
    ``epoch_seconds`` holds the steps and the epoch-end callbacks and the
    refresh is added from the epoch's logs (0 for the uniform-sparse
    head)."""
    if row.get("epoch_seconds") is None:
        return None
    ep = row["epochs"][row["epoch_reported"]]
    return row["epoch_seconds"] + ep.get("index_refresh_seconds", 0.0)


def linear_fit(rows: list[dict]) -> dict | None:
    """Least-squares ``epoch seconds = a + b N`` over the rows of one head
    (:func:`epoch_total`: with the index refresh); its largest relative
    residual and its value at :data:`FULL_TRAIN`."""
    import numpy as np
    pts = [(r["num_train"], epoch_total(r)) for r in rows
           if r.get("epoch_seconds") is not None]
    if len(pts) < 2:
        return None
    n, t = np.array(pts, dtype=float).T
    b, a = np.polyfit(n, t, 1)
    fit = a + b * n
    return {"intercept_s": float(a), "seconds_per_instance": float(b),
            "points": len(pts),
            "max_relative_residual": float(np.max(np.abs(t - fit) / t)),
            "full_epoch_s": float(a + b * FULL_TRAIN),
            "full_epoch_proportional_s": float(
                np.mean(t / n) * FULL_TRAIN)}


def table(rows: list[dict], fits: dict) -> str:
    lines = ["| head | train instances | epoch s (refresh s) | steps | "
             "median step ms | "
             "s / 1k instances | checkpoint s | eval s / 1k test | "
             "peak GiB | load |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head = r["head"] + (" (tf.math.top_k)" if r.get("top_k") ==
                            "tf.math.top_k" else "")
        if r.get("epoch_seconds") is None:
            lines.append(f"| {head} | {r['num_train']:,} | failed "
                         f"(rc {r.get('child_returncode')}) | | | | | | | |")
            continue
        lines.append(
            f"| {head} | {r['num_train']:,} | {epoch_total(r):.0f} "
            f"({epoch_total(r) - r['epoch_seconds']:.0f}) | "
            f"{r['steps']} | {r['step_median_s'] * 1e3:.0f} | "
            f"{epoch_total(r) / r['num_train'] * 1e3:.2f} | "
            f"{r.get('checkpoint_seconds') or 0:.1f} | "
            f"{r.get('eval_seconds_per_1k', float('nan')):.1f} | "
            f"{(r.get('process_peak_bytes') or 0) / GIB:.2f} | "
            f"{r['load_average_before'][0]:.1f}-"
            f"{r['load_average_after'][0]:.1f} |")
    for head, fit in fits.items():
        if fit:
            lines.append(
                f"{head}: epoch = {fit['intercept_s']:.1f} s + "
                f"{fit['seconds_per_instance'] * 1e3:.3f} ms x N (max "
                f"residual {fit['max_relative_residual']:.1%}); at "
                f"{FULL_TRAIN:,}: {fit['full_epoch_s']:.0f} s "
                f"({fit['full_epoch_s'] / 60:.1f} min) extrapolated")
    return "\n".join(lines)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--config")
    p.add_argument("--workdir")
    p.add_argument("--train-path")
    p.add_argument("--test-path")
    p.add_argument("--result")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--extra", action="append", default=[])
    p.add_argument("--fractions", default="0.05,0.1,0.2",
                   help="training sizes as fractions of 490,449")
    p.add_argument("--heads", default="uniform_sparse,sampled")
    p.add_argument("--test", type=int, default=2000)
    p.add_argument("--data-dir", default="/tmp/xmc_epoch_data")
    p.add_argument("--scratch", default="/tmp/xmc_epoch_scratch")
    p.add_argument("--kill-gib", type=float, default=12.0)
    p.add_argument("--tf-top-k", action="store_true",
                   help="run the jobs with tf.math.top_k in the metrics and "
                        "the evaluation (the code before Xmc>TopK)")
    p.add_argument("--merge", action="store_true",
                   help="add the rows to --out's existing rows (the fits "
                        "use the rows of the xmc_tf.ops.topk runs)")
    p.add_argument("--out", default=os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", "epoch.json"))
    args = p.parse_args(argv)
    if args.child:
        child(args)
        return None
    sizes = [int(round(float(f) * FULL_TRAIN))
             for f in args.fractions.split(",")]
    heads = args.heads.split(",")
    for h in heads:
        if h not in HEADS:
            raise SystemExit(f"unknown head {h!r}; have {sorted(HEADS)}")
    paths = prepare_data(args.data_dir, sizes, args.test)
    os.makedirs(args.scratch, exist_ok=True)
    rows, fits = [], {}
    for head in heads:
        head_rows = []
        for n in sizes:
            row = run_one(head, n, paths, args)
            head_rows.append(row)
            print(json.dumps({k: row.get(k) for k in (
                "head", "num_train", "epoch_seconds", "steps",
                "step_median_s", "eval_seconds_per_1k", "error")}),
                flush=True)
        rows += head_rows
        fits[head] = linear_fit(head_rows)
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            old = json.load(f)
        rows = old["rows"] + rows
        fits = {h: linear_fit([r for r in rows if r["head"] == h and r.get(
            "top_k", "xmc_tf.ops.topk") == "xmc_tf.ops.topk"])
            for h in HEADS if any(r["head"] == h for r in rows)}
        sizes = sorted(set(old["sizes"]) | set(sizes))
    print(table(rows, fits), flush=True)
    result = {"shape": SHAPE, "full_train": FULL_TRAIN, "num_test": args.test,
              "sizes": sizes, "rows": rows, "fits": fits,
              "cpus": os.cpu_count()}
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main()
