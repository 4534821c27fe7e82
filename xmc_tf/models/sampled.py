"""SampledTrainer: a model's head trained on positives + sampled negatives.

During training the head layer scores, per instance, only its positive
labels and the candidate negatives a :class:`~xmc_tf.samplers.NegativeSampler`
draws (uniform, in-batch, ANN hard negatives, ASTRA's hard + uniform
mixture, LSH), through the layer's ``score_candidates`` (the op
``Xmc>UniformSparseSampledMatmul`` for a uniform-sparse layer, gather +
einsum for a :class:`~xmc_tf.layers.LabelDense`) or, with shared
candidates, ``score_shared`` (one candidate set per batch, one matrix
product).  The gradient of the label weights is an ``IndexedSlices`` over
the scored rows: with a row-sparse optimizer
(:class:`xmc_tf.optimizers.LazyAdam`) a step costs ``O(b (n + k) e)``
instead of ``O(b m e)``.  The sampled losses (:mod:`xmc_tf.losses.sampled`)
weight the candidates so that the loss estimates the full one-vs-all loss
(importance weights, ASTRA Eq. 2) or the full softmax (log-Q correction).

Defaults read from the training labels (``loss=None``, ``shared="auto"``),
as measured for the CLI's ``astra`` / ``lsh`` configs (docs/notes/sampled.md):
multi-class labels (every instance at most one label) train with
:class:`~xmc_tf.losses.SampledSoftmax` on one candidate set shared by the
batch (when the sampler has a shared mode), multi-label labels with
:class:`~xmc_tf.losses.SampledSquaredHinge` on per-row candidates.

Source: ASTRA (Mehta et al.), Algorithm 1 and Eq. 2; the LSH paper
(``lsh-constant-time-negative-sampling``), Algorithm 1.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from xmc_tf.losses.sampled import SampledLoss, SampledSoftmax, SampledSquaredHinge
from xmc_tf.losses.targets import target_label_ids
from xmc_tf.models.candidates import CandidateTrainer

__all__ = ["SampledTrainer", "sampled_defaults", "serialize_sampler",
           "deserialize_sampler"]

#: Batches of a ``tf.data`` set read to tell multi-class from multi-label
#: labels when ``fit`` gets no arrays.
PEEK_BATCHES = 8


def sampled_defaults(labels, supports_shared: bool) -> dict:
    """The loss and candidate mode that suit a label matrix.

    Args:
      labels: int32 ``[n, w]`` label ids padded with -1.
      supports_shared: whether the sampler has a shared mode.

    Returns:
      ``{"multi_class": bool, "loss": SampledLoss, "shared": bool}``:
      the sampled softmax on shared candidates for multi-class labels (as
      ``tf.nn.sampled_softmax_loss``; the squared hinge with ASTRA's
      weights ``m / k`` of ~200 reached P@1 0.03 on a 50k-class set), the
      squared hinge on per-row candidates for multi-label labels
      (Delicious val P@1 70.0 per row vs 67.6 shared: docs/notes/sampled.md).

    >>> sampled_defaults(np.array([[3], [1]]), True)["shared"]
    True
    """
    labels = np.asarray(labels)
    multi_class = bool(labels.ndim < 2 or labels.shape[1] < 2 or
                       not (labels[:, 1:] >= 0).any())
    loss = SampledSoftmax() if multi_class else SampledSquaredHinge()
    return {"multi_class": multi_class, "loss": loss,
            "shared": multi_class and bool(supports_shared)}


def serialize_sampler(sampler) -> dict:
    """``{"class_name", "config"}`` of a sampler (its ``get_config``)."""
    return {"class_name": type(sampler).__name__, "config": sampler.get_config()}


def deserialize_sampler(config: dict):
    """The sampler :func:`serialize_sampler` described (a new one: an index
    or hash tables are rebuilt by its refresh, not stored here).

    Raises:
      ValueError: an unknown sampler class.
    """
    from xmc_tf import samplers
    cls = getattr(samplers, config["class_name"], None)
    if not isinstance(cls, type):
        raise ValueError(f"unknown sampler {config['class_name']!r}")
    args = {key: deserialize_sampler(value)
            if isinstance(value, dict) and "class_name" in value else value
            for key, value in config["config"].items()}
    return cls.from_config(args) if hasattr(cls, "from_config") else cls(**args)


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledTrainer(CandidateTrainer):
    """Trains a model's head on positives + sampled negatives only.

    ``call``, ``predict`` and ``evaluate``'s metrics use the wrapped model's
    full scores (exact); ``train_step`` runs the model up to the head
    layer's input (``queries [b, e]``), draws candidates with
    ``sampler.sample(queries, label_ids, optimizer.iterations)`` (or
    ``sample_shared``), scores the row's positives and candidates in one
    op call and applies the sampled loss.  Logged: ``loss``,
    ``sampled_fraction`` (mean number of scored labels per row over
    ``num_labels``) and the compiled metrics (see
    :class:`~xmc_tf.models.CandidateTrainer`).

    Args:
      model: a built ``keras.Model`` whose head is a
        :class:`~xmc_tf.layers.scorer.LabelScorer`
        (:class:`~xmc_tf.layers.UniformSparseDense`,
        :class:`~xmc_tf.layers.LabelDense`).
      sampler: a :class:`~xmc_tf.samplers.NegativeSampler` made for the
        head's ``num_labels`` (bound to the head here; keep its index
        current with :class:`xmc_tf.callbacks.RefreshIndex` (ANN) or
        :class:`xmc_tf.callbacks.Rehash` (LSH)).
      loss: a :class:`~xmc_tf.losses.sampled.SampledLoss`, or None: chosen
        from the training labels at ``fit`` (:func:`sampled_defaults`).
      shared: True: one candidate set per batch (``sampler.sample_shared``)
        scored by every row with ``score_shared``; False: per-row
        candidates; ``"auto"``: shared for multi-class training labels when
        the sampler has a shared mode.
      head, train_metrics: see :class:`~xmc_tf.models.CandidateTrainer`.
      **kwargs: see :class:`~xmc_tf.models.CandidateTrainer`.

    Labels: see :meth:`~xmc_tf.models.CandidateTrainer.fit`.
    ``compile()`` without an optimizer uses
    :class:`xmc_tf.optimizers.LazyAdam` at :data:`LEARNING_RATE`.

    Raises:
      ValueError: the model has no (single) LabelScorer head; the sampler
        was made for another number of labels (both named); ``shared=True``
        with a sampler that has no shared mode; ``loss`` not a SampledLoss.

    Example:
      >>> import keras, numpy as np, xmc_tf
      >>> from xmc_tf.samplers import UniformNegativeSampler
      >>> x = np.random.default_rng(0).random((256, 20), np.float32)
      >>> y = [[i % 50, (i + 1) % 50] for i in range(256)]  # label ids
      >>> model = keras.Sequential([keras.Input((20,)),
      ...     keras.layers.Dense(32, activation="relu"),
      ...     xmc_tf.layers.LabelDense(50)])
      >>> trainer = SampledTrainer(model, UniformNegativeSampler(50, 8))
      >>> trainer.compile(xmc_tf.optimizers.LazyAdam(),
      ...                 metrics=[xmc_tf.metrics.PrecisionAtK(1)])
      >>> history = trainer.fit(x, y, epochs=2, verbose=0)
      >>> sorted(history.history)
      ['loss', 'precision_at_1', 'sampled_fraction']
      >>> trainer.predict(x[:4], verbose=0).shape  # every label
      (4, 50)
    """

    #: LazyAdam's learning rate for ``compile()`` without an optimizer (the
    #: CLI's ``sampled`` configs').
    LEARNING_RATE = 2e-3

    def __init__(self, model, sampler, loss=None, shared="auto", head=None,
                 train_metrics=None, **kwargs):
        super().__init__(model, head=head, train_metrics=train_metrics,
                         **kwargs)
        if int(sampler.num_labels) != self.num_labels:
            raise ValueError(
                f"{type(sampler).__name__} was made for {sampler.num_labels} "
                f"labels but the head {self.head_layer.name!r} has "
                f"{self.num_labels}")
        if shared not in (True, False, "auto"):
            raise ValueError(f"shared must be True, False or 'auto', got "
                             f"{shared!r}")
        if shared is True and not sampler.supports_shared:
            raise ValueError(f"{type(sampler).__name__} has no shared-"
                             "candidates mode (shared=True)")
        if loss is not None and not isinstance(loss, SampledLoss):
            raise ValueError(
                f"loss must be a sampled loss (xmc_tf.losses.SampledSquaredHinge"
                f", SampledSoftmax, ...) or None, got {type(loss).__name__}")
        self.sampler = sampler
        self.sampler.bind(self.head_layer)
        self.sampled_loss = loss
        self._shared_arg = shared
        self.shared = shared is True

    def prepare(self, labels, dataset=None):
        """Resolves ``loss=None`` / ``shared="auto"`` from the training
        labels (arrays, or the first ``PEEK_BATCHES`` batches of a
        ``tf.data`` set) and logs the choice."""
        if self.sampled_loss is not None and self._shared_arg != "auto":
            return
        if labels is None:
            if not isinstance(dataset, tf.data.Dataset):
                labels = np.zeros((1, 2), np.int32)  # multi-label defaults
            else:
                batches = list(_label_batches(dataset, self.num_labels))
                width = max((b.shape[1] for b in batches), default=1)
                labels = np.concatenate(
                    [np.pad(b, [(0, 0), (0, width - b.shape[1])],
                            constant_values=-1) for b in batches]
                ) if batches else np.zeros((1, 2), np.int32)
        chosen = sampled_defaults(labels, self.sampler.supports_shared)
        if self.sampled_loss is None:
            self.sampled_loss = chosen["loss"]
        if self._shared_arg == "auto":
            self.shared = chosen["shared"]
        logging.info("SampledTrainer: %s labels -> %s, %s candidates",
                     "multi-class" if chosen["multi_class"] else "multi-label",
                     type(self.sampled_loss).__name__,
                     "shared" if self.shared else "per-row")

    def candidate_loss(self, queries, labels, example_ids, training):
        """Positives + the sampler's candidates, scored and weighted by the
        sampled loss (see the class docstring)."""
        del example_ids, training
        if self.sampled_loss is None:  # evaluate before any fit
            self.prepare(None)
        y = labels
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
        loss = self.sampled_loss(tf.cast(pos_scores, tf.float32), pos_mask,
                                 tf.cast(neg_scores, tf.float32), candidates)
        scored_per_row = (tf.reduce_sum(tf.cast(pos_mask, tf.float32), 1) +
                          tf.reduce_sum(tf.cast(candidates.mask, tf.float32), 1))
        return loss, scored_per_row / float(self.sampler.num_labels)

    def get_config(self):
        return {**super().get_config(),
                "sampler": serialize_sampler(self.sampler),
                "loss": (keras.saving.serialize_keras_object(self.sampled_loss)
                         if self.sampled_loss is not None else None),
                "shared": self.shared if self.sampled_loss is not None
                else self._shared_arg}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["sampler"] = deserialize_sampler(config["sampler"])
        if config.get("loss") is not None:
            config["loss"] = keras.saving.deserialize_keras_object(
                config["loss"], custom_objects=custom_objects)
        return super().from_config(config, custom_objects)

    def get_state(self) -> dict:
        """The sampler's state (index, tables) for an exact resume."""
        return self.sampler.get_state()

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`'s result into the sampler."""
        self.sampler.set_state(state)


def _label_batches(dataset, num_labels):
    """Padded int32 ids of the first ``PEEK_BATCHES`` batches."""
    for batch in dataset.take(PEEK_BATCHES):
        _, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
        if isinstance(y, (tuple, list)):
            y = y[0]
        yield target_label_ids(y, num_labels).numpy().astype(np.int32)
