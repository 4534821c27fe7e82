"""Keras callbacks of xmc_tf.

* :mod:`xmc_tf.callbacks.rewiring` -- SET prune/regrow of uniform-sparse
  layers (:class:`SetRewiring`, :func:`rewire`).
* :mod:`xmc_tf.callbacks.index_refresh` -- a negative sampler's index kept
  in step with the label weights (:class:`RefreshIndex` for ANN indexes,
  :class:`Rehash` for LSH tables).
* :mod:`xmc_tf.callbacks.evaluation` -- held-out P@k once per epoch with a
  given top-k decoder (:class:`TopKEvaluation`).
* :mod:`xmc_tf.callbacks.progress` -- Keras' epoch line without the
  statistics of an event that did not happen in that epoch
  (:class:`EpochLine`).
* :mod:`xmc_tf.callbacks.schedules` -- Keras' :class:`EarlyStopping` and
  :class:`ReduceLROnPlateau` with state that survives a resume.

The callbacks with state have ``get_state()``/``set_state(state)``, which
:mod:`xmc_tf.job.checkpoint` saves and restores.  No module here imports the
heads or :mod:`xmc_tf.job.scoring`: the heads create these callbacks.
"""

from xmc_tf.callbacks.evaluation import TopKEvaluation
from xmc_tf.callbacks.index_refresh import RefreshIndex, Rehash
from xmc_tf.callbacks.progress import EpochLine
from xmc_tf.callbacks.rewiring import SetRewiring, rewire
from xmc_tf.callbacks.schedules import EarlyStopping, ReduceLROnPlateau

__all__ = ["EarlyStopping", "EpochLine", "ReduceLROnPlateau", "RefreshIndex",
           "Rehash", "SetRewiring", "TopKEvaluation", "rewire"]
