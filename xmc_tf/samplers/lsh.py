"""LSH negative sampling in constant time per instance (LNS).

Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
Sec. 2 and Algorithm 1.  The label vectors of the head (its classifier
weights) are hashed into ``L`` tables of ``K``-function meta-hashes
(SimHash or DWTA, :mod:`xmc_tf.ops.lsh`).  Per instance the sampler probes
one bucket per table with

* ``query="embedding"`` (LSH-embedding, LNS Theorem 2): the head input
  ``E_x``, hashed at every step;
* ``query="label"`` (LSH-label, LNS Theorem 1): each positive label's
  vector ``w_y``, whose codes are already in the tables (as of its last
  re-hash),

and returns ``k`` candidates from the union of the probed buckets: all of
them if the buckets hold ``T <= k`` entries, else ``k`` entries drawn
uniformly (stateless, keyed by ``(seed, step, row)``), so the cost per
instance is ``O(q L + k log k)`` whatever the number of labels ``m``.
Accidental hits (candidates among the row's positives) and duplicates are
masked.

Label ``j`` is a candidate with probability (LNS Sec. 1.3, with the read
rate ``r = min(1, k / T)`` of the subsampling)::

    p_j = 1 - prod_q (1 - r * alpha_{q,j}^K)^L

where ``alpha`` is the per-function collision probability of query ``q``
and label ``j``.  SimHash: ``alpha = 1 - theta / pi`` from the cosine of the
current vectors (``inclusion="cosine"``, the default for SimHash).  DWTA has
no closed form: ``alpha^K`` is estimated by the fraction of the row's probed
buckets that hold the label (``inclusion="collisions"``).  The sampler
returns ``log_q = log p_j`` (log-Q correction of a sampled softmax: the
expected number of times ``j`` is drawn) and ``weights = 1 / p_j``
(Horvitz-Thompson: ``sum_j weights_j loss_j`` estimates the loss over all
negatives), with ``p_j`` clipped below at ``min_probability`` (default
``1 / m``, so a weight never exceeds ``m``); ``weighting="none"`` gives
weight 1 to every candidate instead (plain LNS, which trains on the
retrieved negatives without reweighting).  The probabilities treat the
codes as hashes of the current vectors; they are exact right after a
re-hash and drift with the weights until the next one.

Tables follow the weights through :meth:`LshNegativeSampler.refresh` (all
labels) and :meth:`LshNegativeSampler.rehash_rows` (only the given label
rows: ``2 K L`` hash evaluations per row plus a rewrite of the ``[L, m]``
tables; the result equals a full rebuild).  The trainer may call
``rehash_rows`` with the labels updated in a step, or
:class:`xmc_tf.callbacks.Rehash` does it on LNS's schedule (period starting
at 50 steps and growing).

Heads: :class:`xmc_tf.layers.UniformSparseDense` (label ``j`` is the sparse
vector ``kernel[j]`` at coordinates ``indices[j]`` of the ``e =
num_features`` head inputs, hashed without densifying), a label-major dense
layer such as :class:`xmc_tf.layers.LabelDense` (``kernel [m, d]``), or a
``keras.layers.Dense`` (``kernel [d, m]``), told apart once, at
:meth:`LshNegativeSampler.bind`, by the layer's
:func:`~xmc_tf.layers.scorer.label_layout` (which picks how the label
vectors are read: ``xmc_tf/samplers/_lsh_layouts.py``).  The bias is not
part of the label vector (LNS hashes the weight vectors).

The tables live in non-trainable ``tf.Variable`` s on the CPU (the ops are
CPU-only), so :meth:`sample` and :meth:`rehash_rows` run inside a
``tf.function`` without ``numpy_function``; label rows are gathered where the
head lives (only ``[b, k]`` rows travel to the CPU).  Variables are always
read densely and rows gathered from the tensor: a ``ResourceGather`` on a
variable switches it to copy-on-read, after which every read copies all of
it (this made LSH-label sampling 11x slower at m = 10^6 before it was
removed).
"""

from __future__ import annotations

import math
import time

import numpy as np
import tensorflow as tf

