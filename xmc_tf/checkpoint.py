"""Exact resume of ``xmc-tf train``: the whole training state in one file.

A run killed at any point resumes from ``WORKDIR/backup/checkpoint.npz``
and ends with the weights, connectivity and metrics an uninterrupted run
would have produced (on a deterministic device: see ``tests/test_resume.py``
for what is pinned there).  The file is written at the end of every epoch
and once more when training ends, to a temporary sibling renamed into place
(:func:`xmc_tf.workdir.atomic_path`): a kill during the write leaves the
previous checkpoint intact.

What it holds:

* every variable of the model (``model.variables``: weights, the int32
  connectivity of uniform-sparse layers, the Keras seed-generator state of
  the dropout layers) and of the optimizer (step count, learning rate --
  also what ``ReduceLROnPlateau`` changed --, moments);
* the state of every object with ``get_state()``/``set_state(state)`` that
  the trainer registers (:class:`Checkpointer`'s ``stateful``): callbacks
  such as :class:`xmc_tf.callbacks.SetRewiring` (step counter, RNG),
  :class:`EarlyStopping` and :class:`ReduceLROnPlateau` below (counters,
  best value, best weights -- for ``xmc-tf train`` the name of the
  ``best-EPOCH.npz`` file beside the checkpoint, not the arrays), and the
  training model if it has them (e.g.
  a sampler's index state).  A state is any nesting of dicts (str keys),
  lists, JSON scalars and NumPy arrays;
* the bookkeeping: epochs done, whether training stopped early or finished
  (``phase``), training seconds and peak RSS summed over the processes of
  the run, every epoch's logs (``history.csv`` is rewritten from them), the
  run id and the config the run was started with.

Restore order (:func:`restore`): model and optimizer variables are assigned
and ``set_state`` is called *before* ``model.fit`` starts, so no callback
acts on a half-restored run; callbacks whose ``on_train_begin`` resets their
state must re-apply a restored one (as the two Keras subclasses here do).
The data order is keyed by ``(seed, epoch)``
(:func:`xmc_tf.data.make_tf_dataset`), so the resumed epochs see the same
batches.  The granularity is one epoch: a run killed mid-epoch repeats that
epoch from its start.
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
import resource
import time
import zipfile

import keras
import numpy as np
from absl import logging

from xmc_tf.workdir import WorkdirError, atomic_path, write_bytes_atomic

__all__ = ["CheckpointError", "Checkpoint", "Checkpointer", "EarlyStopping",
           "ReduceLROnPlateau", "stateful_objects", "restore", "load",
           "write_history_csv", "discard_hint", "CHECKPOINT_FILE", "FORMAT"]

#: File name inside the backup directory.
CHECKPOINT_FILE = "checkpoint.npz"
#: Best-weights files of :class:`EarlyStopping` in the backup directory.
BEST_WEIGHTS_PATTERN = re.compile(r"best-(\d{6})\.npz$")
#: Version of the file layout (``meta["format"]``).
FORMAT = 1


class CheckpointError(WorkdirError):
    """The backup cannot be used: unreadable, or written for another
    model/config.  The message names the file and how to discard it."""


def discard_hint(directory: str) -> str:
    """How to discard backup ``directory`` (for error messages)."""
    workdir = os.path.dirname(os.path.abspath(directory))
    return (f"discard it with `rm -r {directory}` to start over (or rerun "
            f"with --overwrite, which also discards {workdir}'s results)")


# ---------------------------------------------------------------------------
# State encoding: JSON with NumPy arrays set aside.


def _unreadable(path: str, error: Exception) -> CheckpointError:
    """The one-line error for a backup file that cannot be read (the file,
    the cause, and how to discard it)."""
    return CheckpointError(
        f"the backup {path} is unreadable ({type(error).__name__}: "
        f"{' '.join(str(error).split())}); "
        f"{discard_hint(os.path.dirname(path))}")


def _encode(obj, arrays: dict, prefix: str):
    if isinstance(obj, dict):
        out = {}
        for k, v in obj.items():
            if not isinstance(k, str):
                raise TypeError(f"state keys must be str, got {k!r} at {prefix}")
            out[k] = _encode(v, arrays, f"{prefix}/{k}")
        return out
    if isinstance(obj, (list, tuple)):
        return [_encode(v, arrays, f"{prefix}/{i}") for i, v in enumerate(obj)]
    if isinstance(obj, np.ndarray) or hasattr(obj, "__array__") and not \
            isinstance(obj, (str, bytes, int, float, bool, np.generic)):
        name = f"state{prefix}"
        arrays[name] = np.asarray(obj)
        return {"__ndarray__": name}
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    raise TypeError(f"state value at {prefix or '/'} is a {type(obj).__name__}; "
                    "expected dict, list, JSON scalar or NumPy array")


def _decode(obj, arrays):
    if isinstance(obj, dict):
        if set(obj) == {"__ndarray__"}:
            return np.array(arrays[obj["__ndarray__"]])
        return {k: _decode(v, arrays) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v, arrays) for v in obj]
    return obj


#: Largest block of a variable read at once when writing a checkpoint.
CHUNK_BYTES = 64 * 2**20


def _write_variable(f, variable, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Writes ``variable`` to the binary file ``f`` in ``.npy`` format,
    reading at most ``chunk_bytes`` of it at a time.

    A variable larger than ``chunk_bytes`` is read in blocks of rows with
    ``ResourceGather`` (``tf.gather`` on the variable), so writing it never
    holds a second full copy: after a row-sparse update TensorFlow keeps a
    variable in copy-on-read mode, where a dense read copies all of it
    (an encoder ``[D, d]`` and its two Adam slots: three transient copies of
    ``4 D d`` bytes without this).  Scalars, small variables and
    ``tf.distribute`` variables are read whole.

    Args:
      f: a writable binary file object.
      variable: a ``keras.Variable`` (TensorFlow backend) or ``tf.Variable``.
      chunk_bytes: bytes per block (> 0).
    """
    import tensorflow as tf

    from xmc_tf.ops.sampled import label_variable
    shape = tuple(int(d) for d in variable.shape)
    dtype = np.dtype(variable.dtype)
    tf_var = label_variable(variable)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    if (tf_var is None or len(shape) == 0 or shape[0] == 0
            or row_bytes * shape[0] <= chunk_bytes):
        value = np.asarray(keras.ops.convert_to_numpy(variable))  # 0-d stays
        if not value.flags.c_contiguous:
            value = value.copy(order="C")
        np.lib.format.write_array(f, value, allow_pickle=False)
        return
    header = {"descr": np.lib.format.dtype_to_descr(dtype),
              "fortran_order": False, "shape": shape}
    np.lib.format.write_array_header_2_0(f, header)
    rows = max(1, chunk_bytes // max(row_bytes, 1))
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        block = tf.gather(tf_var, tf.range(start, stop)).numpy()
        f.write(np.ascontiguousarray(block, dtype).tobytes())


def _put_npy(zf, name: str, value) -> None:
    """Adds ``NAME.npy`` to the open ``zipfile.ZipFile`` ``zf``: a Keras /
    TF variable through :func:`_write_variable` (blocks of rows), anything
    else as a C-ordered NumPy array (0-d stays 0-d)."""
    with zf.open(name + ".npy", "w", force_zip64=True) as f:
        if isinstance(value, np.ndarray) or np.isscalar(value):
            value = np.asarray(value)
            if not value.flags.c_contiguous:
                value = value.copy(order="C")
            np.lib.format.write_array(f, value, allow_pickle=False)
        else:
            _write_variable(f, value)


def _describe_variables(variables) -> list:
    return [[v.path, list(v.shape), str(np.dtype(v.dtype))] for v in variables]


def _comparable(description):
    """A variable description without the numeric suffixes Keras adds to
    auto-generated names (``dense_3`` in one process, ``dense`` in another)."""
    path, shape, dtype = description
    return [re.sub(r"_\d+(?=[/_]|$)", "", path), shape, dtype]


def _optimizer_variables(model):
    opt = getattr(model, "optimizer", None)
    return list(opt.variables) if opt is not None and opt.built else []


# ---------------------------------------------------------------------------
# The file.


class Checkpoint:
    """A loaded checkpoint: ``meta`` (the JSON part) and lazy arrays.

    Attributes:
      path: the file.
      meta: dict with ``format``, ``phase`` (``"training"`` or
        ``"trained"``), ``epochs_done``, ``stopped``, ``train_seconds``,
        ``peak_memory_bytes``, ``history`` (list of epoch log dicts),
        ``run_id``, ``resumes``, ``config``, ``model`` / ``optimizer``
        (``[path, shape, dtype]`` per variable) and ``objects`` (encoded
        states by key).
    """

    def __init__(self, path: str, meta: dict, arrays):
        self.path = path
        self.meta = meta
        self._arrays = arrays

    def array(self, name: str) -> np.ndarray:
        """The whole array ``name`` (read into memory)."""
        return self._arrays[name]

    def assign_to(self, name: str, variable,
                  chunk_bytes: int = CHUNK_BYTES) -> None:
        """Assigns the saved array ``name`` to ``variable`` in blocks of at
        most ``chunk_bytes`` bytes of rows (:func:`_read_variable`), so that
        restoring a ``[D, d]`` embedding or optimizer slot never holds a
        second whole copy of it in memory.

        Raises:
          KeyError: no array ``name``.
          ValueError: its shape or dtype differs from the variable's.
        """
        with self._arrays.zip.open(f"{name}.npy") as f:
            _read_variable(f, variable, chunk_bytes)

    def state(self, key: str):
        """The decoded ``get_state()`` of object ``key`` (KeyError if none)."""
        return _decode(self.meta["objects"][key], self._arrays)

    @staticmethod
    def write(path: str, meta: dict, model_variables, optimizer_variables,
              objects: dict) -> None:
        """Writes a checkpoint atomically (one array in memory at a time;
        large variables in blocks of rows, see :func:`_write_variable`).

        Args:
          path: destination ``.npz``.
          meta: the bookkeeping part of :attr:`meta` (JSON-serialisable).
          model_variables / optimizer_variables: Keras variables, saved in
            order as ``model/NNNNNN`` / ``optimizer/NNNNNN``.
          objects: ``{key: get_state() result}``.
        """
        arrays: dict = {}
        meta = dict(meta, format=FORMAT,
                    model=_describe_variables(model_variables),
                    optimizer=_describe_variables(optimizer_variables),
                    objects={k: _encode(s, arrays, f"/{k}")
                             for k, s in objects.items()})
        meta_bytes = json.dumps(meta).encode()
        with atomic_path(path) as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED,
                                 allowZip64=True) as zf:
                for group, variables in (("model", model_variables),
                                         ("optimizer", optimizer_variables)):
                    for i, v in enumerate(variables):
                        _put_npy(zf, f"{group}/{i:06d}", v)
                for name, value in arrays.items():
                    _put_npy(zf, name, value)
                # Last, so a file that has it was written to the end.
                _put_npy(zf, "meta", np.frombuffer(meta_bytes, np.uint8))

    @classmethod
    def read(cls, path: str) -> "Checkpoint":
        """Opens a checkpoint.

        Raises:
          CheckpointError: unreadable, truncated or of another format (the
            message names the file and how to discard it).
        """
        try:
            arrays = np.load(path, allow_pickle=False)
            meta = json.loads(bytes(arrays["meta"]).decode())
            if meta.get("format") != FORMAT:
                raise ValueError(f"format {meta.get('format')!r}, expected "
                                 f"{FORMAT}")
            names = set(arrays.files)
            for group in ("model", "optimizer"):
                for i in range(len(meta[group])):
                    if f"{group}/{i:06d}" not in names:
                        raise ValueError(f"{group} variable {i} missing")
        except Exception as e:  # zipfile, numpy and JSON errors alike
            raise _unreadable(path, e) from e
        return cls(path, meta, arrays)


