"""Keras models that train under ``tf.distribute`` with sparse features.

Keras 3.15's TensorFlow trainer has two bugs under ``tf.distribute``
strategies that no public Keras setting avoids:

1. ``TensorFlowTrainer._maybe_symbolic_build``
   (``keras/src/backend/tensorflow/trainer.py``), run by every ``fit`` and
   ``evaluate`` when the model was created under a strategy's scope, takes
   the first batch of the distributed dataset and reduces it with
   ``strategy.reduce("MEAN", batch, axis=None)`` before it checks whether
   anything is left to build.  That reduction fails on a ``SparseTensor``
   (``AttributeError: 'SparseTensor' object has no attribute 'device'``),
   fails under ``MultiWorkerMirroredStrategy`` on nested batches and on
   label-id matrices of different widths on different workers, and turns
   integer label ids into float means.  Only shapes and dtypes of the batch
   are used (to build the model, its compiled loss and metrics).
2. ``reduce_per_replica`` (same file), which reduces the step logs, calls
   ``strategy.reduce("MEAN", v, axis=0)`` in multi-worker mode, which
   fails on the scalar logs (loss, metrics) that ``train_step`` returns.

:class:`DistributedTrainerMixin` avoids both in the model's own class:
it builds from this worker's first replica's batch (the local value of
each ``DistributedValues``: exact shapes and dtypes, integer ids kept), and
under ``MultiWorkerMirroredStrategy`` its ``train_step`` / ``test_step``
return every log as a ``[1]`` vector, whose cross-worker mean is the value
Keras logs (at the end of an epoch Keras reads the metrics' own results,
summed over every replica).  :class:`DistributedModel` is a
``keras.Model`` with the mixin, for a functional model of your own.

A plain ``keras.Model`` (or ``Sequential``) still meets bug 1, in Keras'
own code before any xmc_tf layer, loss or metric runs.  So that its error
names the fix, importing this module wraps
``TensorFlowTrainer._maybe_symbolic_build`` once: that ``AttributeError``
of a model without the mixin becomes a ``TypeError`` naming
:class:`DistributedModel` (Keras' message kept in it); nothing else
changes, and a Keras release without that method is left alone.
"""

from __future__ import annotations

import functools

import keras
import tensorflow as tf

__all__ = ["DistributedTrainerMixin", "DistributedModel"]


def _local(value, strategy):
    """This worker's first replica's part of ``value`` (a
    ``DistributedValues``), or ``value`` itself."""
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _vector_logs(logs):
    """``{name: [1] tensor}`` from the step's ``{name: scalar}`` logs."""
    return {k: tf.reshape(v, [1]) for k, v in logs.items()}


def step_logs(model, logs):
    """A step's logs as Keras can reduce them: ``[1]`` vectors under
    ``MultiWorkerMirroredStrategy``, else unchanged (for a model whose own
    ``train_step`` / ``test_step`` stand before the mixin's)."""
    if isinstance(model.distribute_strategy,
                  tf.distribute.MultiWorkerMirroredStrategy):
        return _vector_logs(logs)
    return logs


class DistributedTrainerMixin:
    """Mixin of a ``keras.Model`` subclass: ``fit`` / ``evaluate`` under
    ``tf.distribute`` with sparse features and label ids.

    List it first among the bases, before the class that defines
    ``train_step`` (``class SampledTrainer(DistributedTrainerMixin,
    CandidateTrainer)``, or ``class MyModel(DistributedTrainerMixin,
    keras.Model)``); nothing else to call.  Without a strategy (or a model
    created outside its scope) it changes nothing.

    What it overrides (see the module docstring for the Keras bugs):

    * ``_maybe_symbolic_build`` -- a *private* method of Keras 3.15's
      ``TensorFlowTrainer`` (``keras/src/backend/tensorflow/trainer.py``),
      overridden here and nowhere else in xmc_tf because it is the only
      place where Keras reduces the first batch: it builds the model, its
      compiled loss and metrics from this worker's first replica's batch
      instead of ``strategy.reduce("MEAN", batch)`` of all of them.  If a
      Keras upgrade renames it, this override is dead code and the bug
      (if still there) comes back as Keras' own error; the tests of
      ``tests/test_distributed_models.py`` catch it.
    * ``train_step`` / ``test_step`` (public) -- under
      ``tf.distribute.MultiWorkerMirroredStrategy`` they return each log
      as a ``[1]`` vector (Keras' multi-worker reduction of the logs needs
      an axis 0); elsewhere they return the parent's logs unchanged.

    Works with sparse (``SparseTensor``) and dense features, integer label
    ids of any width, and any ``y`` form of :mod:`xmc_tf.losses.targets`.

    Source: workarounds for Keras 3.15.1's TensorFlow trainer
    (``TensorFlowTrainer._maybe_symbolic_build``, ``reduce_per_replica``).
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = getattr(self, "_distribute_strategy", None)
        if iterator is None or strategy is None:
            return super()._maybe_symbolic_build(iterator=iterator,
                                                 data_batch=data_batch)
        for _, _, it in iterator:  # what Keras does: one batch
            batch = next(it)
            break
        data_batch = tf.nest.map_structure(lambda v: _local(v, strategy),
                                           batch)
        return super()._maybe_symbolic_build(data_batch=data_batch)

    def _multi_worker(self) -> bool:
        return isinstance(self.distribute_strategy,
                          tf.distribute.MultiWorkerMirroredStrategy)

    def train_step(self, data):
        """The parent's ``train_step``; ``[1]`` logs under multi-worker."""
        logs = super().train_step(data)
        return _vector_logs(logs) if self._multi_worker() else logs

    def test_step(self, data):
        """The parent's ``test_step``; ``[1]`` logs under multi-worker."""
        logs = super().test_step(data)
        return _vector_logs(logs) if self._multi_worker() else logs


