"""Tests of MachHead, MachDecoder and the MACH losses."""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

from xmc_tf.layers.mach import MachDecoder, MachHead
from xmc_tf.losses.mach import (MachBinaryCrossentropy,
                                MachSoftmaxCrossentropy, mach_bucket_targets)
from op_requirements import needs_ops as _needs
from xmc_tf.ops.mach import PRIME, MachHashing

needs_ops = _needs("xmc_mach_top_k")


# --------------------------------------------------------------------------
# NumPy references.

def np_buckets(h, ids):
    ids = np.asarray(ids, np.int64)
    out = np.full(ids.shape + (h.num_repetitions,), -1, np.int64)
    for r, (a, b) in enumerate(zip(h.hash_a, h.hash_b)):
        for idx in np.ndindex(ids.shape):
            j = int(ids[idx])
            if j >= 0:
                out[idx + (r,)] = ((a * j + b) % h.prime) % h.num_buckets
    return out


def np_targets(h, ids, normalize):
    b = ids.shape[0]
    t = np.zeros((b, h.num_repetitions, h.num_buckets), np.float64)
    hb = np_buckets(h, ids)
    for i in range(b):
        labels = [j for j in range(ids.shape[1]) if ids[i, j] >= 0]
        for j in labels:
            for r in range(h.num_repetitions):
                if normalize:
                    t[i, r, hb[i, j, r]] += 1.0 / len(labels)
                else:
                    t[i, r, hb[i, j, r]] = 1.0
    return t


def np_softmax_loss(h, ids, logits):
    t = np_targets(h, ids, True)
    z = logits.astype(np.float64)
    logp = z - z.max(-1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(-1, keepdims=True))
    return (-(t * logp).sum(-1)).mean(-1)


def np_bce_loss(h, ids, logits):
    t = np_targets(h, ids, False)
    z = logits.astype(np.float64)
    bce = np.maximum(z, 0) - z * t + np.log1p(np.exp(-np.abs(z)))
    return bce.sum(-1).mean(-1)


# --------------------------------------------------------------------------
# Head.

def test_head_forward_and_weights():
    head = MachHead(num_labels=500, num_buckets=16, num_repetitions=3, seed=0,
                    bias_initializer="random_normal")
    x = np.random.default_rng(0).normal(size=(4, 7)).astype(np.float32)
    y = head(x).numpy()
    assert y.shape == (4, 3, 16)
    assert head.kernel.shape == (3, 7, 16) and head.bias.shape == (3, 16)
    expect = (np.einsum("bd,rdc->brc", x, head.kernel.numpy())
              + head.bias.numpy())
    np.testing.assert_allclose(y, expect, rtol=1e-5, atol=1e-5)
    assert head.head_bytes() == (3 * 7 * 16 + 3 * 16) * 4
    assert len(head.trainable_weights) == 2
    # tf.SparseTensor input (e.g. TF-IDF features straight into the head).
    sparse = tf.sparse.from_dense(np.where(x > 0.5, x, 0).astype(np.float32))
    np.testing.assert_allclose(
        head(sparse).numpy(), head(tf.sparse.to_dense(sparse)).numpy(),
        rtol=1e-5, atol=1e-5)
    # Extra leading axes and no bias.
    head2 = MachHead(10, 4, 2, use_bias=False)
    assert head2(np.zeros((2, 5, 3), np.float32)).shape == (2, 5, 2, 4)
    assert head2.bias is None


def test_head_regularizer_and_constraint():
    head = MachHead(10, 4, 2, kernel_regularizer=keras.regularizers.L2(0.1),
                    kernel_constraint="non_neg")
    head(np.ones((1, 3), np.float32))
    assert len(head.losses) == 1
    cfg = head.get_config()
    assert cfg["kernel_constraint"] is not None
    assert MachHead.from_config(cfg).kernel_constraint is not None


def test_buckets_formula_seed_and_padding():
    head = MachHead(num_labels=100_000, num_buckets=37, num_repetitions=5,
                    seed=3)
    ids = np.array([[0, 1, 99_999, -1], [5, 2**16 + 3, -1, -1]])
    got = head.buckets(tf.constant(ids, tf.int32)).numpy()
    assert got.dtype == np.int32 and got.shape == (2, 4, 5)
    np.testing.assert_array_equal(got, np_buckets(head.hashing, ids))
    # Same seed -> same hashes; another seed -> other hashes.
    assert MachHead(100_000, 37, 5, seed=3).hashing == head.hashing
    assert MachHead(100_000, 37, 5, seed=4).hashing != head.hashing
    # a_r, b_r in range.
    assert all(1 <= a < PRIME for a in head.hashing.hash_a)
    assert all(0 <= b < PRIME for b in head.hashing.hash_b)
    # seed=None draws fresh hashes, kept in the config.
    h_none = MachHead(1000, 8, 2, seed=None)
    assert MachHead.from_config(h_none.get_config()).hashing == h_none.hashing


