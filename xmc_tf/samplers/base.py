"""The negative-sampler interface shared by sampled training heads.

A sampled head scores, per instance, only its positive labels and ``k``
candidate negatives instead of all ``num_labels`` labels.  A
:class:`NegativeSampler` draws those candidates for a batch; the sampled
losses (:mod:`xmc_tf.losses.sampled`) turn the candidates' scores into an
estimate of the full one-vs-all or softmax loss, using the importance
``weights`` (one-vs-all losses) or ``log_q`` (sampled softmax, log-Q
correction) that the sampler returns with them.

Contract of :meth:`NegativeSampler.sample` (called inside the trainer's
``tf.function`` train step, so it must be graph-compatible; samplers whose
core is NumPy or faiss wrap it in ``tf.numpy_function``):

* ``queries``: float32 ``[b, d]``, the input of the head layer (the
  instances' embeddings after the intermediate layer).
* ``positives``: int32 ``[b, n]`` label ids, ``-1`` = padding (what
  :func:`xmc_tf.data.make_tf_dataset` yields).
* ``step``: int64 scalar, the optimizer step.  Random draws are
  *stateless*, keyed by ``(seed, step)``: the same step draws the same
  candidates, so a resumed run samples exactly what an uninterrupted run
  would (no RNG state to checkpoint).

It returns :class:`Candidates` with ``k = num_candidates`` columns.  A
candidate equal to one of the row's positives (an "accidental hit") must be
masked out (``mask = False``): the losses treat every unmasked candidate as
a negative.

*Shared* candidates (:meth:`NegativeSampler.sample_shared`, samplers with
``supports_shared``): one candidate set ``ids`` int32 ``[C]`` for the whole
batch, scored by every row (``mask`` / ``log_q`` / ``weights`` stay
``[b, C]``, masking each row's accidental hits).  The head then scores the
batch with one ``[b, e] x [e, C]`` product over ``C`` gathered label rows
instead of gathering ``b k`` rows (what ``tf.nn.sampled_softmax_loss``
does): much cheaper when ``m`` is not much larger than ``b k`` (50k
classes, batch 256, k = 256: 65k gathered rows per step, more than ``m``).

Samplers that follow the head's weights (ANN, LSH) are *bound* to the head
layer with :meth:`NegativeSampler.bind` before training and rebuilt from the
current weights by :meth:`NegativeSampler.refresh` (driven by
:class:`xmc_tf.callbacks.RefreshIndex`).  Their state (a stale index, hash
tables) is returned by :meth:`get_state` as NumPy arrays and restored by
:meth:`set_state`, so a checkpoint holds exactly what the sampler used.

Sources: ASTRA (Mehta et al.), Algorithm 1 and Eq. 2 (hard + uniform
negatives, importance weights); Bengio & Senecal / Jean et al. (sampled
softmax, log-Q correction), as used by ``tf.nn.sampled_softmax_loss``.
"""

from __future__ import annotations

from typing import NamedTuple

import warnings

import numpy as np
import tensorflow as tf

# Defined with the candidate ops (the sampled losses use it without
# importing the samplers); part of this module's interface.
from xmc_tf.ops.sampled import mask_accidental_hits

__all__ = ["Candidates", "NegativeSampler", "SHORT_YIELD", "mask_accidental_hits",
           "shared_candidates"]

#: :meth:`NegativeSampler.check_candidate_yield` warns when a sampler drew
#: fewer than this fraction of the candidates asked for, on average.
SHORT_YIELD = 0.5


class Candidates(NamedTuple):
    """Per-instance candidate negatives for one batch.

    Attributes:
      ids: int32 ``[b, k]`` label ids in ``[0, num_labels)`` (masked entries
        hold any valid id, e.g. 0, so they can be gathered safely), or
        ``[k]`` for candidates shared by all rows of the batch
        (:meth:`NegativeSampler.sample_shared`); the other fields are
        ``[b, k]`` either way.
      mask: bool ``[b, k]``; False for padding and for accidental hits
        (a candidate that is one of the row's positives).
      log_q: float32 ``[b, k]``, log of the expected number of times the
        sampler draws this id for this row (``log(k * q(id))`` for ``k``
        draws from a distribution ``q``): subtracted from the logits by the
        sampled softmax (log-Q correction).  0 where a sampler has no
        proposal distribution (deterministic hard negatives).
      weights: float32 ``[b, k]``, importance weights for one-vs-all
        losses: ``sum_j weights[i, j] * loss(-1, score[i, j])`` estimates
        the loss over all of row ``i``'s negatives (uniform draws of ``k``
        out of ``N`` negatives: ``N / k``; ASTRA Eq. 2: 1 for the ``k_h``
        hard negatives, ``(N - k_h) / k_r`` for the ``k_r`` uniform ones).
        0 where ``mask`` is False.
    """

    ids: tf.Tensor
    mask: tf.Tensor
    log_q: tf.Tensor
    weights: tf.Tensor


