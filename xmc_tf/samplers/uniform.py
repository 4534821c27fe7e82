"""Uniform negative sampling over the labels that are not positives.

Every row ``i`` draws ``k`` labels uniformly, with replacement, from its
negatives ``N_i = [0, m) \\ P_i`` (``P_i``: the row's distinct positives).
The draw maps a uniform integer ``u`` in ``[0, |N_i|)`` to the ``u``-th
label of ``N_i`` in increasing order, so a positive can never be drawn: there
are no accidental hits to discard, every column is a valid negative, and
``|N_i|`` is known exactly.  The map is ``id = u + #{j : p_(j) - j <= u}``
over the sorted distinct positives ``p_(0) < p_(1) < ...`` (one
``tf.searchsorted`` per row, ``O(k log n)``).

With ``k`` draws from ``N_i`` each label of ``N_i`` is drawn ``k / |N_i|``
times in expectation, hence

* ``weights = |N_i| / k = (m - |P_i|) / k``: ``sum_j weights_j *
  loss(-1, s_j)`` is an unbiased estimate of ``sum_{l in N_i} loss(-1,
  s_l)`` (the one-vs-all loss over all negatives; ASTRA Lemma 4.1 with
  ``k_h = 0``);
* ``log_q = log(k / |N_i|)``, the log expected count (log-Q correction of
  the sampled softmax).

Shared mode (:meth:`UniformNegativeSampler.sample_shared`): the batch draws
``C = k`` ids from all of ``[0, m)`` with replacement, every row scores them
and masks its accidental hits, so ``weights = m / C`` and ``log_q = log(C /
m)`` (each label is drawn ``C / m`` times in expectation; the masked hits
are exactly the row's positives, so the estimate over ``N_i`` stays
unbiased).  This is the draw of ``tf.nn.sampled_softmax_loss`` with a
uniform proposal and ``unique=False``.

Draws are stateless, keyed by ``(seed, step)`` (see
:mod:`xmc_tf.samplers.base`).  Sources: ASTRA (Mehta et al.), Algorithm 1
lines 6-8 and Eq. 2; Bengio & Senecal (2008) for the log-Q correction.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.samplers.base import (Candidates, NegativeSampler,
                                  shared_candidates)

__all__ = ["UniformNegativeSampler", "draw_excluding"]


def _check_ids(ids, num_labels, what):
    """Asserts ``ids < num_labels`` (InvalidArgumentError naming ``what``)."""
    return tf.debugging.assert_less(
        ids, tf.constant(num_labels, ids.dtype),
        message=f"{what}: label id >= num_labels = {num_labels}")


def draw_excluding(excluded, num_labels, num_draws, seed):
    """Uniform draws, with replacement, from ``[0, m)`` minus a set per row.

    Args:
      excluded: int32/int64 ``[b, n]`` label ids to exclude per row,
        negative = padding; repeats are allowed (counted once).
      num_labels: m (Python int).
      num_draws: k (Python int >= 0).
      seed: int ``[2]`` tensor, the stateless seed (e.g. ``[seed, step]``).

    Returns:
      ``(ids, count)``: int32 ``[b, k]`` draws, each uniform over the row's
      complement ``C_i`` (0 with nothing to draw), and int32 ``[b]``
      ``|C_i| = m - |distinct excluded ids|``.

    Raises:
      tf.errors.InvalidArgumentError: an excluded id is ``>= num_labels``.

    >>> ids, count = draw_excluding(tf.constant([[0, 2, -1]]), 4, 6,
    ...                             tf.constant([1, 0], tf.int64))
    >>> sorted(set(ids.numpy()[0])) <= [1, 3], int(count[0])
    (True, 2)
    """
    m = int(num_labels)
    excluded = tf.cast(tf.convert_to_tensor(excluded), tf.int64)
    batch = tf.shape(excluded)[0]
    with tf.control_dependencies([_check_ids(excluded, m, "excluded ids")]):
        big = tf.constant(m, tf.int64)
        # One sentinel column so that n = 0 works and the table is non-empty.
        x = tf.concat([tf.where(excluded < 0, big, excluded),
                       tf.fill([batch, 1], big)], axis=1)
    x = tf.sort(x, axis=1)
    dup = tf.concat([tf.zeros([batch, 1], tf.bool), x[:, 1:] == x[:, :-1]], 1)
    x = tf.sort(tf.where(dup, big, x), axis=1)  # distinct ids first, then m
    valid = x < big
    count = big - tf.reduce_sum(tf.cast(valid, tf.int64), axis=1)  # |C_i|
    rank = tf.range(tf.shape(x, out_type=tf.int64)[1], dtype=tf.int64)[None]
    table = tf.where(valid, x - rank, big)  # p_(j) - j, non-decreasing
    raw = tf.random.stateless_uniform(
        tf.stack([batch, int(num_draws)]), seed=seed, minval=None,
        maxval=None, dtype=tf.int64)
    # Modulo bias <= m / 2**63: negligible.
    u = tf.math.floormod(raw, tf.maximum(count, 1)[:, None])
    ids = u + tf.searchsorted(table, u, side="right", out_type=tf.int64)
    ids = tf.where(count[:, None] > 0, ids, 0)
    return tf.cast(ids, tf.int32), tf.cast(count, tf.int32)


class UniformNegativeSampler(NegativeSampler):
    """``k`` uniform negatives per instance, positives excluded by construction.

    See the module docstring for the draw and the estimators.  Every
    returned column is a negative (``mask`` is False only for a row whose
    positives cover all ``m`` labels); repeated ids in a row are possible
    (draws with replacement) and each counts with its own weight, which keeps
    the estimate unbiased.

    Args:
      num_labels: m.
      num_candidates: k, draws per instance.
      seed: int, key of the stateless draws together with the step.

    Raises:
      ValueError: ``num_labels`` or ``num_candidates`` < 1.

    Shapes: ``sample(queries [b, d] (unused), positives int [b, n] padded
    with -1, step)`` returns :class:`~xmc_tf.samplers.Candidates` with
    ``ids`` int32 ``[b, k]``, ``mask`` bool, ``log_q = log(k / (m -
    |P_i|))`` and ``weights = (m - |P_i|) / k`` float32.
    ``sample`` raises ``tf.errors.InvalidArgumentError`` for a positive id
    ``>= m``.

    >>> s = UniformNegativeSampler(num_labels=10, num_candidates=4, seed=1)
    >>> c = s.sample(None, tf.constant([[3, 5], [0, -1]]), step=7)
    >>> c.ids.shape, float(c.weights[0, 0]), float(c.weights[1, 0])
    (TensorShape([2, 4]), 2.0, 2.25)
    """

    supports_shared = True

    def sample(self, queries, positives, step) -> Candidates:
        del queries  # uniform draws do not look at the instance
        return self.sample_excluding(positives, step, self.num_candidates)

    def draw_shared(self, step, num_draws):
        """``num_draws`` ids uniform on ``[0, m)`` with replacement.

        Keyed by ``(self.seed, step)`` (a different stream from
        :meth:`draw`'s per-row draws).

        Returns:
          int32 ``[num_draws]``.
        """
        seed = tf.stack([tf.constant(self.seed, tf.int64) + 0x5EED,
                         tf.cast(step, tf.int64)])
        ids = tf.random.stateless_uniform(
            [int(num_draws)], seed=seed, minval=0, maxval=self.num_labels,
            dtype=tf.int64)
        return tf.cast(ids, tf.int32)

    def sample_shared(self, queries, positives, step) -> Candidates:
        """``k`` uniform ids shared by the batch (see the module docstring).

        Returns:
          :class:`Candidates` with ``ids`` ``[k]``; ``weights = m / k`` and
          ``log_q = log(k / m)`` where a row does not hit a positive.
        """
        del queries
        k = self.num_candidates
        ids = self.draw_shared(step, k)
        m = float(self.num_labels)
        return shared_candidates(
            ids, positives, tf.fill([k], tf.math.log(k / m)),
            tf.fill([k], m / k))

    def draw(self, excluded, step, num_draws):
        """:func:`draw_excluding` keyed by ``(self.seed, step)``.

        Returns:
          ``(ids int32 [b, num_draws], count int32 [b])``.
        """
        seed = tf.stack([tf.constant(self.seed, tf.int64),
                         tf.cast(step, tf.int64)])
        return draw_excluding(excluded, self.num_labels, num_draws, seed)

    def sample_excluding(self, excluded, step, num_draws) -> Candidates:
        """``num_draws`` uniform negatives per row outside ``excluded``.

        Used by :class:`~xmc_tf.samplers.MixtureSampler` with ``excluded`` =
        positives and hard negatives, so the two parts never overlap.

        Args:
          excluded: int ``[b, n]`` ids to exclude, -1 = padding.
          step: int64 scalar, key of the draw.
          num_draws: k' (Python int).

        Returns:
          :class:`Candidates` ``[b, k']``; ``weights = |C_i| / k'`` and
          ``log_q = log(k' / |C_i|)`` with ``C_i`` the row's complement.
        """
        ids, count = self.draw(excluded, step, num_draws)
        count = tf.cast(count, tf.float32)[:, None]
        mask = tf.broadcast_to(count > 0, tf.shape(ids))
        k = float(num_draws)
        weights = tf.where(mask, count / k, 0.0)
        log_q = tf.where(mask, tf.math.log(k / tf.maximum(count, 1.0)), 0.0)
        return Candidates(ids, mask, log_q, weights)
