"""What a Keras user meets with a plain ``model.fit`` and the library's
callbacks and trainers: one clear message for labels of the wrong width,
no blank or empty log lines, a notice where training metrics are dropped,
predictions on no rows, and the Python spelling of ``--overwrite``."""

import logging

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from xmc_tf.errors import WorkdirFinished
from xmc_tf.job.workdir import Workdir
from xmc_tf.models import SampledTrainer
from xmc_tf.samplers import UniformNegativeSampler

N, D, M = 256, 30, 60


def _data(width=M, seed=0):
    x = sp.random(N, D, 0.2, format="csr", dtype=np.float32,
                  random_state=seed)
    y = sp.random(N, width, 0.05, format="csr", dtype=np.float32,
                  random_state=seed + 1)
    y.data[:] = 1.0
    return x, y


def _model(head=None):
    keras.utils.set_random_seed(0)
    return keras.Sequential([
        keras.Input((D,), sparse=True), keras.layers.Dense(16),
        head or xmc_tf.layers.UniformSparseDense(M, 8, seed=0)])


def _compiled(head=None):
    model = _model(head)
    model.compile("adam", loss=xmc_tf.losses.SquaredHinge(),
                  metrics=[xmc_tf.metrics.PrecisionAtK(1)])
    return model


def test_a_wider_label_matrix_is_named_as_such():
    x, y = _data(width=M + 11)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=f"the label matrix is not {M} columns wide"):
        _compiled().fit(x, y, epochs=1, verbose=0)
    with pytest.raises(ValueError, match=f"y_true has {M + 11} columns but "
                       f"the predictions have {M} labels"):
        _compiled().fit(x, y.toarray(), epochs=1, verbose=0)
    x, y = _data()  # the right width trains
    assert np.isfinite(_compiled().fit(x, y, epochs=1, verbose=0)
                       .history["loss"][0])


def _lines(text):
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")


def test_set_rewiring_prints_no_blank_line(capsys):
    x, y = _data()
    for fit_verbose in (0, 2):
        model = _compiled()
        capsys.readouterr()
        model.fit(x, y, batch_size=32, epochs=2, verbose=fit_verbose,
                  callbacks=[xmc_tf.callbacks.SetRewiring(every_n_steps=4,
                                                          verbose=1)])
        out = capsys.readouterr().out
        assert out.count("SetRewiring: moved") == 4
        assert "" not in _lines(out), out


def test_index_callbacks_print_no_blank_line(capsys):
    x, y = _data()
    ids = xmc_tf.data.padded_label_ids(y, M)
    sampler = xmc_tf.samplers.LshNegativeSampler(M, 8, hash="dwta")
    trainer = SampledTrainer(_model(xmc_tf.layers.LabelDense(M)), sampler)
    trainer.compile()
    capsys.readouterr()
    trainer.fit(x, ids, batch_size=64, epochs=2, verbose=2, callbacks=[
        xmc_tf.callbacks.Rehash(sampler, every_n_steps=2, verbose=1)])
    out = capsys.readouterr().out
    assert "Rehash: " in out and "" not in _lines(out), out


def test_a_run_without_rewires_logs_no_set_keys():
    x, y = _data()
    model = _compiled()
    short = model.fit(x, y, batch_size=32, epochs=1, verbose=0, callbacks=[
        xmc_tf.callbacks.SetRewiring(every_n_steps=1000)])
    assert not any(k.startswith("set_") for k in short.history)
    model = _compiled()
    long = model.fit(x, y, batch_size=32, epochs=2, verbose=0, callbacks=[
        xmc_tf.callbacks.SetRewiring(every_n_steps=12)])
    # 8 steps per epoch: epoch 1 has no rewire yet, its row is still there.
    assert long.history["set_rewires"] == [0, 1]


def _epoch_lines(out):
    return [line for line in _lines(out) if " - loss: " in line]


