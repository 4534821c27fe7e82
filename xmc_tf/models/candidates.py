"""Base of the training models that score chosen labels only."""

from __future__ import annotations

from typing import ClassVar

import keras
import tensorflow as tf

from xmc_tf.layers.scorer import SCORER_MEMBERS, LabelScorer

__all__ = ["CandidateTrainer", "find_label_scorer"]


def find_label_scorer(model, head=None, needed_by: str = "candidate training"):
    """The layer of ``model`` that scores labels: its one
    :class:`~xmc_tf.layers.scorer.LabelScorer` layer.

    Args:
      model: a functional ``keras.Model`` (or ``Sequential``).
      head: None (find the one LabelScorer layer), a layer name, or a layer
        of ``model``.
      needed_by: what needs the layer (for messages).

    Returns:
      The layer.

    Raises:
      ValueError: no LabelScorer layer (the message lists the layers and
        what a head layer needs), several (pass ``head``), or ``head``
        names a layer that is missing or is not a LabelScorer.
    """
    if head is not None:
        layer = model.get_layer(head) if isinstance(head, str) else head
        if not isinstance(layer, LabelScorer):
            missing = [m for m in SCORER_MEMBERS if not hasattr(layer, m)]
            raise ValueError(
                f"head layer {layer.name!r} ({type(layer).__name__}) cannot "
                f"score labels: {needed_by} needs a LabelScorer (LabelDense, "
                f"UniformSparseDense); it lacks {', '.join(missing)}")
        return layer
    found = [layer for layer in model.layers if isinstance(layer, LabelScorer)]
    if len(found) == 1:
        return found[0]
    if not found:
        names = ", ".join(f"{layer.name} ({type(layer).__name__})"
                          for layer in model.layers) or "none"
        raise ValueError(
            f"model {model.name!r} has no layer that scores labels: "
            f"{needed_by} needs its output layer to be a LabelScorer "
            "(xmc_tf.layers.LabelDense or UniformSparseDense, not "
            f"keras.layers.Dense); its layers: {names}")
    raise ValueError(
        f"model {model.name!r} has {len(found)} LabelScorer layers "
        f"({', '.join(layer.name for layer in found)}): pass head=NAME")


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

    def __init__(self, model, head=None, **kwargs):
        super().__init__(**kwargs)
        self.inference_model = model
        self.head_layer = find_label_scorer(model, head,
                                            type(self).__name__)
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
