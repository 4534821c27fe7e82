"""Scale benchmark: 670k and 2.8M labels end to end through ``xmc-tf train``.

What it measures
----------------
1. ``runs``: the main job, ``xmc-tf train`` (the CLI, one process per run,
   run one at a time under ``nice -n 10``), on synthetic data shaped like
   Amazon-670K (670,091 labels, 135,909 features, 5.45 labels and ~76
   feature tokens per instance) and Amazon-3M (2,812,281 labels, 337,067
   features, 36 labels and ~36 tokens per instance), written once as XC
   files (``xmc_tf.data.make_synthetic``, train + test split of one draw).
   Heads (``--heads``), all on the same sparse TF-IDF input and a
   ``SparseEmbeddingBag`` encoder of ``--encoder`` (512) units, batch 32
   (the paper's), Adam (``lazy_adam``), squared hinge unless noted, one
   epoch, no validation split:

   * ``uniform_sparse``: ``configs/uniform_sparse.py``, intermediate Dense
     of ``--intermediate`` (32,768, the paper's Amazon-670K setting),
     ``UniformSparseDense`` with s = 32 (670k) / 96 (3M) connections per
     label, SET every ``steps // 2`` steps (two rewires per run).
   * ``dense``: ``configs/dense.py`` without intermediate layer (the
     paper's dense baseline: encoder -> ``Dense(num_labels)``).
   * ``mach``: ``configs/mach.py``, BCE, intermediate 512, B = 8192,
     R = 16.
   * ``sampled``: ``configs/astra.py`` with ``sampler.kind="uniform"``
     (256 uniform negatives per batch), the uniform-sparse layer of the
     same s and intermediate width; evaluation scores every label.
   * ``base``: the same encoder with a 1,000-label dense head on the same
     features (labels folded mod 1,000): what every run costs besides the
     output side (data, TF-IDF, encoder + its Adam state, TensorFlow).

   Reported per run: time per training step (Keras' epoch line: epoch wall
   time / steps, the first step's tracing included), CPU seconds per step
   (user + system CPU time of the process from the model summary, printed
   just before ``fit``, to the epoch line, / steps: less sensitive to the
   other jobs on a shared machine than the wall time), peak RSS of the
   process when training ended (``/proc/PID/status`` ``VmHWM`` read when
   Keras prints the epoch line) and of the whole job (``metrics.json``
   ``peak_memory_bytes``: also evaluation, SavedModel export), the output
   side (train peak minus the ``base`` run's), ``output_layer_bytes`` and
   ``model_bytes`` (float32 variables), P@1/P@5 on the test split (a few
   hundred steps on synthetic data: a smoke check, not a result), the
   load average.
2. ``dense`` where it does not fit: the dense head's peak is predicted as
   ``base + bytes_per_label * m`` with ``bytes_per_label`` measured at
   670k, and the largest m that fits in ``--memory-gib`` (24) is given.
   A dense head is never started when its predicted peak exceeds
   ``--max-run-gib`` (16): the machine is shared.
3. ``pipeline`` (``--pipeline``): the input pipeline alone on an
   Amazon-670K-sized training set (490,449 instances by default): bytes of
   the dataset graph, RSS growth from building and iterating it, and the
   time per batch of 32 / 256 when batches are pulled as fast as possible
   (what a training step would wait for, at most).

Safety on a shared machine: a run whose RSS passes ``--kill-gib`` (14) is
killed (its row records ``killed_at_rss_bytes``); ``--steps 3m=8`` trains
a scale on fewer steps (a smaller training split, named in the data files).

Output: a table on stdout, JSON (``--out``), and a PNG (``--plot``) of the
peak RSS and the time per step against the number of labels, per head.

Timing: wall clock on a 2-core machine shared with other jobs (the load
average is recorded): times are upper bounds.

Usage::

    python benchmarks/scale.py --out scale.json --plot scale.png
    python benchmarks/scale.py --scales 670k --heads uniform_sparse,base
    python benchmarks/scale.py --pipeline --no-runs --out pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import proc_status_bytes  # noqa: E402  (benchmarks/peers.py)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GIB = 2**30

#: Synthetic data sets shaped like the XC repo's Amazon-670K / Amazon-3M.
SCALES = {
    "670k": dict(num_labels=670_091, num_features=135_909,
                 labels_per_instance=5.45, features_per_instance=76.0,
                 fan_in=32, train_steps=64, num_test=1000),
    "3m": dict(num_labels=2_812_281, num_features=337_067,
               labels_per_instance=36.0, features_per_instance=36.0,
               fan_in=96, train_steps=24, num_test=500),
    # A smoke test of this script (seconds): --scales tiny.
    "tiny": dict(num_labels=20_000, num_features=5_000,
                 labels_per_instance=5.0, features_per_instance=30.0,
                 fan_in=32, train_steps=8, num_test=100),
}
_DEFAULT_STEPS = {k: v["train_steps"] for k, v in SCALES.items()}
HEADS = ("base", "uniform_sparse", "mach", "sampled", "dense")
BATCH = 32
BASE_LABELS = 1000


def _load():
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


# ---------------------------------------------------------------------------
# Data.


def prepare_data(scale: str, data_dir: str, seed: int = 0) -> dict:
    """Writes ``{scale}_train.txt`` / ``_test.txt`` (and the ``base``
    files with labels folded mod 1,000) once; returns their paths.

    The training split has ``train_steps * 32`` instances; a number of
    steps other than the default (``--steps``) is part of the file names.
    """
    from xmc_tf import data as xdata
    spec = SCALES[scale]
    os.makedirs(data_dir, exist_ok=True)
    tag = scale if spec["train_steps"] == _DEFAULT_STEPS.get(scale) else (
        f"{scale}_{spec['train_steps']}steps")
    paths = {k: os.path.join(data_dir, f"{tag}_{k}.txt")
             for k in ("train", "test", "base_train", "base_test")}
    if all(os.path.exists(p) for p in paths.values()):
        return paths
    n_train = spec["train_steps"] * BATCH
    ds = xdata.make_synthetic(
        n_train + spec["num_test"], spec["num_features"], spec["num_labels"],
        labels_per_instance=spec["labels_per_instance"],
        features_per_instance=spec["features_per_instance"], seed=seed)
    folded = ds.labels.tocoo()
    folded = type(ds.labels)((np.ones_like(folded.data),
                              (folded.row, folded.col % BASE_LABELS)),
                             shape=(ds.num_instances, BASE_LABELS))
    folded.sum_duplicates()
    folded.data[:] = 1.0
    for name, labels in (("", ds.labels), ("base_", folded)):
        for part, rows in (("train", slice(0, n_train)),
                           ("test", slice(n_train, None))):
            xdata.write_xc(paths[name + part], xdata.XCDataset(
                ds.features[rows], labels[rows]))
    return paths


# ---------------------------------------------------------------------------
# Runs through the CLI.


def _overrides(scale: str, head: str, args) -> tuple[str, list[str]]:
    spec = SCALES[scale]
    steps = spec["train_steps"]
    common = [f"--config.model.encoder_dims=({args.encoder},)",
              f"--config.train.batch_size={BATCH}",
              "--config.train.epochs=1", "--config.train.verbose=2",
              "--config.data.validation_fraction=0",
              "--config.eval.batch_size=64"]
    sparse_layer = [f"--config.model.intermediate_dim={args.intermediate}",
                    f"--config.model.connections_per_label={spec['fan_in']}",
                    f"--config.set.every_n_steps={max(1, steps // 2)}"]
    if head == "uniform_sparse":
        return "uniform_sparse", common + sparse_layer
    if head == "sampled":
        return "astra", common + sparse_layer + [
            "--config.sampler.kind=uniform",
            "--config.sampler.num_negatives=256"]
    if head == "mach":
        return "mach", common + ["--config.model.intermediate_dim=512",
                                 "--config.model.num_buckets=8192",
                                 "--config.model.num_repetitions=16"]
    if head in ("dense", "base"):
        return "dense", common + ["--config.model.intermediate_dim=0"]
    raise ValueError(f"unknown head {head!r}")


_EPOCH = re.compile(r"^\s*(\d+)/(\d+) - (\d+)s - ([\d.]+)(ms|s)/step")


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (``/proc/PID/stat``)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class _Watchdog:
    """Kills one run (SIGKILL to its pid) when its RSS passes a limit.

    Args:
        pid: the process id of the run (a child of this script).
        limit_bytes: RSS limit in bytes; checked every 0.5 seconds.
    """

    def __init__(self, pid: int, limit_bytes: float):
        import threading
        self.pid, self.limit, self.killed_at = pid, limit_bytes, None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self):
        import signal
        while not self._done.wait(0.5):
            rss = proc_status_bytes(self.pid, "VmRSS")
            if rss is None:
                return
            if rss > self.limit:
                self.killed_at = rss
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except OSError:
                    pass
                return

    def stop(self):
        self._done.set()
        self._thread.join()


def run_cli(scale: str, head: str, paths: dict, args) -> dict:
    """One ``xmc-tf train`` process; returns the row of the table."""
    config, overrides = _overrides(scale, head, args)
    prefix = "base_" if head == "base" else ""
    workdir = os.path.join(args.workdir, f"{scale}_{head}")
    cmd = (["nice", "-n", "10", os.path.join(os.path.dirname(sys.executable),
                                             "xmc-tf"), "train",
            f"--config={os.path.join(ROOT, 'configs', config + '.py')}",
            f"--workdir={workdir}", "--overwrite",
            f"--config.data.train={paths[prefix + 'train']}",
            f"--config.data.test={paths[prefix + 'test']}"] + overrides)
    log_path = workdir + ".log"
    os.makedirs(args.workdir, exist_ok=True)
    start, load0 = time.perf_counter(), _load()
    train_peak, step_s, steps = None, None, None
    cpu_fit, cpu_step = None, None
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        log.write(" ".join(cmd) + "\n")
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, env=env,
                                cwd=ROOT)
        watchdog = _Watchdog(proc.pid, args.kill_gib * GIB)
        for line in proc.stdout:
            log.write(line)
            if cpu_fit is None and "Non-trainable params" in line:
                cpu_fit = _cpu_seconds(proc.pid)  # summary: fit starts
            m = _EPOCH.match(line)
            if m and train_peak is None:
                train_peak = proc_status_bytes(proc.pid)
                steps = int(m.group(2))
                step_s = float(m.group(4)) / (1000 if m.group(5) == "ms"
                                              else 1)
                if int(m.group(3)) >= 10:  # Keras rounds "7s/step"
                    step_s = int(m.group(3)) / steps
                cpu_now = _cpu_seconds(proc.pid)
                if cpu_fit is not None and cpu_now is not None:
                    cpu_step = (cpu_now - cpu_fit) / steps
        rc = proc.wait()
        watchdog.stop()
    row = {"scale": scale, "head": head, "num_labels": (
        BASE_LABELS if head == "base" else SCALES[scale]["num_labels"]),
        "returncode": rc, "wall_seconds": round(time.perf_counter() - start,
                                                1),
        "steps": steps, "step_seconds": step_s,
        "cpu_seconds_per_step": cpu_step,
        "train_peak_bytes": train_peak, "load_average": [load0, _load()],
        "log": log_path, "command": " ".join(cmd)}
    if watchdog.killed_at:
        row["killed_at_rss_bytes"] = watchdog.killed_at
    if rc != 0:
        with open(log_path) as f:
            row["error"] = f.read()[-2000:]
        return row
    with open(os.path.join(workdir, "metrics.json")) as f:
        metrics = json.load(f)
    for key in ("peak_memory_bytes", "output_layer_bytes", "model_bytes",
                "train_seconds", "P@1", "P@5", "num_train_instances",
                "num_test_instances"):
        row[key] = metrics.get(key)
    if not args.keep_workdirs:
        shutil.rmtree(workdir, ignore_errors=True)
    return row


def dense_prediction(rows: list[dict], args) -> list[dict]:
    """Dense-head peaks where they were not run: base + bytes/label * m."""
    out = []
    by = {(r["scale"], r["head"]): r for r in rows if r.get("returncode") == 0}
    ref = by.get(("670k", "dense"))
    base_ref = by.get(("670k", "base"))
    if not ref or not base_ref:
        return out
    m_ref = SCALES["670k"]["num_labels"]
    per_label = (ref["train_peak_bytes"] - base_ref["train_peak_bytes"]) / m_ref
    for scale, spec in SCALES.items():
        base = by.get((scale, "base"))
        if (scale, "dense") in by or base is None:
            continue
        m = spec["num_labels"]
        peak = base["train_peak_bytes"] + per_label * m
        fits = int((args.memory_gib * GIB - base["train_peak_bytes"]) /
                   per_label)
        out.append({"scale": scale, "head": "dense (predicted)",
                    "num_labels": m, "train_peak_bytes": int(peak),
                    "bytes_per_label": round(per_label, 1),
                    "output_layer_bytes": 4 * (args.encoder + 1) * m,
                    "largest_m_in_memory": fits,
                    "memory_gib": args.memory_gib})
    return out


# ---------------------------------------------------------------------------
# The input pipeline alone.


def pipeline_benchmark(args) -> dict:
    import resource

    import tensorflow as tf

    from xmc_tf import data as xdata

    def rss():
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024

    spec = SCALES["670k"]
    t = time.perf_counter()
    ds = xdata.make_synthetic(
        args.pipeline_instances, spec["num_features"], spec["num_labels"],
        labels_per_instance=spec["labels_per_instance"],
        features_per_instance=spec["features_per_instance"], seed=0)
    ds.features, _ = xdata.normalize_features(ds.features, "tfidf")
    gen_s = time.perf_counter() - t
    arrays = (ds.features.data.nbytes + ds.features.indices.nbytes +
              ds.features.indptr.nbytes + ds.labels.indices.nbytes +
              ds.labels.indptr.nbytes)
    out = {"num_instances": ds.num_instances, "feature_nnz": ds.features.nnz,
           "label_nnz": ds.labels.nnz, "array_bytes": arrays,
           "generate_seconds": round(gen_s, 1), "batches": {}}
    for bs in (32, 256):
        rss0 = rss()
        t = time.perf_counter()
        tfds = xdata.make_tf_dataset(ds, bs, shuffle=True, seed=0,
                                     repeat=True)
        graph = tfds._as_serialized_graph(  # pylint: disable=protected-access
            external_state_policy=tf.data.experimental.ExternalStatePolicy
            .WARN).numpy()
        build_s = time.perf_counter() - t
        it = iter(tfds)
        for _ in range(20):  # warm-up (tracing, prefetch)
            next(it)
        t, cpu = time.perf_counter(), time.process_time()
        for _ in range(args.pipeline_batches):
            x, y = next(it)
        wall = (time.perf_counter() - t) / args.pipeline_batches
        cpu = (time.process_time() - cpu) / args.pipeline_batches
        out["batches"][bs] = {
            "graph_bytes": len(graph), "build_seconds": round(build_s, 3),
            "ms_per_batch": round(1000 * wall, 3),
            "cpu_ms_per_batch": round(1000 * cpu, 3),
            "rss_growth_bytes": rss() - rss0}
        del it, tfds
    out["peak_rss_bytes"] = resource.getrusage(
        resource.RUSAGE_SELF).ru_maxrss * 1024
    out["load_average"] = _load()
    return out


# ---------------------------------------------------------------------------
# Output.


def _gib(v):
    return "-" if v is None else f"{v / GIB:.2f}"


def table(rows: list[dict]) -> str:
    cols = ("scale", "head", "labels", "s/step", "CPU s/step",
            "train peak GiB",
            "job peak GiB", "output side GiB", "head MB", "model MB",
            "P@1", "P@5")
    base = {r["scale"]: r.get("train_peak_bytes") for r in rows
            if r["head"] == "base" and r.get("returncode") == 0}
    lines = ["| " + " | ".join(cols) + " |",
             "|" + "---|" * len(cols)]
    for r in rows:
        side = None
        if r["head"] != "base" and r.get("train_peak_bytes") and base.get(
                r["scale"]):
            side = r["train_peak_bytes"] - base[r["scale"]]
        err = r.get("returncode") not in (None, 0)
        cells = [r["scale"], r["head"] + (" (failed)" if err else ""),
                 f"{r['num_labels']:,}",
                 "-" if r.get("step_seconds") is None else
                 f"{r['step_seconds']:.2f}",
                 "-" if r.get("cpu_seconds_per_step") is None else
                 f"{r['cpu_seconds_per_step']:.2f}",
                 _gib(r.get("train_peak_bytes")),
                 _gib(r.get("peak_memory_bytes")), _gib(side),
                 "-" if r.get("output_layer_bytes") is None else
                 f"{r['output_layer_bytes'] / 1e6:,.0f}",
                 "-" if r.get("model_bytes") is None else
                 f"{r['model_bytes'] / 1e6:,.0f}",
                 "-" if r.get("P@1") is None else f"{r['P@1']:.2f}",
                 "-" if r.get("P@5") is None else f"{r['P@5']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: str, steady=None) -> None:
    """Peak memory and seconds per step against the number of labels, a
    line per head (a whole CLI step; ``step_seconds_without_stop`` where a
    run records time its process was stopped).

    Args:
      rows: the JSON's ``"runs"``.
      path: PNG file to write.
      steady: optional ``[(num_labels, seconds)]`` of the uniform-sparse
        head's steady-state step (``benchmarks/roofline.py``), drawn as
        stars beside the whole CLI steps.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (ax_mem, ax_time) = plt.subplots(1, 2, figsize=(11, 4.2))
    heads = [h for h in HEADS if h != "base"]
    for head in heads:
        pts = sorted(((r["num_labels"], r) for r in rows
                      if r["head"] == head and r.get("returncode") == 0),
                     key=lambda p: p[0])
        if pts:
            xs = [p[0] for p in pts]
            line, = ax_mem.plot(xs, [p[1]["train_peak_bytes"] / GIB
                                     for p in pts], "o-", label=head)
            ax_time.plot(xs, [p[1].get("step_seconds_without_stop",
                                       p[1]["step_seconds"]) for p in pts],
                         "o-", color=line.get_color(),
                         label=f"{head}: whole CLI step")
            if head == "uniform_sparse" and steady:
                ax_time.plot(*zip(*sorted(steady)), "*-", ms=11,
                             color=line.get_color(),
                             label="uniform_sparse: steady-state step "
                                   "(roofline)")
            if head == "dense":
                pred = [r for r in rows if r["head"] == "dense (predicted)"]
                for r in pred:
                    ax_mem.plot([xs[-1], r["num_labels"]],
                                [pts[-1][1]["train_peak_bytes"] / GIB,
                                 r["train_peak_bytes"] / GIB], "x--",
                                color=line.get_color(),
                                label="dense (predicted)")
    for scale, spec in SCALES.items():
        for r in rows:
            if r["head"] == "base" and r["scale"] == scale and r.get(
                    "train_peak_bytes"):
                ax_mem.plot([spec["num_labels"]],
                            [r["train_peak_bytes"] / GIB], "k_", ms=14)
    ax_mem.axhline(24, color="grey", lw=0.8, ls=":")
    ax_mem.text(0.02, 24.3, "24 GiB machine", color="grey", fontsize=8,
                transform=ax_mem.get_yaxis_transform())
    for ax, label in ((ax_mem, "peak RSS when training ended (GiB)"),
                      (ax_time, "seconds per step of 32 (2 shared cores)")):
        ax.set_xscale("log")
        ax.set_xlabel("number of labels")
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
    ax_mem.legend(fontsize=8)
    if steady:
        ax_time.set_yscale("log")
        ax_time.legend(fontsize=7)
    ax_mem.set_title("memory (black bar: same job without output side)",
                     fontsize=9)
    ax_time.set_title("time per training step", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="670k,3m")
    p.add_argument("--heads", default=",".join(HEADS))
    p.add_argument("--encoder", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=32768)
    p.add_argument("--data-dir", default="/tmp/xmc_tf_scale/data")
    p.add_argument("--workdir", default="/tmp/xmc_tf_scale/runs")
    p.add_argument("--keep-workdirs", action="store_true")
    p.add_argument("--memory-gib", type=float, default=24.0,
                   help="machine memory for the dense-head prediction")
    p.add_argument("--max-run-gib", type=float, default=16.0,
                   help="never start a dense run predicted above this")
    p.add_argument("--kill-gib", type=float, default=14.0,
                   help="kill a run whose RSS passes this (shared machine)")
    p.add_argument("--steps", default="",
                   help="training steps per scale, e.g. 3m=8 (default: "
                        + ", ".join(f"{k}={v}" for k, v in
                                    _DEFAULT_STEPS.items()) + ")")
    p.add_argument("--no-runs", action="store_true")
    p.add_argument("--pipeline", action="store_true")
    p.add_argument("--pipeline-instances", type=int, default=490_449)
    p.add_argument("--pipeline-batches", type=int, default=500)
    p.add_argument("--previous", default=None,
                   help="JSON of an earlier run: keep its rows for runs "
                        "not repeated now (and its pipeline numbers "
                        "without --pipeline)")
    p.add_argument("--out", default=None, help="write the results as JSON")
    p.add_argument("--plot", default=None, help="write the PNG here")
    args = p.parse_args(argv)
    for item in filter(None, args.steps.split(",")):
        scale, steps = item.split("=")
        SCALES[scale]["train_steps"] = int(steps)

    rows, previous = [], {}
    if args.previous and os.path.exists(args.previous):
        with open(args.previous) as f:
            previous = json.load(f)
        rows = [r for r in previous.get("runs", [])
                if r.get("head") != "dense (predicted)"]
    result = {"machine": {"cpus": os.cpu_count(), "load_average": _load()},
              "batch_size": BATCH, "encoder": args.encoder,
              "intermediate": args.intermediate}
    if not args.no_runs:
        heads = args.heads.split(",")
        for scale in args.scales.split(","):
            paths = prepare_data(scale, args.data_dir)
            for head in sorted(heads, key=HEADS.index):
                if head == "dense":
                    pred = dense_prediction(rows, args)
                    over = [r for r in pred if r["scale"] == scale and
                            r["train_peak_bytes"] > args.max_run_gib * GIB]
                    if over:
                        print(f"skip dense at {scale}: predicted "
                              f"{over[0]['train_peak_bytes'] / GIB:.1f} GiB",
                              flush=True)
                        continue
                print(f"run {scale} {head} ...", flush=True)
                rows = [r for r in rows
                        if (r["scale"], r["head"]) != (scale, head)]
                rows.append(run_cli(scale, head, paths, args))
                print(json.dumps(rows[-1]), flush=True)
    rows += dense_prediction(rows, args)
    rows.sort(key=lambda r: (list(SCALES).index(r["scale"]),
                             HEADS.index(r["head"].split()[0])))
    result["runs"] = rows
    if args.pipeline:
        result["pipeline"] = pipeline_benchmark(args)
    elif "pipeline" in previous:
        result["pipeline"] = previous["pipeline"]
    print(table([r for r in rows if r["head"] != "dense (predicted)"] +
                [r for r in rows if r["head"] == "dense (predicted)"]))
    for r in rows:
        if r["head"] == "dense (predicted)":
            print(f"dense head at {r['scale']} ({r['num_labels']:,} labels): "
                  f"predicted train peak {r['train_peak_bytes'] / GIB:.1f} "
                  f"GiB ({r['bytes_per_label']:.0f} B/label over the base "
                  f"run, measured at 670k); at most "
                  f"{r['largest_m_in_memory']:,} labels fit in "
                  f"{r['memory_gib']:.0f} GiB")
    if "pipeline" in result:
        print(json.dumps(result["pipeline"], indent=1))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