def test_epoch_line_shows_set_keys_only_in_epochs_with_a_rewire(capsys):
    x, y = _data()
    model = _compiled()
    capsys.readouterr()
    # 8 steps per epoch, a rewire every 12: after steps 12 and 24, i.e. in
    # epochs 2 and 3; none in epochs 1 and 4.
    history = model.fit(x, y, batch_size=32, epochs=4, verbose=2, callbacks=[
        xmc_tf.callbacks.SetRewiring(every_n_steps=12),
        xmc_tf.callbacks.EpochLine()])
    lines = _epoch_lines(capsys.readouterr().out)
    assert len(lines) == 4, lines
    assert ["set_moved: " in line for line in lines] == [
        False, True, True, False], lines
    assert "set_rewires: 2" in lines[2]
    assert all("precision_at_1: " in line for line in lines)
    # History (and CSVLogger) keep every key in every epoch.
    assert history.history["set_rewires"] == [0, 1, 2, 2]
    assert len(history.history["set_moved"]) == 4


def test_epoch_line_filters_lsh_keys_and_only_the_printed_line():
    line = xmc_tf.callbacks.EpochLine()
    line.on_train_begin()
    logs = [{"loss": 1.0, "lsh_rehashes": 0, "lsh_rows_rehashed": 0,
             "set_rewires": 1, "set_moved": 5, "candidates_per_row": 8.0},
            {"loss": 0.9, "lsh_rehashes": 3, "lsh_rows_rehashed": 60,
             "set_rewires": 1, "set_moved": 5, "candidates_per_row": 8.0}]
    shown = [line.shown(dict(entry)) for entry in logs]
    assert sorted(shown[0]) == ["candidates_per_row", "loss", "set_moved",
                                "set_rewires"]
    assert sorted(shown[1]) == ["candidates_per_row", "loss",
                                "lsh_rehashes", "lsh_rows_rehashed"]
    line.on_train_begin()  # a new fit: counters start again
    assert "set_moved" in line.shown(dict(logs[1]))
    with pytest.raises(TypeError, match="counter keys to key prefixes"):
        xmc_tf.callbacks.EpochLine({"set_rewires": 1})


def test_reduce_lr_on_plateau_prints_one_line(capsys):
    x, y = _data()
    model = _compiled()
    capsys.readouterr()
    model.fit(x, y, batch_size=64, epochs=3, verbose=2, callbacks=[
        xmc_tf.callbacks.ReduceLROnPlateau(monitor="loss", patience=0,
                                           min_delta=1e9, factor=0.5,
                                           verbose=1)])
    out = capsys.readouterr().out
    reductions = [line for line in _lines(out) if "ReduceLROnPlateau" in line]
    # Epoch 1 sets the best loss; epochs 2 and 3 reduce.
    assert len(reductions) == 2 and "" not in _lines(out), out
    assert "reducing learning rate to 0.0005 " in reductions[0]
    assert float(model.optimizer.learning_rate) == pytest.approx(0.00025)


def test_trainer_predicts_no_rows():
    x, _ = _data()
    trainer = SampledTrainer(_model(xmc_tf.layers.LabelDense(M)),
                             UniformNegativeSampler(M, 5))
    assert trainer.predict(x[:0], verbose=0).shape == (0, M)
    assert trainer.predict(x[:3], verbose=0).shape == (3, M)


def test_dropped_training_metrics_are_said(caplog):
    many = 16385
    with caplog.at_level(logging.INFO, logger="absl"):
        trainer = SampledTrainer(_model(xmc_tf.layers.LabelDense(many)),
                                 UniformNegativeSampler(many, 5))
    assert not trainer.train_metrics
    assert any("no training P@k" in r.getMessage()
               and "train_metrics=True" in r.getMessage()
               for r in caplog.records)


def test_finished_workdir_names_the_python_argument(tmp_path):
    wd = Workdir(str(tmp_path))
    (tmp_path / Workdir.METRICS).write_text("{}")
    with pytest.raises(WorkdirFinished, match="overwrite=True"):
        wd.prepare_training()