class NegativeSampler:
    """Base class of the negative samplers (see the module docstring).

    Subclasses implement :meth:`sample` and, when they follow the head's
    weights, :meth:`refresh`, :meth:`get_state` and :meth:`set_state`.

    Args:
      num_labels: m, the size of the label space (>= 1).
      num_candidates: k, candidates per instance (>= 1).
      seed: int seed of the stateless random draws.

    Raises:
      ValueError: ``num_labels`` or ``num_candidates`` < 1.
    """

    #: Whether :meth:`refresh` must run (with a bound head) before sampling.
    needs_refresh = False
    #: Whether :meth:`sample_shared` is implemented.
    supports_shared = False
    #: Whether :meth:`sample` works before the first :meth:`refresh` (a
    #: :class:`~xmc_tf.samplers.MixtureSampler` then draws uniform
    #: negatives only; an ANN or LSH sampler alone raises).
    samples_before_refresh = True

    def __init__(self, num_labels: int, num_candidates: int, seed: int = 0):
        if int(num_labels) < 1:
            raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        if int(num_candidates) < 1:
            raise ValueError(
                f"num_candidates must be >= 1, got {num_candidates}")
        self.num_labels = int(num_labels)
        self.num_candidates = int(num_candidates)
        self.seed = int(seed)
        self.head = None
        self._yield_vars = None  # tf.Variables drawn, asked, rows (bind)
        self._yield_numpy = np.zeros(3, np.float64)  # numpy_function paths
        self._warned_short = False

    def bind(self, head_layer) -> None:
        """Gives the sampler the head layer whose label vectors it indexes.

        Args:
          head_layer: a built head layer exposing ``label_vectors()`` (NumPy
            float32 ``[num_labels, d]``; see the head layers).

        Raises:
          ValueError: the layer's number of labels differs from
            ``num_labels``.
        """
        units = getattr(head_layer, "units", None)
        if units is not None and int(units) != self.num_labels:
            raise ValueError(f"{type(self).__name__}: head has {units} labels, "
                             f"sampler was made for {self.num_labels}")
        self.head = head_layer
        if self._yield_vars is None:
            # Summed over replicas under a tf.distribute strategy.
            with tf.device("/CPU:0"):
                self._yield_vars = [
                    tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                name=f"candidates_{name}",
                                aggregation=tf.VariableAggregation.SUM)
                    for name in ("drawn", "asked", "rows")]

    # ------------------------------------------------------- candidate yield
    def _count_candidates(self, drawn_mask):
        """Adds a batch's drawn candidates to the yield counters.

        Called by samplers that can come up short (LSH, ANN) inside
        :meth:`sample` (graph-compatible; a no-op before :meth:`bind`).

        Args:
          drawn_mask: bool ``[b, k]``, True for each candidate actually
            drawn (accidental hits included: they were drawn).
        """
        if self._yield_vars is None:
            return
        drawn_mask = tf.convert_to_tensor(drawn_mask)
        with tf.device("/CPU:0"):
            counts = [tf.reduce_sum(tf.cast(drawn_mask, tf.float64)),
                      tf.cast(tf.size(drawn_mask), tf.float64),
                      tf.cast(tf.shape(drawn_mask)[0], tf.float64)]
            for variable, count in zip(self._yield_vars, counts):
                variable.assign_add(count)

    def _count_candidates_numpy(self, drawn_mask: np.ndarray) -> None:
        """:meth:`_count_candidates` for code running in NumPy (inside a
        ``tf.numpy_function``): bool ``[b, k]``."""
        drawn_mask = np.asarray(drawn_mask)
        self._yield_numpy += (float(np.count_nonzero(drawn_mask)),
                              float(drawn_mask.size),
                              float(drawn_mask.shape[0]))

    def _yield_counts(self, reset: bool):
        """``(drawn, asked, rows)`` since the last reset."""
        counts = self._yield_numpy.copy()
        if self._yield_vars is not None:
            counts += [float(v.numpy()) for v in self._yield_vars]
        if reset:
            self._yield_numpy[:] = 0.0
            if self._yield_vars is not None:
                for v in self._yield_vars:
                    v.assign(0.0)
        return counts

    def candidate_yield(self, reset: bool = True):
        """Mean candidates drawn per row since the last reset.

        Counts every :meth:`sample` (of an LSH or ANN sampler, also through
        a :class:`~xmc_tf.samplers.MixtureSampler`) since the last reset.
        An LSH sampler comes up short when its probed buckets hold fewer
        than ``k`` labels (too many buckets for the label space); an ANN
        sampler when its index returns fewer than ``k`` labels besides the
        positives.  Accidental hits count as drawn.

        Args:
          reset: start counting afresh after reading.

        Returns:
          ``(mean drawn per row, mean asked per row)`` as floats (the second
          is ``k``, or the mixture's ``k_h``), or None when nothing was
          counted (before :meth:`bind`, or a sampler that always fills its
          ``k``: uniform, in-batch).
        """
        drawn, asked, rows = self._yield_counts(reset)
        return None if rows == 0 else (drawn / rows, asked / rows)

    def check_candidate_yield(self, reset: bool = True):
        """:meth:`candidate_yield`, with a warning when it comes up short.

        Warns (``UserWarning``, once per sampler) when the mean candidates
        drawn per row fall below :data:`SHORT_YIELD` (half) of those asked:
        the loss then sees few negatives (an LSH sampler: fewer hash
        functions per table, e.g. the automatic ``K``; an ANN sampler: a
        larger ``nprobe``).  :class:`~xmc_tf.callbacks.RefreshIndex` and
        :class:`~xmc_tf.callbacks.Rehash` call it at every epoch end; a
        training loop of one's own can call it once an epoch.

        Args:
          reset: as :meth:`candidate_yield`.

        Returns:
          :meth:`candidate_yield`'s value.
        """
        result = self.candidate_yield(reset=reset)
        if result is None or self._warned_short:
            return result
        drawn, asked = result
        if drawn < SHORT_YIELD * asked:
            self._warned_short = True
            warnings.warn(
                f"{type(self).__name__} drew {drawn:.3g} candidates per row "
                f"on average of the {asked:.3g} asked for; the sampled loss "
                "sees few negatives. " + self._short_yield_hint,
                stacklevel=2)
        return result

    #: What to change when :meth:`check_candidate_yield` warns.
    _short_yield_hint = ""

    def sample(self, queries, positives, step) -> Candidates:
        """Draws ``num_candidates`` negatives per row (graph-compatible).

        Args:
          queries: float32 ``[b, d]`` head inputs.
          positives: int32 ``[b, n]`` label ids padded with -1.
          step: int64 scalar optimizer step (keys the stateless draws).

        Returns:
          :class:`Candidates` with ``[b, num_candidates]`` fields.
        """
        raise NotImplementedError

    def sample_shared(self, queries, positives, step) -> Candidates:
        """Draws one candidate set for the whole batch (graph-compatible).

        Args: as :meth:`sample`.

        Returns:
          :class:`Candidates` with ``ids`` int32 ``[C]`` and ``[b, C]``
          ``mask`` (False for each row's accidental hits), ``log_q`` and
          ``weights`` (see :func:`shared_candidates`).

        Raises:
          NotImplementedError: the sampler has no shared mode
            (``supports_shared`` is False).
        """
        raise NotImplementedError(
            f"{type(self).__name__} has no shared-candidates mode")

    def refresh(self) -> dict:
        """Rebuilds the sampler's index from the bound head's weights.

        Returns:
          Statistics for the epoch logs, e.g. ``{"index_refresh_seconds":
          1.2}``; ``{}`` for samplers without an index.
        """
        return {}

    def get_state(self) -> dict[str, np.ndarray]:
        """The sampler's mutable state as NumPy arrays (for checkpoints)."""
        return {}

    def set_state(self, state: dict[str, np.ndarray]) -> None:
        """Restores what :meth:`get_state` returned.

        Raises:
          ValueError: the state does not fit this sampler.
        """
        if state:
            raise ValueError(f"{type(self).__name__} has no state; got keys "
                             f"{sorted(state)}")

    def get_config(self) -> dict:
        """Constructor arguments (JSON-serialisable)."""
        return {"num_labels": self.num_labels,
                "num_candidates": self.num_candidates, "seed": self.seed}

    def __repr__(self):
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_config().items())
        return f"{type(self).__name__}({args})"


