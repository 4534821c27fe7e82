"""The SCENT head: full-softmax training of a multi-class head on in-batch classes.

Training follows Algorithm 26 of ``scent-extreme-multiclass`` (Sec. 6.3): a
batch scores only its own classes ``C_t`` (the distinct labels of its
instances), :class:`xmc_tf.losses.ScentLoss` updates each instance's dual
variable ``nu_i`` in closed form and gives the loss whose gradient lives on
the rows ``W[C_t]``, and the row-sparse momentum step of
:class:`xmc_tf.optimizers.LazySGD` (``config.train.optimizer =
"scent_momentum"``: ``momentum = dampening = 1 - beta``) moves only those
rows and their momentum, as the algorithm's ``V[C_t]``/``W[C_t]`` update.
The per-instance duals need each batch's instance ids: the training data
set is built with ``make_tf_dataset(..., with_example_ids=True)``
(:meth:`ScentHead.dataset_kwargs`) and sized from the training set
(:meth:`ScentHead.prepare`).

Cost per step: ``b x |C_t| <= b^2`` scores instead of ``b x m``: the head
layer's ``score_shared`` gathers the ``|C_t|`` rows once and scores them for
the whole batch (:class:`~xmc_tf.layers.LabelDense`: ``[b, d] x [d, |C_t|]``;
:class:`~xmc_tf.layers.UniformSparseDense`: op ``Xmc>UniformSparseMatmul``
on the gathered rows, ``b |C_t| s``).  Both give ``IndexedSlices``
gradients over ``C_t``.

Evaluation is exact: the trained model is the ordinary full-scoring model,
decoded by the head of its layer (:func:`xmc_tf.heads.head_for_model`);
held-out P@k comes from :class:`xmc_tf.callbacks.TopKEvaluation` once per
epoch.

Config (``config.model.head = "scent"``, ``config.loss = "scent"``; see
``configs/scent.py``):

* ``config.model.sampled_layer``: ``"dense"`` (LabelDense) or
  ``"uniform_sparse"`` (fan-in ``config.model.connections_per_label``; SET
  when ``config.set.enabled``).
* ``config.scent``: ``variant`` (``"scent"``/``"sox"``), ``alpha`` (dual
  step; SOX's gamma), ``negatives`` (``"multiset"``/``"unique"``),
  ``correction`` (``"none"``/``"log_q"``), ``beta`` (momentum weight of
  Algorithm 26 for ``"scent_momentum"``).
* ``config.train.optimizer``: ``"scent_momentum"`` (the paper's update),
  or any optimizer the job builds (``"lazy_adam"``...).

What the training job must do (``xmc_tf/train.py``), for any head::

    head.prepare(fit_data)                   # before build_and_compile
    optimizer = head.make_optimizer() or build_optimizer(config)
    train_ds = make_tf_dataset(fit_data, ..., **head.dataset_kwargs())

Multi-class only: :meth:`ScentHead.prepare` rejects training data with a
row of more than one label (``ValueError``).

Source: ``scent-extreme-multiclass``, Sec. 6.3, Algorithm 26.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf import config as xconfig
from xmc_tf.heads.base import register
from xmc_tf.heads.candidates import CandidateHead, CandidateTrainer
from xmc_tf.losses.scent import (CORRECTIONS, NEGATIVES, VARIANTS, ScentLoss,
                                 multiclass_labels)

__all__ = ["ScentHead", "ScentTrainer", "scent_optimizer", "SCENT_LAYERS"]

SCENT_LAYERS = ("dense", "uniform_sparse")
#: ``config.train.optimizer`` value of Algorithm 26's momentum step.
SCENT_MOMENTUM = "scent_momentum"


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


@register
class ScentHead(CandidateHead):
    """``config.model.head = "scent"``: see the module docstring."""

    name = "scent"
    config_defaults = xconfig.HEAD_DEFAULTS["scent"]
    losses = ("scent",)
    sampled_layers = SCENT_LAYERS

    def __init__(self, config):
        super().__init__(config)
        self._num_examples = None
        self._label_counts = None

    def check_config(self):
        super().check_config()
        sc = self.config.scent
        for field, allowed in (("variant", VARIANTS), ("negatives", NEGATIVES),
                               ("correction", CORRECTIONS)):
            if sc[field] not in allowed:
                raise ValueError(f"config.scent.{field}={sc[field]!r}; "
                                 f"expected one of {allowed}")
        if not float(sc.alpha) > 0 or not np.isfinite(float(sc.alpha)):
            raise ValueError(f"config.scent.alpha={sc.alpha!r} must be a "
                             "finite number > 0")
        if sc.correction == "log_q" and sc.negatives != "multiset":
            raise ValueError("config.scent.correction='log_q' needs "
                             "config.scent.negatives='multiset'")
        if self.config.train.optimizer == SCENT_MOMENTUM and not (
                0.0 < float(sc.beta) <= 1.0):
            raise ValueError(f"config.scent.beta={sc.beta!r} must be in "
                             "(0, 1]")

    def prepare(self, train_data):
        """Sizes the duals from ``train_data`` (and, for ``"log_q"``, counts
        its labels).

        Raises:
          ValueError: a training row has more than one label.
        """
        labels = train_data.labels
        per_row = np.diff(labels.indptr) if hasattr(labels, "indptr") else \
            np.count_nonzero(np.asarray(labels), axis=1)
        multi = int(np.count_nonzero(per_row > 1))
        if multi:
            raise ValueError(
                f"head 'scent' is multi-class but {multi} of "
                f"{train_data.num_instances} training rows have more than one "
                "label; use a multi-label head (dense, uniform_sparse, sampled)")
        self._num_examples = int(train_data.num_instances)
        if self.config.scent.correction == "log_q":
            self._label_counts = train_data.label_counts().astype(np.float64)

    def dataset_kwargs(self):
        return {"with_example_ids": True}

    def make_optimizer(self):
        tc = self.config.train
        if tc.optimizer == SCENT_MOMENTUM:
            return scent_optimizer(tc.learning_rate, self.config.scent.beta)
        return None

    def make_loss(self, layer):
        """The :class:`ScentLoss` of the training set.

        Raises:
          ValueError: :meth:`prepare` was not called.
        """
        if self._num_examples is None:
            raise ValueError("head 'scent' needs the training set size: call "
                             "head.prepare(train_data) before building the "
                             "training model")
        sc = self.config.scent
        return ScentLoss(self._num_examples, alpha=float(sc.alpha),
                         variant=sc.variant, negatives=sc.negatives,
                         correction=sc.correction, num_labels=layer.num_labels,
                         label_counts=self._label_counts,
                         own_term=bool(sc.own_term))

    def training_model(self, model, layer):
        return ScentTrainer(model, self.make_loss(layer),
                            name=f"{model.name}_trainer")

    def results(self, layer):
        sc = self.config.scent
        return {**super().results(layer),
                "scent_variant": sc.variant, "scent_alpha": float(sc.alpha),
                "scent_negatives": sc.negatives,
                "scent_correction": sc.correction}
