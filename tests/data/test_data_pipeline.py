"""Tests of normalize_features, make_tf_dataset and Keras 3 fit on it."""

import math

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import data


def _padded(rows: sp.csr_matrix) -> np.ndarray:
    width = max(1, int(rows.getnnz(axis=1).max()))
    out = -np.ones((rows.shape[0], width), np.int32)
    for i in range(rows.shape[0]):
        ids = rows.indices[rows.indptr[i]:rows.indptr[i + 1]]
        out[i, :ids.size] = ids
    return out


def _identity_dataset(n=103, extra_labels=0):
    """Instance i has feature i (value i + 1) and label i: rows identify."""
    x = sp.csr_matrix((np.arange(1, n + 1, dtype=np.float32),
                       np.arange(n), np.arange(n + 1)), shape=(n, n))
    y = sp.csr_matrix((np.ones(n, np.float32), np.arange(n),
                       np.arange(n + 1)), shape=(n, n + extra_labels))
    return data.XCDataset(x, y)


def _batch_row_ids(x):
    """Row ids of an identity-data-set batch, from its feature ids."""
    return x.indices[:, 1].numpy()


def test_batches_equal_csr_rows():
    ds = data.make_synthetic(700, 60, 300, labels_per_instance=6, seed=3)
    # Make some instances label-less to exercise all--1 rows.
    y = ds.labels.tolil()
    y[5, :] = 0
    y[6, :] = 0
    ds.labels = y.tocsr()
    tfds = data.make_tf_dataset(ds, 64)
    spec_x, spec_y = tfds.element_spec
    assert isinstance(spec_x, tf.SparseTensorSpec)
    assert spec_x.shape.as_list() == [None, 60] and spec_x.dtype == tf.float32
    assert spec_y.dtype == tf.int32 and spec_y.shape.rank == 2
    assert int(tfds.cardinality()) == math.ceil(700 / 64)
    start = 0
    for x, lab in tfds:
        b = x.dense_shape.numpy()[0]
        rows = slice(start, start + b)
        np.testing.assert_array_equal(lab.numpy(), _padded(ds.labels[rows]))
        assert lab.shape[1] == max(1, ds.labels[rows].getnnz(axis=1).max())
        np.testing.assert_array_equal(tf.sparse.to_dense(x).numpy(),
                                      ds.features[rows].toarray())
        # canonical (row-major, sorted) indices
        ind = x.indices.numpy()
        assert (np.diff(ind[:, 0] * 60 + ind[:, 1]) > 0).all()
        start += b
    assert start == 700


def test_dense_features_and_empty_label_batch():
    emb = np.random.default_rng(0).normal(size=(10, 5)).astype(np.float32)
    labels = sp.csr_matrix((10, 7), dtype=np.float32)
    ds = data.XCDataset(emb, labels)
    batches = list(data.make_tf_dataset(ds, 4))
    assert [b[0].shape.as_list() for b in batches] == [[4, 5], [4, 5], [2, 5]]
    np.testing.assert_array_equal(
        np.concatenate([b[0].numpy() for b in batches]), emb)
    for _, lab in batches:  # no labels at all: one column of -1
        assert lab.shape[1] == 1 and (lab.numpy() == -1).all()


def test_shuffle_covers_every_instance_each_epoch():
    n = 103
    tfds = data.make_tf_dataset(_identity_dataset(n), 10, shuffle=True,
                                seed=42)
    epochs = []
    for _ in range(3):  # a new iterator per epoch, like keras fit
        ids = np.concatenate([_batch_row_ids(x) for x, _ in tfds])
        ids_from_labels = np.concatenate(
            [lab.numpy()[:, 0] for _, lab in tfds])
        assert sorted(ids.tolist()) == list(range(n))
        assert sorted(ids_from_labels.tolist()) == list(range(n))
        epochs.append(ids)
    assert not np.array_equal(epochs[0], np.arange(n))
    assert not np.array_equal(epochs[0], epochs[1])
    # Same seed, new data set object: same sequence of epochs.
    again = data.make_tf_dataset(_identity_dataset(n), 10, shuffle=True,
                                 seed=42)
    np.testing.assert_array_equal(
        np.concatenate([_batch_row_ids(x) for x, _ in again]), epochs[0])


