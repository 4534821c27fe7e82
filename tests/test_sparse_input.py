"""Tests of the sparse-input encoder (xmc_tf.layers.SparseEmbeddingBag).

References: a NumPy dense product ``x @ kernel + bias`` (float64),
``tf.sparse.sparse_dense_matmul`` and ``keras.layers.Dense`` on the same
sparse input (its dense kernel gradient).
"""

import os

import keras
import numpy as np
import pytest
import tensorflow as tf

import xmc_tf
from xmc_tf.layers import SparseEmbeddingBag
from xmc_tf.optimizers import LazyAdam


def np_(v):
    return keras.ops.convert_to_numpy(v)


def coo(rows, cols, vals, shape, dtype=np.float32):
    return tf.SparseTensor(np.stack([rows, cols], 1).astype(np.int64),
                           np.asarray(vals, dtype), shape)


def random_sparse(rng, batch, num_features, density, dtype=np.float32):
    dense = (rng.random((batch, num_features)) < density) * rng.random(
        (batch, num_features))
    dense[batch // 2] = 0.0  # an empty row in the middle
    dense[-1] = 0.0          # and at the end (segment ops drop trailing rows)
    return tf.sparse.from_dense(dense.astype(dtype)), dense


def built(layer, num_features, dtype=np.float32, seed=0):
    layer.build((None, num_features))
    rng = np.random.default_rng(seed)
    layer.kernel.assign(rng.standard_normal(layer.kernel.shape).astype(dtype))
    if layer.bias is not None:
        layer.bias.assign(rng.standard_normal(layer.bias.shape).astype(dtype))
    return layer


def test_output_equals_dense_product_with_duplicates_and_empty_rows():
    num_features, units = 20, 6
    layer = built(SparseEmbeddingBag(units), num_features)
    # Entries out of order, a repeated (row, feature) pair, empty rows 1 and 4.
    rows = [3, 0, 2, 0, 3, 0, 2]
    cols = [5, 7, 19, 2, 5, 7, 0]
    vals = [0.5, 1.5, -2.0, 0.25, 1.0, 3.0, 0.75]
    x = coo(rows, cols, vals, [5, num_features])
    dense = np.zeros((5, num_features))
    np.add.at(dense, (rows, cols), vals)
    kernel, bias = np_(layer.kernel), np_(layer.bias)
    out = np_(layer(x))
    assert out.shape == (5, units) and out.dtype == np.float32
    np.testing.assert_allclose(out, dense @ kernel + bias, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out[[1, 4]], np.tile(bias, (2, 1)), rtol=1e-6)
    # Same as TensorFlow's sparse-dense product on the reordered input.
    ref = tf.sparse.sparse_dense_matmul(tf.sparse.reorder(x), layer.kernel) + bias
    np.testing.assert_allclose(out, np_(ref), rtol=1e-5, atol=1e-5)


def test_cpu_op_path_equals_sparse_dense_matmul_path(monkeypatch):
    """On the CPU the layer runs Xmc>EmbeddingBag (and its gradient op);
    with the ops switched off it runs tf.sparse.sparse_dense_matmul: same
    outputs and same IndexedSlices gradient."""
    import xmc_tf.layers.sparse_input as si
    rng = np.random.default_rng(4)
    x, _ = random_sparse(rng, 9, 40, 0.2)
    results = []
    for use_op in (True, False):
        if not use_op:
            monkeypatch.setattr(si, "embedding_bag_supported",
                                lambda *a, **k: False)
        layer = built(SparseEmbeddingBag(7, activation="relu"), 40)

        def make_step(layer):
            @tf.function
            def step(x):
                with tf.GradientTape() as tape:
                    y = layer(x)
                    loss = tf.reduce_sum(y * y)
                return y, tape.gradient(loss, layer.kernel)
            return step

        step = make_step(layer)
        ops = {op.type for op in step.get_concrete_function(x).graph
               .get_operations()}
        assert ("Xmc>EmbeddingBag" in ops) == use_op
        y, g = step(x)
        results.append((np_(y), g.indices.numpy(), g.values.numpy()))
    (y1, i1, v1), (y2, i2, v2) = results
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(i1, i2)
    np.testing.assert_allclose(v1, v2, rtol=1e-5, atol=1e-6)


def test_float64_layer_matches_numpy_tightly():
    rng = np.random.default_rng(1)
    x, dense = random_sparse(rng, 9, 40, 0.2, np.float64)
    layer = built(SparseEmbeddingBag(5, dtype="float64", activation="tanh"),
                  40, np.float64)
    out = np_(layer(x))
    assert out.dtype == np.float64
    ref = np.tanh(dense @ np_(layer.kernel) + np_(layer.bias))
    np.testing.assert_allclose(out, ref, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("combiner", ["mean", "sqrtn"])
def test_combiners_match_numpy_and_dense_input(combiner):
    rng = np.random.default_rng(2)
    x, dense = random_sparse(rng, 7, 30, 0.3)
    layer = built(SparseEmbeddingBag(4, combiner=combiner, use_bias=False), 30)
    if combiner == "mean":
        denom = dense.sum(1, keepdims=True)
    else:
        denom = np.sqrt((dense ** 2).sum(1, keepdims=True))
    scaled = np.divide(dense, denom, out=np.zeros_like(dense),
                       where=denom > 0)
    ref = scaled @ np_(layer.kernel)
    np.testing.assert_allclose(np_(layer(x)), ref, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(layer(dense.astype(np.float32))), ref,
                               rtol=1e-5, atol=1e-6)
    assert np.all(np.isfinite(np_(layer(x))))


def test_dense_input_fallback_equals_sparse():
    rng = np.random.default_rng(3)
    x, dense = random_sparse(rng, 6, 25, 0.2)
    layer = built(SparseEmbeddingBag(3, activation="relu"), 25)
    np.testing.assert_allclose(np_(layer(dense.astype(np.float32))),
                               np_(layer(x)), rtol=1e-5, atol=1e-6)


def test_gradient_is_indexed_slices_over_batch_features_equal_to_dense_layer():
    """Rows of the gradient: exactly the batch's distinct features (Keras'
    Dense adds feature 0 for empty rows); same values as Dense's gradient."""
    rng = np.random.default_rng(4)
    num_features, units = 50, 4
    rows = [0, 0, 1, 2, 2, 2, 4]
    cols = [3, 17, 17, 40, 3, 3, 9]  # 3 repeated, row 3 empty
    vals = rng.random(len(rows)).astype(np.float32)
    x = coo(rows, cols, vals, [5, num_features])
    layer = built(SparseEmbeddingBag(units, activation="sigmoid"), num_features)
    dense_layer = keras.layers.Dense(units, activation="sigmoid")
    dense_layer.build((None, num_features))
    dense_layer.set_weights(layer.get_weights())
    upstream = tf.constant(rng.standard_normal((5, units)).astype(np.float32))
    with tf.GradientTape(persistent=True) as tape:
        loss = tf.reduce_sum(layer(x) * upstream)
        loss_ref = tf.reduce_sum(dense_layer(x) * upstream)
    grad = tape.gradient(loss, layer.kernel)
    grad_ref = tape.gradient(loss_ref, dense_layer.kernel)
    assert isinstance(grad, tf.IndexedSlices)
    indices = np_(grad.indices)
    assert sorted(indices.tolist()) == [3, 9, 17, 40]  # unique, the batch's
    assert grad.values.shape == (4, units)
    np.testing.assert_allclose(np_(tf.convert_to_tensor(grad)), np_(grad_ref),
                               rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np_(tape.gradient(loss, layer.bias)),
                               np_(tape.gradient(loss_ref, dense_layer.bias)),
                               rtol=1e-5, atol=1e-6)


def test_same_initial_weights_as_dense():
    a = SparseEmbeddingBag(8, kernel_initializer=keras.initializers.GlorotUniform(3))
    b = keras.layers.Dense(8, kernel_initializer=keras.initializers.GlorotUniform(3))
    a.build((None, 300))
    b.build((None, 300))
    np.testing.assert_array_equal(np_(a.kernel), np_(b.kernel))
    limit = np.sqrt(6 / (300 + 8))
    assert np.abs(np_(a.kernel)).max() <= limit


def test_invalid_inputs():
    layer = built(SparseEmbeddingBag(3), 10)
    with pytest.raises(ValueError, match="expected axis -1"):
        layer(coo([0], [10], [1.0], [1, 11]))  # wider input than the table
    with pytest.raises(tf.errors.InvalidArgumentError, match="feature id"):
        layer._sparse_call(coo([0, 1], [2, 12], [1.0, 1.0], [2, 10]))
    with pytest.raises(tf.errors.InvalidArgumentError):
        layer._sparse_call(coo([0], [-1], [1.0], [1, 10]))
    three_d = tf.SparseTensor([[0, 0, 1]], [1.0], [1, 2, 10])
    with pytest.raises(ValueError, match="rank-2"):
        layer._sparse_call(three_d)
    with pytest.raises(ValueError):
        SparseEmbeddingBag(0)
    with pytest.raises(ValueError, match="combiner"):
        SparseEmbeddingBag(3, combiner="max")
    with pytest.raises(ValueError, match="last input"):
        SparseEmbeddingBag(3).build((None, None))


class ProbeLazyAdam(LazyAdam):
    """LazyAdam that records, while ``model.fit`` traces its train step, the
    gradient type of every variable and the op outputs in the train-step
    graph that have the table's full shape (a dense gradient or read)."""

    def __init__(self, table_shape, **kwargs):
        super().__init__(**kwargs)
        self.table_shape = tuple(table_shape)
        self.probes = []

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        result = super().apply(grads, trainable_variables)
        graph = tf.compat.v1.get_default_graph()
        # Slot initializers (zeros, run once when Keras builds the slots
        # inside the first trace) are not part of a step.
        full = [f"{op.type}:{op.name}" for op in graph.get_operations()
                for out in op.outputs
                if out.shape.rank == 2 and tuple(out.shape) == self.table_shape
                and "/Initializer/" not in op.name]
        names = [v.path for v in trainable_variables]
        self.probes.append(
            (dict(zip(names, (type(g).__name__ for g in grads))), full))
        return result


def tiny_problem(rng, num_features=300, n=256, labels=5):
    dense = (rng.random((n, num_features)) < 0.02) * rng.random((n, num_features))
    w = rng.standard_normal((num_features, labels))
    y = (dense @ w).astype(np.float32)
    return tf.sparse.from_dense(dense.astype(np.float32)), dense, y


def sparse_model(num_features, units=16, labels=5):
    inputs = keras.Input((num_features,), sparse=True)
    h = SparseEmbeddingBag(units, activation="relu", name="bag")(inputs)
    return keras.Model(inputs, keras.layers.Dense(labels, name="out")(h))


def test_fit_with_lazy_adam_decreases_loss_and_keeps_table_gradient_sparse():
    rng = np.random.default_rng(5)
    num_features = 300
    x, _, y = tiny_problem(rng, num_features)
    model = sparse_model(num_features)
    table = model.get_layer("bag").kernel
    opt = ProbeLazyAdam(table.shape, learning_rate=0.01)
    model.compile(opt, loss="mse", jit_compile=False, steps_per_execution=2)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(32)
    before = np_(table).copy()
    history = model.fit(ds, epochs=6, verbose=0)
    losses = history.history["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    assert opt.probes, "train_step was not traced"
    for kinds, full in opt.probes:
        assert kinds[table.path] == "IndexedSlices"
        assert kinds[model.get_layer("out").kernel.path] != "IndexedSlices"
        assert full == [], full  # no dense [D, units] tensor in the step
    # Rows of features that never occur in the data are not touched.
    unused = np.flatnonzero(np.bincount(np_(x.indices)[:, 1],
                                        minlength=num_features) == 0)
    assert unused.size > 0
    np.testing.assert_array_equal(np_(table)[unused], before[unused])
    assert int(model.optimizer.iterations) == 6 * 8


def test_standard_fit_and_keras_round_trip(tmp_path):
    rng = np.random.default_rng(6)
    num_features = 200
    x, dense, y = tiny_problem(rng, num_features)
    model = sparse_model(num_features)
    model.compile(LazyAdam(0.01), loss="mse", jit_compile=False)
    ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(64)
    history = model.fit(ds, epochs=4, verbose=0)
    assert history.history["loss"][-1] < history.history["loss"][0]
    path = os.path.join(tmp_path, "m.keras")
    model.save(path)
    loaded = keras.models.load_model(path)
    bag = loaded.get_layer("bag")
    assert isinstance(bag, SparseEmbeddingBag) and bag.units == 16
    assert bag.get_config() == model.get_layer("bag").get_config()
    assert isinstance(loaded.optimizer, LazyAdam)
    xs = tf.sparse.slice(x, [0, 0], [20, num_features])
    np.testing.assert_allclose(np_(loaded(xs)), np_(model(xs)), rtol=1e-6)
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables):
        np.testing.assert_array_equal(np_(a), np_(b))
    # Dense evaluation path of the same model (keras.Input without sparse).
    np.testing.assert_allclose(
        np_(model.get_layer("bag")(dense[:20].astype(np.float32))),
        np_(model.get_layer("bag")(xs)), rtol=1e-5, atol=1e-6)


def test_saved_model_export_with_sparse_signatures(tmp_path):
    rng = np.random.default_rng(7)
    num_features = 120
    x, dense, _ = tiny_problem(rng, num_features, n=12)
    model = sparse_model(num_features)
    expected = np_(model(x))
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.add_endpoint(
        "serve_sparse",
        tf.function(lambda sp: model(sp, training=False), input_signature=[
            tf.SparseTensorSpec([None, num_features], tf.float32)]))
    archive.add_endpoint(
        "serve_parts",
        tf.function(lambda i, v, s: model(tf.SparseTensor(i, v, s),
                                          training=False),
                    input_signature=[tf.TensorSpec([None, 2], tf.int64),
                                     tf.TensorSpec([None], tf.float32),
                                     tf.TensorSpec([2], tf.int64)]))
    path = os.path.join(tmp_path, "saved")
    archive.write_out(path, verbose=False)
    loaded = tf.saved_model.load(path)
    np.testing.assert_allclose(np_(loaded.serve_sparse(x)), expected,
                               rtol=1e-6)
    np.testing.assert_allclose(
        np_(loaded.serve_parts(x.indices, x.values, x.dense_shape)), expected,
        rtol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError):
        loaded.serve_parts(tf.constant([[0, num_features + 3]], tf.int64),
                           tf.constant([1.0]),
                           tf.constant([1, num_features + 4], tf.int64))


def test_lazy_adam_on_layer_equals_adam_on_touched_rows_first_step():
    """One step: LazyAdam and Keras' Adam agree on the touched rows (first
    step, zero state), and only LazyAdam leaves the others alone."""
    rng = np.random.default_rng(8)
    x = coo([0, 0, 1], [2, 7, 7], [1.0, 0.5, 2.0], [2, 10])
    layers = [built(SparseEmbeddingBag(3, use_bias=False), 10, seed=1)
              for _ in range(2)]
    upstream = tf.constant(rng.standard_normal((2, 3)).astype(np.float32))
    before = np_(layers[0].kernel).copy()
    for layer, opt in zip(layers, (LazyAdam(0.1), keras.optimizers.Adam(0.1))):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(layer(x) * upstream)
        opt.apply(tape.gradient(loss, [layer.kernel]), [layer.kernel])
    lazy, dense = np_(layers[0].kernel), np_(layers[1].kernel)
    np.testing.assert_allclose(lazy[[2, 7]], dense[[2, 7]], rtol=1e-6)
    others = [0, 1, 3, 4, 5, 6, 8, 9]
    np.testing.assert_array_equal(lazy[others], before[others])
    np.testing.assert_array_equal(dense[others], before[others])  # g=0, m=0


def test_probe_sees_the_dense_table_read_of_keras_dense():
    """The probe above can fail: Keras' Dense on the same sparse input reads
    the whole kernel in every step (a ReadVariableOp of shape [D, units])."""
    rng = np.random.default_rng(9)
    num_features = 120
    x, _, y = tiny_problem(rng, num_features, n=32)
    inputs = keras.Input((num_features,), sparse=True)
    h = keras.layers.Dense(16, activation="relu", name="bag")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(5, name="out")(h))
    opt = ProbeLazyAdam((num_features, 16), learning_rate=0.01)
    model.compile(opt, loss="mse", jit_compile=False)
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(16), epochs=1,
              verbose=0)
    assert opt.probes
    for _, full in opt.probes:
        assert any(name.startswith("ReadVariableOp") for name in full), full
