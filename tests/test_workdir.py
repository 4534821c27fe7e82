"""The work directory keeps its promises (xmc_tf.job.workdir,
xmc_tf.job.checkpoint).

In-process tests: a kill is simulated by raising an exception that is not an
``Exception`` at a chosen step while the cleanup a dying process could not
do is switched off (``files.remove_path``); what is left on disk is then
checked the way ``xmc-tf evaluate`` / ``train`` read it.  The real SIGKILL
tests are in ``tests/test_resume.py``.
"""

import json
import os
import zipfile
import socket
import subprocess
import sys

import keras
import numpy as np
import pytest

import xmc_tf
from xmc_tf.job import artifacts
from xmc_tf.job import checkpoint as ckpt
from xmc_tf import files, saving, variable_io
from xmc_tf.callbacks import EarlyStopping, ReduceLROnPlateau, SetRewiring
from xmc_tf.errors import CheckpointError
from xmc_tf.job.workdir import IncompleteWorkdir, Workdir, WorkdirBusy, WorkdirFinished, WorkdirLock


class Killed(BaseException):
    """Stands for SIGKILL: not caught by ``except Exception``."""


@pytest.fixture
def no_cleanup(monkeypatch):
    """A killed process removes no temporary files."""
    monkeypatch.setattr(files, "remove_path", lambda path: None)


def _die(*args, **kwargs):
    raise Killed()


# ---------------------------------------------------------------------------
# Atomic files.


def test_atomic_path_replaces_only_on_success(tmp_path, monkeypatch):
    path = tmp_path / "a.json"
    files.write_json_atomic(str(path), {"v": 1})
    with pytest.raises(RuntimeError):
        with files.atomic_path(str(path)) as tmp:
            open(tmp, "w").write('{"v": 2')  # half-written
            raise RuntimeError("writer failed")
    assert json.loads(path.read_text()) == {"v": 1}
    assert sorted(os.listdir(tmp_path)) == ["a.json"]  # temporary removed
    # A kill (no cleanup) leaves the old file and a temporary that
    # clean_leftovers removes.
    monkeypatch.setattr(files, "remove_path", lambda p: None)
    with pytest.raises(Killed):
        with files.atomic_path(str(path)) as tmp:
            open(tmp, "w").write('{"v": 3')
            _die()
    monkeypatch.undo()
    assert json.loads(path.read_text()) == {"v": 1}
    assert len(os.listdir(tmp_path)) == 2
    Workdir(str(tmp_path)).clean_leftovers()
    assert sorted(os.listdir(tmp_path)) == ["a.json"]


def test_atomic_directory_replace(tmp_path):
    target = tmp_path / "sm"
    for version in ("old", "new"):
        with files.atomic_path(str(target)) as tmp:
            os.makedirs(os.path.join(tmp, "variables"))
            open(os.path.join(tmp, "variables", "v"), "w").write(version)
    assert (target / "variables" / "v").read_text() == "new"
    assert sorted(os.listdir(tmp_path)) == ["sm"]
    fp = files.fingerprint(str(target))
    assert fp.startswith("sha256:") and fp == files.fingerprint(str(target))
    (target / "variables" / "v").write_text("other")
    assert files.fingerprint(str(target)) != fp


# ---------------------------------------------------------------------------
# The lock.


def _hold(path, owner):
    """Holds the flock of ``path`` on a separate descriptor with ``owner``
    recorded (as another process would)."""
    import fcntl
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.ftruncate(fd, 0)
    os.write(fd, json.dumps(owner).encode())
    return fd


def _dead_pid():
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_held_by_live_process_names_owner(tmp_path):
    with WorkdirLock(str(tmp_path)) as held:
        assert held.owner["pid"] == os.getpid()
        with pytest.raises(WorkdirBusy, match=f"pid {os.getpid()}") as e:
            WorkdirLock(str(tmp_path)).acquire()
        assert "in use by a running xmc-tf" in str(e.value)
        # --force never takes over a live owner's lock.
        with pytest.raises(WorkdirBusy):
            WorkdirLock(str(tmp_path), force=True).acquire()
        assert Workdir(str(tmp_path)).lock().read_owner()["pid"] == os.getpid()
    # Released: the record is cleared and the lock can be taken again.
    assert Workdir(str(tmp_path)).lock().read_owner() is None
    with WorkdirLock(str(tmp_path)) as again:
        assert again.previous_owner is None


