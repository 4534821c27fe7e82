"""Keras callbacks of xmc_tf: SET rewiring of uniformly sparse layers, and
held-out P@k for heads whose top-k needs a decoder (MACH).

SET source: Mocanu et al., "Scalable training of artificial neural networks with
adaptive sparse connectivity inspired by network science" (SET, Nature
Communications 2018), as applied to the last layer by Schultheis & Babbar,
"Towards Memory-Efficient Training for Extremely Large Output Spaces",
Sec. 2 (prune the fraction alpha of smallest-magnitude weights, regrow at
random) and Sec. 4.1 (every 1000 steps, 10 %).
"""

from __future__ import annotations

import keras
import numpy as np

from xmc_tf.layers.uniform_sparse import UniformSparseDense
from xmc_tf.predict import evaluate_model

# Optimizer slot lists that hold one variable per trainable variable, for the
# optimizers whose state SetRewiring knows how to reset.
_SLOTS = {
    keras.optimizers.Adam: ("_momentums", "_velocities", "_velocity_hats"),
    keras.optimizers.AdamW: ("_momentums", "_velocities", "_velocity_hats"),
    keras.optimizers.SGD: ("momentums",),
}


def _slot_names(optimizer):
    """Names of the optimizer's per-variable state lists.

    Raises:
      ValueError: an optimizer whose state layout SetRewiring does not know.
    """
    names = _SLOTS.get(type(optimizer))
    if names is None:
        raise ValueError(
            f"SetRewiring supports {sorted(c.__name__ for c in _SLOTS)}; got "
            f"{type(optimizer).__name__}: its per-weight state could not be "
            "reset for rewired connections.")
    return names


def _optimizer_slots(optimizer, variable):
    """The optimizer state variables of `variable` (same shape as it).

    Raises:
      ValueError: as :func:`_slot_names`.
    """
    names = _slot_names(optimizer)
    if not optimizer.built:
        return []
    index = optimizer._get_variable_index(variable)  # pylint: disable=protected-access
    slots = []
    for name in names:
        values = getattr(optimizer, name, None)
        if values:  # absent or empty (e.g. SGD without momentum, no amsgrad)
            slots.append(values[index])
    return slots


def rewire(indices: np.ndarray, weights: np.ndarray, fraction: float,
           num_features: int, rng: np.random.Generator):
    """One SET step on the connections of every label (in NumPy).

    Per label, the ``round(fraction * s)`` connections with the smallest
    ``|weight|`` are removed and as many are regrown at sources drawn
    uniformly from those the label was not connected to before this step (or,
    when too few such sources exist, from those it is not connected to after
    the removal).

    Args:
      indices: int32 ``[num_labels, s]`` current sources.
      weights: float ``[num_labels, s]`` current weights.
      fraction: alpha in [0, 1].
      num_features: number of possible sources e.
      rng: NumPy generator.

    Returns:
      ``(new_indices, positions)``: int32 ``[num_labels, s]`` and the int64
      ``[num_labels, n]`` column positions that were replaced (their weights
      and optimizer state must be reset by the caller).  Every row of
      ``new_indices`` holds s distinct values in ``[0, num_features)``.
    """
    num_labels, fan_in = indices.shape
    n = int(round(fraction * fan_in))
    if n == 0 or num_labels == 0:
        return indices.copy(), np.zeros((num_labels, 0), np.int64)
    positions = np.argpartition(np.abs(weights), n - 1, axis=1)[:, :n]
    positions.sort(axis=1)
    new = indices.copy()
    rows = np.arange(num_labels)[:, None]
    # Sources to avoid: all current ones when enough others exist, else only
    # the ones that stay.
    keep = np.ones(indices.shape, bool)
    keep[rows, positions] = False
    forbidden = indices if num_features - fan_in >= n else np.where(
        keep, indices, -1)
    row_keys = np.arange(num_labels, dtype=np.int64)[:, None] * num_features
    forbidden_keys = np.sort((row_keys + forbidden)[forbidden >= 0])
    draw = rng.integers(0, num_features, size=(num_labels, n))
    todo = np.ones(draw.shape, bool)
    while todo.any():
        draw[todo] = rng.integers(0, num_features, size=int(todo.sum()))
        keys = row_keys + draw
        clash = np.isin(keys, forbidden_keys, assume_unique=False)
        # Duplicates among the new draws of one row: keep the first.
        order = np.argsort(draw, axis=1, kind="stable")
        sorted_draw = np.take_along_axis(draw, order, axis=1)
        dup_sorted = np.zeros(draw.shape, bool)
        dup_sorted[:, 1:] = sorted_draw[:, 1:] == sorted_draw[:, :-1]
        dup = np.zeros(draw.shape, bool)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        todo = clash | dup
    new[rows, positions] = draw.astype(np.int32)
    return new, positions


