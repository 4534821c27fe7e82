"""The config schema (xmc_tf_cli/schema.py, imported as xmc_tf.config) and the packaged configs.

References: the schema's own tables (BASE, HEAD_DEFAULTS) against what the
code builds from a config, the repository's configs/*.py files against the
packaged names, and the command line in a fresh process (no TensorFlow).
"""

import os

import keras
import ml_collections
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf_cli import cli
from xmc_tf import config as xconfig
from xmc_tf.job import heads
from xmc_tf.job.build import build_model, build_optimizer
from xmc_tf.optimizers import LazyAdam
from xmc_tf.job.resume import config_changes

from repo_module import REPO, load_repo_module


def _flat(c, prefix=""):
    out = {}
    for key, value in c.items():
        if isinstance(value, ml_collections.ConfigDict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _repo_config(name):
    return load_repo_module(f"configs/{name}.py",
                            f"repo_{name}").get_config()


def test_every_registered_head_declares_its_schema_entry():
    assert set(heads.names()) == set(xconfig.HEAD_DEFAULTS)
    for name in heads.names():
        cls = heads.base._REGISTRY[name]  # pylint: disable=protected-access
        assert cls.config_defaults is xconfig.HEAD_DEFAULTS[name]
        assert xconfig.base(name).model.head == name


@pytest.mark.parametrize("name", xconfig.names())
def test_packaged_configs_only_set_schema_fields(name):
    c = xconfig.get_config(name)
    schema = _flat(xconfig.base(c.model.head))
    assert set(_flat(c)) == set(schema)
    with pytest.raises(AttributeError):  # locked: no new fields
        c.model.dropuot = 0.1
    # the name form and the repository's path form are the same config
    assert _repo_config(name).to_dict() == c.to_dict()


def test_packaged_configs_override_only_what_they_say():
    """The resolved values of the former configs/*.py (as of 98e3c02) that
    the refactoring had to keep; beyond the fields they already had, every
    config gained data.split_seed None (and scent the schema's other
    fields, which its head does not read)."""
    mach = _flat(xconfig.get_config("mach"))
    assert (mach["loss"], mach["model.num_buckets"], mach["model.dropout"],
            mach["model.intermediate_dim"], mach["train.learning_rate"],
            mach["model.intermediate_activation"], mach["train.min_delta"],
            mach["model.wide_connections"], mach["set.enabled"]) == (
                "bce", 32, 0.5, 256, 5e-3, "relu", 1e-3, 0, False)
    lsh = xconfig.get_config("lsh")
    # (learning rate, network: left to the data's regime since issue 31;
    # multi-label labels resolve them to the former values)
    assert (lsh.loss, lsh.sampler.kind, lsh.sampler.K,
            lsh.train.learning_rate) == ("softmax", "lsh", "auto", None)
    assert xconfig.resolve_regime(lsh, False).train.learning_rate == 2e-3
    assert xconfig.get_config("astra").sampler.K == "auto"  # lsh_auto_K
    quick = _flat(xconfig.get_config("quickstart"))
    base = _flat(xconfig.base())
    assert {k for k in base if base[k] != quick[k]} == {"train.epochs",
                                                          "train.verbose"}
    assert _flat(xconfig.get_config("uniform_sparse")) == base


def test_unknown_name_lists_the_names():
    with pytest.raises(ValueError, match="packaged configs: astra, dense"):
        xconfig.get_config("nope")
    with pytest.raises(ValueError, match="expected one of"):
        xconfig.base("nope")
    assert xconfig.config_file("configs/mach.py") == "configs/mach.py"
    assert xconfig.config_file("mach") == os.path.join(xconfig.CONFIGS_DIR,
                                                       "mach.py")


def _cli_config(argv):
    argv = cli._with_config_file(["xmc-tf", "train", *argv])  # pylint: disable=protected-access
    fv = cli._define_flags(argv)  # pylint: disable=protected-access
    cli._parse(fv, argv, cli._config_arg(argv))  # pylint: disable=protected-access
    return fv.config


def test_name_and_path_forms_give_equal_configs(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("uniform_sparse", "mach", "astra", "quickstart"):
        by_name = _cli_config([f"--config={name}", "--config.seed=3"])
        by_path = _cli_config([f"--config=configs/{name}.py",
                               "--config.seed=3"])
        assert by_name.to_dict() == by_path.to_dict()
        assert by_name.seed == 3
        assert by_name.to_dict() == {**xconfig.get_config(name).to_dict(),
                                     "seed": 3}
    # None-valued fields stay settable from the command line
    c = _cli_config(["--config=mach", "--config.train.min_delta=0.01",
                     "--config.data.split_seed=4"])
    assert (c.train.min_delta, c.data.split_seed) == (0.01, 4)


@pytest.mark.parametrize("args,names", [
    (["--config=nope"], ["--config=nope", "packaged configs:", "astra",
                         "uniform_sparse"]),
    (["--config=mach", "--config.model.dropuot=0.1"],
     ["--config.model.dropuot", "no config field 'dropuot'",
      "did you mean 'dropout'"]),
])
def test_bad_config_is_one_line(args, names, tmp_path, capsys):
    code = cli.main(["xmc-tf", "train", *args, f"--workdir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("xmc-tf: error: ") and "Traceback" not in err
    for name in names:
        assert name in err, (name, err)


def test_model_from_the_schema_uses_the_schema_defaults():
    """What the code builds from a config that sets nothing is what the
    schema says: the activation, output bias, optimizer, wide path."""
    c = xconfig.base()
    c.model.encoder_dims = (8,)
    c.model.intermediate_dim = 6
    c.model.wide_connections = 3
    head = heads.get_head(c)
    model = build_model(c, 20, 5, sparse_input=True, head=head)
    inter = model.get_layer("intermediate")
    assert inter.activation is keras.activations.get(
        xconfig.BASE["model"]["intermediate_activation"])
    assert inter.activation is keras.activations.leaky_relu
    assert model.get_layer("wide").kernel_scale == 5.0
    assert c.model.output_bias_init == "prior"  # -> the prior start:
    import numpy as np  # pylint: disable=import-outside-toplevel
    import scipy.sparse as sp  # pylint: disable=import-outside-toplevel
    from xmc_tf import data as xdata  # pylint: disable=import-outside-toplevel
    labels = sp.csr_matrix(np.eye(10, 5, dtype=np.float32))
    feats = sp.csr_matrix(np.ones((10, 20), np.float32))
    head.prepare(xdata.XCDataset(feats, labels))
    head.initialize(decoding.scoring_layer(model), model)
    bias = np.asarray(decoding.scoring_layer(model).bias)
    assert np.all(bias < 0)  # not zeros: below 0 for labels on 2 of 10 rows
    opt = build_optimizer(c)
    assert type(opt) is LazyAdam
    assert float(opt.learning_rate) == pytest.approx(2e-3)
    # the uniform-sparse head's own defaults (docs/notes/epochs.md)
    assert (c.train.batch_size, c.model.intermediate_dim) == (256, 6)
    assert xconfig.base().model.intermediate_dim == 1024
    assert xconfig.base("dense").train.batch_size == 64  # the schema's


def test_batch_is_cut_to_the_score_budget():
    """``train.batch_scores_mib``: label-wise heads get at most
    ``MiB * 2**20 / (4 m)`` rows per batch; other heads, None and batches
    that fit are left alone."""
    from xmc_tf.job.plan import batch_cap
    c = xconfig.base()
    assert c.train.batch_scores_mib == 128 and c.train.batch_size == 256
    assert batch_cap(c, 131_072) is None  # 256 * 131072 * 4 B = 128 MiB
    assert batch_cap(c, 131_073) == 255
    assert batch_cap(c, 670_091) == 50
    assert batch_cap(c, 10 ** 9) == 1
    c.train.batch_scores_mib = None
    assert batch_cap(c, 670_091) is None
    m = xconfig.base("mach")
    assert batch_cap(m, 10 ** 8) is None  # scores buckets, not labels


def test_resolve_config_cuts_the_batch_and_says_so(caplog):
    import logging
    import numpy as np  # pylint: disable=import-outside-toplevel
    import scipy.sparse as sp  # pylint: disable=import-outside-toplevel
    from xmc_tf import data as xdata  # pylint: disable=import-outside-toplevel
    from xmc_tf.job.plan import resolve_config
    rows = np.arange(40)
    feats = sp.csr_matrix((np.ones(40, np.float32), (rows, rows % 7)),
                          shape=(40, 7))
    labels = sp.csr_matrix((np.ones(40, np.float32), (rows, rows * 5000)),
                           shape=(40, 200_000))
    c = xconfig.base()
    with caplog.at_level(logging.INFO, logger="absl"):
        run, resolved = resolve_config(c, xdata.XCDataset(feats, labels))
    assert run.train.batch_size == 167 and c.train.batch_size == 256
    assert resolved["fields"]["train.batch_size"] == 167
    assert "config.train.batch_size=167: cut from 256" in caplog.text


def test_head_rejects_a_config_without_its_fields():
    c = xconfig.base()
    c.model.head = "mach"
    c.loss = "bce"
    with pytest.raises(ValueError, match=r"config.model.num_buckets, "
                       r"config.model.num_repetitions.*base\('mach'\)"):
        heads.get_head(c)


def test_resume_accepts_a_saved_config_from_before_the_schema():
    # (as resolved for multi-label labels: astra's network is by regime)
    c = xconfig.resolve_regime(xconfig.get_config("astra"), False)
    saved = c.to_dict()
    saved = {k: dict(v) if isinstance(v, dict) else v
             for k, v in saved.items()}
    saved["train"].pop("min_delta")  # astra deleted it before the schema
    saved["data"].pop("split_seed")  # never in a config before
    saved["model"]["encoder_dims"] = list(saved["model"]["encoder_dims"])
    saved["eval"]["ks"] = list(saved["eval"]["ks"])
    assert config_changes(saved, c) == []
    saved["model"]["dropout"] = 0.3
    assert config_changes(saved, c) == ["config.model.dropout=0.3 (now 0.7)"]


@pytest.mark.parametrize("name", xconfig.names())
def test_every_packaged_config_builds_on_sparse_data(name):
    """Each packaged config goes through what ``xmc-tf train`` does before
    ``fit``: check, ``head.prepare`` on sparse training data, build and
    initialise (the wide path's connections, the prior bias) and compile.
    (``configs/linear.py`` once crashed here: its linear model has no wide
    layer for the connections ``prepare`` had picked.)"""
    from xmc_tf import data as xdata
    from xmc_tf.job import fit as xfit
    from xmc_tf.job import plan as xplan
    from xmc_tf.job import checks as xchecks
    config = xconfig.get_config(name)
    config.data.train = config.data.train or "unused.txt"  # scent: no default
    data = xdata.make_synthetic(num_instances=200, num_features=60,
                                num_labels=30, seed=0)
    if name == "scent":  # multi-class: each row's first label
        y = data.labels.tocsr()
        first = y.indices[y.indptr[:-1]]
        data = xdata.XCDataset(features=data.features, labels=sp.csr_matrix(
            (np.ones(first.size, np.float32), (np.arange(first.size), first)),
            shape=y.shape))
    head = xchecks.check_config(config)
    # the fields left to the data's regime (astra, lsh), as the job does
    config, _ = xplan.resolve_config(config, data)
    head = xchecks.check_config(config)
    head.prepare(data)
    model, layer, fit_model = xfit.build_and_compile(
        config, head, data.num_features, data.num_labels, True)
    assert fit_model.compiled
    x = data.features[:4].tocoo()
    scores = model(tf.sparse.reorder(tf.SparseTensor(
        np.stack([x.row, x.col], 1).astype(np.int64),
        x.data.astype(np.float32), x.shape)))
    assert scores.shape[0] == 4
    mc = config.model
    linear = not mc.encoder_dims and not mc.intermediate_dim
    has_wide = any(l.name == "wide" for l in model.layers)
    assert has_wide == bool(mc.wide_connections and head.wide_path and
                            not linear)


def test_xmc_tf_config_is_the_schema_module():
    """``xmc_tf.config`` is the TensorFlow-free schema module itself, so
    setting one of its names sets the schema's (as a new head's
    ``HEAD_DEFAULTS`` entry must)."""
    import xmc_tf
    from xmc_tf_cli import schema
    assert xconfig is schema and xmc_tf.config is schema
    import xmc_tf.config as by_path
    assert by_path is schema
