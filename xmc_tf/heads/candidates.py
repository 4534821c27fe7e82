"""Candidate heads: train a full-scoring layer on a few scored labels per step.

The sampled head (:mod:`xmc_tf.heads.sampled`: positives + sampled
negatives) and the SCENT head (:mod:`xmc_tf.heads.scent`: the batch's own
classes) share everything but the choice of the scored labels and the loss:

* the head layer, ``config.model.sampled_layer``: ``"uniform_sparse"``
  (:class:`~xmc_tf.layers.UniformSparseDense`, fan-in
  ``config.model.connections_per_label``, SET rewiring when
  ``config.set.enabled``) or ``"dense"`` (:class:`~xmc_tf.layers.LabelDense`),
  both :class:`~xmc_tf.layers.scorer.LabelScorer` s with a zero initial
  bias;
* the training model, a :class:`CandidateTrainer` (``keras.Model``): it runs
  the model up to the head layer's input, lets the subclass choose and
  score labels through the layer's ``score_candidates`` / ``score_shared``
  and apply its loss (Keras passes a loss only ``(y_true, y_pred)``, which
  cannot express per-instance candidates), and logs ``loss`` and
  ``sampled_fraction``;
* evaluation: exact (the inference model scores every label and is decoded
  by the head of its layer, :func:`xmc_tf.heads.head_for_model`), held-out
  P@k once per epoch by :class:`xmc_tf.callbacks.TopKEvaluation`.

A new candidate head is a subclass of :class:`CandidateHead` (with its
trainer, a subclass of :class:`CandidateTrainer` implementing
:meth:`CandidateTrainer.candidate_loss`) in its own module, registered with
:func:`xmc_tf.heads.register`.

Source: ASTRA (Mehta et al.), Algorithm 1; ``scent-extreme-multiclass``,
Algorithm 26.
"""

from __future__ import annotations

from typing import ClassVar

import keras
import tensorflow as tf

from xmc_tf.heads.base import OUTPUT_LAYER, Head, output_layer
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.layers.scorer import check_label_scorer

__all__ = ["CandidateHead", "CandidateTrainer"]


class CandidateTrainer(keras.Model):
    """Base of the training models that score chosen labels only.

    ``call`` is the wrapped model (full scores: prediction and evaluation
    are exact).  ``train_step`` / ``test_step`` read ``(features,
    label_ids[, example_ids])`` batches, run the model up to the head
    layer's input (``queries [b, e]``) and ask :meth:`candidate_loss` for
    the loss and the fraction of labels scored per row; the gradient step
    adds the model's regularization losses.  Logged: ``loss`` and
    ``sampled_fraction``.

    Args:
      model: functional ``keras.Model`` whose head layer (named
        ``"output"``) is a :class:`~xmc_tf.layers.scorer.LabelScorer`.
      **kwargs: ``keras.Model`` arguments (``name``).

    Attributes:
      inference_model: ``model``.
      head_layer: its head layer.
      body: ``model`` up to the head layer's input.

    Raises:
      ValueError: the head layer is not a LabelScorer (the message names
        what it lacks).
    """

    #: Whether the logged ``loss`` includes the model's regularization
    #: losses (the sampled trainer's) or only the candidate loss (SCENT's:
    #: the dual objective).
    logs_regularization: ClassVar[bool] = True

    def __init__(self, model, **kwargs):
        super().__init__(**kwargs)
        self.inference_model = model
        self.head_layer = check_label_scorer(output_layer(model),
                                             f"{type(self).__name__}")
        self.body = keras.Model(model.inputs, self.head_layer.input,
                                name=f"{model.name}_body")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.fraction_tracker = keras.metrics.Mean(name="sampled_fraction")

    @property
    def metrics(self):
        return [self.loss_tracker, self.fraction_tracker]

    def call(self, inputs, training=False):
        return self.inference_model(inputs, training=training)

    def candidate_loss(self, queries, labels, example_ids, training):
        """The loss of a batch and the fraction of labels it scored.

        Args:
          queries: float ``[b, e]``, the head layer's input.
          labels: int ``[b, n]`` label ids padded with -1 (or ``[b]``).
          example_ids: int ``[b]`` instance ids, or None (batches without).
          training: whether this is a training step.

        Returns:
          ``(loss, fraction)``: float32 scalar, and float32 scalar or
          ``[b]`` (scored labels per row over ``num_labels``).
        """
        raise NotImplementedError

    def check_batch(self, data, training: bool) -> None:
        """Rejects batches the trainer cannot use (default: none).

        Raises:
          ValueError: in subclasses, a batch without what they need.
        """
        del data, training

    def _loss(self, x, y, ids=None, training=False):
        """``(loss, fraction)`` of a batch: :meth:`candidate_loss` on the
        body's output, plus the model's regularization losses when
        :attr:`logs_regularization`."""
        queries = self.body(x, training=training)
        loss, fraction = self.candidate_loss(queries, y, ids, training)
        if self.logs_regularization and self.losses:
            loss = loss + tf.add_n(self.losses)
        return loss, fraction

    def _batch(self, data, training):
        self.check_batch(data, training)
        ids = data[2] if len(data) > 2 else None
        return data[0], data[1], ids

    def train_step(self, data):
        x, y, ids = self._batch(data, training=True)
        with tf.GradientTape() as tape:
            loss, fraction = self._loss(x, y, ids, training=True)
            total = loss
            if self.losses and not self.logs_regularization:
                total = loss + tf.add_n(self.losses)
        variables = self.trainable_variables
        grads = tape.gradient(total, variables)
        self.optimizer.apply(grads, variables)
        return self._log(loss, fraction)

    def test_step(self, data):
        x, y, ids = self._batch(data, training=False)
        loss, fraction = self._loss(x, y, ids, training=False)
        return self._log(loss, fraction)

    def _log(self, loss, fraction):
        self.loss_tracker.update_state(loss)
        self.fraction_tracker.update_state(fraction)
        return {m.name: m.result() for m in self.metrics}


