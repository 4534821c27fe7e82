"""Build and fit phases of the main job: the compiled model, its callbacks,
the training and validation streams, and ``fit``.

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 4.1 (learning rate halved on a
validation plateau, then early stopping).
"""

from __future__ import annotations

import gc
import math
import os
import sys

import keras
import numpy as np
import tensorflow as tf

from xmc_tf import callbacks as xcallbacks
from xmc_tf import data as xdata
from xmc_tf.job import cluster as xcluster
from xmc_tf.metrics import evaluator as xevaluation
from xmc_tf.errors import ConfigError, TrainingDiverged
from xmc_tf.job import wide as xwide
from xmc_tf.job.build import build_network, build_optimizer
from xmc_tf.job.report import variable_bytes
from xmc_tf.models.distributed import DistributedModel, DistributedTrainerMixin
from xmc_tf.job.workdir import Workdir

__all__ = ["build_and_compile", "validation_batch_size", "release_optimizer",
           "FUSED_MIN_DELTA",
           "StopOnNonFinite", "LogLearningRate", "ChiefLogs", "make_callbacks",
           "make_datasets",
           "fit_model", "VALIDATION_FREE_BYTES"]


def build_and_compile(config, head, num_features: int, num_labels: int,
                      sparse_input: bool, distributed: bool = False,
                      fit_data=None):
    """Builds the model and compiles the model that ``fit`` runs.

    The optimizer is the head's own (``head.make_optimizer()``, e.g.
    SCENT's row-sparse momentum) or :func:`xmc_tf.job.build.build_optimizer`
    (``config.train.optimizer``); the caller has run ``head.prepare`` on the
    training data, and the wide path (if the model has one) is connected
    from ``fit_data`` (:func:`xmc_tf.job.wide.initialize_wide`).  Heads that train through a wrapper
    (``head.training_model``, e.g. the sampled head's trainer) compile it
    with ``head.compile``.  The checkpoint saves the variables of
    ``fit_model`` (which include ``model``'s) and its ``get_state()`` if it
    has one.  With ``distributed`` (a ``tf.distribute`` strategy: call it
    under ``strategy.scope()``) a plain model is fitted as an
    :class:`xmc_tf.models.DistributedModel` of the same layers (Keras 3.15
    cannot build a plain model from a distributed sparse batch: see
    :mod:`xmc_tf.models.distributed`).

    Returns:
      ``(model, layer, fit_model)``: the inference model (exported), its
      head layer, and the compiled model to ``fit``.

    Raises:
      ConfigError: the model cannot be built from the config.
    """
    try:
        model, layer, wide = build_network(config, num_features, num_labels,
                                           sparse_input, head)
    except ValueError as e:
        raise ConfigError(" ".join(str(e).split())) from e
    # Initial values from the data (a resume restores its checkpoint over
    # them): e.g. the prior bias, the wide path's connections.
    head.initialize(layer, model)
    if wide is not None and fit_data is not None:
        xwide.initialize_wide(wide, config, fit_data)
    try:
        steps = (math.ceil(fit_data.num_instances / config.train.batch_size)
                 if fit_data is not None else None)
        optimizer = head.make_optimizer() or build_optimizer(config, steps)
    except ValueError as e:
        raise ConfigError(" ".join(str(e).split())) from e
    _bind_fused_updates(config, model, optimizer, distributed)
    fit_model = head.training_model(model, layer)
    if distributed and not isinstance(fit_model, DistributedTrainerMixin):
        if fit_model is not model:
            raise ConfigError(
                f"{type(fit_model).__name__} cannot train under a "
                "tf.distribute strategy: its class does not list "
                "xmc_tf.models.DistributedTrainerMixin among its bases")
        # The same layers (and variables) in a model class whose fit works
        # on distributed sparse batches.
        fit_model = DistributedModel(model.inputs, model.outputs,
                                     name=model.name)
    head.compile(fit_model, layer, optimizer)  # jit_compile=False
    return model, layer, fit_model


def _bind_fused_updates(config, model, optimizer, distributed) -> None:
    """Binds every fused head update of ``model``
    (``UniformSparseDense(fused_update=...)``) to ``optimizer``'s current
    learning rate, read at every step: the LR schedule (plateau halving,
    cosine) steps the kernel too.

    Raises:
      ConfigError: a fused update under a strategy with several replicas
        (each would step its own copy of the kernel).
    """
    rules = [layer.fused_update for layer in model._flatten_layers()  # pylint: disable=protected-access
             if getattr(layer, "fused_update", None) is not None]
    if rules and distributed and \
            tf.distribute.get_strategy().num_replicas_in_sync > 1:
        raise ConfigError(
            f"config.model.head_update={config.model.head_update!r} steps "
            "each replica's own copy of the head: use head_update="
            "'optimizer' under a strategy with several replicas")
    for rule in rules:
        rule.learning_rate = lambda: optimizer.learning_rate