def test_head_config_roundtrip_and_validation():
    head = MachHead(1000, 32, 4, seed=9, kernel_initializer="he_normal",
                    name="mach")
    cfg = head.get_config()
    for key in ("hash_a", "hash_b", "prime", "num_labels", "num_buckets",
                "num_repetitions", "seed"):
        assert key in cfg
    clone = MachHead.from_config(cfg)
    assert clone.hashing == head.hashing and clone.name == "mach"
    assert clone.decode_activation == "softmax"
    sig = MachHead.from_config(
        MachHead(1000, 32, 4, seed=9, decode_activation="sigmoid").get_config())
    assert sig.decode_activation == "sigmoid"
    assert MachDecoder.from_head(sig, k=2).activation == "sigmoid"
    with pytest.raises(ValueError, match="decode_activation"):
        MachHead(1000, 32, 4, decode_activation="relu")
    with pytest.raises(ValueError):
        MachHead(1000, 32, 4, hash_a=[1, 2])
    with pytest.raises(ValueError, match="num_repetitions"):
        MachHead(1000, 32, 4, hash_a=[1, 2], hash_b=[0, 0])
    with pytest.raises(ValueError):
        MachHead(0, 32, 4)


# --------------------------------------------------------------------------
# Losses.

def _random_ids(rng, b, n, m):
    ids = rng.integers(0, m, (b, n))
    lengths = rng.integers(0, n + 1, b)
    lengths[0] = n
    lengths[1] = 0  # a row without labels
    ids[np.arange(n)[None, :] >= lengths[:, None]] = -1
    ids[2, :2] = [7, 7] if n >= 2 else ids[2, :2]  # a repeated id
    return ids


@pytest.mark.parametrize("loss_cls,ref", [
    (MachSoftmaxCrossentropy, np_softmax_loss),
    (MachBinaryCrossentropy, np_bce_loss),
])
def test_losses_match_numpy(loss_cls, ref):
    rng = np.random.default_rng(1)
    h = MachHashing.random(300, 8, 3, seed=1)
    ids = _random_ids(rng, 6, 4, 300)
    logits = rng.normal(0, 2, (6, 3, 8)).astype(np.float32)
    expect = ref(h, ids, logits)
    per_row = loss_cls(h, reduction=None)(tf.constant(ids, tf.int32), logits)
    np.testing.assert_allclose(per_row.numpy(), expect, rtol=1e-5, atol=1e-6)
    mean = loss_cls(h)(tf.constant(ids, tf.int64), logits)
    np.testing.assert_allclose(float(mean), expect.mean(), rtol=1e-5)
    w = rng.random(6).astype(np.float32)
    weighted = loss_cls(h, reduction="sum")(ids, logits, sample_weight=w)
    np.testing.assert_allclose(float(weighted), (w * expect).sum(), rtol=1e-5)
    if loss_cls is MachSoftmaxCrossentropy:
        assert per_row.numpy()[1] == 0.0  # no labels -> no loss


def test_softmax_loss_single_label_is_paper_cross_entropy():
    # Algorithm 1: each repetition is a B-way softmax classifier on h_r(y).
    rng = np.random.default_rng(2)
    h = MachHashing.random(50, 5, 4, seed=2)
    y = rng.integers(0, 50, 9)
    logits = rng.normal(size=(9, 4, 5)).astype(np.float32)
    hb = np_buckets(h, y)  # [9, R]
    ce = tf.keras.losses.sparse_categorical_crossentropy(
        hb.reshape(-1), logits.reshape(-1, 5), from_logits=True)
    expect = ce.numpy().reshape(9, 4).mean(-1)
    got = MachSoftmaxCrossentropy(h, reduction=None)(y, logits).numpy()
    np.testing.assert_allclose(got, expect, rtol=1e-5, atol=1e-6)


def test_targets_scatter_and_large_ids_exact():
    h = MachHashing.random(PRIME, 64, 3, seed=3)
    ids = np.array([[2**24 + 1, 2**30 + 5, -1], [PRIME - 1, -1, -1]],
                   np.int64)
    got = mach_bucket_targets(ids, h).numpy()
    np.testing.assert_array_equal(got, np_targets(h, ids, False))
    # Through the Loss: ids above 2^24 must not be rounded to float32.
    logits = np.random.default_rng(3).normal(size=(2, 3, 64)).astype(np.float32)
    loss = MachBinaryCrossentropy(h, reduction=None)(ids, logits).numpy()
    np.testing.assert_allclose(loss, np_bce_loss(h, ids, logits), rtol=1e-5)
    # Float targets [b, R, B] are used as given.
    t = np_targets(h, ids, False).astype(np.float32)
    np.testing.assert_allclose(
        MachBinaryCrossentropy(h, reduction=None)(t, logits).numpy(), loss,
        rtol=1e-6)


