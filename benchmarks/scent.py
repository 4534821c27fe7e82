"""SCENT benchmark: full softmax vs tf.nn.sampled_softmax_loss vs SCENT.

What it measures
----------------
Extreme multi-class next-word prediction on ``ManNextWord``
(``/work/shared/data/ManNextWord``: 400k train / 50k test instances, 120k
binary (position, word) features, 50k classes; ``--max-train`` /
``--max-test`` take a random subsample for development).  Every method trains
the same model -- sparse input -> ``SparseEmbeddingBag(--dim, ReLU)`` ->
output layer over all 50k classes (``xmc_tf.job.build.build_model``, no
intermediate layer, dropout ``--dropout`` after the embedding, default
none) -- at the same batch size, for the same
number of epochs, on the same shuffled batches (``make_tf_dataset``, seed
``--seed``), each in its own process (so the peak RSS is per method):

* ``full_softmax``: ``configs/uniform_sparse.py`` with ``model.head="dense"``
  and ``loss="softmax"`` (``keras.layers.Dense`` head, all 50k logits per
  row, :class:`xmc_tf.losses.SoftmaxCrossentropy`), LazyAdam ``--lr``.
* ``sampled_softmax``: ``tf.nn.sampled_softmax_loss`` with its log-uniform
  sampler, ``--num-sampled`` classes per step (default: the batch size, as
  many as SCENT scores at most), in a custom train step over a label-major
  head (``benchmarks/baselines.py``), LazyAdam ``--lr``.
* ``scent``: head ``"scent"`` as ``configs/scent.py`` ships it (what
  ``xmc-tf train --config=configs/scent.py`` runs): in-batch classes,
  per-instance duals, ``scent.correction="log_q"`` (in-batch classes
  importance-weighted by the training label frequencies; not in the paper),
  ``scent.own_term=True`` (the own class in the inner mean; not in the
  paper, whose estimator diverges on the full training file), ``--scent-alpha`` (default: the config's), LazyAdam ``--lr``
  (``--scent-optimizer scent_momentum``: Algorithm 26's momentum step,
  learning rate ``--scent-lr``, ``--scent-beta``).
* ``scent_paper``: the same with the paper's plain in-batch estimator
  (``scent.correction="none"``, ``scent.own_term=False``).  ``sox``: SOX (paper estimator) with
  ``gamma = --scent-alpha``.
* ``astra_shared`` / ``lsh_shared``: the sampled head of configs/astra.py
  / configs/lsh.py with ``sampler.shared=True`` over the same layer (a pool
  of ANN- or LSH-retrieved labels and the batch's positives scored exactly
  plus uniform draws, sampled softmax; the index / tables refreshed by the
  head's callbacks), LazyAdam ``--lr``.
* ``napkinxc``, ``omikuji``, ``fasttext``: the peers of
  ``benchmarks/peers.py`` with their defaults, trained on the same split and
  (L2-normalised) features; ``train_s`` is their training time.

Reported per method: seconds per epoch (wall clock of each epoch of
``fit``, mean over epochs after the first, which includes tracing),
training seconds, peak RSS of its process (MiB), P@1 / P@5 on the test
split (percent; one label per instance, so P@5 = recall@5 / 5), the test
cross-entropy of the full softmax over all 50k classes (nats, mean over
test instances) and ``classes_per_step`` (output rows scored per step:
50k for the full softmax, ``num_sampled`` + the batch's labels for sampled
softmax, the batch's distinct labels for SCENT).  All runs use the same
harness below (``fit`` on the xmc_tf pipeline, no validation split, no LR
schedule) so that only the loss differs; ``xmc-tf train
--config=configs/scent.py`` runs the same SCENT model through the job
(tested in ``tests/test_scent.py``).

Timing: wall clock (``time.perf_counter``) on a machine shared with other
jobs (load average recorded in the JSON); TensorFlow's default thread pools.

Usage::

    python benchmarks/scent.py --out scent.json              # full data
    python benchmarks/scent.py --max-train 50000 --max-test 10000 \\
        --epochs 2 --methods scent,sampled_softmax --out dev.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from peers import format_table  # noqa: E402  (benchmarks/peers.py)

METHODS = ("full_softmax", "sampled_softmax", "scent", "scent_paper", "sox",
           "astra_shared", "lsh_shared", "napkinxc", "omikuji", "fasttext")
#: Peers of benchmarks/peers.py (trained on the same split, same features).
PEER_METHODS = ("napkinxc", "omikuji", "fasttext")
#: ``--methods`` entries may override options: ``NAME:key=value:...``.
OVERRIDES = {"lr": "lr", "alpha": "scent_alpha", "beta": "scent_beta",
             "optimizer": "scent_optimizer", "scent_lr": "scent_lr",
             "num_sampled": "num_sampled"}
WORKER_OPTIONS = ("data_dir", "max_train", "max_test", "epochs", "batch_size",
                  "eval_batch_size", "dim", "dropout", "lr", "num_sampled",
                  "scent_optimizer", "scent_lr", "scent_beta", "scent_alpha",
                  "seed")
COLUMNS = ["method", "epochs", "s_per_epoch", "first_epoch_s", "train_s",
           "peak_rss_mb", "P@1", "P@5", "test_ce", "classes_per_step",
           "final_train_loss"]


def _load_config(name):
    """The packaged config ``name`` (``configs/<name>.py``)."""
    from xmc_tf import config as xconfig
    return xconfig.get_config(name)


def _model_config(method, args):
    if method == "full_softmax":
        c = _load_config("uniform_sparse")
        c.model.head = "dense"
        c.loss = "softmax"
    elif method in ("astra_shared", "lsh_shared"):
        # The sampled head with shared candidates over the same LabelDense
        # layer: configs/astra.py (ANN hard-negative pool) or configs/lsh.py
        # (LSH-retrieved pool), batch positives in the pool, k_r uniform
        # draws, sampled softmax; the index / tables refreshed as the
        # configs do (ASTRA from the first epoch here: tau_s = 0).
        c = _load_config("astra" if method == "astra_shared" else "lsh")
        c.loss = "softmax"
        c.model.sampled_layer = "dense"
        c.sampler.shared = True
        c.sampler.refresh_start_epoch = 0
        c.train.learning_rate = args.lr
    else:
        c = _load_config("scent")
        c.model.sampled_layer = "dense"
        c.scent.alpha = args.scent_alpha
        c.scent.beta = args.scent_beta
        c.scent.variant = "sox" if method == "sox" else "scent"
        c.scent.correction = "log_q" if method == "scent" else "none"
        # The paper's estimator (no own-class term) for scent_paper / sox.
        c.scent.own_term = method == "scent"
        c.train.optimizer = args.scent_optimizer
        c.train.learning_rate = (args.scent_lr if args.scent_optimizer ==
                                 "scent_momentum" else args.lr)
    c.seed = args.seed
    c.model.encoder = "sparse_embedding"
    c.model.encoder_dims = (args.dim,)
    c.model.intermediate_dim = 0
    c.model.dropout = args.dropout
    c.set.enabled = False
    return c


def _subsample(dataset, n, seed):
    from xmc_tf import data as xdata
    if not n or n >= dataset.num_instances:
        return dataset
    rows = np.sort(np.random.default_rng(seed).choice(dataset.num_instances,
                                                      n, replace=False))
    return xdata.XCDataset(dataset.features[rows], dataset.labels[rows])


def worker(method, args):
    """Trains and evaluates one method in this process; returns its row."""
    import keras
    import tensorflow as tf

    from xmc_tf import data as xdata
    from xmc_tf.job import heads as xheads
    from xmc_tf.job.build import build_model
    from xmc_tf.optimizers import LazyAdam

    from baselines import TFSampledSoftmaxTrainer, full_softmax_cross_entropy

    path = os.path.join(args.data_dir, "ManNextWord")
    full_train = xdata.load_dataset(os.path.join(path, "train.txt.gz"))
    if args.dev:
        # Tuning: evaluate on training-file instances outside the training
        # subsample (the test file stays unseen).
        order = np.random.default_rng(args.seed).permutation(
            full_train.num_instances)
        n_eval = args.max_test or 10_000
        n_train = args.max_train or full_train.num_instances - n_eval
        if n_train + n_eval > full_train.num_instances:
            raise ValueError("--dev: --max-train + --max-test exceed the "
                             "training file")
        rows = np.sort(order[:n_train]), np.sort(order[n_train:n_train +
                                                       n_eval])
        train, test = (xdata.XCDataset(full_train.features[r],
                                       full_train.labels[r]) for r in rows)
    else:
        train = _subsample(full_train, args.max_train, args.seed)
        test = _subsample(xdata.load_dataset(os.path.join(path,
                                                          "test.txt.gz")),
                          args.max_test, args.seed + 1)
    del full_train
    train.features, _ = xdata.normalize_features(train.features, "l2")
    test.features, _ = xdata.normalize_features(test.features, "l2")

    if method in PEER_METHODS:
        return _peer_row(method, train, test, args)
    config = _model_config(method, args)
    keras.utils.set_random_seed(args.seed)
    # sampled_softmax: the "scent" head only builds its LabelDense layer.
    head = xheads.get_head(config)
    head.prepare(train)
    model = build_model(config, train.num_features, train.num_labels,
                        train.is_sparse, head)
    from xmc_tf import decoding
    layer = decoding.scoring_layer(model)
    ds_kwargs = {}
    if method == "full_softmax":
        fit_model = model
        fit_model.compile(optimizer=LazyAdam(args.lr),
                          loss=head.make_loss(layer), jit_compile=False)
    elif method == "sampled_softmax":
        fit_model = TFSampledSoftmaxTrainer(
            model, args.num_sampled or args.batch_size, seed=args.seed)
        fit_model.compile(optimizer=LazyAdam(args.lr), jit_compile=False)
    else:
        fit_model = head.training_model(model, layer)
        head.compile(fit_model, layer,
                     head.make_optimizer() or LazyAdam(args.lr))
        ds_kwargs = head.dataset_kwargs()
    # The heads' own callbacks (index refresh, LSH re-hash); no validation.
    head_callbacks = (head.callbacks(layer, None)
                      if method in ("astra_shared", "lsh_shared") else [])
    train_ds = xdata.make_tf_dataset(train, args.batch_size, shuffle=True,
                                     seed=args.seed, **ds_kwargs)

    epoch_s = []

    class EpochTimer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.t0 = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            epoch_s.append(time.perf_counter() - self.t0)
            print(f"[{method}] epoch {epoch + 1}: {epoch_s[-1]:.1f} s, "
                  f"loss {logs.get('loss'):.4f}", flush=True)

    t0 = time.perf_counter()
    hist = fit_model.fit(train_ds, epochs=args.epochs, verbose=0,
                         shuffle=False,
                         callbacks=head_callbacks + [EpochTimer()])
    train_s = time.perf_counter() - t0

    # Test: full softmax over all classes, P@1 / P@5 from the same logits.
    ces, hits1, hits5 = [], 0, 0
    for x, y in xdata.make_tf_dataset(test, args.eval_batch_size):
        logits = model(x, training=False)
        ces.append(full_softmax_cross_entropy(logits, y))
        top = tf.math.top_k(logits, k=5).indices.numpy()
        true = y.numpy()[:, :1]
        hits1 += int(np.sum(top[:, :1] == true))
        hits5 += int(np.sum(top == true))
    n_test = test.num_instances
    if method == "full_softmax":
        classes = float(train.num_labels)
    elif method == "sampled_softmax":
        # sampled + the batch's true labels (some may coincide).
        classes = float(fit_model.num_sampled) + float(np.mean(
            [len(np.unique(yb.numpy()[yb.numpy() >= 0]))
             for _, yb in xdata.make_tf_dataset(train, args.batch_size,
                                                shuffle=True,
                                                seed=args.seed)]))
    else:
        classes = float(np.mean(hist.history["sampled_fraction"]) *
                        train.num_labels)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {
        "method": method, "epochs": args.epochs,
        "epoch_s": [round(s, 2) for s in epoch_s],
        "s_per_epoch": float(np.mean(epoch_s[1:] if len(epoch_s) > 1
                                     else epoch_s)),
        "first_epoch_s": epoch_s[0], "train_s": train_s,
        "peak_rss_mb": peak / 2**20,
        "P@1": 100.0 * hits1 / n_test, "P@5": 100.0 * hits5 / (5 * n_test),
        "test_ce": float(np.mean(np.concatenate(ces))),
        "classes_per_step": classes,
        "train_loss": [float(v) for v in hist.history["loss"]],
        "final_train_loss": float(hist.history["loss"][-1]),
        "num_train": train.num_instances, "num_test": n_test,
        "num_labels": train.num_labels,
        "optimizer": type(fit_model.optimizer).__name__,
        "learning_rate": float(keras.ops.convert_to_numpy(
            fit_model.optimizer.learning_rate)),
        "config": json.loads(config.to_json_best_effort()),
    }


def _peer_row(method, train, test, args):
    """Trains one peer of benchmarks/peers.py on ``train`` (its defaults),
    scores ``test``; the row has the columns the table reads."""
    import peers
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "train.txt")
        from xmc_tf import data as xdata
        xdata.write_xc(path, train)  # Omikuji trains on a file
        t0 = time.perf_counter()
        row = peers.PEERS[method](train, test, threads=os.cpu_count() or 2,
                                  train_path=path)
        process_s = time.perf_counter() - t0
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"method": method, "peer": row["method"], "epochs": "-",
            "train_s": row["train_s"], "s_per_epoch": None,
            "first_epoch_s": None, "peak_rss_mb": peak / 2**20,
            "P@1": row["P@1"], "P@5": row["P@5"], "test_ce": None,
            "classes_per_step": None, "final_train_loss": None,
            "decode_qps": row.get("decode_qps"), "peer_process_s": process_s,
            "num_train": train.num_instances, "num_test": test.num_instances,
            "num_labels": train.num_labels}


def _parser():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data-dir", default="/work/shared/data")
    p.add_argument("--methods",
                   default="full_softmax,sampled_softmax,scent,scent_paper,sox",
                   help=f"comma-separated, of {METHODS}")
    p.add_argument("--max-train", type=int, default=0,
                   help="random subsample of the training set (0: all)")
    p.add_argument("--max-test", type=int, default=0)
    p.add_argument("--dev", action="store_true",
                   help="tuning mode: evaluate on --max-test held-out "
                        "instances of the training file, not on the test "
                        "file")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--eval-batch-size", type=int, default=1024)
    p.add_argument("--dim", type=int, default=128,
                   help="width of the embedding (input of the output layer)")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="dropout rate after the embedding (training only)")
    p.add_argument("--lr", type=float, default=1e-2,
                   help="LazyAdam learning rate (full / sampled softmax, "
                        "and SCENT with --scent-optimizer lazy_adam)")
    p.add_argument("--num-sampled", type=int, default=0,
                   help="tf.nn.sampled_softmax_loss classes per step "
                        "(0: the batch size)")
    p.add_argument("--scent-optimizer", default="lazy_adam",
                   choices=["scent_momentum", "lazy_adam"])
    p.add_argument("--scent-lr", type=float, default=5.0,
                   help="learning rate of --scent-optimizer scent_momentum")
    p.add_argument("--scent-beta", type=float, default=None)
    p.add_argument("--scent-alpha", type=float, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="write the results as JSON")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--result", default=None, help=argparse.SUPPRESS)
    p.add_argument("--label", default=None, help=argparse.SUPPRESS)
    return p


def main(argv=None):
    p = _parser()
    args = p.parse_args(argv)
    defaults = _load_config("scent")
    if args.scent_beta is None:
        args.scent_beta = float(defaults.scent.beta)
    if args.scent_alpha is None:
        args.scent_alpha = float(defaults.scent.alpha)

    if args.worker:
        row = worker(args.worker, args)
        row["method"] = args.label or args.worker
        with open(args.result, "w") as f:
            json.dump(row, f, indent=1, default=str)
        return

    methods = []
    for spec in [m for m in args.methods.split(",") if m]:
        name, *pairs = spec.split(":")
        if name not in METHODS:
            p.error(f"unknown method {name!r}; expected {METHODS}")
        over = {}
        for pair in pairs:
            key, _, value = pair.partition("=")
            if key not in OVERRIDES or not value:
                p.error(f"--methods {spec!r}: expected key=value with key "
                        f"in {tuple(OVERRIDES)}")
            over[OVERRIDES[key]] = value
        methods.append((spec, name, over))
    import tensorflow as tf
    result = {"machine": {"platform": platform.platform(),
                          "cpus": os.cpu_count(),
                          "loadavg_start": os.getloadavg(),
                          "tensorflow": tf.__version__},
              "args": vars(args), "rows": []}
    with tempfile.TemporaryDirectory(prefix="scent_bench_") as tmp:
        for i, (spec, m, over) in enumerate(methods):
            out = os.path.join(tmp, f"{i}_{m}.json")
            values = {k: over.get(k, getattr(args, k)) for k in WORKER_OPTIONS}
            cmd = [sys.executable, os.path.abspath(__file__), "--worker", m,
                   "--label", spec, "--result", out] + [
                       f"--{k.replace('_', '-')}={v}"
                       for k, v in values.items()] + (
                           ["--dev"] if args.dev else [])
            print(f"== {m}: {' '.join(cmd[2:])}", flush=True)
            t0 = time.perf_counter()
            proc = subprocess.run(cmd)
            if proc.returncode != 0:
                print(f"{m} failed with exit code {proc.returncode}")
                result["rows"].append({"method": spec,
                                       "error": proc.returncode})
                continue
            with open(out) as f:
                row = json.load(f)
            row["process_s"] = time.perf_counter() - t0
            result["rows"].append(row)
            print(format_table([row], COLUMNS), flush=True)
    result["machine"]["loadavg_end"] = os.getloadavg()
    ok = [r for r in result["rows"] if "error" not in r]
    if ok:
        r0 = ok[0]
        print(f"\n== ManNextWord: {r0['num_train']} train / {r0['num_test']} "
              f"test, {r0['num_labels']} classes, batch {args.batch_size}, "
              f"{args.epochs} epochs, dim {args.dim}, dropout {args.dropout} "
              f"(test P@k percent, test CE nats over all classes) ==")
        print(format_table(ok, COLUMNS))
    print(f"\nload average start/end: {result['machine']['loadavg_start']} / "
          f"{result['machine']['loadavg_end']}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
