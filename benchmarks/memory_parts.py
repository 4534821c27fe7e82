"""Where the memory of a training run goes, part by part (issue 59 item 4).

What it measures
----------------
For each scale of ``benchmarks/scale.py`` (``--scales``: the synthetic
Amazon-670K / Amazon-3M shapes, same files, same job settings as its
``uniform_sparse`` and ``base`` runs: encoder 512, intermediate 32,768,
fan-in 32 / 96, batch 32, ``lazy_adam``, SET twice a run; the label tree
and the other fused scorers off, as training does not use them) and head
(``--heads``: ``uniform_sparse`` and the 1,000-label ``base``), one child
process goes through the job's own phases (:mod:`xmc_tf.job.run`:
``plan`` and ``split``, ``build``, the optimizer's ``build``, ``make_datasets``, then
``fit`` for the scale's steps) and records after each phase the process's
resident memory (``VmRSS``) and, within the phase, its peak (``VmHWM``,
reset at the phase's start through ``/proc/self/clear_refs``):

* ``runtime``: Python, NumPy, TensorFlow, Keras and the op library, loaded;
* ``data``: the job's plan (the XC files read, the splits, TF-IDF);
* ``model``: the built and compiled model;
* ``optimizer``: its state, created;
* ``datasets``: the training stream built;
* ``fit``: the training steps (peak) and after them (resident).

Besides the measured growth of each phase, the exact bytes of every
variable are added up by part (``encoder``, ``intermediate``, the head's
``kernel``, ``indices`` and ``bias``, the ``wide`` path, ``other``), for
the model and for the optimizer's state of each (its slots,
``xmc_tf.optimizers.slot_variables``), and variables outside both that
the layers keep (the wide path's inverted index). What the phases grew
beyond those exact bytes is the part no variable holds: the runtime,
the data, and the training's transient buffers (fit peak minus the RSS
before fit: gradients, the optimizer's temporaries, the ``[batch, m]``
scores and signal, SET's buffers, the input pipeline's prefetch).

Usage::

    python benchmarks/memory_parts.py --out benchmarks/results/memory_parts.json
    python benchmarks/memory_parts.py --scales tiny --heads uniform_sparse

Output: a table on stdout, JSON (``--out``).  Bytes are bytes; GiB = 2^30
bytes.  One run at a time; the machine's other load changes the times
only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import scale  # noqa: E402  (benchmarks/scale.py: shapes, data, settings)
from peers import proc_status_bytes  # noqa: E402  (benchmarks/peers.py)
from real_data import parse_set  # noqa: E402  (benchmarks/real_data.py)

GIB = 2**30
PHASES = ("start", "runtime", "data", "model", "optimizer", "datasets",
          "fit")


def _status(key: str) -> int:
    """This process's ``/proc/self/status`` entry ``key`` (``VmRSS``,
    ``VmHWM``), bytes."""
    return proc_status_bytes(os.getpid(), key)


def _reset_peak():
    """Resets ``VmHWM`` to the current RSS (Linux ``clear_refs`` 5)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


def _part(layer_name: str, variable_name: str) -> str:
    """The part a variable of the job's model belongs to."""
    if layer_name.startswith("encoder"):
        return "encoder"
    if layer_name == "intermediate":
        return "intermediate"
    if layer_name == "output":
        leaf = variable_name.rsplit("/", 1)[-1]
        if leaf.startswith("fused_"):  # a fused update's state
            return "head fused state"
        return {"kernel": "head kernel", "indices": "head indices",
                "bias": "head bias"}.get(leaf, "head other")
    if layer_name == "wide":
        return "wide"
    return "other"