def test_stale_lock_needs_force(tmp_path):
    lock_path = os.path.join(tmp_path, WorkdirLock.FILE)
    pid = _dead_pid()
    fd = _hold(lock_path, {"pid": pid, "host": socket.gethostname(),
                           "started": "earlier", "command": "xmc-tf train"})
    try:
        with pytest.raises(WorkdirBusy, match="--force") as e:
            WorkdirLock(str(tmp_path)).acquire()
        assert f"pid {pid}" in str(e.value)
        assert "no longer running" in str(e.value)
        with WorkdirLock(str(tmp_path), force=True) as lock:
            assert lock.previous_owner["pid"] == pid
            assert lock.owner["pid"] == os.getpid()
            with pytest.raises(WorkdirBusy, match=str(os.getpid())):
                WorkdirLock(str(tmp_path)).acquire()
    finally:
        os.close(fd)


def test_lock_of_another_host_needs_force(tmp_path):
    fd = _hold(os.path.join(tmp_path, WorkdirLock.FILE),
               {"pid": 1, "host": "elsewhere.example", "command": "x"})
    try:
        with pytest.raises(WorkdirBusy, match="another host.*--force"):
            WorkdirLock(str(tmp_path)).acquire()
        WorkdirLock(str(tmp_path), force=True).acquire().release()
    finally:
        os.close(fd)


def test_lock_of_dead_owner_is_free(tmp_path):
    """A process that died holding the lock released it (kernel); the next
    owner sees its record."""
    # What WorkdirLock.acquire leaves in the file, by a process that dies.
    code = ("import fcntl, json, os, sys; fd = os.open(sys.argv[1], "
            "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); "
            "os.write(fd, json.dumps({'pid': os.getpid()}).encode()); "
            "os._exit(0)")
    subprocess.run([sys.executable, "-c", code,
                    os.path.join(tmp_path, WorkdirLock.FILE)], check=True)
    with WorkdirLock(str(tmp_path)) as lock:
        assert lock.previous_owner and lock.previous_owner["pid"] != os.getpid()


# ---------------------------------------------------------------------------
# Completion marker and export order.


def _tiny_model():
    inputs = keras.Input((6,), name="features")
    outputs = xmc_tf.layers.UniformSparseDense(5, 3, seed=0, name="output")(
        keras.layers.Dense(4)(inputs))
    return keras.Model(inputs, outputs)


def _write_artifacts(wd):
    np.save(wd.file(Workdir.INV_PROPENSITIES), np.ones(5))
    np.savez(wd.file(Workdir.PREPROCESSING), method="none", idf=np.zeros(0))


def test_finished_workdir_refused_and_overwrite_drops_marker_first(tmp_path):
    wd = Workdir(str(tmp_path / "run"))
    wd.prepare_training()
    _write_artifacts(wd)
    artifacts.export_model(_tiny_model(), wd.path, k=2)
    marked = wd.mark_complete({"P@1": 50.0}, "run-1")
    assert wd.check_complete() == marked
    assert set(marked["run"]["fingerprints"]) == set(Workdir.ARTIFACTS)
    with pytest.raises(WorkdirFinished) as e:
        wd.prepare_training()
    for hint in (f"xmc-tf evaluate --workdir={wd.path}", "--workdir",
                 "--overwrite"):
        assert hint in str(e.value)
    # A model file that is not the recorded one is reported.
    artifacts.export_model(_tiny_model(), wd.path, k=2)  # new random weights
    with pytest.raises(IncompleteWorkdir, match="does not belong"):
        wd.check_complete()
    wd.prepare_training(overwrite=True)
    assert wd.completion() is None
    assert not os.path.exists(wd.file(Workdir.MODEL))
    with pytest.raises(IncompleteWorkdir, match="no finished run"):
        wd.check_complete()


@pytest.mark.parametrize("step", ["model_write", "saved_model_write",
                                  "before_metrics", "metrics_write"])
