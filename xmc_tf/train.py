"""The main job: train, evaluate and export an extreme classifier.

``train_and_evaluate(config, workdir)`` reads an XC-repo data set, builds
the model of :func:`xmc_tf.job.build.build_model`

    input (sparse TF-IDF or dense embeddings)
      -> encoder layers (ReLU)                  [learned features]
      -> intermediate Dense (leaky ReLU in      [Sec. 3.4 of the paper]
         configs/uniform_sparse.py)
      -> output head (xmc_tf.heads registry: uniform_sparse | dense | mach)

trains it with ``model.fit`` (``config.train.optimizer``, LazyAdam by
default; learning rate halved when the head's
monitor -- validation P@3 -- stops improving, down to a floor, then early
stopping: Sec. 4.1) with the head's own callbacks (SET rewiring for the
uniform-sparse head, held-out P@k for heads without full scores in
training), evaluates P@k, nDCG@k, PSP@k and recall@k on the test set with
the head's decoder, and writes ``model.keras``, ``saved_model/`` and, last,
``metrics.json`` to the work directory.  Nothing here branches on the
head's name: see :mod:`xmc_tf.heads`.

The work directory keeps its promises (:mod:`xmc_tf.workdir`,
:mod:`xmc_tf.checkpoint`): one run at a time (a lock), a finished run is
not retrained unless ``overwrite``, a killed run resumes exactly from
``workdir/backup`` (kept until the export is complete), and every file is
renamed into place when complete.

Under ``xmc-tf train --strategy=mirrored|multi_worker`` the same job runs
data parallel through ``tf.distribute`` (:func:`fit_and_export`,
:mod:`xmc_tf.distribute`): every worker trains the whole model on its
share of every batch, and only the chief writes the work directory.

Steps of :func:`train_and_evaluate`, each a function below (where to hook
in): :func:`check_config` -> :func:`load_data` -> :func:`resolve_config`
(the fields a config leaves to the data's label regime,
:func:`xmc_tf.config.by_regime`) -> :func:`prepare_splits`
(validation split, feature normalisation fitted on the fit part) ->
:func:`build_and_compile`
(model, optimizer, the model ``fit`` runs) -> :func:`make_callbacks` ->
restore / ``fit`` -> evaluate -> export (the exported model starts with
the normalisation, :mod:`xmc_tf.preprocessing`, so it takes raw features).

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 3.4 and 4.1.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import importlib.util
import json
import math
import os
import resource
import shutil
import tempfile
import time

import keras
import numpy as np
from absl import logging

from xmc_tf import callbacks as xcallbacks
from xmc_tf import config as xconfig
from xmc_tf.job import checkpoint as xckpt
from xmc_tf import data as xdata
from xmc_tf.job import cluster as xdist
from xmc_tf.job import ensemble as xensemble
from xmc_tf.metrics import evaluator as xevaluation
from xmc_tf.job import heads as xheads
from xmc_tf.job import tree as xlabel_tree
from xmc_tf import metrics as xmetrics
from xmc_tf.job import preprocessing as xprep
from xmc_tf import saving as xsaving
from xmc_tf.errors import (CheckpointError, ConfigError, DataError,
                           DistributeError, TrainingDiverged)
from xmc_tf.job.scoring import format_table
from xmc_tf.models.distributed import DistributedModel, DistributedTrainerMixin
from xmc_tf.job.build import (ENCODERS, INTERMEDIATE_ACTIVATIONS, OPTIMIZERS,
                              build_model, build_optimizer)
from xmc_tf.layers.label_tree import LabelTreeScores, fuse_with_tree
from xmc_tf.job.scoring import evaluate_model
from xmc_tf.samplers.registry import auto_bool
from xmc_tf.saving import export_model, export_saved_model
from xmc_tf.job.workdir import (Workdir, atomic_path, discard_hint,
                                write_bytes_atomic)

__all__ = ["train_and_evaluate", "build_model", "export_saved_model",
           "format_table", "check_config", "load_data",
           "resolve_config", "prepare_splits", "build_and_compile", "make_callbacks",
           "check_strategy", "fit_and_export", "release_optimizer",
           "validation_batch_size", "StopOnNonFinite", "ChiefLogs",
           "TrainingDiverged"]

PREPROCESSING_FILE = Workdir.PREPROCESSING
INV_PROPENSITIES_FILE = Workdir.INV_PROPENSITIES

#: Config fields that may change between a run and its resume (they do not
#: change what is computed; ``train.epochs`` moves the end of the run, which
#: the resume says in one line).
RESUME_MAY_CHANGE = ("train.verbose", "train.tensorboard", "train.epochs")


def peak_memory_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def subset(dataset: xdata.XCDataset, rows: np.ndarray) -> xdata.XCDataset:
    """The instances `rows` of `dataset` (a new XCDataset)."""
    return xdata.XCDataset(features=dataset.features[rows],
                           labels=dataset.labels[rows])


def validation_split(train: xdata.XCDataset, config):
    """Splits the training set into the part ``fit`` trains on and the
    validation part (``config.data.validation_fraction`` of the instances,
    drawn with ``config.data.split_seed``, default ``config.seed``).

    Returns:
      ``(fit_data, val_data_or_None)``, rows in file order.
    """
    seed = config.data.split_seed
    rng = np.random.default_rng(config.seed if seed is None else seed)
    order = rng.permutation(train.num_instances)
    num_val = int(round(config.data.validation_fraction * train.num_instances))
    if not num_val:
        return train, None
    return (subset(train, np.sort(order[num_val:])),
            subset(train, np.sort(order[:num_val])))


def _variable_bytes(variables) -> int:
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                   for v in variables))


def output_layer_bytes(model: keras.Model) -> int:
    """Bytes of the output layer's variables (weights, indices, bias)."""
    return _variable_bytes(model.get_layer("output").weights)


def model_bytes(model: keras.Model) -> int:
    """Bytes of all the model's variables (every layer; no optimizer state)."""
    return _variable_bytes(model.weights)


# ---------------------------------------------------------------------------
# The steps.


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_int(field: str, value, low: int) -> None:
    """Raises ValueError unless ``value`` is an int (not a bool) >= low."""
    if not (isinstance(value, int) and not isinstance(value, bool)
            and value >= low):
        raise ValueError(f"config.{field}={value!r} must be an int >= {low}")