def load(directory: str) -> Checkpoint | None:
    """The checkpoint in backup ``directory``, or None if there is none.

    Raises:
      CheckpointError: the file is unreadable, or the directory holds a
        backup in another format (e.g. Keras ``BackupAndRestore`` files of
        an older xmc_tf).
    """
    path = os.path.join(directory, CHECKPOINT_FILE)
    if os.path.exists(path):
        return Checkpoint.read(path)
    if os.path.isdir(directory):
        others = [n for n in os.listdir(directory) if not n.startswith(".")
                  and not BEST_WEIGHTS_PATTERN.match(n)]
        if others:
            raise CheckpointError(
                f"the backup {directory} holds {', '.join(sorted(others)[:3])}"
                f" but no {CHECKPOINT_FILE} (an older xmc_tf's format, which "
                f"cannot resume exactly); {discard_hint(directory)}")
    return None


# ---------------------------------------------------------------------------
# Restoring.


def stateful_objects(callbacks, training_model=None) -> dict:
    """``{key: object}`` of the objects whose state a checkpoint keeps.

    Every callback with ``get_state`` and ``set_state`` methods, keyed
    ``callback/INDEX/CLASS`` (stable for a given config), and the training
    model as ``model`` if it has them.
    """
    out = {}
    for i, cb in enumerate(callbacks):
        if callable(getattr(cb, "get_state", None)) and callable(
                getattr(cb, "set_state", None)):
            out[f"callback/{i}/{type(cb).__name__}"] = cb
    if training_model is not None and callable(
            getattr(training_model, "get_state", None)) and callable(
                getattr(training_model, "set_state", None)):
        out["model"] = training_model
    return out


