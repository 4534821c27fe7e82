"""Exact resume of ``xmc-tf train``: the whole training state in one file.

A run killed at any point resumes from ``WORKDIR/backup/checkpoint.npz``
and ends with the weights, connectivity and metrics an uninterrupted run
would have produced (on a deterministic device: see ``tests/test_resume.py``
for what is pinned there).  The file is written at the end of every epoch
and once more when training ends, to a temporary sibling renamed into place
(:func:`xmc_tf.files.atomic_path`): a kill during the write leaves the
previous checkpoint intact.

What it holds:

* every variable of the model (``model.variables``: weights, the int32
  connectivity of uniform-sparse layers, the Keras seed-generator state of
  the dropout layers) and of the optimizer (step count, learning rate --
  also what ``ReduceLROnPlateau`` changed --, moments);
* the state of every object with ``get_state()``/``set_state(state)`` that
  the trainer registers (:class:`Checkpointer`'s ``stateful``): callbacks
  such as :class:`xmc_tf.callbacks.SetRewiring` (step counter, RNG),
  :class:`xmc_tf.callbacks.EarlyStopping` and
  :class:`xmc_tf.callbacks.ReduceLROnPlateau` (counters,
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
state must re-apply a restored one (as those two Keras subclasses do).
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

from xmc_tf.callbacks.schedules import BEST_WEIGHTS_PATTERN
from xmc_tf.errors import CheckpointError
from xmc_tf.variable_io import CHUNK_BYTES, put_npy, read_variable
from xmc_tf.files import atomic_path, discard_hint, write_bytes_atomic

__all__ = ["Checkpoint", "Checkpointer", "stateful_objects", "restore",
           "load", "write_history_csv", "CHECKPOINT_FILE", "FORMAT"]

#: File name inside the backup directory.
CHECKPOINT_FILE = "checkpoint.npz"
#: Version of the file layout (``meta["format"]``).
FORMAT = 1


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
        most ``chunk_bytes`` bytes of rows (:func:`xmc_tf.variable_io.read_variable`), so that
        restoring a ``[D, d]`` embedding or optimizer slot never holds a
        second whole copy of it in memory.

        Raises:
          KeyError: no array ``name``.
          ValueError: its shape or dtype differs from the variable's.
        """
        with self._arrays.zip.open(f"{name}.npy") as f:
            read_variable(f, variable, chunk_bytes)

    def state(self, key: str):
        """The decoded ``get_state()`` of object ``key`` (KeyError if none)."""
        return _decode(self.meta["objects"][key], self._arrays)

    @staticmethod
    def write(path: str, meta: dict, model_variables, optimizer_variables,
              objects: dict) -> None:
        """Writes a checkpoint atomically (one array in memory at a time;
        large variables in blocks of rows, see :func:`xmc_tf.variable_io.write_variable`).

        Args:
          path: destination ``.npz``.
          meta: the bookkeeping part of ``meta`` (JSON-serialisable).
          model_variables, optimizer_variables: Keras variables, saved in
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
                        put_npy(zf, f"{group}/{i:06d}", v)
                for name, value in arrays.items():
                    put_npy(zf, name, value)
                # Last, so a file that has it was written to the end.
                put_npy(zf, "meta", np.frombuffer(meta_bytes, np.uint8))

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
