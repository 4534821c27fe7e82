"""A Keras user's own functional models through xmc_tf's decoding and
export: several outputs (the label-scoring one found structurally, or
named), several inputs (each a named signature input), scipy CSR input to
``top_k_function``, float32 scores under ``mixed_float16``.  The reference
is the model's own output ranked by NumPy."""

import logging

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from xmc_tf import decoding, saving

NUM_FEATURES, NUM_LABELS = 40, 60


def _sparse(n=9, seed=0):
    return sp.random(n, NUM_FEATURES, 0.2, format="csr", dtype=np.float32,
                     random_state=seed)


def _sparse_tensor(x):
    coo = sp.coo_matrix(x)
    order = np.lexsort((coo.col, coo.row))
    return tf.SparseTensor(np.stack([coo.row[order], coo.col[order]], 1)
                           .astype(np.int64), coo.data[order],
                           np.asarray(coo.shape, np.int64))


def _parts(x, prefix=""):
    """The serve signature's inputs of a sparse input named ``prefix``."""
    st = _sparse_tensor(x)
    return {f"{prefix}indices": st.indices, f"{prefix}values": st.values,
            f"{prefix}dense_shape": st.dense_shape}


def _top5(scores):
    scores = np.asarray(scores, np.float32)
    return np.argsort(-scores, axis=1, kind="stable")[:, :5]


def _two_output_model():
    x = keras.Input((NUM_FEATURES,), sparse=True, name="text")
    h = xmc_tf.layers.SparseEmbeddingBag(16)(x)
    h = keras.layers.Dense(32, activation="relu", name="hidden")(h)
    labels = xmc_tf.layers.UniformSparseDense(NUM_LABELS, 8, seed=1,
                                              name="scores")(h)
    count = keras.layers.Dense(1, name="count")(h)
    # Keras orders dict outputs by key: "count" comes first.
    return keras.Model(x, {"labels": labels, "count": count})


def test_two_outputs_export_the_label_scoring_one(tmp_path):
    model = _two_output_model()
    x = _sparse()
    want = _top5(model(_sparse_tensor(x))["labels"])
    ids, scores = decoding.top_k_function(model, 5)(x)
    np.testing.assert_array_equal(ids.numpy(), want)
    saving.export_saved_model(model, str(tmp_path / "sm"), k=5)
    sm = saving.load_saved_model(str(tmp_path / "sm"))
    out = sm.signatures["serve"](**_parts(x))
    np.testing.assert_array_equal(out["label_ids"].numpy(), want)
    every = sm.score_all_labels(**_parts(x))["label_scores"]
    assert every.shape == (9, NUM_LABELS)
    # Named: by dict key, by the output layer's name, by position.
    for output in ("labels", "scores", 1):
        assert decoding.label_output(model, output).outputs[0].shape[-1] \
            == NUM_LABELS
    assert decoding.label_output(model, "count").outputs[0].shape[-1] == 1
    with pytest.raises(ValueError, match="k=5 must be in"):
        decoding.top_k_function(model, 5, output="count")
    with pytest.raises(ValueError, match="not an output"):
        decoding.label_output(model, "nope")


def test_two_plain_outputs_ask_for_output():
    x = keras.Input((NUM_FEATURES,))
    model = keras.Model(x, [keras.layers.Dense(7)(x), keras.layers.Dense(7)(x)])
    with pytest.raises(ValueError, match="pass output="):
        decoding.top_k_function(model, 3)
    # The widest plain output is chosen when it is the only one.
    model = keras.Model(x, {"a": keras.layers.Dense(3)(x),
                            "b": keras.layers.Dense(9, name="wide")(x)})
    assert decoding.label_output(model).outputs[0].shape[-1] == 9


def _two_input_model():
    text = keras.Input((NUM_FEATURES,), sparse=True, name="text")
    meta = keras.Input((3,), name="meta")
    h = xmc_tf.layers.SparseEmbeddingBag(16)(text)
    h = keras.layers.Concatenate()([h, meta])
    h = keras.layers.Dense(32, activation="relu")(h)
    scores = xmc_tf.layers.UniformSparseDense(NUM_LABELS, 8, seed=1)(h)
    return keras.Model({"text": text, "meta": meta}, scores)


