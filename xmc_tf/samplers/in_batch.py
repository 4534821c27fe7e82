"""In-batch negatives: the other instances' positives as candidates.

The candidates of a batch are the distinct labels that occur among the
positives of any of its rows, shared by all rows; for row ``i`` the ones in
its own positives are masked (accidental hits), so each row sees the other
rows' positives.  The scores of shared candidates could be computed as one
``[b, k]`` product; the interface still returns ids per row.

Sizing: the batch holds ``U`` distinct positive labels (at most ``b * n``).
The sampler returns a fixed ``k = num_candidates`` columns:

* ``U <= k``: all of them, the remaining ``k - U`` columns are padding
  (``mask`` False);
* ``U > k``: a uniformly random subset of ``k`` of them (stateless, keyed by
  ``(seed, step)``, the same subset for every row).

Choose ``k`` around the typical ``U``, e.g. ``batch_size x`` the mean number
of positives per instance (a label shared by several rows counts once), so
that little is dropped or padded.

Candidate distribution: a label appears as candidate in proportion to how
often it is a positive, so in-batch negatives are biased toward frequent
labels.  ``log_q`` estimates the log expected count from the batch itself:
``log(c_l * min(1, k / U))`` with ``c_l`` the number of rows having ``l``
as a positive (the frequency estimate of "sampling-bias-corrected" in-batch
softmax, Yi et al., RecSys 2019, with the in-batch count as estimate) times
the probability of surviving the subset.  ``weights`` are 1 for unmasked
candidates: the in-batch set is *not* an unbiased sample of the negatives,
so one-vs-all losses with this sampler do not estimate the full loss (use
:class:`~xmc_tf.samplers.UniformNegativeSampler` or the mixture for that).

Sources: in-batch negatives as used by NGAME/DEXA (cited in ASTRA Sec. 3.1);
log-Q correction as in ``tf.nn.sampled_softmax_loss``.
"""

from __future__ import annotations

import tensorflow as tf

from xmc_tf.samplers.base import Candidates, NegativeSampler, mask_accidental_hits

__all__ = ["InBatchSampler"]


class InBatchSampler(NegativeSampler):
    """The batch's other positives as negatives (see the module docstring).

    Args:
      num_labels: m (ids are checked against it).
      num_candidates: k, fixed number of candidate columns.
      seed: key (with the step) of the subset drawn when the batch has more
        than k distinct positives.

    Raises:
      ValueError: ``num_labels`` or ``num_candidates`` < 1.

    Shapes: ``sample(queries (unused), positives int [b, n] padded with -1,
    step)`` returns ``Candidates`` with ``ids`` int32 ``[b, k]`` (padding
    columns hold 0), ``mask`` bool (False for padding and for the row's own
    positives), ``log_q`` float32 (0 where masked) and ``weights`` float32
    (1 where unmasked, else 0).  ``sample`` raises
    ``tf.errors.InvalidArgumentError`` for a positive id ``>= m``.

    >>> s = InBatchSampler(num_labels=10, num_candidates=4)
    >>> c = s.sample(None, tf.constant([[1, 2], [2, -1]]), step=0)
    >>> c.ids.numpy().tolist(), c.mask.numpy().tolist()
    ([[1, 2, 0, 0], [1, 2, 0, 0]], [[False, False, False, False], [True, False, False, False]])
    """

    def sample(self, queries, positives, step) -> Candidates:
        del queries
        m, k = self.num_labels, self.num_candidates
        positives = tf.cast(tf.convert_to_tensor(positives), tf.int64)
        check = tf.debugging.assert_less(
            positives, tf.constant(m, tf.int64),
            message=f"positives: label id >= num_labels = {m}")
        with tf.control_dependencies([check]):
            batch = tf.shape(positives)[0]
            rows = tf.broadcast_to(
                tf.range(tf.cast(batch, tf.int64), dtype=tf.int64)[:, None],
                tf.shape(positives))
        valid = positives >= 0
        # Distinct (row, label) pairs, then per label the number of rows.
        pairs, _ = tf.unique(tf.boolean_mask(rows * m + positives, valid))
        labels, _, row_counts = tf.unique_with_counts(tf.math.floormod(pairs, m))
        num_unique = tf.shape(labels)[0]
        # Random subset of k when U > k: the k smallest stateless keys.
        keys = tf.random.stateless_uniform(
            [num_unique], seed=tf.stack([tf.constant(self.seed, tf.int64),
                                         tf.cast(step, tf.int64)]))
        keep = tf.minimum(num_unique, k)
        _, chosen = tf.math.top_k(-keys, k=keep, sorted=False)
        chosen = tf.sort(chosen)  # keep first-occurrence order
        labels = tf.gather(labels, chosen)
        row_counts = tf.cast(tf.gather(row_counts, chosen), tf.float32)
        survive = tf.minimum(1.0, k / tf.maximum(tf.cast(num_unique, tf.float32), 1.0))
        pad = k - keep
        ids = tf.pad(tf.cast(labels, tf.int32), [[0, pad]])
        log_q = tf.pad(tf.math.log(row_counts * survive), [[0, pad]])
        filled = tf.pad(tf.ones([keep], tf.bool), [[0, pad]], constant_values=False)
        ids = tf.broadcast_to(ids[None], tf.stack([batch, k]))
        mask = tf.logical_and(filled[None], mask_accidental_hits(ids, positives))
        log_q = tf.where(mask, log_q[None], 0.0)
        weights = tf.cast(mask, tf.float32)
        return Candidates(ids, mask, log_q, weights)