from xmc_tf.ops.lsh import (HASHES, LshHashFamily,
                            collision_inclusion_probability, lsh_build_tables,
                            lsh_query, lsh_update_tables,
                            simhash_inclusion_probability)
from xmc_tf.layers.scorer import label_layout
from xmc_tf.samplers._lsh_layouts import CPU as _CPU
from xmc_tf.samplers._lsh_layouts import label_weights
from xmc_tf.samplers._lsh_layouts import read as _read
from xmc_tf.samplers.base import Candidates, NegativeSampler, mask_accidental_hits

__all__ = ["LshNegativeSampler", "lsh_auto_K"]

QUERIES = ("embedding", "label")
INCLUSIONS = ("auto", "cosine", "collisions")
WEIGHTINGS = ("inverse_probability", "none")
_EPS = 1e-30


# ------------------------------------------------------------ query modes
class _EmbeddingQuery:
    """``query="embedding"``: one probe per row, the hashed head input."""

    @staticmethod
    def probe_codes(family, variables, queries, positives, codes):
        """int32 ``[b, 1, L]`` (see :meth:`LshNegativeSampler.query_codes`)."""
        del positives, codes
        return tf.expand_dims(family.hash_dense(
            tf.cast(queries, tf.float32), _read(variables["params"])), 1)

    @staticmethod
    def cosines(weights, queries, positives, ids):
        """Cosines ``[b, k, 1]`` of the candidates with the head input."""
        del positives
        x = tf.cast(queries, tf.float32)
        x_norm = tf.norm(x, axis=-1)[:, None]  # [b, 1]
        dot, w_norm = weights.embedding_dot(x, ids)
        cos = dot / tf.maximum(w_norm * x_norm, _EPS)
        return cos[..., None], tf.ones([tf.shape(ids)[0], 1], tf.bool)


class _LabelQuery:
    """``query="label"``: one probe per positive, its stored codes."""

    @staticmethod
    def probe_codes(family, variables, queries, positives, codes):
        """int32 ``[b, n, L]``, -1 for padding."""
        del family, queries
        positives = tf.cast(positives, tf.int32)
        if codes is None:
            codes = _read(variables["codes"])
        rows = tf.gather(codes, tf.maximum(positives, 0))
        return tf.where(positives[..., None] >= 0, rows, -1)

    @staticmethod
    def cosines(weights, queries, positives, ids):
        """Cosines ``[b, k, n]`` of the candidates with the positives."""
        del queries
        query_mask = positives >= 0
        # Padding reads label 0: masked by query_mask.
        return weights.label_cosines(ids, tf.maximum(positives, 0)), query_mask


_QUERY_MODES = {"embedding": _EmbeddingQuery(), "label": _LabelQuery()}


# -------------------------------------------------------- inclusion modes
class _CosineInclusion:
    """``p_j`` from the cosines (SimHash's ``alpha = 1 - theta / pi``)."""

    count_collisions = False

    def __init__(self, K, L):  # pylint: disable=invalid-name
        self.K, self.L = K, L  # pylint: disable=invalid-name

    def probability(self, res, qcodes, cosines):
        """``p [b, k]``; ``cosines()`` gives ``[b, k, q]`` and the mask."""
        del qcodes
        cos, query_mask = cosines()
        cos = tf.stop_gradient(cos)  # a proposal, not a loss term
        return simhash_inclusion_probability(cos, query_mask, self.K, self.L,
                                             res.rate)


class _CollisionInclusion:
    """``p_j`` from the fraction of the row's probes that hold ``j``."""

    count_collisions = True

    def __init__(self, K, L):  # pylint: disable=invalid-name
        del K
        self.L = L  # pylint: disable=invalid-name

    def probability(self, res, qcodes, cosines):
        """As :meth:`_CosineInclusion.probability` (``cosines`` unused)."""
        del cosines
        valid_probes = tf.reduce_sum(
            tf.cast(tf.reduce_all(qcodes >= 0, axis=-1), tf.int32),
            axis=1) * self.L
        return collision_inclusion_probability(res.collisions, valid_probes,
                                               res.rate)


