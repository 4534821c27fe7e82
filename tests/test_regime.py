"""Fields left to the data's label regime (xmc_tf.config.by_regime).

The astra and lsh configs leave their network and schedule to the training
labels: multi-class labels take configs/scent.py's values (the reference
here is that config file, read independently of
``xmc_tf.config.MULTI_CLASS_DEFAULTS``), multi-label ones the sampled head's
schema defaults (``xmc_tf.config.base("sampled")``).  An explicit value is
kept; a resumed run resolves the same values, and a backup whose labels
resolved otherwise is refused.
"""

import json

import keras
import numpy as np
import pytest

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import plan as xplan
from xmc_tf.job import checks as xchecks
from xmc_tf.job import resume as xresume
from xmc_tf.job import run as xrun
from xmc_tf.errors import CheckpointError

FIELDS = ("data.normalize", "data.validation_fraction", "model.encoder_dims",
          "model.intermediate_dim", "model.dropout", "model.sampled_layer",
          "train.batch_size", "train.learning_rate",
          "train.min_learning_rate", "train.early_stopping_patience")


def _value(config, field):
    section, name = field.split(".")
    return config[section][name]


def _toy(labels_per_instance, seed=1):
    return xdata.make_synthetic(300, 60, 30,
                                labels_per_instance=labels_per_instance,
                                seed=seed)


@pytest.mark.parametrize("name", ["astra", "lsh"])
def test_multi_class_labels_take_scents_network(name):
    train = _toy(1)
    assert np.diff(train.labels.indptr).max() == 1  # the toy is multi-class
    config = xconfig.get_config(name)
    run, regime = xplan.resolve_config(config, train)
    scent = xconfig.get_config("scent")
    for field in FIELDS:
        assert _value(run, field) == _value(scent, field), field
        assert _value(config, field) is None  # the given config is unchanged
    assert regime["labels"] == "multi-class"
    # the regime's fields, and the automatic fields the config spells "auto"
    assert set(FIELDS) <= set(regime["fields"])
    assert set(regime["fields"]) - set(FIELDS) <= set(xplan.automatic_fields())
    assert not any(xplan.is_auto(v) for v in regime["fields"].values())
    assert regime["fields"]["model.encoder_dims"] == [512]
    # the rest of the config is the given one
    assert run.sampler.kind == config.sampler.kind
    assert run.loss == ("softmax" if config.loss == "auto" else config.loss)


@pytest.mark.parametrize("name", ["astra", "lsh"])
def test_multi_label_labels_keep_the_heads_defaults(name):
    train = _toy(3)
    assert np.diff(train.labels.indptr).max() > 1
    run, regime = xplan.resolve_config(xconfig.get_config(name), train)
    schema = xconfig.base("sampled")
    for field in FIELDS:
        if field == "data.normalize":  # "auto" in the schema: counts here
            assert _value(run, field) == "tfidf"
            continue
        assert _value(run, field) == _value(schema, field), field
    assert (run.model.encoder_dims, run.model.intermediate_dim,
            run.train.batch_size, run.model.sampled_layer) == (
                (1024,), 4096, 64, "uniform_sparse")
    assert regime["labels"] == "multi-label"


def test_explicit_values_are_kept_from_the_command_line():
    """``--config.model.encoder_dims=(64,)`` parses with the field's type
    (as ``xmc-tf train`` parses it) and survives the resolution; the other
    fields are still chosen."""
    from xmc_tf_cli import cli
    argv = cli._with_config_file([  # pylint: disable=protected-access
        "xmc-tf", "train", "--config=astra",
        "--config.model.encoder_dims=(64,)", "--config.train.batch_size=32",
        "--config.model.sampled_layer=uniform_sparse"])
    fv = cli._define_flags(argv)  # pylint: disable=protected-access
    cli._parse(fv, argv, cli._config_arg(argv))  # pylint: disable=protected-access
    config = fv.config
    assert config.model.encoder_dims == (64,)
    assert xconfig.unresolved_fields(config) == tuple(
        f for f in FIELDS if f not in ("model.encoder_dims",
                                       "train.batch_size",
                                       "model.sampled_layer"))
    run, regime = xplan.resolve_config(config, _toy(1))
    assert (run.model.encoder_dims, run.train.batch_size,
            run.model.sampled_layer) == ((64,), 32, "uniform_sparse")
    assert run.model.intermediate_dim == 0 and run.train.learning_rate == 1e-2
    assert "model.encoder_dims" not in regime["fields"]


