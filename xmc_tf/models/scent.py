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

    ``call``, ``predict`` and ``evaluate``'s metrics use the wrapped model's
    full scores (exact).  ``train_step`` runs the model up to the head
    layer's input (``queries [b, e]``), scores every row against the
    batch's distinct classes only and applies the
    :class:`~xmc_tf.losses.ScentLoss`, which updates the duals of the
    batch's instances: it needs each training row's instance id, which
    ``fit`` adds itself when it gets arrays (a ``tf.data`` set yields
    ``(features, label_ids, example_ids)``:
    ``make_tf_dataset(..., with_example_ids=True)``).  ``test_step``
    changes no dual (loss: the objective at the batch-optimal duals).
    Logged: ``loss``, ``sampled_fraction`` (classes scored per step over
    ``num_labels``) and the compiled metrics.  The logged ``loss`` is the
    batch's dual objective ``mean_i [S_i exp(-nu_i) + nu_i - 1]``
    (:class:`~xmc_tf.losses.ScentLoss`), which at the optimal duals is the
    cross-entropy of the in-batch estimate minus ``log`` of the number of
    classes it averages over: it turns negative once the cross-entropy is
    below that ``log``, as it should (a falling loss is progress).

    The loss is an attribute, so its variables (``nu``, ``visits``) are
    among the trainer's (non-trainable) variables: ``save`` /
    ``save_weights`` and the job's checkpoint keep them.

    Args:
      model: a built ``keras.Model`` whose head is a
        :class:`~xmc_tf.layers.scorer.LabelScorer`
        (:class:`~xmc_tf.layers.LabelDense`,
        :class:`~xmc_tf.layers.UniformSparseDense`).
      loss: a :class:`~xmc_tf.losses.ScentLoss` for the training set, or
        None: :meth:`ScentLoss.from_labels` of the labels ``fit`` gets (the
        measured settings; ``fit`` must then get arrays).
      head, train_metrics: see :class:`~xmc_tf.models.CandidateTrainer`.
      **kwargs: see :class:`~xmc_tf.models.CandidateTrainer`.

    ``compile()`` without an optimizer uses
    :class:`xmc_tf.optimizers.LazyAdam` at :data:`LEARNING_RATE` (the
    ``scent`` config's; Algorithm 26's own update is
    :func:`scent_optimizer`).

    Raises:
      ValueError: the head cannot score label subsets; ``loss`` not a
        ScentLoss; a training row with several labels (at ``fit`` on
        arrays); a training batch without example ids; ``loss=None`` and
        ``fit`` on a ``tf.data`` set.
      tf.errors.InvalidArgumentError: at run time, a row with several
        labels, a label or id out of range (see ``ScentLoss``).

    Example:
      >>> import keras, numpy as np, xmc_tf
      >>> rng = np.random.default_rng(0)
      >>> y = rng.integers(0, 20, 512)                  # one class per row
      >>> x = (np.eye(20)[y] + rng.normal(0, .3, (512, 20))).astype("f4")
      >>> model = keras.Sequential([keras.Input((20,)),
      ...     keras.layers.Dense(32, activation="relu"),
      ...     xmc_tf.layers.LabelDense(20)])
      >>> trainer = ScentTrainer(model)
      >>> trainer.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1)])
      >>> history = trainer.fit(x, y, batch_size=64, epochs=3, verbose=0)
      >>> int(keras.ops.sum(trainer.scent_loss.visits))  # each row 3 times
      1536
    """

    #: The logged loss is the dual objective (no regularization).
    logs_regularization = False
    needs_example_ids = True
    #: LazyAdam's learning rate for ``compile()`` without an optimizer.
    LEARNING_RATE = 1e-2

    def __init__(self, model, loss=None, head=None, train_metrics=None,
                 **kwargs):
        super().__init__(model, head=head, train_metrics=train_metrics,
                         **kwargs)
        if loss is not None and not isinstance(loss, ScentLoss):
            raise ValueError(f"loss must be a ScentLoss or None, got "
                             f"{type(loss).__name__}")
        self.scent_loss = loss
        if loss is not None:
            self._check_loss(loss)
            # Every part is built (a functional model and the loss's
            # variables): save_weights works before any call.
            self.built = True

    def _check_loss(self, loss):
        if loss.num_labels is not None and loss.num_labels != self.num_labels:
            raise ValueError(f"the ScentLoss was made for {loss.num_labels} "
                             f"labels but the head {self.head_layer.name!r} "
                             f"has {self.num_labels}")

    def prepare(self, labels, dataset=None):
        """Builds ``ScentLoss.from_labels(labels)`` when ``loss`` was None,
        and checks the size of the duals.

        Raises:
          ValueError: ``loss=None`` and no label arrays; a row with
            several labels; more rows than a given loss has duals.
        """
        if labels is None:
            if self.scent_loss is None:
                raise ValueError(
                    "ScentTrainer(loss=None) reads the training labels: pass "
                    "arrays to fit, or ScentTrainer(model, loss=xmc_tf.losses"
                    ".ScentLoss.from_labels(train_labels))")
            return
        if self.scent_loss is None:
            with self.distribute_strategy.scope():
                self.scent_loss = ScentLoss.from_labels(
                    labels, num_labels=self.num_labels)
            self.built = True
        elif labels.shape[0] > self.scent_loss.num_examples:
            raise ValueError(
                f"fit got {labels.shape[0]} training rows but the ScentLoss "
                f"has duals for {self.scent_loss.num_examples}")

    def get_config(self):
        config = super().get_config()
        config["loss"] = (keras.saving.serialize_keras_object(self.scent_loss)
                          if self.scent_loss is not None else None)
        return config

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        if config.get("loss") is not None:
            config["loss"] = keras.saving.deserialize_keras_object(
                config["loss"], custom_objects=custom_objects)
        return super().from_config(config, custom_objects)

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

    def check_batch(self, labels, example_ids, training):
        """Training batches must carry example ids.

        Raises:
          ValueError: a training batch without example ids.
        """
        if training and example_ids is None:
            raise ValueError(
                "ScentTrainer needs each training row's instance id: call "
                "fit with arrays (it adds them), or give a tf.data set of "
                "(features, label_ids, example_ids) batches: "
                "make_tf_dataset(..., with_example_ids=True)")

    def candidate_loss(self, queries, labels, example_ids, training):
        """The batch's distinct classes scored by every row, and the SCENT
        loss (which updates the batch's duals when ``training``; evaluation
        changes no dual and reads no ids)."""
        if self.scent_loss is None:
            raise ValueError("ScentTrainer(loss=None) has no loss before fit "
                             "has seen the training labels")
        labels = multiclass_labels(labels)
        classes, _ = tf.unique(tf.boolean_mask(labels, labels >= 0))
        scores = tf.cast(self.score_classes(queries, classes), tf.float32)
        loss = self.scent_loss(scores, labels, classes,
                               example_ids if training else None,
                               training=training)
        fraction = tf.cast(tf.size(classes), tf.float32) / float(self.num_labels)
        return loss, fraction