def _inclusion_mode(inclusion, hash, K, L):  # pylint: disable=redefined-builtin,invalid-name
    """The inclusion strategy; ``"auto"``: cosine for SimHash, collisions
    for DWTA."""
    if inclusion == "auto":
        inclusion = "cosine" if hash == "simhash" else "collisions"
    cls = _CosineInclusion if inclusion == "cosine" else _CollisionInclusion
    return cls(K, L)


class LshNegativeSampler(NegativeSampler):
    """LSH-label / LSH-embedding negatives (LNS, see the module docstring).

    Args:
      num_labels: m.
      num_candidates: k, candidates per instance (the width of the output).
      hash: ``"simhash"`` or ``"dwta"``.
      K: hash functions per table (SimHash: bits per table; DWTA:
        ``log2(bin_size)`` bits per function).  None (the default):
        :func:`lsh_auto_K` for this ``hash``, ``bin_size`` and
        ``bucket_bits``, so that the ``L`` probed buckets hold about ``k``
        labels.  LNS uses SimHash K=9, L=50 (Text8, 250k labels) and DWTA
        K=6, L=400 / K=5, L=350.
      L: number of tables.
      query: ``"embedding"`` (hash the head input) or ``"label"`` (probe with
        the positives' codes).
      seed: seed of the hash functions and of the draws.
      bin_size: DWTA window w (``log2 w`` bits per function).
      bucket_bits: cap on bucket-id bits: tables have ``2^min(K log2 w,
        bucket_bits)`` buckets (longer codes are folded by a mixing hash).
      inclusion: how ``p_j`` is computed: ``"cosine"`` (SimHash only),
        ``"collisions"``, or ``"auto"`` (cosine for SimHash, collisions for
        DWTA).
      weighting: ``"inverse_probability"`` (weights ``1 / p_j``) or
        ``"none"`` (weights 1).
      min_probability: floor of ``p_j`` (default ``1 / num_labels``).

    Raises:
      ValueError: an argument out of range or unknown.

    Shapes: ``sample(queries float32 [b, d], positives int [b, n] padded with
    -1, step int64)`` returns :class:`~xmc_tf.samplers.Candidates` ``[b,
    k]`` (``ids`` int32, ``mask`` bool, ``log_q``/``weights`` float32).
    ``sample`` before :meth:`refresh` (or :meth:`set_state`) raises
    RuntimeError; the candidates it draws are counted for
    :meth:`~xmc_tf.samplers.NegativeSampler.candidate_yield`; a query of the wrong width or a positive id ``>= m``
    raises ``tf.errors.InvalidArgumentError``.

    >>> import keras, xmc_tf
    >>> head = xmc_tf.layers.LabelDense(1000)
    >>> _ = head(keras.ops.ones((1, 32)))
    >>> s = LshNegativeSampler(1000, 20, K=4, L=8, seed=0)
    >>> s.bind(head); _ = s.refresh()
    >>> c = s.sample(tf.ones((2, 32)), tf.constant([[3, -1], [5, 6]]), step=0)
    >>> c.ids.shape
    TensorShape([2, 20])
    """

    needs_refresh = True
    samples_before_refresh = False
    _short_yield_hint = ("The probed buckets hold fewer labels than asked "
                         "for: use fewer hash functions per table (K=None "
                         "picks them from the label space) or more tables.")

    def __init__(self, num_labels, num_candidates, hash="simhash", K=None, L=50,
                 query="embedding", seed=0, bin_size=8, bucket_bits=16,
                 inclusion="auto", weighting="inverse_probability",
                 min_probability=None):
        # pylint: disable=redefined-builtin,invalid-name
        super().__init__(num_labels, num_candidates, seed)
        if hash not in HASHES:
            raise ValueError(f"hash must be one of {HASHES}, got {hash!r}")
        if query not in QUERIES:
            raise ValueError(f"query must be one of {QUERIES}, got {query!r}")
        if inclusion not in INCLUSIONS:
            raise ValueError(f"inclusion must be one of {INCLUSIONS}, got "
                             f"{inclusion!r}")
        if inclusion == "cosine" and hash != "simhash":
            raise ValueError("inclusion='cosine' needs hash='simhash' (DWTA "
                             "has no closed-form collision probability)")
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting must be one of {WEIGHTINGS}, got "
                             f"{weighting!r}")
        if not 1 <= int(bucket_bits) <= 24:
            raise ValueError(f"bucket_bits must be in [1, 24], got {bucket_bits}")
        if K is None:
            K = lsh_auto_K(num_labels, num_candidates, L, hash=hash,  # noqa: N806
                           bin_size=bin_size, bucket_bits=bucket_bits)
        if int(K) < 1 or int(L) < 1:
            raise ValueError(f"K and L must be >= 1, got {K} and {L}")
        if min_probability is not None and not 0.0 < min_probability <= 1.0:
            raise ValueError(f"min_probability must be in (0, 1], got "
                             f"{min_probability}")
        self.hash = hash
        self.K = int(K)  # pylint: disable=invalid-name
        self.L = int(L)  # pylint: disable=invalid-name
        self.query = query
        self.bin_size = int(bin_size)
        self.bucket_bits = int(bucket_bits)
        self.inclusion = inclusion
        self.weighting = weighting
        self.min_probability = (None if min_probability is None
                                else float(min_probability))
        self.family: LshHashFamily | None = None
        # Strategies: query and inclusion mode (fixed here), the head's
        # weight layout (chosen at bind()).
        self._query = _QUERY_MODES[query]
        self._inclusion = _inclusion_mode(inclusion, hash, self.K, self.L)
        self._weights = None
        self._vars = None
        self._ready = False
        self._pending_state = None
        self.rehashes = 0

    # ------------------------------------------------------------------ head
    def bind(self, head_layer) -> None:
        """Binds the head and draws the hash functions (see the class doc).

        Args:
          head_layer: a built :class:`~xmc_tf.layers.scorer.LabelScorer`
            (:class:`~xmc_tf.layers.UniformSparseDense`,
            :class:`~xmc_tf.layers.LabelDense`), another label-major dense
            layer (``kernel [m, d]``) or a ``keras.layers.Dense`` (``kernel
            [d, m]``): see :func:`~xmc_tf.layers.scorer.label_layout`.

        Raises:
          ValueError: the layer is not built, has no usable ``kernel``, or
            its number of labels differs from ``num_labels``; DWTA with an
            input width smaller than ``bin_size``.
        """
        super().bind(head_layer)
        try:
            layout = label_layout(head_layer)
        except ValueError:
            raise ValueError(f"{type(self).__name__}: the head must be built "
                             "and have a 2-d kernel") from None
        self._weights = label_weights(layout)
        input_dim, rows = layout.input_dim, layout.num_labels
        if rows != self.num_labels:
            raise ValueError(f"{type(self).__name__}: head has {rows} label "
                             f"rows, sampler was made for {self.num_labels}")
        self.family = LshHashFamily(self.hash, self.K, self.L, input_dim,
                                    seed=self.seed, bin_size=self.bin_size,
                                    bucket_bits=self.bucket_bits)
        B = self.family.num_buckets  # pylint: disable=invalid-name
        m, L = self.num_labels, self.L  # pylint: disable=invalid-name
        with tf.device(_CPU):
            self._vars = {
                "params": tf.Variable(self.family.params, trainable=False,
                                      name="lsh_params"),
                "codes": tf.Variable(tf.zeros([m, L], tf.int32),
                                     trainable=False, name="lsh_codes"),
                "offsets": tf.Variable(tf.zeros([L, B + 1], tf.int32),
                                       trainable=False, name="lsh_offsets"),
                "labels": tf.Variable(tf.zeros([L, m], tf.int32),
                                      trainable=False, name="lsh_labels"),
            }
        self._ready = False
        if self._pending_state is not None:
            state, self._pending_state = self._pending_state, None
            self.set_state(state)

    @property
    def ready(self) -> bool:
        """Whether the tables have been built (or restored)."""
        return self._ready

    def _check_bound(self):
        if self._vars is None:
            raise RuntimeError(f"{type(self).__name__}: bind() a head first")

    def _hash_rows(self, rows=None):
        """Codes ``[r, L]`` of the head's label rows (all when ``rows`` is None).

        The rows are gathered where the head lives (a GPU head sends only
        the ``r`` rows to the CPU); the hash ops run on the CPU.
        """
        return self._weights.hash(self.family, self._vars["params"], rows)

    # --------------------------------------------------------------- tables
    def refresh(self) -> dict:
        """Re-hashes every label and rebuilds the tables (LNS pre-processing).

        Returns:
          ``{"index_refresh_seconds": seconds, "lsh_rows_rehashed": m}``.

        Raises:
          RuntimeError: no head bound.
        """
        self._check_bound()
        start = time.perf_counter()
        codes = self._hash_rows()
        with tf.device(_CPU):
            offsets, labels = lsh_build_tables(codes, self.family.num_buckets)
            self._vars["codes"].assign(codes)
            self._vars["offsets"].assign(offsets)
            self._vars["labels"].assign(labels)
        self._ready = True
        self.rehashes += 1
        return {"index_refresh_seconds": time.perf_counter() - start,
                "lsh_rows_rehashed": self.num_labels}

    def rehash_rows(self, rows):
        """Re-hashes the given label rows only (LNS update phase).

        Graph-compatible: may run inside the trainer's ``tf.function`` with
        the label ids updated in a step.  Costs ``2 K L`` hash evaluations
        per row (the row's own ``s`` or ``d`` inputs each) plus one rewrite
        of the ``[L, m]`` label array; the tables then equal a full
        :meth:`refresh` of those rows' current weights.  Repeated rows are
        fine.

        Args:
          rows: int ``[r]`` label ids in ``[0, num_labels)``.

        Returns:
          int32 scalar tensor, ``r``.

        Raises:
          RuntimeError: before :meth:`refresh` / :meth:`set_state`.
          tf.errors.InvalidArgumentError: a row out of range.
        """
        self._check_bound()
        if not self._ready:
            raise RuntimeError(f"{type(self).__name__}: refresh() before "
                               "rehash_rows()")
        rows = tf.reshape(tf.cast(rows, tf.int32), [-1])
        row_codes = self._hash_rows_checked(rows)
        with tf.device(_CPU):
            offsets, labels, codes = lsh_update_tables(
                _read(self._vars["offsets"]), _read(self._vars["labels"]),
                _read(self._vars["codes"]), rows, row_codes)
            self._vars["offsets"].assign(offsets)
            self._vars["labels"].assign(labels)
            self._vars["codes"].assign(codes)
        return tf.size(rows)

    def _hash_rows_checked(self, rows):
        """Hashes ``rows`` after checking their range (a clear error)."""
        with tf.control_dependencies([
                tf.debugging.assert_non_negative(
                    rows, message="rehash_rows: negative label id"),
                tf.debugging.assert_less(
                    rows, tf.constant(self.num_labels, tf.int32),
                    message=f"rehash_rows: label id >= num_labels = "
                            f"{self.num_labels}")]):
            return self._hash_rows(tf.identity(rows))

    # --------------------------------------------------------------- sample
    def query_codes(self, queries, positives, codes=None):
        """Codes probed per row: int32 ``[b, q, L]``, -1 = no probe.

        ``query="embedding"``: the hashed head inputs (``q = 1``);
        ``query="label"``: the stored codes of the positives (``q = n``).

        Args:
          queries: float ``[b, d]`` head inputs.
          positives: int ``[b, n]``, -1 = padding.
          codes: the label codes as a tensor, if already read.
        """
        with tf.device(_CPU):
            return self._query.probe_codes(self.family, self._vars, queries,
                                           positives, codes)

    def sample(self, queries, positives, step) -> Candidates:
        """``k`` LSH candidates per row (see the class docstring).

        Raises:
          RuntimeError: before :meth:`refresh` / :meth:`set_state`.
        """
        self._check_bound()
        if not self._ready:
            raise RuntimeError(f"{type(self).__name__}: the tables are not "
                               "built; call refresh() (or set_state) first")
        positives = tf.cast(tf.convert_to_tensor(positives), tf.int32)
        with tf.control_dependencies([tf.debugging.assert_less(
                positives, tf.constant(self.num_labels, tf.int32),
                message=f"positives: label id >= num_labels = "
                        f"{self.num_labels}")]):
            positives = tf.identity(positives)
        # The LSH ops and the tables are on the CPU; the cosines gather the
        # candidates' rows where the head lives.
        with tf.device(_CPU):
            codes = _read(self._vars["codes"])
            qcodes = self.query_codes(queries, positives, codes)
            res = lsh_query(_read(self._vars["offsets"]),
                            _read(self._vars["labels"]), codes, qcodes,
                            self.num_candidates,
                            step=step, seed=self.seed,
                            count_collisions=self._inclusion.count_collisions)
        self._count_candidates(res.valid)
        mask = tf.logical_and(res.valid,
                              mask_accidental_hits(res.ids, positives))
        p = self._inclusion.probability(
            res, qcodes, lambda: self._cosines(queries, positives, res.ids))
        floor = (self.min_probability if self.min_probability is not None
                 else 1.0 / self.num_labels)
        p = tf.maximum(p, floor)
        log_q = tf.where(mask, tf.math.log(p), 0.0)
        if self.weighting == "inverse_probability":
            # In float64: graph rewrites of a float32 1 / p (an approximate
            # reciprocal) would differ from eager by an ulp.
            inv = tf.cast(1.0 / tf.cast(p, tf.float64), tf.float32)
            weights = tf.where(mask, inv, 0.0)
        else:
            weights = tf.cast(mask, tf.float32)
        return Candidates(res.ids, mask, log_q, weights)

    def _cosines(self, queries, positives, ids):
        """Cosine of every candidate with every query: ``[b, k, q]``, mask."""
        return self._query.cosines(self._weights, queries, positives, ids)

    # ---------------------------------------------------------------- state
    def get_state(self) -> dict:
        """Hash parameters and label codes as NumPy arrays.

        The tables are a deterministic function of the codes (rebuilt by
        :meth:`set_state`), so the state is ``{"params": float32 [e, K L]
        (SimHash) or int32 [K L, w] (DWTA), "codes": int32 [m, L]}``; ``{}``
        before the first refresh.
        """
        if self._vars is None or not self._ready:
            return {}
        return {"params": self._vars["params"].numpy(),
                "codes": self._vars["codes"].numpy()}

    def set_state(self, state) -> None:
        """Restores :meth:`get_state`; a reload then samples identically.

        Before :meth:`bind` the state is kept and applied at bind time.
        ``{}`` forgets the tables (``ready`` becomes False).

        Raises:
          ValueError: missing or unexpected keys, or arrays whose shape or
            dtype does not fit this sampler and head.
        """
        if self._vars is None:
            self._pending_state = dict(state) if state else None
            return
        if not state:
            self._ready = False
            return
        if set(state) != {"params", "codes"}:
            raise ValueError(f"{type(self).__name__}.set_state: expected keys "
                             f"['codes', 'params'], got {sorted(state)}")
        params = np.asarray(state["params"])
        codes = np.asarray(state["codes"])
        want = self._vars["params"]
        if params.shape != tuple(want.shape) or params.dtype != want.dtype:
            raise ValueError(f"params must be {want.dtype.name} "
                             f"{tuple(want.shape)}, got {params.dtype} "
                             f"{params.shape}")
        if codes.shape != (self.num_labels, self.L) or not np.issubdtype(
                codes.dtype, np.integer):
            raise ValueError(f"codes must be int32 ({self.num_labels}, "
                             f"{self.L}), got {codes.dtype} {codes.shape}")
        B = self.family.num_buckets  # pylint: disable=invalid-name
        if codes.size and (codes.min() < 0 or codes.max() >= B):
            raise ValueError(f"codes must be in [0, {B}) (num_buckets)")
        # Re-derive the family (DWTA parameters are validated by its ops).
        self.family = LshHashFamily(self.hash, self.K, self.L,
                                    self.family.input_dim, seed=self.seed,
                                    bin_size=self.bin_size,
                                    bucket_bits=self.bucket_bits,
                                    params=params)
        with tf.device(_CPU):
            self._vars["params"].assign(params)
            offsets, labels = lsh_build_tables(codes.astype(np.int32), B)
            self._vars["codes"].assign(codes.astype(np.int32))
            self._vars["offsets"].assign(offsets)
            self._vars["labels"].assign(labels)
        self._ready = True

    def label_rows(self) -> dict:
        """The bound head's label vectors as label-major NumPy copies.

        Returns:
          ``{"weights": float32 [m, d]}`` for a dense head;
          ``{"weights": float32 [m, s], "indices": int32 [m, s]}`` for a
          uniform-sparse head (used by :class:`xmc_tf.callbacks.Rehash` to
          find the labels that changed).

        Raises:
          RuntimeError: no head bound.
        """
        self._check_bound()
        return self._weights.numpy_rows()

    def tables(self) -> dict:
        """The current tables as NumPy: ``offsets [L, B + 1]``, ``labels [L,
        m]``, ``codes [m, L]`` (for inspection and tests)."""
        self._check_bound()
        return {k: self._vars[k].numpy() for k in ("offsets", "labels",
                                                   "codes")}

    def get_config(self) -> dict:
        return {**super().get_config(), "hash": self.hash, "K": self.K,
                "L": self.L, "query": self.query, "bin_size": self.bin_size,
                "bucket_bits": self.bucket_bits, "inclusion": self.inclusion,
                "weighting": self.weighting,
                "min_probability": self.min_probability}

    @classmethod
    def from_config(cls, config: dict) -> "LshNegativeSampler":
        """Inverse of :meth:`get_config`."""
        return cls(**config)