def test_a_config_without_automatic_fields_is_returned_as_is():
    config = xconfig.get_config("scent")
    config.data.normalize, config.tree.enabled = "l2", False
    config.centroids.enabled = False
    config.neighbours.enabled = False
    config.shortlist.enabled = False
    config.tree.rankers = "linear"
    config.train.monitor = "network"
    run, regime = xplan.resolve_config(config, _toy(1))
    assert run is config and regime == {}


@pytest.mark.parametrize("labels_per_instance", [1, 3])
def test_every_automatic_field_is_resolved_once_from_the_data(
        labels_per_instance):
    """The one resolver: no "auto" (or None) is left in the run's config,
    each value is the component's own rule on the data (NumPy checks)."""
    from xmc_tf.job.samplers import sampler_sizes
    from xmc_tf.samplers.lsh import lsh_auto_K
    train = _toy(labels_per_instance)
    multi_class = labels_per_instance == 1
    for name in xconfig.names():
        config = xconfig.get_config(name)
        run, regime = xplan.resolve_config(config, train)
        leaves = xconfig.flat_fields(json.loads(run.to_json_best_effort()))
        left = [f for f, v in leaves if xplan.is_auto(v)
                and f not in ("tree.weight", "centroids.weight",
                              "centroids.idf", "neighbours.weight",
                              "neighbours.idf", "data.split_seed",
                              "model.wide_max_mib",
                              "model.wide_max_fan_out", "train.min_delta")]
        assert left == [], (name, left)
        integer = bool(np.all(train.features.data ==
                              np.floor(train.features.data)))
        if config.data.normalize == "auto":
            assert run.data.normalize == ("tfidf" if integer else "l2")
        if config.get("sampler") and config.sampler.K == "auto":
            sizes = sampler_sizes(run.sampler, 30)
            k = (max(sizes["num_hard"], 1) if run.sampler.shared
                 else sizes["num_negatives"])
            assert run.sampler.K == lsh_auto_K(30, k, run.sampler.L,
                                               hash=run.sampler.hash)
        if config.get("sampler") and config.sampler.shared == "auto":
            assert run.sampler.shared == (
                multi_class and run.sampler.kind in ("uniform", "mixture",
                                                     "lsh"))
        if config.tree.enabled == "auto":
            # 30 labels: under both max_labels and max_classes
            assert run.tree.enabled == xchecks.check_config(
                run).scores_every_label
        if config.centroids.enabled == "auto":
            counts = train.label_counts()
            assert run.centroids.enabled == bool(
                np.median(counts[counts > 0]) <= 8
                and xchecks.check_config(run).scores_every_label)
        if config.neighbours.enabled == "auto":
            counts = train.label_counts()
            df = np.bincount(train.features.indices,
                             minlength=train.num_features)
            assert run.neighbours.enabled == bool(
                np.median(counts[counts > 0]) <= 8
                and (df.astype(float) ** 2).sum() / train.num_instances
                <= run.neighbours.max_postings
                and xchecks.check_config(run).scores_every_label)
        assert regime["labels"] == ("multi-class" if multi_class
                                    else "multi-label")


def test_check_config_checks_both_regimes_and_the_json_is_plain():
    config = xconfig.get_config("astra")
    config.data.train = "unused"
    head = xchecks.check_config(config)  # None fields pass
    assert head.name == "sampled"
    saved = json.loads(config.to_json_best_effort())
    assert saved["model"]["encoder_dims"] is None
    assert xresume.config_changes(saved, config) == []
    config.model.dropout = 1.5  # an explicit bad value is still refused
    with pytest.raises(Exception, match="config.model.dropout=1.5"):
        xchecks.check_config(config)
    with pytest.raises(ValueError, match="cannot be chosen by regime"):
        xconfig.by_regime(xconfig.base("sampled"), ("model.head",))


class _StopAfterFirstEpoch(keras.callbacks.Callback):
    """Kills the run in its second epoch (the first is checkpointed)."""

    def on_epoch_end(self, epoch, logs=None):
        if epoch == 1:
            raise KeyboardInterrupt("killed")


def _write(path, dataset):
    xdata.write_xc(str(path), dataset)


def _run_config(path, epochs=3):
    config = xconfig.get_config("astra")
    config.data.train = str(path)
    config.data.test = ""
    config.train.epochs = epochs
    config.train.verbose = 0
    config.train.early_stopping_patience = 5  # all epochs run
    config.model.encoder_dims = (16,)  # small, explicit: kept
    config.sampler.kind = "mixture"
    return config