def test_kill_during_export_never_leaves_disagreeing_metrics(
        tmp_path, monkeypatch, step):
    """QA's case: a finished workdir retrained with --overwrite, killed at
    each step of the export: metrics.json is either absent or agrees with
    every model file on disk, and model.keras is never a torn file."""
    wd = Workdir(str(tmp_path / "run"))
    wd.prepare_training()
    _write_artifacts(wd)
    old = _tiny_model()
    artifacts.export_model(old, wd.path, k=2)
    wd.mark_complete({"P@1": 1.0}, "old")
    old_fp = files.fingerprint(wd.file(Workdir.MODEL))

    wd.prepare_training(overwrite=True)
    new = _tiny_model()
    monkeypatch.setattr(files, "remove_path", lambda path: None)
    if step == "model_write":
        def partial_save(self, path, *a, **k):
            open(path, "wb").write(b"PK\x03\x04 torn")
            _die()
        monkeypatch.setattr(keras.Model, "save", partial_save)
    elif step == "saved_model_write":
        monkeypatch.setattr(saving, "export_saved_model", _die)
    elif step == "metrics_write":
        def torn_write(path, data):
            with files.atomic_path(path) as tmp:
                open(tmp, "wb").write(data[:len(data) // 2])
                _die()
        monkeypatch.setattr(files, "write_bytes_atomic", torn_write)
    with pytest.raises(Killed):
        artifacts.export_model(new, wd.path, k=2)
        if step == "before_metrics":
            _die()
        wd.mark_complete({"P@1": 2.0}, "new")
    monkeypatch.undo()

    with pytest.raises(IncompleteWorkdir):
        wd.check_complete()
    assert not os.path.exists(wd.file(Workdir.METRICS))
    if os.path.exists(wd.file(Workdir.MODEL)):  # old or new, whole
        loaded = artifacts.load_model(wd.path, verify=False)
        fp = files.fingerprint(wd.file(Workdir.MODEL))
        src = old if fp == old_fp else new
        for a, b in zip(loaded.weights, src.weights):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # The next run removes what the killed writer left.
    wd.clean_leftovers()
    assert not [n for n in os.listdir(wd.path) if ".tmp-" in n or ".old-" in n]


# ---------------------------------------------------------------------------
# Checkpoint file.


def _compiled_model():
    model = _tiny_model()
    model.compile(keras.optimizers.Adam(1e-3), loss="mse", jit_compile=False)
    model.optimizer.build(model.trainable_variables)
    return model


def test_checkpoint_round_trip_and_kill_during_write(tmp_path, monkeypatch):
    model = _compiled_model()
    model.optimizer.iterations.assign(7)
    state = {"a": {"rng": np.random.default_rng(3).bit_generator.state,
                   "arr": np.arange(6.0).reshape(2, 3), "none": None,
                   "list": [1, 2.5, "x", [np.int32(4)]]}}
    path = os.path.join(tmp_path, ckpt.CHECKPOINT_FILE)
    meta = {"phase": "training", "epochs_done": 1}
    ckpt.Checkpoint.write(path, meta, model.variables,
                          model.optimizer.variables, state)
    loaded = ckpt.load(str(tmp_path))
    got = loaded.state("a")
    np.testing.assert_array_equal(got["arr"], state["a"]["arr"])
    assert got["rng"] == state["a"]["rng"] and got["none"] is None
    assert got["list"] == [1, 2.5, "x", [4]]

    # Killed while writing the next checkpoint: the previous one is intact.
    monkeypatch.setattr(files, "remove_path", lambda p: None)
    calls = []
    write_array = np.lib.format.write_array

    def dying_write_array(f, value, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            _die()
        return write_array(f, value, **kwargs)

    monkeypatch.setattr(np.lib.format, "write_array", dying_write_array)
    model.optimizer.iterations.assign(99)
    with pytest.raises(Killed):
        ckpt.Checkpoint.write(path, dict(meta, epochs_done=2),
                              model.variables, model.optimizer.variables, {})
    monkeypatch.undo()
    again = ckpt.load(str(tmp_path))
    assert again.meta["epochs_done"] == 1
    fresh = _compiled_model()

    class Holder:
        def set_state(self, s):
            self.state = s

    holder = Holder()
    ckpt.restore(again, fresh, {"a": holder})
    assert int(fresh.optimizer.iterations) == 7
    for a, b in zip(fresh.variables, model.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    np.testing.assert_array_equal(holder.state["arr"], state["a"]["arr"])


def test_restore_checks_objects_and_corrupt_backup_is_named(tmp_path):
    model = _compiled_model()
    path = os.path.join(tmp_path, ckpt.CHECKPOINT_FILE)
    ckpt.Checkpoint.write(path, {}, model.variables, model.optimizer.variables,
                          {"callback/0/X": {"n": 1}})
    with pytest.raises(CheckpointError, match="other callbacks"):
        ckpt.restore(ckpt.load(str(tmp_path)), _compiled_model(), {})
    other = keras.Model(*(lambda i: (i, keras.layers.Dense(2)(i)))(
        keras.Input((6,))))
    other.compile("adam", "mse")
    with pytest.raises(CheckpointError, match="another model"):
        ckpt.restore(ckpt.load(str(tmp_path)), other, {})
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    with pytest.raises(CheckpointError) as e:
        ckpt.load(str(tmp_path))
    assert path in str(e.value) and f"rm -r {tmp_path}" in str(e.value)
    os.remove(path)
    (tmp_path / "latest.weights.h5").write_bytes(b"old keras backup")
    with pytest.raises(CheckpointError, match="older xmc_tf"):
        ckpt.load(str(tmp_path))


def test_callback_states_survive_on_train_begin():
    """set_state before fit; Keras' on_train_begin resets must not undo it."""
    es = EarlyStopping(monitor="loss", patience=3,
                            restore_best_weights=True)
    es.set_state({"wait": 2, "stopped_epoch": 0, "best": 0.25,
                  "best_epoch": 4, "best_weights": [np.ones(2)]})
    es.on_train_begin()
    s = es.get_state()
    assert (s["wait"], s["best"], s["best_epoch"]) == (2, 0.25, 4)
    np.testing.assert_array_equal(s["best_weights"][0], np.ones(2))
    lr = ReduceLROnPlateau(monitor="loss", patience=2)
    lr.set_state({"wait": 1, "cooldown_counter": 0, "best": 0.5})
    lr.on_train_begin()
    assert lr.get_state() == {"wait": 1, "cooldown_counter": 0, "best": 0.5}


def test_set_rewiring_state_continues_the_draws():
    """After set_state(get_state()) a fresh SetRewiring draws what the
    original would have drawn next (the regrowth RNG is part of the state)."""
    a = SetRewiring(every_n_steps=5, seed=11)
    a._rng.integers(0, 100, size=17)  # advance, as rewires would
    a._periods_done, a.rewires = 4, 4
    a.last_stats = {"set_moved": 3, "set_mean_abs_pruned": 0.5,
                    "set_rewires": 4}
    state = json.loads(json.dumps(a.get_state()))  # JSON-serialisable
    b = SetRewiring(every_n_steps=5, seed=11)
    b.set_state(state)
    assert (b._periods_done, b.rewires, b.last_stats) == (4, 4, a.last_stats)
    np.testing.assert_array_equal(b._rng.integers(0, 1 << 30, size=8),
                                  a._rng.integers(0, 1 << 30, size=8))


def test_metrics_without_marker_counts_as_finished(tmp_path):
    """A metrics.json of an older xmc_tf: train refuses to overwrite it
    silently, evaluate/predict cannot verify it and say what to do."""
    wd = Workdir(str(tmp_path))
    (tmp_path / Workdir.METRICS).write_text('{"P@1": 62.9}')
    with pytest.raises(WorkdirFinished, match="--overwrite"):
        wd.prepare_training()
    with pytest.raises(IncompleteWorkdir, match="without completion marker"):
        wd.check_complete()
    wd.prepare_training(overwrite=True)
    assert not (tmp_path / Workdir.METRICS).exists()


@pytest.mark.parametrize("shape,dtype", [((37, 5), "float32"),
                                         ((11, 3, 2), "float32"),
                                         ((29,), "int32"), ((), "float32")])
def test_checkpoint_writes_large_variables_in_blocks(tmp_path, shape, dtype):
    # A row-sparse update puts the variable in copy-on-read mode, the case
    # the block reads are for; blocks of 4 rows (chunk 4 rows' bytes)
    # must give the same .npy as np.save of the whole array.
    import io
    import tensorflow as tf
    rng = np.random.default_rng(0)
    value = (rng.normal(size=shape) * 100).astype(dtype)
    var = keras.Variable(value, dtype=dtype)
    if len(shape) >= 1:
        tf_var = var.value if isinstance(var.value, tf.Variable) else var._value
        tf_var.scatter_add(tf.IndexedSlices(
            tf.ones((1,) + shape[1:], dtype), tf.constant([0])))
        value[0] += 1
    row = np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))
    buf = io.BytesIO()
    variable_io.write_variable(buf, var, chunk_bytes=4 * row if shape else 1)
    got = np.load(io.BytesIO(buf.getvalue()), allow_pickle=False)
    assert got.dtype == np.dtype(dtype) and got.shape == shape
    np.testing.assert_array_equal(got, value)


@pytest.mark.parametrize("shape,dtype", [((37, 5), "float32"),
                                         ((29,), "int32"), ((), "float32")])
def test_read_variable_in_blocks_inverts_write(tmp_path, shape, dtype):
    # np.save'd arrays (an independent writer) are assigned back in blocks
    # of 4 rows; a shape or dtype mismatch is a ValueError, not a reshape.
    import io
    rng = np.random.default_rng(1)
    value = (rng.normal(size=shape) * 100).astype(dtype)
    buf = io.BytesIO()
    np.save(buf, value)
    var = keras.Variable(np.zeros(shape, dtype), dtype=dtype)
    row = np.dtype(dtype).itemsize * int(np.prod(shape[1:], dtype=np.int64))
    buf.seek(0)
    variable_io.read_variable(buf, var, chunk_bytes=4 * row if shape else 1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(var), value)
    other = keras.Variable(np.zeros((3,) + tuple(shape), dtype), dtype=dtype)
    buf.seek(0)
    with pytest.raises(ValueError, match="file holds"):
        variable_io.read_variable(buf, other)


@pytest.mark.parametrize("state", ["copy_on_read", "shared_read"])
def test_read_variable_writes_rows_in_place_safely(state):
    # The blocks are scattered into the variable's buffer.  A variable
    # that a row-sparse op put in copy-on-read mode, and one whose buffer a
    # tensor read earlier still shares, must end with the file's values,
    # and that earlier read must keep the values it had (no write through
    # a shared buffer).
    import io
    import tensorflow as tf
    rng = np.random.default_rng(2)
    shape = (23, 3)
    before = rng.normal(size=shape).astype(np.float32)
    value = rng.normal(size=shape).astype(np.float32)
    var = keras.Variable(before)
    tf_var = var.value if isinstance(var.value, tf.Variable) else var._value
    held = None
    if state == "copy_on_read":
        tf_var.scatter_add(tf.IndexedSlices(tf.zeros((1, 3)),
                                            tf.constant([0])))
    else:
        held = tf_var.read_value()
    buf = io.BytesIO()
    np.save(buf, value)
    buf.seek(0)
    variable_io.read_variable(buf, var, chunk_bytes=4 * 3 * 4)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(var), value)
    if held is not None:
        np.testing.assert_array_equal(held.numpy(), before)


def test_restore_reads_variables_in_blocks(tmp_path, monkeypatch):
    # restore() assigns every model and optimizer variable from the file in
    # row blocks (Checkpoint.assign_to), never through a whole in-memory
    # copy (Checkpoint.array); the values equal the saved model's.
    model = _compiled_model()
    rng = np.random.default_rng(5)
    for v in model.variables + model.optimizer.variables:
        v.assign(rng.normal(size=v.shape).astype(v.dtype))
    path = os.path.join(tmp_path, ckpt.CHECKPOINT_FILE)
    ckpt.Checkpoint.write(path, {}, model.variables, model.optimizer.variables,
                          {})
    whole = []
    monkeypatch.setattr(ckpt.Checkpoint, "array",
                        lambda self, name: whole.append(name))
    fresh = _compiled_model()
    ckpt.restore(ckpt.load(str(tmp_path)), fresh, {})
    assert whole == []
    for a, b in zip(fresh.variables + fresh.optimizer.variables,
                    model.variables + model.optimizer.variables):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    # A small block size gives the same values (several slice assigns).
    again = _compiled_model()
    loaded = ckpt.load(str(tmp_path))
    i = next(j for j, v in enumerate(model.variables) if len(v.shape) == 2)
    kernel, target = model.variables[i], again.variables[i]
    loaded.assign_to(f"model/{i:06d}", target, chunk_bytes=4 * 4)
    np.testing.assert_array_equal(np.asarray(target), np.asarray(kernel))
    with pytest.raises(ValueError, match="file holds"):
        loaded.assign_to(f"model/{i:06d}", again.optimizer.iterations)
    # Damaged variable data (meta intact) is a one-line CheckpointError.
    with zipfile.ZipFile(path) as zf:
        info = zf.getinfo(f"model/{i:06d}.npy")
        start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    with open(path, "r+b") as f:
        f.seek(start + info.file_size - 1)
        last = f.read(1)
        f.seek(start + info.file_size - 1)
        f.write(bytes([last[0] ^ 0xFF]))
    with pytest.raises(CheckpointError, match="unreadable.*rm -r"):
        ckpt.restore(ckpt.load(str(tmp_path)), _compiled_model(), {})


def _monitored_run(es, model, losses):
    """Drives ``es`` through epochs with the given ``loss`` values, setting
    the model's weights to ``epoch + 1`` before each epoch end; returns the
    epochs run."""
    es.set_model(model)
    es.on_train_begin()
    done = []
    for epoch, loss in enumerate(losses):
        es.on_epoch_begin(epoch)
        model.set_weights([np.full(w.shape, epoch + 1, w.dtype)
                           for w in model.get_weights()])
        es.on_epoch_end(epoch, {"loss": loss})
        done.append(epoch)
        if model.stop_training:
            break
    es.on_train_end()
    return done


@pytest.mark.parametrize("losses", [[3.0, 2.0, 2.5, 2.2, 2.1, 1.0],
                                    [1.0, 2.0, 3.0, 4.0],
                                    [float("nan"), 2.0, 1.0, 1.5]])
def test_early_stopping_best_weights_on_disk_match_keras(tmp_path, losses):
    """Disk-backed best weights: same stop, best epoch and restored weights
    as Keras' in-memory EarlyStopping; one best file left; none held in
    the state."""
    def model():
        m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
        m.stop_training = False
        return m
    ref_model, disk_model = model(), model()
    ref = keras.callbacks.EarlyStopping(monitor="loss", patience=2,
                                        restore_best_weights=True)
    disk = EarlyStopping(monitor="loss", patience=2,
                              restore_best_weights=True,
                              best_weights_dir=str(tmp_path))
    assert _monitored_run(ref, ref_model, losses) == _monitored_run(
        disk, disk_model, losses)
    assert (disk.best_epoch, disk.stopped_epoch) == (ref.best_epoch,
                                                      ref.stopped_epoch)
    for a, b in zip(ref_model.get_weights(), disk_model.get_weights()):
        np.testing.assert_array_equal(a, b)
    disk.on_epoch_begin(0)  # the next epoch's clean-up
    assert os.listdir(tmp_path) == [f"best-{disk.best_epoch:06d}.npz"]
    state = disk.get_state()
    assert state["best_weights"] is None
    assert state["best_weights_file"] == f"best-{disk.best_epoch:06d}.npz"


def test_early_stopping_disk_state_resume_and_missing_file(tmp_path):
    """A restored state keeps its file and drops a killed epoch's leftover;
    a state whose file is gone is a CheckpointError; load() of a backup
    with only a best file is 'no checkpoint'."""
    (tmp_path / "best-000002.npz").write_bytes(b"x")
    (tmp_path / "best-000005.npz").write_bytes(b"killed epoch's file")
    state = {"wait": 1, "stopped_epoch": 0, "best": 0.5, "best_epoch": 2,
             "best_weights": None, "best_weights_file": "best-000002.npz"}
    es = EarlyStopping(monitor="loss", restore_best_weights=True,
                            best_weights_dir=str(tmp_path))
    es.set_state(state)
    es.on_train_begin()
    assert os.listdir(tmp_path) == ["best-000002.npz"]
    assert es.get_state() == state
    assert ckpt.load(str(tmp_path)) is None
    os.remove(tmp_path / "best-000002.npz")
    es = EarlyStopping(monitor="loss", restore_best_weights=True,
                            best_weights_dir=str(tmp_path))
    es.set_state(state)
    with pytest.raises(CheckpointError, match="best-000002.npz are "
                       "missing"):
        es.on_train_begin()


def test_early_stopping_moves_an_in_memory_state_to_disk(tmp_path):
    """A state with best-weight arrays (an in-memory EarlyStopping's, as
    older checkpoints hold) resumed with best_weights_dir: the arrays become
    best-EPOCH.npz and are what on_train_end restores."""
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.stop_training = False
    arrays = [np.full(w.shape, 7.0, w.dtype) for w in model.get_weights()]
    es = EarlyStopping(monitor="loss", restore_best_weights=True,
                            best_weights_dir=str(tmp_path))
    es.set_model(model)
    es.set_state({"wait": 0, "stopped_epoch": 0, "best": 0.5,
                  "best_epoch": 3, "best_weights": arrays})
    es.on_train_begin()
    assert os.listdir(tmp_path) == ["best-000003.npz"]
    assert es.get_state()["best_weights"] is None
    es.on_epoch_end(4, {"loss": 0.9})  # no improvement: file kept
    es.on_train_end()
    for got, want in zip(model.get_weights(), arrays):
        np.testing.assert_array_equal(got, want)
