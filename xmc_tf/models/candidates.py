"""Base of the training models that score chosen labels only.

A Keras user wraps their own model -- any functional or ``Sequential``
model whose output layer is a :class:`~xmc_tf.layers.scorer.LabelScorer`
(:class:`~xmc_tf.layers.LabelDense`, :class:`~xmc_tf.layers.UniformSparseDense`)
-- in a trainer (:class:`~xmc_tf.models.SampledTrainer`,
:class:`~xmc_tf.models.ScentTrainer`) and calls ``compile`` / ``fit`` /
``evaluate`` / ``save`` / ``export`` on the trainer as on any Keras model:

* each training step runs the model up to the head layer's input
  (``queries [b, e]``) and scores only a few labels per row (the subclass
  chooses them and gives the loss: Keras passes a loss only ``(y_true,
  y_pred)``, which cannot express per-instance candidates);
* ``call`` / ``predict`` / ``evaluate`` use the wrapped model's full scores,
  so held-out metrics given to ``compile(metrics=[...])``
  (:class:`xmc_tf.metrics.PrecisionAtK` ...) are exact; on training
  batches they are computed from the head layer's full scores only where
  that is cheap (``train_metrics``);
* ``fit`` / ``evaluate`` take features as a scipy CSR matrix, a dense array
  or a ``tf.data`` set, and labels as a scipy CSR / dense multi-hot matrix,
  label-id lists or ``-1``-padded id arrays (per batch:
  :func:`xmc_tf.losses.targets.target_label_ids`);
* ``save("m.keras")`` / ``keras.models.load_model`` round trip (the wrapped
  model, the loss and the sampler's configuration); ``export(path)`` writes
  the wrapped model's SavedModel with xmc_tf's named signatures
  (:func:`xmc_tf.saving.export_saved_model`).

Source: ASTRA (Mehta et al.), Algorithm 1 (score only positives and
candidates); ``scent-extreme-multiclass``, Algorithm 26 (score only the
batch's classes).
"""

from __future__ import annotations

from typing import ClassVar

from absl import logging
import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import saving
from xmc_tf.data.labels import padded_label_ids
from xmc_tf.data.pipeline import count_non_finite
from xmc_tf.layers.scorer import SCORER_MEMBERS, LabelScorer
from xmc_tf.losses.targets import target_label_ids
from xmc_tf.models.distributed import DistributedTrainerMixin, step_logs

__all__ = ["CandidateTrainer", "find_label_scorer", "TRAIN_METRICS_MAX_LABELS"]

#: ``train_metrics=None``: compiled metrics are computed on training batches
#: (from the head layer's full scores) up to this many labels.
TRAIN_METRICS_MAX_LABELS = 16384

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


def _num_rows(x):
    if isinstance(x, dict):
        x = next(iter(x.values()))
    if isinstance(x, (tuple, list)) and x and not np.isscalar(x[0]):
        x = x[0]
    shape = getattr(x, "shape", None)
    return int(shape[0]) if shape is not None else len(x)


def _features(x):
    """Float32 features: a scipy matrix as CSR, an array as float32.

    Raises:
      ValueError: NaN or infinite feature values (they would train to a
        NaN loss without a word).
    """
    if sp.issparse(x):
        x = sp.csr_matrix(x, dtype=np.float32)
        x.sort_indices()  # Keras' SparseTensor batches are then in order
    elif isinstance(x, np.ndarray) and x.dtype.kind in "fiub":
        x = x.astype(np.float32, copy=False)
    else:
        return x
    bad = count_non_finite(x)
    if bad:
        raise ValueError(f"the features hold {bad} NaN or infinite values: "
                         "replace them before training")
    return x


