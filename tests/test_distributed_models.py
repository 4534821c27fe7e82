"""xmc_tf.models.distributed: models and trainers under tf.distribute with
sparse features, and no fix-up call.

Keras 3.15 builds a model created under a strategy from
``strategy.reduce("MEAN", first_batch)`` (``TensorFlowTrainer.
_maybe_symbolic_build``), which fails on ``SparseTensor`` features and
casts label ids to floats, and reduces scalar step logs with ``axis=0`` in
multi-worker mode.  Checked here, in fresh interpreters (logical devices and
collective ops must be configured before TensorFlow starts):

* ``MirroredStrategy`` over two logical CPUs: a plain ``keras.Model`` with
  sparse features fails with Keras' error (the bug is real: if a Keras
  upgrade fixes it, this test says so), which xmc_tf turns into a
  ``TypeError`` naming ``DistributedModel``; ``DistributedModel`` and a stand-in
  trainer (a ``keras.Model`` subclass with its own ``train_step``, listed
  after :class:`DistributedTrainerMixin`, as ``SampledTrainer`` /
  ``ScentTrainer`` would be) train with sparse and dense features to the
  weights of the same SGD steps in one process without a strategy, and
  their loss and metrics only ever see integer label ids.
* ``MultiWorkerMirroredStrategy`` with two local workers: the stand-in
  trainer and ``DistributedModel`` (sparse features, label ids of different
  widths per worker) end with the same weights on both workers, equal to
  one process's.
"""

import os
import textwrap

import numpy as np
import pytest

from local_cluster import run_script, run_two_workers

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_MODELS = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import tensorflow as tf

    def setup_models():
        import keras
        from xmc_tf import data as xdata
        from xmc_tf.losses import SquaredHinge
        from xmc_tf.metrics import PrecisionAtK
        from xmc_tf.models.distributed import (DistributedModel,
                                               DistributedTrainerMixin)
        seen = set()  # dtypes of y_true that the loss saw (traced)

        class SpyHinge(SquaredHinge):
            def __call__(self, y_true, y_pred, sample_weight=None):
                seen.add(tf.as_dtype(y_true.dtype).name)
                return super().__call__(y_true, y_pred, sample_weight)

        class TinyTrainer(keras.Model):
            # Stand-in for CandidateTrainer: wraps a model, own train_step.
            def __init__(self, model, global_batch, **kwargs):
                super().__init__(**kwargs)
                self.inner = model
                self.global_batch = global_batch
                self.loss_fn = SpyHinge(reduction=None)
                self.tracker = keras.metrics.Mean(name="loss")

            @property
            def metrics(self):
                return [self.tracker]

            def call(self, x, training=False):
                return self.inner(x, training=training)

            def _loss(self, data, training):
                x, y = data
                per_row = self.loss_fn(y, self.inner(x, training=training))
                return tf.reduce_sum(per_row) / self.global_batch, per_row

            def train_step(self, data):
                with tf.GradientTape() as tape:
                    loss, per_row = self._loss(data, True)
                variables = self.inner.trainable_variables
                grads = tape.gradient(loss, variables)
                self.optimizer.apply(grads, variables)
                self.tracker.update_state(per_row)
                return {m.name: m.result() for m in self.metrics}

            def test_step(self, data):
                _, per_row = self._loss(data, False)
                self.tracker.update_state(per_row)
                return {m.name: m.result() for m in self.metrics}

        class DistributedTiny(DistributedTrainerMixin, TinyTrainer):
            pass

        def data(seed=5):
            ds = xdata.make_synthetic(256, 40, 30, labels_per_instance=2,
                                      features_per_instance=6, seed=seed)
            ds.features = ds.features.astype(np.float32)
            return ds

        def net(sparse, model_cls=keras.Model):
            keras.utils.set_random_seed(0)
            inputs = keras.Input((40,), sparse=sparse)
            hidden = keras.layers.Dense(16, activation="relu")(inputs)
            return model_cls(inputs, keras.layers.Dense(30)(hidden))

        def weights(model):
            return [np.asarray(v.numpy()) for v in model.trainable_variables]

        return dict(keras=keras, xdata=xdata, SpyHinge=SpyHinge, seen=seen,
                    TinyTrainer=TinyTrainer, DistributedTiny=DistributedTiny,
                    DistributedModel=DistributedModel, PrecisionAtK=PrecisionAtK,
                    data=data, net=net, weights=weights)
