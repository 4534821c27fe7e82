"""Keras' ``EarlyStopping`` and ``ReduceLROnPlateau`` with state that
survives a resume (``get_state``/``set_state``, checkpointed by
:mod:`xmc_tf.job.checkpoint`), and best weights kept on disk.

The learning rate that ``ReduceLROnPlateau`` changes is an optimizer
variable, checkpointed with the optimizer; what these classes add is their
counters and best values.  ``xmc-tf train`` places both after the head's
callbacks (which write the monitored logs) and before the checkpointer.
"""

from __future__ import annotations

import os
import re
import zipfile

import keras
import numpy as np
from absl import logging

from xmc_tf.callbacks._steps import print_line
from xmc_tf.errors import CheckpointError
from xmc_tf.variable_io import put_npy, read_variable
from xmc_tf.files import atomic_path, discard_hint

__all__ = ["EarlyStopping", "ReduceLROnPlateau", "BEST_WEIGHTS_PATTERN"]

#: Names of the best-weights files :class:`EarlyStopping` writes into its
#: ``best_weights_dir`` (``best-EPOCH.npz``; for ``xmc-tf train`` the backup
#: directory, whose other files :func:`xmc_tf.job.checkpoint.load` checks).
BEST_WEIGHTS_PATTERN = re.compile(r"best-(\d{6})\.npz$")


class _RestoredState:
    """Mixin for a Keras callback whose ``on_train_begin`` resets its state:
    :meth:`set_state` applies a restored state at once and keeps it, and
    :meth:`_reapply_state` (called after Keras' reset) applies it again.
    Subclasses define ``_apply(state)``."""

    _pending = None

    def set_state(self, state: dict) -> None:
        """Applies ``state`` (a :meth:`get_state` result) now and again
        after Keras' ``on_train_begin`` reset; call before ``fit``."""
        self._pending = dict(state)
        self._apply(self._pending)

    def _reapply_state(self) -> bool:
        """Applies the state given to :meth:`set_state` once more (after
        Keras' reset) and forgets it; False when there was none."""
        if self._pending is None:
            return False
        self._apply(self._pending)
        self._pending = None
        return True


class EarlyStopping(_RestoredState, keras.callbacks.EarlyStopping):
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
      *args: as for ``keras.callbacks.EarlyStopping``.
      **kwargs: as for ``keras.callbacks.EarlyStopping``.

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
        """Patience counter, best value and epoch, stopped epoch, and the
        best weights (arrays, or the name of their file) for a resume."""
        best_weights = self.best_weights
        return {"wait": int(self.wait), "stopped_epoch": int(self.stopped_epoch),
                "best": None if self.best is None else float(self.best),
                "best_epoch": int(self.best_epoch),
                "best_weights": None if best_weights is None else
                [np.asarray(w) for w in best_weights],
                "best_weights_file": self.best_weights_file}

    def _apply(self, s):
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
        if not self._reapply_state():
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
                    put_npy(zf, f"{i:06d}", w)
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
                        read_variable(f, v)
        except (OSError, KeyError, ValueError, zipfile.BadZipFile) as e:
            raise CheckpointError(
                f"the best weights {path} do not fit the model ("
                f"{type(e).__name__}: {' '.join(str(e).split())}); "
                f"{discard_hint(self.best_weights_dir)}") from e


class ReduceLROnPlateau(_RestoredState, keras.callbacks.ReduceLROnPlateau):
    """``keras.callbacks.ReduceLROnPlateau`` whose state survives a resume.

    ``get_state()`` returns the patience and cooldown counters and the best
    value (the learning rate itself is an optimizer variable, checkpointed
    with the optimizer); ``set_state`` re-applies them after Keras'
    ``on_train_begin`` reset.  Arguments as for Keras' class; with
    ``verbose=1`` a reduction prints one line (no blank line below a
    one-line-per-epoch log; the epoch's logged ``learning_rate`` is the rate
    it trained at, as in Keras).

    >>> cb = ReduceLROnPlateau(monitor="val_loss")
    >>> cb.set_state(cb.get_state())
    """

    def get_state(self) -> dict:
        """Patience and cooldown counters and best value, for a resume."""
        return {"wait": int(self.wait),
                "cooldown_counter": int(self.cooldown_counter),
                "best": None if self.best is None else float(self.best)}

    def _apply(self, s):
        self.wait, self.cooldown_counter = s["wait"], s["cooldown_counter"]
        self.best = s["best"]

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._reapply_state()

    def on_epoch_end(self, epoch, logs=None):
        # Keras prints its reduction after a new line, a blank line below
        # one-line-per-epoch logs (verbose=2): the line is printed here.
        optimizer = self.model.optimizer
        if hasattr(optimizer, "optimizers") or not self.verbose:
            return super().on_epoch_end(epoch, logs)
        verbose, self.verbose = self.verbose, 0
        before = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        try:
            super().on_epoch_end(epoch, logs)
        finally:
            self.verbose = verbose
        after = float(keras.ops.convert_to_numpy(optimizer.learning_rate))
        if after < before:
            line = (f"Epoch {epoch + 1}: ReduceLROnPlateau reducing "
                    f"learning rate to {after:.4g} (this epoch's logged "
                    f"learning_rate, {before:.4g}, is the rate it trained at)")
            if keras.utils.is_interactive_logging_enabled():
                print_line(self, line)
            else:  # where Keras' own messages go then
                logging.info(line)