def _check_nonnegative(field: str, value) -> None:
    """Raises ValueError unless ``value`` is a number >= 0."""
    if not (_is_number(value) and value >= 0):
        raise ValueError(f"config.{field}={value!r} must be a number >= 0")


#: The "decide from the data" value of config fields.
AUTO = "auto"


def tree_enabled(value):
    """``config.tree.enabled`` as True, False or None (``"auto"``), command
    line strings read (:func:`xmc_tf.samplers.registry.auto_bool`).

    Raises:
      ValueError: any other value.

    >>> tree_enabled("auto"), tree_enabled("False"), tree_enabled(True)
    (None, False, True)
    """
    return auto_bool(value, "config.tree.enabled")


def tree_weight(value):
    """``config.tree.weight`` as a float >= 0, or None (``"auto"``); strings
    from the command line are read as numbers.

    Raises:
      ValueError: anything else.

    >>> tree_weight("auto"), tree_weight("0.3"), tree_weight(1)
    (None, 0.3, 1.0)
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = float("nan")
    if isinstance(value, bool) or not weight >= 0:
        raise ValueError(f"config.tree.weight={value!r} must be 'auto' or a "
                         "number >= 0")
    return weight


def _check_tree(config, head) -> None:
    """Validates ``config.tree`` (ValueError naming the field)."""
    tc = config.get("tree")
    if tc is None:
        return
    enabled, weight = tree_enabled(tc.enabled), tree_weight(tc.weight)
    _check_int("tree.leaf_size", tc.leaf_size, 2)
    _check_int("tree.max_labels", tc.max_labels, 1)
    for name in ("c", "tol"):
        if not (_is_number(tc[name]) and tc[name] > 0):
            raise ValueError(f"config.tree.{name}={tc[name]!r} must be a "
                             "number > 0")
    _check_nonnegative("tree.threshold", tc.threshold)
    if enabled is True and not head.scores_every_label:
        raise ValueError(f"config.tree.enabled=True needs a head that scores "
                         f"every label; head {head.name!r} does not")
    if (enabled is True and weight is None
            and not config.data.validation_fraction):
        raise ValueError("config.tree.weight='auto' is read on the validation "
                         "split: set config.data.validation_fraction > 0 or a "
                         "number for config.tree.weight")


def label_tree_plan(config, head, num_labels: int, sparse_input: bool,
                    has_validation: bool,
                    multi_class: bool = False) -> tuple[bool, str]:
    """Whether the run fits a label tree (:mod:`xmc_tf.label_tree`), and why.

    ``config.tree.enabled="auto"`` turns it on for sparse input, a head that
    scores every label, a validation split to read its weight on,
    multi-label training data and at most ``config.tree.max_labels`` labels
    (time and memory grow with m).  Multi-class data stays off: on the
    ManNextWord 40k subset (50k classes) the fit had not finished after 8
    minutes, against 12 s of SCENT training, and no gain was measured there.

    Returns:
      ``(enabled, reason)``; ``reason`` is one line for the log.
    """
    tc = config.get("tree")
    enabled = tree_enabled(tc.enabled) if tc is not None else False
    if enabled is False:
        return False, "config.tree.enabled=False"
    if not sparse_input:
        return False, "dense input features"
    if not head.scores_every_label:
        return False, f"head {head.name!r} does not score every label"
    if enabled is True:
        return True, "config.tree.enabled=True"
    if not has_validation and tree_weight(tc.weight) is None:
        return False, "no validation split to read its weight on"
    if multi_class:
        return False, ("multi-class training data (config.tree.enabled=True "
                       "fits it anyway)")
    if num_labels > tc.max_labels:
        return False, (f"{num_labels} labels > config.tree.max_labels="
                       f"{tc.max_labels}")
    return True, (f"sparse input, {num_labels} labels <= "
                  f"config.tree.max_labels={tc.max_labels}")


def tree_validation_blocks(model, tree_layer, val_data, batch_size: int):
    """Yields ``(deep scores, tree log-scores, labels)`` per block of
    ``val_data`` (normalised): NumPy ``[b, m]`` float32 twice and the
    ``scipy.sparse`` labels, as
    :func:`xmc_tf.label_tree.choose_fusion_weight` takes them; ``b`` is
    ``batch_size`` capped by :func:`xmc_tf.evaluation.score_batch_size`."""
    batch = xevaluation.score_batch_size(batch_size, model)
    for start in range(0, val_data.num_instances, batch):
        part = subset(val_data, np.arange(
            start, min(start + batch, val_data.num_instances)))
        x = next(iter(xdata.make_tf_dataset(part, part.num_instances)))[0]
        yield (model(x, training=False).numpy(), tree_layer(x).numpy(),
               part.labels)


#: The fitted tree, kept in the backup directory until the export is done.
LABEL_TREE_FILE = "label_tree.npz"


def attach_label_tree(config, wd: Workdir, head, model, fit_data, val_data,
                      sparse_input: bool):
    """Fits (or reloads) the label tree and fuses it with ``model``.

    The tree is fit on the (normalised) fit split and saved in the backup
    directory, so a run killed during evaluation or export reloads it; its
    weight is read on the validation split (``config.tree.weight="auto"``:
    :func:`xmc_tf.label_tree.choose_fusion_weight`).

    Returns:
      ``(model_to_export, info, seconds)``: ``model`` itself when the tree
      is off or its weight is 0, else
      :func:`xmc_tf.layers.label_tree.fuse_with_tree` of it; ``info`` is the
      dict for ``metrics.json`` (``{}`` when off; ``fit_seconds``: the fit's,
      also after a reload); ``seconds``: the fit's plus this call's weight
      choice, for ``train_seconds``.
    """
    enabled, why = label_tree_plan(
        config, head, fit_data.num_labels, sparse_input, val_data is not None,
        xconfig.is_multi_class(fit_data.labels))
    if enabled and val_data is None and tree_weight(config.tree.weight) is None:
        enabled, why = False, ("config.tree.weight='auto' and the validation "
                               "split is empty")
    logging.info("label tree: %s (%s)", "on" if enabled else "off", why)
    if not enabled:
        return model, {}, 0.0
    tc = config.tree
    start = time.time()
    path = os.path.join(wd.backup_dir, LABEL_TREE_FILE)
    tree = None
    fit_seconds = None
    if os.path.exists(path):
        with np.load(path) as saved:
            tree = xlabel_tree.LabelTree.from_arrays(saved)
            fit_seconds = float(saved["fit_seconds"])
        if (tree.num_features, tree.num_labels) != (fit_data.num_features,
                                                    fit_data.num_labels):
            tree = None
        else:
            logging.info("label tree: reloaded %s (fit in %.1f s)", path,
                         fit_seconds)
    if tree is None:
        last = [start]

        def progress(line):
            if time.time() - last[0] >= 10:
                last[0] = time.time()
                logging.info(line)
        tree = xlabel_tree.fit_label_tree(
            fit_data.features, fit_data.labels, leaf_size=tc.leaf_size,
            c=float(tc.c), tol=float(tc.tol), threshold=float(tc.threshold),
            seed=config.seed, progress=progress)
        fit_seconds = time.time() - start
        os.makedirs(wd.backup_dir, exist_ok=True)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.savez(f, fit_seconds=fit_seconds, **tree.to_arrays())
    choose_start = time.time()
    layer = LabelTreeScores.from_tree(tree, name="label_tree")
    info = {"columns": tree.num_columns, "weights": int(tree.weights.nnz),
            "depth": int(tree.paths.shape[1]),
            "bytes": xlabel_tree.label_tree_bytes(tree),
            "fit_seconds": round(fit_seconds, 2)}
    weight = tree_weight(tc.weight)
    if weight is None:
        weight, table = xlabel_tree.choose_fusion_weight(
            tree_validation_blocks(model, layer, val_data,
                                   config.eval.batch_size),
            ks=tuple(config.eval.ks))
        info["validation"] = {str(a): {f"P@{k}": round(v, 2)
                                       for k, v in row.items()}
                              for a, row in table.items()}
        logging.info("label tree: weight %s (validation P@k by weight: %s)",
                     weight, "; ".join(
                         f"{a}: " + "/".join(f"{v:.2f}" for v in row.values())
                         for a, row in table.items()))
    info["weight"] = float(weight)
    logging.info("label tree: %d classifiers, %d weights (%.1f MiB), depth "
                 "%d, %.1f s", info["columns"], info["weights"],
                 info["bytes"] / 2**20, info["depth"], fit_seconds)
    seconds = fit_seconds + (time.time() - choose_start)
    if not weight:
        return model, info, seconds
    return fuse_with_tree(model, layer, float(weight)), info, seconds


def check_config(config) -> xheads.Head:
    """Validates the config before anything is read or written.

    A config that leaves fields to the data's label regime
    (:func:`xmc_tf.config.by_regime`, value None) is checked as it would be
    resolved for multi-label and for multi-class training labels
    (:func:`resolve_config` fills them in once the labels are read).

    Returns:
      The :class:`xmc_tf.heads.Head` that ``config.model.head`` names
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
                ("model.encoder", config.model.encoder, ENCODERS),
                ("model.intermediate_activation",
                 config.model.intermediate_activation,
                 INTERMEDIATE_ACTIVATIONS)):
            if value not in allowed:
                raise ValueError(f"config.{field}={value!r}; expected one of "
                                 f"{allowed}")
        _check_int("model.ensemble_size", config.model.ensemble_size, 1)
        size = config.model.ensemble_size
        if size > 1 and not head.scores_every_label:
            raise ValueError(
                f"config.model.ensemble_size={size} needs a head that scores "
                f"every label; head {head.name!r} does not (use 1)")
        _check_int("model.wide_connections", config.model.wide_connections, 0)
        if config.model.wide_max_mib is not None:
            _check_int("model.wide_max_mib", config.model.wide_max_mib, 0)
        for name in ("input_dropout", "dropout", "intermediate_dropout"):
            rate = config.model[name]
            if not (_is_number(rate) and 0.0 <= rate < 1.0):
                raise ValueError(f"config.model.{name}={rate!r} must be in "
                                 "[0, 1)")
        if tc.optimizer == "lazy_adamw":
            _check_nonnegative("train.weight_decay", tc.weight_decay)
        if tc.min_delta is not None:
            _check_nonnegative("train.min_delta", tc.min_delta)
        _check_tree(config, head)
        frac = config.data.validation_fraction
        if not 0.0 <= frac < 1.0:
            raise ValueError(f"config.data.validation_fraction={frac!r} must "
                             "be in [0, 1)")
        if not config.data.train:
            raise ValueError("config.data.train is empty; set "
                             "--config.data.train=FILE")
    except (ValueError, KeyError, AttributeError, TypeError) as e:
        raise ConfigError(" ".join(str(e).split()).strip("'\"")) from e
    if tc.tensorboard and importlib.util.find_spec("tensorboard") is None:
        raise ConfigError("config.train.tensorboard=True needs the tensorboard "
                          "package: pip install 'tensorboard~=2.21.0'")
    return head


