"""Check phase of the main job: the config as given, checked once before
anything is read or written.

:func:`check` is the job's first step
(:func:`xmc_tf.job.run.train_and_evaluate`): it checks every field
(:func:`check_config`, for both label regimes when the config leaves fields
to the data) and, under a ``tf.distribute`` strategy, what data-parallel
training needs (:func:`check_strategy`), and returns the frozen
:class:`Checked` that every later step reads instead of the config.
The plan phase (:mod:`xmc_tf.job.plan`) resolves it from the data;
:func:`check_batch_split` checks a batch size the plan chose.
"""

from __future__ import annotations

import dataclasses
import importlib.util

from xmc_tf import config as xconfig
from xmc_tf.config import auto_bool, check_int, check_nonnegative
from xmc_tf.errors import ConfigError
from xmc_tf.job import cluster as xcluster
from xmc_tf.job import heads as xheads
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.build import (ENCODERS, INTERMEDIATE_ACTIVATIONS, OPTIMIZERS,
                             SCHEDULES)

__all__ = ["Checked", "check", "check_config", "check_strategy",
           "check_batch_split", "MONITORS"]


#: The values of ``config.train.monitor``.
MONITORS = ("auto", "network", "fused")


@dataclasses.dataclass(frozen=True)
class Checked:
    """The check phase's value: the config as given and what checking it
    found.

    Attributes:
      config: the config as given (``ml_collections.ConfigDict``; what
        ``config.json``, the resume check, the workers' agreement and an
        ensemble's members compare).  Not modified after the check.
      head: the :class:`xmc_tf.job.heads.Head` that ``config.model.head``
        names, bound to ``config``.
    """

    config: object
    head: xheads.Head


def check(config, cluster: xcluster.Cluster) -> Checked:
    """Checks ``config`` for the job (:func:`check_config`, and
    :func:`check_strategy` when ``cluster`` has a strategy).

    Args:
      config: the job config (``ml_collections.ConfigDict``).
      cluster: the process's :class:`xmc_tf.job.cluster.Cluster`.

    Returns:
      The frozen :class:`Checked`.

    Raises:
      ConfigError: a bad value (the message names the field), or one the
        strategy cannot train.
    """
    head = check_config(config)
    if cluster.strategy is not None:
        check_strategy(config, head, cluster)
    return Checked(config, head)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_config(config) -> xheads.Head:
    """Validates the config before anything is read or written.

    A config that leaves fields to the data's label regime
    (:func:`xmc_tf.config.by_regime`, value None) is checked as it would be
    resolved for multi-label and for multi-class training labels
    (:func:`resolve_config` fills them in once the labels are read).

    Returns:
      The :class:`xmc_tf.job.heads.Head` that ``config.model.head`` names
      (bound to ``config`` as given).

    Raises:
      ConfigError: a bad value (the message names the field), or
        ``train.tensorboard`` without the tensorboard package.
    """
    if not xconfig.unresolved_fields(config):
        return _check_resolved(config)
    for multi_class in (False, True):
        _check_resolved(xconfig.resolve_regime(config, multi_class))
    try:
        return xheads.get_head(config)
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(" ".join(str(e).split()).strip("'\"")) from e