def lsh_auto_K(num_labels: int, num_candidates: int, L: int,  # noqa: N802,N803
               hash: str = "simhash", bin_size: int = 8,  # pylint: disable=redefined-builtin
               bucket_bits: int = 16) -> int:
    """Hash functions per LSH table for a label space (what
    :class:`LshNegativeSampler` uses with ``K=None``).

    A table of ``K`` functions of ``b`` bits each has ``2^(K b)`` buckets
    (SimHash: ``b = 1``; DWTA: ``b = log2(bin_size)``), so a bucket holds
    ``m / 2^(K b)`` labels on average and the ``L`` probed buckets about
    ``L m / 2^(K b)``.  The bits per table are ``n = clip(floor(log2(L m /
    k)), 1, bucket_bits)`` (then the probed buckets hold at least ``k``
    labels: enough to fill the ``k`` candidates, and no more buckets than
    needed), and ``K = max(1, floor(n / b))`` functions give them (``K b
    <= n``: at least ``k`` labels, unless one function alone has more bits
    than ``n``).  A larger ``K`` leaves most probes empty on a small label
    space: Bibtex, m = 159, with SimHash ``K = 9`` gave about 13
    candidates per row of the 256 asked for; DWTA with ``K = 7`` (21 bits,
    folded to 16: 65k buckets for 159 labels) drew almost none.

    Args:
      num_labels: m (>= 1).
      num_candidates: k.
      L: tables.
      hash: ``"simhash"`` or ``"dwta"``.
      bin_size: DWTA window w (a power of two: ``log2 w`` bits per
        function); ignored for SimHash.
      bucket_bits: cap on the bits of a bucket id (as
        :class:`LshNegativeSampler`'s).

    Returns:
      int K >= 1.

    Raises:
      ValueError: an unknown ``hash``, or a ``bin_size`` that is not a power
        of two >= 2.

    >>> lsh_auto_K(159, 39, 50), lsh_auto_K(50_000, 256, 50)
    (7, 13)
    >>> lsh_auto_K(159, 39, 50, hash="dwta", bin_size=8)  # 2 x 3 bits
    2
    """
    if hash not in HASHES:
        raise ValueError(f"hash must be one of {HASHES}, got {hash!r}")
    bits_per_hash = 1
    if hash == "dwta":
        w = int(bin_size)
        if w < 2 or w & (w - 1):
            raise ValueError(f"bin_size must be a power of two >= 2, got "
                             f"{bin_size}")
        bits_per_hash = w.bit_length() - 1
    ratio = int(L) * int(num_labels) / max(int(num_candidates), 1)
    bits = min(int(bucket_bits),
               max(1, math.floor(math.log2(max(ratio, 2.0)))))
    return max(1, bits // bits_per_hash)
