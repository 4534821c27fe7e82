"""Portable SavedModels: export_saved_model traces the signatures with
TensorFlow's own ops where every Xmc> op has an equivalent (Xmc>TopK,
Xmc>EmbeddingBag), and such a SavedModel serves, in a new process that
never imports xmc_tf, the scores and top-k of the Keras model."""

import os
import subprocess
import sys
import threading

import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from xmc_tf import config as xconfig
from xmc_tf import saving
from xmc_tf.job.build import build_model
from xmc_tf.ops import stock, topk

NUM_FEATURES, NUM_LABELS, K = 30, 12, 3


def saved_ops(path):
    """Xmc> op types in a SavedModel's graphs (functions included)."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return stock.custom_op_types(mg.graph_def for mg in proto.meta_graphs)


def make_model(name, sparse_input):
    config = xconfig.resolve_regime(xconfig.get_config(name),
                                    multi_class=name == "scent")
    return build_model(config, NUM_FEATURES, NUM_LABELS,
                       sparse_input=sparse_input)


def features(sparse_input, rows=5, seed=0):
    rng = np.random.default_rng(seed)
    dense = rng.random((rows, NUM_FEATURES)).astype(np.float32)
    dense[dense < 0.6] = 0.0
    if not sparse_input:
        return dense, {"features": dense}
    idx = np.argwhere(dense).astype(np.int64)  # row-major order
    parts = {"indices": idx, "values": dense[idx[:, 0], idx[:, 1]],
             "dense_shape": np.array(dense.shape, np.int64)}
    return dense, parts


def keras_scores(model, dense, sparse_input):
    x = tf.sparse.from_dense(dense) if sparse_input else dense
    return model(x, training=False).numpy()


@pytest.mark.parametrize("name,sparse_input", [
    ("scent", True), ("linear", True), ("dense", False)])
def test_portable_savedmodel_serves_without_xmc_tf(tmp_path, name,
                                                   sparse_input):
    model = make_model(name, sparse_input)
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K) is True
    assert saved_ops(path) == []
    dense, parts = features(sparse_input)
    expected = keras_scores(model, dense, sparse_input)
    np.savez(tmp_path / "inputs.npz", **parts)
    script = f"""
import sys
import numpy as np
import tensorflow as tf
sm = tf.saved_model.load({path!r})
parts = dict(np.load({str(tmp_path / 'inputs.npz')!r}))
scores = sm.signatures["score_all_labels"](**parts)["label_scores"].numpy()
top = sm.signatures["serve"](**parts)
np.savez({str(tmp_path / 'out.npz')!r}, scores=scores,
         ids=top["label_ids"].numpy(), best=top["scores"].numpy())
assert not [m for m in sys.modules if m.startswith("xmc_tf")]
print("OK")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    out = np.load(tmp_path / "out.npz")
    np.testing.assert_allclose(out["scores"], expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["best"], -np.sort(-expected, 1)[:, :K],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.take_along_axis(expected, out["ids"], 1), out["best"],
        rtol=1e-5, atol=1e-6)


def test_model_with_uniform_sparse_layer_keeps_xmc_ops(tmp_path):
    model = make_model("uniform_sparse", True)
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K) is False
    ops = saved_ops(path)
    assert "Xmc>UniformSparseMatmul" in ops
    # Not portable anyway, so the fast ops serve (when the library has them).
    if topk.top_k_supported():
        assert "Xmc>TopK" in ops
    with pytest.raises(ValueError, match="Xmc>UniformSparseMatmul"):
        saving.export_saved_model(model, str(tmp_path / "p"), k=K,
                                  portable=True)


def test_portable_false_uses_xmc_ops(tmp_path):
    if not topk.top_k_supported():
        pytest.skip("the op library has no Xmc>TopK here")
    model = make_model("scent", True)
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K,
                                     portable=False) is False
    assert "Xmc>TopK" in saved_ops(path)
    loaded = saving.load_saved_model(path)
    dense, parts = features(True, seed=1)
    np.testing.assert_allclose(
        loaded.signatures["score_all_labels"](**parts)["label_scores"],
        keras_scores(model, dense, True), rtol=1e-5, atol=1e-6)


def test_stock_ops_nests_and_is_per_thread():
    assert not stock.stock_ops_only()
    seen = []
    with stock.stock_ops():
        with stock.stock_ops():
            assert stock.stock_ops_only()
        assert stock.stock_ops_only()  # the inner exit keeps the outer on
        worker = threading.Thread(
            target=lambda: seen.append(stock.stock_ops_only()))
        worker.start()
        worker.join()
        assert not topk.top_k_supported()
    assert seen == [False]
    assert not stock.stock_ops_only()