#: The progress an epoch must make in the fused monitor
#: (:data:`xmc_tf.job.finalize.FUSED_MONITOR`, a fraction) to count, when
#: ``config.train.min_delta`` is None: 0.01 points of mean P@k, Keras'
#: default for ``ReduceLROnPlateau``, for both the schedule and early
#: stopping.  Early stopping's own default (0) lets a fused model that
#: creeps by a few instances an epoch train on: DebDocNextWord's rose by
#: 0.002-0.01 points an epoch once the network stopped mattering.  At 0.1
#: points ManNextWord's stopped while its network still learned the
#: tail classes (validation 14.14 against 14.46; docs/notes/tail.md).
FUSED_MIN_DELTA = 1e-4

#: Score blocks of validation up to this size are not limited by the
#: training batch (label spaces of up to 16,384 labels keep batches of 1024).
VALIDATION_FREE_BYTES = 64 << 20


def validation_batch_size(eval_batch_size: int, train_batch_size: int,
                          model) -> int:
    """Instances per batch of the validation pass inside ``fit``.

    Validation runs while the optimizer's state is held, so its float32
    score blocks ``[batch, m]`` are kept within a training batch's
    (``4 m train_batch_size`` bytes) once they pass
    :data:`VALIDATION_FREE_BYTES`, and always within
    :data:`xmc_tf.metrics.evaluator.SCORE_BLOCK_BYTES`: at 670k labels 64 rows
    (the default training batch) instead of 100, so that validation holds
    no more than a training step.

    Args:
      eval_batch_size: ``config.eval.batch_size`` (>= 1).
      train_batch_size: ``config.train.batch_size`` (>= 1).
      model: the model whose output is scored (as for
        :func:`xmc_tf.metrics.evaluator.score_batch_size`).

    Returns:
      int in ``[1, eval_batch_size]``.
    """
    model = getattr(model, "inference_model", None) or model
    try:
        width = int(np.prod([int(d) for d in model.outputs[0].shape[1:]]))
    except (AttributeError, IndexError, TypeError, ValueError):
        width = 0
    budget = min(xevaluation.SCORE_BLOCK_BYTES,
                 max(VALIDATION_FREE_BYTES, 4 * width * int(train_batch_size)))
    return xevaluation.score_batch_size(eval_batch_size, model, budget)


def release_optimizer(model) -> int:
    """Drops the optimizer state of a model whose training is over.

    After the last checkpoint (which keeps the optimizer's variables for a
    resume) nothing the job does reads them: evaluation and export use the
    model's weights only.  Dropping them before evaluation and export frees
    the Adam moments, twice the trainable variables (1.2 GiB at 670k labels
    with the default encoder), and keeps them out of ``model.keras``, which
    saved a compiled model's optimizer with it.

    The model is left uncompiled (``model.compiled`` False): it cannot
    ``fit`` or ``evaluate`` again, and ``model.keras`` no longer carries a
    compile config, whose loading compiled the nested model and built a
    new optimizer (the moments' memory again) in every process that loaded
    the file.

    Args:
      model: a compiled ``keras.Model`` (the one ``fit`` ran), or any
        model without an optimizer (nothing happens).

    Returns:
      Bytes of the optimizer variables released (0 if none).
    """
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return 0
    released = (variable_bytes(optimizer.variables)
                if getattr(optimizer, "built", False) else 0)
    compile_config = getattr(model, "_compile_config", None)  # Keras 3
    config = getattr(compile_config, "config", None)
    if isinstance(config, dict) and config.get("optimizer") is optimizer:
        config["optimizer"] = keras.saving.serialize_keras_object(optimizer)
    # The traced train step captures the optimizer's variables.
    model.train_function = None
    # Deleting the attribute also drops TensorFlow's checkpoint dependency
    # on it (assigning None alone keeps that reference).
    del model.optimizer
    model.optimizer = None
    model.compiled = False
    del optimizer, compile_config, config
    gc.collect()
    return released


class LogLearningRate(keras.callbacks.Callback):
    """Adds ``learning_rate`` to the epoch logs (and so to ``history.csv``):
    the optimizer's rate after the epoch's last step, e.g. of a
    ``keras.optimizers.schedules.CosineDecay`` (with a plateau schedule
    :class:`xmc_tf.callbacks.ReduceLROnPlateau` logs the rate instead)."""

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate))