def shared_candidates(ids, positives, log_q, weights, valid=None):
    """:class:`Candidates` for one id set ``[C]`` scored by every row.

    Args:
      ids: int32 ``[C]`` label ids in ``[0, m)``.
      positives: int32 ``[b, n]`` positive ids padded with -1; a candidate
        equal to one of row i's positives is masked for row i.
      log_q: float32 ``[C]``, log expected count of each column in the
        batch's draw (0 for a column included with certainty).
      weights: float32 ``[C]``, importance weight of each column for the
        one-vs-all losses (1 for a certain column).
      valid: optional bool ``[C]``; False masks a column for every row
        (e.g. a uniform draw that repeats a certain column).

    Returns:
      :class:`Candidates` with ``ids [C]`` and ``[b, C]`` ``mask``,
      ``log_q`` and ``weights`` (0 where masked).
    """
    ids = tf.cast(ids, tf.int32)
    mask = mask_accidental_hits(ids, positives)  # [b, C]
    if valid is not None:
        mask = tf.logical_and(mask, tf.cast(valid, tf.bool)[None, :])
    log_q = tf.cast(log_q, tf.float32)[None, :]
    weights = tf.cast(weights, tf.float32)[None, :]
    return Candidates(ids, mask, tf.where(mask, log_q, 0.0),
                      tf.where(mask, weights, 0.0))
