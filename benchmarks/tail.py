"""Where we lose: P@1, P@5 and PSP@5 per label-frequency bucket (issue 45).

Extreme classification is mostly tail: most labels have a handful of
training instances.  This benchmark trains each method on a data set's
training file, predicts the top 5 of every test instance and reports the
metrics overall and per bucket of the true label's training frequency
(:func:`xmc_tf.metrics.evaluate_by_frequency`: 1, 2-3, 4-8, 9-32, 33+
training instances; on multi-class data a bucket's P@1 is the accuracy on
the test instances whose class has that many training instances).

Data sets (``--datasets``):

* ``debdoc``: DebDocNextWord (``benchmarks/datasets/make_large_class.py``,
  ``--debdoc-dir``): 752k training instances, 181k classes, at most 8
  instances per class;
* ``mannextword``: ``ManNextWord`` of ``--shared`` (400k instances, 50k
  classes declared, 18k seen, 12.9k of them fewer than 5 times);
* ``wordnet``: ``WordNetHypernyms`` of ``--shared`` (multi-label, 10k
  labels, 19 instances per label).

Methods (``--methods``): ours, by packaged config and overrides, through
:class:`xmc_tf.ExtremeClassifier` (``NAME`` = a packaged config, or
``NAME=CONFIG:field=value;field=value`` for a variant, e.g.
``scent_wide=scent:model.wide_connections=32``); the peers of
``benchmarks/peers.py`` (``omikuji``, ``fasttext``, ``napkinxc``,
``pecos``: XR-Linear in its own venv, ``XMC_PECOS_PYTHON``) at their
defaults.  Every method runs in a process of its own (peak RSS is its
own), with ``--threads`` threads for the peers.  Training seconds: wall
clock of ``fit`` for ours (validation passes, the label tree and export
included), the peers' own training for them.

Usage::

    python benchmarks/tail.py --datasets debdoc --methods omikuji,scent \\
        --out benchmarks/results/tail.json --figure docs/results/figures/tail.png

The JSON is rewritten after every method.  Timing is on the development
machine (2 cores, often shared): upper bounds.
"""

from __future__ import annotations

import argparse
import csv
import json
import multiprocessing as mp
import os
import platform
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

PEER_NAMES = ("omikuji", "fasttext", "napkinxc", "pecos")
DATASETS = ("debdoc", "mannextword", "wordnet")


def dataset_paths(name: str, args) -> tuple[str, str]:
    """(train, test) XC files of a data set name."""
    if name == "debdoc":
        root = args.debdoc_dir
    elif name == "mannextword":
        root = os.path.join(args.shared, "ManNextWord")
    elif name == "wordnet":
        root = os.path.join(args.shared, "WordNetHypernyms")
    else:
        raise SystemExit(f"unknown data set {name!r}; one of {DATASETS}")
    paths = (os.path.join(root, "train.txt.gz"),
             os.path.join(root, "test.txt.gz"))
    for p in paths:
        if not os.path.exists(p):
            raise SystemExit(f"{name}: {p} not found")
    return paths


def parse_method(spec: str) -> tuple[str, str | None, dict]:
    """``NAME`` or ``NAME=CONFIG:f=v;f=v`` -> (name, config, overrides);
    config None for a peer."""
    if "=" not in spec.split(":")[0]:
        name = spec
        return (name, None, {}) if name in PEER_NAMES else (name, name, {})
    name, rest = spec.split("=", 1)
    config, _, fields = rest.partition(":")
    overrides = {}
    for item in filter(None, fields.split(";")):
        key, value = item.split("=", 1)
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    return name, config, overrides