""")

_MIRRORED = _MODELS + textwrap.dedent(r"""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    g = setup_models()
    keras, xdata, net, weights = g["keras"], g["xdata"], g["net"], g["weights"]
    ds = g["data"]()
    B = 32
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    out = {"replicas": strategy.num_replicas_in_sync}

    def dataset(sparse):
        d = xdata.XCDataset(ds.features if sparse else ds.features.toarray(),
                            ds.labels)
        return xdata.make_tf_dataset(d, B)

    # 1. A plain keras.Model with sparse features: Keras' own error.
    with strategy.scope():
        plain = net(True)
        plain.compile(keras.optimizers.SGD(0.1), g["SpyHinge"](),
                      jit_compile=False)
    try:
        plain.fit(dataset(True), epochs=1, verbose=0)
        out["plain_error"] = None
    except Exception as e:  # noqa: BLE001
        out["plain_error"] = f"{type(e).__name__}: {e}"

    for sparse in (True, False):
        key = "sparse" if sparse else "dense"
        # 2. DistributedModel vs keras.Model in one process, same SGD steps.
        g["seen"].clear()
        ref = net(sparse)
        ref.compile(keras.optimizers.SGD(0.1), g["SpyHinge"](),
                    jit_compile=False)
        ref.fit(dataset(sparse), epochs=2, verbose=0)
        with strategy.scope():
            model = net(sparse, g["DistributedModel"])
            model.compile(keras.optimizers.SGD(0.1), g["SpyHinge"](),
                          metrics=[g["PrecisionAtK"](1)], jit_compile=False)
        hist = model.fit(dataset(sparse), epochs=2, verbose=0)
        logs = model.evaluate(dataset(sparse), verbose=0, return_dict=True)
        out[f"model_{key}"] = {
            "max_diff": max(float(np.abs(a - b).max()) for a, b in
                            zip(weights(ref), weights(model))),
            "loss": hist.history["loss"], "eval": logs,
            "seen": sorted(g["seen"])}
        # 3. The stand-in trainer, with and without the mixin's strategy.
        g["seen"].clear()
        ref = g["TinyTrainer"](net(sparse), B)
        ref.compile(keras.optimizers.SGD(0.1), jit_compile=False)
        ref.fit(dataset(sparse), epochs=2, verbose=0)
        with strategy.scope():
            trainer = g["DistributedTiny"](net(sparse), B)
            trainer.compile(keras.optimizers.SGD(0.1), jit_compile=False)
        hist = trainer.fit(dataset(sparse), epochs=2, verbose=0)
        out[f"trainer_{key}"] = {
            "max_diff": max(float(np.abs(a - b).max()) for a, b in
                            zip(weights(ref), weights(trainer))),
            "loss": hist.history["loss"], "seen": sorted(g["seen"])}
    print("RESULT " + json.dumps(out), flush=True)
""")

_WORKER = _MODELS + textwrap.dedent(r"""
    out_dir, index = sys.argv[1], int(sys.argv[2])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    g = setup_models()
    keras, xdata, net, weights = g["keras"], g["xdata"], g["net"], g["weights"]
    ds = g["data"]()
    B = 32
    out = {"replicas": strategy.num_replicas_in_sync}
    arrays = {}
    with strategy.scope():
        trainer = g["DistributedTiny"](net(True), B)
        trainer.compile(keras.optimizers.SGD(0.1), jit_compile=False)
        model = net(True, g["DistributedModel"])
        model.compile(keras.optimizers.SGD(0.1), g["SpyHinge"](),
                      metrics=[g["PrecisionAtK"](1)], jit_compile=False)
    for name, m in (("trainer", trainer), ("model", model)):
        train = xdata.distribute_tf_dataset(strategy, ds, B)
        hist = m.fit(train, epochs=2, verbose=0)
        logs = m.evaluate(xdata.distribute_tf_dataset(strategy, ds, B),
                          verbose=0, return_dict=True)
        out[name] = {"loss": [float(np.ravel(v)[0])
                              for v in hist.history["loss"]],
                     "eval": {k: float(np.ravel(v)[0])
                              for k, v in logs.items()}}
        for i, w in enumerate(weights(m)):
            arrays[f"{name}/{i}"] = w
    out["seen"] = sorted(g["seen"])
    # One process, no strategy: the same SGD steps.
    if index == 0:
        ref = g["TinyTrainer"](net(True), B)
        ref.compile(keras.optimizers.SGD(0.1), jit_compile=False)
        ref.fit(xdata.make_tf_dataset(ds, B), epochs=2, verbose=0)
        for i, w in enumerate(weights(ref)):
            arrays[f"ref/{i}"] = w
    np.savez(os.path.join(out_dir, f"worker_{index}.npz"), **arrays)
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_mirrored_sparse_and_dense_features_without_fix_up_calls():
    r = run_script(_MIRRORED, ROOT, timeout=300)
    assert r["replicas"] == 2
    # The Keras bug that the mixin works around (a plain keras.Model).
    assert r["plain_error"] is not None, (
        "Keras now trains a plain keras.Model on SparseTensor features under "
        "MirroredStrategy: DistributedTrainerMixin may be unnecessary")
    assert "'SparseTensor' object has no attribute 'device'" in (
        r["plain_error"]), r["plain_error"]
    # ... and since xmc_tf's import, its error names the fix.
    assert r["plain_error"].startswith("TypeError: "), r["plain_error"]
    assert "xmc_tf.models.DistributedModel(inputs, outputs)" in (
        r["plain_error"]), r["plain_error"]
    for key in ("model_sparse", "model_dense", "trainer_sparse",
                "trainer_dense"):
        # Two replicas' summed gradients = the one-process batch gradient.
        assert r[key]["max_diff"] < 1e-5, (key, r[key])
        assert r[key]["loss"][1] < r[key]["loss"][0], (key, r[key])
        # Built from the local batch: the loss never saw float ids.
        assert r[key]["seen"] == ["int32"], (key, r[key])
    for key in ("model_sparse", "model_dense"):
        assert 0.0 <= r[key]["eval"]["precision_at_1"] <= 1.0


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist_models")
    return out, run_two_workers(_WORKER, out, ROOT, timeout=300)


