"""Keras' epoch line, without the statistics of an event that did not
happen in that epoch."""

from __future__ import annotations

import keras

__all__ = ["EVENT_KEYS", "EpochLine"]

#: ``{counter key: prefix of its keys}`` for the callbacks of
#: :mod:`xmc_tf.callbacks` that log an event's statistics every epoch:
#: ``SetRewiring`` (``set_rewires``, ``set_moved``, ...), ``RefreshIndex``
#: (``index_refreshes``, ``index_refresh_seconds``) and ``Rehash``
#: (``lsh_rehashes``, ``lsh_rows_rehashed``, ...).  Each counter is the
#: number of events so far.
EVENT_KEYS = {"set_rewires": "set_", "index_refreshes": "index_",
              "lsh_rehashes": "lsh_"}


class EpochLine(keras.callbacks.ProgbarLogger):
    """Keras' progress bar and epoch line (``keras.callbacks.ProgbarLogger``)
    that leaves out an event's keys in an epoch where the event did not
    happen.

    ``SetRewiring``, ``RefreshIndex`` and ``Rehash`` put their statistics
    in every epoch's logs, so that ``History`` and ``CSVLogger`` get the
    same columns in every epoch; on the printed line, the previous rewire's
    ``set_moved: 12800`` in an epoch without a rewire reads as a new one.
    This callback prints, for each ``counter: prefix`` of ``events``, the
    keys starting with ``prefix`` only in an epoch where ``counter`` grew
    (in the first epoch of a ``fit``: where it is above 0).  The logs
    themselves are not changed: the callbacks after it, ``History`` and
    ``CSVLogger`` see every key.

    Pass it in ``fit``'s callbacks; Keras then uses it instead of its own
    progress bar (``verbose`` as for ``fit``: 0 silent, 1 a bar, 2 one line
    per epoch).  List it after the callbacks whose keys it filters.

    Args:
      events: ``{counter key: key prefix}`` (default :data:`EVENT_KEYS`).

    Raises:
      TypeError: ``events`` is not a dict of strings to strings.

    Example:
      >>> line = EpochLine()
      >>> line.shown({"loss": 0.5, "set_rewires": 1, "set_moved": 8})
      {'loss': 0.5, 'set_rewires': 1, 'set_moved': 8}
      >>> line.shown({"loss": 0.4, "set_rewires": 1, "set_moved": 8})
      {'loss': 0.4}
    """

    def __init__(self, events: dict | None = None):
        super().__init__()
        events = dict(EVENT_KEYS if events is None else events)
        if not all(isinstance(k, str) and isinstance(v, str)
                   for k, v in events.items()):
            raise TypeError(f"EpochLine: events must map counter keys to key "
                            f"prefixes (strings), got {events!r}")
        self.events = events
        self._counts: dict = {}

    def on_train_begin(self, logs=None):
        super().on_train_begin(logs)
        self._counts = {}

    def shown(self, logs: dict) -> dict:
        """The part of an epoch's ``logs`` that its line shows (a new dict),
        against the counters of the previous call, which it replaces."""
        hidden = []
        for counter, prefix in self.events.items():
            if counter not in logs:
                continue
            count = float(logs[counter])
            if count <= self._counts.get(counter, 0.0):
                hidden.append(prefix)
            self._counts[counter] = count
        if not hidden:
            return dict(logs)
        return {k: v for k, v in logs.items()
                if not any(k.startswith(p) for p in hidden)}

    def on_epoch_end(self, epoch, logs=None):
        super().on_epoch_end(epoch, self.shown(dict(logs or {})))
