"""Tests of normalize_features, make_tf_dataset and Keras 3 fit on it."""

import math
import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import config as xconfig
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


def test_resolve_normalization_auto_by_value_kind():
    counts = sp.csr_matrix(np.array([[3, 0, 1], [0, 0, 0]], np.float32))
    weights = sp.csr_matrix(np.array([[0.25, 0, 1], [0, 2, 0]], np.float32))
    negative = sp.csr_matrix(np.array([[-1, 0, 2]], np.float32))
    assert data.resolve_normalization("auto", counts) == "tfidf"
    assert data.resolve_normalization("auto", counts.toarray()) == "tfidf"
    assert data.resolve_normalization("auto", counts.astype(np.int64)) == "tfidf"
    assert data.resolve_normalization("auto", sp.csr_matrix((2, 3))) == "tfidf"
    # One non-integer value anywhere (here in row 0) makes them weights.
    assert data.resolve_normalization("auto", weights) == "l2"
    assert data.resolve_normalization("auto", weights.toarray()) == "l2"
    assert data.resolve_normalization("auto", negative) == "l2"
    for method in ("tfidf", "l2", "none"):
        assert data.resolve_normalization(method, weights) == method
    with pytest.raises(ValueError, match="unknown method 'l1'"):
        data.resolve_normalization("l1", counts)


def test_load_data_resolves_auto_on_train_and_records_it(tmp_path):
    from xmc_tf.job import preprocessing as xpreprocessing  # pylint: disable=import-outside-toplevel
    from xmc_tf.job import inputs as xinputs
    ds = data.make_synthetic(60, 30, 8, seed=1)  # token counts
    weighted = data.XCDataset(data.normalize_features(ds.features, "tfidf")[0],
                              ds.labels)
    for name, dataset, want in (("counts", ds, "tfidf"),
                                ("weights", weighted, "l2")):
        path = str(tmp_path / f"{name}.txt")
        data.write_xc(path, dataset)
        config = xconfig.get_config("uniform_sparse")
        config.data.train, config.data.test = path, path
        config.data.validation_fraction = 0.0  # fit on every row here
        workdir = tmp_path / f"wd_{name}"
        workdir.mkdir()
        train, test = xinputs.read_datasets(config)
        np.testing.assert_array_equal(train.features.toarray(),  # raw
                                      data.read_xc(path).features.toarray())
        fit, val, norm = xinputs.prepare_splits(config, train, str(workdir))
        assert val is None
        saved = np.load(workdir / "preprocessing.npz")
        assert str(saved["method"]) == want == norm.method
        expected, _ = data.normalize_features(data.read_xc(path).features, want)
        np.testing.assert_allclose(fit.features.toarray(),
                                   expected.toarray(), rtol=1e-6)
        test = xpreprocessing.normalize(test, norm)
        np.testing.assert_allclose(test.features.toarray(),
                                   expected.toarray(), rtol=1e-6)
        assert (saved["idf"].size > 0) == (want == "tfidf")


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


# ---------------------------------------------------------------------------
# The streaming pipeline against the previous implementation, which held the
# CSR arrays as graph constants and gathered ragged rows in TensorFlow (kept
# here, verbatim in substance, as the reference of the output contract).