def _nbytes(v) -> int:
    """Bytes of a variable's value (from its shape and dtype: no copy)."""
    dtype = getattr(v.dtype, "as_numpy_dtype", v.dtype)  # tf.DType or str
    return int(np.prod(v.shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def measure_child(scale_name: str, head: str, paths: dict, args) -> dict:
    """The phases of one run in this process (a fresh child)."""
    rss = {"start": _status("VmRSS")}
    peak = {}

    def phase(name, fn):
        _reset_peak()
        t = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - t
        # RSS first: the high-water mark read after it is at least that
        # (threads may still allocate between the two reads).
        rss[name] = _status("VmRSS")
        peak[name] = _status("VmHWM")
        times[name] = round(seconds, 2)
        return out

    times = {}

    def load_runtime():
        import tensorflow as tf  # noqa: F401
        import keras  # noqa: F401
        import xmc_tf
        from xmc_tf.ops import _loader
        _loader.load()
        return xmc_tf

    phase("runtime", load_runtime)
    from xmc_tf.job import load_config
    from xmc_tf.callbacks import SetRewiring
    from xmc_tf.job import cluster as xcluster
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import checks as xchecks
    from xmc_tf.job import run as xrun
    from xmc_tf.job.workdir import Workdir
    from xmc_tf.optimizers import slot_variables

    config_name, flags = scale._overrides(scale_name, head, args)
    prefix = "base_" if head == "base" else ""
    overrides = dict(parse_set(f[len("--config."):]) for f in flags)
    overrides.update(parse_set(item) for item in args.set)
    overrides.update({"data.train": paths[prefix + "train"],
                      "data.test": paths[prefix + "test"]})
    config = load_config(config_name, overrides)
    for section in ("tree", "centroids", "neighbours"):
        if section in config:
            config[section].enabled = False
    config.train.verbose = 0
    workdir = os.path.join(args.workdir, f"parts_{scale_name}_{head}"
                           + (f"_{args.label}" if args.label else ""))
    os.makedirs(workdir, exist_ok=True)
    job = xrun.Job(Workdir(workdir), xcluster.Cluster(None))
    checked = xchecks.check(config, job.cluster)

    def plan_and_split():
        planned = xrun.plan(job, checked, None)
        return planned, xrun.split(job, planned)

    planned, splits = phase("data", plan_and_split)
    built = phase("model", lambda: xrun.build(job, planned, splits))
    model, fit_model = built.model, built.fit_model
    opt = fit_model.optimizer
    phase("optimizer", lambda: opt.build(fit_model.trainable_variables))
    train_ds, _ = phase("datasets", lambda: xfit.make_datasets(
        planned.config, planned.head, splits.fit_data, None, model,
        job.cluster, 0))
    steps = scale.SCALES[scale_name]["train_steps"]
    set_cbs = [c for c in built.callbacks if isinstance(c, SetRewiring)]
    phase("fit", lambda: fit_model.fit(train_ds, steps_per_epoch=steps,
                                       epochs=1, verbose=0,
                                       callbacks=set_cbs))

    exact_model, exact_opt, kept = {}, {}, {}
    for layer in model.layers:
        for v in layer.variables:
            part = _part(layer.name, v.path if hasattr(v, "path") else
                         v.name)
            exact_model[part] = exact_model.get(part, 0) + _nbytes(v)
            if v.trainable:
                for slot in slot_variables(opt, v):
                    exact_opt[part] = exact_opt.get(part, 0) + _nbytes(slot)
        cache = getattr(layer, "_inverted_cache", None)
        if cache is not None:
            part = _part(layer.name, "")
            kept[part] = kept.get(part, 0) + sum(_nbytes(v) for v in cache)
    return {"scale": scale_name, "head": head, "steps": steps,
            "label": args.label, "set": list(args.set),
            "num_labels": (scale.BASE_LABELS if head == "base" else
                           scale.SCALES[scale_name]["num_labels"]),
            "rss_bytes": rss, "phase_peak_bytes": peak,
            "phase_seconds": times, "model_variable_bytes": exact_model,
            "optimizer_state_bytes": exact_opt,
            "kept_outside_variables_bytes": kept}


def parts_table(row: dict) -> list[tuple[str, int, int | None]]:
    """(part, exact bytes or None, measured bytes or None) rows of one run:
    the phases' growth beside the exact bytes of the variables they made."""
    rss, peak = row["rss_bytes"], row["phase_peak_bytes"]
    grow = {p: rss[p] - rss[q] for q, p in zip(PHASES, PHASES[1:])}
    out = [("runtime (Python, TF, Keras, op library)", None,
            rss["runtime"])]
    out.append(("data and plan (files, splits, TF-IDF)", None, grow["data"]))
    model_total = sum(row["model_variable_bytes"].values())
    for part, n in sorted(row["model_variable_bytes"].items()):
        out.append((f"model: {part}", n, None))
    out.append(("model: all variables / phase growth", model_total,
                grow["model"]))
    opt_total = sum(row["optimizer_state_bytes"].values())
    for part, n in sorted(row["optimizer_state_bytes"].items()):
        out.append((f"optimizer state: {part}", n, None))
    out.append(("optimizer state: all / phase growth", opt_total,
                grow["optimizer"]))
    out.append(("training stream (datasets)", None, grow["datasets"]))
    kept = sum(row["kept_outside_variables_bytes"].values())
    out.append(("kept by layers outside the variables (fit)", kept, None))
    out.append(("fit: resident growth", None, grow["fit"]))
    out.append(("fit: transient (peak - RSS before fit)", None,
                peak["fit"] - rss["datasets"]))
    out.append(("whole process peak (fit)", None, peak["fit"]))
    return out


def _fmt(n):
    return "-" if n is None else f"{n / GIB:.3f}"


def print_table(row: dict):
    print(f"\n{row['scale']} / {row['head']} ({row['num_labels']:,} labels, "
          f"{row['steps']} steps): GiB")
    print(f"| part | exact | measured |\n|---|---|---|")
    for part, exact, measured in parts_table(row):
        print(f"| {part} | {_fmt(exact)} | {_fmt(measured)} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", default="670k,3m")
    p.add_argument("--heads", default="base,uniform_sparse")
    p.add_argument("--encoder", type=int, default=512)
    p.add_argument("--intermediate", type=int, default=32768)
    p.add_argument("--data-dir", default="/tmp/xmc_tf_scale/data")
    p.add_argument("--workdir", default="/tmp/xmc_tf_scale/parts")
    p.add_argument("--steps", default="",
                   help="as scale.py: e.g. 3m=8 trains that scale on fewer "
                        "steps")
    p.add_argument("--set", action="append", default=[],
                   help="a config override KEY=VALUE for every run (e.g. "
                        "model.head_update=fused_adam); repeatable")
    p.add_argument("--label", default="",
                   help="names the runs of these --set overrides")
    p.add_argument("--out", default=None, help="write the results as JSON")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for item in filter(None, args.steps.split(",")):
        name, n = item.split("=")
        scale.SCALES[name]["train_steps"] = int(n)
    if args.child:
        scale_name, head, paths = json.loads(args.child)
        print("RESULT " + json.dumps(measure_child(scale_name, head, paths,
                                                   args)))
        return 0
    rows = []
    for scale_name in args.scales.split(","):
        paths = scale.prepare_data(scale_name, args.data_dir)
        for head in args.heads.split(","):
            cmd = [sys.executable, os.path.abspath(__file__),
                   "--child", json.dumps([scale_name, head, paths]),
                   "--encoder", str(args.encoder),
                   "--intermediate", str(args.intermediate),
                   "--workdir", args.workdir, "--steps", args.steps,
                   "--label", args.label] + [f"--set={item}"
                                             for item in args.set]
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
            proc = subprocess.run(cmd, capture_output=True, text=True,
                                  env=env)
            result = [ln for ln in proc.stdout.splitlines()
                      if ln.startswith("RESULT ")]
            if proc.returncode != 0 or not result:
                raise SystemExit(f"{scale_name}/{head} failed:\n"
                                 f"{proc.stderr[-3000:]}")
            row = json.loads(result[-1][len("RESULT "):])
            print_table(row)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": os.uname().nodename,
                       "encoder": args.encoder,
                       "intermediate": args.intermediate,
                       "batch_size": scale.BATCH, "runs": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