def test_repeat_and_drop_remainder():
    n, bs = 53, 8
    tfds = data.make_tf_dataset(_identity_dataset(n), bs, shuffle=True,
                                seed=1, repeat=True, drop_remainder=True)
    assert tfds.element_spec[0].shape.as_list() == [bs, n]
    assert tfds.element_spec[1].shape.as_list() == [bs, None]
    assert tfds.cardinality() == tf.data.INFINITE_CARDINALITY
    per_epoch = n // bs
    ids = [_batch_row_ids(x) for x, _ in tfds.take(3 * per_epoch)]
    assert all(len(i) == bs for i in ids)
    for e in range(3):
        epoch = np.concatenate(ids[e * per_epoch:(e + 1) * per_epoch])
        assert len(set(epoch.tolist())) == per_epoch * bs  # no repeats
    finite = data.make_tf_dataset(_identity_dataset(n), bs,
                                  drop_remainder=True)
    assert int(finite.cardinality()) == per_epoch
    assert len(list(finite)) == per_epoch


def test_make_tf_dataset_errors():
    with pytest.raises(ValueError, match="batch_size"):
        data.make_tf_dataset(_identity_dataset(5), 0)
    with pytest.raises(ValueError, match="leaves no batch"):
        data.make_tf_dataset(_identity_dataset(5), 8, drop_remainder=True)


def test_normalize_features():
    x = sp.csr_matrix(np.array([[3, 4, 0], [0, 0, 0], [1, 0, 1]],
                               np.float32))
    l2, idf = data.normalize_features(x, "l2")
    assert idf is None and isinstance(l2, sp.csr_matrix)
    np.testing.assert_allclose(l2.toarray(), [[.6, .8, 0], [0, 0, 0],
                                              [2**-.5, 0, 2**-.5]], rtol=1e-6)
    assert x[0, 0] == 3  # input untouched
    tfidf, idf = data.normalize_features(x, "tfidf")
    want_idf = np.log(4 / (1 + np.array([2, 1, 1]))) + 1
    np.testing.assert_allclose(idf, want_idf, rtol=1e-6)
    dense = x.toarray() * want_idf
    norms = np.linalg.norm(dense, axis=1, keepdims=True)
    np.testing.assert_allclose(tfidf.toarray(),
                               dense / np.where(norms == 0, 1, norms),
                               rtol=1e-6)
    test, idf2 = data.normalize_features(x[2:], "tfidf", idf=idf)
    assert idf2 is idf or np.array_equal(idf2, idf)
    np.testing.assert_allclose(test.toarray(), tfidf[2:].toarray(), rtol=1e-6)
    d, _ = data.normalize_features(x.toarray(), "tfidf")
    np.testing.assert_allclose(d, tfidf.toarray(), rtol=1e-6)
    same, none = data.normalize_features(x, "none")
    assert none is None and (same != x).nnz == 0
    with pytest.raises(ValueError, match="unknown method"):
        data.normalize_features(x, "l1")
    with pytest.raises(ValueError, match="idf has 2"):
        data.normalize_features(x, "tfidf", idf=np.ones(2))
    with pytest.raises(ValueError, match="only used"):
        data.normalize_features(x, "l2", idf=idf)


