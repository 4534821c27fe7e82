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
a = sm.serve(sp).numpy(); b = model(sp).numpy()
assert a.shape == (4, 50), a.shape
np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
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