def _constant_dataset(ds, batch_size, *, shuffle=False, seed=None,
                      drop_remainder=False, repeat=False, first_epoch=0,
                      with_example_ids=False):
    from xmc_tf.data.pipeline import _batch_rows
    y = sp.csr_matrix(ds.labels)
    lab_splits = tf.constant(y.indptr.astype(np.int64))
    lab_ids = tf.constant(y.indices.astype(np.int32))
    if ds.is_sparse:
        x = sp.csr_matrix(ds.features, dtype=np.float32)
        feat_splits = tf.constant(x.indptr.astype(np.int64))
        feat_ids = tf.constant(x.indices.astype(np.int32))
        feat_vals = tf.constant(x.data.astype(np.float32))
    else:
        dense = tf.constant(np.asarray(ds.features, np.float32))

    def gather(rows):
        static_b = rows.shape[0]
        b = (tf.constant(static_b, tf.int64) if static_b is not None else
             tf.shape(rows, out_type=tf.int64)[0])
        labels = tf.gather(tf.RaggedTensor.from_row_splits(
            lab_ids, lab_splits, validate=False), rows)
        label_ids = labels.to_tensor(default_value=-1)
        width = tf.shape(label_ids)[1]
        label_ids = tf.pad(label_ids, [[0, 0], [0, tf.maximum(1 - width, 0)]],
                           constant_values=-1)
        label_ids.set_shape([static_b, None])
        if ds.is_sparse:
            ids = tf.gather(tf.RaggedTensor.from_row_splits(
                feat_ids, feat_splits, validate=False), rows)
            vals = tf.gather(tf.RaggedTensor.from_row_splits(
                feat_vals, feat_splits, validate=False), rows)
            indices = tf.stack([ids.value_rowids(),
                                tf.cast(ids.flat_values, tf.int64)], axis=1)
            features = tf.SparseTensor(indices, vals.flat_values, tf.stack(
                [b, tf.constant(ds.num_features, tf.int64)]))
        else:
            features = tf.gather(dense, rows)
        if with_example_ids:
            return features, label_ids, rows
        return features, label_ids

    rows = _batch_rows(ds.num_instances, batch_size, shuffle, seed,
                       drop_remainder, repeat, first_epoch)
    return rows.map(gather)


def _as_numpy(element):
    out = []
    for t in element:
        if isinstance(t, tf.SparseTensor):
            out += [t.indices.numpy(), t.values.numpy(),
                    t.dense_shape.numpy()]
        else:
            out.append(t.numpy())
    return out


def _assert_same_batches(a, b, num_batches=None):
    if num_batches is not None:
        a, b = a.take(num_batches), b.take(num_batches)
    count = 0
    for x, y in zip(a, b, strict=True):
        for u, v in zip(_as_numpy(x), _as_numpy(y), strict=True):
            assert u.dtype == v.dtype
            np.testing.assert_array_equal(u, v)
        count += 1
    return count


def _messy_dataset(n=300, dense=False):
    ds = data.make_synthetic(n, 80, 500, labels_per_instance=4,
                             features_per_instance=12, seed=9)
    y = ds.labels.tolil()
    y[7, :] = 0  # label-less rows
    y[8, :] = 0
    ds.labels = y.tocsr()
    x = ds.features.tolil()
    x[11, :] = 0  # a row without features
    ds.features = x.tocsr()
    if dense:
        ds.features = ds.features.toarray()
    return ds


@pytest.mark.parametrize("dense", [False, True])
def test_streaming_batches_equal_the_constant_implementation(dense):
    """Same batches (values, dtypes, shapes, -1 padding, sparse indices, row
    order, epoch keying) as the previous graph-constant pipeline, for every
    combination of the options that shape the stream."""
    ds = _messy_dataset(dense=dense)
    per_epoch = math.ceil(300 / 32)
    for kwargs in (dict(), dict(shuffle=True, seed=4),
                   dict(shuffle=True, seed=4, repeat=True, first_epoch=3),
                   dict(shuffle=True, seed=5, drop_remainder=True,
                        with_example_ids=True),
                   dict(repeat=True, drop_remainder=True)):
        new = data.make_tf_dataset(ds, 32, **kwargs)
        old = _constant_dataset(ds, 32, **kwargs)
        assert new.element_spec == old.element_spec, kwargs
        if kwargs.get("repeat"):
            assert _assert_same_batches(new, old, 2 * per_epoch + 1) == (
                2 * per_epoch + 1)
        else:
            for _ in range(2):  # two epochs of the same objects
                assert _assert_same_batches(new, old) == int(
                    new.cardinality())


def _graph_def(ds):
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(ds._as_serialized_graph(  # pylint: disable=protected-access
        external_state_policy=tf.data.experimental.ExternalStatePolicy.WARN
    ).numpy())
    return graph


def _largest_constant(graph):
    def consts(nodes):
        for node in nodes:
            if node.op == "Const":
                shape = node.attr["value"].tensor.tensor_shape
                yield int(np.prod([d.size for d in shape.dim]))
    sizes = list(consts(graph.node))
    for fn in graph.library.function:
        sizes += list(consts(fn.node_def))
    return max(sizes, default=0)