def test_loss_accepts_head_and_config_and_serializes():
    head = MachHead(100, 8, 2, seed=5)
    for spec in (head, head.hashing, head.hashing.get_config()):
        loss = MachBinaryCrossentropy(spec)
        assert loss.hashing == head.hashing
    loss = MachSoftmaxCrossentropy(head, name="mach_ce")
    restored = keras.losses.deserialize(keras.losses.serialize(loss))
    assert isinstance(restored, MachSoftmaxCrossentropy)
    assert restored.hashing == head.hashing and restored.name == "mach_ce"


# --------------------------------------------------------------------------
# Decoder, save/load and training.

def _model(num_labels=200, d=16, B=16, R=4, seed=0, hidden=None):
    inputs = keras.Input((d,))
    x = inputs
    if hidden:
        x = keras.layers.Dense(hidden, activation="relu")(x)
    head = MachHead(num_labels, B, R, seed=seed, name="mach_head")
    return keras.Model(inputs, head(x)), head


@needs_ops
def test_decoder_layer_matches_op_and_brute_force():
    model, head = _model()
    x = np.random.default_rng(4).normal(size=(10, 16)).astype(np.float32)
    logits = model(x)
    for activation in ("softmax", "sigmoid", "linear"):
        fast = MachDecoder.from_head(head, k=7, activation=activation)
        slow = MachDecoder.from_head(head, k=7, activation=activation,
                                     method="brute_force")
        ids, scores = fast(logits)
        ids2, scores2 = slow(logits)
        np.testing.assert_array_equal(ids.numpy(), ids2.numpy())
        np.testing.assert_array_equal(scores.numpy(), scores2.numpy())
        ids3, _ = head.decode(logits, 7, activation=activation)
        np.testing.assert_array_equal(ids.numpy(), ids3.numpy())
    # Scores are the mean bucket probability (Eq. 2).
    probs = tf.nn.softmax(logits, -1).numpy()
    ids, scores = MachDecoder.from_head(head, k=3)(logits)
    hb = np_buckets(head.hashing, ids.numpy())  # [b, k, R]
    expect = np.take_along_axis(
        probs[:, None, :, :], hb[..., None], axis=-1)[..., 0].mean(-1)
    np.testing.assert_allclose(scores.numpy(), expect, rtol=1e-5)
    with pytest.raises(ValueError):
        MachDecoder.from_head(head, k=3, activation="relu")
    with pytest.raises(ValueError):
        MachDecoder.from_head(head, k=201)
    cfg = MachDecoder.from_head(head, k=3).get_config()
    assert MachDecoder.from_config(cfg).hashing == head.hashing


