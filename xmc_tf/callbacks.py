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

import time

import keras
import numpy as np

from xmc_tf.layers.uniform_sparse import UniformSparseDense
from xmc_tf.optimizers.slots import slot_names, slot_variables
from xmc_tf.predict import evaluate_model


def _optimizer_step(model) -> int:
    """``model.optimizer.iterations`` as a Python int; also under a
    ``tf.distribute`` strategy, where it is a mirrored variable that
    ``int()`` does not convert."""
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


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
        self._periods_done = _optimizer_step(self.model) // (
            self.every_n_steps)

    def on_train_batch_end(self, batch, logs=None):
        # Count optimizer steps, not callback calls: with
        # compile(steps_per_execution=k) Keras calls this once per k batches.
        periods = _optimizer_step(self.model) // self.every_n_steps
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


class RefreshIndex(keras.callbacks.Callback):
    """Rebuilds a negative sampler's index on a schedule (ASTRA's stale index).

    ASTRA (Mehta et al.), Algorithm 1 lines 10-13: from epoch ``tau_s``
    (``start_epoch``) on, rebuild the ANN index over the classifier weights
    every ``tau_r`` epochs (``every_epochs``; the paper uses 5 and 5,
    Appendix B.2), and sample hard negatives from the stale index in
    between.  Calls ``sampler.refresh()``:

    * at the beginning of every epoch ``e >= start_epoch`` with
      ``(e - start_epoch) % every_epochs == 0``, and at the first epoch
      ``>= start_epoch`` of a ``fit`` whenever the sampler has no index yet
      (so a resumed run rebuilds it before its first step: this is the "at
      train begin" refresh);
    * additionally every ``every_steps`` optimizer steps (counted with
      ``optimizer.iterations``, exact with ``steps_per_execution``), once
      ``start_epoch`` is reached;
    * after a SET rewire (``after_rewire``) and after
      :meth:`request_refresh`.

    Before ``start_epoch`` a :class:`~xmc_tf.samplers.MixtureSampler` draws
    only uniform negatives (Algorithm 1 lines 6-8).

    Epoch logs get ``index_refresh_seconds`` (seconds spent refreshing
    during the epoch, 0 if none) and ``index_refreshes`` (refreshes so far),
    always present so CSVLogger/TensorBoard callbacks placed after this one
    see them.

    SET cooperation: :class:`SetRewiring` moves connections of a
    uniform-sparse head, which changes those labels' vectors; the index
    keeps the old vectors until its next refresh (a rewired label is
    re-indexed then).  Pass the SetRewiring callback as ``after_rewire`` to
    refresh right after each rewire (detected at the end of the batch in
    which it happened, or the next one when this callback comes first in the
    list), or call :meth:`request_refresh` from any other code.

    Args:
      sampler: a bound :class:`~xmc_tf.samplers.NegativeSampler` (``bind``
        done by the trainer).
      start_epoch: tau_s, first epoch (0-based) with an index.
      every_epochs: tau_r, refresh period in epochs (None: no epoch schedule).
      every_steps: refresh period in optimizer steps (None: off).
      after_rewire: a :class:`SetRewiring` instance, or None.
      verbose: print a line per refresh.

    Raises:
      ValueError: ``start_epoch < 0``, a period < 1, or ``after_rewire`` is
        not a SetRewiring callback.

    ASTRA refreshes from epoch 5 every 5 epochs; here from epoch 0 every 2
    (needs faiss):

    >>> import keras, xmc_tf
    >>> from xmc_tf.data import make_synthetic, make_tf_dataset
    >>> from xmc_tf.heads.sampled import SampledTrainer
    >>> from xmc_tf.losses import SampledSquaredHinge
    >>> from xmc_tf.samplers import AnnNegativeSampler
    >>> train = make_synthetic(256, 100, 50, seed=0)
    >>> inputs = keras.Input((100,), sparse=True)
    >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(50, name="output")(
    ...     keras.layers.Dense(16)(inputs)))
    >>> sampler = AnnNegativeSampler(50, 4)
    >>> trainer = SampledTrainer(model, sampler, SampledSquaredHinge())
    >>> trainer.compile(optimizer="adam", jit_compile=False)
    >>> cb = RefreshIndex(sampler, start_epoch=0, every_epochs=2)
    >>> history = trainer.fit(make_tf_dataset(train, 64), epochs=4, verbose=0,
    ...                       callbacks=[cb])
    >>> history.history["index_refreshes"]  # at the start of epochs 0 and 2
    [1, 1, 2, 2]
    """

    def __init__(self, sampler, start_epoch=0, every_epochs=1, every_steps=None,
                 after_rewire=None, verbose=0):
        super().__init__()
        if int(start_epoch) < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        for name, value in [("every_epochs", every_epochs),
                            ("every_steps", every_steps)]:
            if value is not None and int(value) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if after_rewire is not None and not isinstance(after_rewire, SetRewiring):
            raise ValueError("after_rewire must be a SetRewiring callback, got "
                             f"{type(after_rewire).__name__}")
        self.sampler = sampler
        self.start_epoch = int(start_epoch)
        self.every_epochs = None if every_epochs is None else int(every_epochs)
        self.every_steps = None if every_steps is None else int(every_steps)
        self.after_rewire = after_rewire
        self.verbose = verbose
        self.refreshes = 0
        self.last_stats: dict = {}
        self._epoch = None
        self._epoch_seconds = 0.0
        self._periods_done = 0
        self._rewires_seen = 0
        self._requested = False

    def request_refresh(self) -> None:
        """Asks for a refresh at the end of the current training batch."""
        self._requested = True

    def _has_index(self) -> bool:
        ready = getattr(self.sampler, "ready", None)
        return self.refreshes > 0 if ready is None else bool(ready)

    def _started(self) -> bool:
        return self._epoch is not None and self._epoch >= self.start_epoch

    def refresh_now(self) -> dict:
        """Refreshes the sampler once; returns its statistics."""
        start = time.perf_counter()
        stats = dict(self.sampler.refresh() or {})
        seconds = float(stats.get("index_refresh_seconds",
                                  time.perf_counter() - start))
        self.refreshes += 1
        self._epoch_seconds += seconds
        self.last_stats = stats
        if self.verbose:
            print(f"\nRefreshIndex: refresh {self.refreshes} took {seconds:.3g} s")
        return stats

    def on_train_begin(self, logs=None):
        self._epoch = None
        if self.every_steps is not None:
            self._periods_done = (_optimizer_step(self.model)
                                  // self.every_steps)
        if self.after_rewire is not None:
            self._rewires_seen = self.after_rewire.rewires

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = int(epoch)
        self._epoch_seconds = 0.0
        if not self._started():
            return
        scheduled = (self.every_epochs is not None and
                     (self._epoch - self.start_epoch) % self.every_epochs == 0)
        if scheduled or not self._has_index():
            self.refresh_now()

    def on_train_batch_end(self, batch, logs=None):
        due = self._requested
        if self.every_steps is not None:
            periods = _optimizer_step(self.model) // self.every_steps
            if periods > self._periods_done:
                self._periods_done = periods
                due = due or self._started()
        if self.after_rewire is not None and (
                self.after_rewire.rewires > self._rewires_seen):
            self._rewires_seen = self.after_rewire.rewires
            due = due or self._started()
        if due:
            self._requested = False
            self.refresh_now()

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update({"index_refresh_seconds": self._epoch_seconds,
                         "index_refreshes": self.refreshes})


class Rehash(keras.callbacks.Callback):
    """Re-hashes an LSH sampler's tables as the label weights move (LNS).

    LNS ("A Truly Constant-Time Distribution-Aware Negative Sampling",
    Sec. 2 "Update hash tables" and Sec. 3.3) re-inserts updated label
    vectors into the hash tables, "with an initial update period of 50
    iterations and then exponentially decaying the updating frequency (as we
    need less updates near convergence)".  Two schedules, counted in
    optimizer steps (``optimizer.iterations``, exact with
    ``steps_per_execution``):

    * ``schedule="period"``: a full re-hash (``sampler.refresh()``) after
      ``every_n_steps`` steps, then after each period the period is divided
      by ``frequency_decay`` (frequency multiplied by it; 1 keeps it
      constant), capped at ``max_period``.  The paper gives no decay rate.
    * ``schedule="threshold"``: every ``every_n_steps`` steps, only the
      labels whose vector changed by more than ``threshold`` (relative L2
      norm ``|w - w_0| / |w_0|`` against the vector last hashed; any change
      of a uniform-sparse label's connections counts) are re-hashed with
      ``sampler.rehash_rows`` (``2 K L`` hashes per row instead of ``K L m``
      for all).  Keeps a float32 copy of the label weights (``4 m d``
      bytes).

    The sampler's tables are built at train begin if it has none.  Epoch
    logs get ``lsh_rehash_seconds`` (seconds spent re-hashing during the
    epoch), ``lsh_rows_rehashed`` (labels re-hashed during the epoch),
    ``lsh_rehashes`` (re-hashes so far) and ``lsh_rehash_period`` (current
    period in steps), always present so that CSVLogger / TensorBoard
    callbacks placed after this one see them.  ``get_state``/``set_state``
    carry the schedule (and the threshold snapshot) across a resume
    (:mod:`xmc_tf.checkpoint`).

    Args:
      sampler: a bound :class:`xmc_tf.samplers.LshNegativeSampler` (or any
        sampler with ``refresh()``, ``ready``, and for the threshold
        schedule ``rehash_rows(rows)`` and ``label_rows()``).
      schedule: ``"period"`` or ``"threshold"``.
      every_n_steps: the (initial) period in optimizer steps (LNS: 50).
      frequency_decay: in (0, 1]; period schedule only.
      max_period: cap on the period in steps (None: no cap).
      threshold: relative change that triggers a label's re-hash (> 0);
        threshold schedule only.
      verbose: print a line per re-hash.

    Raises:
      ValueError: an unknown schedule or an argument out of range; at train
        begin, a threshold schedule with a sampler lacking ``rehash_rows``.

    The LNS schedule starts at 50 steps; here at 2 (4 steps an epoch):

    >>> import keras, xmc_tf
    >>> from xmc_tf.data import make_synthetic, make_tf_dataset
    >>> from xmc_tf.heads.sampled import SampledTrainer
    >>> from xmc_tf.losses import SampledSoftmax
    >>> from xmc_tf.samplers import LshNegativeSampler
    >>> train = make_synthetic(256, 100, 50, labels_per_instance=1, seed=0)
    >>> inputs = keras.Input((100,), sparse=True)
    >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(50, name="output")(
    ...     keras.layers.Dense(16)(inputs)))
    >>> sampler = LshNegativeSampler(50, 4, K=2, L=4)
    >>> trainer = SampledTrainer(model, sampler, SampledSoftmax())
    >>> trainer.compile(optimizer="adam", jit_compile=False)
    >>> cb = Rehash(sampler, schedule="period", every_n_steps=2,
    ...             frequency_decay=0.9)
    >>> history = trainer.fit(make_tf_dataset(train, 64), epochs=2, verbose=0,
    ...                       callbacks=[cb])
    >>> history.history["lsh_rehashes"][-1] >= 2  # the period grows
    True
    """

    def __init__(self, sampler, schedule="period", every_n_steps=50,
                 frequency_decay=0.95, max_period=None, threshold=0.1,
                 verbose=0):
        super().__init__()
        if schedule not in ("period", "threshold"):
            raise ValueError("schedule must be 'period' or 'threshold', got "
                             f"{schedule!r}")
        if int(every_n_steps) < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if not 0.0 < float(frequency_decay) <= 1.0:
            raise ValueError("frequency_decay must be in (0, 1], got "
                             f"{frequency_decay}")
        if max_period is not None and int(max_period) < int(every_n_steps):
            raise ValueError(f"max_period ({max_period}) must be >= "
                             f"every_n_steps ({every_n_steps})")
        if not float(threshold) > 0.0:
            raise ValueError(f"threshold must be > 0, got {threshold}")
        self.sampler = sampler
        self.schedule = schedule
        self.every_n_steps = int(every_n_steps)
        self.frequency_decay = float(frequency_decay)
        self.max_period = None if max_period is None else int(max_period)
        self.threshold = float(threshold)
        self.verbose = verbose
        self.period = float(self.every_n_steps)
        self.rehashes = 0
        self._next_step = None
        self._snapshot = None
        self._epoch_seconds = 0.0
        self._epoch_rows = 0

    def _ensure_tables(self):
        # The initial build is not counted as a re-hash.
        if not bool(getattr(self.sampler, "ready", False)):
            self.sampler.refresh()

    def on_train_begin(self, logs=None):
        if self.schedule == "threshold" and not (
                hasattr(self.sampler, "rehash_rows")
                and hasattr(self.sampler, "label_rows")):
            raise ValueError("Rehash(schedule='threshold') needs a sampler "
                             "with rehash_rows() and label_rows(), got "
                             f"{type(self.sampler).__name__}")
        self._ensure_tables()
        step = _optimizer_step(self.model)
        if self._next_step is None or self._next_step <= step:
            self._next_step = step + int(round(self.period))
        if self.schedule == "threshold" and self._snapshot is None:
            self._snapshot = self.sampler.label_rows()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_seconds = 0.0
        self._epoch_rows = 0

    def _timed(self, fn, rows):
        start = time.perf_counter()
        if rows is None:
            fn()
            count = int(self.sampler.num_labels)
        else:
            fn(rows)
            count = int(len(rows))
        seconds = time.perf_counter() - start
        self.rehashes += 1
        self._epoch_seconds += seconds
        self._epoch_rows += count
        if self.verbose:
            print(f"\nRehash: {count} labels re-hashed in {seconds:.3g} s")

    def changed_rows(self, current=None) -> np.ndarray:
        """Label ids whose vector moved by more than ``threshold`` since it
        was last hashed (threshold schedule); updates nothing.

        Args:
          current: ``sampler.label_rows()`` if already read.

        Returns:
          int32 ``[r]`` sorted label ids.
        """
        if current is None:
            current = self.sampler.label_rows()
        old = self._snapshot
        diff = np.linalg.norm(current["weights"] - old["weights"], axis=1)
        base = np.maximum(np.linalg.norm(old["weights"], axis=1), 1e-12)
        changed = diff > self.threshold * base
        if "indices" in current:
            changed |= np.any(current["indices"] != old["indices"], axis=1)
        return np.flatnonzero(changed).astype(np.int32)

    def rehash_now(self) -> int:
        """Re-hashes once per the schedule; returns the labels re-hashed."""
        if self.schedule == "period":
            self._timed(self.sampler.refresh, None)
            return int(self.sampler.num_labels)
        current = self.sampler.label_rows()
        rows = self.changed_rows(current)
        if len(rows):
            self._timed(self.sampler.rehash_rows, rows)
            for key, value in current.items():
                self._snapshot[key][rows] = value[rows]
        return int(len(rows))

    def on_train_batch_end(self, batch, logs=None):
        step = _optimizer_step(self.model)
        if self._next_step is None or step < self._next_step:
            return
        self.rehash_now()
        if self.schedule == "period":
            self.period /= self.frequency_decay
            if self.max_period is not None:
                self.period = min(self.period, float(self.max_period))
        self._next_step = step + max(1, int(round(self.period)))

    def get_state(self) -> dict:
        """The schedule's state for an exact resume (:mod:`xmc_tf.checkpoint`):
        current period, next re-hash step, re-hashes so far and, for the
        threshold schedule, the label weights last hashed (NumPy arrays).
        The sampler's own tables are in ``sampler.get_state()``."""
        state = {"period": float(self.period), "rehashes": int(self.rehashes),
                 "next_step": -1 if self._next_step is None
                 else int(self._next_step)}
        if self._snapshot is not None:
            state["snapshot"] = dict(self._snapshot)
        return state

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`; call before ``fit``."""
        self.period = float(state["period"])
        self.rehashes = int(state["rehashes"])
        step = int(state["next_step"])
        self._next_step = None if step < 0 else step
        snapshot = state.get("snapshot")
        self._snapshot = (None if snapshot is None else
                          {k: np.array(v) for k, v in snapshot.items()})

    def on_epoch_end(self, epoch, logs=None):
        if logs is not None:
            logs.update({"lsh_rehash_seconds": self._epoch_seconds,
                         "lsh_rows_rehashed": self._epoch_rows,
                         "lsh_rehashes": self.rehashes,
                         "lsh_rehash_period": float(self.period)})
