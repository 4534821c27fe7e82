"""MACH benchmark: accuracy, head size and speed, with napkinXC/Omikuji.

What it measures
----------------
1. ``real``: the main job (``xmc_tf.job.run.train_and_evaluate``, what
   ``xmc-tf train --config=configs/mach.py`` runs) on the ``xcsplit`` files
   of Bibtex and Delicious (``/work/shared/data``) for each ``--configs``
   entry ``BxR`` (B buckets, R repetitions; Medini et al., NeurIPS 2019,
   Sec. 3) and each of ``--losses`` (``bce``: binary cross-entropy over
   bucket indicators, ``softmax``: per-repetition softmax cross-entropy;
   :mod:`xmc_tf.losses.mach`); everything else (encoder, intermediate
   width d, dropout, LR schedule, early stopping on validation P@3) is
   configs/mach.py.  The ``--reference`` configs (default
   configs/uniform_sparse.py) train on the same files.  Reported: P@1/3/5
   on the test split, bytes of the output layer (MACH: kernel ``[R, d, B]``
   + bias, float32) and of the whole model, training seconds
   (``model.fit`` wall time), epochs, decode throughput (queries/s of the
   exact threshold-algorithm decoder ``Xmc>MachTopK`` on the test logits,
   of brute force, and of forward + decode in batches of 256).
2. ``baselines``: napkinXC PLT and Omikuji (default settings, 2 threads) on
   the same files, in the same run (``--skip-baselines`` to omit; skipped
   automatically when not installed).
3. ``decode``: the decoder alone at m = 1M labels, R = 16, B = 4096, k = 5 on
   synthetic peaked ("trained-like") meta-probabilities: per query, softmax
   over B of N(0, 1) logits plus boosts ``peak, peak - 0.5, ...`` at the
   buckets of 5 random relevant labels, for ``--decode-peaks`` values of
   ``peak``.  Exact top-k (checked against brute force on a subset).
4. ``synthetic``: (``--synthetic``) the main job at m = 1M labels, B = 4096,
   R = 16, softmax loss, on ``xmc_tf.data.make_synthetic`` data written as
   XC files (no encoder, intermediate ``--synthetic-hidden``, no validation
   split, ``--synthetic-epochs`` epochs): training throughput, head bytes
   versus a dense head, P@k, and decode throughput on the trained model's
   own meta-probabilities.

Timing: wall clock (``time.perf_counter``) and process CPU time
(``time.process_time``, all threads).  On a shared machine the wall time
includes waiting for other processes; the load average is recorded in the
JSON.  TensorFlow uses its default thread pools (all cores of the machine).

Usage::

    python benchmarks/mach.py --out mach.json
    python benchmarks/mach.py --datasets delicious --configs 30x16 \\
        --reference= --skip-baselines --no-decode --out quick.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import sys
import shutil
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from peers import (elapsed, format_table, load_config, run_napkinxc,
                   run_omikuji, timer)

DATA_FILES = {
    "bibtex": ("Bibtex/xc/bibtex_xcsplit_train.txt.gz",
               "Bibtex/xc/bibtex_xcsplit_test.txt.gz"),
    "delicious": ("Delicious/xc/delicious_xcsplit_train.txt.gz",
                  "Delicious/xc/delicious_xcsplit_test.txt.gz"),
}


# ---------------------------------------------------------------------------
# 1. MACH on real data, through the main job (configs/mach.py).

def _decode_throughput(head, logits, k, activation, method, max_queries=None):
    """Queries/s of the MachTopK decoder on precomputed logits."""
    import tensorflow as tf
    from xmc_tf.ops.mach import mach_top_k, meta_probabilities
    probs = meta_probabilities(tf.constant(logits[:max_queries]), activation)
    mach_top_k(probs[:2], k, head.hashing, method=method)  # builds the cache
    start = timer()
    ids, scores = mach_top_k(probs, k, head.hashing, method=method)
    ids = ids.numpy()
    wall, cpu = elapsed(start)
    n = probs.shape[0]
    return ids, scores.numpy(), {"queries": int(n), "wall_s": wall,
                                 "cpu_s": cpu, "qps": n / wall,
                                 "cpu_ms_per_query": 1e3 * cpu / n}


def _train_config(config, name, train_path, test_path, args, tag):
    """Runs ``xmc_tf.job.run.train_and_evaluate`` (what ``xmc-tf train``
    runs); returns (metrics dict, workdir)."""
    from xmc_tf.job import run as xrun
    config.data.train = train_path
    config.data.test = test_path
    config.seed = args.seed
    config.train.verbose = 0
    if args.max_epochs:
        config.train.epochs = min(config.train.epochs, args.max_epochs)
    workdir = os.path.join(args.workdir, f"{name}_{tag}")
    shutil.rmtree(workdir, ignore_errors=True)  # no BackupAndRestore resume
    return xrun.train_and_evaluate(config, workdir), workdir


def train_mach(name, train_path, test_path, B, R, loss, args,
               overrides=None):
    """configs/mach.py with B, R, loss (and ``overrides``: dotted config
    key -> value) on the files; adds decode throughput to the metrics."""
    import keras
    import tensorflow as tf
    from xmc_tf import data as xdata
    from xmc_tf.job import scoring as xscoring
    from xmc_tf.job import preprocessing as xprep
    config = load_config("mach")
    config.model.num_buckets, config.model.num_repetitions = B, R
    config.loss = loss
    if args.intermediate_dim:
        config.model.intermediate_dim = args.intermediate_dim
    for key, value in (overrides or {}).items():
        section, field = key.split(".")
        config[section][field] = value
    metrics, workdir = _train_config(config, name, train_path, test_path,
                                     args, f"mach_{B}x{R}_{loss}")
    model = keras.models.load_model(os.path.join(workdir, "model.keras"),
                                    compile=False)
    from xmc_tf import decoding
    head = decoding.scoring_layer(model)  # inside the normalising model
    test = xprep.load_for_model(test_path, workdir)
    forward = tf.function(lambda x: model(x, training=False))
    logits = np.concatenate([forward(x).numpy() for x, _ in
                             xdata.make_tf_dataset(test, 1024)])
    activation = head.decode_activation
    ids, _, fast = _decode_throughput(head, logits, 5, activation, "threshold")
    bf_ids, _, brute = _decode_throughput(head, logits, 5, activation,
                                          "brute_force")
    if not np.array_equal(ids, bf_ids):
        raise AssertionError("threshold and brute-force decoders disagree")
    # End to end: forward + decode, per batch of 256 (the serving path).
    serve = xscoring.top_k_function(model, 5)
    batches = [x for x, _ in xdata.make_tf_dataset(test, 256)]
    serve(batches[0])
    start = timer()
    for x in batches:
        serve(x)[0].numpy()
    e2e_wall, _ = elapsed(start)
    d = head.kernel.shape[1]
    return {"dataset": name, "method": f"MACH B={B} R={R} {loss}", "B": B,
            "R": R, "d": d, "loss": loss,
            **{k: metrics[k] for k in ("P@1", "P@3", "P@5")},
            "head_bytes": metrics["output_layer_bytes"],
            "model_bytes": metrics["model_bytes"],
            "dense_head_bytes": 4 * (d + 1) * metrics["num_labels"],
            "train_s": metrics["train_seconds"], "epochs": metrics["epochs"],
            "decode_qps": fast["qps"],
            "decode_cpu_ms_per_query": fast["cpu_ms_per_query"],
            "brute_force_qps": brute["qps"],
            "end_to_end_qps": test.num_instances / e2e_wall,
            "workdir": workdir}


def train_reference(name, train_path, test_path, config_name, args):
    """The uniform-sparse (or dense) main job on the same files."""
    metrics, workdir = _train_config(load_config(config_name), name,
                                     train_path, test_path, args, config_name)
    return {"dataset": name, "method": config_name,
            **{k: metrics[k] for k in ("P@1", "P@3", "P@5")},
            "head_bytes": metrics["output_layer_bytes"],
            "model_bytes": metrics["model_bytes"],
            "train_s": metrics["train_seconds"], "epochs": metrics["epochs"],
            "workdir": workdir}


# ---------------------------------------------------------------------------
# 3. Decoder at m = 1M.

def peaked_probs(rng, hashing, b, peak, num_relevant=5):
    """Softmax of N(0,1) logits plus boosts at relevant labels' buckets."""
    R, B = hashing.num_repetitions, hashing.num_buckets
    logits = rng.normal(0.0, 1.0, (b, R, B)).astype(np.float32)
    rel = rng.integers(0, hashing.num_labels, (b, num_relevant))
    hb = hashing.buckets_numpy(rel)  # [b, n, R]
    rows = np.arange(b)
    for t in range(num_relevant):
        for r in range(R):
            logits[rows, r, hb[:, t, r]] += peak - 0.5 * t
    logits -= logits.max(-1, keepdims=True)
    e = np.exp(logits)
    return (e / e.sum(-1, keepdims=True)).astype(np.float32)