@keras.saving.register_keras_serializable(package="xmc_tf")
class CandidateTrainer(DistributedTrainerMixin, keras.Model):
    """Base of the training models that score chosen labels only.

    See the module docstring for the Keras behaviour.  ``train_step``
    reads ``(features, labels[, example_ids])`` batches, runs the body
    (``model`` up to the head layer's input, ``queries [b, e]``) and asks
    :meth:`candidate_loss` for the loss and the fraction of labels scored
    per row; the gradient step adds the model's regularization losses.
    Logged: ``loss``, ``sampled_fraction`` and the compiled metrics.

    Args:
      model: a built functional or ``Sequential`` ``keras.Model`` with one
        :class:`~xmc_tf.layers.scorer.LabelScorer` layer (the head).
      head: None (the model's one LabelScorer layer), or its name or the
        layer itself when the model has several.
      train_metrics: whether compiled metrics are also computed on training
        batches, from the head layer's full scores ``[b, m]`` (validation
        batches always use the model's full scores).  None: when the head
        is the model's last layer and ``m <= TRAIN_METRICS_MAX_LABELS``.
      **kwargs: ``keras.Model`` arguments (``name``).

    Attributes:
      inference_model: ``model``.
      head_layer: its head layer.
      body: ``model`` up to the head layer's input.
      num_labels: m.

    Under ``tf.distribute`` (``MirroredStrategy``,
    ``MultiWorkerMirroredStrategy``: build and compile the trainer under
    ``strategy.scope()``) it trains with sparse or dense features and no
    fix-up call (:class:`~xmc_tf.models.DistributedTrainerMixin`).

    Raises:
      ValueError: no (or no single) LabelScorer layer; the message names
        what is missing.
    """

    #: Whether the logged ``loss`` includes the model's regularization
    #: losses (the sampled trainer's) or only the candidate loss (SCENT's:
    #: the dual objective).
    logs_regularization: ClassVar[bool] = True
    #: Whether training batches need instance ids (SCENT's duals): ``fit``
    #: on arrays adds them.
    needs_example_ids: ClassVar[bool] = False
    #: LazyAdam's learning rate for ``compile()`` without an optimizer (the
    #: CLI's ``astra`` / ``lsh`` configs' on multi-label data).
    LEARNING_RATE: ClassVar[float] = 1e-3

    def __init__(self, model, head=None, train_metrics=None, **kwargs):
        super().__init__(**kwargs)
        if not getattr(model, "inputs", None):
            raise ValueError(
                f"{type(self).__name__} needs a built model with inputs: "
                "start it with keras.Input(...) (functional or Sequential)")
        self.inference_model = model
        self.head_layer = find_label_scorer(model, head, type(self).__name__)
        self.num_labels = int(self.head_layer.num_labels)
        self.body = keras.Model(model.inputs, self.head_layer.input,
                                name=f"{model.name}_body")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.fraction_tracker = keras.metrics.Mean(name="sampled_fraction")
        self._train_metrics_arg = train_metrics
        last = model.layers[-1] is self.head_layer
        if train_metrics is None:
            train_metrics = last and self.num_labels <= TRAIN_METRICS_MAX_LABELS
            if last and not train_metrics:
                logging.info(
                    "%s: no training P@k (compiled metrics on validation "
                    "only): %d labels > %d, where scoring every label of "
                    "each training batch would cost more than the step; "
                    "pass train_metrics=True to have them",
                    type(self).__name__, self.num_labels,
                    TRAIN_METRICS_MAX_LABELS)
        elif train_metrics and not last:
            raise ValueError("train_metrics=True needs the head layer "
                             f"{self.head_layer.name!r} to be the model's last "
                             "layer")
        self.train_metrics = bool(train_metrics)
        self.built = True  # the wrapped model is built

    # -- Keras model API ------------------------------------------------------

    @property
    def metrics(self):
        metrics = [self.loss_tracker, self.fraction_tracker]
        if getattr(self, "_compile_metrics", None) is not None:
            metrics.append(self._compile_metrics)
        return metrics

    def call(self, inputs, training=False):
        return self.inference_model(inputs, training=training)

    def compile(self, optimizer=None, loss=None, metrics=None,
                jit_compile=False, **kwargs):
        """``keras.Model.compile`` with the trainer's own loss.

        Args:
          optimizer: as Keras; None: :class:`xmc_tf.optimizers.LazyAdam` at
            :attr:`LEARNING_RATE` (row-sparse: only the scored labels' rows
            and their moments move).
          loss: must be None: the trainer's loss is its constructor
            argument.
          metrics: label metrics on full scores, e.g.
            ``[xmc_tf.metrics.PrecisionAtK(1)]`` (see ``train_metrics``).
          jit_compile: False by default (XLA cannot compile the custom ops).
          **kwargs: other ``keras.Model.compile`` arguments.

        Raises:
          ValueError: a ``loss`` is given.
        """
        if loss is not None:
            raise ValueError(
                f"{type(self).__name__}.compile takes no loss: pass it as "
                f"{type(self).__name__}(model, ..., loss=...)")
        if isinstance(metrics, dict):
            raise ValueError("metrics must be a list (the trainer has one "
                             "output)")
        if optimizer is None:
            from xmc_tf.optimizers import LazyAdam
            optimizer = LazyAdam(learning_rate=self.LEARNING_RATE)
        super().compile(optimizer=optimizer, metrics=metrics,
                        jit_compile=jit_compile, **kwargs)

    def compile_from_config(self, config):
        """Compiles from ``get_compile_config()`` (``keras.models.load_model``
        of a compiled trainer)."""
        config = keras.saving.deserialize_keras_object(config)
        self.compile(**config)
        if getattr(self, "optimizer", None) is not None and self.built:
            self.optimizer.build(self.trainable_variables)

    def _build_metrics(self):
        """Builds the compiled metrics before a run (they may see no
        training batch: ``train_metrics`` False)."""
        metrics = getattr(self, "_compile_metrics", None)
        if metrics is not None and not metrics.built:
            out = self.inference_model.outputs[0]
            metrics.build(keras.KerasTensor((None, None), "int32"),
                          keras.KerasTensor(out.shape, out.dtype))

    def fit(self, x=None, y=None, batch_size=None, epochs=1, **kwargs):
        """``keras.Model.fit`` on any XMC data form.

        ``x``: scipy sparse or dense ``[n, num_features]`` features, or a
        ``tf.data`` set / generator of ``(features, label_ids[,
        example_ids])`` batches (``y`` then None).  ``y``: a scipy CSR /
        dense multi-hot ``[n, num_labels]`` label matrix, label-id lists or
        ``-1``-padded int ids ``[n, w]`` (turned into padded ids once,
        :func:`xmc_tf.data.padded_label_ids`; no dense ``[n, num_labels]``
        array is made).  ``validation_data`` takes the same forms;
        ``validation_split`` holds out the last rows, as Keras does.

        Raises:
          ValueError: features and labels with different row counts, a
            label id ``>= num_labels``, a label matrix of another width
            (each naming both sizes), NaN or infinite feature values,
            before any step runs.
        """
        kwargs = dict(kwargs)
        split = float(kwargs.pop("validation_split", 0.0) or 0.0)
        if y is not None:  # arrays (Keras takes y only with arrays)
            x, y = self._arrays(x, y)
            if split:
                if kwargs.get("validation_data") is not None:
                    raise ValueError("pass validation_data or "
                                     "validation_split, not both")
                cut = int(round(_num_rows(x) * (1.0 - split)))
                kwargs["validation_data"] = (x[cut:], y[cut:])
                x, y = x[:cut], y[:cut]
            self.prepare(y)
            if self.needs_example_ids:
                y = (y, np.arange(_num_rows(x), dtype=np.int64))
        elif split:
            raise ValueError("validation_split needs array inputs")
        else:
            self.prepare(None, dataset=x)
        val = kwargs.get("validation_data")
        if isinstance(val, (tuple, list)) and len(val) >= 2:
            kwargs["validation_data"] = self._arrays(val[0], val[1])
        self._build_metrics()
        return super().fit(x, y, batch_size=batch_size, epochs=epochs,
                           **kwargs)

    def predict(self, x, *args, **kwargs):
        """``keras.Model.predict`` of the wrapped model's scores (float
        ``[n, num_labels]``); features as :meth:`fit` takes them.  No rows
        give a ``[0, num_labels]`` array (Keras' own loop fails on them).

        Raises:
          ValueError: NaN or infinite feature values.
        """
        x = _features(x)
        if (sp.issparse(x) or isinstance(x, np.ndarray)) and x.shape[0] == 0:
            return np.zeros((0, self.num_labels), np.float32)
        return super().predict(x, *args, **kwargs)

    def evaluate(self, x=None, y=None, *args, **kwargs):
        """``keras.Model.evaluate`` on the forms :meth:`fit` takes."""
        if y is not None:
            x, y = self._arrays(x, y)
        self._build_metrics()
        return super().evaluate(x, y, *args, **kwargs)

    def prepare(self, labels, dataset=None) -> None:
        """Called by :meth:`fit` before training with the training labels
        (int32 padded ids ``[n, w]``, or None and the ``tf.data`` set):
        subclasses resolve their data-dependent defaults here."""
        del labels, dataset

    def _arrays(self, x, y):
        """Checked float32 features and int32 padded ids."""
        x = _features(x)
        n = _num_rows(x)
        ids = padded_label_ids(y, self.num_labels)
        if ids.shape[0] != n:
            raise ValueError(f"features have {n} rows but labels have "
                             f"{ids.shape[0]}")
        return x, ids

    def get_config(self):
        return {"name": self.name,
                "model": keras.saving.serialize_keras_object(
                    self.inference_model),
                "head": self.head_layer.name,
                "train_metrics": self._train_metrics_arg}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        config["model"] = keras.saving.deserialize_keras_object(
            config["model"], custom_objects=custom_objects)
        return cls(**config)

    def export(self, filepath, format="tf_saved_model", verbose=None, k=5,
               portable=None, **kwargs):
        """Writes the wrapped model as a SavedModel with xmc_tf's named
        signatures (``serve``: top ``k``; ``score_all_labels``), as
        :func:`xmc_tf.saving.export_saved_model` does.

        Args:
          filepath: output directory.
          format: ``"tf_saved_model"``; other Keras formats export the
            wrapped model with ``keras.Model.export``.
          verbose: unused (Keras' argument).
          k: labels per instance of ``serve``.
          portable: see :func:`xmc_tf.saving.export_saved_model`.

        Returns:
          True when the SavedModel needs no xmc_tf op.

        Raises:
          ValueError: as :func:`xmc_tf.saving.export_saved_model`.
        """
        del verbose
        if format != "tf_saved_model":
            return self.inference_model.export(filepath, format=format,
                                               **kwargs)
        if kwargs:
            raise ValueError(f"unexpected arguments {sorted(kwargs)}")
        return saving.export_saved_model(self.inference_model, filepath, k=k,
                                         portable=portable)

    # -- the training step ----------------------------------------------------

    def candidate_loss(self, queries, labels, example_ids, training):
        """The loss of a batch and the fraction of labels it scored.

        Args:
          queries: float ``[b, e]``, the head layer's input.
          labels: int32 ``[b, n]`` label ids padded with -1.
          example_ids: int ``[b]`` instance ids, or None (batches without).
          training: whether this is a training step.

        Returns:
          ``(loss, fraction)``: float32 scalar, and float32 scalar or
          ``[b]`` (scored labels per row over ``num_labels``).
        """
        raise NotImplementedError

    def check_batch(self, labels, example_ids, training: bool) -> None:
        """Rejects batches the trainer cannot use (default: none).

        Raises:
          ValueError: in subclasses, a batch without what they need.
        """
        del labels, example_ids, training

    def _batch(self, data, training):
        """``(x, int32 label ids [b, n], example ids or None)`` of a batch:
        ``(x, y)``, ``(x, (y, ids))`` (what :meth:`fit` makes of arrays) or
        ``(x, y, ids)`` (``make_tf_dataset(..., with_example_ids=True)``)."""
        x, y, ids = keras.utils.unpack_x_y_sample_weight(data)
        if isinstance(y, (tuple, list)):
            y, ids = y
        self.check_batch(y, ids, training)
        return x, tf.cast(target_label_ids(y, self.num_labels), tf.int32), ids

    def _loss(self, x, y, ids=None, training=False):
        """``(loss, fraction, queries)`` of a batch: :meth:`candidate_loss`
        on the body's output, plus the model's regularization losses when
        :attr:`logs_regularization`."""
        queries = self.body(x, training=training)
        loss, fraction = self.candidate_loss(queries, y, ids, training)
        if self.logs_regularization and self.losses:
            loss = loss + tf.add_n(self.losses)
        return loss, fraction, queries

    def train_step(self, data):
        x, y, ids = self._batch(data, training=True)
        with tf.GradientTape() as tape:
            loss, fraction, queries = self._loss(x, y, ids, training=True)
            total = loss
            if self.losses and not self.logs_regularization:
                total = loss + tf.add_n(self.losses)
            # The replicas' gradients are summed: each takes 1/replicas of
            # its batch mean (as Keras' compiled losses do).
            replicas = tf.distribute.get_strategy().num_replicas_in_sync
            if replicas > 1:
                total = total / float(replicas)
            # LossScaleOptimizer (mixed_float16) scales; apply() unscales.
            scaled = self.optimizer.scale_loss(total)
        variables = self.trainable_variables
        grads = tape.gradient(scaled, variables)
        self.optimizer.apply(grads, variables)
        if self.train_metrics and self._compile_metrics is not None:
            scores = self.head_layer(tf.stop_gradient(queries))
            self._compile_metrics.update_state(y, scores)
        return self._log(loss, fraction, metrics=self.train_metrics)

    def test_step(self, data):
        x, y, ids = self._batch(data, training=False)
        loss, fraction, _ = self._loss(x, y, ids, training=False)
        if self._compile_metrics is not None:
            self._compile_metrics.update_state(
                y, self.inference_model(x, training=False))
        return self._log(loss, fraction)

    def _log(self, loss, fraction, metrics=True):
        self.loss_tracker.update_state(loss)
        self.fraction_tracker.update_state(fraction)
        if metrics:
            return step_logs(self, self.get_metrics_result())
        return step_logs(self, {m.name: m.result() for m in (
            self.loss_tracker, self.fraction_tracker)})

    # -- state of the candidate source (checkpoints) ---------------------------

    def get_state(self) -> dict:
        """Mutable state outside the Keras variables (e.g. a sampler's
        index) as NumPy arrays, for an exact resume (default: none)."""
        return {}

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`'s result."""
        del state
