"""The trainers of xmc_tf.models behave as Keras models in a user's own code:
compile(metrics=...), fit on scipy / NumPy / id-list data, save and load,
ModelCheckpoint, export, defaults from the labels, and one-line errors."""

import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from xmc_tf import config as xconfig
from xmc_tf.data import label_matrix, padded_label_ids
from xmc_tf.losses import SampledSoftmax, SampledSquaredHinge, ScentLoss
from xmc_tf.models import SampledTrainer, ScentTrainer
from xmc_tf.losses.targets import target_label_ids
from xmc_tf.models.candidates import find_label_scorer
from xmc_tf.samplers import UniformNegativeSampler

N, D, M = 384, 24, 20


def _data(multi_label=True, seed=0):
    rng = np.random.default_rng(seed)
    x = sp.random(N, D, density=0.3, format="csr", random_state=seed,
                  dtype=np.float32)
    scores = x @ rng.standard_normal((D, M))
    if multi_label:
        return x, np.argsort(-scores, axis=1)[:, :2].astype(np.int32)
    return x, np.argmax(scores, axis=1).astype(np.int32)


def _model(head=None, sparse=True):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((D,), sparse=sparse),
        keras.layers.Dense(16, activation="relu"),
        head or xmc_tf.layers.LabelDense(M)])


def _p_at_1(scores, y_ids):
    top = np.argmax(scores, axis=1)
    return float(np.mean([top[i] in set(r[r >= 0]) for i, r in
                          enumerate(np.atleast_2d(y_ids.T).T)]))


def test_label_ids_from_every_form():
    want = np.array([[1, 2], [0, -1]], np.int32)
    dense = np.array([[0, 1, 1], [1, 0, 0]], np.float32)
    coo = sp.coo_matrix(dense)
    sparse = tf.SparseTensor(np.stack([coo.row, coo.col], 1).astype(np.int64),
                             coo.data, coo.shape)
    for y in (want, want.astype(np.float32), dense, dense > 0, sparse):
        np.testing.assert_array_equal(target_label_ids(y, 3).numpy(), want)
    np.testing.assert_array_equal(target_label_ids(tf.constant([2, 0]), 3).numpy(),
                                  [[2], [0]])


def test_compiled_metrics_are_exact_on_validation_data():
    x, y = _data()
    trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6))
    trainer.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1),
                             xmc_tf.metrics.PrecisionAtK(3)])
    history = trainer.fit(x, label_matrix(y, M), epochs=2, batch_size=64,
                          verbose=0, validation_data=(x[:100], y[:100]))
    assert {"precision_at_1", "val_precision_at_1",
            "val_precision_at_3"} <= set(history.history)
    result = trainer.evaluate(x[:100], [list(r) for r in y[:100]], verbose=0,
                              return_dict=True)
    scores = trainer.predict(x[:100], verbose=0)
    assert scores.shape == (100, M)
    assert result["precision_at_1"] == pytest.approx(_p_at_1(scores, y[:100]),
                                                     abs=1e-6)
    # the last epoch's validation metric is the same computation
    assert history.history["val_precision_at_1"][-1] == pytest.approx(
        result["precision_at_1"], abs=1e-6)


def test_label_forms_train_identically():
    """CSR, multi-hot, id lists and padded ids are the same labels."""
    x, y = _data()
    forms = [padded_label_ids(y), label_matrix(y, M),
             label_matrix(y, M).toarray(), [list(r) for r in y]]
    weights = []
    for labels in forms:
        trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6))
        trainer.compile(keras.optimizers.SGD(0.1))
        trainer.fit(x, labels, epochs=1, batch_size=64, shuffle=False,
                    verbose=0)
        weights.append([w.numpy() for w in trainer.inference_model.weights])
    for other in weights[1:]:
        for a, b in zip(weights[0], other):
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_train_metrics_switch():
    x, y = _data()
    for train_metrics, expected in ((None, True), (False, False)):
        trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6),
                                 train_metrics=train_metrics)
        trainer.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1)])
        history = trainer.fit(x, y, epochs=1, verbose=0,
                              validation_data=(x, y))
        assert ("precision_at_1" in history.history) == expected
        assert "val_precision_at_1" in history.history


def test_defaults_follow_the_labels():
    x, y = _data(multi_label=False)
    trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6))
    trainer.compile()
    trainer.fit(x, y, epochs=1, verbose=0)
    assert isinstance(trainer.sampled_loss, SampledSoftmax) and trainer.shared
    assert isinstance(trainer.optimizer, xmc_tf.optimizers.LazyAdam)
    assert float(trainer.optimizer.learning_rate) == pytest.approx(
        SampledTrainer.LEARNING_RATE)
    x, y = _data()
    trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6))
    trainer.compile()
    trainer.fit(x, y, epochs=1, verbose=0)
    assert isinstance(trainer.sampled_loss, SampledSquaredHinge)
    assert not trainer.shared
    # A tf.data set: read from its first batches.
    x, y = _data(multi_label=False)
    trainer = SampledTrainer(_model(sparse=False), UniformNegativeSampler(M, 6))
    trainer.compile()
    trainer.fit(tf.data.Dataset.from_tensor_slices(
        (x.toarray(), y[:, None])).batch(32), epochs=1, verbose=0)
    assert isinstance(trainer.sampled_loss, SampledSoftmax) and trainer.shared


