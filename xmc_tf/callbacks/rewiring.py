"""SET rewiring of uniformly sparse layers (:func:`rewire`,
:class:`SetRewiring`).

Source: Mocanu et al., "Scalable training of artificial neural networks with
adaptive sparse connectivity inspired by network science" (SET, Nature
Communications 2018), as applied to the last layer by Schultheis & Babbar,
"Towards Memory-Efficient Training for Extremely Large Output Spaces",
Sec. 2 (prune the fraction alpha of smallest-magnitude weights, regrow at
random) and Sec. 4.1 (every 1000 steps, 10 %).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.callbacks._steps import optimizer_step
from xmc_tf.layers.uniform_sparse import UniformSparseDense
from xmc_tf.ops.uniform_sparse import set_rewire, set_rewire_supported
from xmc_tf.optimizers.slots import slot_names, slot_variables

__all__ = ["rewire", "SetRewiring"]


def _slot_names(optimizer):
    """Names of the optimizer's per-variable state lists.

    Raises:
      ValueError: an optimizer whose state layout SetRewiring does not know
        (see :func:`xmc_tf.optimizers.slot_names`).
    """
    try:
        return slot_names(optimizer)
    except ValueError as e:
        raise ValueError(f"SetRewiring: {e}: its per-weight state could not "
                         "be reset for rewired connections.") from None


def _optimizer_slots(optimizer, variable):
    """The optimizer state variables of `variable` (same shape as it).

    Raises:
      ValueError: as :func:`_slot_names`.
    """
    _slot_names(optimizer)
    return slot_variables(optimizer, variable)


def _dtype_name(x) -> str:
    """The dtype name of an array, tensor or Keras variable."""
    return getattr(x.dtype, "name", str(x.dtype))


def _rewire_by_op(indices, weights, fraction, num_features, rng, use_op):
    """:func:`rewire` through ``Xmc>SetRewire``: ``(new indices as an int32
    tensor, positions as a NumPy array)``, or None where ``use_op`` (None:
    decide as :func:`rewire` does) does not pick the op or nothing moves."""
    num_labels, fan_in = (int(d) for d in indices.shape)
    n = int(round(fraction * fan_in))
    if use_op is None:
        use_op = (_dtype_name(weights) == "float32" and fan_in <= num_features
                  and set_rewire_supported())
    if not use_op or n == 0 or num_labels == 0:
        return None
    seed = rng.integers(0, np.iinfo(np.int64).max, size=2, dtype=np.int64)
    new, positions = set_rewire(indices, weights, n, num_features, seed)
    return new, positions.numpy()


def rewire(indices: np.ndarray, weights: np.ndarray, fraction: float,
           num_features: int, rng: np.random.Generator, use_op=None):
    """One SET step on the connections of every label.

    Per label, the ``round(fraction * s)`` connections with the smallest
    ``|weight|`` are removed and as many are regrown at sources drawn
    uniformly from those the label was not connected to before this step (or,
    when too few such sources exist, from those it is not connected to after
    the removal).

    Args:
      indices: int32 ``[num_labels, s]`` current sources: a NumPy array, or
        a tensor or variable (the op reads it in place; NumPy copies it).
      weights: float ``[num_labels, s]`` current weights (the same kinds).
      fraction: alpha in [0, 1].
      num_features: number of possible sources e.
      rng: NumPy generator.
      use_op: run the op ``Xmc>SetRewire``
        (:func:`xmc_tf.ops.uniform_sparse.set_rewire`, seeded with two
        draws of ``rng``; one multi-threaded pass, 10-100x faster than
        NumPy at 10^5-10^6 labels) rather than NumPy; None: when the op
        library has it and ``weights`` are float32 (with ``fan_in <=
        num_features``).  The two give different draws for one ``rng``
        state, each deterministic in it.

    Returns:
      ``(new_indices, positions)``: int32 ``[num_labels, s]`` and the int64
      ``[num_labels, n]`` column positions that were replaced (their weights
      and optimizer state must be reset by the caller).  Every row of
      ``new_indices`` holds s distinct values in ``[0, num_features)``.
    """
    by_op = _rewire_by_op(indices, weights, fraction, num_features, rng,
                          use_op)
    if by_op is not None:
        return by_op[0].numpy(), by_op[1]
    num_labels, fan_in = (int(d) for d in indices.shape)
    n = int(round(fraction * fan_in))
    if not isinstance(indices, np.ndarray):
        indices = keras.ops.convert_to_numpy(indices)
    if n == 0 or num_labels == 0:
        return indices.copy(), np.zeros((num_labels, 0), np.int64)
    if not isinstance(weights, np.ndarray):
        weights = keras.ops.convert_to_numpy(weights)
    # A compact copy, so that the [num_labels, s] int64 argpartition result
    # is freed at once (2 GB at m = 2.8M, s = 96).
    positions = np.argpartition(np.abs(weights), n - 1, axis=1)[:, :n].copy()
    positions.sort(axis=1)
    new = indices.copy()
    rows = np.arange(num_labels)[:, None]
    # Sources to avoid: all current ones when enough others exist, else only
    # the ones that stay.
    keep = np.ones(indices.shape, bool)
    keep[rows, positions] = False
    row_keys = np.arange(num_labels, dtype=np.int64)[:, None] * num_features
    if num_features - fan_in >= n:
        # Keys row * e + source, sorted in place per row: rows occupy
        # disjoint key ranges, so the flat array is sorted (one int64
        # [num_labels, s] array, no further copies).
        forbidden_keys = indices.astype(np.int64)
        forbidden_keys += row_keys
        forbidden_keys.sort(axis=1)
        forbidden_keys = forbidden_keys.reshape(-1)
    else:
        forbidden = np.where(keep, indices, -1)
        forbidden_keys = np.sort((row_keys + forbidden)[forbidden >= 0])
    draw = rng.integers(0, num_features, size=(num_labels, n))
    todo = np.ones(draw.shape, bool)
    while todo.any():
        draw[todo] = rng.integers(0, num_features, size=int(todo.sum()))
        keys = row_keys + draw
        # Membership by binary search in the sorted keys (np.isin would
        # concatenate and argsort all of them: ~5x their memory).
        where = np.minimum(np.searchsorted(forbidden_keys, keys),
                           max(forbidden_keys.size - 1, 0))
        clash = (forbidden_keys[where] == keys if forbidden_keys.size else
                 np.zeros(keys.shape, bool))
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
    ``get_state``/``set_state`` carry the counters and the RNG across a
    resume (:mod:`xmc_tf.checkpoint`).

    Args:
      every_n_steps: rewire period in training batches (paper: 1000).
      fraction: alpha, fraction of each label's connections moved (0.1).
      layers: the layers to rewire; default all UniformSparseDense layers of
        the model.
      seed: seed of the regrowth draws.
      verbose: print a line per rewire.

    Raises:
      ValueError: bad arguments; at train begin, an optimizer other than
        Adam, AdamW or SGD or a subclass of them (e.g.
        :class:`xmc_tf.optimizers.LazyAdam`, ``LazySGD``), or a model without
        UniformSparseDense layer.

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
        self._periods_done = optimizer_step(self.model) // (
            self.every_n_steps)

    def on_train_batch_end(self, batch, logs=None):
        # Count optimizer steps, not callback calls: with
        # compile(steps_per_execution=k) Keras calls this once per k batches.
        periods = optimizer_step(self.model) // self.every_n_steps
        while self._periods_done < periods:
            self._periods_done += 1
            self.rewire_now()

    def rewire_now(self):
        """Rewires the target layers once and returns the statistics dict.

        Per layer: :func:`rewire` on the variables (the op reads them in
        place and its new indices tensor is assigned as it is), then the
        kernel and its optimizer slots, one after another, are zeroed at the
        moved positions (``tf.where`` with a ``[m, s]`` bool mask: one
        ``[m, s]`` copy at a time, 1.1 GB at m = 2.8M, s = 96).
        """
        moved, pruned_abs = 0, 0.0
        for layer in self._targets():
            by_op = _rewire_by_op(layer.indices, layer.kernel, self.fraction,
                                  layer.num_features, self._rng, None)
            new, positions = by_op or rewire(
                layer.indices, layer.kernel, self.fraction,
                layer.num_features, self._rng, use_op=False)
            del by_op
            if positions.shape[1] == 0:
                continue
            layer.indices.assign(new)  # a tensor: the variable takes it over
            del new
            # The moved positions as a [m, s] mask (NumPy fancy assignment:
            # TensorFlow's scatter ops run on one thread, ~20 ns per entry);
            # then one multi-threaded select per variable, one at a time.
            num_labels = positions.shape[0]
            fan_in = int(layer.indices.shape[1])
            mask = np.zeros((num_labels, fan_in), bool)
            np.put_along_axis(mask, positions, True, axis=1)
            moved += positions.size
            del positions
            mask = tf.constant(mask)
            kernel = tf.convert_to_tensor(layer.kernel)
            pruned_abs += float(tf.reduce_sum(tf.where(
                mask, tf.abs(kernel), tf.zeros((), kernel.dtype))))
            del kernel
            slots = _optimizer_slots(self.model.optimizer, layer.kernel)
            for variable in [layer.kernel] + list(slots):
                value = tf.convert_to_tensor(variable)
                variable.assign(tf.where(mask, tf.zeros((), value.dtype),
                                         value))
                del value
            del mask
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

    def get_state(self) -> dict:
        """The state an exact resume needs (JSON-serialisable): rewires done,
        periods counted, the last statistics and the regrowth RNG state
        (used by :mod:`xmc_tf.checkpoint`)."""
        return {"periods_done": int(self._periods_done),
                "rewires": int(self.rewires),
                "last_stats": dict(self.last_stats),
                "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`; call before ``fit`` (the optimizer's
        step count must be restored too: ``on_train_begin`` recounts the
        periods from it).

        Raises:
          ValueError: the RNG state is of another bit generator.
        """
        self._periods_done = int(state["periods_done"])
        self.rewires = int(state["rewires"])
        self.last_stats = dict(state["last_stats"])
        self._rng.bit_generator.state = state["rng"]
