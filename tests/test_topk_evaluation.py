"""TopKEvaluation and xmc_tf.job.scoring against NumPy top-k of dense
scores."""

import keras
import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data as xdata
from xmc_tf.callbacks import TopKEvaluation
from xmc_tf.layers import MachHead
from xmc_tf import decoding
from xmc_tf.job.scoring import predict_top_k, top_k_function
from op_requirements import needs_ops


def _data(seed=0, n=120, d=20, m=30):
    rng = np.random.default_rng(seed)
    x = sp.random(n, d, density=0.3, format="csr", random_state=seed,
                  dtype=np.float32)
    labels = sp.random(n, m, density=0.1, format="csr", random_state=seed + 1)
    labels.data[:] = 1.0
    return xdata.XCDataset(features=x, labels=labels.astype(np.float32)), rng


def _np_precision(scores, labels, k):
    top = np.array([sorted(range(scores.shape[1]),
                           key=lambda j: (-row[j], j))[:k] for row in scores])
    dense = labels.toarray() > 0
    return np.mean([dense[i, top[i]].sum() / k for i in range(len(top))])


def test_dense_head_logs_val_precision():
    data, _ = _data()
    inputs = keras.Input((20,), sparse=True)
    model = keras.Model(inputs, keras.layers.Dense(30)(inputs))
    cb = TopKEvaluation(data, ks=(1, 3), batch_size=50,
                        decoder=top_k_function)
    cb.set_model(model)
    logs = {"loss": 1.0}
    cb.on_epoch_end(0, logs)
    scores = model(xdata.make_tf_dataset(data, 1000).get_single_element()[0])
    for k in (1, 3):
        assert logs[f"val_precision_at_{k}"] == pytest.approx(
            _np_precision(np.asarray(scores), data.labels, k), abs=1e-9)
    assert logs["loss"] == 1.0
    assert decoding.scores_every_label(model)
    with pytest.raises(ValueError):
        TopKEvaluation(data, ks=(), decoder=top_k_function)
    with pytest.raises(ValueError, match="decoder must be a function"):
        TopKEvaluation(data, ks=(1,), decoder="top_k")
    assert TopKEvaluation(data, ks=(1,)).decoder is decoding.top_k_function


@needs_ops("xmc_mach_top_k")
def test_mach_head_is_decoded_exactly():
    data, _ = _data(seed=2)
    inputs = keras.Input((20,), sparse=True)
    head = MachHead(30, 8, 3, seed=1, decode_activation="sigmoid")
    model = keras.Model(inputs, head(keras.layers.Dense(16)(inputs)))
    assert decoding.scoring_layer(model) is head
    assert not decoding.scores_every_label(model)
    x = xdata.make_tf_dataset(data, 1000).get_single_element()[0]
    z = np.asarray(model(x), np.float64)  # [n, R, B]
    p = 1.0 / (1.0 + np.exp(-z))
    buckets = head.hashing.buckets_numpy(np.arange(30))  # [m, R]
    scores = np.stack([p[:, r, buckets[:, r]] for r in range(3)]).mean(0)
    ids = np.concatenate([i for i, _ in predict_top_k(model, data, 3, 40)])
    expected = np.array([sorted(range(30), key=lambda j: (-row[j], j))[:3]
                         for row in scores])
    np.testing.assert_array_equal(ids, expected)
    logs = {}
    cb = TopKEvaluation(data, ks=(1,), prefix="held_out_",
                        decoder=decoding.top_k_function)
    cb.set_model(model)
    cb.on_epoch_end(0, logs)
    assert logs["held_out_precision_at_1"] == pytest.approx(
        _np_precision(scores, data.labels, 1), abs=1e-9)


def test_decoder_is_built_once_and_sees_the_current_weights():
    # The callback asks the decoder once per model (top max(ks) labels) and
    # evaluates every epoch with the model's weights of that epoch.
    data, rng = _data(seed=3)
    inputs = keras.Input((20,), sparse=True)
    dense = keras.layers.Dense(30)
    model = keras.Model(inputs, dense(inputs))
    calls = []

    def decoder(m, k):
        calls.append(k)
        return decoding.top_k_function(m, k)

    cb = TopKEvaluation(data, ks=(1, 3), batch_size=64, decoder=decoder)
    cb.set_model(model)
    x = xdata.make_tf_dataset(data, 1000).get_single_element()[0]
    for epoch in range(4):  # batches of 64 and 56 rows every epoch
        dense.kernel.assign(rng.normal(size=(20, 30)).astype(np.float32))
        logs = {}
        cb.on_epoch_end(epoch, logs)
        scores = np.asarray(model(x))
        for k in (1, 3):
            assert logs[f"val_precision_at_{k}"] == pytest.approx(
                _np_precision(scores, data.labels, k), abs=1e-9)
    assert calls == [3]
    # Compiled with reduce_retracing: the first batch's shape, then an
    # unknown batch size that also serves the shorter last batch.
    assert 1 <= cb._top_k.experimental_get_tracing_count() <= 2
    other = keras.Model(inputs, keras.layers.Dense(30)(inputs))
    cb.set_model(other)
    cb.on_epoch_end(3, {})
    assert calls == [3, 3]