class CandidateHead(Head):
    """Base of the heads trained through a :class:`CandidateTrainer`.

    Subclasses set :attr:`name`, :attr:`losses` and :attr:`sampled_layers`
    and implement :meth:`make_loss` and ``training_model``; they may add
    callbacks (:meth:`candidate_callbacks`) and ``metrics.json`` entries
    (``results``).  See the module docstring.

    Raises:
      ValueError: ``config.model.sampled_layer`` not in
        :attr:`sampled_layers`, or ``config.loss`` not in :attr:`losses`.
    """

    layer_types = ()  # decoded by the head of its (full-scoring) layer
    full_scores_in_training = False
    # The CandidateTrainer's sampler state (ANN index, LSH tables, SCENT's
    # per-instance duals) lives in each process, not in mirrored variables.
    data_parallel = False
    #: ``config.model.sampled_layer`` values.
    sampled_layers: ClassVar[tuple[str, ...]] = ("uniform_sparse", "dense")

    def check_config(self):
        super().check_config()
        self.check_sampled_layer()

    def check_sampled_layer(self) -> None:
        """Validates ``config.model.sampled_layer``.

        None (left to the data's regime, :func:`xmc_tf.config.by_regime`)
        passes: :func:`xmc_tf.train.check_config` checks the values it
        resolves to.

        Raises:
          ValueError: not one of :attr:`sampled_layers` (nor None).
        """
        layer = self.config.model.sampled_layer
        if layer is not None and layer not in self.sampled_layers:
            raise ValueError(f"config.model.sampled_layer={layer!r}; expected "
                             f"one of {self.sampled_layers}")

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        mc = self.config.model
        if mc.sampled_layer == "uniform_sparse":
            fan_in = min(mc.connections_per_label, input_dim)
            # A zero bias as before the layer's default became "hinge_prior"
            # (these heads' bias is not set from the data).
            return UniformSparseDense(num_labels, fan_in,
                                      seed=self.config.seed,
                                      bias_initializer="zeros",
                                      name=OUTPUT_LAYER)
        return LabelDense(num_labels, bias_initializer="zeros",
                          name=OUTPUT_LAYER)

    def compile(self, model, layer, optimizer):
        # The trainer computes its own loss in train_step.
        model.compile(optimizer=optimizer, jit_compile=False)

    def candidate_callbacks(self, layer, set_callback) -> list:
        """Callbacks of the head's candidate source (default: none).

        Args:
          layer: the built head layer.
          set_callback: the :class:`xmc_tf.callbacks.SetRewiring` of the
            head, or None.
        """
        del layer, set_callback
        return []

    def callbacks(self, layer, val_data):
        """SET rewiring of a uniform-sparse layer (``config.set.enabled``),
        then :meth:`candidate_callbacks`, then the held-out P@k."""
        cbs = []
        set_cb = None
        if (self.config.model.sampled_layer == "uniform_sparse" and
                self.config.set.enabled):
            from xmc_tf.callbacks import SetRewiring
            set_cb = SetRewiring(every_n_steps=self.config.set.every_n_steps,
                                 fraction=self.config.set.fraction,
                                 seed=self.config.seed)
            cbs.append(set_cb)
        cbs += self.candidate_callbacks(layer, set_cb)
        return cbs + super().callbacks(layer, val_data)

    def results(self, layer):
        return {"sampled_layer": self.config.model.sampled_layer}
