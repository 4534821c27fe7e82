"""The callbacks' and samplers' own defaults are the ones the CLI's config
uses (xmc_tf.config; how they were chosen: docs/notes/defaults.md,
docs/notes/sampled.md), so ``RefreshIndex(sampler)``, ``Rehash(sampler)``,
``SetRewiring()`` and ``LshNegativeSampler(m, k)`` train as ``xmc-tf
train`` does."""

import inspect

import ml_collections
import pytest

from xmc_tf import config as xconfig
from xmc_tf.callbacks import RefreshIndex, Rehash, SetRewiring
from xmc_tf.samplers import LshNegativeSampler, UniformNegativeSampler
from xmc_tf.samplers.mixture import MixtureSampler


def defaults(cls):
    return {name: p.default for name, p in
            inspect.signature(cls.__init__).parameters.items()
            if p.default is not inspect.Parameter.empty}


SAMPLER = xconfig.HEAD_DEFAULTS["sampled"]["sampler"]


def test_refresh_index_defaults_are_the_cli_schedule():
    d = defaults(RefreshIndex)
    assert d["start_epoch"] == SAMPLER.refresh_start_epoch == 1
    assert d["every_n_epochs"] == SAMPLER.refresh_every_epochs == 1
    assert d["every_n_steps"] is None and SAMPLER.refresh_every_steps == 0


def test_rehash_defaults_are_the_cli_schedule():
    d = defaults(Rehash)
    assert d["every_n_steps"] == SAMPLER.rehash_every_steps == 50
    assert d["frequency_decay"] == SAMPLER.rehash_decay == 0.95


def test_set_rewiring_defaults_are_the_cli_and_paper_ones():
    d = defaults(SetRewiring)
    assert d["every_n_steps"] == xconfig.BASE["set"]["every_n_steps"] == 1000
    assert d["fraction"] == xconfig.BASE["set"]["fraction"] == 0.1
    assert d["regrowth"] == xconfig.BASE["set"]["regrowth"]


def test_lsh_sampler_defaults_are_the_cli_ones():
    d = defaults(LshNegativeSampler)
    assert d["K"] is None and SAMPLER.K == "auto"  # both: lsh_auto_K
    for name in ("hash", "L", "query", "weighting"):
        assert d[name] == SAMPLER[name], name


def test_cli_factories_build_the_default_callbacks():
    """The registry's refresh callbacks with the CLI's config equal the
    callbacks a user builds with no argument but the sampler; a config
    without the rehash fields falls back to Rehash's own defaults."""
    from xmc_tf.job.samplers import _rehash_callbacks, index_refresh_callbacks
    lsh = LshNegativeSampler(100, 8)
    mixture = MixtureSampler(lsh, UniformNegativeSampler(100, 8))
    sc = ml_collections.ConfigDict(dict(SAMPLER))
    (cli,) = index_refresh_callbacks(mixture, sc)
    user = RefreshIndex(mixture)
    for attr in ("start_epoch", "every_n_epochs", "every_n_steps"):
        assert getattr(cli, attr) == getattr(user, attr), attr
    for config in (sc, ml_collections.ConfigDict(dict(kind="lsh"))):
        (cli,) = _rehash_callbacks(mixture, config)
        user = Rehash(lsh)
        assert cli.sampler is lsh
        for attr in ("schedule", "every_n_steps", "frequency_decay"):
            assert getattr(cli, attr) == getattr(user, attr), attr
    with pytest.raises(ValueError, match="every_n_epochs"):
        RefreshIndex(lsh, every_n_epochs=0)
