"""The update rule of a uniform-sparse head trained inside its backward pass.

:class:`FusedUpdate` is what ``UniformSparseDense(fused_update=...)`` takes:
the layer's weights gradient is applied inside the backward op
(:func:`xmc_tf.ops.uniform_sparse_grad_apply`), so neither a dense ``[m, s]``
float32 gradient nor a Keras optimizer's slots and temporaries exist for the
kernel.  With a bfloat16 kernel (the layer's ``dtype="bfloat16"``) the
rule's state has that dtype too and the steps are Kahan-compensated.

Sources: ELMO (Zhang et al., "ELMO: Efficiency via Low-precision and Peak
Memory Optimization in Large Output Spaces", ICML 2025): a classifier in pure
bfloat16 with Kahan summation and the update fused into the backward;
Kingma & Ba, "Adam", Algorithm 1 (the ``"adam"`` rule, per label row).
"""

from __future__ import annotations

import keras

__all__ = ["FusedUpdate"]

RULES = ("sgd", "adam")


@keras.saving.register_keras_serializable(package="xmc_tf")
class FusedUpdate:
    """The optimizer step a layer applies to its own kernel in the backward.

    Args:
      rule: ``"adam"`` (two moments per weight, in the kernel's dtype) or
        ``"sgd"`` (no state: the memory of ELMO's classifier).
      learning_rate: a float, a ``keras.optimizers.schedules``
        ``LearningRateSchedule`` (called with the layer's own step count,
        from 0), or a zero-argument callable returning a scalar, read at
        every step (e.g. ``lambda: optimizer.learning_rate``: the model's
        optimizer's current rate, which Keras' ``ReduceLROnPlateau``
        changes).  A callable is saved as the value it returns when the
        config is taken.
      beta_1, beta_2, epsilon: Adam's (``rule="adam"``), as
        ``keras.optimizers.Adam``.
      kahan: Kahan-compensated steps (one more state variable per weight);
        None: on for a 16-bit kernel, off for float32.
      lazy: Adam steps only the labels with a non-zero signal in the batch
        (as :class:`xmc_tf.optimizers.LazyAdam` on a row-sparse gradient:
        less work, other results); False (default): every label, those
        without signal along a zero gradient, as ``keras.optimizers.Adam``
        on the dense gradient the model's optimizer would get.

    Raises:
      ValueError: an unknown ``rule``, a ``learning_rate`` that is not
        positive, or betas outside ``[0, 1)``.

    >>> rule = FusedUpdate("adam", learning_rate=1e-3)
    >>> rule.state_names("bfloat16")
    ('compensation', 'm', 'v')
    >>> FusedUpdate.from_config(rule.get_config()).rule
    'adam'
    """

    def __init__(self, rule="adam", learning_rate=1e-3, beta_1=0.9,
                 beta_2=0.999, epsilon=1e-7, kahan=None, lazy=False):
        if rule not in RULES:
            raise ValueError(f"FusedUpdate rule={rule!r}; expected one of "
                             f"{RULES}")
        if isinstance(learning_rate, (int, float)) and not learning_rate > 0:
            raise ValueError(f"learning_rate must be > 0, got {learning_rate}")
        if not (0 <= beta_1 < 1 and 0 <= beta_2 < 1):
            raise ValueError(f"beta_1={beta_1}, beta_2={beta_2} must be in "
                             "[0, 1)")
        self.rule = rule
        self.learning_rate = learning_rate
        self.beta_1 = float(beta_1)
        self.beta_2 = float(beta_2)
        self.epsilon = float(epsilon)
        self.kahan = kahan
        self.lazy = bool(lazy)

    def uses_kahan(self, dtype) -> bool:
        """Whether steps on a kernel of ``dtype`` are compensated."""
        if self.kahan is not None:
            return bool(self.kahan)
        return keras.backend.standardize_dtype(dtype) in ("bfloat16",
                                                          "float16")

    def state_names(self, dtype) -> tuple:
        """The state variables per weight, in the op's order."""
        names = ("compensation",) if self.uses_kahan(dtype) else ()
        return names + (("m", "v") if self.rule == "adam" else ())

    def current_learning_rate(self, step):
        """The learning rate at ``step`` (a scalar tensor or float)."""
        lr = self.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            return lr(step)
        if callable(lr):
            return lr()
        return lr

    def step_size(self, step):
        """The op's ``alpha`` for the 1-based step ``step`` (int64 tensor):
        the learning rate, with Adam's bias corrections folded in (Kingma &
        Ba, Sec. 2) for ``rule="adam"``."""
        import tensorflow as tf
        lr = tf.cast(self.current_learning_rate(step - 1), tf.float32)
        if self.rule == "sgd":
            return lr
        t = tf.cast(step, tf.float32)
        return lr * tf.sqrt(1.0 - tf.pow(self.beta_2, t)) / (
            1.0 - tf.pow(self.beta_1, t))

    def get_config(self) -> dict:
        lr = self.learning_rate
        if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
            lr = keras.saving.serialize_keras_object(lr)
        elif callable(lr):
            lr = float(keras.ops.convert_to_numpy(lr()))
        return {"rule": self.rule, "learning_rate": lr, "beta_1": self.beta_1,
                "beta_2": self.beta_2, "epsilon": self.epsilon,
                "kahan": self.kahan, "lazy": self.lazy}

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if isinstance(config.get("learning_rate"), dict):
            config["learning_rate"] = keras.saving.deserialize_keras_object(
                config["learning_rate"])
        return cls(**config)

    def __repr__(self):
        return (f"FusedUpdate(rule={self.rule!r}, "
                f"learning_rate={self.learning_rate!r})")
