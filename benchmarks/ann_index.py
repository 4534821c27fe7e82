"""Benchmark of the ANN index behind AnnNegativeSampler: refresh time and recall.

What it measures
----------------
ASTRA (Mehta et al., Sec. 5.2.1) indexes the classifier weights and rebuilds
the index every few epochs; the rebuild must fit in an epoch.  For
:class:`xmc_tf.samplers.AnnNegativeSampler` this benchmark reports, per case:

* ``build s``: first :meth:`build_from_vectors` (IVF: k-means training on
  ``64 * nlist`` rows + adding all vectors; flat: copy; HNSW: graph build);
* ``refresh s``: a later refresh from changed vectors (IVF: ``reset()`` +
  ``add`` with the trained centroids kept; HNSW: full rebuild), the median
  of ``--repeats``;
* ``q/s``: queries per second, batches of 256 queries, ``k + 0`` results;
* ``recall@k``: fraction of the exact top-k labels (by exact inner product
  with the *original* head, NumPy float64 on a sample of queries) that the
  sampler returns, k = 50.

Cases
-----
``dense``: label-major head vectors in 64 dimensions (63 weights + bias
coordinate) at m = 100k and 1M, synthetic "classifier-like" data: 1000
cluster centres, each label a centre plus noise scaled by a log-normal norm
(unnormalised, so maximum inner product search), queries = a random label's
direction plus noise.  Index kinds: IVF-Flat-IP (default nlist, nprobe 8 /
16 / 32), exact flat (100k), HNSW M=32 (100k; faiss HNSW cannot remove
vectors, so its refresh is a rebuild).

``sparse``: a uniform-sparse head (m = 100k, e = 4096 or 512, s = 32) whose
label weights follow 100 cluster profiles over the e inputs, queries are
ReLU inputs from the same profiles.  Label vectors by
:func:`xmc_tf.samplers.vectors.label_vectors`: exact scatter (e = 512,
513-d vectors, fits the 1 GiB budget) or projection to p = 64 / 128 with a
Gaussian matrix or the top principal directions of 4096 recorded queries
(the sampler's default once it has seen queries), searched with the exact
flat index (recall of the encoding alone) and with IVF (encoding + index).
``vectors s`` is the time to form the label vectors.

All times are wall-clock on the machine as it is (the development machine
has 2 cores shared with other jobs: treat them as upper bounds).

How to run
----------
::

    PYTHONPATH=. python benchmarks/ann_index.py --sizes full --out ann.json

``--sizes small`` runs only the m = 100k cases (~2 min).  Needs faiss
(``pip install xmc_tf[ann]``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time

import numpy as np

from xmc_tf.layers.uniform_sparse import random_connections
from xmc_tf.samplers.ann import AnnNegativeSampler, import_faiss
from xmc_tf.samplers.vectors import QueryTransform, label_vectors

K = 50
BATCH = 256


def exact_top_k(queries, vectors, k, chunk=65536):
    """Exact top-k ids by inner product (float64 accumulation), in chunks."""
    best_s = np.full((len(queries), 0), -np.inf)
    best_i = np.zeros((len(queries), 0), np.int64)
    q = queries.astype(np.float64)
    for start in range(0, len(vectors), chunk):
        s = q @ vectors[start:start + chunk].astype(np.float64).T
        ids = np.arange(start, start + s.shape[1])
        best_s = np.concatenate([best_s, s], 1)
        best_i = np.concatenate([best_i, np.broadcast_to(ids, s.shape)], 1)
        keep = np.argpartition(-best_s, min(k, best_s.shape[1] - 1), 1)[:, :k]
        best_s = np.take_along_axis(best_s, keep, 1)
        best_i = np.take_along_axis(best_i, keep, 1)
    return best_i


def recall(found, reference):
    k = reference.shape[1]
    return float(np.mean([len(set(a.tolist()) & set(b.tolist())) / k
                          for a, b in zip(found, reference)]))


def search_all(sampler, queries, k=K):
    """Sampler search in batches of 256 (no positives); ids and queries/s."""
    none = -np.ones((BATCH, 1), np.int64)
    out, start = [], time.perf_counter()
    for i in range(0, len(queries), BATCH):
        q = queries[i:i + BATCH]
        ids, mask, _ = sampler.search(q, none[:len(q)], k)
        out.append(np.where(mask, ids, -1))
    seconds = time.perf_counter() - start
    return np.concatenate(out), len(queries) / seconds


def dense_data(m, d, num_queries, seed):
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(1000, d - 1)).astype(np.float32)
    cluster = rng.integers(0, 1000, m)
    norms = np.exp(0.3 * rng.normal(size=(m, 1))).astype(np.float32)
    w = np.empty((m, d), np.float32)
    for start in range(0, m, 131072):
        stop = min(m, start + 131072)
        w[start:stop, :-1] = norms[start:stop] * (
            centers[cluster[start:stop]]
            + 0.5 * rng.normal(size=(stop - start, d - 1)).astype(np.float32))
    w[:, -1] = 0.1 * rng.normal(size=m).astype(np.float32)  # bias coordinate
    picks = rng.integers(0, m, num_queries)
    q = np.ones((num_queries, d), np.float32)
    q[:, :-1] = (centers[cluster[picks]]
                 + 0.5 * rng.normal(size=(num_queries, d - 1)).astype(np.float32))
    return w, q


def time_refreshes(sampler, vectors, transform, repeats, rng):
    """Median refresh time from slightly changed vectors (a training step)."""
    times = []
    for _ in range(repeats):
        changed = vectors + 0.01 * rng.standard_normal(vectors.shape,
                                                       dtype=np.float32)
        times.append(sampler.build_from_vectors(
            changed, transform)["index_refresh_seconds"])
    sampler.build_from_vectors(vectors, transform)  # back to the original
    return statistics.median(times)


def dense_cases(m, repeats, num_queries, kinds):
    d = 64
    rng = np.random.default_rng(1)
    t = time.perf_counter()
    vectors, queries = dense_data(m, d, num_queries, seed=0)
    print(f"  data {m} x {d}: {time.perf_counter() - t:.1f} s", flush=True)
    t = time.perf_counter()
    reference = exact_top_k(queries, vectors, K)
    print(f"  exact top-{K} of {num_queries} queries: "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    transform = QueryTransform(d, None, append_one=False)
    rows = []
    for kind in kinds:
        sampler = AnnNegativeSampler(m, K, index=kind)
        build = sampler.build_from_vectors(vectors, transform)[
            "index_refresh_seconds"]
        refresh = time_refreshes(sampler, vectors, transform,
                                 1 if kind == "hnsw" else repeats, rng)
        probes = [8, 16, 32] if kind == "ivf_flat" else [None]
        for nprobe in probes:
            if nprobe is not None:
                sampler._index.nprobe = nprobe  # pylint: disable=protected-access
            found, qps = search_all(sampler, queries)
            rows.append({
                "case": "dense", "m": m, "dim": d, "index": kind,
                "nlist": sampler.nlist if kind == "ivf_flat" else None,
                "nprobe": nprobe, "encoding": "exact",
                "build_s": build, "refresh_s": refresh, "vectors_s": 0.0,
                "queries_per_s": qps, f"recall_at_{K}": recall(found, reference)})
            print_row(rows[-1])
    return rows


def sparse_head(m, e, s, num_queries, seed):
    """indices/kernel of a uniform-sparse head and clustered ReLU queries."""
    rng = np.random.default_rng(seed)
    profiles = np.abs(rng.normal(size=(100, e))).astype(np.float32)
    cluster = rng.integers(0, 100, m)
    indices = random_connections(m, s, e, seed=seed)
    kernel = (profiles[cluster[:, None], indices]
              + 0.3 * rng.normal(size=(m, s))).astype(np.float32)
    bias = (0.1 * rng.normal(size=m)).astype(np.float32)

    def queries(n):
        return np.maximum(profiles[rng.integers(0, 100, n)]
                          + 0.3 * rng.normal(size=(n, e)), 0).astype(np.float32)
    return indices, kernel, bias, queries(num_queries), queries(4096)


class _Head:
    """Minimal uniform-sparse head (the attributes label_vectors reads)."""

    def __init__(self, indices, kernel, bias, num_features):
        self.indices, self.kernel, self.bias = indices, kernel, bias
        self.num_features = num_features
        self.units = kernel.shape[0]


def sparse_exact_top_k(head, queries, k):
    import scipy.sparse  # pylint: disable=import-outside-toplevel
    m, s = head.kernel.shape
    w = scipy.sparse.csr_matrix(
        (head.kernel.ravel().astype(np.float64), head.indices.ravel(),
         np.arange(0, m * s + 1, s)), shape=(m, head.num_features))
    scores = (w @ queries.astype(np.float64).T).T + head.bias
    top = np.argpartition(-scores, k, 1)[:, :k]
    return top


def sparse_cases(m, e, s, num_queries, encodings, index_kinds):
    t = time.perf_counter()
    indices, kernel, bias, queries, recorded = sparse_head(m, e, s, num_queries, 3)
    head = _Head(indices, kernel, bias, e)
    reference = sparse_exact_top_k(head, queries, K)
    print(f"  sparse head m={m} e={e} s={s} + exact top-{K}: "
          f"{time.perf_counter() - t:.1f} s", flush=True)
    rows = []
    for name, projection, use_queries in encodings:
        t = time.perf_counter()
        vectors, transform = label_vectors(
            head, projection=projection, seed=0,
            queries=recorded if use_queries else None)
        vec_s = time.perf_counter() - t
        for kind in index_kinds:
            sampler = AnnNegativeSampler(m, K, index=kind)
            build = sampler.build_from_vectors(vectors, transform)[
                "index_refresh_seconds"]
            found, qps = search_all(sampler, queries)
            rows.append({
                "case": "sparse", "m": m, "dim": transform.output_dim,
                "e": e, "s": s, "index": kind,
                "nlist": sampler.nlist if kind == "ivf_flat" else None,
                "nprobe": sampler.nprobe if kind == "ivf_flat" else None,
                "encoding": name, "build_s": build, "refresh_s": None,
                "vectors_s": vec_s, "queries_per_s": qps,
                f"recall_at_{K}": recall(found, reference)})
            print_row(rows[-1])
    return rows


HEADER = (f"{'case':<7}{'m':>9}{'dim':>5}  {'index':<9}{'nlist':>6}{'nprobe':>7}  "
          f"{'encoding':<16}{'vectors s':>10}{'build s':>9}{'refresh s':>10}"
          f"{'q/s':>9}{'recall@' + str(K):>10}")


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)


def print_row(r):
    print(f"{r['case']:<7}{r['m']:>9}{r['dim']:>5}  {r['index']:<9}"
          f"{_fmt(r['nlist'], 'd'):>6}{_fmt(r['nprobe'], 'd'):>7}  "
          f"{r['encoding']:<16}{r['vectors_s']:>10.2f}{r['build_s']:>9.2f}"
          f"{_fmt(r['refresh_s'], '.2f'):>10}{r['queries_per_s']:>9.0f}"
          f"{r[f'recall_at_{K}']:>10.3f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", choices=["small", "full"], default="small")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--queries", type=int, default=1024)
    parser.add_argument("--out", default=None, help="JSON output path")
    args = parser.parse_args()
    faiss = import_faiss()
    print(f"faiss {faiss.__version__}, {os.cpu_count()} cpus, "
          f"omp threads {faiss.omp_get_max_threads()}, "
          f"load {os.getloadavg()[0]:.2f}, {platform.processor() or platform.machine()}")
    print(HEADER)
    rows = dense_cases(100_000, args.repeats, args.queries,
                       ["flat", "ivf_flat", "hnsw"])
    if args.sizes == "full":
        rows += dense_cases(1_000_000, args.repeats, args.queries, ["ivf_flat"])
    rows += sparse_cases(100_000, 512, 32, args.queries,
                         [("exact", "none", False),
                          ("gauss p=128", 128, False),
                          ("queries p=128", 128, True)], ["flat", "ivf_flat"])
    rows += sparse_cases(100_000, 4096, 32, args.queries,
                         [("gauss p=64", 64, False), ("gauss p=128", 128, False),
                          ("queries p=64", 64, True),
                          ("queries p=128", 128, True)], ["flat", "ivf_flat"])
    print(f"load at end {os.getloadavg()[0]:.2f}")
    if args.out:
        with open(args.out, "w", encoding="utf-8") as f:
            json.dump({"k": K, "batch": BATCH, "faiss": faiss.__version__,
                       "rows": rows}, f, indent=1)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