@keras.saving.register_keras_serializable(package="xmc_tf")
class DistributedModel(DistributedTrainerMixin, keras.Model):
    """A ``keras.Model`` that trains under ``tf.distribute`` with sparse
    features: ``DistributedModel(inputs, outputs)`` instead of
    ``keras.Model(inputs, outputs)``.

    Build and compile it under ``strategy.scope()`` and ``fit`` it like any
    Keras model (a ``tf.data`` dataset, a distributed dataset of
    :func:`xmc_tf.data.distribute_tf_dataset`, or arrays).  Under
    ``MirroredStrategy`` over several devices, or
    ``MultiWorkerMirroredStrategy``, a plain ``keras.Model`` fails in
    Keras 3.15 on ``SparseTensor`` features (and casts label ids to
    floats); this one does not (:class:`DistributedTrainerMixin`).  Saved
    and loaded like a functional ``keras.Model`` (registered as
    ``xmc_tf>DistributedModel``).

    Args:
      inputs, outputs, name, ...: as for the functional ``keras.Model``.

    Raises:
      ValueError: as ``keras.Model`` (e.g. outputs not reachable from the
        inputs).

    Example:
      >>> inputs = keras.Input((20,), sparse=True)
      >>> model = DistributedModel(inputs, keras.layers.Dense(5)(inputs))
      >>> isinstance(model, keras.Model)
      True
    """


_PLAIN_MODEL_ERROR = (
    "a {cls} model cannot fit SparseTensor batches under {strategy} (Keras 3.15 "
    "builds the model from strategy.reduce of the first batch, which fails "
    "on a SparseTensor: {keras_error}): create it as "
    "xmc_tf.models.DistributedModel(inputs, outputs) under strategy.scope() "
    "instead of keras.Model (a subclassed model: list "
    "xmc_tf.models.DistributedTrainerMixin first among its bases)")


def _name_the_fix() -> None:
    """Wraps Keras' ``TensorFlowTrainer._maybe_symbolic_build`` (once) so
    that a model without :class:`DistributedTrainerMixin` which meets
    Keras' ``strategy.reduce`` of a ``SparseTensor`` batch gets a
    ``TypeError`` naming :class:`DistributedModel` instead of
    ``AttributeError: 'SparseTensor' object has no attribute 'device'``.

    Raises (from the wrapped method):
      TypeError: that case, with Keras' message in it.
    """
    try:
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    except ImportError:  # another Keras layout: nothing to wrap
        return
    original = TensorFlowTrainer.__dict__.get("_maybe_symbolic_build")
    if original is None or getattr(original, "_xmc_tf_wrapped", False):
        return

    @functools.wraps(original)
    def _maybe_symbolic_build(self, *args, **kwargs):
        try:
            return original(self, *args, **kwargs)
        except AttributeError as e:
            if (isinstance(self, DistributedTrainerMixin)
                    or "SparseTensor" not in str(e)):
                raise
            strategy = getattr(self, "_distribute_strategy", None)
            raise TypeError(_PLAIN_MODEL_ERROR.format(
                cls=type(self).__name__,
                strategy=type(strategy).__name__ if strategy else "a strategy",
                keras_error=e)) from e

    _maybe_symbolic_build._xmc_tf_wrapped = True
    TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build


_name_the_fix()