def restore(checkpoint: Checkpoint, model, stateful: dict) -> None:
    """Restores variables and object states; call before ``model.fit``.

    Builds the optimizer if needed, checks that every variable matches the
    recorded path/shape/dtype, assigns the values (large variables in
    blocks of rows, :meth:`Checkpoint.assign_to`), then calls
    ``set_state`` of every object in ``stateful``.

    Raises:
      CheckpointError: the checkpoint was written for another model
        (variables or stateful objects differ), or a variable's data in it
        is damaged (e.g. a CRC mismatch).
    """
    directory = os.path.dirname(checkpoint.path)
    opt = model.optimizer
    if opt is not None and not opt.built:
        opt.build(model.trainable_variables)
    groups = (("model", list(model.variables)),
              ("optimizer", _optimizer_variables(model)))
    for group, variables in groups:
        saved = [_comparable(d) for d in checkpoint.meta[group]]
        now = [_comparable(d) for d in _describe_variables(variables)]
        if saved != now:
            diff = next((f"{a} != {b}" for a, b in zip(saved, now) if a != b),
                        f"{len(saved)} != {len(now)} variables")
            raise CheckpointError(
                f"the backup {checkpoint.path} was written for another "
                f"model ({group} {diff}); {discard_hint(directory)}")
    try:
        for group, variables in groups:
            for i, v in enumerate(variables):
                checkpoint.assign_to(f"{group}/{i:06d}", v)
    except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
        raise _unreadable(checkpoint.path, e) from e
    missing = sorted(set(stateful) - set(checkpoint.meta["objects"]))
    extra = sorted(set(checkpoint.meta["objects"]) - set(stateful))
    if missing or extra:
        raise CheckpointError(
            f"the backup {checkpoint.path} was written with other callbacks "
            f"(missing {missing}, unexpected {extra}); "
            f"{discard_hint(directory)}")
    for key, obj in stateful.items():
        obj.set_state(checkpoint.state(key))


