"""ScentTrainer: SCENT on in-batch classes."""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.losses.scent import ScentLoss, multiclass_labels
from xmc_tf.models.candidates import CandidateTrainer

__all__ = ["ScentTrainer", "scent_optimizer"]


def scent_optimizer(learning_rate, beta):
    """Algorithm 26's weight update as a Keras optimizer.

    ``V[C] = (1 - beta) V[C] + beta Z[C]``, ``W[C] -= eta V[C]`` on the rows
    ``C`` of an ``IndexedSlices`` gradient: :class:`xmc_tf.optimizers.LazySGD`
    with ``momentum = dampening = 1 - beta`` (exact for a constant learning
    rate; see its docstring).  Dense gradients (the encoder) get the same
    recursion on every row.

    Args:
      learning_rate: eta (float or schedule).
      beta: momentum weight in ``(0, 1]`` (1: plain SGD).

    Returns:
      A :class:`~xmc_tf.optimizers.LazySGD`.

    Raises:
      ValueError: ``beta`` outside ``(0, 1]``.

    >>> opt = scent_optimizer(0.1, beta=0.1)
    >>> round(opt.momentum, 6), round(opt.dampening, 6)
    (0.9, 0.9)
    """
    from xmc_tf.optimizers import LazySGD
    beta = float(beta)
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"beta must be in (0, 1], got {beta}")
    return LazySGD(learning_rate=learning_rate, momentum=1.0 - beta,
                   dampening=1.0 - beta)


@keras.saving.register_keras_serializable(package="xmc_tf")
class ScentTrainer(CandidateTrainer):
    """Trains a multi-class model's head with SCENT on in-batch classes.

    ``call`` is the wrapped model (full scores: prediction and evaluation
    are exact).  ``train_step`` reads ``(features, label_ids, example_ids)``
    batches (``make_tf_dataset(..., with_example_ids=True)``), runs the
    model up to the head layer's input (``queries [b, e]``), scores every
    row against the batch's distinct classes and applies ``loss``
    (:class:`~xmc_tf.losses.ScentLoss`, which updates the duals of the
    batch's instances).  ``test_step`` accepts batches with or without ids
    and changes no dual (loss: the objective at the batch-optimal duals).
    Logged: ``loss`` and ``sampled_fraction`` (classes scored per step over
    ``num_labels``).

    The loss is an attribute, so its variables (``nu``, ``visits``) are
    among the trainer's (non-trainable) variables: ``save_weights`` /
    ``load_weights`` and the job's checkpoint keep them.

    Args:
      model: functional ``keras.Model`` whose head layer (named
        ``"output"``) is a :class:`~xmc_tf.layers.scorer.LabelScorer`
        (:class:`~xmc_tf.layers.LabelDense`,
        :class:`~xmc_tf.layers.UniformSparseDense`).
      loss: a :class:`~xmc_tf.losses.ScentLoss` for the training set.
      **kwargs: ``keras.Model`` arguments (``name``).

    Raises:
      ValueError: the head layer cannot score label subsets, or (in
        ``train_step``) a batch without example ids.
      tf.errors.InvalidArgumentError: at run time, a row with several
        labels, a label or id out of range (see ``ScentLoss``).

    Example:
      >>> import keras, xmc_tf
      >>> from xmc_tf.data import make_synthetic, make_tf_dataset
      >>> from xmc_tf.losses import ScentLoss
      >>> train = make_synthetic(256, 100, 50, labels_per_instance=1, seed=0)
      >>> inputs = keras.Input((100,), sparse=True)
      >>> hidden = keras.layers.Dense(32, activation="relu")(inputs)
      >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(
      ...     50, name="output")(hidden))
      >>> trainer = ScentTrainer(model, ScentLoss(train.num_instances, 1.0,
      ...                                         num_labels=50))
      >>> trainer.compile(optimizer=scent_optimizer(0.1, 0.1),
      ...                 jit_compile=False)
      >>> history = trainer.fit(make_tf_dataset(
      ...     train, 64, shuffle=True, with_example_ids=True), epochs=2,
      ...     verbose=0)
      >>> sorted(history.history)
      ['loss', 'sampled_fraction']
      >>> int(keras.ops.sum(trainer.scent_loss.visits))  # each instance twice
      512
    """

    #: The logged loss is the dual objective (no regularization).
    logs_regularization = False

    def __init__(self, model, loss, **kwargs):
        super().__init__(model, **kwargs)
        if not isinstance(loss, ScentLoss):
            raise ValueError(f"loss must be a ScentLoss, got "
                             f"{type(loss).__name__}")
        self.scent_loss = loss
        self.num_labels = int(self.head_layer.num_labels)
        # Every part is built (a functional model and the loss's variables):
        # save_weights works before any call.
        self.built = True

    def score_classes(self, queries, classes):
        """Logits ``[b, U]`` of every row for the classes ``classes [U]``:
        the head layer's ``score_shared`` (one candidate set for the whole
        batch; gathered rows + one product, ``IndexedSlices`` gradients).

        Args:
          queries: float ``[b, e]``, the head layer's input.
          classes: int ``[U]`` class ids in ``[0, num_labels)``.

        Raises:
          tf.errors.InvalidArgumentError: a class id out of range.
        """
        return self.head_layer.score_shared(queries, tf.cast(classes, tf.int32))

    def check_batch(self, data, training):
        """Training batches must carry example ids.

        Raises:
          ValueError: a training batch without example ids.
        """
        if training and (not isinstance(data, (tuple, list)) or
                         len(data) < 3 or data[2] is None):
            raise ValueError(
                "ScentTrainer needs (features, label_ids, example_ids) "
                "batches: make_tf_dataset(..., with_example_ids=True)")

    def candidate_loss(self, queries, labels, example_ids, training):
        """The batch's distinct classes scored by every row, and the SCENT
        loss (which updates the batch's duals when ``training``; evaluation
        changes no dual and reads no ids)."""
        labels = multiclass_labels(labels)
        classes, _ = tf.unique(tf.boolean_mask(labels, labels >= 0))
        scores = self.score_classes(queries, classes)
        loss = self.scent_loss(scores, labels, classes,
                               example_ids if training else None,
                               training=training)
        fraction = tf.cast(tf.size(classes), tf.float32) / float(self.num_labels)
        return loss, fraction
