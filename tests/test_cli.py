"""End-to-end test of the `xmc-tf` command on small synthetic XC-repo files.

Checks the documented contract: `train` with --config.data.train/test writes
metrics.json (required keys), model.keras and saved_model/; `evaluate`
reproduces the metrics; `predict` writes top-k ids whose P@1, recomputed here
from the file and the true labels, equals the reported P@1.
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from xmc_tf import data as xdata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.train.epochs=2", "--config.model.encoder_dims=(32,)",
         "--config.model.intermediate_dim=64",
         "--config.model.connections_per_label=8",
         "--config.set.every_n_steps=3", "--config.train.batch_size=32",
         "--config.train.verbose=0"]


def xmc_tf_cmd(*args):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", "xmc_tf", *args], env=env,
                          capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    data = xdata.make_synthetic(600, 200, 50, seed=3)
    train = xdata.XCDataset(features=data.features[:450], labels=data.labels[:450])
    test = xdata.XCDataset(features=data.features[450:], labels=data.labels[450:])
    xdata.write_xc(tmp / "train.txt.gz", train)
    xdata.write_xc(tmp / "test.txt", test)
    workdir = tmp / "run"
    out = xmc_tf_cmd("train", "--config=configs/uniform_sparse.py",
                     f"--config.data.train={tmp / 'train.txt.gz'}",
                     f"--config.data.test={tmp / 'test.txt'}",
                     f"--workdir={workdir}", *SMALL)
    return tmp, workdir, test, out


def test_train_outputs(trained):
    _, workdir, test, out = trained
    metrics = json.loads((workdir / "metrics.json").read_text())
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "train_seconds",
                "epochs", "num_labels", "peak_memory_bytes"]:
        assert key in metrics, key
    assert metrics["num_labels"] == 50
    assert metrics["epochs"] == 2
    assert 0.0 <= metrics["P@1"] <= 100.0
    assert metrics["peak_memory_bytes"] > 10 * 2**20
    assert (workdir / "model.keras").is_file()
    assert (workdir / "saved_model" / "saved_model.pb").is_file()
    assert "P@1" in out  # the printed results table


def test_evaluate_reproduces_metrics(trained):
    tmp, workdir, _, _ = trained
    out = xmc_tf_cmd("evaluate", f"--workdir={workdir}",
                     f"--data={tmp / 'test.txt'}")
    evaluated = json.loads(out.strip().splitlines()[-1])
    metrics = json.loads((workdir / "metrics.json").read_text())
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5"]:
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-6)


def test_predict_file_matches_reported_precision(trained):
    tmp, workdir, test, _ = trained
    pred = tmp / "pred.txt"
    xmc_tf_cmd("predict", f"--workdir={workdir}", f"--data={tmp / 'test.txt'}",
               f"--output={pred}", "--k=3")
    lines = pred.read_text().splitlines()
    assert len(lines) == test.num_instances
    top1 = np.array([int(line.split()[0].split(":")[0]) for line in lines])
    assert all(len(line.split()) == 3 for line in lines)
    hits = np.asarray(test.labels[np.arange(len(top1)), top1]).ravel()
    hits = hits.astype(np.float64)  # the reported metrics are float64
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert 100.0 * hits.mean() == pytest.approx(metrics["P@1"], abs=1e-6)


def test_saved_model_serves_in_new_process(trained):
    tmp, workdir, test, _ = trained
    features = xdata.normalize_features(test.features[:4], "none")[0]
    np.save(tmp / "dense_x.npy", features.toarray())
    script = f"""
import numpy as np, tensorflow as tf, keras
import xmc_tf
from xmc_tf.train import load_for_model
sm = tf.saved_model.load({str(workdir / 'saved_model')!r})
model = keras.models.load_model({str(workdir / 'model.keras')!r}, compile=False)
data = load_for_model({str(tmp / 'test.txt')!r}, {str(workdir)!r})
x = data.features[:4].tocoo()
sp = tf.SparseTensor(np.stack([x.row, x.col], 1).astype(np.int64),
                     x.data.astype(np.float32), x.shape)
sp = tf.sparse.reorder(sp)
b = model(sp).numpy()
parts = dict(indices=sp.indices, values=sp.values, dense_shape=sp.dense_shape)
a = sm.score_all_labels(**parts)["label_scores"].numpy()
assert a.shape == (4, 50), a.shape
np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
top = sm.signatures["serve"](**parts)      # the named serving signature
ids, scores = top["label_ids"].numpy(), top["scores"].numpy()
assert ids.shape == (4, 5), ids.shape
np.testing.assert_allclose(scores, -np.sort(-b, axis=1)[:, :5], rtol=1e-5,
                           atol=1e-5)
np.testing.assert_allclose(np.take_along_axis(b, ids, 1), scores, rtol=1e-5,
                           atol=1e-5)
print("OK")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_bad_command_is_usage_error():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", "xmc_tf", "fly", "--workdir=/tmp/x"],
                          env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0
    assert "usage: xmc-tf" in proc.stderr + proc.stdout


