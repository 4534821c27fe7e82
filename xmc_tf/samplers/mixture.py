"""ASTRA's mixture of stale hard negatives and uniform negatives (Eq. 2).

ASTRA (Mehta et al.), Sec. 3.1 Idea 2, Algorithm 1 and Eq. 2: per instance
``i`` take ``k_h`` hard negatives ``H_i`` from a stale index (weight 1) and
``k_r`` negatives ``R_i`` uniformly from the rest, weighted ``1 / (p k_r)``
with ``p`` the probability of one uniform draw, so that::

    L_+ + sum_{l in H_i} l(-1, s_l) + sum_{l in R_i} w_i l(-1, s_l)

is an unbiased estimate of the full one-vs-all loss (Lemma 4.1).  The paper
writes ``p = 1 / (L - k_h)``; with several positives per row the uniform
part here draws from ``N_i = [0, m) \\ (P_i u H_i)``, so::

    w_i = |N_i| / k_r = (m - |P_i| - |H_i|) / k_r,

with ``|H_i|`` the hard negatives actually returned (unmasked).  Because the
uniform draw excludes the positives and the hard negatives by construction
(:func:`~xmc_tf.samplers.uniform.draw_excluding`), there are no accidental
hits and no duplicates between the two parts; the uniform part draws with
replacement, so it may repeat an id, each repeat with its own weight (still
unbiased).  ``log_q``: 0 for the hard ones (included with certainty,
expected count 1), ``log(k_r / |N_i|)`` for the uniform ones.

Before the hard sampler has an index (ASTRA's epochs ``t < tau_s``,
Algorithm 1 lines 6-8; :class:`xmc_tf.callbacks.RefreshIndex` with
``start_epoch = tau_s`` builds it), all ``k_h + k_r`` columns are uniform
negatives with weight ``(m - |P_i|) / (k_h + k_r)``.  The switch is decided
at run time, inside the traced train step.

Shared mode (:meth:`MixtureSampler.sample_shared`): the batch's pool
``H = union_i (H_i u P_i)`` (each row's ``k_h`` hard negatives and, with
``pool_positives``, its positives, deduplicated) plus ``k_r`` ids drawn
uniformly from ``[0, m)`` for the whole batch; every row scores all of
them.  For row ``i`` the pool's labels that are not its
positives are scored exactly (weight 1, ``log_q = 0``), and a uniform draw
that is neither in ``H`` nor in ``P_i`` gets ``w = m / k_r`` (``log_q =
log(k_r / m)``): each label outside ``H u P_i`` is drawn ``k_r / m``
times in expectation, so the estimate of row ``i``'s one-vs-all loss stays
unbiased (Lemma 4.1 with ``H`` in place of ``H_i``), and a row also sees
the other rows' hard negatives.  The pool may be any set that depends on
the batch only, so adding the batch's positives keeps the estimate
unbiased (and so does taking the hard negatives of only the first
``hard_queries`` rows of the batch: the pool stays a function of the
batch); the positives are the frequent labels (in-batch negatives follow
the label frequencies), which dominate a softmax's normaliser and which
``k_r`` uniform draws from ``m`` labels rarely hit.  Scored per row:
``|H| + k_r <= b k_h + k_r`` labels, in one matrix product instead of
``b (k_h + k_r)`` row gathers.  Before the index exists ``H`` is empty (``k_r`` uniform columns).

``hard_queries`` = q < b queries the hard sampler with q rows of a batch
instead of all b: the search (a faiss query or an LSH probe per row) is
a large part of a shared step's cost, and on multi-class data the rows' hard
negatives overlap (ManNextWord, a trained head: the exact top-32 of 2,048
instances hold 542 distinct labels), so q rows find most of the pool that
b rows would.  Measured in docs/notes/sampled.md.

Ablation in the paper (its Table 5, LF-AmazonTitles-131K P@1): uniform only
72.49, stale hard only 52.84, mixture 84.88; Table 11 uses
``k_h : k_r`` = 15-50 : 100-400.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.samplers.base import (Candidates, NegativeSampler,
                                  mask_accidental_hits, shared_candidates)
from xmc_tf.samplers.uniform import UniformNegativeSampler

__all__ = ["MixtureSampler"]


class MixtureSampler(NegativeSampler):
    """``k_h`` hard (index) + ``k_r`` uniform negatives with Eq. 2 weights.

    Columns ``[0, k_h)`` are the hard part, ``[k_h, k_h + k_r)`` the uniform
    part (before the index exists: all uniform).

    Args:
      hard: the hard-negative sampler, typically an
        :class:`~xmc_tf.samplers.AnnNegativeSampler` (any
        :class:`NegativeSampler` works; one with ``sample_with_status`` may
        be sampled before its first refresh).
      uniform: a :class:`~xmc_tf.samplers.UniformNegativeSampler`; its seed
        keys the uniform draws.
      k_h: hard negatives per instance, ``<= hard.num_candidates`` (default
        all of them; the hard sampler's top ``k_h`` are kept).
      k_r: uniform negatives per instance (default
        ``uniform.num_candidates``).
      pool_positives: in shared mode, add the batch's positives to the
        exactly scored pool (each row masks its own).
      hard_queries: in shared mode, the hard sampler is queried with the
        first ``hard_queries`` rows of a batch only (None or 0: all rows).

    Raises:
      ValueError: the two samplers disagree on ``num_labels``, ``uniform``
        is not a UniformNegativeSampler, or ``k_h``/``k_r`` out of range.

    Shapes: ``sample(queries float32 [b, e], positives int [b, n], step)``
    returns ``Candidates`` ``[b, k_h + k_r]``.

    >>> import numpy as np, xmc_tf
    >>> from xmc_tf.samplers import AnnNegativeSampler, UniformNegativeSampler
    >>> head = xmc_tf.layers.LabelDense(1000)
    >>> _ = head(np.ones((1, 16), np.float32))
    >>> mix = MixtureSampler(AnnNegativeSampler(1000, 50),
    ...                      UniformNegativeSampler(1000, 400, seed=1))
    >>> mix.bind(head); _ = mix.refresh()  # builds the hard sampler's index
    >>> x = np.random.default_rng(0).normal(size=(4, 16)).astype(np.float32)
    >>> c = mix.sample(x, np.array([[3], [5], [7], [9]], np.int32), step=0)
    >>> c.ids.shape
    TensorShape([4, 450])
    >>> # Eq. 2: a uniform draw stands for (m - |P| - k_h) / k_r labels.
    >>> round(float(c.weights[0, -1]), 4), (1000 - 1 - 50) / 400
    (2.3725, 2.3725)
    """

    def __init__(self, hard: NegativeSampler, uniform: UniformNegativeSampler,
                 k_h=None, k_r=None, pool_positives=True, hard_queries=None):
        if not isinstance(uniform, UniformNegativeSampler):
            raise ValueError("uniform must be a UniformNegativeSampler, got "
                             f"{type(uniform).__name__}")
        if hard.num_labels != uniform.num_labels:
            raise ValueError(f"hard sampler has {hard.num_labels} labels, "
                             f"uniform sampler {uniform.num_labels}")
        k_h = hard.num_candidates if k_h is None else int(k_h)
        k_r = uniform.num_candidates if k_r is None else int(k_r)
        if not 0 <= k_h <= hard.num_candidates:
            raise ValueError(f"k_h must be in [0, {hard.num_candidates}], got {k_h}")
        if k_r < 1:
            raise ValueError(f"k_r must be >= 1, got {k_r}")
        if hard_queries is not None and int(hard_queries) < 0:
            raise ValueError(f"hard_queries must be >= 0 or None, got "
                             f"{hard_queries}")
        super().__init__(hard.num_labels, k_h + k_r, uniform.seed)
        self.hard, self.uniform = hard, uniform
        self.k_h, self.k_r = k_h, k_r
        self.pool_positives = bool(pool_positives)
        self.hard_queries = int(hard_queries) if hard_queries else None
        self.needs_refresh = hard.needs_refresh

    def bind(self, head_layer) -> None:
        super().bind(head_layer)
        self.hard.bind(head_layer)

    def refresh(self, **kwargs) -> dict:
        """Refreshes the hard sampler's index (statistics passed through)."""
        return self.hard.refresh(**kwargs)

    @property
    def ready(self) -> bool:
        """Whether the hard part is active (its index exists)."""
        return bool(getattr(self.hard, "ready", True))

    def candidate_yield(self, reset: bool = True):
        """The hard sampler's :meth:`~NegativeSampler.candidate_yield` (the
        uniform part always fills its ``k_r``): mean hard candidates drawn
        and asked (``k_h``) per row, or None."""
        return self.hard.candidate_yield(reset=reset)

    def check_candidate_yield(self, reset: bool = True):
        """The hard sampler's
        :meth:`~NegativeSampler.check_candidate_yield` (warns once when it
        draws under half of ``k_h`` per row)."""
        return self.hard.check_candidate_yield(reset=reset)

    def _hard(self, queries, positives, step):
        if self.k_h == 0:
            batch = tf.shape(positives)[0]
            return (tf.zeros([batch, 0], tf.int32), tf.zeros([batch, 0], tf.bool),
                    tf.constant(True))
        if hasattr(self.hard, "sample_with_status"):
            return self.hard.sample_with_status(queries, positives, self.k_h,
                                                allow_empty=True)
        c = self.hard.sample(queries, positives, step)
        return c.ids[:, :self.k_h], c.mask[:, :self.k_h], tf.constant(True)

    def sample(self, queries, positives, step) -> Candidates:
        positives = tf.cast(tf.convert_to_tensor(positives), tf.int32)
        h_ids, h_mask, ready = self._hard(queries, positives, step)
        excluded = tf.concat([positives, tf.where(h_mask, h_ids, -1)], axis=1)
        k_all = self.k_h + self.k_r
        u_ids, count = self.uniform.draw(excluded, step, k_all)
        count = tf.cast(count, tf.float32)[:, None]  # [b, 1] = |N_i|
        has_neg = count > 0

        def part(k):  # mask, log_q, weights of k uniform draws from N_i
            mask = tf.broadcast_to(has_neg, [tf.shape(count)[0], k])
            log_q = tf.where(mask, tf.math.log(k / tf.maximum(count, 1.0)), 0.0)
            return mask, log_q, tf.where(mask, count / k, 0.0)

        r_mask, r_logq, r_w = part(self.k_r)
        h_w = tf.cast(h_mask, tf.float32)
        mixed = Candidates(
            ids=tf.concat([h_ids, u_ids[:, :self.k_r]], 1),
            mask=tf.concat([h_mask, r_mask], 1),
            log_q=tf.concat([tf.zeros_like(h_w), r_logq], 1),
            weights=tf.concat([h_w, r_w], 1))
        # Without an index the hard columns are all masked, so the draw
        # excluded only the positives: all k_h + k_r columns are uniform.
        uniform = Candidates(u_ids, *part(k_all))
        return Candidates(*[tf.where(ready, a, b)
                            for a, b in zip(mixed, uniform)])

    supports_shared = True

    def sample_shared(self, queries, positives, step) -> Candidates:
        """The batch's hard pool + ``k_r`` shared uniform ids (module
        docstring, "Shared mode").

        Returns:
          :class:`Candidates` with ``ids`` int32 ``[|H| + k_r]`` (``|H|``
          varies by batch), columns ``[0, |H|)`` the hard pool.
        """
        positives = tf.cast(tf.convert_to_tensor(positives), tf.int32)
        if self.hard_queries is not None:  # the first q rows only
            q = self.hard_queries
            queries = None if queries is None else queries[:q]
            positives_q = positives[:q]
        else:
            positives_q = positives
        h_ids, h_mask, _ = self._hard(queries, positives_q, step)
        pool = tf.boolean_mask(h_ids, h_mask)
        if self.pool_positives:
            pool = tf.concat([pool, tf.boolean_mask(positives, positives >= 0)],
                             0)
        pool = tf.unique(pool).y  # [H]
        drawn = self.uniform.draw_shared(step, self.k_r)  # [k_r]
        # A draw that repeats a pool label is masked: the pool scores it
        # exactly already (O(k_r |H|) compares).
        outside_pool = mask_accidental_hits(drawn[None, :], pool[None, :])[0]
        m = float(self.num_labels)
        exact = tf.zeros_like(pool, tf.float32)  # log_q 0, weight 1
        k_r = self.k_r
        return shared_candidates(
            tf.concat([pool, drawn], 0), positives,
            log_q=tf.concat([exact, tf.fill([k_r], tf.math.log(k_r / m))], 0),
            weights=tf.concat([exact + 1.0, tf.fill([k_r], m / k_r)], 0),
            valid=tf.concat([tf.ones_like(pool, tf.bool), outside_pool], 0))

    def get_state(self) -> dict:
        return {f"hard/{k}": v for k, v in self.hard.get_state().items()}

    def set_state(self, state) -> None:
        prefix = "hard/"
        other = [k for k in state if not k.startswith(prefix)]
        if other:
            raise ValueError(f"MixtureSampler.set_state: unexpected keys {other}")
        self.hard.set_state({k[len(prefix):]: v for k, v in state.items()})

    def get_config(self) -> dict:
        return {"hard": {"class_name": type(self.hard).__name__,
                         "config": self.hard.get_config()},
                "uniform": {"class_name": type(self.uniform).__name__,
                            "config": self.uniform.get_config()},
                "k_h": self.k_h, "k_r": self.k_r,
                "pool_positives": self.pool_positives,
                "hard_queries": self.hard_queries}
