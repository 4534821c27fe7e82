"""Keeping a negative sampler's index in step with the label weights:
:class:`RefreshIndex` (ANN index, ASTRA's schedule) and :class:`Rehash`
(LSH tables, LNS' schedule)."""

from __future__ import annotations

import time

import keras
import numpy as np

from xmc_tf.callbacks._steps import optimizer_step, print_line
from xmc_tf.callbacks.rewiring import SetRewiring

__all__ = ["RefreshIndex", "Rehash"]


def _log_candidate_yield(sampler, logs) -> None:
    """Epoch end: the sampler's mean candidates per row into ``logs``
    (``candidates_per_row``), with its once-only warning when short
    (:meth:`xmc_tf.samplers.NegativeSampler.check_candidate_yield`)."""
    check = getattr(sampler, "check_candidate_yield", None)
    result = check() if check is not None else None
    if result is not None and logs is not None:
        logs["candidates_per_row"] = result[0]


class RefreshIndex(keras.callbacks.Callback):
    """Rebuilds a negative sampler's index on a schedule (ASTRA's stale index).

    ASTRA (Mehta et al.), Algorithm 1 lines 10-13: from epoch ``tau_s``
    (``start_epoch``) on, rebuild the ANN index over the classifier weights
    every ``tau_r`` epochs (``every_n_epochs``; the paper uses 5 and 5,
    Appendix B.2), and sample hard negatives from the stale index in
    between.  Calls ``sampler.refresh()``:

    * at the beginning of every epoch ``e >= start_epoch`` with
      ``(e - start_epoch) % every_n_epochs == 0``, and at the first epoch
      ``>= start_epoch`` of a ``fit`` whenever the sampler has no index yet
      (so a resumed run rebuilds it before its first step: this is the "at
      train begin" refresh);
    * before ``start_epoch`` too when the sampler has no index and cannot
      sample without one (``samples_before_refresh`` False: an ANN or LSH
      sampler alone);
    * additionally every ``every_n_steps`` optimizer steps (counted with
      ``optimizer.iterations``, exact with ``steps_per_execution``), once
      ``start_epoch`` is reached;
    * after a SET rewire (``after_rewire``) and after
      :meth:`request_refresh`.

    Before ``start_epoch`` a :class:`~xmc_tf.samplers.MixtureSampler` draws
    only uniform negatives (Algorithm 1 lines 6-8).

    The defaults are the CLI's (``config.sampler.refresh_*``,
    :data:`xmc_tf.config.HEAD_DEFAULTS`): a first epoch of uniform
    negatives, then a refresh at the start of every epoch (``tau_s = 1``,
    ``tau_r = 1``; with a projected uniform-sparse head the first epoch also
    records the head inputs that the projection basis is fitted to, see
    :mod:`xmc_tf.samplers.ann`).

    Epoch logs get ``index_refresh_seconds`` (seconds spent refreshing
    during the epoch, 0 if none) and ``index_refreshes`` (refreshes so far),
    always present so CSVLogger/TensorBoard callbacks placed after this one
    see them, and ``candidates_per_row`` (the sampler's
    :meth:`~xmc_tf.samplers.NegativeSampler.candidate_yield`: mean
    candidates drawn per row in the epoch, or of a mixture's hard part;
    absent when nothing was counted).  At each epoch end the sampler's
    :meth:`~xmc_tf.samplers.NegativeSampler.check_candidate_yield` warns
    once if that fell below half of what was asked.

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
      every_n_epochs: tau_r, refresh period in epochs (None: no epoch
        schedule).
      every_n_steps: refresh period in optimizer steps (None: off).
      after_rewire: a :class:`SetRewiring` instance, or None.
      verbose: print a line per refresh.

    Raises:
      ValueError: ``start_epoch < 0``, a period < 1, or ``after_rewire`` is
        not a SetRewiring callback.

    ASTRA refreshes from epoch 5 every 5 epochs; here from epoch 0 every 2
    (needs faiss):

    >>> import keras, xmc_tf
    >>> from xmc_tf.data import make_synthetic, make_tf_dataset
    >>> from xmc_tf.models import SampledTrainer
    >>> from xmc_tf.losses import SampledSquaredHinge
    >>> from xmc_tf.samplers import AnnNegativeSampler
    >>> train = make_synthetic(256, 100, 50, seed=0)
    >>> inputs = keras.Input((100,), sparse=True)
    >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(50, name="output")(
    ...     keras.layers.Dense(16)(inputs)))
    >>> sampler = AnnNegativeSampler(50, 4)
    >>> trainer = SampledTrainer(model, sampler, SampledSquaredHinge())
    >>> trainer.compile(optimizer="adam", jit_compile=False)
    >>> cb = RefreshIndex(sampler, start_epoch=0, every_n_epochs=2)
    >>> history = trainer.fit(make_tf_dataset(train, 64), epochs=4, verbose=0,
    ...                       callbacks=[cb])
    >>> history.history["index_refreshes"]  # at the start of epochs 0 and 2
    [1, 1, 2, 2]
    """

    def __init__(self, sampler, start_epoch=1, every_n_epochs=1,
                 every_n_steps=None, after_rewire=None, verbose=0):
        super().__init__()
        if int(start_epoch) < 0:
            raise ValueError(f"start_epoch must be >= 0, got {start_epoch}")
        for name, value in [("every_n_epochs", every_n_epochs),
                            ("every_n_steps", every_n_steps)]:
            if value is not None and int(value) < 1:
                raise ValueError(f"{name} must be >= 1 or None, got {value}")
        if after_rewire is not None and not isinstance(after_rewire, SetRewiring):
            raise ValueError("after_rewire must be a SetRewiring callback, got "
                             f"{type(after_rewire).__name__}")
        self.sampler = sampler
        self.start_epoch = int(start_epoch)
        self.every_n_epochs = (None if every_n_epochs is None
                               else int(every_n_epochs))
        self.every_n_steps = (None if every_n_steps is None
                              else int(every_n_steps))
        self.after_rewire = after_rewire
        self.verbose = verbose
        self.refreshes = 0
        self.last_stats: dict = {}
        self._epoch = None
        self._epoch_seconds = 0.0
        self._periods_done = 0
        self._rewires_seen = 0
        self._requested = False

    def get_config(self) -> dict:
        """Constructor arguments; the sampler as ``{"class_name",
        "config"}`` (``after_rewire`` is a callback: not included)."""
        return {"sampler": {"class_name": type(self.sampler).__name__,
                            "config": self.sampler.get_config()},
                "start_epoch": self.start_epoch,
                "every_n_epochs": self.every_n_epochs,
                "every_n_steps": self.every_n_steps, "verbose": self.verbose}

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
            print_line(self, f"RefreshIndex: refresh {self.refreshes} took "
                       f"{seconds:.3g} s")
        return stats

    def on_train_begin(self, logs=None):
        self._epoch = None
        if self.every_n_steps is not None:
            self._periods_done = (optimizer_step(self.model)
                                  // self.every_n_steps)
        if self.after_rewire is not None:
            self._rewires_seen = self.after_rewire.rewires

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = int(epoch)
        self._epoch_seconds = 0.0
        if not self._started():
            if not self._has_index() and not getattr(
                    self.sampler, "samples_before_refresh", True):
                self.refresh_now()
            return
        scheduled = (self.every_n_epochs is not None and
                     (self._epoch - self.start_epoch) % self.every_n_epochs == 0)
        if scheduled or not self._has_index():
            self.refresh_now()

    def on_train_batch_end(self, batch, logs=None):
        due = self._requested
        if self.every_n_steps is not None:
            periods = optimizer_step(self.model) // self.every_n_steps
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
        _log_candidate_yield(self.sampler, logs)


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
    callbacks placed after this one see them, and ``candidates_per_row``
    (the sampler's :meth:`~xmc_tf.samplers.NegativeSampler.candidate_yield`
    over the epoch; absent when nothing was counted); the sampler's
    :meth:`~xmc_tf.samplers.NegativeSampler.check_candidate_yield` warns
    once when it fell below half of ``k``.  The defaults (period 50 steps,
    decay 0.95) are the CLI's (``config.sampler.rehash_every_steps``,
    ``rehash_decay``): LNS' initial period; the decay was not measured.  ``get_state``/``set_state``
    carry the schedule (and the threshold snapshot) across a resume
    (:mod:`xmc_tf.job.checkpoint`).

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
    >>> from xmc_tf.models import SampledTrainer
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

    def get_config(self) -> dict:
        """Constructor arguments; the sampler as ``{"class_name",
        "config"}``."""
        return {"sampler": {"class_name": type(self.sampler).__name__,
                            "config": self.sampler.get_config()},
                "schedule": self.schedule, "every_n_steps": self.every_n_steps,
                "frequency_decay": self.frequency_decay,
                "max_period": self.max_period, "threshold": self.threshold,
                "verbose": self.verbose}

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
        step = optimizer_step(self.model)
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
            print_line(self, f"Rehash: {count} labels re-hashed in "
                       f"{seconds:.3g} s")

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
        step = optimizer_step(self.model)
        if self._next_step is None or step < self._next_step:
            return
        self.rehash_now()
        if self.schedule == "period":
            self.period /= self.frequency_decay
            if self.max_period is not None:
                self.period = min(self.period, float(self.max_period))
        self._next_step = step + max(1, int(round(self.period)))

    def get_state(self) -> dict:
        """The schedule's state for an exact resume
        (:mod:`xmc_tf.job.checkpoint`): current period, next re-hash step, re-hashes so far and, for the
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
        _log_candidate_yield(self.sampler, logs)
