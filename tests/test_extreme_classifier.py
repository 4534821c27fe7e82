"""``xmc_tf.ExtremeClassifier``: the main job on scipy matrices.

Checked against independent references: the ``xmc-tf train`` command on the
same data (same metrics), NumPy P@k of ``predict``'s ids, the exported
SavedModel's ``serve``, an uninterrupted run (exact resume), and one-line
``ValueError`` s for bad input before anything is trained.
"""

import json
import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp

import xmc_tf
from xmc_tf_cli import cli
from xmc_tf import data as xdata
from xmc_tf.errors import (CheckpointError, IncompleteWorkdir,
                           WorkdirFinished)

SYN = "synthetic:num_instances=360,num_features=80,num_labels=20,seed=1"
QUIET = {"train.verbose": 0}


@pytest.fixture(scope="module")
def split():
    ds = xdata.load_dataset(SYN)
    train = xdata.XCDataset(ds.features[:300], ds.labels[:300])
    test = xdata.XCDataset(ds.features[300:], ds.labels[300:])
    return train, test


@pytest.fixture(scope="module")
def fitted(split, tmp_path_factory):
    train, test = split
    clf = xmc_tf.ExtremeClassifier(
        "uniform_sparse", dict(QUIET, **{"train.epochs": 3}),
        workdir=str(tmp_path_factory.mktemp("ec") / "run"))
    return clf.fit(train.features, train.labels,
                   test_data=(test.features, test.labels))


def _precision_at_1(ids, labels):
    dense = labels.toarray()
    return 100.0 * float(np.mean(dense[np.arange(len(ids)), ids[:, 0]]))