# --------------------------------------------------------------------------
# The MACH head through the same command (configs/mach.py).

MACH_SMALL = ["--config.train.epochs=2", "--config.model.encoder_dims=(32,)",
              "--config.model.intermediate_dim=16",
              "--config.model.num_buckets=8",
              "--config.model.num_repetitions=4",
              "--config.train.batch_size=32", "--config.train.verbose=0"]


@pytest.fixture(scope="module")
def trained_mach(trained):
    tmp = trained[0]
    workdir = tmp / "mach"
    xmc_tf_cmd("train", "--config=configs/mach.py",
               f"--config.data.train={tmp / 'train.txt.gz'}",
               f"--config.data.test={tmp / 'test.txt'}",
               f"--workdir={workdir}", *MACH_SMALL)
    return tmp, workdir, trained[2]


def _mach_brute_force_top_k(workdir, data_path, k):
    """Top-k by scoring all labels in NumPy from the saved model's logits."""
    import keras
    import tensorflow as tf
    import xmc_tf
    from xmc_tf.train import load_for_model
    model = keras.models.load_model(workdir / "model.keras", compile=False)
    head = model.get_layer("output")
    assert isinstance(head, xmc_tf.layers.MachHead)
    data = load_for_model(str(data_path), str(workdir))
    x = data.features.tocoo()
    sp = tf.sparse.reorder(tf.SparseTensor(
        np.stack([x.row, x.col], 1).astype(np.int64),
        x.data.astype(np.float32), x.shape))
    z = model(sp).numpy().astype(np.float64)  # [n, R, B]
    assert head.decode_activation == "sigmoid"  # the config's loss is bce
    p = 1.0 / (1.0 + np.exp(-z))
    h = head.hashing
    m = h.num_labels
    scores = np.zeros((z.shape[0], m))
    for r, (a, b) in enumerate(zip(h.hash_a, h.hash_b)):
        buckets = ((a * np.arange(m, dtype=np.int64) + b) % h.prime) % h.num_buckets
        scores += p[:, r, buckets]
    scores /= h.num_repetitions
    return np.array([sorted(range(m), key=lambda j: (-row[j], j))[:k]
                     for row in scores]), head


def test_mach_train_outputs_and_evaluate(trained_mach):
    tmp, workdir, _ = trained_mach
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert metrics["head"] == "mach"
    assert (metrics["num_buckets"], metrics["num_repetitions"]) == (8, 4)
    # kernel [R, d, B] + bias [R, B], float32.
    assert metrics["output_layer_bytes"] == 4 * 4 * 8 * (16 + 1)
    assert metrics["model_bytes"] > metrics["output_layer_bytes"]
    history = (workdir / "history.csv").read_text()
    assert "val_precision_at_3" in history  # the LR schedule's monitor
    out = xmc_tf_cmd("evaluate", f"--workdir={workdir}",
                     f"--data={tmp / 'test.txt'}")
    evaluated = json.loads(out.strip().splitlines()[-1])
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5"]:
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-6)


def test_mach_predict_and_saved_model_match_brute_force(trained_mach):
    tmp, workdir, test = trained_mach
    pred = tmp / "mach_pred.txt"
    xmc_tf_cmd("predict", f"--workdir={workdir}", f"--data={tmp / 'test.txt'}",
               f"--output={pred}", "--k=3")
    got = np.array([[int(t.split(":")[0]) for t in line.split()]
                    for line in pred.read_text().splitlines()])
    expected, _ = _mach_brute_force_top_k(workdir, tmp / "test.txt", 5)
    # Labels sharing all R buckets tie exactly in both (lower id first).
    np.testing.assert_array_equal(got, expected[:, :3])
    metrics = json.loads((workdir / "metrics.json").read_text())
    hits = np.asarray(test.labels[np.arange(len(got)), got[:, 0]]).ravel()
    assert 100.0 * hits.astype(np.float64).mean() == pytest.approx(
        metrics["P@1"], abs=1e-6)
    script = f"""
import numpy as np, tensorflow as tf
import xmc_tf
from xmc_tf.train import load_for_model
sm = tf.saved_model.load({str(workdir / 'saved_model')!r})
data = load_for_model({str(tmp / 'test.txt')!r}, {str(workdir)!r})
x = data.features.tocoo()
sp = tf.sparse.reorder(tf.SparseTensor(
    np.stack([x.row, x.col], 1).astype(np.int64), x.data.astype(np.float32),
    x.shape))
out = sm.signatures["serve"](indices=sp.indices, values=sp.values,
                             dense_shape=sp.dense_shape)
np.save({str(tmp / 'served.npy')!r}, out["label_ids"].numpy())
print("OK", out["scores"].shape)
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp / "served.npy"), expected)


def test_mach_head_rejects_label_wise_loss(tmp_path):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run(
        [sys.executable, "-m", "xmc_tf", "train", "--config=configs/mach.py",
         "--config.loss=squared_hinge", f"--workdir={tmp_path}"],
        env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode != 0
    assert "does not fit head 'mach'" in proc.stderr
