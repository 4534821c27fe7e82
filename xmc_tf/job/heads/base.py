"""The output-head abstraction: one class per head, asked through a registry.

A *head* is the last stage of an xmc_tf model -- the layer that scores
labels -- as the job trains it: the layer, the losses it trains with, the
metrics computed on training batches, the callbacks it needs (SET
rewiring, index refresh, held-out P@k), its defaults (its entry of
:data:`xmc_tf.config.HEAD_DEFAULTS`) and what the trained model reports in
``metrics.json``.  Decoding a trained model is not the head's: it goes by
the type of the model's scoring layer (:mod:`xmc_tf.decoding`), so a saved
model needs no config.  :mod:`xmc_tf.job` and the ``xmc-tf`` command never
branch on the head's name: they ask the registry (:func:`get_head`).
Adding a head means adding one
module to ``xmc_tf/job/heads/`` that subclasses :class:`Head` and decorates it
with :func:`register`.

Example:
    >>> from xmc_tf.job import heads
    >>> sorted(heads.names())[:2]
    ['dense', 'mach']
"""

from __future__ import annotations

import copy
from typing import ClassVar

import keras

from xmc_tf import config as xconfig
from xmc_tf import decoding

__all__ = ["Head", "register", "get_head", "names", "OUTPUT_LAYER"]

_REGISTRY: dict[str, type["Head"]] = {}

#: Name of the head layer in every model built by xmc_tf (for reading a
#: model summary; nothing looks the layer up by it).
OUTPUT_LAYER = "output"



def register(cls: type["Head"]) -> type["Head"]:
    """Class decorator adding a :class:`Head` subclass to the registry.

    A head defined outside xmc_tf brings its config fields with it: its
    ``config_defaults`` become its entry of
    :data:`xmc_tf.config.HEAD_DEFAULTS`, so ``xmc_tf.config.base(name)``
    builds its configs once its module is imported (one module and this
    decorator, no other edit).

    Raises:
      ValueError: the class has no ``name``, the name is taken, or the
        schema already holds other defaults for that name.
    """
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"head {cls.name!r} is already registered "
                         f"({_REGISTRY[cls.name].__name__})")
    known = xconfig.HEAD_DEFAULTS.get(cls.name)
    if known is None:
        xconfig.HEAD_DEFAULTS[cls.name] = cls.config_defaults
    elif known is not cls.config_defaults:
        raise ValueError(f"head {cls.name!r}: config_defaults differ from "
                         f"xmc_tf.config.HEAD_DEFAULTS[{cls.name!r}]")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> tuple[str, ...]:
    """Names of the registered heads (what ``config.model.head`` accepts)."""
    return tuple(_REGISTRY)


def get_head(config) -> "Head":
    """The head that ``config.model.head`` names, checked against the config.

    Args:
      config: the ml_collections job config (``config.model.head``,
        ``config.loss`` and the head's own fields).

    Returns:
      A :class:`Head` instance bound to ``config``.

    Raises:
      ValueError: an unknown head name, or a config value the head rejects
        (e.g. a loss it cannot train with).
    """
    name = config.model.head
    if name not in _REGISTRY:
        raise ValueError(f"config.model.head={name!r}; expected one of "
                         f"{names()}")
    return _REGISTRY[name](config)





def missing_fields(config, fields: dict, prefix: str = "config.") -> list:
    """The fields of ``fields`` (a nested dict, as
    :data:`xmc_tf.config.HEAD_DEFAULTS` holds) that ``config`` lacks,
    dotted (``["config.model.num_buckets"]``)."""
    missing = []
    for key, value in fields.items():
        if key not in config:
            missing.append(f"{prefix}{key}")
        elif isinstance(value, dict) and not hasattr(value, "lock"):
            missing += missing_fields(config[key], value, f"{prefix}{key}.")
    return missing


