"""What the step-scheduled callbacks share: the optimizer step count they
read and how they print their one-line messages."""

from __future__ import annotations

import keras

__all__ = ["optimizer_step", "print_line"]


def optimizer_step(model) -> int:
    """``model.optimizer.iterations`` as a Python int.

    Also under a ``tf.distribute`` strategy, where it is a mirrored variable
    that ``int()`` does not convert.  Counting optimizer steps (not callback
    calls) keeps a period exact with ``compile(steps_per_execution=k)``,
    where Keras calls ``on_train_batch_end`` once per ``k`` batches.

    Args:
      model: a compiled ``keras.Model`` (its optimizer is built).

    Returns:
      The number of optimizer steps taken so far.
    """
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


def print_line(callback, text: str) -> None:
    """Prints a callback's one-line message (``verbose``) on a line of its
    own: after a new line under ``fit(verbose=1)``'s progress bar, whose
    line is open while the epoch runs, and without one otherwise (a blank
    line below one-line-per-epoch logs, ``verbose=2``).

    Args:
      callback: the ``keras.callbacks.Callback`` (its ``params``, set by
        ``fit``; absent outside a ``fit``).
      text: the message, without a trailing new line.
    """
    params = getattr(callback, "params", None) or {}
    print(("\n" if params.get("verbose") == 1 else "") + text, flush=True)
