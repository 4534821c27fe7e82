"""One implementation: the CLI's candidate heads (configs ``astra``, ``lsh``,
``scent``) build the public Keras components a user would build by hand
from the same settings -- xmc_tf.models trainers, xmc_tf.samplers samplers,
xmc_tf.losses losses -- and a training step of each gives the same scores.
"""

import keras
import numpy as np
import pytest
from xmc_tf import decoding
from xmc_tf import data as xdata
from xmc_tf.job import heads
from xmc_tf.config import get_config as packaged_config
from xmc_tf.job.build import build_model
from xmc_tf.losses import SampledSoftmax, SampledSquaredHinge, ScentLoss
from xmc_tf.models import SampledTrainer, ScentTrainer
from xmc_tf.samplers import (AnnNegativeSampler, LshNegativeSampler,
                             MixtureSampler, UniformNegativeSampler)

D, M = 60, 40


def _config(name, multi_class):
    c = packaged_config(name)
    c.seed = 3
    c.model.encoder_dims = (16,)
    c.model.intermediate_dim = 0
    c.model.dropout = 0.0
    c.model.sampled_layer = "dense"
    if "sampler" in c:
        c.sampler.num_negatives, c.sampler.num_hard = 8, 4
        c.sampler.num_uniform = 8
        c.sampler.max_fraction = None
    return c


def _by_hand(name, c, multi_class):
    """The sampler and loss a user writes from the config's settings."""
    seed, sc = c.seed, c.get("sampler")
    if name == "scent":
        return None, None
    shared = multi_class  # "auto": shared on multi-class labels
    if name == "astra":
        sampler = MixtureSampler(
            AnnNegativeSampler(M, 4, index=sc.index, nprobe=sc.nprobe,
                               seed=seed),
            UniformNegativeSampler(M, 8, seed=seed + 1), k_h=4,
            pool_positives=sc.pool_positives, hard_queries=sc.hard_queries)
    else:
        lsh = LshNegativeSampler(M, 4 if shared else 8, hash=sc.hash, L=sc.L,
                                 query=sc.query, seed=seed)
        sampler = (MixtureSampler(lsh, UniformNegativeSampler(M, 8,
                                                              seed=seed + 1),
                                  k_h=4, pool_positives=sc.pool_positives,
                                  hard_queries=sc.hard_queries)
                   if shared else lsh)
    # configs/lsh.py sets the sampled softmax (the paper's loss); astra's
    # "auto" reads the labels.
    loss = (SampledSoftmax() if multi_class or name == "lsh"
            else SampledSquaredHinge())
    return sampler, loss


@pytest.mark.parametrize("name,multi_class", [
    ("astra", False), ("astra", True), ("lsh", False), ("lsh", True),
    ("scent", True)])
def test_cli_heads_build_the_public_components(name, multi_class):
    train = xdata.make_synthetic(200, D, M, seed=1,
                                 labels_per_instance=1 if multi_class else 3)
    c = _config(name, multi_class)
    head = heads.get_head(c)
    head.prepare(train)
    model = build_model(c, D, M, sparse_input=True, head=head)
    cli = head.training_model(model, decoding.scoring_layer(model))

    before = model.get_weights()
    twin = keras.models.clone_model(model)
    twin.set_weights(before)
    sampler, loss = _by_hand(name, c, multi_class)
    if name == "scent":
        assert type(cli) is ScentTrainer
        hand = ScentTrainer(twin, ScentLoss.from_labels(train.labels))
        assert hand.scent_loss.get_config() == cli.scent_loss.get_config()
        np.testing.assert_array_equal(hand.scent_loss.log_weight.numpy(),
                                      cli.scent_loss.log_weight.numpy())
    else:
        assert type(cli) is SampledTrainer
        hand = SampledTrainer(twin, sampler, loss=loss, shared=multi_class)
        assert type(cli.sampler) is type(sampler)
        assert cli.sampler.get_config() == sampler.get_config()
        assert type(cli.sampled_loss) is type(loss)
        assert cli.shared == hand.shared == multi_class
        for trainer in (cli, hand):
            trainer.sampler.refresh()  # index / tables from equal weights

    batch = next(iter(xdata.make_tf_dataset(
        train, 64, **({"with_example_ids": True} if name == "scent" else {}))))
    for trainer in (cli, hand):
        trainer.compile(keras.optimizers.SGD(0.1))
        trainer.train_on_batch(*batch)
    x = batch[0]
    np.testing.assert_allclose(hand.predict(x, verbose=0),
                               cli.predict(x, verbose=0), rtol=1e-5, atol=1e-6)
    assert not all(np.array_equal(a, b) for a, b in
                   zip(before, model.get_weights()))  # the step trained
