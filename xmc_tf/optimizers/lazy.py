"""Row-sparse ("lazy") Adam, AdamW and momentum SGD for Keras 3 on TensorFlow.

What Keras 3.15 (TensorFlow backend) does with a ``tf.IndexedSlices`` gradient
------------------------------------------------------------------------------
Read from ``keras/src/optimizers/base_optimizer.py``, ``adam.py``, ``sgd.py``
and ``keras/src/backend/tensorflow/optimizer.py`` and checked by tracing
``optimizer.apply`` in a ``tf.function`` (ops named in brackets):

* ``BaseOptimizer.apply`` hands the tape's gradients to ``update_step``
  unchanged: nothing densifies them up front.  ``TFOptimizer.assign``,
  ``assign_add`` and ``assign_sub`` turn an ``IndexedSlices`` *value* into
  ``scatter_update`` / ``scatter_add`` / ``scatter_sub``.
* ``Adam`` / ``AdamW`` (and Nadam, Adamax, Lion, Ftrl, momentum RMSprop):
  ``ops.subtract(gradient, m)`` with a sparse and a dense operand densifies
  the gradient (``UnsortedSegmentSum`` into a dense ``[N, ...]`` tensor);
  then every row of both moments and of the weights is updated.  The result
  is exactly dense Adam, at ``O(N d)`` time and a dense ``N x d`` temporary
  per step, whatever the number of rows the batch touched.
* ``SGD`` without momentum is truly row-sparse (``ResourceScatterSub``);
  ``SGD(momentum>0)`` densifies like Adam.
* ``clipnorm``: ``tf.clip_by_norm`` on the ``IndexedSlices`` (stays sparse)
  but the norm is that of the *values as given*: with duplicate indices it is
  not the gradient's norm (rows ``+3`` and ``-3`` at one index: gradient 0,
  norm used 4.24).  ``clipvalue``: clips the values before duplicates are
  summed.  ``global_clipnorm``: ``v * scale`` densifies the gradient.
* ``weight_decay`` (decoupled, in ``_apply_weight_decay``): a dense update of
  the whole variable every step.
* ``loss_scale_factor``: ``g / scale`` raises ``TypeError`` for
  ``IndexedSlices``.
* ``gradient_accumulation_steps``: ``g + accumulator`` densifies; the
  accumulators are dense.
* Any dense read of a variable after a sparse op copies the whole variable
  (TensorFlow's copy-on-read mode, see :mod:`xmc_tf.optimizers.rows`).

What this module adds
---------------------
:class:`LazyAdam`, :class:`LazyAdamW` and :class:`LazySGD` subclass
``keras.optimizers.Adam`` / ``SGD``: same constructor arguments, same slot
variables under the same attribute names (``_momentums``, ``_velocities``,
``_velocity_hats``; ``momentums``), so :func:`xmc_tf.optimizers.slot_variables`
and ``xmc_tf.callbacks.SetRewiring`` treat them like the Keras classes.  For a
dense gradient they run Keras' own ``update_step`` (identical results).  For an
``IndexedSlices`` gradient of a variable ``[N, ...]`` (any rank; the indices
address the first axis) they

1. sum the rows of duplicate indices (:func:`xmc_tf.optimizers.deduplicate`),
2. read the touched rows of the weights and slots with ``ResourceGather``,
3. apply the Keras formula to those rows only, and write them back with
   ``scatter_update`` / ``scatter_sub``.

Rows not in the gradient keep their weights *and* optimizer state.  Clipping
runs on the de-duplicated gradient (so ``clipnorm``, ``global_clipnorm`` and
``clipvalue`` give what they give for the equivalent dense gradient, and
stay sparse); decoupled weight decay decays only the rows in the gradient
(like TensorFlow Addons' ``DecoupledWeightDecayExtension`` for sparse
gradients); ``loss_scale_factor`` works.  ``gradient_accumulation_steps`` and
``use_ema`` run, but densely (Keras' dense accumulators / moving averages).

A variable may receive a dense gradient in one traced step and an
``IndexedSlices`` in another (the branch is chosen when the step is traced).
The same code serves input tables (:class:`xmc_tf.layers.SparseEmbeddingBag`,
``[num_features, units]``) and sampled output heads (``[num_labels, fan_in]``
kernels whose gradient covers the scored label rows).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import ops

from xmc_tf.ops.optimizers import (fused_adam_supported, resource_apply_adam,
                                   resource_sparse_apply_adam)
from xmc_tf.optimizers.rows import deduplicate, gather_rows, tf_variable

__all__ = ["LazyAdam", "LazyAdamW", "LazySGD"]


def _with_values(gradient, values):
    return tf.IndexedSlices(values, gradient.indices, gradient.dense_shape)


def _dense_shape(variable, dtype):
    # The static shape: tf.shape(variable) would add a dense read of it.
    return tf.constant(list(variable.shape), dtype)


def _positive(value) -> bool:
    return value is not None and value > 0


class _RowSparseMixin:
    """Sparse-aware clipping, weight decay and loss scaling (see module doc)."""

    def apply(self, grads, trainable_variables=None):
        """Applies gradients; ``IndexedSlices`` update only their rows.

        Same contract as ``keras.optimizers.Optimizer.apply``.  When
        ``loss_scale_factor`` is set, the gradients are unscaled here (Keras
        3.15 cannot divide an ``IndexedSlices``).
        """
        scale = self.loss_scale_factor
        grads = list(grads)
        if scale is None or not any(
                isinstance(g, tf.IndexedSlices) for g in grads):
            return super().apply(grads, trainable_variables)
        unscaled = []
        for g in grads:
            if isinstance(g, tf.IndexedSlices):
                g = _with_values(g, g.values / scale)
            elif g is not None:
                g = g / scale
            unscaled.append(g)
        self.loss_scale_factor = None
        try:
            return super().apply(unscaled, trainable_variables)
        finally:
            self.loss_scale_factor = scale

    def _clip_gradients(self, grads):
        clipping = (_positive(self.clipnorm) or _positive(self.global_clipnorm)
                    or _positive(self.clipvalue))
        if not clipping or not any(
                isinstance(g, tf.IndexedSlices) for g in grads):
            return super()._clip_gradients(grads)
        grads = [deduplicate(g) if isinstance(g, tf.IndexedSlices) else g
                 for g in grads]
        if _positive(self.clipnorm):
            # TFOptimizer._clip_by_norm is tf.clip_by_norm: sparse-aware.
            return [None if g is None else self._clip_by_norm(g)
                    for g in grads]
        if _positive(self.global_clipnorm):
            # Keras' clip_by_global_norm, with the values of the slices.
            values = [g.values if isinstance(g, tf.IndexedSlices) else g
                      for g in grads if g is not None]
            norm = ops.sqrt(ops.sum(ops.stack(
                [ops.sum(ops.square(v)) for v in values])))
            clip = self.global_clipnorm
            scale = clip * ops.minimum(1.0 / norm, 1.0 / clip)
            scale = scale + (norm - norm)  # NaN for a non-finite norm
            return [None if g is None else
                    _with_values(g, g.values * scale)
                    if isinstance(g, tf.IndexedSlices) else g * scale
                    for g in grads]
        v = self.clipvalue
        return [None if g is None else
                _with_values(g, ops.clip(g.values, -v, v))
                if isinstance(g, tf.IndexedSlices) else ops.clip(g, -v, v)
                for g in grads]

    def _apply_weight_decay(self, variables):
        # Done per variable in update_step, on the rows of the gradient.
        del variables

    def _decay(self, variable, learning_rate, indices=None):
        """Decoupled weight decay of ``variable`` (or of its rows ``indices``)."""
        if self.weight_decay is None or not self._use_weight_decay(variable):
            return
        lr = ops.cast(learning_rate, variable.dtype)
        wd = ops.cast(self.weight_decay, variable.dtype)
        if indices is None:
            self.assign_sub(variable, variable * wd * lr)
        else:
            rows = gather_rows(variable, indices)
            self._scatter(self.assign_sub, variable, indices, rows * wd * lr)

    @staticmethod
    def _sparse_rows(gradient, variable):
        """(unique indices, summed rows cast to the variable's dtype)."""
        gradient = deduplicate(gradient)
        return gradient.indices, ops.cast(gradient.values, variable.dtype)

    def _scatter(self, method, target, indices, values):
        method(target, tf.IndexedSlices(
            values, indices, _dense_shape(target, indices.dtype)))


@keras.saving.register_keras_serializable(package="xmc_tf")
class LazyAdam(_RowSparseMixin, keras.optimizers.Adam):
    """Adam that updates only the rows present in an ``IndexedSlices`` gradient.

    Dense gradients get exactly ``keras.optimizers.Adam``'s update.  For an
    ``IndexedSlices`` gradient ``g`` over the rows ``R`` (duplicates summed
    first) of a variable ``w [N, ...]``, with the global step
    ``t = iterations + 1``:

    .. code-block:: text

        m[R] += (g - m[R]) * (1 - beta_1)
        v[R] += (g**2 - v[R]) * (1 - beta_2)
        v_hat[R] = max(v_hat[R], v[R])                   (amsgrad only)
        w[R] -= lr * sqrt(1 - beta_2**t) / (1 - beta_1**t)
                * m[R] / (sqrt(v[R]) + epsilon)

    and nothing else changes.  Semantics compared with dense Adam: a row
    absent from the batch keeps its moments (dense Adam decays them by
    ``beta_1``/``beta_2`` and keeps moving the row along ``m``); the bias
    correction uses the global step, not the number of updates the row has
    had, so the first update of a row first seen late in training is about
    ``(1 - beta_1) / sqrt(1 - beta_2)`` (3.2 with the defaults) times the
    learning rate per unit of normalised gradient, where dense Adam's first
    step is 1 times it.  This is the update of TensorFlow Addons'
    ``LazyAdam`` (Kingma & Ba, "Adam", ICLR 2015, Algorithm 1, applied per
    row).  Cost per step: ``O(|R| d)`` instead of ``O(N d)``.

    On the CPU (float32/float64 variables, no ``amsgrad``) each update is
    one fused in-place pass: ops ``Xmc>ResourceSparseApplyAdam`` for the
    rows of an ``IndexedSlices`` and ``Xmc>ResourceApplyAdam`` for a dense
    gradient (:mod:`xmc_tf.ops.optimizers`), with the same operations in the
    same order, so the same results.  Elsewhere (GPU, distributed
    variables, ``fused=False``) the row update is the composite
    ``ResourceGather`` / element-wise / ``scatter`` one and the dense update
    Keras' own.

    Decoupled ``weight_decay`` decays only the rows in ``R`` (all rows for a
    dense gradient), before the Adam update as in Keras.  Clipping
    (``clipnorm``, ``global_clipnorm``, ``clipvalue``) applies to the
    de-duplicated gradient.  See :mod:`xmc_tf.optimizers.lazy` for what
    Keras' own Adam does with sparse gradients.

    Args:
      learning_rate, beta_1, beta_2, epsilon, amsgrad: as
        ``keras.optimizers.Adam``.
      weight_decay, clipnorm, clipvalue, global_clipnorm: as
        ``keras.optimizers.Adam``.
      use_ema, ema_momentum, ema_overwrite_frequency: as
        ``keras.optimizers.Adam`` (``use_ema`` works but is dense).
      loss_scale_factor, gradient_accumulation_steps, name: as
        ``keras.optimizers.Adam`` (``gradient_accumulation_steps`` works but
        is dense).
      fused: use the fused CPU ops (row and dense updates) where they apply
        (default True); False always runs the composite row update and
        Keras' own dense update.
      **kwargs: base optimizer keyword arguments.

    Attributes:
      _momentums: slot list, as Keras' Adam.
      _velocities: slot list, as Keras' Adam.
      _velocity_hats: slot list, as Keras' Adam.
      fused: the ``fused`` argument.

    Raises:
      ValueError: invalid hyperparameters (as Keras' Adam).
      tf.errors.InvalidArgumentError: at run time, a gradient index outside
        ``[0, N)``.

    Example:
      >>> import numpy as np
      >>> w = keras.Variable(np.ones((4, 2), np.float32))
      >>> opt = LazyAdam(learning_rate=0.1)
      >>> opt.apply([tf.IndexedSlices(tf.ones((1, 2)), [2], [4, 2])], [w])
      >>> np.round(w.numpy()[:, 0].astype(float), 3).tolist()  # row 2 only
      [1.0, 1.0, 0.9, 1.0]
    """

    def __init__(self, *args, fused=True, **kwargs):
        super().__init__(*args, **kwargs)
        self.fused = bool(fused)

    def get_config(self):
        """Keras' Adam config plus ``fused``."""
        config = super().get_config()
        config["fused"] = self.fused
        return config

    def _fused(self, *variables) -> bool:
        """Whether the fused ops can update these (CPU) variables."""
        if not self.fused:
            return False
        try:
            tf_vars = [tf_variable(x) for x in variables]
        except TypeError:
            return False
        return all(fused_adam_supported(x) for x in tf_vars)

    def _alpha(self, variable, learning_rate):
        """Bias-corrected step size, computed as keras.optimizers.Adam."""
        dtype = variable.dtype
        lr = ops.cast(learning_rate, dtype)
        local_step = ops.cast(self.iterations + 1, dtype)
        beta_1_power = ops.power(ops.cast(self.beta_1, dtype), local_step)
        beta_2_power = ops.power(ops.cast(self.beta_2, dtype), local_step)
        return lr * ops.sqrt(1 - beta_2_power) / (1 - beta_1_power)

    def update_step(self, gradient, variable, learning_rate):
        """One update of ``variable``; sparse rows only for ``IndexedSlices``."""
        index = self._get_variable_index(variable)
        m = self._momentums[index]
        v = self._velocities[index]
        if not isinstance(gradient, tf.IndexedSlices):
            self._decay(variable, learning_rate)
            if self.amsgrad or not self._fused(variable, m, v):
                return super().update_step(gradient, variable, learning_rate)
            # Keras' update in one pass (Xmc>ResourceApplyAdam).
            return resource_apply_adam(
                tf_variable(variable), tf_variable(m), tf_variable(v),
                self._alpha(variable, learning_rate), self.beta_1,
                self.beta_2, self.epsilon,
                ops.cast(gradient, variable.dtype))
        indices, grad = self._sparse_rows(gradient, variable)
        self._decay(variable, learning_rate, indices)
        alpha = self._alpha(variable, learning_rate)
        if not self.amsgrad and self._fused(variable, m, v):
            # One in-place pass over the rows (Xmc>ResourceSparseApplyAdam).
            resource_sparse_apply_adam(
                tf_variable(variable), tf_variable(m), tf_variable(v), alpha,
                self.beta_1, self.beta_2, self.epsilon, grad, indices)
            return

        m_rows = gather_rows(m, indices)
        m_rows = ops.add(m_rows, ops.multiply(ops.subtract(grad, m_rows),
                                              1 - self.beta_1))
        v_rows = gather_rows(v, indices)
        v_rows = ops.add(v_rows, ops.multiply(
            ops.subtract(ops.square(grad), v_rows), 1 - self.beta_2))
        self._scatter(self.assign, m, indices, m_rows)
        self._scatter(self.assign, v, indices, v_rows)
        if self.amsgrad:
            v_hat = self._velocity_hats[index]
            v_rows = ops.maximum(gather_rows(v_hat, indices), v_rows)
            self._scatter(self.assign, v_hat, indices, v_rows)
        self._scatter(self.assign_sub, variable, indices, ops.divide(
            ops.multiply(m_rows, alpha), ops.add(ops.sqrt(v_rows),
                                                 self.epsilon)))


@keras.saving.register_keras_serializable(package="xmc_tf")
class LazyAdamW(LazyAdam):
    """:class:`LazyAdam` with decoupled weight decay on by default.

    The counterpart of ``keras.optimizers.AdamW`` (Loshchilov & Hutter,
    "Decoupled Weight Decay Regularization", ICLR 2019, Algorithm 2): each
    step first ``w -= learning_rate * weight_decay * w``, then the Adam
    update.  Dense gradients: identical to Keras' AdamW.  ``IndexedSlices``
    gradients: only the rows in the gradient are decayed and updated (rows
    not in the batch are not decayed).

    Args:
      weight_decay: float, default 0.004 (Keras' AdamW default).
      **kwargs: the other arguments, as :class:`LazyAdam`.

    Raises:
      ValueError: ``weight_decay`` is None.

    >>> LazyAdamW(learning_rate=1e-3).weight_decay
    0.004
    """

    def __init__(self, learning_rate=0.001, weight_decay=0.004, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-7, amsgrad=False, **kwargs):
        super().__init__(learning_rate=learning_rate, beta_1=beta_1,
                         beta_2=beta_2, epsilon=epsilon, amsgrad=amsgrad,
                         weight_decay=weight_decay, **kwargs)
        if self.weight_decay is None:
            raise ValueError("LazyAdamW needs a weight_decay (a float); use "
                             "LazyAdam for none")


@keras.saving.register_keras_serializable(package="xmc_tf")
class LazySGD(_RowSparseMixin, keras.optimizers.SGD):
    """Momentum SGD whose momentum advances only on rows with a gradient.

    Dense gradients: ``keras.optimizers.SGD``'s update (identical when
    ``dampening == 0``).  With the velocity ``m`` in Keras' convention
    (learning rate folded in), for an ``IndexedSlices`` gradient ``g`` over
    rows ``R`` (duplicates summed):

    .. code-block:: text

        m[R] = momentum * m[R] - learning_rate * (1 - dampening) * g
        w[R] += m[R]                                  (nesterov=False)
        w[R] += momentum * m[R] - learning_rate * g   (nesterov=True)

    Rows outside ``R`` keep weights and velocity.  The momentum update runs
    as TensorFlow's fused in-place row kernel
    (``ResourceSparseApplyKerasMomentum``, which has Keras' convention);
    without momentum it is a ``scatter_sub`` of ``learning_rate * g``.

    This is the weight update of SCENT (Algorithm 26, "SCENT for solving
    XMC", in ``scent-extreme-multiclass``): ``V[C] = (1 - beta) V[C] +
    beta Z[C]``, ``W[C] -= eta V[C]`` on the set ``C`` of rows in the batch,
    which is this class with ``momentum = dampening = 1 - beta`` and
    ``learning_rate = eta`` (then ``m = -eta V``).  The correspondence is
    exact for a constant learning rate; with a schedule, SCENT's ``V`` does
    not contain ``eta`` while Keras' velocity carries past learning rates.
    The velocity starts at zero (the first step is dampened, as in SCENT
    with ``V_0 = 0``; PyTorch's SGD instead starts the buffer at the first
    gradient).

    Args:
      learning_rate: float or schedule (default 0.01, as Keras' SGD).
      momentum: float in [0, 1].
      nesterov: Nesterov momentum (requires ``dampening == 0``).
      dampening: float in [0, 1]; scales the gradient entering the velocity
        by ``1 - dampening`` (0 gives Keras' SGD).
      weight_decay: decoupled weight decay; only rows in the gradient decay.
      **kwargs: the other arguments, as ``keras.optimizers.SGD``.

    Attributes:
      momentums: velocity slots (Keras' SGD name); empty when momentum is 0.

    Raises:
      ValueError: ``momentum`` or ``dampening`` outside [0, 1], or
        ``nesterov`` with ``dampening > 0``.

    >>> import numpy as np
    >>> w = keras.Variable(np.zeros((3, 1), np.float32))
    >>> opt = LazySGD(learning_rate=1.0, momentum=0.5)
    >>> g = tf.IndexedSlices(tf.ones((1, 1)), [1], [3, 1])
    >>> opt.apply([g], [w]); opt.apply([g], [w])
    >>> w.numpy().ravel().tolist()  # -1, then -1 + (-0.5 - 1)
    [0.0, -2.5, 0.0]
    """

    def __init__(self, learning_rate=0.01, momentum=0.0, nesterov=False,
                 dampening=0.0, **kwargs):
        super().__init__(learning_rate=learning_rate, momentum=float(momentum),
                         nesterov=nesterov, **kwargs)
        dampening = float(dampening)
        if not 0.0 <= dampening <= 1.0:
            raise ValueError(f"dampening must be in [0, 1], got {dampening}")
        if nesterov and dampening > 0:
            raise ValueError("Nesterov momentum requires dampening=0")
        self.dampening = dampening

    def _scaled(self, gradient, learning_rate):
        if self.dampening == 0:
            return ops.multiply(gradient, learning_rate)
        return ops.multiply(gradient, learning_rate * (1 - self.dampening))

    def update_step(self, gradient, variable, learning_rate):
        """One update of ``variable``; sparse rows only for ``IndexedSlices``."""
        lr = ops.cast(learning_rate, variable.dtype)
        if not isinstance(gradient, tf.IndexedSlices):
            self._decay(variable, learning_rate)
            if self.momentum == 0 or self.dampening == 0:
                return super().update_step(gradient, variable, learning_rate)
            gradient = ops.cast(gradient, variable.dtype)
            m = self.momentums[self._get_variable_index(variable)]
            momentum = ops.cast(self.momentum, variable.dtype)
            self.assign(m, ops.subtract(ops.multiply(m, momentum),
                                        self._scaled(gradient, lr)))
            self.assign_add(variable, m)
            return None
        if self.momentum == 0 and self.weight_decay is None:
            # scatter_sub adds duplicate rows itself: no de-duplication.
            grad = ops.cast(gradient.values, variable.dtype)
            self._scatter(self.assign_sub, variable, gradient.indices,
                          ops.multiply(grad, lr))
            return None
        indices, grad = self._sparse_rows(gradient, variable)
        self._decay(variable, learning_rate, indices)
        if self.momentum == 0:
            self._scatter(self.assign_sub, variable, indices,
                          ops.multiply(grad, lr))
            return None
        m = self.momentums[self._get_variable_index(variable)]
        if self.dampening != 0:
            grad = ops.multiply(grad, ops.cast(1 - self.dampening, grad.dtype))
        # TensorFlow's fused row update in Keras' convention (one pass over
        # the rows, in place; rows must be unique):
        # accum[R] = momentum * accum[R] - lr * grad;
        # var[R] += accum[R]   or, Nesterov, momentum * accum[R] - lr * grad.
        tf.raw_ops.ResourceSparseApplyKerasMomentum(
            var=tf_variable(variable).handle, accum=tf_variable(m).handle,
            lr=lr, grad=grad, indices=indices,
            momentum=ops.cast(self.momentum, variable.dtype),
            use_locking=False, use_nesterov=self.nesterov)
        return None

    def get_config(self):
        """Keras' SGD config plus ``dampening``."""
        config = super().get_config()
        config["dampening"] = self.dampening
        return config
