"""Held-out P@k once per epoch, for heads whose top-k needs a decoder:
:class:`TopKEvaluation`."""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf import decoding
from xmc_tf.metrics.evaluator import evaluate_top_k, score_batch_size

__all__ = ["TopKEvaluation"]


class TopKEvaluation(keras.callbacks.Callback):
    """Held-out P@k at the end of every epoch, written into the epoch logs.

    For models whose top-k is expensive to compute inside every training
    step: a :class:`~xmc_tf.layers.MachHead` is decoded by ``Xmc>MachTopK``,
    whose threshold algorithm degrades to an ``O(m R)`` scan per row while
    the meta-probabilities are still flat (early training), so an in-graph
    metric would slow every training batch.  This callback decodes only the
    held-out set, once per epoch, with the ``decoder`` it is given
    (:func:`xmc_tf.metrics.evaluator.evaluate_top_k`); the decoder is built for the
    callback's model once (compiled with ``tf.function`` unless it is
    already), and reads the model's current weights at every epoch.

    Logs ``{prefix}precision_at_{k}`` for each ``k`` as a **fraction** in
    [0, 1] (the names and scale of :class:`xmc_tf.metrics.PrecisionAtK`), so
    ``ReduceLROnPlateau``, ``EarlyStopping`` and ``CSVLogger`` placed
    *after* it in the callback list can monitor them.

    Args:
      dataset: held-out :class:`xmc_tf.data.XCDataset` (features already
        normalised as the model expects).
      ks: cut-offs, ints >= 1.
      prefix: prefix of the log keys.
      batch_size: instances per prediction batch.
      decoder: ``(model, k) -> top_k`` where ``top_k`` maps a feature batch
        to ``(ids int32 [b, k], scores float32 [b, k])``, best first;
        default :func:`xmc_tf.decoding.top_k_function` (by the type of the
        model's scoring layer: MACH's exact decoder, else the top ``k``
        scores).

    Raises:
      ValueError: empty ``ks``, a ``k < 1``, or a ``decoder`` that is not
        callable.

    Example:
      >>> import keras, xmc_tf
      >>> from xmc_tf.data import make_synthetic, make_tf_dataset
      >>> train = make_synthetic(256, 100, 50, seed=0)
      >>> val_data = make_synthetic(64, 100, 50, seed=1)
      >>> inputs = keras.Input((100,), sparse=True)
      >>> model = keras.Model(inputs, keras.layers.Dense(50)(inputs))
      >>> model.compile("adam", xmc_tf.losses.SquaredHinge(),
      ...               jit_compile=False)
      >>> cb = TopKEvaluation(val_data, ks=(1, 3))
      >>> history = model.fit(make_tf_dataset(train, 64), epochs=2, verbose=0,
      ...     callbacks=[cb, keras.callbacks.EarlyStopping(
      ...         "val_precision_at_3", mode="max")])
      >>> sorted(k for k in history.history if k.startswith("val_"))
      ['val_precision_at_1', 'val_precision_at_3']
    """

    def __init__(self, dataset, ks=(1, 3), prefix="val_", batch_size=1024, *,
                 decoder=None):
        super().__init__()
        self.ks = tuple(int(k) for k in ks)
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks must be non-empty ints >= 1, got {ks!r}")
        if decoder is None:
            decoder = decoding.top_k_function
        if not callable(decoder):
            raise ValueError("decoder must be a function (model, k) -> top_k, "
                             f"got {type(decoder).__name__}")
        self.dataset = dataset
        self.prefix = prefix
        self.batch_size = int(batch_size)
        self.decoder = decoder
        self._top_k = None
        self._top_k_model = None

    def get_config(self) -> dict:
        """Constructor arguments other than the data set and the decoder."""
        return {"ks": list(self.ks), "prefix": self.prefix,
                "batch_size": self.batch_size}

    def _decoder_for_model(self):
        """The compiled top-``max(ks)`` decoder of the current model, built
        once per model (it reads the weights when called): the decoder's
        own ``tf.function`` if it returns one, else the function compiled
        with ``reduce_retracing`` (traced at most twice in a run: the first
        batch's shape, then an unknown batch size)."""
        if self._top_k is None or self._top_k_model is not self.model:
            top_k = self.decoder(self.model, max(self.ks))
            if not hasattr(top_k, "get_concrete_function"):  # not compiled
                top_k = tf.function(top_k, reduce_retracing=True)
            self._top_k, self._top_k_model = top_k, self.model
        return self._top_k

    def evaluate(self) -> dict:
        """``{log key: P@k fraction}`` of the current model on the data."""
        result = evaluate_top_k(self._decoder_for_model(), self.dataset,
                                ks=self.ks, batch_size=score_batch_size(
                                    self.batch_size, self.model))
        return {f"{self.prefix}precision_at_{k}": result[f"P@{k}"] / 100.0
                for k in self.ks}

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.evaluate())