def test_no_graph_constant_grows_with_the_data_set():
    """The dataset graph of a data set with 4M feature entries (32 MB of CSR
    arrays; the old pipeline put them all into Const nodes, and a
    ``GraphDef`` cannot exceed 2 GB) stays a few KB, identical in size to
    that of a tiny data set up to the bytes of a few scalars, and holds no constant of more than a handful of
    elements."""
    n = 100_000
    rng = np.random.default_rng(0)
    nnz_per_row = 40
    indptr = np.arange(0, n * nnz_per_row + 1, nnz_per_row, dtype=np.int64)
    indices = np.sort(rng.integers(0, 50_000, (n, nnz_per_row)), axis=1)
    indices += np.arange(nnz_per_row)  # distinct, sorted per row
    x = sp.csr_matrix((rng.random(n * nnz_per_row, np.float32),
                       indices.ravel().astype(np.int32), indptr),
                      shape=(n, 50_000 + nnz_per_row))
    y = sp.csr_matrix((np.ones(n, np.float32), rng.integers(0, 1000, n),
                       np.arange(n + 1)), shape=(n, 1000))
    big = data.XCDataset(x, y)
    small = data.XCDataset(x[:10], y[:10])
    for kwargs in (dict(), dict(shuffle=True, seed=1, repeat=True)):
        g_big = _graph_def(data.make_tf_dataset(big, 256, **kwargs))
        g_small = _graph_def(data.make_tf_dataset(small, 256, **kwargs))
        assert g_big.ByteSize() < 64 * 1024, g_big.ByteSize()
        # Only scalars (N, number of batches) differ: varint bytes.
        assert abs(g_big.ByteSize() - g_small.ByteSize()) < 64
        assert _largest_constant(g_big) <= 16
    # The reference pipeline does embed the arrays (what this test guards).
    assert _largest_constant(_graph_def(_constant_dataset(big, 256))) >= (
        x.nnz)
    # ... and the streaming batches still equal the CSR rows.
    tfds = data.make_tf_dataset(big, 1000, shuffle=True, seed=2,
                                with_example_ids=True)
    for xb, lab, ids in tfds.take(3):
        rows = ids.numpy()
        np.testing.assert_array_equal(tf.sparse.to_dense(xb).numpy(),
                                      x[rows].toarray())
        np.testing.assert_array_equal(lab.numpy()[:, 0], y[rows].indices)


def test_shards_cut_every_global_batch_in_order():
    """Shard k of num_shards yields chunk k of each global batch of the
    unsharded stream; together the shards see exactly that stream."""
    n, bs, shards = 103, 5, 3
    ds = _identity_dataset(n)
    whole = [_batch_row_ids(x) for x, _ in data.make_tf_dataset(
        ds, bs * shards, shuffle=True, seed=6)]
    parts = [[_batch_row_ids(x) for x, _ in data.make_tf_dataset(
        ds, bs, shuffle=True, seed=6, num_shards=shards, shard_index=k)]
        for k in range(shards)]
    assert all(len(p) == len(whole) for p in parts)
    for j, batch in enumerate(whole):
        np.testing.assert_array_equal(
            np.concatenate([p[j] for p in parts]), batch)
        assert all(len(p[j]) == bs for p in parts[:-1]) or j == len(whole) - 1
    # A worker with two replicas: its chunks in order, per global batch.
    both = [_batch_row_ids(x) for x, _ in data.make_tf_dataset(
        ds, bs, shuffle=True, seed=6, num_shards=shards, shard_index=[1, 2])]
    assert len(both) == 2 * len(whole)
    for j in range(len(whole)):
        np.testing.assert_array_equal(both[2 * j], parts[1][j])
        np.testing.assert_array_equal(both[2 * j + 1], parts[2][j])
    with pytest.raises(ValueError, match="shard_index"):
        data.make_tf_dataset(ds, bs, num_shards=2, shard_index=2)
    with pytest.raises(ValueError, match="num_shards"):
        data.make_tf_dataset(ds, bs, num_shards=0)
    # The default strategy (one replica): the unsharded stream.
    dist = data.distribute_tf_dataset(tf.distribute.get_strategy(), ds, bs,
                                      shuffle=True, seed=6)
    got = [_batch_row_ids(x) for x, _ in dist]
    want = [_batch_row_ids(x) for x, _ in data.make_tf_dataset(
        ds, bs, shuffle=True, seed=6)]
    assert len(got) == len(want)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


