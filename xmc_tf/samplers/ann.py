"""Hard negatives from a (stale) faiss inner-product index over the label vectors.

ASTRA (Mehta et al.), Sec. 3.1 Idea 1 and Algorithm 1 lines 10-13: index the
*classifier* weights, so that the retrieved negatives are the labels the
current loss scores highest for an instance ("hard" negatives), and refresh
the index only every few epochs (stale).  :meth:`AnnNegativeSampler.refresh`
(driven by :class:`xmc_tf.callbacks.RefreshIndex`) rebuilds it from the bound
head's current weights; :meth:`~xmc_tf.samplers.NegativeSampler.sample` queries it with
the batch's head inputs (fresh queries, stale index) inside the train step
through ``tf.numpy_function`` and returns, per instance, the ``k`` labels
with the highest index scores that are not among its positives.

Label and query vectors come from :func:`xmc_tf.samplers.vectors.label_vectors`
(bias as an extra coordinate; a uniform-sparse head is scattered into its
e-dimensional input space, or projected when that exceeds ``max_bytes``).
When it projects, the sampler keeps the last ``query_sample_size`` head
inputs it was queried with and projects onto their top principal directions
at the next refresh (a Gaussian projection until it has seen enough of
them): the recall of a Gaussian projection is poor (see
:mod:`xmc_tf.samplers.vectors`), so with a projected head start the hard
negatives after some training steps (``RefreshIndex(start_epoch >= 1)``; a
:class:`~xmc_tf.samplers.MixtureSampler` records queries during its
uniform-only epochs).  Classifier weights are unnormalised, so
this is maximum-inner-product search (MIPS).

Index kinds (``index=``):

* ``"flat"``: exact ``faiss.IndexFlatIP``; refresh = copy the vectors.
* ``"ivf_flat"``: ``faiss.IndexIVFFlat`` with an inner-product coarse
  quantizer (``nlist`` k-means centroids, ``nprobe`` lists searched).  A
  refresh keeps the trained centroids and only re-assigns the vectors
  (``reset()`` + ``add``); the centroids are re-trained on the first
  refresh, every ``retrain_every`` refreshes, and when asked
  (``refresh(retrain=True)``).  Cost of a refresh: ``O(m * nlist * d)``
  for the assignment.
* ``"hnsw"``: ``faiss.IndexHNSWFlat`` (inner product); faiss HNSW cannot
  remove vectors, so every refresh rebuilds the graph (slow at 10^6 labels;
  graph indexes also lose recall on MIPS).
* ``"auto"`` (default): ``"flat"`` for ``m <= flat_threshold`` (16384: one
  batch of 256 queries then costs ~0.3 GFLOP at d = 64, and IVF's
  k-means has too few points per list), else ``"ivf_flat"``.

Defaults ``nlist = 2**round(log2(sqrt(m)))`` (1024 at 10^6 labels: a refresh
assigns 10^6 x 1024 x 64 multiply-adds) and ``nprobe = 16``.  Measured by
``benchmarks/ann_index.py`` on 2 shared cores (load 5-7, upper bounds),
synthetic clustered classifier-like vectors: at 10^6 x 64, first build
(k-means + add) 19.5 s, refresh 8.4 s, recall@50 0.999, 441 queries/s; at
10^5 x 64 (nlist 256) refresh 0.36 s, recall@50 0.965; HNSW rebuild at
10^5 x 64 27 s.

faiss is an optional dependency (``pip install xmc_tf[ann]``), imported
only when an index is built or restored.

The per-step search runs with one BLAS and one OpenMP thread
(:func:`one_thread`): a train step's search is small (``hard_queries`` rows,
:class:`~xmc_tf.samplers.MixtureSampler`), and the idle threads of NumPy's
and faiss' OpenBLAS / OpenMP pools spin after each call on the cores
TensorFlow's own threads run the step on.  ManNextWord (50k classes, 2
cores, ASTRA shared, 16 rows queried, the second epoch): 10.6 ms per step
with the libraries' default pools, 7.1 ms with one thread around each
search (also 7.1 with ``OPENBLAS_NUM_THREADS=1`` for the whole process;
SCENT: 3.9-4.2 ms).  Index refreshes (between steps) keep the default
pools.
"""

from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf

from xmc_tf.layers.scorer import label_layout
from xmc_tf.samplers.base import Candidates, NegativeSampler
from xmc_tf.samplers.vectors import (DEFAULT_MAX_BYTES, QueryTransform,
                                     label_vectors, projection_dim)

__all__ = ["AnnNegativeSampler", "FAISS", "import_faiss", "one_thread",
           "auto_index_kind"]


def auto_index_kind(num_labels: int, flat_threshold: int = 16384) -> str:
    """The index ``index="auto"`` stands for: ``"flat"`` (exact) up to
    ``flat_threshold`` labels, ``"ivf_flat"`` above.

    >>> auto_index_kind(10_000), auto_index_kind(670_091)
    ('flat', 'ivf_flat')
    """
    return "flat" if int(num_labels) <= int(flat_threshold) else "ivf_flat"

#: ``requires`` of the kinds that keep a faiss index.
FAISS = {"faiss": "pip install 'xmc_tf[ann]' (or faiss-cpu)"}

INDEX_KINDS = ("auto", "flat", "ivf_flat", "hnsw")


def import_faiss():
    """Imports faiss, or raises an ImportError saying how to install it.

    Returns:
      the ``faiss`` module.

    Raises:
      ImportError: faiss is not installed (``pip install xmc_tf[ann]``).
    """
    try:
        import faiss  # pylint: disable=import-outside-toplevel
    except ImportError as e:
        raise ImportError(
            "AnnNegativeSampler needs faiss, an optional dependency of "
            "xmc_tf: install it with `pip install xmc_tf[ann]` (or `pip "
            "install faiss-cpu`)") from e
    return faiss


_CONTROLLER = []  # the threadpoolctl controller, made after faiss loads


def one_thread():
    """One thread for every BLAS and OpenMP pool loaded (a context manager).

    A ``threadpoolctl.ThreadpoolController`` made once (after importing
    faiss when it is installed, so that its OpenBLAS / OpenMP libraries are
    among the pools), then ``controller.limit(limits=1)``: about 10 us a
    call.

    Returns:
      the limiter, already in effect: ``with one_thread(): ...`` restores
      the previous limits on exit.
    """
    if not _CONTROLLER:
        import threadpoolctl  # pylint: disable=import-outside-toplevel
        try:
            import_faiss()
        except ImportError:
            pass
        _CONTROLLER.append(threadpoolctl.ThreadpoolController())
    return _CONTROLLER[0].limit(limits=1)


def default_nlist(num_labels: int) -> int:
    """``2**round(log2(sqrt(m)))``, at least 1: the default IVF list count.

    >>> default_nlist(1_000_000), default_nlist(100_000)
    (1024, 256)
    """
    return max(1, 2 ** int(round(math.log2(math.sqrt(max(num_labels, 1))))))


