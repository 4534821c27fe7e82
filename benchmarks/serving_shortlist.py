"""Serving latency of the default job's models: shortlist and re-rank
against exact full scoring and against Omikuji, on the same data.

What it measures
----------------
For each ``--case NAME=WORKDIR,TRAIN,TEST``: the SavedModel that ``xmc-tf
train`` (or :class:`xmc_tf.ExtremeClassifier`) wrote in ``WORKDIR`` is
loaded (:func:`xmc_tf.saving.load_saved_model`) and called on the first
test instances of ``TEST`` (raw feature values, as in the file):

* ``serve``: the model's top 5 -- for a fused model
  (:class:`xmc_tf.layers.FusedScores`) the shortlist (the label tree's beam
  search, the neighbours' votes) re-ranked by every part;
* ``full``: ``score_all_labels`` (every label's exact fused score) and
  ``tf.math.top_k`` of it: what serving cost before the shortlist.

Latency per instance at batch 1 (the median of ``--single`` calls of one
instance each) and at batch 256 (the median of ``--batches`` calls of 256,
divided by 256), wall clock, TensorFlow's default thread pools; P@5 of both
on the first ``--eval-rows`` test instances (serve's is what the job
reports; full's is the exact ranking the shortlist approximates).

Omikuji 0.5 (``--omikuji``: trained on ``TRAIN`` with its defaults, 2
threads, in this process) answers the same instances one ``predict`` call
each (beam 10, top 5; it has no batch call, so its batch-256 figure is the
same per-instance loop), and its P@5 on the same rows.

The machine is shared (2 cores): the load average at the start and the
end is in the JSON; times under load are upper bounds.

Usage::

    python benchmarks/serving_shortlist.py \\
        --case debdoc=WORKDIR,TRAIN.txt.gz,TEST.txt.gz --omikuji \\
        --out benchmarks/results/serving_shortlist.json

Output: a table on stdout and the JSON of ``--out`` (rows per case).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
sys.path.insert(0, ROOT)
from peers import format_table, precision  # noqa: E402


def _batch(features, rows):
    import tensorflow as tf
    part = features[rows].tocoo()
    return (tf.constant(np.stack([part.row, part.col], 1), tf.int64),
            tf.constant(part.data, tf.float32),
            tf.constant(part.shape, tf.int64))


def _per_instance_ms(call, features, starts, size):
    """Median milliseconds per instance of ``call(*batch)`` over batches of
    ``size`` rows starting at ``starts`` (one warm-up call first)."""
    call(*_batch(features, np.arange(size)))
    times = []
    for start in starts:
        parts = _batch(features, np.arange(start, start + size))
        t0 = time.perf_counter()
        call(*parts)
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times) / size


def _top5(fn, features, rows, batch=256):
    ids = []
    for start in range(0, rows, batch):
        ids.append(np.asarray(fn(*_batch(features, np.arange(
            start, min(start + batch, rows))))))
    return np.concatenate(ids)


def measure_case(name, workdir, train_path, test_path, args):
    """The rows of one case (ours, and Omikuji's when asked)."""
    import tensorflow as tf
    from xmc_tf import saving
    from xmc_tf.data import load_dataset
    test = load_dataset(test_path)
    sm = saving.load_saved_model(os.path.join(workdir, "saved_model"))
    serve = sm.signatures["serve"]
    every = sm.signatures["score_all_labels"]
    metrics = json.load(open(os.path.join(workdir, "metrics.json")))

    def serve_ids(i, v, s):
        return serve(indices=i, values=v, dense_shape=s)["label_ids"]

    def full_ids(i, v, s):
        scores = every(indices=i, values=v, dense_shape=s)["label_scores"]
        return tf.math.top_k(scores, k=5).indices

    rows = min(args.eval_rows, test.num_instances)
    labels = test.labels[:rows]
    out = []
    for variant, fn in (("serve", serve_ids), ("full", full_ids)):
        single = _per_instance_ms(lambda *a: fn(*a).numpy(), test.features,
                                  range(1, 1 + args.single), 1)
        batched = _per_instance_ms(lambda *a: fn(*a).numpy(), test.features,
                                   [256 * (j + 1) for j in
                                    range(args.batches)], 256)
        ids = _top5(fn, test.features, rows)
        out.append({"case": name, "method": f"xmc_tf {variant}",
                    "labels": int(test.num_labels),
                    "shortlist": metrics.get("fusion", {}).get(
                        "shortlist_width"),
                    "ms_batch1": single, "ms_per_instance_batch256": batched,
                    "P@5": precision(ids, labels)["P@5"],
                    "P@1": precision(ids, labels)["P@1"],
                    "eval_rows": rows, "load_average": os.getloadavg()[0]})
        print(json.dumps(out[-1]), flush=True)
    if args.omikuji:
        out.append(_omikuji(name, train_path, test, rows, args))
    return out


def _omikuji(name, train_path, test, rows, args):
    import omikuji
    import tempfile
    from peers import _plain_copy
    with tempfile.TemporaryDirectory() as tmp:
        plain = _plain_copy(train_path, tmp)
        t0 = time.perf_counter()
        model = omikuji.Model.train_on_data(plain, n_threads=2)
        train_s = time.perf_counter() - t0
    feats = test.features

    def pairs(i):
        lo, hi = feats.indptr[i], feats.indptr[i + 1]
        return list(zip(feats.indices[lo:hi].tolist(),
                        feats.data[lo:hi].tolist()))
    model.predict(pairs(0), top_k=5)
    times = []
    for i in range(1, 1 + args.single):
        p = pairs(i)
        t0 = time.perf_counter()
        model.predict(p, top_k=5)
        times.append(time.perf_counter() - t0)
    ids = np.full((rows, 5), -1, np.int64)
    for i in range(rows):
        pred = model.predict(pairs(i), top_k=5)
        ids[i, :len(pred)] = [p[0] for p in pred]
    per = 1e3 * statistics.median(times)
    row = {"case": name, "method": "Omikuji predict",
           "labels": int(test.num_labels), "shortlist": None,
           "ms_batch1": per, "ms_per_instance_batch256": per,
           "P@5": precision(ids, test.labels[:rows])["P@5"],
           "P@1": precision(ids, test.labels[:rows])["P@1"],
           "eval_rows": rows, "train_s": train_s,
           "load_average": os.getloadavg()[0]}
    print(json.dumps(row), flush=True)
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", required=True,
                   help="NAME=WORKDIR,TRAIN,TEST (repeatable)")
    p.add_argument("--omikuji", action="store_true",
                   help="train Omikuji on TRAIN and time its predict")
    p.add_argument("--single", type=int, default=200,
                   help="calls of one instance timed")
    p.add_argument("--batches", type=int, default=4,
                   help="calls of 256 instances timed")
    p.add_argument("--eval-rows", type=int, default=4096)
    p.add_argument("--out", default=os.path.join(
        ROOT, "benchmarks", "results", "serving_shortlist.json"))
    args = p.parse_args()
    start_load = os.getloadavg()
    rows = []
    for case in args.case:
        name, spec = case.split("=", 1)
        workdir, train_path, test_path = spec.split(",")
        rows += measure_case(name, workdir, train_path, test_path, args)
        result = {"machine": {"platform": platform.platform(),
                              "cpus": os.cpu_count(),
                              "loadavg_start": start_load,
                              "loadavg_end": os.getloadavg()},
                  "args": vars(args), "rows": rows}
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    print(format_table(rows, ["case", "method", "labels", "shortlist",
                              "ms_batch1", "ms_per_instance_batch256", "P@1",
                              "P@5"]))


if __name__ == "__main__":
    main()