def test_keras_fit_sparse_inputs_padded_int_targets():
    keras.utils.set_random_seed(0)
    ds = data.make_synthetic(1024, 400, 60, labels_per_instance=3,
                             features_per_instance=24, seed=5)
    ds.features, _ = data.normalize_features(ds.features, "tfidf")
    num_features, num_labels = ds.num_features, ds.num_labels
    tfds = data.make_tf_dataset(ds, 128, shuffle=True, seed=0)

    def multi_hot_bce(y_true, y_pred):
        # Keras casts y_true to float32 before calling the loss.
        ids = tf.cast(y_true, tf.int32)
        multi_hot = tf.reduce_max(tf.one_hot(ids, num_labels), axis=1)
        return keras.losses.binary_crossentropy(multi_hot, y_pred,
                                                from_logits=True)

    inputs = keras.Input(shape=(num_features,), sparse=True)
    hidden = keras.layers.Dense(64)(inputs)
    logits = keras.layers.Dense(num_labels)(hidden)
    model = keras.Model(inputs, logits)
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss=multi_hot_bce)
    hist = model.fit(tfds, epochs=4, verbose=0, shuffle=False)
    losses = hist.history["loss"]
    assert len(losses) == 4 and np.all(np.isfinite(losses))
    assert losses[-1] < 0.6 * losses[0], losses
    # The trained model ranks true labels first most of the time.
    x, lab = next(iter(data.make_tf_dataset(ds, 256)))
    top1 = np.argmax(model.predict(x, verbose=0), axis=1)
    lab = lab.numpy()
    p1 = np.mean([top1[i] in lab[i] for i in range(len(top1))])
    assert p1 > 0.5, p1


def _epoch_orders(tfds, num_epochs, per_epoch):
    ids = [_batch_row_ids(x) for x, _ in tfds.take(num_epochs * per_epoch)]
    return [np.concatenate(ids[e * per_epoch:(e + 1) * per_epoch])
            for e in range(num_epochs)]


def test_shuffle_is_keyed_by_seed_and_epoch():
    """A stream started at epoch 2 (a resumed run) sees the batches that an
    uninterrupted stream sees from its third epoch on, in a new data set
    object; every epoch is a permutation and consecutive epochs differ."""
    n, bs = 37, 5
    per_epoch = math.ceil(n / bs)

    def stream(first_epoch, seed=7):
        return data.make_tf_dataset(_identity_dataset(n), bs, shuffle=True,
                                    seed=seed, repeat=True,
                                    first_epoch=first_epoch)

    full = _epoch_orders(stream(0), 5, per_epoch)
    for order in full:
        assert sorted(order.tolist()) == list(range(n))
    assert not np.array_equal(full[0], full[1])
    resumed = _epoch_orders(stream(2), 3, per_epoch)
    for a, b in zip(full[2:], resumed):
        np.testing.assert_array_equal(a, b)
    other_seed = _epoch_orders(stream(2, seed=8), 1, per_epoch)
    assert not np.array_equal(other_seed[0], full[2])

    # Without repeat: iteration k of the object is epoch first_epoch + k.
    once = data.make_tf_dataset(_identity_dataset(n), bs, shuffle=True,
                                seed=7, first_epoch=3)
    for e in (3, 4):
        np.testing.assert_array_equal(
            np.concatenate([_batch_row_ids(x) for x, _ in once]), full[e])
    with pytest.raises(ValueError, match="first_epoch"):
        data.make_tf_dataset(_identity_dataset(n), bs, first_epoch=-1)


def test_with_example_ids_names_the_rows_of_each_batch():
    """The third element is each instance's row in the data set: on the
    identity data set it equals the feature id and the label of the row,
    shuffled or not, and the default output keeps two elements."""
    n, bs = 47, 6
    plain = data.make_tf_dataset(_identity_dataset(n), bs)
    assert len(plain.element_spec) == 2
    for shuffle, drop in ((False, False), (True, True)):
        tfds = data.make_tf_dataset(_identity_dataset(n), bs, shuffle=shuffle,
                                    seed=3, drop_remainder=drop,
                                    with_example_ids=True)
        spec = tfds.element_spec
        assert len(spec) == 3 and spec[2].dtype == tf.int64
        assert spec[2].shape.as_list() == [bs if drop else None]
        seen = []
        for x, lab, ids in tfds:
            np.testing.assert_array_equal(ids.numpy(), _batch_row_ids(x))
            np.testing.assert_array_equal(ids.numpy(), lab.numpy()[:, 0])
            seen.extend(ids.numpy().tolist())
        assert len(seen) == len(set(seen)) == (n // bs * bs if drop else n)
        if not shuffle:
            assert seen == list(range(n))