def test_multi_worker_trainer_and_model_agree_across_workers(two_workers):
    out, (r0, r1) = two_workers
    assert r0["replicas"] == r1["replicas"] == 2
    a, b = np.load(out / "worker_0.npz"), np.load(out / "worker_1.npz")
    for key in b.files:
        np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    # Two workers' summed gradients = one process's batch gradient.
    for i in range(sum(k.startswith("ref/") for k in a.files)):
        np.testing.assert_allclose(a[f"trainer/{i}"], a[f"ref/{i}"],
                                   atol=1e-5)
    for name in ("trainer", "model"):
        assert r0[name] == r1[name], name  # cross-worker means, alike
        assert r0[name]["loss"][1] < r0[name]["loss"][0]
    assert r0["seen"] == r1["seen"] == ["int32"]


_TRAINERS = textwrap.dedent(r"""
    import json
    import numpy as np
    import scipy.sparse as sp
    import tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    import keras
    import xmc_tf
    from xmc_tf.models import SampledTrainer, ScentTrainer
    from xmc_tf.samplers import NegativeSampler
    from xmc_tf.samplers.base import Candidates, mask_accidental_hits

    class AllNegatives(NegativeSampler):
        # Every label a candidate, positives masked: deterministic, so the
        # split batches must give the one-process step exactly.
        def sample(self, queries, positives, step):
            b = tf.shape(positives)[0]
            ids = tf.tile(tf.range(self.num_labels, dtype=tf.int32)[None],
                          [b, 1])
            mask = mask_accidental_hits(ids, positives)
            return Candidates(ids, mask, tf.zeros(tf.shape(ids)),
                              tf.cast(mask, tf.float32))

    n, d, m = 256, 30, 20
    rng = np.random.default_rng(0)
    x = sp.random(n, d, density=0.3, format="csr", random_state=0,
                  dtype=np.float32)
    s = x @ rng.standard_normal((d, m))
    y_multi, y_class = np.argsort(-s, 1)[:, :2], np.argmax(s, 1)
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])

    def net(sparse):
        keras.utils.set_random_seed(0)
        return keras.Sequential([
            keras.Input((d,), sparse=sparse),
            keras.layers.Dense(16, activation="relu"),
            xmc_tf.layers.LabelDense(m)])

    def run(make, y, sparse, distributed):
        features = x if sparse else x.toarray()
        with strategy.scope() if distributed else tf.device("/cpu:0"):
            trainer = make(net(sparse))
            trainer.compile(keras.optimizers.SGD(0.1),
                            metrics=[xmc_tf.metrics.PrecisionAtK(1)])
        hist = trainer.fit(features, y, batch_size=64, epochs=2, verbose=0,
                           shuffle=False,
                           validation_data=(features[:64], y[:64]))
        return trainer, hist.history

    out = {}
    for sparse in (True, False):
        key = "sparse" if sparse else "dense"
        make = lambda model: SampledTrainer(
            model, AllNegatives(m, m), loss=xmc_tf.losses.SampledSquaredHinge())
        one, h1 = run(make, y_multi, sparse, False)
        two, h2 = run(make, y_multi, sparse, True)
        out[f"sampled_{key}"] = {
            "max_diff": max(float(np.abs(a.numpy() - b.numpy()).max())
                            for a, b in zip(one.inference_model.weights,
                                            two.inference_model.weights)),
            "loss": h2["loss"], "loss_one": h1["loss"],
            "val_p1": h2["val_precision_at_1"]}
        scent, h = run(lambda model: ScentTrainer(model), y_class, sparse,
                       True)
        out[f"scent_{key}"] = {
            "visits": np.unique(scent.scent_loss.visits.numpy()).tolist(),
            "loss": h["loss"], "val_p1": h["val_precision_at_1"]}
    print("RESULT " + json.dumps(out), flush=True)
""")


def test_trainers_under_mirrored_strategy_without_fix_up_calls():
    """SampledTrainer (deterministic candidates) equals its one-process
    run; ScentTrainer updates every instance's dual once per epoch from
    both replicas; both on sparse and dense features, fit on arrays."""
    r = run_script(_TRAINERS, ROOT, timeout=300)
    for key in ("sparse", "dense"):
        sampled, scent = r[f"sampled_{key}"], r[f"scent_{key}"]
        assert sampled["max_diff"] < 1e-5, sampled
        np.testing.assert_allclose(sampled["loss"], sampled["loss_one"],
                                   rtol=1e-5)
        assert scent["visits"] == [2], scent
        assert scent["loss"][1] < scent["loss"][0], scent
        assert 0.0 <= scent["val_p1"][-1] <= 1.0