class SetRewiring(keras.callbacks.Callback):
    """SET prune/regrow of every :class:`UniformSparseDense` layer.

    Every ``every_n_steps`` training batches, per label, the ``fraction`` of
    connections with the smallest ``|weight|`` are moved to sources the label
    is not connected to, uniformly at random; the moved weights restart at
    zero and so does their optimizer state (Adam/AdamW moments, SGD
    momentum).  After every rewire each label still has exactly ``s``
    distinct, in-range sources.

    The period counts optimizer steps (``optimizer.iterations``), so it is
    exact with ``steps_per_execution > 1`` too.  Statistics of the last
    rewire are added to every epoch's logs, zeros before the first one (so
    History, CSVLogger and a TensorBoard callback placed after this one see
    them):
    ``set_moved`` (connections moved per rewire), ``set_mean_abs_pruned``
    (mean |w| of the pruned connections) and ``set_rewires`` (count so far).

    Args:
      every_n_steps: rewire period in training batches (paper: 1000).
      fraction: alpha, fraction of each label's connections moved (0.1).
      layers: the layers to rewire; default all UniformSparseDense layers of
        the model.
      seed: seed of the regrowth draws.
      verbose: print a line per rewire.

    Raises:
      ValueError: bad arguments; at train begin, an optimizer other than
        Adam, AdamW or SGD, or a model without UniformSparseDense layer.

    >>> cb = SetRewiring(every_n_steps=1000, fraction=0.1)
    """

    def __init__(self, every_n_steps=1000, fraction=0.1, layers=None, seed=None,
                 verbose=0):
        super().__init__()
        if int(every_n_steps) < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        self.every_n_steps = int(every_n_steps)
        self.fraction = float(fraction)
        self.layers = layers
        self.verbose = verbose
        self._rng = np.random.default_rng(seed)
        self._periods_done = 0
        self.rewires = 0
        self.last_stats = {"set_moved": 0, "set_mean_abs_pruned": 0.0,
                           "set_rewires": 0}

    def _targets(self):
        if self.layers is not None:
            return list(self.layers)
        return [l for l in self.model._flatten_layers()  # pylint: disable=protected-access
                if isinstance(l, UniformSparseDense)]

    def on_train_begin(self, logs=None):
        if not self._targets():
            raise ValueError("SetRewiring: the model has no UniformSparseDense layer")
        _slot_names(self.model.optimizer)  # unsupported optimizer: ValueError
        self._periods_done = int(self.model.optimizer.iterations) // (
            self.every_n_steps)

    def on_train_batch_end(self, batch, logs=None):
        # Count optimizer steps, not callback calls: with
        # compile(steps_per_execution=k) Keras calls this once per k batches.
        periods = int(self.model.optimizer.iterations) // self.every_n_steps
        while self._periods_done < periods:
            self._periods_done += 1
            self.rewire_now()

    def rewire_now(self):
        """Rewires the target layers once and returns the statistics dict."""
        moved, pruned_abs = 0, 0.0
        for layer in self._targets():
            weights = keras.ops.convert_to_numpy(layer.kernel)
            indices = keras.ops.convert_to_numpy(layer.indices)
            new, positions = rewire(indices, weights, self.fraction,
                                    layer.num_features, self._rng)
            if positions.shape[1] == 0:
                continue
            rows = np.arange(indices.shape[0])[:, None]
            pruned_abs += float(np.abs(weights[rows, positions]).sum())
            moved += positions.size
            mask = np.ones(weights.shape, bool)
            mask[rows, positions] = False
            layer.indices.assign(new)
            layer.kernel.assign(weights * mask)
            for slot in _optimizer_slots(self.model.optimizer, layer.kernel):
                slot.assign(keras.ops.convert_to_numpy(slot) * mask)
        self.rewires += 1
        self.last_stats = {"set_moved": moved,
                           "set_mean_abs_pruned": pruned_abs / max(moved, 1),
                           "set_rewires": self.rewires}
        if self.verbose:
            print(f"\nSetRewiring: moved {moved} connections, mean |w| pruned "
                  f"{self.last_stats['set_mean_abs_pruned']:.4g}")
        return self.last_stats

    def on_epoch_end(self, epoch, logs=None):
        # Always present (zeros before the first rewire) so that loggers
        # which fix their columns after the first epoch (CSVLogger) see them.
        if logs is not None:
            logs.update(self.last_stats)


class TopKEvaluation(keras.callbacks.Callback):
    """Held-out P@k at the end of every epoch, written into the epoch logs.

    For models whose top-k is expensive to compute inside every training
    step: a :class:`~xmc_tf.layers.MachHead` is decoded by ``Xmc>MachTopK``,
    whose threshold algorithm degrades to an ``O(m R)`` scan per row while
    the meta-probabilities are still flat (early training), so an in-graph
    metric would slow every training batch.  This callback decodes only the
    held-out set, once per epoch, with :func:`xmc_tf.predict.evaluate_model`
    (any head).

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

    Raises:
      ValueError: empty ``ks`` or a ``k < 1``.

    Example:
      >>> cb = TopKEvaluation(val_data, ks=(1, 3))  # doctest: +SKIP
      >>> model.fit(train_ds, callbacks=[cb, keras.callbacks.EarlyStopping(
      ...     "val_precision_at_3", mode="max")])  # doctest: +SKIP
    """

    def __init__(self, dataset, ks=(1, 3), prefix="val_", batch_size=1024):
        super().__init__()
        self.ks = tuple(int(k) for k in ks)
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"ks must be non-empty ints >= 1, got {ks!r}")
        self.dataset = dataset
        self.prefix = prefix
        self.batch_size = int(batch_size)

    def evaluate(self) -> dict:
        """``{log key: P@k fraction}`` of the current model on the data."""
        result = evaluate_model(self.model, self.dataset, ks=self.ks,
                                batch_size=self.batch_size)
        return {f"{self.prefix}precision_at_{k}": result[f"P@{k}"] / 100.0
                for k in self.ks}

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update(self.evaluate())