class StopOnNonFinite(keras.callbacks.Callback):
    """Stops a run whose training loss is NaN or +-inf, with a clear error.

    Keras' ``TerminateOnNaN`` stops quietly, after which the job would export
    and evaluate a broken model.  This raises :class:`TrainingDiverged`
    instead, before the epoch's checkpoint is written (the job's
    :class:`~xmc_tf.job.checkpoint.Checkpointer` runs after it), so the workdir
    keeps the last finite epoch and ``xmc-tf`` prints one line.  The loss is
    read every ``every_n_batches`` batches and at every epoch end (reading
    it waits for the step, so not every batch).

    Args:
      every_n_batches: batches between checks (>= 1).

    Raises:
      TrainingDiverged: from ``on_train_batch_end`` / ``on_epoch_end``.
    """

    def __init__(self, every_n_batches: int = 50):
        super().__init__()
        self.every_n_batches = max(1, int(every_n_batches))
        self._epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def _check(self, logs, where):
        loss = (logs or {}).get("loss")
        if loss is None:
            return
        # (a [1] vector per batch under a multi-worker strategy)
        value = float(np.ravel(keras.ops.convert_to_numpy(loss))[0])
        if not math.isfinite(value):
            raise TrainingDiverged(
                f"training diverged: loss {value} at epoch {self._epoch + 1}"
                f"{where}; the workdir keeps the last finished epoch's "
                "backup; lower config.train.learning_rate (or check the "
                "loss options) and rerun with --overwrite (from Python: "
                "overwrite=True)")

    def on_train_batch_end(self, batch, logs=None):
        if (batch + 1) % self.every_n_batches == 0:
            self._check(logs, f", batch {batch + 1}")

    def on_epoch_end(self, epoch, logs=None):
        self._check(logs, "")


class ChiefLogs(keras.callbacks.Callback):
    """Replaces every worker's epoch logs with the chief's (multi-worker).

    Keras all-reduces the loss and the compiled metrics, so those agree on
    every worker; values that callbacks compute on their own (held-out P@k
    of :class:`xmc_tf.callbacks.TopKEvaluation`, SET statistics) could
    differ in the last bits between machines, and a learning-rate schedule
    or early stopping that decided differently on two workers would make
    them diverge or wait for each other forever.  Placed after the
    callbacks that write logs and before those that read them
    (:func:`make_callbacks`), this gives every worker the chief's numbers:
    one small broadcast per epoch (:meth:`xmc_tf.job.cluster.Cluster.broadcast_json`),
    made by every worker.

    Args:
      cluster: this process's :class:`xmc_tf.job.cluster.Cluster`.
    """

    def __init__(self, cluster: xcluster.Cluster):
        super().__init__()
        self.cluster = cluster

    def on_epoch_end(self, epoch, logs=None):
        if logs is None or not self.cluster.multi_worker:
            return
        mine = {}
        for key, value in logs.items():
            try:  # a Python int or float (a [1] vector's element)
                mine[key] = np.ravel(keras.ops.convert_to_numpy(value))[0] \
                    .item()
            except (TypeError, ValueError, IndexError, AttributeError):
                continue
        logs.update(self.cluster.broadcast_json(
            mine if self.cluster.is_chief else None))


def make_callbacks(config, workdir: str, head, layer, val_data,
                   cluster: xcluster.Cluster | None = None,
                   fused=None) -> list:
    """The callbacks of ``fit``, in order.

    :class:`StopOnNonFinite`, then the head's own callbacks (SET, held-out
    P@k, ...), so their epoch logs reach the rest (in a multi-worker
    ``cluster``, replaced by the chief's: :class:`ChiefLogs`); then LR
    halving (``config.train.schedule="plateau"``; with ``"cosine"`` the
    optimizer's schedule, its rate logged by :class:`LogLearningRate`) and
    early stopping on the head's monitor (val P@3 when a
    validation split exists), both with state that survives a resume
    (:mod:`xmc_tf.job.checkpoint`; the best weights on disk in
    ``workdir/backup``, not in memory), and TensorBoard.  With ``fused``
    (a :class:`xmc_tf.job.finalize.FusedValidation`) the head's callbacks
    get no validation data, ``fused`` follows them, and the schedule and
    early stopping follow the fused model's validation P@k
    (:data:`xmc_tf.job.finalize.FUSED_MONITOR`) instead.  The
    :class:`~xmc_tf.job.checkpoint.Checkpointer` (which also writes
    ``history.csv``) is appended by the caller, last."""
    tc = config.train
    monitor, mode = head.monitor(val_data is not None)
    if fused is not None:
        from xmc_tf.job.finalize import FUSED_MONITOR
        monitor, mode, val_data = FUSED_MONITOR, "max", None
    # An epoch counts as progress only if the monitor moves by
    # config.train.min_delta, so a run whose metric creeps ends by itself
    # (None: Keras' defaults, 1e-4 for the schedule and 0 for stopping;
    # FUSED_MIN_DELTA for the fused monitor).
    if tc.min_delta is not None:
        deltas = {"lr": float(tc.min_delta), "stop": float(tc.min_delta)}
    elif fused is not None:
        deltas = {"lr": FUSED_MIN_DELTA, "stop": FUSED_MIN_DELTA}
    else:
        deltas = {"lr": 1e-4, "stop": 0.0}
    cbs = [StopOnNonFinite()] + head.callbacks(layer, val_data)
    if fused is not None:
        cbs.append(fused)
    if cluster is not None and cluster.multi_worker:
        cbs.append(ChiefLogs(cluster))
    if tc.get("schedule", "plateau") == "plateau":
        cbs.append(xcallbacks.ReduceLROnPlateau(
            monitor=monitor, mode=mode, factor=0.5, patience=tc.lr_patience,
            min_lr=tc.min_learning_rate, min_delta=deltas["lr"],
            verbose=1 if tc.verbose else 0))
    else:  # the optimizer's own schedule (xmc_tf.job.build.learning_rate)
        cbs.append(LogLearningRate())
    cbs += [
        xcallbacks.EarlyStopping(
            monitor=monitor, mode=mode, patience=tc.early_stopping_patience,
            min_delta=deltas["stop"], restore_best_weights=True,
            verbose=1 if tc.verbose else 0,
            best_weights_dir=Workdir(workdir).backup_dir),
    ]
    if tc.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(os.path.join(workdir,
                                                            "tensorboard")))
    return cbs