def test_scent_from_labels_holds_the_configs_settings():
    settings = xconfig.HEAD_DEFAULTS["scent"]["scent"]
    for key, value in ScentLoss.MEASURED_DEFAULTS.items():
        assert settings[key] == value, key
    labels = np.array([0, 2, 2, -1, 1, 2])
    loss = ScentLoss.from_labels(labels, num_labels=4)
    assert (loss.num_examples, loss.num_labels) == (6, 4)
    counts = np.array([1, 1, 3, 0], np.float64)
    with np.errstate(divide="ignore"):
        want = np.log(counts.sum()) - np.log(4) - np.log(counts)
    np.testing.assert_allclose(loss.log_weight.numpy()[:3], want[:3],
                               rtol=1e-6)
    with pytest.raises(ValueError, match="more than one label"):
        ScentLoss.from_labels([[0, 1], [2]])
    assert ScentLoss.from_labels(labels, alpha=2.0).alpha == 2.0


def test_scent_fit_on_arrays_adds_instance_ids():
    x, y = _data(multi_label=False)
    trainer = ScentTrainer(_model())
    trainer.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1)])
    history = trainer.fit(x, y, epochs=3, batch_size=64, verbose=0,
                          validation_split=0.25)
    n_fit = N - int(round(N * 0.25))
    assert trainer.scent_loss.num_examples == n_fit
    np.testing.assert_array_equal(trainer.scent_loss.visits.numpy(),
                                  np.full(n_fit, 3))
    assert history.history["val_precision_at_1"][-1] > 1.5 / M  # learns


def test_head_found_through_a_final_activation():
    head = xmc_tf.layers.LabelDense(M, name="labels")
    model = keras.Sequential([keras.Input((D,)), keras.layers.Dense(8), head,
                              keras.layers.Activation("sigmoid")])
    assert find_label_scorer(model) is head
    trainer = SampledTrainer(model, UniformNegativeSampler(M, 4))
    assert trainer.head_layer is head and not trainer.train_metrics


def test_save_load_and_checkpoint_round_trip(tmp_path):
    x, y = _data(multi_label=False)
    trainer = ScentTrainer(_model())
    trainer.compile(metrics=[xmc_tf.metrics.PrecisionAtK(1)])
    path = str(tmp_path / "ck.keras")
    trainer.fit(x, y, epochs=1, batch_size=64, verbose=0,
                callbacks=[keras.callbacks.ModelCheckpoint(path)])
    trainer.save(str(tmp_path / "m.keras"))
    for file in (path, str(tmp_path / "m.keras")):
        loaded = keras.models.load_model(file)
        assert type(loaded) is ScentTrainer
        np.testing.assert_allclose(loaded.predict(x[:8], verbose=0),
                                   trainer.predict(x[:8], verbose=0),
                                   rtol=1e-6)
        np.testing.assert_array_equal(loaded.scent_loss.nu.numpy(),
                                      trainer.scent_loss.nu.numpy())
        assert loaded.scent_loss.get_config() == trainer.scent_loss.get_config()
        assert isinstance(loaded.optimizer, xmc_tf.optimizers.LazyAdam)
    loaded.fit(x, y, epochs=1, batch_size=64, verbose=0)  # trains on

    x, y = _data()
    sampled = SampledTrainer(_model(xmc_tf.layers.UniformSparseDense(M, 4)),
                             UniformNegativeSampler(M, 6, seed=3),
                             loss=SampledSquaredHinge(margin=0.5))
    sampled.compile()
    sampled.fit(x, y, epochs=1, verbose=0)
    sampled.save(str(tmp_path / "s.keras"))
    loaded = keras.models.load_model(str(tmp_path / "s.keras"))
    assert loaded.sampler.get_config() == sampled.sampler.get_config()
    assert loaded.sampled_loss.margin == 0.5 and loaded.shared is False
    np.testing.assert_allclose(loaded.predict(x[:8], verbose=0),
                               sampled.predict(x[:8], verbose=0), rtol=1e-6)


def test_export_writes_the_wrapped_model(tmp_path):
    x, y = _data()
    trainer = SampledTrainer(_model(sparse=False), UniformNegativeSampler(M, 6))
    trainer.compile()
    trainer.fit(x.toarray(), y, epochs=1, verbose=0)
    dense = x[:5].toarray()
    want = np.argsort(-trainer.predict(dense, verbose=0), axis=1,
                      kind="stable")[:, :3]
    for path, export in (
            ("a", lambda p: trainer.export(p, k=3)),
            ("b", lambda p: xmc_tf.saving.export_saved_model(trainer, p, k=3))):
        export(str(tmp_path / path))
        served = tf.saved_model.load(str(tmp_path / path))
        ids = served.signatures["serve"](features=tf.constant(dense))
        np.testing.assert_array_equal(ids["label_ids"].numpy(), want)