def load_data(config, workdir: str):
    """Reads train/test (raw feature values) and saves the PSP weights
    (``inv_propensities.npy``, from all training labels, as the XC repo
    computes them) in ``workdir``.  The feature normalisation is fitted
    later, on the fit split only (:func:`prepare_splits`).

    Returns:
      ``(train, test_or_None, inv_propensities)``.

    Raises:
      DataError: unreadable or malformed files (file and line named), or
        train and test of different widths.
    """
    dc = config.data
    train = xprep.load_spec(dc.train, "config.data.train")
    test = xprep.load_spec(dc.test, "config.data.test") if dc.test else None
    if test is not None and (test.num_labels != train.num_labels or
                             test.num_features != train.num_features):
        raise DataError(
            f"config.data.train={dc.train!r} ({train.num_features} features, "
            f"{train.num_labels} labels) and config.data.test={dc.test!r} "
            f"({test.num_features}, {test.num_labels}) disagree")
    inv_prop = xmetrics.inverse_propensities(
        train.labels, A=config.eval.propensity_a, B=config.eval.propensity_b)
    with atomic_path(Workdir(workdir).file(INV_PROPENSITIES_FILE)) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, inv_prop)
    return train, test, inv_prop


def resolve_config(config, train: xdata.XCDataset):
    """Fills in the fields that ``config`` leaves to the data's label
    regime (:func:`xmc_tf.config.by_regime`; the astra / lsh configs'
    network and schedule) from the raw training labels, logging one line
    per field.

    Multi-class labels (every instance at most one label,
    :func:`xmc_tf.config.is_multi_class`) take
    :data:`xmc_tf.config.MULTI_CLASS_DEFAULTS`, multi-label ones the head's
    schema defaults; values the config sets are kept.

    Args:
      config: the job config (checked by :func:`check_config`).
      train: the raw training set (:func:`load_data`).

    Returns:
      ``(run_config, regime)``: the config the run trains with (``config``
      itself when nothing is left to the data) and ``{"labels":
      "multi-class" | "multi-label", "fields": {field: value}}`` (JSON
      values; ``{}`` when nothing is left to the data), which the
      checkpoint and ``metrics.json`` keep.
    """
    if not xconfig.unresolved_fields(config):
        return config, {}
    multi_class = xconfig.is_multi_class(train.labels)
    labels = "multi-class" if multi_class else "multi-label"
    values = xconfig.regime_values(config, multi_class)
    for field, value in values.items():
        logging.info("config.%s=%r: chosen for %s training labels (left to "
                     "the data's regime; docs/defaults.md)", field, value,
                     labels)
    regime = {"labels": labels,
              "fields": json.loads(json.dumps(values, sort_keys=True))}
    return xconfig.resolve_regime(config, multi_class), regime


