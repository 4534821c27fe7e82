"""SampledTrainer: a model's head trained on positives + sampled negatives."""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.models.candidates import CandidateTrainer

__all__ = ["SampledTrainer"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledTrainer(CandidateTrainer):
    """Trains a model's head on positives + sampled negatives only.

    ``call`` is the wrapped model (full scores: prediction and evaluation
    are exact); ``train_step`` / ``test_step`` run the model up to the head
    layer's input (``queries`` ``[b, e]``), draw candidates with
    ``sampler.sample(queries, label_ids, optimizer.iterations)``, score the
    row's positives and candidates with ``head.score_candidates`` in one op
    call and apply the sampled loss.  Logged: ``loss`` and
    ``sampled_fraction`` (mean number of scored labels per row over
    ``num_labels``).

    Args:
      model: functional ``keras.Model`` whose head layer (named
        ``"output"``) is a :class:`~xmc_tf.layers.scorer.LabelScorer`
        (:class:`~xmc_tf.layers.UniformSparseDense`,
        :class:`~xmc_tf.layers.LabelDense`).
      sampler: a :class:`~xmc_tf.samplers.NegativeSampler` (bound to the
        head here).
      loss: a :class:`~xmc_tf.losses.sampled.SampledLoss`.
      shared: draw one candidate set per batch
        (``sampler.sample_shared``) scored by every row with the head
        layer's ``score_shared`` (one matrix product), instead of per-row
        candidates.

    Targets ``y``: int ``[b, n]`` label ids padded with -1 (what
    :func:`xmc_tf.data.make_tf_dataset` yields).

    Raises:
      ValueError: the head layer cannot score candidates, or ``shared``
        with a sampler that has no shared mode.

    Example:
      >>> import keras, xmc_tf
      >>> from xmc_tf.data import make_synthetic, make_tf_dataset
      >>> from xmc_tf.losses import SampledSquaredHinge
      >>> from xmc_tf.samplers import UniformNegativeSampler
      >>> train = make_synthetic(256, 100, 50, labels_per_instance=2, seed=0)
      >>> inputs = keras.Input((100,), sparse=True)
      >>> hidden = keras.layers.Dense(32, activation="relu")(inputs)
      >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(
      ...     50, name="output")(hidden))
      >>> trainer = SampledTrainer(model, UniformNegativeSampler(50, 8),
      ...                          SampledSquaredHinge())
      >>> trainer.compile(optimizer=xmc_tf.optimizers.LazyAdam(),
      ...                 jit_compile=False)
      >>> history = trainer.fit(make_tf_dataset(train, 64), epochs=2,
      ...                       verbose=0)
      >>> sorted(history.history)
      ['loss', 'sampled_fraction']
      >>> model(next(iter(make_tf_dataset(train, 4)))[0]).shape  # all labels
      TensorShape([4, 50])
    """

    def __init__(self, model, sampler, loss, shared=False, **kwargs):
        if shared and not sampler.supports_shared:
            raise ValueError(f"{type(sampler).__name__} has no shared-"
                             "candidates mode (shared=True)")
        super().__init__(model, **kwargs)
        self.shared = bool(shared)
        self.sampler = sampler
        self.sampler.bind(self.head_layer)
        self.sampled_loss = loss

    def candidate_loss(self, queries, labels, example_ids, training):
        """Positives + the sampler's candidates, scored and weighted by the
        sampled loss (see the class docstring)."""
        del example_ids, training
        y = tf.cast(labels, tf.int32)
        if y.shape.rank == 1:
            y = y[:, None]
        draw = self.sampler.sample_shared if self.shared else self.sampler.sample
        candidates = draw(tf.stop_gradient(queries), y,
                          self.optimizer.iterations)
        # The draw and its weights are constants of the loss: no gradient
        # may flow through a sampler's reads of the head (e.g. the LSH
        # inclusion probabilities' arccos of the cosines, infinite at 1).
        candidates = type(candidates)(*[tf.stop_gradient(t)
                                        for t in candidates])
        pos_mask = y >= 0
        if candidates.ids.shape.rank == 1:  # shared by the batch
            pos_scores = self.head_layer.score_candidates(queries,
                                                          tf.maximum(y, 0))
            neg_scores = self.head_layer.score_shared(queries, candidates.ids)
        else:
            scored = tf.concat([tf.maximum(y, 0), candidates.ids], axis=1)
            scores = self.head_layer.score_candidates(queries, scored)
            n = tf.shape(y)[1]
            pos_scores, neg_scores = scores[:, :n], scores[:, n:]
        loss = self.sampled_loss(pos_scores, pos_mask, neg_scores, candidates)
        scored_per_row = (tf.reduce_sum(tf.cast(pos_mask, tf.float32), 1) +
                          tf.reduce_sum(tf.cast(candidates.mask, tf.float32), 1))
        return loss, scored_per_row / float(self.sampler.num_labels)

    def get_state(self) -> dict:
        """The sampler's state (index, tables) for an exact resume."""
        return self.sampler.get_state()

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`'s result into the sampler."""
        self.sampler.set_state(state)