def test_two_inputs_serve_by_name(tmp_path):
    model = _two_input_model()
    x = _sparse(seed=3)
    meta = np.random.default_rng(0).normal(size=(9, 3)).astype(np.float32)
    full = model({"text": _sparse_tensor(x),
                  "meta": tf.constant(meta)}).numpy()
    ids, _ = decoding.top_k_function(model, 5)({"text": x, "meta": meta})
    np.testing.assert_array_equal(ids.numpy(), _top5(full))
    saving.export_saved_model(model, str(tmp_path / "sm"), k=5)
    sm = saving.load_saved_model(str(tmp_path / "sm"))
    names = set(sm.signatures["serve"].structured_input_signature[1])
    assert names == {"text_indices", "text_values", "text_dense_shape",
                     "meta"}
    parts = dict(_parts(x, "text_"), meta=tf.constant(meta))
    out = sm.signatures["serve"](**parts)
    np.testing.assert_array_equal(out["label_ids"].numpy(), _top5(full))
    np.testing.assert_allclose(
        sm.score_all_labels(**parts)["label_scores"].numpy(), full,
        rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="needs the inputs"):
        decoding.top_k_function(model, 5)({"text": x})


def test_top_k_function_takes_what_predict_takes():
    x_in = keras.Input((NUM_FEATURES,), sparse=True)
    h = xmc_tf.layers.SparseEmbeddingBag(16)(x_in)
    model = keras.Model(x_in, xmc_tf.layers.UniformSparseDense(
        NUM_LABELS, 8, seed=1)(h))
    x = _sparse(seed=5)
    want = _top5(model.predict(x, verbose=0))
    top = decoding.top_k_function(model, 5)
    for value in (x, sp.csr_array(x), x.tocoo(), _sparse_tensor(x)):
        np.testing.assert_array_equal(top(value)[0].numpy(), want)
    dense_in = keras.Input((NUM_FEATURES,))
    dense = keras.Model(dense_in, keras.layers.Dense(NUM_LABELS)(dense_in))
    rows = x.toarray()
    want = _top5(dense.predict(rows, verbose=0))
    for value in (rows, rows.tolist(), tf.constant(rows)):
        np.testing.assert_array_equal(
            decoding.top_k_function(dense, 5)(value)[0].numpy(), want)


def test_mixed_float16_serves_float32(tmp_path):
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        x_in = keras.Input((NUM_FEATURES,), sparse=True)
        h = xmc_tf.layers.SparseEmbeddingBag(16)(x_in)
        h = keras.layers.Dense(32, activation="relu")(h)
        model = keras.Model(x_in, xmc_tf.layers.UniformSparseDense(
            NUM_LABELS, 8, seed=1)(h))
        x = _sparse(seed=7)
        assert model(_sparse_tensor(x)).dtype == tf.float16
        saving.export_saved_model(model, str(tmp_path / "sm"), k=5)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    sm = saving.load_saved_model(str(tmp_path / "sm"))
    out = sm.signatures["serve"](**_parts(x))
    every = sm.score_all_labels(**_parts(x))["label_scores"]
    assert out["scores"].dtype == tf.float32 and every.dtype == tf.float32
    np.testing.assert_allclose(
        out["scores"].numpy(),
        np.take_along_axis(every.numpy(), out["label_ids"].numpy(), 1))


def test_not_portable_is_said(tmp_path, caplog):
    x_in = keras.Input((NUM_FEATURES,), sparse=True)
    model = keras.Model(x_in, xmc_tf.layers.UniformSparseDense(
        NUM_LABELS, 8, seed=1)(x_in))
    with caplog.at_level(logging.INFO, logger="absl"):
        portable = saving.export_saved_model(model, str(tmp_path / "sm"))
    assert portable is False
    assert any("not portable" in r.getMessage()
               and "import xmc_tf" in r.getMessage() for r in caplog.records)
