"""Losses over the positives and sampled candidate negatives of each instance.

A sampled head scores, per instance ``i``, its positives (``pos_scores``
``[b, n]``, valid where ``pos_mask``) and the ``k`` candidates a
:class:`~xmc_tf.samplers.NegativeSampler` drew (``neg_scores`` ``[b, k]``
for ``candidates.ids``).  The losses here turn those scores into

* a one-vs-all estimate (:class:`SampledSquaredHinge`,
  :class:`SampledBinaryCrossentropy`):
  ``sum_{p valid} l(+1, s_p) + sum_{j: mask_j} weights_j l(-1, s_j)``,
  unbiased for the full loss ``sum_l l(y_l, s_l)`` of
  :mod:`xmc_tf.losses.hinge` when the sampler's importance weights are
  (uniform sampler: ``(m - |P_i|) / k``; ASTRA Eq. 2 for the mixture).  With
  every negative label as a candidate and weights 1 it *equals* the full
  loss;
* a multi-label sampled softmax (:class:`SampledSoftmax`).

Call convention (not a ``keras.losses.Loss``, whose ``(y_true, y_pred)``
cannot carry candidates; the sampled trainer calls it in its train step)::

    loss(pos_scores, pos_mask, neg_scores, candidates, sample_weight=None)

returning a scalar, or the per-instance ``[b]`` values with
``reduction=None``/``"none"``.  Reductions follow Keras and
:mod:`xmc_tf.losses.hinge`: ``"sum_over_batch_size"`` (default: the sum over
instances of ``sample_weight * per_instance``, divided by ``b``) and
``"sum"``.  All arithmetic is float32.

Sources: Schultheis & Babbar, Sec. 2 eq. 2 (one-vs-all squared hinge / BCE);
ASTRA (Mehta et al.), Eq. 1-2 and Lemma 4.1 (importance-weighted BCE over
hard + uniform negatives); Bengio & Senecal 2008 and Jean et al. 2015
(sampled softmax with log-Q correction), as in
``tf.nn.sampled_softmax_loss``.
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.ops.sampled import mask_accidental_hits

__all__ = ["SampledBinaryCrossentropy", "SampledLoss", "SampledSoftmax",
           "SampledSquaredHinge"]

# Logit given to masked candidates: exp underflows to exactly 0 in float32,
# without the NaN gradients of -inf when a row has no valid candidate.
_MASKED_LOGIT = -1e9
_REDUCTIONS = ("sum_over_batch_size", "sum", "none", None)
# The full loss that each sampled loss estimates (for the error message).
_FULL_LOSS = {"SampledSquaredHinge": "SquaredHinge",
              "SampledBinaryCrossentropy": "BinaryCrossentropy",
              "SampledSoftmax": "SoftmaxCrossentropy"}


class SampledLoss:
    """Base class: argument checks and Keras-style reduction.

    Args:
      reduction: ``"sum_over_batch_size"``, ``"sum"``, or ``None``/``"none"``.
      name: name of the loss.

    Raises:
      ValueError: unknown reduction.
    """

    def __init__(self, reduction="sum_over_batch_size", name=None):
        if reduction not in _REDUCTIONS:
            raise ValueError(f"reduction must be one of {_REDUCTIONS}, got "
                             f"{reduction!r}")
        self.reduction = reduction
        self.name = name or type(self).__name__

    def per_instance(self, pos_scores, pos_mask, neg_scores, candidates,
                     **kwargs):
        """float32 ``[b]`` loss of every instance (before reduction)."""
        raise NotImplementedError

    def __call__(self, pos_scores, pos_mask, neg_scores=None, candidates=None,
                 sample_weight=None, **kwargs):
        """Reduced loss; see the module docstring for the arguments.

        ``neg_scores`` and ``candidates`` are required: called as a Keras
        loss, ``loss(y_true, y_pred)`` (what ``model.compile(loss=...)``
        does), it raises the ValueError below instead of a missing-argument
        TypeError.

        Args:
          pos_scores: float ``[b, n]`` scores of the positives.
          pos_mask: bool ``[b, n]``, False for padding positives.
          neg_scores: float ``[b, k]`` scores of ``candidates.ids``.
          candidates: :class:`~xmc_tf.samplers.Candidates` ``[b, k]``.
          sample_weight: optional float ``[b]`` per-instance weights.
          **kwargs: loss-specific (see :class:`SampledSoftmax`).

        Returns:
          float32 scalar, or ``[b]`` with ``reduction=None``.

        Raises:
          ValueError: called without ``neg_scores`` and ``candidates`` (as
            ``model.compile(loss=...)`` does: a sampled loss needs
            :class:`xmc_tf.models.SampledTrainer`), or mismatched static
            shapes.
          tf.errors.InvalidArgumentError: mismatched shapes at run time.
        """
        if neg_scores is None or candidates is None:
            raise ValueError(
                f"{type(self).__name__} scores the candidates a sampler draws "
                "and cannot be the loss of model.compile (which passes only "
                "y_true and y_pred): train with xmc_tf.models.SampledTrainer("
                f"model, sampler, loss={type(self).__name__}()) and compile "
                "the trainer, or use the full loss "
                f"xmc_tf.losses.{_FULL_LOSS.get(type(self).__name__, 'SquaredHinge')}"
                "() in model.compile")
        pos_scores = tf.cast(tf.convert_to_tensor(pos_scores), tf.float32)
        neg_scores = tf.cast(tf.convert_to_tensor(neg_scores), tf.float32)
        pos_mask = tf.cast(tf.convert_to_tensor(pos_mask), tf.bool)
        pos_scores.shape.assert_is_compatible_with(pos_mask.shape)
        neg_scores.shape.assert_is_compatible_with(candidates.mask.shape)
        checks = [
            tf.debugging.assert_equal(tf.shape(pos_scores), tf.shape(pos_mask),
                                      message="pos_scores vs pos_mask shape"),
            tf.debugging.assert_equal(tf.shape(neg_scores),
                                      tf.shape(candidates.mask),
                                      message="neg_scores vs candidates shape"),
            tf.debugging.assert_equal(tf.shape(pos_scores)[0],
                                      tf.shape(neg_scores)[0],
                                      message="batch sizes differ")]
        with tf.control_dependencies(checks):
            values = self.per_instance(pos_scores, pos_mask, neg_scores,
                                       candidates, **kwargs)
        if sample_weight is not None:
            values = values * tf.cast(sample_weight, tf.float32)
        if self.reduction in (None, "none"):
            return values
        total = tf.reduce_sum(values)
        if self.reduction == "sum":
            return total
        return total / tf.cast(tf.maximum(tf.shape(values)[0], 1), tf.float32)

    def get_config(self) -> dict:
        return {"reduction": self.reduction, "name": self.name}

    @classmethod
    def from_config(cls, config):
        return cls(**config)


def _negative_weights(candidates):
    """Importance weights, 0 where masked (float32 ``[b, k]``)."""
    return tf.where(candidates.mask, tf.cast(candidates.weights, tf.float32),
                    0.0)


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledSquaredHinge(SampledLoss):
    """Importance-weighted squared hinge over positives and candidates.

    ``sum_{p} max(0, margin - s_p)**2 + sum_j w_j max(0, margin + s_j)**2``
    per instance (targets +1 for positives, -1 for candidates), the sampled
    form of :class:`xmc_tf.losses.SquaredHinge` (same margin, same
    per-instance sum, same reductions).

    Args:
      margin: the margin (1.0, as in the paper).
      reduction, name: see :class:`SampledLoss`.

    >>> from xmc_tf.samplers import Candidates
    >>> c = Candidates(tf.constant([[5]]), tf.constant([[True]]),
    ...                tf.constant([[0.0]]), tf.constant([[3.0]]))
    >>> float(SampledSquaredHinge()(tf.constant([[0.5]]), tf.constant([[True]]),
    ...                             tf.constant([[0.0]]), c))
    3.25
    """

    def __init__(self, margin=1.0, reduction="sum_over_batch_size",
                 name="sampled_squared_hinge"):
        super().__init__(reduction, name)
        self.margin = float(margin)

    def per_instance(self, pos_scores, pos_mask, neg_scores, candidates):
        pos = tf.where(pos_mask, tf.square(tf.nn.relu(self.margin - pos_scores)),
                       0.0)
        neg = tf.square(tf.nn.relu(self.margin + neg_scores))
        return (tf.reduce_sum(pos, -1)
                + tf.reduce_sum(_negative_weights(candidates) * neg, -1))

    def get_config(self):
        return {**super().get_config(), "margin": self.margin}


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledBinaryCrossentropy(SampledLoss):
    """Importance-weighted binary cross-entropy from logits (ASTRA Eq. 2).

    ``sum_p log(1 + exp(-s_p)) + sum_j w_j log(1 + exp(s_j))`` per instance:
    ASTRA's ``L_+ + L_-(H) + 1/(p k_r) L_-(R)`` when the candidates come from
    :class:`~xmc_tf.samplers.MixtureSampler`; the sampled form of
    :class:`xmc_tf.losses.BinaryCrossentropy`.

    Args:
      reduction, name: see :class:`SampledLoss`.

    >>> from xmc_tf.samplers import Candidates
    >>> c = Candidates(tf.constant([[5]]), tf.constant([[True]]),
    ...                tf.constant([[0.0]]), tf.constant([[2.0]]))
    >>> round(float(SampledBinaryCrossentropy()(
    ...     tf.constant([[0.0]]), tf.constant([[True]]), tf.constant([[0.0]]), c)), 4)
    2.0794
    """

    def __init__(self, reduction="sum_over_batch_size",
                 name="sampled_binary_crossentropy"):
        super().__init__(reduction, name)

    def per_instance(self, pos_scores, pos_mask, neg_scores, candidates):
        pos = tf.where(pos_mask, tf.nn.softplus(-pos_scores), 0.0)
        neg = tf.nn.softplus(neg_scores)
        return (tf.reduce_sum(pos, -1)
                + tf.reduce_sum(_negative_weights(candidates) * neg, -1))


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledSoftmax(SampledLoss):
    """Multi-label sampled softmax with log-Q correction and hit removal.

    For every valid positive ``p`` of instance ``i``, a softmax over ``{p}``
    and the row's unmasked candidates, with the candidates' logits
    corrected by their log expected counts::

        l_p = -log( exp(s_p - lq_p) /
                    (exp(s_p - lq_p) + sum_{j: mask_j} exp(s_j - log_q_j)) )

    and the instance's loss is the mean of ``l_p`` over its valid positives
    (0 for an instance without positives).  The other positives of the row
    never act as negatives: they are not in the softmax, and a candidate
    equal to one of them must be masked (the samplers do; pass
    ``positives=`` to make the loss mask such accidental hits itself).
    ``tf.nn.sampled_softmax_loss`` assumes one positive per row (its
    ``remove_accidental_hits`` and TFRS' ``RemoveAccidentalHits`` mask only
    the row's single true class).

    ``lq_p`` (``pos_log_q``) is the positive's log expected count.  It
    defaults to 0: the positive is in its softmax with certainty (expected
    count 1), which makes the denominator an unbiased estimate of the full
    partition function when the candidates are drawn from the negatives with
    the given ``log_q``.  ``tf.nn.sampled_softmax_loss`` instead subtracts
    ``log(true_expected_count)`` from the true logit; pass that as
    ``pos_log_q`` to reproduce it exactly for single-label rows.

    Args:
      reduction, name: see :class:`SampledLoss`.

    Extra call arguments:
      pos_log_q: optional float ``[b, n]`` (default 0).
      positives: optional int ``[b, n]`` positive ids (padded with -1):
        candidates equal to any of them are masked.

    >>> from xmc_tf.samplers import Candidates
    >>> c = Candidates(tf.constant([[7, 8]]), tf.constant([[True, False]]),
    ...                tf.constant([[0.0, 0.0]]), tf.constant([[1.0, 0.0]]))
    >>> round(float(SampledSoftmax()(tf.constant([[0.0]]), tf.constant([[True]]),
    ...                               tf.constant([[0.0, 5.0]]), c)), 4)
    0.6931
    """

    def __init__(self, reduction="sum_over_batch_size", name="sampled_softmax"):
        super().__init__(reduction, name)

    def per_instance(self, pos_scores, pos_mask, neg_scores, candidates,
                     pos_log_q=None, positives=None):
        mask = candidates.mask
        if positives is not None:
            mask = tf.logical_and(mask, mask_accidental_hits(candidates.ids,
                                                             positives))
        neg = tf.where(mask, neg_scores - tf.cast(candidates.log_q, tf.float32),
                       _MASKED_LOGIT)
        neg_lse = tf.reduce_logsumexp(neg, axis=-1, keepdims=True)  # [b, 1]
        pos = pos_scores
        if pos_log_q is not None:
            pos = pos - tf.cast(pos_log_q, tf.float32)
        # -log(e^a / (e^a + e^c)) = softplus(c - a)
        per_pos = tf.where(pos_mask, tf.nn.softplus(neg_lse - pos), 0.0)
        count = tf.reduce_sum(tf.cast(pos_mask, tf.float32), -1)
        return tf.math.divide_no_nan(tf.reduce_sum(per_pos, -1), count)