def decode_benchmark(args):
    import tensorflow as tf
    from xmc_tf.ops.mach import MachHashing, mach_top_k
    m, R, B, k = args.decode_labels, 16, 4096, 5
    h = MachHashing.random(m, B, R, seed=args.seed)
    rng = np.random.default_rng(args.seed)
    rows = []
    start = timer()
    mach_top_k(tf.zeros([1, R, B]), k, h)  # builds the inverted lists
    build_wall, _ = elapsed(start)
    for peak in args.decode_peaks:
        probs = tf.constant(peaked_probs(rng, h, args.decode_queries, peak))
        mach_top_k(probs[:8], k, h)  # warm-up
        best = None
        for _ in range(args.decode_repeats):
            start = timer()
            ids, scores = mach_top_k(probs, k, h)
            ids = ids.numpy()
            wall, cpu = elapsed(start)
            if best is None or wall < best[0]:
                best = (wall, cpu)
        n_check = min(args.decode_check, args.decode_queries)
        start = timer()
        bf_ids, bf_scores = mach_top_k(probs[:n_check], k, h,
                                       method="brute_force")
        bf_wall, _ = elapsed(start)
        exact = (np.array_equal(bf_ids.numpy(), ids[:n_check]) and
                 np.array_equal(bf_scores.numpy(), scores.numpy()[:n_check]))
        rows.append({"m": m, "R": R, "B": B, "k": k, "peak": peak,
                     "queries": args.decode_queries, "wall_s": best[0],
                     "qps": args.decode_queries / best[0],
                     "cpu_ms_per_query": 1e3 * best[1] / args.decode_queries,
                     "qps_per_2_cores_from_cpu_time":
                         2 * args.decode_queries / best[1],
                     "brute_force_qps": n_check / bf_wall,
                     "exact_vs_brute_force": bool(exact),
                     "mean_top1_score": float(scores.numpy()[:, 0].mean()),
                     "list_build_s": build_wall})
    return rows