def test_a_compiled_decoder_is_used_as_it_is():
    # predict.top_k_function returns a tf.function: not wrapped again.
    data, _ = _data(seed=4)
    inputs = keras.Input((20,), sparse=True)
    model = keras.Model(inputs, keras.layers.Dense(30)(inputs))
    made = []

    def decoder(m, k):
        made.append(top_k_function(m, k))
        return made[-1]

    cb = TopKEvaluation(data, ks=(2,), batch_size=50, decoder=decoder)
    cb.set_model(model)
    logs = {}
    cb.on_epoch_end(0, logs)
    assert cb._top_k is made[0]
    assert made[0].experimental_get_tracing_count() >= 1
    scores = np.asarray(model(
        xdata.make_tf_dataset(data, 1000).get_single_element()[0]))
    assert logs["val_precision_at_2"] == pytest.approx(
        _np_precision(scores, data.labels, 2), abs=1e-9)
def test_top_k_function_is_traced_once_per_shape_across_epochs():
    """``fit`` with a per-epoch :class:`TopKEvaluation` over a held-out set
    whose last batch is shorter: the top-k function is made once per
    ``(model, k)`` and traced at most twice in the whole run (the first
    batch's shape, then an unknown batch size).  Before the cache, every
    epoch made and traced a new function (two traces per epoch here, and
    TF's retracing warning from the fifth epoch on; TF counts the traces
    of all functions with the same Python code, so a process evaluating
    many models, like this test session, can still see it)."""
    from xmc_tf.job import scoring as predict
    from xmc_tf.losses import SquaredHinge

    data, _ = _data(seed=3, n=110)  # batches of 50, 50, 10
    inputs = keras.Input((20,), sparse=True)
    model = keras.Model(inputs, keras.layers.Dense(30, name="output")(
        keras.layers.Dense(8)(inputs)))
    model.compile("adam", SquaredHinge(), jit_compile=False)
    train = xdata.make_tf_dataset(data, 55)
    cb = TopKEvaluation(data, ks=(1, 3), batch_size=50,
                        decoder=predict.top_k_function)
    model.fit(train, epochs=6, callbacks=[cb], verbose=0)
    fn = predict.top_k_function(model, 3)
    assert predict.top_k_function(model, 3) is fn
    assert 1 <= fn.experimental_get_tracing_count() <= 2
    traced = fn.experimental_get_tracing_count()
    predict.evaluate_model(model, data, ks=(1, 3), batch_size=50)
    predict.evaluate_model(model, data, ks=(3,), batch_size=37)
    assert fn.experimental_get_tracing_count() == traced
    # Still the current weights' top-k (the function reads the variables).
    scores = np.asarray(model(xdata.make_tf_dataset(
        data, 1000).get_single_element()[0]))
    assert cb.evaluate()["val_precision_at_3"] == pytest.approx(
        _np_precision(scores, data.labels, 3), abs=1e-9)


def test_top_k_function_checks_k_and_keeps_no_model_alive():
    import gc
    import weakref

    from xmc_tf.job import scoring as predict

    inputs = keras.Input((20,))
    model = keras.Model(inputs, keras.layers.Dense(30)(inputs))
    with pytest.raises(ValueError, match="k=31"):
        predict.top_k_function(model, 31)
    fn = predict.top_k_function(model, 2)
    ids, _ = fn(np.ones((3, 20), np.float32))
    assert ids.shape == (3, 2)
    ref = weakref.ref(model)
    del model, inputs
    gc.collect()
    assert ref() is None


def test_score_blocks_stay_within_the_budget(monkeypatch):
    """Evaluation asks the model for at most ``max_bytes`` of scores per
    batch (the batch is cut, the results stay those of NumPy's top-k)."""
    import functools

    from xmc_tf.job import scoring
    from xmc_tf.metrics.evaluator import score_batch_size

    data, _ = _data(seed=4, n=100)
    inputs = keras.Input((20,), sparse=True)
    model = keras.Model(inputs, keras.layers.Dense(30)(inputs))
    assert score_batch_size(1024, model, max_bytes=30 * 4 * 7) == 7
    assert score_batch_size(5, model, max_bytes=30 * 4 * 7) == 5
    assert score_batch_size(9, model, max_bytes=1) == 1
    monkeypatch.setattr(scoring, "score_batch_size", functools.partial(
        score_batch_size, max_bytes=30 * 4 * 16))
    batches = list(scoring.predict_top_k(model, data, k=3, batch_size=1024))
    assert [ids.shape[0] for ids, _ in batches] == [16] * 6 + [4]
    scores = np.asarray(model(xdata.make_tf_dataset(
        data, 1000).get_single_element()[0]))
    got = np.concatenate([ids for ids, _ in batches])
    np.testing.assert_array_equal(
        got, np.argsort(-scores, axis=1, kind="stable")[:, :3])