def test_user_errors_are_one_value_error():
    x, y = _data()
    trainer = SampledTrainer(_model(), UniformNegativeSampler(M, 6))
    trainer.compile()
    with pytest.raises(ValueError, match=f"features have {N} rows but labels "
                       f"have {N - 1}"):
        trainer.fit(x, y[1:], verbose=0)
    bad = y.copy()
    bad[3, 0] = M
    with pytest.raises(ValueError, match=f"label id {M} is out of range for "
                       f"{M} labels"):
        trainer.fit(x, bad, verbose=0)
    with pytest.raises(ValueError, match=f"{M + 1} columns but the model has "
                       f"{M} labels"):
        trainer.fit(x, sp.csr_matrix((N, M + 1)), verbose=0)
    with pytest.raises(ValueError, match=f"made for {M + 5} labels but the "
                       f"head .* has {M}"):
        SampledTrainer(_model(), UniformNegativeSampler(M + 5, 6))
    with pytest.raises(ValueError, match="takes no loss"):
        trainer.compile(loss=SampledSquaredHinge())
    with pytest.raises(ValueError, match="no layer that scores labels"):
        SampledTrainer(_model(keras.layers.Dense(M)),
                       UniformNegativeSampler(M, 6))
    two = keras.Sequential([keras.Input((D,)), xmc_tf.layers.LabelDense(8),
                            xmc_tf.layers.LabelDense(M, name="last")])
    with pytest.raises(ValueError, match="pass head=NAME"):
        SampledTrainer(two, UniformNegativeSampler(M, 6))
    assert SampledTrainer(two, UniformNegativeSampler(M, 6),
                          head="last").head_layer.name == "last"
    with pytest.raises(ValueError, match="more than one label"):
        ScentTrainer(_model()).fit(x, y, verbose=0)
    scent = ScentTrainer(_model())
    scent.compile()
    with pytest.raises(ValueError, match="reads the training labels"):
        scent.fit(tf.data.Dataset.from_tensors((x[:4].toarray(), y[:4, 0])),
                  verbose=0)
    assert os.environ.get("XMC_TF_NEVER") is None


def test_non_finite_features_are_refused_before_training():
    x, y = _data()
    for value in (np.nan, np.inf):
        bad = x.copy()
        bad.data[5] = value
        dense = x.toarray()
        dense[2, 1] = value
        for trainer, labels in (
                (SampledTrainer(_model(), UniformNegativeSampler(M, 6)), y),
                (ScentTrainer(_model()), y[:, 0])):
            trainer.compile()
            with pytest.raises(ValueError, match="1 NaN or infinite"):
                trainer.fit(bad, labels, verbose=0)
            with pytest.raises(ValueError, match="1 NaN or infinite"):
                trainer.fit(x, labels, validation_data=(bad, labels),
                            verbose=0)
        dense_trainer = SampledTrainer(_model(sparse=False),
                                       UniformNegativeSampler(M, 6))
        dense_trainer.compile()
        with pytest.raises(ValueError, match="1 NaN or infinite"):
            dense_trainer.fit(dense, y, verbose=0)


def test_export_of_a_mach_serving_model_names_the_training_model(tmp_path):
    inputs = keras.Input((10,))
    head = xmc_tf.layers.MachHead(50, 8, 2)
    model = keras.Model(inputs, head(keras.layers.Dense(4)(inputs)))
    ids, scores = xmc_tf.layers.MachDecoder.from_head(head, k=3)(model.output)
    serving = keras.Model(model.input, [ids, scores])
    with pytest.raises(ValueError, match="takes MACH's training model"):
        xmc_tf.saving.export_saved_model(serving, str(tmp_path / "a"))
    xmc_tf.saving.export_saved_model(model, str(tmp_path / "b"), k=3)
    served = tf.saved_model.load(str(tmp_path / "b"))
    x = np.random.default_rng(0).standard_normal((4, 10)).astype(np.float32)
    np.testing.assert_array_equal(
        served.signatures["serve"](features=tf.constant(x))["label_ids"],
        serving(x)[0])


def test_callbacks_rebuild_from_their_config():
    from xmc_tf.callbacks import RefreshIndex, Rehash, SetRewiring
    from xmc_tf.models.sampled import deserialize_sampler
    from xmc_tf.samplers import AnnNegativeSampler, LshNegativeSampler
    callbacks = [SetRewiring(every_n_steps=7, fraction=0.2, seed=4),
                 RefreshIndex(AnnNegativeSampler(M, 5), start_epoch=2,
                              every_n_steps=9),
                 Rehash(LshNegativeSampler(M, 5, hash="dwta"),
                        every_n_steps=11, max_period=40)]
    for cb in callbacks:
        config = cb.get_config()
        if "sampler" in config:
            config["sampler"] = deserialize_sampler(config["sampler"])
        assert type(cb)(**config).get_config() == cb.get_config()
    assert callbacks[2].get_config()["sampler"]["config"]["hash"] == "dwta"