def _check_resolved(config) -> xheads.Head:
    try:
        head = xheads.get_head(config)
        tc = config.train
        for name in ("batch_size", "epochs"):
            if int(tc[name]) < 1:
                raise ValueError(f"config.train.{name}={tc[name]!r} must be "
                                 ">= 1")
        for field, value, allowed in (
                ("train.optimizer", tc.optimizer, OPTIMIZERS),
                ("train.schedule", tc.get("schedule", "plateau"), SCHEDULES),
                ("model.encoder", config.model.encoder, ENCODERS),
                ("model.intermediate_activation",
                 config.model.intermediate_activation,
                 INTERMEDIATE_ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"config.{field}={value!r}; expected one of "
                                 f"{allowed}")
        check_int("model.ensemble_size", config.model.ensemble_size, 1)
        size = config.model.ensemble_size
        if size > 1 and not head.scores_every_label:
            raise ValueError(
                f"config.model.ensemble_size={size} needs a head that scores "
                f"every label; head {head.name!r} does not (use 1)")
        _check_model_fields(config.model)
        if tc.optimizer == "lazy_adamw":
            check_nonnegative("train.weight_decay", tc.weight_decay)
        if tc.min_delta is not None:
            check_nonnegative("train.min_delta", tc.min_delta)
        if tc.get("batch_scores_mib") is not None:
            check_int("train.batch_scores_mib", tc.batch_scores_mib, 1)
        if tc.get("monitor", "auto") not in MONITORS:
            raise ValueError(f"config.train.monitor={tc.monitor!r}; expected "
                             f"one of {MONITORS}")
        for kind in xscorers.kinds():
            kind.check(config, head)
        sc = config.get("shortlist")
        if sc is not None:
            auto_bool(sc.enabled, "config.shortlist.enabled")
            check_int("shortlist.min_labels", sc.min_labels, 0)
        frac = config.data.validation_fraction
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"config.data.validation_fraction={frac!r} must "
                             "be in [0, 1)")
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(" ".join(str(e).split()).strip("'\"")) from e
    if tc.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("config.train.tensorboard=True needs the tensorboard "
                          "package: pip install 'tensorboard~=2.21.0'")
    return head


def _check_model_fields(mc) -> None:
    """The wide path's and the dropout rates' fields of ``config.model``
    (ValueError naming the field)."""
    check_int("model.wide_connections", mc.wide_connections, 0)
    if mc.wide_max_mib is not None:
        check_int("model.wide_max_mib", mc.wide_max_mib, 0)
    fan_out = mc.get("wide_max_fan_out")
    if fan_out is not None and not (_is_number(fan_out) and fan_out > 0):
        raise ValueError(f"config.model.wide_max_fan_out={fan_out!r} must "
                         "be a number > 0 (or None: no cap)")
    for name in ("input_dropout", "dropout", "intermediate_dropout"):
        rate = mc[name]
        if not (_is_number(rate) and 0.0 <= rate < 1.0):
            raise ValueError(f"config.model.{name}={rate!r} must be in "
                             "[0, 1)")


def check_strategy(config, head, cluster: xcluster.Cluster) -> None:
    """Checks that ``config`` can be trained data parallel.

    Args:
      config: the job config (checked by :func:`check_config`).
      head: its :class:`xmc_tf.job.heads.Head`.
      cluster: the :class:`xmc_tf.job.cluster.Cluster` of the strategy
        (``num_replicas`` is read).

    Raises:
      ConfigError: ``config.model.ensemble_size > 1`` (members are trained
        one process at a time), a head that cannot be trained data parallel
        (:attr:`xmc_tf.job.heads.Head.data_parallel`), or
        ``config.train.batch_size`` not a multiple of the replicas
        (:func:`check_batch_split`; a batch size left to the label regime,
        None, is checked once resolved).
    """
    batch_size = config.train.batch_size
    if config.model.ensemble_size > 1:
        raise ConfigError(
            f"config.model.ensemble_size={config.model.ensemble_size}: "
            "ensembles are trained without a strategy (--strategy=none); "
            "train the members as separate runs to spread them over machines")
    if not head.data_parallel:
        raise ConfigError(
            f"config.model.head={head.name!r} cannot be trained under a "
            "tf.distribute strategy (its trainer keeps per-process sampler "
            "or per-instance state); use --strategy=none")
    if batch_size is not None:
        check_batch_split(batch_size, cluster)


def check_batch_split(batch_size: int, cluster: xcluster.Cluster) -> None:
    """Checks that the global batch splits evenly over the replicas.

    Args:
      batch_size: ``config.train.batch_size`` (instances per step, all
        replicas together).
      cluster: the :class:`xmc_tf.job.cluster.Cluster` of the strategy.

    Raises:
      ConfigError: ``batch_size`` not a multiple of ``cluster.num_replicas``.
    """
    replicas = cluster.num_replicas
    if batch_size % replicas:
        raise ConfigError(
            f"config.train.batch_size={batch_size} must be a "
            f"multiple of the {replicas} replicas of the strategy (the global "
            "batch is split evenly over them)")