def _interrupted_run(tmp_path):
    """A multi-class run stopped after its first epoch: (data path,
    workdir)."""
    path = tmp_path / "train.txt"
    _write(path, _toy(1))
    workdir = str(tmp_path / "wd")
    with pytest.raises(KeyboardInterrupt):
        xrun.train_and_evaluate(_run_config(path), workdir,
                                  callbacks=[_StopAfterFirstEpoch()])
    keras.backend.clear_session()
    return path, workdir


def test_resume_resolves_the_same_values(tmp_path):
    path, workdir = _interrupted_run(tmp_path)
    metrics = xrun.train_and_evaluate(_run_config(path), workdir)
    assert metrics["run"]["resumes"] == 1
    assert metrics["epochs"] == 3
    assert metrics["regime"]["labels"] == "multi-class"
    assert metrics["regime"]["fields"]["train.batch_size"] == 256
    assert "model.encoder_dims" not in metrics["regime"]["fields"]
    with open(tmp_path / "wd" / "config.json") as f:
        saved = json.load(f)  # the config as given
    assert saved["train"]["batch_size"] is None
    assert saved["model"]["encoder_dims"] == [16]


def test_resume_refuses_a_backup_whose_labels_resolved_otherwise(tmp_path):
    path, workdir = _interrupted_run(tmp_path)
    _write(path, _toy(3))  # same file name, multi-label labels now
    with pytest.raises(CheckpointError, match="chosen from its training "
                                              "labels"):
        xrun.train_and_evaluate(_run_config(path), workdir)


def test_a_run_checks_its_config_once(tmp_path, monkeypatch):
    """``train_and_evaluate`` checks the config once, as given (both label
    regimes), and makes no head beyond those of that check: the plan binds
    the checked head to the resolved config (Head.bound_to)."""
    from xmc_tf.job.heads import base as heads_base
    path = tmp_path / "train.txt"
    _write(path, _toy(1))
    config = _run_config(path, epochs=1)
    made = []
    init = heads_base.Head.__init__

    def counting_init(self, c):
        made.append(type(self).__name__)
        init(self, c)

    monkeypatch.setattr(heads_base.Head, "__init__", counting_init)
    xchecks.check_config(config)
    heads_per_check, made[:] = len(made), []
    checks = []
    check = xchecks.check_config

    def counting_check(c):
        checks.append(c)
        return check(c)

    monkeypatch.setattr(xchecks, "check_config", counting_check)
    bound = []
    bound_to = heads_base.Head.bound_to

    def recording_bound_to(self, c):
        bound.append(c)
        return bound_to(self, c)

    monkeypatch.setattr(heads_base.Head, "bound_to", recording_bound_to)
    metrics = xrun.train_and_evaluate(config, str(tmp_path / "wd"))
    assert len(checks) == 1 and checks[0] is config
    assert len(made) == heads_per_check == 3  # as given, both regimes
    # the run's head is bound to the resolved config (batch size by regime)
    assert bound[-1].train.batch_size == 256
    assert metrics["regime"]["fields"]["train.batch_size"] == 256


def _flat(config, prefix=""):
    import ml_collections
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            yield from _flat(value, prefix + key + ".")
        else:
            yield prefix + key, value


@pytest.mark.parametrize("name", xconfig.names())
@pytest.mark.parametrize("labels_per_instance", [1, 3])
def test_the_plan_leaves_concrete_values(name, labels_per_instance):
    """After the plan the config holds no "auto" but the fused scorers'
    ``weight`` and ``idf`` (read on validation after training), and every
    True/False/"auto" field a bool -- strings from the command line too."""
    train = _toy(labels_per_instance)
    config = xconfig.get_config(name)
    for field in xconfig.AUTO_BOOL_FIELDS:
        section, key = field.split(".")
        if section in config and config[section][key] is True:
            config[section][key] = "True"  # as --config.X=True gives it
    checked = xchecks.Checked(config, xchecks.check_config(config))
    planned = xplan.make_plan(checked, xrun.JobData(train))
    left = {k for k, v in _flat(planned.config)
            if isinstance(v, str) and v.strip().lower() == "auto"}
    assert left <= {f"{s}.{f}" for s in ("tree", "centroids", "neighbours")
                    for f in ("weight", "idf")}, left
    for field in xconfig.AUTO_BOOL_FIELDS:
        section, key = field.split(".")
        if section not in planned.config:
            continue
        value = planned.config[section][key]
        assert isinstance(value, bool) or (key == "idf" and value == "auto"), (
            field, value)
    assert planned.head.config is planned.config