class AnnNegativeSampler(NegativeSampler):
    """Top-k non-positive labels of a stale MIPS index (ASTRA hard negatives).

    See the module docstring.  Candidates are deterministic given the index
    (no random draw): ``weights`` are 1 and ``log_q`` 0 for the unmasked
    ones (ASTRA Eq. 2 gives the hard negatives weight 1; see
    :class:`~xmc_tf.samplers.MixtureSampler` for the unbiased mix).  A
    column is masked when the index returns fewer than ``k`` non-positive
    labels (IVF lists probed hold too few vectors, or ``m - |P_i| < k``).

    Args:
      num_labels: m.
      num_candidates: k, hard negatives per instance.
      index: ``"auto"``, ``"flat"``, ``"ivf_flat"`` or ``"hnsw"``.
      nlist: IVF lists (default ``default_nlist(num_labels)``).
      nprobe: IVF lists searched per query.
      hnsw_m: HNSW neighbours per node.
      ef_search, ef_construction: HNSW search / build breadth.
      retrain_every: re-train the IVF centroids every this many refreshes
        (0: only the first time and when asked).
      flat_threshold: ``index="auto"`` uses the exact index up to this m.
      projection, max_bytes: how label vectors are formed, see
        :func:`~xmc_tf.samplers.vectors.label_vectors`.
      query_sample_size: head inputs kept (the most recent ones) to fit the
        projection basis at each refresh; 0 = always Gaussian.  Memory
        ``query_sample_size * e * 4`` bytes, used only when projecting.
      seed: seed of the projection and of the k-means.
      num_threads: faiss OpenMP threads (None: faiss' default).

    Raises:
      ValueError: bad arguments.
      ImportError: (at :meth:`refresh` / :meth:`set_state`) faiss missing.

    Shapes: ``sample(queries float32 [b, e], positives int [b, n] padded with
    -1, step (unused))`` returns ``Candidates`` ``[b, k]``.  It fails when
    no index has been built yet (RuntimeError) or when the queries' width
    differs from the bound head's input (ValueError); inside a
    ``tf.function`` the ``tf.numpy_function`` reports them as a
    ``tf.errors.OpError`` (UnknownError, InvalidArgumentError) carrying the
    Python error's text.

    >>> import keras, numpy as np, xmc_tf
    >>> head = xmc_tf.layers.LabelDense(
    ...     1000, kernel_initializer=keras.initializers.GlorotUniform(seed=0))
    >>> _ = head(np.ones((1, 16), np.float32))  # built: 1000 vectors of 16
    >>> sampler = AnnNegativeSampler(num_labels=1000, num_candidates=8)
    >>> sampler.bind(head)
    >>> sampler.refresh()["index_projection"]  # 1000 <= flat_threshold: exact
    'none'
    >>> x = np.random.default_rng(0).normal(size=(32, 16)).astype(np.float32)
    >>> positives = np.full((32, 1), -1, np.int32)  # none (padding)
    >>> ids = sampler.sample(x, positives, step=0).ids.numpy()
    >>> ids.shape
    (32, 8)
    >>> scores = x @ head.kernel.numpy().T + head.bias.numpy()
    >>> bool(np.all(np.sort(ids, 1) == np.sort(np.argsort(-scores, 1)[:, :8], 1)))
    True
    """

    needs_refresh = True
    samples_before_refresh = False
    _short_yield_hint = ("Search more of the index (a larger nprobe) or "
                         "use index='flat'.")

    def __init__(self, num_labels, num_candidates, index="auto", nlist=None,
                 nprobe=16, hnsw_m=32, ef_search=128, ef_construction=64,
                 retrain_every=10, flat_threshold=16384, projection="auto",
                 max_bytes=DEFAULT_MAX_BYTES, query_sample_size=4096, seed=0,
                 num_threads=None):
        super().__init__(num_labels, num_candidates, seed)
        if index not in INDEX_KINDS:
            raise ValueError(f"index must be one of {INDEX_KINDS}, got {index!r}")
        if nlist is not None and int(nlist) < 1:
            raise ValueError(f"nlist must be >= 1, got {nlist}")
        for name, value in [("nprobe", nprobe), ("hnsw_m", hnsw_m),
                            ("ef_search", ef_search),
                            ("ef_construction", ef_construction)]:
            if int(value) < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if int(retrain_every) < 0:
            raise ValueError(f"retrain_every must be >= 0, got {retrain_every}")
        if int(query_sample_size) < 0:
            raise ValueError("query_sample_size must be >= 0, got "
                             f"{query_sample_size}")
        self.index_type = index
        self.kind = index if index != "auto" else auto_index_kind(
            self.num_labels, flat_threshold)
        self.nlist = int(nlist) if nlist is not None else default_nlist(
            self.num_labels)
        self.nprobe = int(nprobe)
        self.hnsw_m = int(hnsw_m)
        self.ef_search = int(ef_search)
        self.ef_construction = int(ef_construction)
        self.retrain_every = int(retrain_every)
        self.flat_threshold = int(flat_threshold)
        self.projection = projection
        self.max_bytes = int(max_bytes)
        self.num_threads = num_threads
        self.query_sample_size = int(query_sample_size)
        self._queries = None  # ring buffer [query_sample_size, e] when projecting
        self._queries_seen = 0
        self._index = None
        self._transform: QueryTransform | None = None
        self.refresh_count = 0
        self._refreshes_since_train = 0

    def bind(self, head_layer) -> None:
        super().bind(head_layer)
        self._queries, self._queries_seen = None, 0
        if (self.query_sample_size and projection_dim(
                head_layer, self.projection, self.max_bytes) is not None):
            width = label_layout(head_layer).input_dim
            self._queries = np.zeros((self.query_sample_size, int(width)),
                                     np.float32)

    def _record(self, queries):
        """Keeps the most recent head inputs (ring buffer) for the basis."""
        if self._queries is None:
            return
        x = np.asarray(queries, np.float32)
        size = self._queries.shape[0]
        if x.ndim != 2 or x.shape[1] != self._queries.shape[1] or not len(x):
            return
        x = x[-size:]
        rows = (self._queries_seen + np.arange(len(x))) % size
        self._queries[rows] = x
        self._queries_seen += len(x)

    def recorded_queries(self):
        """The kept head inputs ``[min(seen, query_sample_size), e]`` or None."""
        if self._queries is None or not self._queries_seen:
            return None
        return self._queries[:min(self._queries_seen, self._queries.shape[0])]

    # ------------------------------------------------------------------ index
    @property
    def ready(self) -> bool:
        """Whether an index has been built (or restored)."""
        return self._index is not None

    def _faiss(self):
        faiss = import_faiss()
        if self.num_threads is not None:
            faiss.omp_set_num_threads(int(self.num_threads))
        return faiss

    def _new_index(self, faiss, dim, vectors, train):
        if self.kind == "flat":
            return faiss.IndexFlatIP(dim), False
        if self.kind == "hnsw":
            index = faiss.IndexHNSWFlat(dim, self.hnsw_m,
                                        faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = self.ef_construction
            index.hnsw.efSearch = self.ef_search
            return index, False
        nlist = min(self.nlist, vectors.shape[0])
        if (not train and self._index is not None
                and self._index.d == dim and self._index.nlist == nlist):
            self._index.reset()  # keep the trained centroids
            return self._index, False
        quantizer = faiss.IndexFlatIP(dim)
        index = faiss.IndexIVFFlat(quantizer, dim, nlist,
                                   faiss.METRIC_INNER_PRODUCT)
        index.own_fields = True  # the index keeps the quantizer alive
        quantizer.this.disown()
        index.cp.seed = self.seed
        index.cp.max_points_per_centroid = 64  # train on <= 64 * nlist rows
        index.nprobe = min(self.nprobe, nlist)
        index.train(vectors)
        return index, True

    def build_from_vectors(self, vectors, transform: QueryTransform,
                           retrain=False) -> dict:
        """Builds or refreshes the index from given label vectors.

        :meth:`refresh` calls this with the bound head's vectors; tests and
        benchmarks can call it directly.

        Args:
          vectors: float32 ``[m, d']`` label vectors.
          transform: the matching :class:`QueryTransform`.
          retrain: re-train the IVF centroids now.

        Returns:
          ``{"index_refresh_seconds", "index_refresh_count",
          "index_retrained"}``.

        Raises:
          ValueError: ``vectors`` is not ``[num_labels, transform.output_dim]``.
          ImportError: faiss missing.
        """
        vectors = np.ascontiguousarray(vectors, dtype=np.float32)
        if vectors.shape != (self.num_labels, transform.output_dim):
            raise ValueError(
                f"label vectors must be [{self.num_labels}, "
                f"{transform.output_dim}], got {vectors.shape}")
        faiss = self._faiss()
        start = time.perf_counter()
        due = (self.retrain_every > 0
               and self._refreshes_since_train >= self.retrain_every)
        index, trained = self._new_index(faiss, vectors.shape[1], vectors,
                                         train=retrain or due)
        index.add(vectors)
        seconds = time.perf_counter() - start
        self._index, self._transform = index, transform
        self.refresh_count += 1
        # Refreshes served by the current centroids, this one included.
        self._refreshes_since_train = 1 if trained else (
            self._refreshes_since_train + 1)
        return {"index_refresh_seconds": seconds,
                "index_refresh_count": self.refresh_count,
                "index_retrained": bool(trained)}

    def refresh(self, retrain=False) -> dict:
        """Re-indexes the bound head's current label vectors (see the module).

        Args:
          retrain: also re-train the IVF centroids.

        Returns:
          statistics (:meth:`build_from_vectors`; the seconds include
          reading the weights and forming the vectors) and
          ``"index_projection"``: ``"none"`` (exact vectors), ``"queries"``
          (projected on the recorded queries' principal directions) or
          ``"gaussian"`` (projected, no queries recorded yet: low recall,
          see :mod:`xmc_tf.samplers.vectors`).

        Raises:
          RuntimeError: no head bound (:meth:`bind`).
          ImportError: faiss missing.
        """
        if self.head is None:
            raise RuntimeError(f"{type(self).__name__}.refresh: bind() the "
                               "head layer first")
        start = time.perf_counter()
        queries = self.recorded_queries()
        vectors, transform = label_vectors(
            self.head, self.projection, self.max_bytes,
            self.seed + self.refresh_count, queries=queries)
        stats = self.build_from_vectors(vectors, transform, retrain=retrain)
        stats["index_refresh_seconds"] = time.perf_counter() - start
        stats["index_projection"] = (
            "none" if transform.matrix is None else
            "queries" if queries is not None and len(queries) >= transform.matrix.shape[1]
            else "gaussian")
        return stats

    # ----------------------------------------------------------------- search
    def search(self, queries, positives, num_candidates=None, allow_empty=False):
        """NumPy core of :meth:`sample` (runs eagerly, outside TensorFlow).

        Args:
          queries: float ``[b, e]`` head inputs.
          positives: int ``[b, n]`` ids, -1 = padding.
          num_candidates: k (default ``self.num_candidates``).
          allow_empty: without an index, return all-masked candidates and
            ``ready=False`` instead of raising.

        Returns:
          ``(ids int32 [b, k], mask bool [b, k], ready bool)``: per row the
          k highest-scoring labels that are not positives, in decreasing
          index score.

        Raises:
          RuntimeError: no index (and not ``allow_empty``).
          ValueError: queries of the wrong width.
        """
        k = self.num_candidates if num_candidates is None else int(num_candidates)
        positives = np.asarray(positives).astype(np.int64, copy=False)
        b = positives.shape[0]
        self._record(queries)
        if self._index is None:
            if allow_empty:
                return (np.zeros((b, k), np.int32), np.zeros((b, k), bool),
                        np.bool_(False))
            raise RuntimeError(
                f"{type(self).__name__}: no index yet; call refresh() after "
                "bind() (xmc_tf.callbacks.RefreshIndex does it at train begin)")
        n = positives.shape[1]
        depth = min(k + n, self._index.ntotal)
        with one_thread():  # see the module docstring
            u = self._transform(queries)  # checks the width, even if b = 0
            if b == 0 or depth == 0:
                return (np.zeros((b, k), np.int32), np.zeros((b, k), bool),
                        np.bool_(True))
            _, found = self._index.search(u, depth)  # [b, depth], -1 = none
        bad = found < 0
        if n:
            bad |= (found[:, :, None] == positives[:, None, :]).any(-1)
        # Stable: the first k good ones per row, in the index's order.
        order = np.argsort(bad, axis=1, kind="stable")[:, :k]
        ids = np.take_along_axis(found, order, axis=1)
        mask = ~np.take_along_axis(bad, order, axis=1)
        if ids.shape[1] < k:
            pad = k - ids.shape[1]
            ids = np.pad(ids, [(0, 0), (0, pad)])
            mask = np.pad(mask, [(0, 0), (0, pad)])
        ids = np.where(mask, ids, 0).astype(np.int32)
        # Positives the index returned were drawn too (the yield measures
        # the index, not the data).
        drawn = np.minimum(mask.sum(axis=1) + (bad & (found >= 0)).sum(
            axis=1), k)
        self._count_candidates_numpy(np.arange(k)[None, :] < drawn[:, None])
        return ids, mask, np.bool_(True)

    def sample_with_status(self, queries, positives, num_candidates=None,
                           allow_empty=False):
        """Graph wrapper of :meth:`search`: ``(ids, mask, ready)`` tensors."""
        k = self.num_candidates if num_candidates is None else int(num_candidates)

        def fn(q, p):
            return self.search(q, p, k, allow_empty=allow_empty)

        queries = tf.convert_to_tensor(queries, tf.float32)
        positives = tf.convert_to_tensor(positives)
        ids, mask, ready = tf.numpy_function(
            fn, [queries, positives], [tf.int32, tf.bool, tf.bool],
            stateful=True, name="ann_search")
        batch = queries.shape[0]
        ids.set_shape([batch, k])
        mask.set_shape([batch, k])
        ready.set_shape([])
        return ids, mask, ready

    def sample(self, queries, positives, step) -> Candidates:
        del step  # deterministic given the index
        ids, mask, _ = self.sample_with_status(queries, positives)
        weights = tf.cast(mask, tf.float32)
        return Candidates(ids, mask, tf.zeros_like(weights), weights)

    # ------------------------------------------------------------------ state
    def get_state(self) -> dict:
        """The index (serialised by faiss), the query transform and the
        recorded head inputs of the projection basis.

        Returns:
          ``{"recorded_queries": float32 [query_sample_size, e] (the ring
          buffer), "queries_seen": int64 [1]}`` once a projecting sampler
          has recorded queries (before the first refresh too: they decide
          the basis of the next one, so a resume needs them), plus after
          the first refresh ``{"index": uint8 [bytes], "transform_matrix":
          float32 [e, p] (or [0, 0] = identity), "transform_meta": int64
          [input_dim, append_one, refresh_count, refreshes_since_train]}``;
          ``{}`` when there is neither.
        """
        state = {}
        if self._queries is not None and self._queries_seen:
            state["recorded_queries"] = self._queries.copy()
            state["queries_seen"] = np.array([self._queries_seen], np.int64)
        if self._index is None:
            return state
        faiss = self._faiss()
        matrix = self._transform.matrix
        state.update({
            "index": np.asarray(faiss.serialize_index(self._index)),
            "transform_matrix": (np.zeros((0, 0), np.float32) if matrix is None
                                 else matrix),
            "transform_meta": np.array(
                [self._transform.input_dim, int(self._transform.append_one),
                 self.refresh_count, self._refreshes_since_train], np.int64),
        })
        return state

    def _set_recorded_queries(self, state) -> None:
        queries = state.get("recorded_queries")
        seen = state.get("queries_seen")
        if (queries is None) != (seen is None):
            raise ValueError(f"{type(self).__name__}.set_state: "
                             "'recorded_queries' and 'queries_seen' go together")
        if queries is None:
            if self._queries is not None:
                self._queries[:] = 0.0
            self._queries_seen = 0
            return
        queries = np.array(queries, np.float32)  # a copy
        if self._queries is not None and queries.shape != self._queries.shape:
            raise ValueError(f"state holds recorded queries {queries.shape}, "
                             f"the sampler records {self._queries.shape}")
        self._queries = queries  # (an unbound sampler takes them as given)
        self._queries_seen = int(np.asarray(seen).reshape(-1)[0])

    def set_state(self, state) -> None:
        """Restores :meth:`get_state` (no index keys: drops the index).

        Raises:
          ValueError: keys missing, an index over another number of labels,
            or recorded queries of another shape than the bound sampler's.
          ImportError: faiss missing.
        """
        state = dict(state or {})
        index_keys = {"index", "transform_matrix", "transform_meta"}
        missing = index_keys - set(state)
        if missing and missing != index_keys:
            raise ValueError(f"{type(self).__name__}.set_state: missing keys "
                             f"{sorted(missing)}")
        self._set_recorded_queries(state)
        if missing:  # no index in the state
            self._index, self._transform = None, None
            return
        faiss = self._faiss()
        index = faiss.deserialize_index(np.asarray(state["index"], np.uint8))
        if index.ntotal != self.num_labels:
            raise ValueError(f"state holds an index over {index.ntotal} "
                             f"labels, sampler has {self.num_labels}")
        meta = np.asarray(state["transform_meta"]).astype(np.int64)
        matrix = np.asarray(state["transform_matrix"], np.float32)
        transform = QueryTransform(int(meta[0]),
                                   None if matrix.size == 0 else matrix,
                                   bool(meta[1]))
        if transform.output_dim != index.d:
            raise ValueError(f"transform gives {transform.output_dim}-d "
                             f"queries, index is {index.d}-d")
        if hasattr(index, "nprobe"):
            index.nprobe = min(self.nprobe, index.nlist)
        self._index, self._transform = index, transform
        self.refresh_count = int(meta[2])
        self._refreshes_since_train = int(meta[3])

    def get_config(self) -> dict:
        return {**super().get_config(), "index": self.index_type,
                "nlist": self.nlist, "nprobe": self.nprobe,
                "hnsw_m": self.hnsw_m, "ef_search": self.ef_search,
                "ef_construction": self.ef_construction,
                "retrain_every": self.retrain_every,
                "flat_threshold": self.flat_threshold,
                "projection": self.projection, "max_bytes": self.max_bytes,
                "query_sample_size": self.query_sample_size,
                "num_threads": self.num_threads}