def prepare_splits(config, train: xdata.XCDataset, workdir: str):
    """Splits the raw training set (:func:`validation_split`), fits the
    feature normalisation on the fit part only (``"auto"`` resolved there:
    :func:`xmc_tf.data.resolve_normalization`; idf from the fit rows),
    saves it (``preprocessing.npz``) and normalises both parts.

    Returns:
      ``(fit_data, val_data_or_None, normalization)``: normalised data
      sets and the :class:`xmc_tf.preprocessing.Normalization`.

    Raises:
      ConfigError: an unknown ``config.data.normalize``.
    """
    fit_raw, val_raw = validation_split(train, config)
    try:
        norm = xprep.fit_normalization(config.data.normalize, fit_raw)
    except ValueError as e:
        raise ConfigError(f"config.data.normalize: {e}") from e
    if norm.sparse and config.data.normalize == "auto":
        logging.info("config.data.normalize='auto': %s (the training "
                     "features are %s)", norm.method,
                     "whole numbers" if norm.method == "tfidf" else "weights")
    xprep.save(norm, workdir)
    fit_data = xprep.normalize(fit_raw, norm)
    val_data = xprep.normalize(val_raw, norm) if val_raw is not None else None
    return fit_data, val_data, norm


def build_and_compile(config, head, num_features: int, num_labels: int,
                      sparse_input: bool, distributed: bool = False):
    """Builds the model and compiles the model that ``fit`` runs.

    The optimizer is the head's own (``head.make_optimizer()``, e.g.
    SCENT's row-sparse momentum) or :func:`xmc_tf.job.build.build_optimizer`
    (``config.train.optimizer``); the caller has run ``head.prepare`` on the
    training data.  Heads that train through a wrapper
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
        model = build_model(config, num_features, num_labels, sparse_input,
                            head)
    except ValueError as e:
        raise ConfigError(" ".join(str(e).split())) from e
    layer = xheads.output_layer(model)
    head.initialize(layer, model)  # e.g. the prior bias; a resume restores over it
    try:
        optimizer = head.make_optimizer() or build_optimizer(config)
    except ValueError as e:
        raise ConfigError(" ".join(str(e).split())) from e
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
    :data:`xmc_tf.evaluation.SCORE_BLOCK_BYTES`: at 670k labels 64 rows
    (the default training batch) instead of 100, so that validation holds
    no more than a training step.

    Args:
      eval_batch_size: ``config.eval.batch_size`` (>= 1).
      train_batch_size: ``config.train.batch_size`` (>= 1).
      model: the model whose output is scored (as for
        :func:`xmc_tf.evaluation.score_batch_size`).

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
    released = (_variable_bytes(optimizer.variables)
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


class StopOnNonFinite(keras.callbacks.Callback):
    """Stops a run whose training loss is NaN or +-inf, with a clear error.

    Keras' ``TerminateOnNaN`` stops quietly, after which the job would export
    and evaluate a broken model.  This raises :class:`TrainingDiverged`
    instead, before the epoch's checkpoint is written (the job's
    :class:`~xmc_tf.checkpoint.Checkpointer` runs after it), so the workdir
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
                "loss options) and rerun with --overwrite")

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
    one small broadcast per epoch (:meth:`xmc_tf.distribute.Cluster.broadcast_json`),
    made by every worker.

    Args:
      cluster: this process's :class:`xmc_tf.distribute.Cluster`.
    """

    def __init__(self, cluster: xdist.Cluster):
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
                   cluster: xdist.Cluster | None = None) -> list:
    """:class:`StopOnNonFinite`, then the head's own callbacks (SET,
    held-out P@k, ...), so their epoch logs reach the rest (in a
    multi-worker ``cluster``, replaced by the chief's: :class:`ChiefLogs`); then LR halving
    and early stopping on the head's monitor (val P@3 when a validation split exists), both with
    state that survives a resume (:mod:`xmc_tf.checkpoint`; the best
    weights on disk in ``workdir/backup``, not in memory), and
    TensorBoard.  The :class:`~xmc_tf.checkpoint.Checkpointer` (which also
    writes ``history.csv``) is appended by the caller, last."""
    tc = config.train
    monitor, mode = head.monitor(val_data is not None)
    # An epoch counts as progress only if the monitor moves by
    # config.train.min_delta, so a run whose metric creeps ends by itself
    # (None: Keras' defaults, 1e-4 for the schedule and 0 for stopping).
    deltas = ({"lr": 1e-4, "stop": 0.0} if tc.min_delta is None else
              {"lr": float(tc.min_delta), "stop": float(tc.min_delta)})
    cbs = [StopOnNonFinite()] + head.callbacks(layer, val_data)
    if cluster is not None and cluster.multi_worker:
        cbs.append(ChiefLogs(cluster))
    cbs += [
        xcallbacks.ReduceLROnPlateau(
            monitor=monitor, mode=mode, factor=0.5, patience=tc.lr_patience,
            min_lr=tc.min_learning_rate, min_delta=deltas["lr"], verbose=1),
        xcallbacks.EarlyStopping(
            monitor=monitor, mode=mode, patience=tc.early_stopping_patience,
            min_delta=deltas["stop"], restore_best_weights=True, verbose=1,
            best_weights_dir=Workdir(workdir).backup_dir),
    ]
    if tc.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(os.path.join(workdir,
                                                            "tensorboard")))
    return cbs


# ---------------------------------------------------------------------------
# Resume.


def _resume_config(config) -> dict:
    out = json.loads(config.to_json_best_effort(sort_keys=True))
    for key in RESUME_MAY_CHANGE:
        section, field = key.split(".")
        out.get(section, {}).pop(field, None)
    return out


def _flat(d, prefix=""):
    for k, v in d.items():
        if isinstance(v, dict):
            yield from _flat(v, f"{prefix}{k}.")
        else:
            yield f"{prefix}{k}", v


_MISSING = object()


def config_changes(saved: dict, config) -> list:
    """What differs between a run's saved config (``config.json``, the
    backup's) and ``config``, fields of :data:`RESUME_MAY_CHANGE` aside.

    A field the saved config lacks is no change: it was written by an
    xmc_tf from before the field joined the schema (:mod:`xmc_tf.config`),
    whose run read the code's fallback for it; such fields are logged.

    Returns:
      ``["config.K=SAVED (now NOW)", ...]``, sorted; empty if none.
    """
    a, b = dict(_flat(saved)), dict(_flat(_resume_config(config)))
    for key in RESUME_MAY_CHANGE:
        a.pop(key, None)
    older = sorted(set(b) - set(a))
    if older:
        logging.info("the saved config predates the fields %s; taken as "
                     "their current values", ", ".join(older))
    return [f"config.{k}={a.get(k)!r} (now {b.get(k)!r})"
            for k in sorted(a) if a[k] != b.get(k, _MISSING)]



def _check_resumable(ckpt: xckpt.Checkpoint, config) -> None:
    diff = config_changes(ckpt.meta.get("config", {}), config)
    if not diff:
        return
    raise CheckpointError(
        f"the backup {ckpt.path} belongs to a run with another config: "
        f"{', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}; rerun with "
        f"that config to resume, or {discard_hint(os.path.dirname(ckpt.path))}")


# ---------------------------------------------------------------------------
# The job.


def train_and_evaluate(config, workdir: str, *, overwrite: bool = False,
                       force: bool = False, callbacks=(),
                       strategy=None) -> dict:
    """Runs the main job; see the module docstring.

    Holds the workdir lock throughout.  If ``workdir/backup`` holds a
    checkpoint of an unfinished run with the same config, the run resumes
    from it exactly (weights, optimizer, callback states, epoch, seconds,
    history); a finished workdir is refused unless ``overwrite``.

    Under a ``tf.distribute`` ``strategy`` (:func:`xmc_tf.distribute.make_strategy`)
    the model is trained data parallel (:func:`fit_and_export`); only the
    chief (:class:`xmc_tf.distribute.Cluster`) locks and writes ``workdir``.
    The other workers of a multi-worker run write nothing there: they
    receive the chief's backup (so a resumed run restores the same state
    everywhere), keep their own checkpoints in a temporary directory that
    is deleted when they return, and wait until the chief has evaluated and
    exported the model.

    Args:
      config: ml_collections ConfigDict (see ``configs/uniform_sparse.py``).
      workdir: output directory (created; on the chief only).
      overwrite: retrain into a workdir that holds a finished run (its
        results, history and backup are deleted first).
      force: take over a stale workdir lock
        (:class:`xmc_tf.workdir.WorkdirLock`).
      callbacks: extra Keras callbacks, run after the job's own and before
        the checkpointer (their ``get_state``/``set_state`` are
        checkpointed too).
      strategy: None (one process, one device) or the
        ``tf.distribute.Strategy`` to train under, created before TensorFlow
        ran any op.

    Returns:
      The metrics dict also written to ``workdir/metrics.json``: ``P@k``,
      ``nDCG@k``, ``PSP@k``, ``R@k`` (percent), ``train_seconds`` and
      ``epochs`` (summed over all processes of a resumed run),
      ``num_labels``, ``peak_memory_bytes`` (peak RSS, bytes, the largest
      of the run's processes), ``output_layer_bytes`` and ``model_bytes``
      (variables of the head / of the whole model, bytes), the data set
      sizes, for MACH ``num_buckets`` and ``num_repetitions``, under a
      strategy ``strategy`` / ``num_workers`` / ``num_replicas``, and
      ``run`` (the completion marker: run id, finish time, resumes,
      fingerprints of the model files).  A non-chief worker returns the
      chief's dict (it wrote no file).

    Raises:
      ConfigError: a bad config value, or one that the strategy cannot
        train (:func:`check_strategy`).
      DataError: unreadable or inconsistent data files.
      WorkdirBusy: another process holds the workdir lock.
      WorkdirFinished: the workdir holds a finished run (no ``overwrite``).
      CheckpointError: an unreadable backup, or one of another config.
      DistributeError: (multi-worker) the chief stopped with an error,
        workers run with different configs or data, or a worker lost
        contact with the others.
    """
    head = check_config(config)
    cluster = xdist.Cluster(strategy)
    if strategy is not None:
        check_strategy(config, head, cluster)
    try:
        if not cluster.is_chief:
            return _worker_job(config, head, list(callbacks), cluster)
        return _chief_job(config, workdir, head, list(callbacks), cluster,
                          overwrite=overwrite, force=force)
    except Exception as e:
        lost = _lost_contact(e) if cluster.multi_worker else None
        if lost is None:
            raise
        raise DistributeError(
            f"{cluster.name} lost contact with the other workers ({lost}); "
            "rerun the same command on every worker: the run resumes from "
            "the chief's backup") from e


def _lost_contact(error) -> str | None:
    """The gist of a collective-op error from a worker that went away
    (TensorFlow's health check aborts the pending all-reduce), else None."""
    import tensorflow as tf
    if not isinstance(error, (tf.errors.UnavailableError,
                              tf.errors.DeadlineExceededError,
                              tf.errors.CancelledError)):
        return None
    # TensorFlow's message: "Graph execution error:", "Detected at node
    # ... defined at", indented stack lines, then the cause ("Socket
    # closed", "... is down"), then gRPC details.
    skip = ("Graph execution error", "Detected at node", "Additional GRPC",
            ":UNKNOWN:", "The error could be", "[[")
    lines = [line.strip() for line in
             str(getattr(error, "message", error)).splitlines()
             if line.strip() and not line[:1].isspace()
             and not line.strip().startswith(skip)]
    text = " ".join((lines[0] if lines else type(error).__name__).split())
    return text[:200]


def check_strategy(config, head, cluster: xdist.Cluster) -> None:
    """Checks that ``config`` can be trained data parallel.

    Args:
      config: the job config (checked by :func:`check_config`).
      head: its :class:`xmc_tf.heads.Head`.
      cluster: the :class:`xmc_tf.distribute.Cluster` of the strategy
        (``num_replicas`` is read).

    Raises:
      ConfigError: ``config.model.ensemble_size > 1`` (members are trained
        one process at a time), a head that cannot be trained data parallel
        (:attr:`xmc_tf.heads.Head.data_parallel`), or
        ``config.train.batch_size`` not a multiple of the replicas (the
        global batch is split evenly over them).
    """
    replicas = cluster.num_replicas
    batch_size = config.train.batch_size  # None: by regime, checked later
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
    if batch_size is not None and batch_size % replicas:
        raise ConfigError(
            f"config.train.batch_size={batch_size} must be a "
            f"multiple of the {replicas} replicas of the strategy (the global "
            "batch is split evenly over them)")


def _chief_job(config, workdir, head, callbacks, cluster, *, overwrite,
               force) -> dict:
    """The job of the chief (or the only process): lock and prepare the
    workdir, tell the other workers whether and from what to resume, train,
    evaluate and export, and tell them the outcome."""
    wd = Workdir(workdir)
    with contextlib.ExitStack() as stack:
        try:
            lock = stack.enter_context(wd.lock(force=force))
            if lock.previous_owner:
                logging.warning("workdir %s: the previous run (pid %s) ended "
                                "without releasing its lock", workdir,
                                lock.previous_owner.get("pid"))
            wd.prepare_training(overwrite)
            if config.model.ensemble_size > 1:
                return _run_ensemble(config, wd, overwrite=overwrite,
                                     force=force, callbacks=callbacks)
            ckpt = xckpt.load(wd.backup_dir)
            if ckpt is not None:
                _check_resumable(ckpt, config)
        except BaseException as e:
            cluster.broadcast_json({"error": _one_line(e)})
            raise
        names = (sorted(n for n in os.listdir(wd.backup_dir)
                        if not n.startswith(".") and
                        os.path.isfile(os.path.join(wd.backup_dir, n)))
                 if ckpt is not None else [])
        cluster.broadcast_json({"error": None})
        cluster.check_same("config", _config_dict(config))
        cluster.broadcast_files(wd.backup_dir, names)
        trained = fit_and_export(config, wd, head, ckpt, callbacks, cluster)
        try:
            metrics = trained()
        except BaseException as e:
            cluster.broadcast_json({"error": _one_line(e)})
            raise
        cluster.broadcast_json({"metrics": metrics})
        return metrics


def _worker_job(config, head, callbacks, cluster) -> dict:
    """The job of a non-chief worker: train beside the chief from the
    chief's backup, in a temporary directory (nothing in the workdir), then
    wait for the chief's evaluation and export."""
    with tempfile.TemporaryDirectory(
            prefix=f"xmc-tf-worker{cluster.index}-") as tmp:
        wd = Workdir(tmp)
        start = cluster.broadcast_json()
        if start["error"] is not None:
            raise DistributeError(f"the chief (worker 0) stopped: "
                                  f"{start['error']}")
        cluster.check_same("config", _config_dict(config))
        names = cluster.broadcast_files(wd.backup_dir)
        ckpt = xckpt.load(wd.backup_dir) if names else None
        fit_and_export(config, wd, head, ckpt, callbacks, cluster)
        logging.info("%s: trained; waiting for the chief (worker 0) to "
                     "evaluate and export the model", cluster.name)
        done = cluster.broadcast_json()
        if "error" in done:
            raise DistributeError(f"the chief (worker 0) stopped after "
                                  f"training: {done['error']}")
        return done["metrics"]


def _config_dict(config) -> dict:
    """Every field of ``config`` (workers must agree on all of them:
    ``train.epochs`` too, which a resume may change)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


def fit_and_export(config, wd: Workdir, head, ckpt, extra_callbacks,
                   cluster: xdist.Cluster | None = None):
    """Trains the model (resuming from ``ckpt``) and returns the function
    that evaluates and exports it.

    Every worker of a data-parallel run calls this with the same config:
    the model, its optimizer and the restored state are created under
    ``cluster.strategy.scope()``, the training and validation batches are
    split over the replicas (:func:`xmc_tf.data.distribute_tf_dataset`: the
    union of the replicas' step-``i`` batches is the one-process batch
    ``i``), and the epoch logs are the chief's (:class:`ChiefLogs`).  Each
    worker writes ``wd`` (a temporary directory off the chief).

    Args:
      config: the job config (checked).
      wd: the :class:`~xmc_tf.workdir.Workdir` this process writes.
      head: the config's :class:`xmc_tf.heads.Head`.
      ckpt: the :class:`xmc_tf.checkpoint.Checkpoint` to resume from, or
        None.
      extra_callbacks: the caller's callbacks.
      cluster: the :class:`xmc_tf.distribute.Cluster`; None: one process.

    Returns:
      On the chief, a function of no arguments that evaluates the model
      on the test set, exports it to ``wd`` and writes ``metrics.json``
      (returning its dict); elsewhere None.
    """
    cluster = cluster or xdist.Cluster()
    strategy = cluster.strategy

    def scope():  # (a strategy's scope object is entered once)
        return (strategy.scope() if strategy is not None
                else contextlib.nullcontext())

    keras.utils.set_random_seed(config.seed)
    train, test, inv_prop = load_data(config, wd.path)
    logging.info("train: %s; test: %s", train, test)
    cluster.check_same("data", {
        "train": [train.num_instances, train.num_features, train.num_labels],
        "test": [test.num_instances, test.num_features, test.num_labels]
        if test is not None else None})
    # config.json and the checkpoint's config are the config as given (a
    # resume and an ensemble's members are checked against it); the values
    # the data chose are kept beside it (meta / metrics.json "regime").
    write_bytes_atomic(wd.file(Workdir.CONFIG),
                       config.to_json_best_effort(indent=2).encode())
    given = config
    config, regime = resolve_config(given, train)
    if regime:
        head = check_config(config)
        if strategy is not None:
            check_strategy(config, head, cluster)
    if ckpt is not None and ckpt.meta.get("regime", {}) != regime:
        raise CheckpointError(
            f"the backup {ckpt.path} was trained with "
            f"{ckpt.meta.get('regime', {}).get('fields', {})} chosen from "
            f"its training labels, this run's labels give "
            f"{regime.get('fields', {})} (config.data.train changed?); "
            f"{discard_hint(os.path.dirname(ckpt.path))}")
    tc = config.train

    fit_data, val_data, norm = prepare_splits(config, train, wd.path)
    num_train, train_is_sparse = train.num_instances, train.is_sparse
    del train  # the raw copy; fit_data / val_data are normalised ones

    try:
        head.prepare(fit_data)  # e.g. SCENT sizes its per-instance duals
    except ValueError as e:
        raise DataError(" ".join(str(e).split())) from e
    with scope():
        model, layer, fit_model = build_and_compile(
            config, head, fit_data.num_features, fit_data.num_labels,
            train_is_sparse, distributed=strategy is not None)
    model.summary(print_fn=logging.info)
    cbs = make_callbacks(config, wd.path, head, layer, val_data, cluster)
    cbs += extra_callbacks
    stateful = xckpt.stateful_objects(cbs, fit_model)
    meta = {"run_id": Workdir.new_run_id(), "resumes": 0,
            "config": _resume_config(given), "train_epochs": tc.epochs,
            "regime": regime}
    if ckpt is not None:
        m = ckpt.meta
        if m.get("train_epochs", tc.epochs) != tc.epochs:
            logging.warning("resuming with config.train.epochs=%d (the "
                            "interrupted run had %d)", tc.epochs,
                            m["train_epochs"])
        meta.update(run_id=m["run_id"], resumes=m["resumes"] + 1,
                    history=m["history"], train_seconds=m["train_seconds"],
                    peak_memory_bytes=m["peak_memory_bytes"])
    checkpointer = xckpt.Checkpointer(wd.backup_dir, stateful,
                                      wd.file(Workdir.HISTORY), meta)
    initial_epoch, last_epoch = 0, tc.epochs
    if ckpt is not None:
        with scope():  # the optimizer's variables, if it builds them here
            xckpt.restore(ckpt, fit_model, stateful)
        xckpt.write_history_csv(wd.file(Workdir.HISTORY), checkpointer.history)
        initial_epoch = ckpt.meta["epochs_done"]
        if ckpt.meta["stopped"]:
            last_epoch = initial_epoch
        logging.info("resuming run %s from %s: %d epochs done (%s)",
                     meta["run_id"], ckpt.path, initial_epoch,
                     ckpt.meta["phase"])

    if ckpt is None or ckpt.meta["phase"] != "trained":
        steps = math.ceil(fit_data.num_instances / tc.batch_size)
        # One stream of epochs keyed by (seed, epoch): a resumed run sees
        # the batches an uninterrupted one sees (under a strategy, split
        # over the replicas).
        train_kwargs = dict(shuffle=True, seed=config.seed, repeat=True,
                            first_epoch=initial_epoch,
                            **head.dataset_kwargs())
        # Keras' validation scores [batch, m] beside the optimizer state:
        # blocks no wider than a training batch's (validation_batch_size;
        # per replica).
        val_batch = validation_batch_size(config.eval.batch_size,
                                          tc.batch_size, model)
        if strategy is None:
            train_ds = xdata.make_tf_dataset(fit_data, tc.batch_size,
                                             **train_kwargs)
            val_ds = (xdata.make_tf_dataset(val_data, val_batch)
                      if val_data is not None else None)
        else:
            train_ds = xdata.distribute_tf_dataset(
                strategy, fit_data, tc.batch_size, **train_kwargs)
            val_ds = (xdata.distribute_tf_dataset(
                strategy, val_data, val_batch * cluster.num_replicas)
                      if val_data is not None else None)
        fit_model.fit(train_ds, validation_data=val_ds,
                      steps_per_epoch=steps, initial_epoch=initial_epoch,
                      epochs=max(last_epoch, initial_epoch),
                      shuffle=False,  # make_tf_dataset shuffles per epoch
                      callbacks=cbs + [checkpointer], verbose=tc.verbose)
    if not cluster.is_chief:
        return None

    def evaluate_and_export() -> dict:
        # Training is over and checkpointed: the optimizer's moments are
        # not needed for evaluation and export (nor wanted in model.keras).
        released = release_optimizer(fit_model)
        if released:
            logging.info("released the optimizer state (%.2f GiB) before "
                         "evaluation and export", released / 2**30)
        # The exported model takes the raw features (normalisation inside),
        # and the test metrics are computed through it.
        scorer, tree_info, tree_seconds = attach_label_tree(
            config, wd, head, model, fit_data, val_data, train_is_sparse)
        exported = xprep.with_normalization(scorer, norm)
        results = {}
        if test is not None:
            results = evaluate_model(exported, test, inv_prop,
                                     tuple(config.eval.ks),
                                     config.eval.batch_size)
        results.update({
            # the label tree's fit and weight choice included
            "train_seconds": round(checkpointer.train_seconds + tree_seconds,
                                   2),
            "epochs": len(checkpointer.history),
            "num_labels": fit_data.num_labels,
            "num_features": fit_data.num_features,
            "num_train_instances": num_train,
            "num_test_instances": test.num_instances if test is not None
            else 0,
            "output_layer_bytes": output_layer_bytes(model),
            "model_bytes": model_bytes(model),
            "head": config.model.head,
        })
        if regime:
            results["regime"] = regime
        if strategy is not None:
            results.update(strategy=cluster.kind,
                           num_workers=cluster.num_workers,
                           num_replicas=cluster.num_replicas)
        results.update(head.results(layer))
        if tree_info:
            results["label_tree"] = tree_info
        export_model(exported, wd.path, k=max(config.eval.ks))
        results["peak_memory_bytes"] = checkpointer.peak_memory_bytes
        metrics = wd.mark_complete(results, meta["run_id"],
                                   resumes=meta["resumes"])
        # The backup goes only now that the export is complete.
        shutil.rmtree(wd.backup_dir, ignore_errors=True)
        return metrics

    return evaluate_and_export


# ---------------------------------------------------------------------------
# Ensembles.

#: Sub-directory of an ensemble's workdir holding one workdir per member.
MEMBERS_DIR = "members"


def member_config(config, index: int):
    """The config of ensemble member ``index`` (0-based): ``config`` with
    ``seed = config.seed + index``, the ensemble's validation split
    (``data.split_seed``, default ``config.seed``) and ``ensemble_size 1``.

    Members differ only in their random streams (initial weights, SET
    draws, batch order), as in deep ensembles (Lakshminarayanan et al.,
    NeurIPS 2017); sharing the split keeps the ensemble's validation
    metrics clean."""
    member = copy.deepcopy(config)
    split_seed = config.data.split_seed
    member.seed = int(config.seed) + int(index)
    member.data.split_seed = int(config.seed if split_seed is None
                                 else split_seed)
    member.model.ensemble_size = 1
    return member


def _check_member(member_wd: Workdir, config) -> dict:
    """The metrics of a finished member workdir, after checking that it
    was trained with ``config`` (fields of :data:`RESUME_MAY_CHANGE`
    aside).

    Raises:
      ConfigError: the member was trained with another config.
      IncompleteWorkdir: its model files do not match its metrics.json.
    """
    metrics = member_wd.check_complete()
    try:
        with open(member_wd.file(Workdir.CONFIG)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = None
    if saved is None or config_changes(saved, config):
        raise ConfigError(
            f"ensemble member {member_wd.path} was trained with another "
            "config; rerun with that config, or pass --overwrite to retrain "
            "every member")
    return metrics


def _run_ensemble(config, wd: Workdir, *, overwrite: bool, force: bool,
                  callbacks: list) -> dict:
    """Trains ``config.model.ensemble_size`` members one after the other,
    each a complete run of its own in ``WORKDIR/members/<i>`` (so a killed
    ensemble resumes inside the member it was training, and finished
    members are not retrained), then exports the model that averages their
    scores (:func:`xmc_tf.ensemble.average_scores`) with its validation
    and test metrics; ``metrics.json`` also lists each member's."""
    n = int(config.model.ensemble_size)
    members_dir = wd.file(MEMBERS_DIR)
    if overwrite:
        shutil.rmtree(members_dir, ignore_errors=True)
    member_metrics, member_dirs = [], []
    for i in range(n):
        mc = member_config(config, i)
        mdir = os.path.join(members_dir, str(i))
        mwd = Workdir(mdir)
        if mwd.completion() is not None:
            metrics = _check_member(mwd, mc)
            logging.info("ensemble member %d/%d (seed %d) already trained in "
                         "%s", i + 1, n, mc.seed, mdir)
        else:
            logging.info("ensemble member %d/%d (seed %d): training in %s",
                         i + 1, n, mc.seed, mdir)
            metrics = train_and_evaluate(mc, mdir, force=force,
                                         callbacks=callbacks)
        member_metrics.append(metrics)
        member_dirs.append(mdir)
        keras.backend.clear_session()  # the member's graphs and variables

    keras.utils.set_random_seed(config.seed)
    train, test, inv_prop = load_data(config, wd.path)
    write_bytes_atomic(wd.file(Workdir.CONFIG),
                       config.to_json_best_effort(indent=2).encode())
    config, regime = resolve_config(config, train)  # as each member did
    # Members share the split (and so the normalisation, inside each
    # member's model): the raw validation rows are theirs too.
    _, val_data = validation_split(train, member_config(config, 0))
    with atomic_path(wd.file(PREPROCESSING_FILE)) as tmp:
        shutil.copyfile(os.path.join(member_dirs[0], PREPROCESSING_FILE), tmp)
    model = xensemble.average_scores(
        [xsaving.load_model(d) for d in member_dirs])
    ks, batch = tuple(config.eval.ks), config.eval.batch_size
    results = {}
    if val_data is not None:
        val = evaluate_model(model, val_data, None, ks, batch)
        results.update({f"val_{k}": v for k, v in val.items() if "@" in k})
    if test is not None:
        results.update(evaluate_model(model, test, inv_prop, ks, batch))
    results.update({
        "train_seconds": round(sum(m["train_seconds"]
                                   for m in member_metrics), 2),
        "epochs": sum(m["epochs"] for m in member_metrics),
        "num_labels": train.num_labels,
        "num_features": train.num_features,
        "num_train_instances": train.num_instances,
        "num_test_instances": test.num_instances if test is not None else 0,
        "output_layer_bytes": sum(m["output_layer_bytes"]
                                  for m in member_metrics),
        "model_bytes": model_bytes(model),
        "head": config.model.head,
        "ensemble_size": n,
        **({"regime": regime} if regime else {}),
        "members": {str(i): {k: v for k, v in m.items()
                             if k in ("P@1", "P@3", "P@5", "train_seconds",
                                      "epochs")}
                    for i, m in enumerate(member_metrics)},
    })
    export_model(model, wd.path, k=max(ks))
    results["peak_memory_bytes"] = max(
        [peak_memory_bytes()] + [m.get("peak_memory_bytes", 0)
                                 for m in member_metrics])
    return wd.mark_complete(results, Workdir.new_run_id(), resumes=0)
