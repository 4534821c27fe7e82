"""The optimizer step count that step-scheduled callbacks read."""

from __future__ import annotations

import keras

__all__ = ["optimizer_step"]


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
