"""Portable SavedModels: export_saved_model traces the signatures with
TensorFlow's own ops where every Xmc> op has a TensorFlow formulation
(Xmc>TopK, Xmc>EmbeddingBag, the uniform-sparse products, MACH's decoder:
every packaged config), and such a SavedModel serves, in a new process that
never imports xmc_tf, the scores and top-k of the Keras model (its own
top-k from the Xmc> ops).  Also the stock formulations themselves against
the ops and NumPy."""

import os
import subprocess
import sys
import threading

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.core.protobuf import saved_model_pb2

from xmc_tf import config as xconfig
from xmc_tf import decoding, saving
from xmc_tf.job.build import build_model
from xmc_tf.layers import UniformSparseDense
from xmc_tf.ops import mach, stock, topk
from xmc_tf.ops import uniform_sparse as us

NUM_FEATURES, NUM_LABELS, K = 30, 12, 3


def saved_ops(path):
    """Xmc> op types in a SavedModel's graphs (functions included)."""
    proto = saved_model_pb2.SavedModel()
    with open(os.path.join(path, "saved_model.pb"), "rb") as f:
        proto.ParseFromString(f.read())
    return stock.custom_op_types(mg.graph_def for mg in proto.meta_graphs)


def make_model(name, sparse_input, **model_fields):
    config = xconfig.get_config(name)
    for field, value in model_fields.items():
        setattr(config.model, field, value)
    config = xconfig.resolve_regime(config, multi_class=name == "scent")
    return build_model(config, NUM_FEATURES, NUM_LABELS,
                       sparse_input=sparse_input)


def randomize(model, seed=0):
    """Random float weights (so that no two labels tie), integer ones
    (connections) kept."""
    rng = np.random.default_rng(seed)
    for v in model.weights:
        if v.dtype in ("float32", "float16", "bfloat16"):
            v.assign(rng.normal(0, 0.5, v.shape).astype(v.dtype))