def test_cli_and_object_give_the_same_metrics(split, fitted, tmp_path,
                                              capsys):
    train, test = split
    xdata.write_xc(str(tmp_path / "train.txt"), train)
    xdata.write_xc(str(tmp_path / "test.txt"), test)
    workdir = tmp_path / "cli"
    code = cli.main(["xmc-tf", "train", "--config=uniform_sparse",
                     f"--workdir={workdir}", "--config.train.epochs=3",
                     "--config.train.verbose=0",
                     f"--config.data.train={tmp_path / 'train.txt'}",
                     f"--config.data.test={tmp_path / 'test.txt'}"])
    capsys.readouterr()
    assert code == 0
    with open(workdir / "metrics.json") as f:
        want = json.load(f)
    for key in ("P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "R@5", "epochs"):
        assert fitted.metrics_[key] == pytest.approx(want[key], abs=1e-6), key
    # evaluate() on the test arrays gives what fit recorded.
    got = fitted.evaluate(test.features, test.labels)
    for key in ("P@1", "P@3", "P@5", "PSP@3"):
        assert got[key] == pytest.approx(fitted.metrics_[key], abs=1e-4)


def test_predict_is_sorted_and_agrees_with_evaluate(split, fitted):
    _, test = split
    ids, scores = fitted.predict(test.features, k=4)
    assert ids.shape == scores.shape == (test.num_instances, 4)
    assert ids.dtype == np.int32 and scores.dtype == np.float32
    assert (np.diff(scores, axis=1) <= 0).all()
    assert ((ids >= 0) & (ids < 20)).all()
    assert all(len(set(row)) == 4 for row in ids)
    p1 = fitted.evaluate(test.features, test.labels, ks=(1,))["P@1"]
    assert p1 == pytest.approx(_precision_at_1(ids, test.labels), abs=1e-4)
    # Dense rows of the same features and id-list labels give the same.
    dense_ids, _ = fitted.predict(test.features.toarray(), k=4)
    np.testing.assert_array_equal(dense_ids, ids)
    id_lists = [list(r.indices) for r in test.labels]
    assert fitted.evaluate(test.features, id_lists, ks=(1,))["P@1"] == \
        pytest.approx(p1)


def test_save_load_and_export(split, fitted, tmp_path):
    _, test = split
    ids, scores = fitted.predict(test.features, k=3)
    fitted.save(str(tmp_path / "saved"))
    assert not os.path.exists(tmp_path / "saved" / "backup")
    loaded = xmc_tf.ExtremeClassifier.load(str(tmp_path / "saved"))
    got_ids, got_scores = loaded.predict(test.features, k=3)
    np.testing.assert_array_equal(got_ids, ids)
    np.testing.assert_allclose(got_scores, scores, rtol=1e-5, atol=1e-6)
    assert loaded.num_labels == 20 and loaded.num_features == 80
    assert loaded.config.model.head == "uniform_sparse"
    fitted.export(str(tmp_path / "sm"), k=3)
    served = xmc_tf.saving.load_saved_model(str(tmp_path / "sm"))
    x = test.features[:5].tocoo()
    out = served.signatures["serve"](
        indices=np.stack([x.row, x.col], 1).astype(np.int64),
        values=x.data.astype(np.float32),
        dense_shape=np.array(x.shape, np.int64))
    np.testing.assert_array_equal(
        np.asarray(out[sorted(out)[0]] if "ids" not in str(sorted(out))
                   else [v for k, v in out.items() if "id" in k][0]),
        ids[:5])
    with pytest.raises(IncompleteWorkdir):
        xmc_tf.ExtremeClassifier.load(str(tmp_path / "nothing"))


@pytest.mark.parametrize("call,message", [
    (lambda c, X, Y: c.fit(X[:10], Y[:9]), "X has 10 rows but Y has 9"),
    (lambda c, X, Y: c.fit(X[:0], Y[:0]), "X is empty"),
    (lambda c, X, Y: c.fit(X.toarray() * np.nan, Y), "NaN or infinite"),
    (lambda c, X, Y: c.fit(X, [[0]] * 299 + [[-2]]), "negative"),
    (lambda c, X, Y: c.fit(X, Y, validation_data=(X[:5], [[25]] * 5)),
     "out of range for 20 labels"),
    (lambda c, X, Y: c.fit(X, Y, test_data=(X[:5, :70], Y[:5])),
     "80 features"),
    (lambda c, X, Y: c.predict(X), "not fitted"),
])
def test_bad_input_is_one_value_error_before_training(split, tmp_path, call,
                                                      message):
    train, _ = split
    clf = xmc_tf.ExtremeClassifier("uniform_sparse", QUIET,
                                   workdir=str(tmp_path / "wd"))
    with pytest.raises(ValueError, match=message) as e:
        call(clf, train.features, train.labels)
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "wd" / "backup")


def test_bad_input_after_fit(split, fitted):
    _, test = split
    with pytest.raises(ValueError, match="trained on 80"):
        fitted.predict(test.features[:, :50])
    with pytest.raises(ValueError, match="out of range for 20 labels"):
        fitted.evaluate(test.features[:2], [[3], [21]])


def test_bad_config_overrides():
    with pytest.raises(ValueError, match="config.train.epoch: no such field"):
        xmc_tf.ExtremeClassifier("uniform_sparse", {"train.epoch": 3})
    with pytest.raises(ValueError, match="no config file or packaged"):
        xmc_tf.ExtremeClassifier("no_such_config")
    with pytest.raises(ValueError, match="config.train.epochs"):
        xmc_tf.ExtremeClassifier("uniform_sparse", {"train.epochs": "many"})