@needs_ops
def test_keras_save_load_roundtrip(tmp_path):
    model, head = _model(hidden=8)
    model.compile(optimizer="adam", loss=MachSoftmaxCrossentropy(head),
                  jit_compile=False)
    rng = np.random.default_rng(5)
    x = rng.normal(size=(32, 16)).astype(np.float32)
    y = rng.integers(0, 200, (32, 1)).astype(np.int32)
    model.fit(x, y, epochs=1, verbose=0)
    path = os.path.join(tmp_path, "mach.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    lhead = loaded.get_layer("mach_head")
    assert isinstance(lhead, MachHead)
    assert lhead.hashing == head.hashing
    ids = tf.constant([[0, 17, 199, -1]])
    np.testing.assert_array_equal(lhead.buckets(ids).numpy(),
                                  head.buckets(ids).numpy())
    np.testing.assert_array_equal(loaded.predict(x, verbose=0),
                                  model.predict(x, verbose=0))
    a = head.decode(model(x), 5)
    b = lhead.decode(loaded(x), 5)
    np.testing.assert_array_equal(a[0].numpy(), b[0].numpy())
    np.testing.assert_array_equal(a[1].numpy(), b[1].numpy())
    # The compiled loss came back with the same hash family.
    assert loaded.loss.hashing == head.hashing
    loaded.fit(x, y, epochs=1, verbose=0)


@needs_ops
def test_saved_model_export_for_serving(tmp_path):
    model, head = _model()
    inputs = keras.Input((16,))
    ids, scores = MachDecoder.from_head(head, k=5)(model(inputs))
    serving = keras.Model(inputs, [ids, scores])
    x = np.random.default_rng(6).normal(size=(4, 16)).astype(np.float32)
    want = serving.predict(x, verbose=0)
    path = os.path.join(tmp_path, "served")
    serving.export(path)
    restored = tf.saved_model.load(path)
    got = restored.serve(tf.constant(x))
    np.testing.assert_array_equal(got[0].numpy(), want[0])
    np.testing.assert_array_equal(got[1].numpy(), want[1])
    # Saved through .keras too (the decoder has no weights).
    kpath = os.path.join(tmp_path, "serving.keras")
    serving.save(kpath)
    again = keras.models.load_model(kpath).predict(x, verbose=0)
    np.testing.assert_array_equal(again[0], want[0])


def _multiclass_data(rng, n, m, d, noise):
    protos = rng.normal(size=(m, d)).astype(np.float32)
    y = rng.integers(0, m, n)
    x = protos[y] + noise * rng.normal(size=(n, d)).astype(np.float32)
    return x, y


@needs_ops
def test_end_to_end_multiclass_learns():
    rng = np.random.default_rng(7)
    m, d = 200, 24
    x, y = _multiclass_data(rng, 5000, m, d, 0.6)
    model, head = _model(num_labels=m, d=d, B=16, R=6, seed=1, hidden=64)
    model.compile(optimizer=keras.optimizers.Adam(0.005),
                  loss=MachSoftmaxCrossentropy(head), jit_compile=False)
    hist = model.fit(x[:4000], y[:4000, None].astype(np.int32), epochs=4,
                     batch_size=128, verbose=0)
    assert hist.history["loss"][-1] < hist.history["loss"][0]
    ids, _ = head.decode(model(x[4000:]), 1)
    p1 = float(np.mean(ids.numpy()[:, 0] == y[4000:]))
    assert p1 > 0.4, p1  # chance: 1 / 200; measured 0.63


@needs_ops
def test_end_to_end_multilabel_bce_learns():
    rng = np.random.default_rng(8)
    m, d, n = 300, 32, 5000
    protos = rng.normal(size=(m, d)).astype(np.float32)
    y = np.stack([rng.integers(0, m, n), rng.integers(0, m, n)], 1)
    y[::3, 1] = -1  # some rows with one label
    x = protos[y[:, 0]] + np.where(y[:, 1:] >= 0, protos[y[:, 1]], 0)
    x = (x + 0.3 * rng.normal(size=(n, d))).astype(np.float32)
    model, head = _model(num_labels=m, d=d, B=32, R=6, seed=2, hidden=128)
    model.compile(optimizer=keras.optimizers.Adam(0.005),
                  loss=MachBinaryCrossentropy(head), jit_compile=False)
    model.fit(x[:4000], y[:4000].astype(np.int32), epochs=4, batch_size=128,
              verbose=0)
    ids, _ = MachDecoder.from_head(head, k=1, activation="sigmoid")(
        model(x[4000:]))
    top = ids.numpy()[:, 0]
    p1 = float(np.mean((top == y[4000:, 0]) | (top == y[4000:, 1])))
    assert p1 > 0.35, p1  # chance: < 1 %; measured 0.60


@needs_ops
@pytest.mark.parametrize("activation", ["softmax", "sigmoid"])
def test_mach_precision_metric_matches_dense_scores(activation):
    from xmc_tf.metrics import MachPrecisionAtK
    rng = np.random.default_rng(11)
    h = MachHashing.random(150, 16, 3, seed=4)
    logits = rng.normal(size=(40, 3, 16)).astype(np.float32)
    ids = _random_ids(rng, 40, 4, 150)
    # Dense reference: every label's MACH score, top-k by (-score, id).
    z = logits.astype(np.float64)
    if activation == "softmax":
        p = np.exp(z - z.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
    else:
        p = 1.0 / (1.0 + np.exp(-z))
    lb = np_buckets(h, np.arange(150))  # [m, R]
    scores = np.stack([p[:, r, lb[:, r]] for r in range(3)]).mean(0)
    for k in (1, 3):
        expected = 0.0
        for i in range(40):
            top = sorted(range(150), key=lambda j: (-scores[i, j], j))[:k]
            expected += len(set(top) & set(ids[i][ids[i] >= 0])) / k
        metric = MachPrecisionAtK(k, h, activation=activation)
        metric.update_state(tf.constant(ids[:25]), logits[:25])
        metric.update_state(tf.constant(ids[25:]), logits[25:])
        assert float(metric.result()) == pytest.approx(expected / 40, abs=1e-6)
        assert metric.name == f"precision_at_{k}"
        clone = MachPrecisionAtK.from_config(metric.get_config())
        assert clone.hashing == h and clone.activation == activation
    head = MachHead(150, 16, 3, seed=4, decode_activation="sigmoid")
    assert MachPrecisionAtK(1, head).activation == "sigmoid"
    with pytest.raises(ValueError, match="activation"):
        MachPrecisionAtK(1, h, activation="relu")
    with pytest.raises(ValueError, match="exceeds"):
        MachPrecisionAtK(151, h)