def serve_in_fresh_process(tmp_path, path, parts, all_scores=True):
    """Loads the SavedModel at ``path`` in a new interpreter that never
    imports xmc_tf and calls its signatures on ``parts``; returns
    ``(ids, best, scores or None)``."""
    np.savez(tmp_path / "inputs.npz", **parts)
    out = tmp_path / "out.npz"
    script = f"""
import sys
import numpy as np
import tensorflow as tf
sm = tf.saved_model.load({path!r})
parts = dict(np.load({str(tmp_path / 'inputs.npz')!r}))
top = sm.signatures["serve"](**parts)
got = dict(ids=top["label_ids"].numpy(), best=top["scores"].numpy())
if {all_scores!r}:
    got["scores"] = sm.signatures["score_all_labels"](
        **parts)["label_scores"].numpy()
np.savez({str(out)!r}, **got)
assert not [m for m in sys.modules if m.startswith("xmc_tf")], "xmc_tf"
print("OK")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True, cwd=str(tmp_path))
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    got = np.load(out)
    return got["ids"], got["best"], got["scores"] if all_scores else None


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
    ids, best, scores = serve_in_fresh_process(tmp_path, path, parts)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(best, -np.sort(-expected, 1)[:, :K],
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        np.take_along_axis(expected, ids, 1), best, rtol=1e-5, atol=1e-6)


# Small uniform-sparse models: the output layer (fan-in 8 from a 64-wide
# intermediate layer) and, on sparse input, the wide path (8 connections
# per label into the 30 input features).
SMALL_US = dict(encoder_dims=(32,), intermediate_dim=64,
                connections_per_label=8)


@pytest.mark.parametrize("sparse_input,wide", [
    (True, 8), (True, 0), (False, 0)],
    ids=["sparse-wide", "sparse-nowide", "dense"])
def test_uniform_sparse_model_exports_portable(tmp_path, sparse_input, wide):
    """The default config's model (uniform-sparse output layer, wide path on
    sparse input): portable=True writes no Xmc> op, and a process without
    xmc_tf serves the model's own top-k (Xmc> ops) and scores."""
    model = make_model("uniform_sparse", sparse_input, wide_connections=wide,
                       **SMALL_US)
    wide_layers = [layer for layer in model._flatten_layers()
                   if isinstance(layer, UniformSparseDense)]
    assert len(wide_layers) == (2 if wide else 1)
    randomize(model)
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K, portable=True) is True
    assert saved_ops(path) == []
    dense, parts = features(sparse_input, rows=6)
    x = tf.sparse.from_dense(dense) if sparse_input else dense
    want_ids, want_best = decoding.top_k_function(model, K)(x)  # Xmc> ops
    expected = keras_scores(model, dense, sparse_input)
    ids, best, scores = serve_in_fresh_process(tmp_path, path, parts)
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_allclose(best, want_best.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(scores, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("sparse_input", [True, False])
def test_mach_model_exports_portable(tmp_path, sparse_input):
    """MACH: the serve signature decodes with TensorFlow's ops the same ids
    and scores as Xmc>MachTopK (the model's own decoder)."""
    model = make_model("mach", sparse_input, encoder_dims=(32,),
                       intermediate_dim=16, num_buckets=8, num_repetitions=3)
    randomize(model, seed=1)
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K, portable=True) is True
    assert saved_ops(path) == []
    dense, parts = features(sparse_input, rows=7, seed=2)
    x = tf.sparse.from_dense(dense) if sparse_input else dense
    want_ids, want_best = decoding.top_k_function(model, K)(x)
    ids, best, _ = serve_in_fresh_process(tmp_path, path, parts,
                                          all_scores=False)
    np.testing.assert_array_equal(ids, want_ids.numpy())
    np.testing.assert_allclose(best, want_best.numpy(), rtol=1e-6, atol=0)
    # The Xmc> export still decodes with the op.
    fast = str(tmp_path / "fast")
    assert saving.export_saved_model(model, fast, k=K,
                                     portable=False) is False
    assert "Xmc>MachTopK" in saved_ops(fast)


class _InvertedIndexScores(keras.layers.Layer):
    """A layer whose output needs Xmc>UniformSparseInvertedIndex, an op
    without a TensorFlow formulation (not used by a packaged model)."""

    def build(self, input_shape):
        self.connections = self.add_weight(
            name="connections", shape=(4, 2), dtype="int32",
            initializer="zeros", trainable=False)

    def call(self, x):
        offsets, _ = us.uniform_sparse_inverted_index(self.connections,
                                                      x.shape[-1])
        return x + tf.cast(offsets[1:], x.dtype)[None]


def test_model_with_an_op_without_stock_formulation(tmp_path):
    inputs = keras.Input((NUM_FEATURES,))
    model = keras.Model(inputs, _InvertedIndexScores(name="offsets")(inputs))
    path = str(tmp_path / "sm")
    assert saving.export_saved_model(model, path, k=K) is False  # auto
    ops = saved_ops(path)
    assert "Xmc>UniformSparseInvertedIndex" in ops
    # Not portable anyway, so the fast ops serve (when the library has them).
    if topk.top_k_supported():
        assert "Xmc>TopK" in ops
    with pytest.raises(ValueError, match="Xmc>UniformSparseInvertedIndex"):
        saving.export_saved_model(model, str(tmp_path / "p"), k=K,
                                  portable=True)


def test_default_export_of_uniform_sparse_keeps_the_fast_ops(tmp_path):
    """portable=None uses only the equally fast stock equivalents, so a
    uniform-sparse model keeps its Xmc> ops (TopK included); portable=True
    writes it with TensorFlow's ops only."""
    model = make_model("uniform_sparse", True, wide_connections=8, **SMALL_US)
    assert saving.export_saved_model(model, str(tmp_path / "a"),
                                     k=K) is False
    ops = saved_ops(str(tmp_path / "a"))
    assert {"Xmc>UniformSparseMatmul",
            "Xmc>UniformSparseMatmulSparseInput"} <= set(ops), ops
    assert saving.export_saved_model(model, str(tmp_path / "b"), k=K,
                                     portable=True) is True
    assert saved_ops(str(tmp_path / "b")) == []


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


# ---------------------------------------------------------------------------
# The stock formulations against the ops and NumPy.

def _reference(x, idx, w):
    return np.einsum("bms,ms->bm", x.astype(np.float64)[:, idx],
                     w.astype(np.float64))


@pytest.mark.parametrize("batch", [1, 3, 40])
@pytest.mark.parametrize("m,s,e", [(7, 3, 5), (3000, 16, 64)])
def test_uniform_sparse_stock_matches_op_and_numpy(batch, m, s, e):
    rng = np.random.default_rng(batch * 7 + m)
    x = rng.standard_normal((batch, e)).astype(np.float32)
    idx = rng.integers(0, e, (m, s)).astype(np.int32)
    idx[::2, 1] = idx[::2, 0]  # duplicate sources within a label row
    w = rng.standard_normal((m, s)).astype(np.float32)
    want = _reference(x, idx, w)
    got = us.uniform_sparse_matmul_stock(x, idx, w).numpy()
    assert got.shape == (batch, m) and got.dtype == np.float32
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, us.uniform_sparse_matmul(x, idx, w),
                               rtol=1e-5, atol=1e-5)
    # Inside stock_ops the wrapper traces to it, with no Xmc> op.
    fn = tf.function(lambda x: us.uniform_sparse_matmul(x, idx, w))
    with stock.stock_ops():
        concrete = fn.get_concrete_function(tf.TensorSpec([None, e]))
    assert stock.custom_op_types([concrete.graph.as_graph_def()]) == []
    np.testing.assert_allclose(concrete(tf.constant(x)), want, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("dtype,tol", [("float16", 4e-3),
                                       ("bfloat16", 3e-2)])
def test_uniform_sparse_stock_mixed_precision(dtype, tol):
    """Compute dtype in and out, products and sums in float32 (as the op)."""
    rng = np.random.default_rng(3)
    x = tf.cast(rng.standard_normal((5, 40)), dtype)
    idx = rng.integers(0, 40, (300, 8)).astype(np.int32)
    w = tf.cast(rng.standard_normal((300, 8)), dtype)
    got = us.uniform_sparse_matmul_stock(x, idx, w)
    assert got.dtype == dtype
    op = us.uniform_sparse_matmul(x, idx, w)
    want = _reference(tf.cast(x, tf.float32).numpy(), idx,
                      tf.cast(w, tf.float32).numpy())
    scale = np.abs(want).max()
    for out in (got, op):
        np.testing.assert_allclose(tf.cast(out, tf.float32).numpy() / scale,
                                   want / scale, atol=tol)


def test_uniform_sparse_sparse_input_stock_matches_op():
    """The sparse-input product inside stock_ops: the same scores as the op
    (repeated entries of the batch add up), with no Xmc> op."""
    rng = np.random.default_rng(4)
    e, m, s = 50, 400, 6
    idx = rng.integers(0, e, (m, s)).astype(np.int32)
    idx[:, 2] = idx[:, 1]
    w = rng.standard_normal((m, s)).astype(np.float32)
    coords = np.array([[0, 3], [0, 7], [2, 3], [2, 3], [2, 49], [1, 0]],
                      np.int64)  # row 2 stores feature 3 twice
    values = rng.standard_normal(len(coords)).astype(np.float32)
    sp_input = tf.SparseTensor(coords, values, [4, e])
    dense = np.zeros((4, e), np.float32)
    np.add.at(dense, (coords[:, 0], coords[:, 1]), values)
    want = _reference(dense, idx, w)
    fast = us.uniform_sparse_matmul_sparse_input(sp_input, idx, w)
    fn = tf.function(lambda i, v, d: us.uniform_sparse_matmul_sparse_input(
        tf.SparseTensor(i, v, d), idx, w))
    with stock.stock_ops():
        concrete = fn.get_concrete_function(
            tf.TensorSpec([None, 2], tf.int64), tf.TensorSpec([None]),
            tf.TensorSpec([2], tf.int64))
    assert stock.custom_op_types([concrete.graph.as_graph_def()]) == []
    got = concrete(sp_input.indices, sp_input.values, sp_input.dense_shape)
    np.testing.assert_allclose(fast, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_uniform_sparse_stock_rejects_bad_operands():
    x = np.ones((2, 5), np.float32)
    with pytest.raises(ValueError, match="must equal indices shape"):
        us.uniform_sparse_matmul_stock(x, np.zeros((3, 2), np.int32),
                                       np.zeros((3, 4), np.float32))
    with pytest.raises(tf.errors.InvalidArgumentError):
        us.uniform_sparse_matmul_stock(x, np.full((3, 2), 5, np.int32),
                                       np.zeros((3, 2), np.float32))


def _mach_reference(probs, hashing, k):
    """NumPy: float32 sum in repetition order, / R; best first, ties by
    the lower id (a stable sort of the negated scores)."""
    h = hashing.buckets_numpy(np.arange(hashing.num_labels))  # [m, R]
    total = np.zeros((probs.shape[0], hashing.num_labels), np.float32)
    for r in range(hashing.num_repetitions):
        total = total + probs[:, r, h[:, r]]
    scores = total / np.float32(hashing.num_repetitions)
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    return order, np.take_along_axis(scores, order, 1)


@pytest.mark.parametrize("m,B,R,batch,k", [
    (50, 4, 3, 5, 7),        # many labels share all their buckets: ties
    (10, 2, 2, 4, 10),       # k = m
    (3000, 32, 4, 3, 5),
    (20000, 64, 8, 70, 10),  # several label blocks
])
def test_mach_stock_matches_op_bitwise(m, B, R, batch, k):
    rng = np.random.default_rng(m)
    hashing = mach.MachHashing.random(m, B, R, seed=1)
    probs = tf.nn.softmax(rng.standard_normal((batch, R, B)), -1)
    probs = tf.cast(probs, tf.float32)
    want_ids, want_scores = _mach_reference(probs.numpy(), hashing, k)
    ids, scores = mach.mach_top_k_stock(probs, k, hashing)
    op_ids, op_scores = mach.mach_top_k(probs, k, hashing)
    np.testing.assert_array_equal(ids, want_ids)
    np.testing.assert_array_equal(scores, want_scores)
    np.testing.assert_array_equal(ids, op_ids)
    np.testing.assert_array_equal(scores, op_scores)
    fn = tf.function(lambda p: mach.mach_top_k(p, k, hashing))
    with stock.stock_ops():
        concrete = fn.get_concrete_function(tf.TensorSpec([None, R, B]))
    assert stock.custom_op_types([concrete.graph.as_graph_def()]) == []
    np.testing.assert_array_equal(concrete(probs)[0], want_ids)


def test_mach_stock_small_blocks_and_overflow(monkeypatch):
    """Blocks smaller than m, a last block shorter than k, and scores that
    overflow to +-inf: ranked as the op ranks them (ties by lower id)."""
    monkeypatch.setattr(mach, "STOCK_BLOCK_ELEMENTS", 1)  # block = k
    hashing = mach.MachHashing.random(23, 3, 2, seed=5)
    probs = np.zeros((3, 2, 3), np.float32)
    probs[1] = 3e38        # every label +inf
    probs[2, :, 0] = -3e38  # the labels of bucket 0 in both: -inf
    probs[2, :, 1] = 1.0
    ids, scores = mach.mach_top_k_stock(probs, 5, hashing)
    op_ids, op_scores = mach.mach_top_k(probs, 5, hashing)
    np.testing.assert_array_equal(ids, op_ids)
    np.testing.assert_array_equal(scores, op_scores)
    assert np.isinf(scores[1]).all()


def test_mach_stock_rejects_non_finite_and_bad_k():
    hashing = mach.MachHashing.random(20, 4, 2, seed=0)
    bad = np.full((1, 2, 4), np.nan, np.float32)
    with pytest.raises(tf.errors.InvalidArgumentError, match="finite"):
        mach.mach_top_k_stock(bad, 2, hashing)
    with pytest.raises(ValueError, match="k must be"):
        mach.mach_top_k_stock(np.zeros((1, 2, 4), np.float32), 21, hashing)
    with pytest.raises(ValueError, match="shape"):
        mach.mach_top_k_stock(np.zeros((1, 3, 4), np.float32), 2, hashing)