# ---------------------------------------------------------------------------
# Binary cache (memory-mapped .npy) and reading progress.


def _is_mapped(a):
    """Whether ``a`` is a view of a memory-mapped file (not a copy)."""
    import mmap
    while a is not None:
        if isinstance(a, (np.memmap, mmap.mmap)):
            return True
        a = getattr(a, "base", None)
    return False


def test_cache_round_trip_is_memory_mapped_and_streams_the_same(tmp_path):
    from xmc_tf.data import cache
    ds = _messy_dataset()
    cache.write_cache(ds, tmp_path / "c", source={"spec": "x"})
    back = cache.read_cache(tmp_path / "c")
    assert _is_mapped(back.features.indices)
    assert _is_mapped(back.features.data)
    assert _is_mapped(back.labels.indices)
    assert not back.features.data.flags.writeable
    assert (back.features != ds.features).nnz == 0
    assert (back.labels != ds.labels).nnz == 0
    assert back.labels.dtype == np.float32
    kwargs = dict(shuffle=True, seed=3, with_example_ids=True)
    assert _assert_same_batches(data.make_tf_dataset(back, 64, **kwargs),
                                data.make_tf_dataset(ds, 64, **kwargs)) == 5
    # Normalising a memory-mapped (read-only) matrix makes a new one.
    norm, _ = data.normalize_features(back.features, "tfidf")
    want, _ = data.normalize_features(ds.features, "tfidf")
    np.testing.assert_allclose(norm.toarray(), want.toarray(), rtol=1e-6)
    dense = data.XCDataset(np.arange(12, dtype=np.float32).reshape(4, 3),
                           ds.labels[:4])
    cache.write_cache(dense, tmp_path / "d")
    np.testing.assert_array_equal(cache.read_cache(tmp_path / "d").features,
                                  dense.features)


def test_cache_rejects_damage(tmp_path):
    from xmc_tf.data import cache
    ds = _messy_dataset()
    d = cache.write_cache(ds, tmp_path / "c")
    ids = np.load(os.path.join(d, "features_indices.npy"))
    ids[5] = ds.num_features  # out of range
    np.save(os.path.join(d, "features_indices.npy"), ids)
    with pytest.raises(ValueError, match="outside"):
        cache.read_cache(d)
    np.save(os.path.join(d, "features_indices.npy"), ids[:-1])
    with pytest.raises(ValueError, match="meta.json says"):
        cache.read_cache(d)
    os.remove(os.path.join(d, "meta.json"))
    with pytest.raises(ValueError, match="no meta.json"):
        cache.read_cache(d)


def test_load_cached_reads_once_with_progress_then_maps(tmp_path, capsys,
                                                        monkeypatch):
    from xmc_tf.data import cache, xc_reader
    ds = _messy_dataset()
    path = str(tmp_path / "train.txt")
    data.write_xc(path, ds)
    calls = []
    real = xc_reader.read_xc

    def spy(p, progress="auto"):
        calls.append(p)
        return real(p, progress=progress)

    monkeypatch.setattr(xc_reader, "read_xc", spy)
    monkeypatch.setattr(xc_reader, "PROGRESS_MIN_INSTANCES", 100)
    first = cache.load_cached(path, tmp_path / "cache")
    out = capsys.readouterr().out
    assert "reading" in out and "300/300" in out  # the Keras progress bar
    assert "writing the data cache" in out
    again = cache.load_cached(path, tmp_path / "cache")
    assert calls == [path]  # the second call maps the cache
    assert _is_mapped(again.features.data)
    assert (again.features != ds.features).nnz == 0
    assert (first.labels != ds.labels).nnz == 0
    os.utime(path, ns=(1, 1))  # the file changed: read again
    cache.load_cached(path, tmp_path / "cache", progress=False)
    assert calls == [path, path]
    assert "reading" not in capsys.readouterr().out


def test_read_xc_progress_callback(tmp_path):
    ds = _messy_dataset()
    path = str(tmp_path / "train.txt")
    data.write_xc(path, ds)
    seen = []
    back = data.read_xc(path, progress=lambda done, total: seen.append(
        (done, total)))
    assert seen and seen[-1] == (300, 300)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert (back.features != ds.features).nnz == 0