# ---------------------------------------------------------------------------
# 4. Training at m = 1M on synthetic data.

def synthetic_benchmark(args):
    """configs/mach.py at m = --decode-labels on make_synthetic data written
    as XC files (what a user would run with ``xmc-tf train``)."""
    from xmc_tf import data as xdata
    m, R, B = args.decode_labels, 16, 4096
    n_train, n_test = args.synthetic_instances, 2000
    start = timer()
    full = xdata.make_synthetic(n_train + n_test, args.synthetic_features, m,
                                seed=args.seed)
    gen_wall, _ = elapsed(start)
    os.makedirs(args.workdir, exist_ok=True)
    train_path = os.path.join(args.workdir, "synthetic_train.txt")
    test_path = os.path.join(args.workdir, "synthetic_test.txt")
    xdata.write_xc(train_path, xdata.XCDataset(full.features[:n_train],
                                               full.labels[:n_train]))
    xdata.write_xc(test_path, xdata.XCDataset(full.features[n_train:],
                                              full.labels[n_train:]))
    row = train_mach("synthetic", train_path, test_path, B, R, "softmax",
                     args, overrides={
                         "model.encoder_dims": (),
                         "model.intermediate_dim": args.synthetic_hidden,
                         "train.batch_size": args.synthetic_batch_size,
                         "train.epochs": args.synthetic_epochs,
                         "data.validation_fraction": 0.0})
    row.update({"m": m, "train_instances": n_train,
                "features": args.synthetic_features,
                "batch_size": args.synthetic_batch_size,
                "generate_s": gen_wall,
                "train_instances_per_s":
                    n_train * row["epochs"] / row["train_s"]})
    return row


# ---------------------------------------------------------------------------