# ---------------------------------------------------------------------------
# The callback.


def _peak_memory_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def write_history_csv(path: str, history: list) -> None:
    """Writes ``history.csv`` atomically: ``epoch,KEY,...`` (keys sorted;
    Keras CSVLogger's layout), one row per dict of ``history``."""
    keys = sorted({k for row in history for k in row if k != "epoch"})
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["epoch"] + keys)
    for row in history:
        writer.writerow([row["epoch"]] + [row.get(k, "") for k in keys])
    write_bytes_atomic(path, buf.getvalue().encode())


def _jsonable_logs(logs) -> dict:
    out = {}
    for k, v in (logs or {}).items():
        try:
            out[k] = float(v) if not isinstance(v, (int, str)) else v
        except (TypeError, ValueError):
            continue
    return out


class Checkpointer(keras.callbacks.Callback):
    """Writes the training state at every epoch end and when training ends.

    Place it **last** in the callback list: its ``on_epoch_end`` must see
    the state that the others (early stopping, LR schedule, SET statistics)
    leave, and its ``on_train_end`` the best weights that ``EarlyStopping``
    restores.  It also rewrites ``history.csv`` from the checkpointed epoch
    logs, so the file never holds rows of epochs a resumed run repeats.

    Args:
      directory: the backup directory (created).
      stateful: ``{key: object}`` from :func:`stateful_objects`.
      history_path: ``history.csv`` to rewrite, or None.
      meta: bookkeeping carried over: ``run_id``, ``config``, ``resumes``
        and, when resuming, ``history``, ``train_seconds`` (earlier
        processes), ``peak_memory_bytes``.

    Attributes:
      history: every epoch's logs so far (all processes), ``epoch`` 0-based.
      train_seconds: training seconds of all processes so far.
    """

    def __init__(self, directory: str, stateful: dict, history_path=None,
                 meta: dict | None = None):
        super().__init__()
        self.directory = directory
        self.stateful = stateful
        self.history_path = history_path
        meta = dict(meta or {})
        self.history = list(meta.pop("history", []))
        self._prior_seconds = float(meta.pop("train_seconds", 0.0))
        self._prior_peak = int(meta.pop("peak_memory_bytes", 0))
        self.meta = meta
        self._start = None
        self.phase = "training"

    @property
    def path(self) -> str:
        return os.path.join(self.directory, CHECKPOINT_FILE)

    @property
    def train_seconds(self) -> float:
        run = 0.0 if self._start is None else time.perf_counter() - self._start
        return self._prior_seconds + run

    @property
    def peak_memory_bytes(self) -> int:
        return max(self._prior_peak, _peak_memory_bytes())

    def save(self, phase: str) -> None:
        """Writes the checkpoint now (``phase``: "training" or "trained")."""
        os.makedirs(self.directory, exist_ok=True)
        meta = dict(self.meta, phase=phase, epochs_done=len(self.history),
                    stopped=bool(getattr(self.model, "stop_training", False)),
                    train_seconds=self.train_seconds,
                    peak_memory_bytes=self.peak_memory_bytes,
                    history=self.history)
        Checkpoint.write(self.path, meta, list(self.model.variables),
                         _optimizer_variables(self.model),
                         {k: o.get_state() for k, o in self.stateful.items()})
        self.phase = phase

    def on_train_begin(self, logs=None):
        self._start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.history.append(dict(_jsonable_logs(logs), epoch=int(epoch)))
        self.save("training")
        if self.history_path:
            write_history_csv(self.history_path, self.history)

    def on_train_end(self, logs=None):
        self.save("trained")
        if self._start is not None:
            self._prior_seconds = self.train_seconds
            self._start = None


