"""What the train job holds after training (issue 32, item 3).

The memory itself is measured by ``benchmarks/run_memory.py``, not here:
these tests pin the behaviour that makes it small.
"""

import os
import warnings
import weakref
import zipfile

import h5py
import keras
import numpy as np
import pytest

import xmc_tf  # noqa: F401  (registers the ops and Keras classes)
from xmc_tf import decoding
from xmc_tf import saving, variable_io
from xmc_tf.job import fit as xfit
from xmc_tf.ops.sampled import label_variable
from xmc_tf.optimizers import LazyAdam


def _fitted_model():
    rng = np.random.default_rng(0)
    x = keras.Input((6,), name="features")
    h = keras.layers.Dense(5, activation="relu", name="hidden")(x)
    model = keras.Model(x, keras.layers.Dense(3, name="output")(h))
    model.compile(LazyAdam(1e-2), loss="mse", jit_compile=False)
    data = rng.normal(size=(32, 6)).astype(np.float32)
    model.fit(data, rng.normal(size=(32, 3)).astype(np.float32),
              batch_size=8, epochs=1, verbose=0)
    return model, data


def test_release_optimizer_frees_the_slots_and_keeps_the_model(tmp_path):
    model, data = _fitted_model()
    optimizer = model.optimizer
    want_bytes = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                     for v in optimizer.variables)
    slots = [weakref.ref(label_variable(v)) for v in optimizer.variables
             if len(v.shape) == 2]
    assert slots  # the two Adam moments of each kernel
    opt_ref = weakref.ref(optimizer)
    before = model.predict(data, verbose=0)
    del optimizer

    assert xfit.release_optimizer(model) == want_bytes
    assert opt_ref() is None
    assert all(ref() is None for ref in slots)
    assert model.optimizer is None and not model.compiled
    np.testing.assert_array_equal(model.predict(data, verbose=0), before)
    assert xfit.release_optimizer(model) == 0  # nothing left

    # model.keras of the model nested as the job exports it (behind the
    # normalisation) holds the model's variables only, and loading it
    # builds no optimizer (Keras compiled a nested model that had a
    # compile config, and warned that its saved optimizer had no
    # variables: an error here).
    x = keras.Input((6,), name="raw")
    exported = keras.Model(x, model(x))
    path = os.path.join(tmp_path, "m.keras")
    exported.save(path)
    with zipfile.ZipFile(path) as zf, zf.open("model.weights.h5") as f:
        names = []
        h5py.File(f, "r").visit(names.append)
    assert names and not any("optimizer" in n for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = keras.models.load_model(path, compile=False)
    assert all(getattr(layer, "optimizer", None) is None
               for layer in loaded._flatten_layers())
    np.testing.assert_array_equal(loaded.predict(data, verbose=0), before)


def test_release_optimizer_without_optimizer():
    x = keras.Input((2,))
    model = keras.Model(x, keras.layers.Dense(1)(x))
    assert xfit.release_optimizer(model) == 0
    model.compile(LazyAdam(1e-2), loss="mse")  # not built: no variables yet
    assert xfit.release_optimizer(model) == 0
    assert model.optimizer is None


def _h5_datasets(path):
    out = {}
    with zipfile.ZipFile(path) as zf, zf.open("model.weights.h5") as f:
        with h5py.File(f, "r") as h5:
            h5.visititems(lambda name, obj: out.__setitem__(name, obj[()])
                          if isinstance(obj, h5py.Dataset) else None)
    return out


def test_save_keras_file_writes_the_archive_model_save_writes(
        tmp_path, monkeypatch):
    # The streamed weights file, its kernels written in blocks of one row
    # (16-byte blocks), gives the archive Keras' own model.save writes (in
    # memory, on this machine): the same entries, the same config, the
    # same arrays; and it loads to the same model.
    model, data = _fitted_model()
    xfit.release_optimizer(model)
    ours, keras_own = (os.path.join(tmp_path, n) for n in ("a.keras",
                                                           "b.keras"))
    written = []
    write = variable_io.write_h5_dataset

    def spy(group, name, variable, chunk_bytes):
        done = write(group, name, variable, chunk_bytes)
        written.append((tuple(variable.shape), done))
        return done
    monkeypatch.setattr(variable_io, "write_h5_dataset", spy)
    saving.save_keras_file(model, ours, chunk_bytes=16)
    assert ((6, 5), True) in written and ((5, 3), True) in written
    assert ((5,), True) in written  # 20 bytes: a block of 4 values
    model.save(keras_own)
    with zipfile.ZipFile(ours) as a, zipfile.ZipFile(keras_own) as b:
        assert sorted(a.namelist()) == sorted(b.namelist())
        assert a.read("config.json") == b.read("config.json")
    got, want = _h5_datasets(ours), _h5_datasets(keras_own)
    assert sorted(got) == sorted(want) and got
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    assert sorted(os.listdir(tmp_path)) == ["a.keras", "b.keras"]  # no temp
    loaded = keras.models.load_model(ours, compile=False)
    np.testing.assert_array_equal(loaded.predict(data, verbose=0),
                                  model.predict(data, verbose=0))


@pytest.mark.parametrize("labels,eval_batch,train_batch,want", [
    (159, 1024, 64, 1024),       # Bibtex: 0.6 MiB blocks, unchanged
    (10_122, 1024, 64, 1024),    # WordNetHypernyms: 40 MiB, unchanged
    (16_384, 1024, 64, 1024),    # exactly 64 MiB
    (16_385, 1024, 64, 1023),    # 64 MiB of rows: the free allowance
    (670_091, 1024, 64, 64),     # the training batch's rows
    (670_091, 1024, 256, 100),   # 256 MiB blocks at most
    (670_091, 32, 64, 32)])
def test_validation_batch_size(labels, eval_batch, train_batch, want):
    # Reference: rows of float32 scores within max(64 MiB, a training
    # batch's scores), and within 256 MiB; never more than asked.
    x = keras.Input((3,))
    model = keras.Model(x, keras.layers.Dense(labels)(x))
    row = 4 * labels
    budget = min(256 << 20, max(64 << 20, row * train_batch))
    assert want == min(eval_batch, budget // row)
    assert xfit.validation_batch_size(eval_batch, train_batch,
                                        model) == want


if __name__ == "__main__":
    raise SystemExit(pytest.main([__file__, "-q"]))