def _peak_rss() -> int:
    with open(f"/proc/{os.getpid()}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def _load(train_path, test_path, max_train, max_test):
    from xmc_tf.data import read_xc  # pylint: disable=import-outside-toplevel
    from xmc_tf.data import XCDataset  # pylint: disable=import-outside-toplevel
    train, test = read_xc(train_path, progress=False), read_xc(
        test_path, progress=False)

    def head(data, n):  # the first n rows (the files' rows are shuffled)
        if not n or data.num_instances <= n:
            return data
        return XCDataset(data.features[:n], data.labels[:n])

    return head(train, max_train), head(test, max_test)


def _child(conn, method, config, overrides, train_path, test_path, args_d):
    """Runs one method; sends {"topk_ids", "train_seconds", ...}."""
    try:
        train, test = _load(train_path, test_path, args_d["max_train"],
                            args_d["max_test"])
        if config is None:
            import peers  # pylint: disable=import-outside-toplevel
            path = train_path
            with tempfile.TemporaryDirectory() as tmp:
                if args_d["max_train"]:
                    from xmc_tf.data import write_xc  # pylint: disable=C0415
                    path = os.path.join(tmp, "train.txt")
                    write_xc(path, train)
                res = peers.PEERS[method](train, test,
                                          threads=args_d["threads"],
                                          train_path=path, return_ids=True)
            out = {"topk_ids": res["topk_ids"], "train_seconds": res["train_s"],
                   "label": res["method"]}
        else:
            import xmc_tf  # pylint: disable=import-outside-toplevel
            start = time.time()
            keep = args_d.get("workdirs")
            clf = xmc_tf.ExtremeClassifier(
                config, overrides,
                workdir=os.path.join(keep, method) if keep else None,
                overwrite=True)
            clf.fit_datasets(train)
            seconds = time.time() - start
            ids, _ = clf.predict(test.features, k=5)
            out = {"topk_ids": ids.astype(np.int64), "train_seconds": seconds,
                   "label": f"xmc_tf {config}" + (
                       f" {overrides}" if overrides else ""),
                   "epochs": clf.metrics_.get("epochs"),
                   "resolved": {k: clf.metrics_.get("config", {}).get(k)
                                for k in ("model", "loss")},
                   # what the data chose: the regime's fields and the
                   # fusion weights read on validation (label tree,
                   # centroids, neighbour votes), as metrics.json records
                   # them
                   "chosen": {k: clf.metrics_.get(k)
                              for k in ("regime", "label_tree", "centroids",
                                        "neighbours", "fusion")
                              if k in clf.metrics_},
                   # what drove early stopping, epoch by epoch
                   "history": _history(clf.workdir)}
        out["peak_rss_bytes"] = _peak_rss()
        conn.send(out)
    except Exception as e:  # pylint: disable=broad-except
        import traceback  # pylint: disable=import-outside-toplevel
        conn.send({"error": f"{type(e).__name__}: {e}",
                   "traceback": traceback.format_exc()})
    finally:
        conn.close()


def _history(workdir):
    """history.csv's validation columns, one dict per epoch (floats)."""
    path = os.path.join(workdir, "history.csv")
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [{k: round(float(v), 5) for k, v in row.items()
                 if v and (k == "epoch" or k.startswith("val_")
                           or k == "learning_rate")}
                for row in csv.DictReader(f)]


def run_method(method, config, overrides, train_path, test_path, args):
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(
        child, method, config, overrides, train_path, test_path,
        {"max_train": args.max_train, "max_test": args.max_test,
         "threads": args.threads, "workdirs": args.workdirs}))
    proc.start()
    child.close()
    result = parent.recv() if parent.poll(args.timeout) else {
        "error": f"no result in {args.timeout} s"}
    proc.join(10)
    if proc.is_alive():
        proc.kill()
    return result


def bucket_table(train, test, edges):
    """Labels and test instances per bucket (what the buckets hold)."""
    from xmc_tf.metrics import frequency_buckets  # pylint: disable=C0415
    counts = train.label_counts()
    bucket, names = frequency_buckets(counts, edges)
    test_rows = np.repeat(np.arange(test.num_instances),
                          np.diff(test.labels.indptr))
    test_bucket = bucket[test.labels.indices]
    out = []
    for b, name in [(-1, "0")] + list(enumerate(names)):
        out.append({"bucket": name,
                    "train_labels": int(((bucket == b) & (counts > 0)).sum()),
                    "test_instances": int(np.unique(
                        test_rows[test_bucket == b]).size)})
    return counts, out


def score(ids, test, counts, inv):
    from xmc_tf.metrics import (XMCEvaluator,  # pylint: disable=C0415
                                evaluate_by_frequency)
    ev = XMCEvaluator(ks=(1, 5), inv_propensities=inv)
    ev.update(ids, test.labels)
    overall = ev.result()
    per_bucket = evaluate_by_frequency(ids, test.labels, counts, ks=(1, 5),
                                       inv_propensities=inv)
    return overall, per_bucket


