"""Optimizers with row-sparse ("lazy") updates, and optimizer-slot access.

* :class:`LazyAdam`, :class:`LazyAdamW`, :class:`LazySGD`: Keras optimizers
  that update only the rows present in a ``tf.IndexedSlices`` gradient
  (weights and optimizer state), and behave as Keras' ``Adam`` / ``AdamW`` /
  ``SGD`` for dense gradients.  Keras 3.15's own Adam/AdamW and momentum SGD
  densify such gradients and update every row (details in
  :mod:`xmc_tf.optimizers.lazy`).
* :class:`FusedUpdate`: the rule a ``UniformSparseDense(fused_update=...)``
  steps its own kernel with inside the backward pass (no ``[m, s]``
  gradient, no optimizer slots; bfloat16 with Kahan-compensated steps).
* :func:`slot_names`, :func:`slot_variables`: the per-variable optimizer
  state of Keras' Adam/AdamW/SGD and their subclasses (the only place in
  xmc_tf that knows the slot attribute names).
* :func:`deduplicate`, :func:`gather_rows`: row helpers for code that
  produces or consumes ``IndexedSlices`` (read rows with ``ResourceGather``:
  a dense read of a sparsely updated variable copies all of it).

Example:
  >>> import keras, xmc_tf
  >>> model = keras.Sequential([
  ...     keras.Input((50_000,), sparse=True),
  ...     xmc_tf.layers.SparseEmbeddingBag(64, activation="relu"),
  ...     keras.layers.Dense(10)])
  >>> model.compile(xmc_tf.optimizers.LazyAdam(1e-3), loss="mse",
  ...               jit_compile=False)
"""

from xmc_tf.optimizers.fused import FusedUpdate
from xmc_tf.optimizers.lazy import LazyAdam, LazyAdamW, LazySGD
from xmc_tf.optimizers.rows import deduplicate, gather_rows, tf_variable
from xmc_tf.optimizers.slots import slot_names, slot_variables

__all__ = ["FusedUpdate", "LazyAdam", "LazyAdamW", "LazySGD", "deduplicate",
           "gather_rows", "slot_names", "slot_variables", "tf_variable"]