class Head:
    """Base class of the output heads.

    Subclasses set :attr:`name` and :attr:`losses` and implement
    :meth:`build_layer` and :meth:`make_loss`; the defaults here describe a
    head that scores every label (``[batch, num_labels]`` logits).

    Args:
      config: the job config (ml_collections ``ConfigDict``).

    Raises:
      ValueError: ``config.loss`` is not one of :attr:`losses`, or another
        head-specific config value is invalid (:meth:`check_config`).
    """

    #: ``config.model.head`` value.
    name: ClassVar[str] = ""
    #: ``config.loss`` values the head trains with.
    losses: ClassVar[tuple[str, ...]] = ()
    #: Whether P@k can be computed in-graph on every training batch (full
    #: scores are available); otherwise validation P@k comes from
    #: :class:`xmc_tf.callbacks.TopKEvaluation` once per epoch.
    full_scores_in_training: ClassVar[bool] = True
    #: Whether ``config.model.wide_connections`` (a per-label linear path on
    #: the input features added to the head's scores) fits this head.
    wide_path: ClassVar[bool] = False
    #: Whether the inference model outputs a score per label
    #: (``[batch, num_labels]``), so that ``config.model.ensemble_size``
    #: members can be averaged (:mod:`xmc_tf.job.ensemble`).
    scores_every_label: ClassVar[bool] = True
    #: Whether ``xmc-tf train --strategy=mirrored|multi_worker`` can train
    #: the head data parallel (every replica the whole model, gradients
    #: summed): its trainer keeps no state per process or per instance.
    data_parallel: ClassVar[bool] = True
    #: The config fields the head adds to the schema and the defaults it
    #: changes: its entry of :data:`xmc_tf.config.HEAD_DEFAULTS` (kept
    #: there, free of TensorFlow, for ``xmc-tf train --help``), from which
    #: :func:`xmc_tf.config.base` builds the head's configs.
    config_defaults: ClassVar[dict] = {}

    def __init__(self, config):
        self.config = config
        missing = missing_fields(config, self.config_defaults)
        if missing:
            raise ValueError(
                f"config.model.head={self.name!r} needs the fields "
                f"{', '.join(missing)}, which this config lacks; start from "
                f"xmc_tf.config.base({self.name!r}) (a packaged config of "
                "that head: xmc_tf.config.names())")
        self.check_config()

    def bound_to(self, config) -> "Head":
        """This head bound to ``config`` without checking it again: the
        resolved copy (:func:`xmc_tf.job.plan.resolve_config`) of the config
        this head was checked with (:func:`xmc_tf.job.checks.check_config`
        checks both label regimes' values).  Call it before
        :meth:`prepare`: the copy shares what ``__init__`` set.

        Returns:
          A new head of this class; ``self`` is unchanged.
        """
        head = copy.copy(self)
        head.config = config
        return head

    # -- training -----------------------------------------------------------

    def check_config(self) -> None:
        """Validates the head's config fields.

        Raises:
          ValueError: ``config.loss`` not in :attr:`losses`.
        """
        if self.config.loss not in self.losses:
            raise ValueError(
                f"config.loss={self.config.loss!r} does not fit head "
                f"{self.name!r}; expected one of {self.losses}")

    def build_layer(self, num_labels: int, input_dim: int,
                    sparse_input: bool = False):
        """The head layer, named ``"output"``, for ``num_labels`` labels.

        Args:
          num_labels: m.
          input_dim: width of the layer's input.
          sparse_input: the layer sits directly on the sparse input
            features (a linear model: no encoder or intermediate layer).
        """
        raise NotImplementedError

    def make_loss(self, layer):
        """The Keras loss for ``config.loss`` (``layer`` is built)."""
        raise NotImplementedError

    def train_metrics(self, layer) -> list:
        """Metrics computed on training (and Keras validation) batches."""
        if not self.full_scores_in_training:
            return []
        from xmc_tf.metrics import PrecisionAtK
        return [PrecisionAtK(1), PrecisionAtK(3)]

    def callbacks(self, layer, val_data) -> list:
        """Callbacks the head needs, run before the loggers and schedules.

        Args:
          layer: the built head layer.
          val_data: the held-out :class:`xmc_tf.data.XCDataset` or None.
        """
        if self.full_scores_in_training or val_data is None:
            return []
        from xmc_tf.callbacks import TopKEvaluation
        return [TopKEvaluation(val_data, ks=(1, 3),
                               batch_size=self.config.eval.batch_size,
                               decoder=decoding.top_k_function)]

    def monitor(self, has_validation: bool) -> tuple[str, str]:
        """``(log key, mode)`` driving LR halving and early stopping."""
        if has_validation:
            return "val_precision_at_3", "max"
        if self.full_scores_in_training:
            return "precision_at_3", "max"
        return "loss", "min"

    def prepare(self, train_data) -> None:
        """Shown the training instances (after any validation split) before
        :meth:`build_layer` / :meth:`training_model`; heads with state per
        training instance (SCENT's duals) size it here.  Default: nothing.

        Args:
          train_data: the :class:`xmc_tf.data.XCDataset` that ``fit`` sees.
        """
        del train_data

    def initialize(self, layer, model=None) -> None:
        """Sets initial values of the built head layer's weights (and of
        other layers of ``model``) from what :meth:`prepare` saw (e.g. a
        prior bias).  Called on a fresh model only: a resumed run restores
        its checkpoint over these values.  Default: nothing.

        Args:
          layer: the built head layer.
          model: the built inference model, or None.
        """
        del layer, model

    def dataset_kwargs(self) -> dict:
        """Extra keyword arguments of :func:`xmc_tf.data.make_tf_dataset`
        for the training data set (e.g. ``{"with_example_ids": True}`` for
        a trainer that reads instance ids).  Default: ``{}``."""
        return {}

    def make_optimizer(self):
        """The head's own optimizer, or None (default) for the job's
        (:func:`xmc_tf.job.build.build_optimizer`)."""
        return None

    def training_model(self, model: keras.Model, layer) -> keras.Model:
        """The model ``fit`` runs (``model`` itself unless the head trains
        through a wrapper, e.g. a sampled trainer)."""
        return model

    def compile(self, model: keras.Model, layer, optimizer) -> None:
        """Compiles the model ``fit`` runs (see :meth:`training_model`) with
        the head's loss and metrics; ``jit_compile=False`` because XLA
        cannot compile the custom ops."""
        model.compile(optimizer=optimizer, loss=self.make_loss(layer),
                      metrics=self.train_metrics(layer), jit_compile=False)

    def results(self, layer) -> dict:
        """Head-specific entries of ``metrics.json``."""
        return {}