class _KillAt(keras.callbacks.Callback):
    """Stops the process's run at the end of an epoch, as a kill would
    (after that epoch's checkpoint: appended after the job's own)."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.epoch:
            raise KeyboardInterrupt


def test_workdir_resumes_exactly_and_refuses_other_data(split, fitted,
                                                        tmp_path):
    train, test = split
    workdir = str(tmp_path / "resumed")
    overrides = dict(QUIET, **{"train.epochs": 3})
    with pytest.raises(KeyboardInterrupt):
        xmc_tf.ExtremeClassifier("uniform_sparse", overrides, workdir,
                                 callbacks=[_KillAt(2)]).fit(
            train.features, train.labels,
            test_data=(test.features, test.labels))
    assert os.path.exists(os.path.join(workdir, "backup"))
    with pytest.raises(CheckpointError, match="other data"):
        xmc_tf.ExtremeClassifier("uniform_sparse", overrides, workdir).fit(
            train.features[:200], train.labels[:200],
            test_data=(test.features, test.labels))
    clf = xmc_tf.ExtremeClassifier("uniform_sparse", overrides, workdir).fit(
        train.features, train.labels, test_data=(test.features, test.labels))
    assert clf.metrics_["run"]["resumes"] == 1
    for key in ("P@1", "P@3", "P@5", "epochs"):
        assert clf.metrics_[key] == pytest.approx(fitted.metrics_[key],
                                                  abs=1e-6)
    with pytest.raises(WorkdirFinished):
        xmc_tf.ExtremeClassifier("uniform_sparse", overrides, workdir).fit(
            train.features, train.labels)
    xmc_tf.ExtremeClassifier("uniform_sparse", overrides, workdir,
                             overwrite=True).fit(train.features, train.labels)


def _multi_class(split):
    train, test = split
    one = [sp.csr_matrix((np.ones(d.num_instances, np.float32),
                          (np.arange(d.num_instances),
                           np.asarray(d.labels.argmax(axis=1)).ravel())),
                         shape=d.labels.shape) for d in (train, test)]
    return (xdata.XCDataset(train.features, one[0]),
            xdata.XCDataset(test.features, one[1]))


@pytest.mark.parametrize("name,overrides", [
    ("dense", {}), ("linear", {}), ("mach", {"model.num_buckets": 8,
                                             "model.num_repetitions": 2}),
    ("astra", {}), ("lsh", {}), ("scent", {}),
    ("uniform_sparse", {"model.ensemble_size": 2}),
])
def test_every_config_fits_predicts_and_evaluates(split, name, overrides):
    train, test = _multi_class(split) if name == "scent" else split
    clf = xmc_tf.ExtremeClassifier(
        name, dict(QUIET, **{"train.epochs": 1}, **overrides))
    clf.fit(train.features, train.labels)
    ids, scores = clf.predict(test.features, k=3)
    assert ids.shape == (test.num_instances, 3)
    assert (np.diff(scores, axis=1) <= 0).all()
    result = clf.evaluate(test.features, test.labels, ks=(1, 3))
    assert result["P@1"] == pytest.approx(
        _precision_at_1(ids, test.labels), abs=1e-4)
    assert clf.metrics_["head"] == clf.config.model.head


def test_metrics_record_the_resolved_config(fitted):
    config = fitted.metrics_["config"]
    assert config["data"]["normalize"] in ("tfidf", "l2")  # was "auto"
    assert isinstance(config["tree"]["enabled"], bool)
    assert fitted.metrics_["regime"]["fields"]["data.normalize"] == \
        config["data"]["normalize"]


def test_auto_override_leaves_a_typed_field_to_the_data():
    clf = xmc_tf.ExtremeClassifier("uniform_sparse",
                                   {"train.batch_size": "auto"})
    assert clf.config.train.batch_size is None
    clf.config.train.batch_size = 32  # still an int field
    assert clf.config.train.batch_size == 32


def test_a_second_fit_without_workdir_retrains(split):
    train, test = split
    clf = xmc_tf.ExtremeClassifier("linear", dict(QUIET, **{"train.epochs": 1}))
    first = clf.fit(train.features, train.labels).predict(test.features[:5])
    clf.fit(train.features[:200], train.labels[:200])  # other data: retrained
    assert clf.metrics_["num_train_instances"] == 200
    assert clf.predict(test.features[:5])[0].shape == first[0].shape