def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="/work/shared/data")
    p.add_argument("--datasets", default="bibtex,delicious")
    p.add_argument("--configs", default="32x16,64x16,128x16",
                   help="comma-separated BxR (buckets x repetitions)")
    p.add_argument("--losses", default="bce",
                   help="comma-separated: softmax, bce")
    p.add_argument("--intermediate-dim", type=int, default=None,
                   help="d of the MACH head [R, d, B] (default: "
                        "configs/mach.py)")
    p.add_argument("--max-epochs", type=int, default=None,
                   help="cap on the configs' epochs (early stopping "
                        "usually ends them sooner)")
    p.add_argument("--reference", default="uniform_sparse",
                   help="comma-separated configs/*.py trained on the same "
                        "files for comparison ('' for none)")
    p.add_argument("--workdir", default=None,
                   help="work directories of the runs (default: a "
                        "temporary directory, removed at the end)")
    p.add_argument("--threads", type=int, default=2,
                   help="threads of the baselines")
    p.add_argument("--skip-baselines", action="store_true")
    p.add_argument("--no-real", action="store_true",
                   help="skip the Bibtex/Delicious runs")
    p.add_argument("--no-decode", action="store_true")
    p.add_argument("--decode-labels", type=int, default=1_000_000)
    p.add_argument("--decode-queries", type=int, default=4000)
    p.add_argument("--decode-repeats", type=int, default=3)
    p.add_argument("--decode-check", type=int, default=50,
                   help="queries checked against brute force")
    p.add_argument("--decode-peaks", type=float, nargs="+",
                   default=[6.0, 4.0])
    p.add_argument("--synthetic", action="store_true",
                   help="also train at m = --decode-labels on synthetic data")
    p.add_argument("--synthetic-instances", type=int, default=100_000)
    p.add_argument("--synthetic-features", type=int, default=20_000)
    p.add_argument("--synthetic-hidden", type=int, default=256)
    p.add_argument("--synthetic-batch-size", type=int, default=512)
    p.add_argument("--synthetic-epochs", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="mach_bench_")
        args.workdir = tmp.name

    import tensorflow as tf
    from xmc_tf import data as xdata

    result = {"machine": {"platform": platform.platform(),
                          "cpus": os.cpu_count(),
                          "loadavg_start": os.getloadavg(),
                          "tensorflow": tf.__version__},
              "args": vars(args), "real": [], "decode": [], "synthetic": None}
    configs = [tuple(int(v) for v in c.lower().split("x"))
               for c in args.configs.split(",") if c]
    losses = [l for l in args.losses.split(",") if l]
    for l in losses:
        if l not in ("softmax", "bce"):
            p.error(f"unknown loss {l!r}")

    if not args.no_real:
        for name in [d for d in args.datasets.split(",") if d]:
            train_path, test_path = (os.path.join(args.data_dir, f)
                                     for f in DATA_FILES[name])
            raw_train = xdata.read_xc(train_path)
            raw_test = xdata.read_xc(test_path)
            for ref in [r for r in args.reference.split(",") if r]:
                row = train_reference(name, train_path, test_path, ref, args)
                result["real"].append(row)
                print(format_table([row], ["dataset", "method", "P@1", "P@3", "P@5",
                                     "head_bytes", "train_s"]), flush=True)
            if not args.skip_baselines:
                try:
                    result["real"].append({"dataset": name, **run_napkinxc(
                        raw_train, raw_test, args.threads)})
                except ImportError as e:
                    print(f"napkinXC skipped: {e}")
                try:
                    result["real"].append({"dataset": name, **run_omikuji(
                        raw_train, raw_test, args.threads,
                        train_path=train_path)})
                except ImportError as e:
                    print(f"Omikuji skipped: {e}")
            for (B, R), loss in itertools.product(configs, losses):
                row = train_mach(name, train_path, test_path, B, R, loss,
                                 args)
                result["real"].append(row)
                print(format_table([row], ["dataset", "method", "P@1", "P@3", "P@5",
                                     "head_bytes", "train_s", "decode_qps"]),
                      flush=True)
    if not args.no_decode:
        result["decode"] = decode_benchmark(args)
    if args.synthetic:
        result["synthetic"] = synthetic_benchmark(args)
    result["machine"]["loadavg_end"] = os.getloadavg()

    if result["real"]:
        print("\n== Real data (test split, percent; bytes of the output "
              "layer / whole model) ==")
        print(format_table(result["real"], [
            "dataset", "method", "P@1", "P@3", "P@5", "head_bytes",
            "model_bytes", "train_s", "epochs", "decode_qps",
            "brute_force_qps", "end_to_end_qps"]))
    if result["decode"]:
        print(f"\n== Decoder, m={args.decode_labels} R=16 B=4096 k=5, "
              "synthetic peaked probs ==")
        print(format_table(result["decode"], [
            "peak", "queries", "qps", "cpu_ms_per_query",
            "qps_per_2_cores_from_cpu_time", "brute_force_qps",
            "exact_vs_brute_force", "mean_top1_score", "list_build_s"]))
    if result["synthetic"]:
        print(f"\n== Training at m={args.decode_labels} on synthetic data "
              "(B=4096, R=16, softmax) ==")
        print(format_table([result["synthetic"]], [
            "m", "train_instances", "train_s", "epochs",
            "train_instances_per_s", "head_bytes", "dense_head_bytes",
            "model_bytes", "P@1", "P@5", "decode_qps", "brute_force_qps"]))
    print(f"\nload average start/end: {result['machine']['loadavg_start']} / "
          f"{result['machine']['loadavg_end']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {args.out}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
