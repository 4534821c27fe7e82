"""Benchmark of LSH negative sampling: constant-time query, build, re-hash.

What it measures
----------------
LNS ("A Truly Constant-Time Distribution-Aware Negative Sampling", Sec. 2.2)
claims a sampling cost independent of the number of labels m at fixed K, L.
With ``xmc_tf.ops.lsh`` the buckets grow with m (about ``m / 2^K`` labels
each), so the query op reads only ``k`` of the ``T`` probed entries (uniform
draws located through the CSR offsets, never scanning a bucket): per
instance ``O(q L + k log k)``.  For each m in ``--sizes`` (default 100k and
1M) and each hash family (SimHash K=9, L=50, the paper's Text8 setting;
DWTA K=6, w=8, L=50, its 18-bit codes folded to 2^12 buckets) on random dense label vectors
(d = 64, unit Gaussian, as a label-major dense head holds them):

* ``hash s`` / ``build s``: hashing all m label vectors (``Xmc>LshSimHash``
  / ``Xmc>LshDwtaHash``) and building the L CSR tables (counting sort);
* ``rehash s``: re-hashing ``--rehash-rows`` random labels (hash them, then
  ``Xmc>LshUpdateTables``, which rewrites the ``[L, m]`` label array), and
  ``rehash/full``: its share of a full hash + build;
* ``query us/inst``: ``Xmc>LshQuery`` per instance for a batch of
  ``--batch`` instances with k = ``--k`` candidates, for LSH-embedding
  (q = 1 probe per table, codes of ReLU query vectors) and LSH-label
  (q = 5 positives per instance), with and without collision counts; median
  over ``--repeats`` calls, each with another step (fresh draws);
* ``sample us/inst``: the whole ``LshNegativeSampler.sample`` (hashing the
  queries, querying, masking accidental hits, cosines and inclusion
  probabilities) per instance, SimHash only.

The query calls of the different sizes are interleaved round-robin (one
call of each size in turn) so that load changes on the shared machine
cancel out of the ratios.

The last table divides each query time at the largest m by that at the
smallest (target: <= 1.3 from 100k to 1M).  ``T``: the mean number of probed
entries per instance (the work a bucket scan would do).

All times are wall-clock on the shared machine (2 cores, other jobs
running): read them as upper bounds.

Measured (2 shared cores, load ~5, defaults: d=64, b=256, k=100, 30
interleaved repeats; upper bounds)
--------------------------------------------------------------------------
Query op per instance, m = 100k -> 1M: SimHash embedding 20.4 -> 23.7 us
(x1.16), label (5 positives) 28.3 -> 30.7 us (x1.09); whole
``LshNegativeSampler.sample`` 148 -> 170 us (x1.15) embedding, 316 -> 343 us
(x1.08) label; DWTA embedding 33.6 -> 37.9 us (x1.13), label 46 -> 62 us
(x1.33).  Collision counts (DWTA's inclusion estimate) read a codes row per
candidate, which leaves the L3 cache at 1M: x1.04-1.64.  T (entries a bucket
scan would read) grows 10x: 12k -> 123k (SimHash embedding).  Build at 1M:
SimHash hash 15.2 s + tables 8.9 s, DWTA 37.3 s + 15.8 s; re-hash of 1024
labels at 1M: 0.65 s (SimHash) / 1.6 s (DWTA), 3 % of a full build, nearly
all of it rewriting the [L, m] tables.

How to run
----------
Build the op library (or ``pip install .``), then::

    XMC_TF_LIBRARY_PATH=/tmp/xmc/_xmc_ops.so PYTHONPATH=. \\
        python benchmarks/lsh.py --out /tmp/lsh.json

``--sizes 10000,100000`` for a quick run.  Peak memory at m = 1M: about
1.5 GB (vectors 256 MB, codes and labels 200 MB each per hash family,
plus the sampler's copies).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from xmc_tf.ops.lsh import (LshHashFamily, lsh_build_tables,  # noqa: E402
                            lsh_query, lsh_update_tables)
from xmc_tf.samplers.lsh import LshNegativeSampler  # noqa: E402

FAMILIES = {
    "simhash": dict(kind="simhash", num_bits=9, num_tables=50),
    # 6 * log2(8) = 18 code bits folded to 12: 4096 buckets, so that the
    # probed buckets hold T > k entries at m = 100k too (the regime where
    # the query subsamples and its cost should not depend on m).
    "dwta": dict(kind="dwta", num_bits=6, num_tables=50, bin_size=8,
                 bucket_bits=12),
}


class _Head:
    """Minimal label-major dense head: ``kernel [m, d]``."""

    def __init__(self, vectors):
        self.kernel = tf.Variable(vectors, trainable=False)
        self.units = vectors.shape[0]


def _timed(fn, repeats):
    """Median seconds of ``fn(i)`` over ``repeats`` calls after a warm-up."""
    fn(-1)
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def _interleaved(fns, repeats):
    """Median seconds of each ``fns[j](i)``, calls interleaved round-robin.

    Alternating the sizes cancels the drift of a shared machine's load out
    of the ratios between them.
    """
    for fn in fns:
        fn(-1)
    times = [[] for _ in fns]
    for i in range(repeats):
        for j, fn in enumerate(fns):
            start = time.perf_counter()
            fn(i)
            times[j].append(time.perf_counter() - start)
    return [float(np.median(t)) for t in times]


def build_family(name, m, d, args, rng):
    """Hashes m random label vectors and builds the tables (timed)."""
    spec = FAMILIES[name]
    family = LshHashFamily(input_dim=d, seed=args.seed, **spec)
    vectors = rng.standard_normal((m, d), dtype=np.float32)
    row = {"hash": name, "m": m, "K": family.num_bits,
           "L": family.num_tables, "B": family.num_buckets}
    start = time.perf_counter()
    codes = family.hash_dense(vectors)
    codes.numpy()
    row["hash_s"] = time.perf_counter() - start
    start = time.perf_counter()
    offsets, labels = lsh_build_tables(codes, family.num_buckets)
    labels.numpy()
    row["build_s"] = time.perf_counter() - start

    rows = rng.choice(m, args.rehash_rows, replace=False).astype(np.int32)
    moved = rng.standard_normal((len(rows), d), dtype=np.float32)

    def rehash(_):
        new = family.hash_dense(moved)
        out = lsh_update_tables(offsets, labels, codes, rows, new)
        out[1].numpy()

    row["rehash_s"] = _timed(rehash, max(3, args.repeats // 4))
    row["rehash_over_full"] = row["rehash_s"] / (row["hash_s"] +
                                                 row["build_s"])
    state = {"family": family, "vectors": vectors, "codes": codes,
             "offsets": offsets, "labels": labels}
    return row, state


def query_calls(row, state, args, rng):
    """The timed query calls of one size: {key: fn(i)}."""
    family, codes = state["family"], state["codes"]
    offsets, labels = state["offsets"], state["labels"]
    m, d = state["vectors"].shape
    b, k = args.batch, args.k
    x = np.maximum(rng.standard_normal((b, d), dtype=np.float32), 0)
    positives = rng.integers(0, m, (b, 5)).astype(np.int32)
    emb_codes = family.hash_dense(x)[:, None, :]
    label_codes = tf.gather(codes, positives)
    calls = {}
    for mode, qc in (("embedding", emb_codes), ("label", label_codes)):
        for collisions in (False, True):
            def query(i, qc=qc, collisions=collisions):
                res = lsh_query(offsets, labels, codes, qc, k, step=i + 1,
                                seed=args.seed, count_collisions=collisions)
                res.ids.numpy()
            calls[f"query_{mode}{'_coll' if collisions else ''}_us"] = query
        res = lsh_query(offsets, labels, codes, qc, k, step=0)
        row[f"T_{mode}"] = float(np.mean(res.probed.numpy()))
        row[f"rate_{mode}"] = float(np.mean(res.rate.numpy()))
    if row["hash"] == "simhash":
        head = _Head(state["vectors"])
        for mode in ("embedding", "label"):
            sampler = LshNegativeSampler(m, k, hash="simhash",
                                         K=family.num_bits,
                                         L=family.num_tables, query=mode,
                                         seed=args.seed)
            sampler.bind(head)
            sampler.set_state({"params": family.params,
                               "codes": codes.numpy()})
            sample = tf.function(sampler.sample)
            xq, pq = tf.constant(x), tf.constant(positives)

            def run(i, sample=sample, xq=xq, pq=pq):
                c = sample(xq, pq, tf.constant(i + 1, tf.int64))
                c.ids.numpy()
            calls[f"sample_{mode}_us"] = run
    return calls


def bench_family(name, sizes, d, args, rng):
    """Rows of one hash family: build per size, queries interleaved."""
    rows, calls = [], []
    for m in sizes:
        print(f"{name} m={m}: build ...", flush=True)
        row, state = build_family(name, m, d, args, rng)
        rows.append(row)
        calls.append(query_calls(row, state, args, rng))
    print(f"{name}: queries ...", flush=True)
    for key in calls[0]:
        secs = _interleaved([c[key] for c in calls], args.repeats)
        for row, sec in zip(rows, secs):
            row[key] = 1e6 * sec / args.batch
    return rows


QUERY_KEYS = ["query_embedding_us", "query_embedding_coll_us",
              "query_label_us", "query_label_coll_us", "sample_embedding_us",
              "sample_label_us"]


def print_tables(rows):
    print("\nBuild and re-hash (seconds; upper bounds, shared 2-core machine)")
    print(f"{'hash':8} {'m':>9} {'K':>2} {'L':>3} {'B':>6} {'hash s':>8} "
          f"{'build s':>8} {'rehash s':>9} {'rehash/full':>11}")
    for r in rows:
        print(f"{r['hash']:8} {r['m']:>9} {r['K']:>2} {r['L']:>3} {r['B']:>6} "
              f"{r['hash_s']:8.3f} {r['build_s']:8.3f} {r['rehash_s']:9.4f} "
              f"{r['rehash_over_full']:11.4f}")
    print("\nQuery cost per instance (microseconds)")
    names = ["emb", "emb+coll", "label", "label+coll", "sample emb",
             "sample label"]
    print(f"{'hash':8} {'m':>9} {'T emb':>9} {'T label':>9} " +
          " ".join(f"{n:>12}" for n in names))
    for r in rows:
        vals = [f"{r[k]:12.2f}" if k in r else f"{'-':>12}"
                for k in QUERY_KEYS]
        print(f"{r['hash']:8} {r['m']:>9} {r['T_embedding']:9.0f} "
              f"{r['T_label']:9.0f} " + " ".join(vals))
    ratios = {}
    print("\nQuery time ratio largest m / smallest m (target <= 1.3)")
    for name in FAMILIES:
        sel = sorted((r for r in rows if r["hash"] == name),
                     key=lambda r: r["m"])
        if len(sel) < 2:
            continue
        lo, hi = sel[0], sel[-1]
        ratios[name] = {k: hi[k] / lo[k] for k in QUERY_KEYS if k in lo}
        print(f"{name:8} m {lo['m']} -> {hi['m']}: " + ", ".join(
            f"{k.replace('_us', '')} {v:.2f}" for k, v in ratios[name].items()))
    return ratios


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000",
                        help="comma-separated numbers of labels m")
    parser.add_argument("--hashes", default="simhash,dwta")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--rehash-rows", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="write results as JSON")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    rows = []
    sizes = [int(s) for s in args.sizes.split(",")]
    for name in args.hashes.split(","):
        rows += bench_family(name, sizes, args.dim, args, rng)
    ratios = print_tables(rows)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows, "ratios": ratios,
                       "tf_version": tf.__version__, "cpus": os.cpu_count()},
                      f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