# ---------------------------------------------------------------------------
# Keras callbacks with state.


def _read_variable(f, variable, chunk_bytes: int = CHUNK_BYTES) -> None:
    """Assigns the ``.npy`` array at the position of binary file ``f`` to
    ``variable``, at most ``chunk_bytes`` of it at a time (the reverse of
    :func:`_write_variable`: blocks of rows assigned by slice, so a large
    variable is never held twice).

    Raises:
      ValueError: the array's shape or dtype differs from the variable's.
    """
    major, _ = np.lib.format.read_magic(f)
    read_header = (np.lib.format.read_array_header_1_0 if major == 1 else
                   np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(f)
    want = tuple(int(d) for d in variable.shape)
    if tuple(shape) != want or dtype != np.dtype(variable.dtype) or fortran:
        raise ValueError(f"{variable.path}: file holds {dtype}{list(shape)}, "
                         f"variable is {np.dtype(variable.dtype)}{list(want)}")
    from xmc_tf.ops.sampled import label_variable
    tf_var = label_variable(variable)
    row_bytes = dtype.itemsize * int(np.prod(shape[1:], dtype=np.int64))
    if (tf_var is None or len(shape) == 0 or shape[0] == 0
            or row_bytes * shape[0] <= chunk_bytes):
        count = int(np.prod(shape, dtype=np.int64))
        value = np.frombuffer(f.read(count * dtype.itemsize), dtype, count)
        variable.assign(value.reshape(shape))
        return
    rows = max(1, chunk_bytes // max(row_bytes, 1))
    for start in range(0, shape[0], rows):
        stop = min(shape[0], start + rows)
        block = np.frombuffer(f.read((stop - start) * row_bytes), dtype)
        tf_var[start:stop].assign(block.reshape((stop - start,) + shape[1:]))


class EarlyStopping(keras.callbacks.EarlyStopping):
    """``keras.callbacks.EarlyStopping`` whose state survives a resume and
    whose best weights can live on disk instead of in memory.

    ``get_state()`` returns the patience counter, best value and epoch, the
    epoch it stopped at and the best weights (``restore_best_weights``);
    ``set_state`` re-applies them after Keras' ``on_train_begin`` reset.

    With ``best_weights_dir``, the weights of the best epoch are written to
    ``best_weights_dir/best-EPOCH.npz`` (atomically, in blocks of rows) and
    read back in blocks when training ends, instead of Keras' in-memory
    copy (``model.get_weights()``: one more copy of every weight, e.g.
    1 GB for a ``[500k, 512]`` float32 encoder).  The state then names the
    file rather than holding the arrays, so a checkpoint does not store the
    weights twice either.  Files of other epochs (a better epoch's
    predecessor, a killed epoch's leftovers) are deleted once a checkpoint
    no longer needs them: at the next epoch's start and at
    ``on_train_begin``.

    Args:
      best_weights_dir: directory for the best-weights file (created), or
        None for Keras' in-memory copy.
      *args, **kwargs: as for ``keras.callbacks.EarlyStopping``.

    Raises:
      CheckpointError: (``on_train_begin``) a restored state names a
        best-weights file that is missing; (``on_train_end``) the file does
        not match the model.

    >>> cb = EarlyStopping(monitor="val_loss", patience=3)
    >>> state = cb.get_state()  # before training too
    >>> state["wait"], state["best"], state["best_epoch"]
    (0, None, 0)
    >>> cb.set_state(state)
    """

    _pending = None

    def __init__(self, *args, best_weights_dir: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.best_weights_dir = best_weights_dir
        self.best_weights_file = None  # name inside best_weights_dir
        # Keras sets best_epoch in on_train_begin only: get_state() of a
        # callback that has not trained yet failed (AttributeError).
        self.best_epoch = getattr(self, "best_epoch", 0)

    @property
    def _on_disk(self) -> bool:
        return bool(self.restore_best_weights and self.best_weights_dir)

    def get_state(self) -> dict:
        best_weights = self.best_weights
        return {"wait": int(self.wait), "stopped_epoch": int(self.stopped_epoch),
                "best": None if self.best is None else float(self.best),
                "best_epoch": int(self.best_epoch),
                "best_weights": None if best_weights is None else
                [np.asarray(w) for w in best_weights],
                "best_weights_file": self.best_weights_file}

    def set_state(self, state: dict) -> None:
        self._pending = dict(state)
        self._apply()

    def _apply(self):
        s = self._pending
        self.wait, self.stopped_epoch = s["wait"], s["stopped_epoch"]
        self.best, self.best_epoch = s["best"], s["best_epoch"]
        self.best_weights = s["best_weights"]
        self.best_weights_file = s.get("best_weights_file")

    def _remove_stale_files(self):
        if not self.best_weights_dir or not os.path.isdir(
                self.best_weights_dir):
            return
        for name in os.listdir(self.best_weights_dir):
            if (BEST_WEIGHTS_PATTERN.match(name)
                    and name != self.best_weights_file):
                os.remove(os.path.join(self.best_weights_dir, name))

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._pending is not None:
            self._apply()
            self._pending = None
        else:
            self.best_weights_file = None
        if (self._on_disk and self.best_weights is not None
                and not self.best_weights_file):
            # A state of an in-memory EarlyStopping (an older checkpoint):
            # its arrays become the file.
            self._write_best(self.best_epoch, self.best_weights)
            self.best_weights = None
        if self._on_disk and self.best_weights_file and not os.path.exists(
                os.path.join(self.best_weights_dir, self.best_weights_file)):
            raise CheckpointError(
                f"the best weights {self.best_weights_file} are missing from "
                f"{self.best_weights_dir}; "
                f"{discard_hint(self.best_weights_dir)}")
        self._remove_stale_files()

    def on_epoch_begin(self, epoch, logs=None):
        self._remove_stale_files()

    def on_epoch_end(self, epoch, logs=None):
        if not self._on_disk:
            return super().on_epoch_end(epoch, logs)
        before = self.best_epoch
        self.restore_best_weights = False  # Keras' copy: not wanted
        try:
            super().on_epoch_end(epoch, logs)
        finally:
            self.restore_best_weights = True
        first = (self.best_weights_file is None
                 and epoch >= self.start_from_epoch
                 and (logs or {}).get(self.monitor) is not None)
        # Keras sets best_epoch only on an improvement (values such as NaN
        # make comparing ``best`` unreliable).
        if (self.best_epoch == epoch and before != epoch) or first:
            self._write_best(epoch, self.model.weights)
            if first:  # Keras' "no best yet" rule
                self.best_epoch = epoch

    def _write_best(self, epoch, weights):
        """Writes ``weights`` (variables, read in blocks, or arrays) as
        ``best-EPOCH.npz`` and names it in the state."""
        name = f"best-{epoch:06d}.npz"
        os.makedirs(self.best_weights_dir, exist_ok=True)
        with atomic_path(os.path.join(self.best_weights_dir, name)) as tmp:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED,
                                 allowZip64=True) as zf:
                for i, w in enumerate(weights):
                    _put_npy(zf, f"{i:06d}", w)
        self.best_weights_file = name

    def on_train_end(self, logs=None):
        if not (self._on_disk and self.best_weights_file):
            return super().on_train_end(logs)
        if self.stopped_epoch > 0 and self.verbose > 0:
            logging.info("Epoch %d: early stopping", self.stopped_epoch + 1)
        path = os.path.join(self.best_weights_dir, self.best_weights_file)
        if self.verbose > 0:
            logging.info("Restoring model weights from the end of the best "
                         "epoch: %d (%s).", self.best_epoch + 1, path)
        try:
            with zipfile.ZipFile(path) as zf:
                for i, v in enumerate(self.model.weights):
                    with zf.open(f"{i:06d}.npy") as f:
                        _read_variable(f, v)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise CheckpointError(
                f"the best weights {path} do not fit the model ("
                f"{type(e).__name__}: {' '.join(str(e).split())}); "
                f"{discard_hint(self.best_weights_dir)}") from e


class ReduceLROnPlateau(keras.callbacks.ReduceLROnPlateau):
    """``keras.callbacks.ReduceLROnPlateau`` whose state survives a resume.

    ``get_state()`` returns the patience and cooldown counters and the best
    value (the learning rate itself is an optimizer variable, checkpointed
    with the optimizer); ``set_state`` re-applies them after Keras'
    ``on_train_begin`` reset.  Arguments as for Keras' class.

    >>> cb = ReduceLROnPlateau(monitor="val_loss")
    >>> cb.set_state(cb.get_state())
    """

    _pending = None

    def get_state(self) -> dict:
        return {"wait": int(self.wait),
                "cooldown_counter": int(self.cooldown_counter),
                "best": None if self.best is None else float(self.best)}

    def set_state(self, state: dict) -> None:
        self._pending = dict(state)
        self._apply()

    def _apply(self):
        s = self._pending
        self.wait, self.cooldown_counter = s["wait"], s["cooldown_counter"]
        self.best = s["best"]

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        if self._pending is not None:
            self._apply()
            self._pending = None