def plot(result, path):
    import matplotlib  # pylint: disable=import-outside-toplevel
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # pylint: disable=import-outside-toplevel
    names = list(result["datasets"])
    fig, axes = plt.subplots(1, len(names), figsize=(5.5 * len(names), 4),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        entry = result["datasets"][name]
        buckets = [b["bucket"] for b in entry["buckets"]
                   if b["test_instances"] > 0 and b["bucket"] != "0"]
        for method, row in entry["methods"].items():
            if "per_bucket" not in row:
                continue
            p1 = {b["bucket"]: b["P@1"] for b in row["per_bucket"]}
            ax.plot(range(len(buckets)), [p1.get(b, np.nan) for b in buckets],
                    marker="o", label=f"{method} ({row['train_seconds']:.0f} s)")
        ax.set_xticks(range(len(buckets)), buckets)
        ax.set_xlabel("training instances of the true label")
        ax.set_ylabel("test P@1 (%)")
        ax.set_title(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[2:]))
    parser.add_argument("--datasets", default="debdoc")
    parser.add_argument("--methods", default="omikuji,fasttext,scent",
                        help="comma-separated; see the description")
    parser.add_argument("--shared", default=os.path.join(REPO, "..",
                                                         "shared", "data"))
    parser.add_argument("--debdoc-dir",
                        default="/work/runs/corpus/DebDocNextWord")
    parser.add_argument("--max-train", type=int, default=0,
                        help="first N training instances (0: all)")
    parser.add_argument("--max-test", type=int, default=0,
                        help="first N test instances (0: all)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=4 * 3600)
    parser.add_argument("--workdirs", default="",
                        help="keep each of our runs' workdir in DIR/METHOD "
                             "(e.g. for benchmarks/serving_shortlist.py)")
    parser.add_argument("--out", default="tail.json")
    parser.add_argument("--merge", action="store_true",
                        help="keep the methods already in --out")
    parser.add_argument("--figure", default=None)
    args = parser.parse_args(argv)

    from xmc_tf.metrics import inverse_propensities  # pylint: disable=C0415
    from xmc_tf.metrics.evaluator import FREQUENCY_EDGES  # pylint: disable=C0415
    result = {"machine": {"platform": platform.platform(),
                          "cpus": os.cpu_count(),
                          "loadavg_start": os.getloadavg()},
              "args": vars(args), "edges": list(FREQUENCY_EDGES),
              "datasets": {}}
    if args.merge and os.path.exists(args.out):
        with open(args.out) as f:
            result["datasets"] = json.load(f).get("datasets", {})
    methods = [parse_method(m) for m in args.methods.split(",") if m]
    for name in args.datasets.split(","):
        train_path, test_path = dataset_paths(name, args)
        train, test = _load(train_path, test_path, args.max_train,
                            args.max_test)
        counts, buckets = bucket_table(train, test, FREQUENCY_EDGES)
        inv = inverse_propensities(counts, num_instances=train.num_instances)
        entry = result["datasets"].setdefault(name, {"methods": {}})
        entry.update(train_instances=train.num_instances,
                     test_instances=test.num_instances,
                     num_labels=train.num_labels, buckets=buckets)
        print(f"== {name}: {train.num_instances} train, {test.num_instances} "
              f"test, {train.num_labels} labels; buckets {buckets}",
              flush=True)
        for method, config, overrides in methods:
            t0 = time.time()
            res = run_method(method, config, overrides, train_path, test_path,
                             args)
            row = {k: v for k, v in res.items() if k != "topk_ids"}
            row["load_after"] = os.getloadavg()
            if "topk_ids" in res:
                overall, per_bucket = score(res["topk_ids"], test, counts, inv)
                row.update(overall=overall, per_bucket=per_bucket)
                cells = " ".join(f"{b['bucket']}:{b['P@1']:.2f}"
                                 for b in per_bucket)
                print(f"{method:<16} P@1 {overall['P@1']:6.2f} P@5 "
                      f"{overall['P@5']:5.2f} PSP@5 {overall['PSP@5']:5.2f} "
                      f"train {row['train_seconds']:7.1f} s | P@1 per bucket "
                      f"{cells}", flush=True)
            else:
                print(f"{method:<16} FAILED: {res.get('error')}", flush=True)
            row["wall_seconds"] = time.time() - t0
            entry["methods"][method] = row
            result["machine"]["loadavg_end"] = os.getloadavg()
            with open(args.out, "w") as f:
                json.dump(result, f, indent=1, default=float)
    if args.figure:
        plot(result, args.figure)
        print(f"wrote {args.figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