def make_datasets(config, head, fit_data, val_data, model,
                  cluster: xcluster.Cluster, initial_epoch: int):
    """The training and validation streams of ``fit``.

    One stream of epochs keyed by ``(config.seed, epoch)``, so a resumed
    run sees the batches an uninterrupted one sees; under a strategy the
    batches are split over the replicas
    (:func:`xmc_tf.data.distribute_tf_dataset`).  Validation batches are
    no wider than a training batch's scores (:func:`validation_batch_size`,
    per replica).

    Returns:
      ``(train_ds, val_ds_or_None)``.
    """
    tc = config.train
    train_kwargs = dict(shuffle=True, seed=config.seed, repeat=True,
                        first_epoch=initial_epoch, **head.dataset_kwargs())
    val_batch = validation_batch_size(config.eval.batch_size, tc.batch_size,
                                      model)
    strategy = cluster.strategy
    if strategy is None:
        train_ds = xdata.make_tf_dataset(fit_data, tc.batch_size,
                                         **train_kwargs)
        val_ds = (xdata.make_tf_dataset(val_data, val_batch)
                  if val_data is not None else None)
        return train_ds, val_ds
    train_ds = xdata.distribute_tf_dataset(strategy, fit_data, tc.batch_size,
                                           **train_kwargs)
    val_ds = (xdata.distribute_tf_dataset(strategy, val_data,
                                          val_batch * cluster.num_replicas)
              if val_data is not None else None)
    return train_ds, val_ds


def _keras_verbose(verbose: int) -> int:
    """``config.train.verbose`` for ``Model.fit``: a progress bar (1) only
    where it is drawn in place (a terminal, or a notebook), else one line
    per epoch (2).

    Keras redraws its bar with ``\\b`` and ``\\r`` whenever the system is
    POSIX, terminal or not, so in a log file or a pipe every epoch came out
    as one line of about 19,000 characters.
    """
    if verbose == 1 and not ("ipykernel" in sys.modules or (
            hasattr(sys.stdout, "isatty") and sys.stdout.isatty())):
        return 2
    return verbose


def fit_model(fit_model, config, head, fit_data, val_data, model,
              cluster: xcluster.Cluster, callbacks: list, initial_epoch: int,
              last_epoch: int) -> None:
    """Runs ``fit_model.fit`` from ``initial_epoch`` to ``last_epoch`` on
    the streams of :func:`make_datasets` (``config.train.batch_size``,
    ``ceil(n / batch_size)`` steps per epoch) with ``callbacks``, then
    :class:`xmc_tf.callbacks.EpochLine` as the progress bar (an epoch's
    line leaves out the SET / index / LSH keys of an event that did not
    happen in it; ``history.csv`` keeps them)."""
    tc = config.train
    train_ds, val_ds = make_datasets(config, head, fit_data, val_data, model,
                                     cluster, initial_epoch)
    fit_model.fit(train_ds, validation_data=val_ds,
                  steps_per_epoch=math.ceil(fit_data.num_instances
                                            / tc.batch_size),
                  initial_epoch=initial_epoch,
                  epochs=max(last_epoch, initial_epoch),
                  shuffle=False,  # make_tf_dataset shuffles per epoch
                  callbacks=list(callbacks) + [xcallbacks.EpochLine()],
                  verbose=_keras_verbose(tc.verbose))
