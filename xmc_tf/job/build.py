"""Builds the Keras model of the main job from a config.

::

    input (sparse TF-IDF [b, D] or dense embeddings [b, D])
      -> encoder layers (ReLU, dropout)          config.model.encoder_dims
         (on sparse input the first one is a SparseEmbeddingBag: its
         gradient covers only the batch's feature rows; config.model.encoder
         = "dense" keeps keras.layers.Dense, whose gradient is [D, d])
      -> intermediate Dense (dropout)            config.model.intermediate_dim
                                                 (.intermediate_activation,
                                                  .intermediate_dropout)
      -> head layer named "output"               config.model.head
                                                 (xmc_tf.job.heads)
      (+ on sparse input: the wide path, a        config.model.wide_connections
         per-label sparse linear layer named      (.wide_lr_multiplier,
         "wide" on the input features, its         .wide_init, .wide_l2,
         scores added to the head's)               .wide_max_mib;
                                                   .input_dropout before both)

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 3.4 (a wide dense intermediate layer
before the sparse output layer), Sec. 4.1 (dropout on the input features).
The wide path is the "wide" part of Cheng et al., "Wide & Deep Learning
for Recommender Systems" (DLRS 2016): a linear model on the sparse
features trained jointly with the deep one, its scores added; here each
label keeps the features of its positive instances (PIFA, as the label
representations of Parabel / PECOS) as uniform-sparse connections, and
the kernel is trained ``wide_lr_multiplier`` times faster (a label's
weights move only on the batches where the label matters).
"""

from __future__ import annotations

import keras

from xmc_tf.job import heads as xheads
from xmc_tf.job import wide as xwide
from xmc_tf.layers import SparseDropout, SparseEmbeddingBag

__all__ = ["build_model", "build_network", "build_optimizer", "ENCODERS",
           "learning_rate", "SCHEDULES",
           "INTERMEDIATE_ACTIVATIONS", "OPTIMIZERS"]

#: ``config.model.encoder``: the first encoder layer on sparse input.
ENCODERS = ("sparse_embedding", "dense")
#: ``config.model.intermediate_activation`` (Keras activation names).
INTERMEDIATE_ACTIVATIONS = ("relu", "leaky_relu", "gelu", "linear")
#: ``config.train.optimizer``.
OPTIMIZERS = ("lazy_adam", "lazy_adamw", "adam")


def _encode(config, inputs, sparse_input: bool):
    """The encoder and intermediate layers on ``inputs``; returns
    ``(x, features)``: the hidden output and what the wide path reads (the
    input after ``input_dropout``)."""
    mc = config.model
    x = inputs
    if mc.input_dropout:
        x = SparseDropout(mc.input_dropout, seed=config.seed + 2,
                          name="input_dropout")(x)
    features = x
    for i, units in enumerate(mc.encoder_dims):
        if i == 0 and sparse_input and mc.encoder == "sparse_embedding":
            layer = SparseEmbeddingBag(units, activation="relu",
                                       name=f"encoder_{i}")
        else:
            layer = keras.layers.Dense(units, activation="relu",
                                       name=f"encoder_{i}")
        x = layer(x)
        if mc.dropout:
            x = keras.layers.Dropout(mc.dropout, seed=config.seed)(x)
    if mc.intermediate_dim:
        x = keras.layers.Dense(mc.intermediate_dim,
                               activation=mc.intermediate_activation,
                               name="intermediate")(x)
        if mc.intermediate_dropout:
            x = keras.layers.Dropout(mc.intermediate_dropout,
                                     seed=config.seed + 1)(x)
    return x, features


def _check_model_config(mc) -> None:
    if mc.encoder not in ENCODERS:
        raise ValueError(f"config.model.encoder={mc.encoder!r}; expected one "
                         f"of {ENCODERS}")
    if mc.intermediate_activation not in INTERMEDIATE_ACTIVATIONS:
        raise ValueError(
            f"config.model.intermediate_activation="
            f"{mc.intermediate_activation!r}; expected one of "
            f"{INTERMEDIATE_ACTIVATIONS}")


def build_network(config, num_features: int, num_labels: int,
                  sparse_input: bool, head: xheads.Head | None = None):
    """:func:`build_model`, with the layers the job initialises.

    Returns:
      ``(model, head_layer, wide_layer)``: the model, the layer
      ``head.build_layer`` made (it scores the labels), and the wide path's
      layer (:func:`xmc_tf.job.wide.build_wide`) or None.

    Raises:
      ValueError: as :func:`build_model`.
    """
    head = head or xheads.get_head(config)
    _check_model_config(config.model)
    inputs = keras.Input(shape=(num_features,), sparse=sparse_input,
                         name="features")
    x, features = _encode(config, inputs, sparse_input)
    linear = x is features
    head_layer = head.build_layer(num_labels, int(x.shape[-1]),
                                  sparse_input=sparse_input and linear)
    outputs = head_layer(x)
    fan_in = xwide.plan_fan_in(config, head, num_features, num_labels,
                               sparse_input, linear)
    wide_layer = xwide.build_wide(config, num_labels, fan_in) if fan_in \
        else None
    if wide_layer is not None:
        # The head's scores first: xmc_tf.decoding follows the first input.
        outputs = keras.layers.Add(name="scores")([outputs,
                                                   wide_layer(features)])
    model = keras.Model(inputs, outputs, name=f"xmc_{config.model.head}")
    return model, head_layer, wide_layer


def build_model(config, num_features: int, num_labels: int,
                sparse_input: bool, head: xheads.Head | None = None
                ) -> keras.Model:
    """Builds the (uncompiled) Keras model described by ``config.model``.

    Args:
      config: the ml_collections config (uses ``config.model``,
        ``config.seed``, ``config.loss``; fields and defaults:
        :mod:`xmc_tf.config`).
      num_features: input dimension D.
      num_labels: number of labels m.
      sparse_input: whether the input is a ``tf.SparseTensor``.
      head: the :class:`xmc_tf.job.heads.Head` (default
        ``xmc_tf.job.heads.get_head(config)``).

    Returns:
      A functional ``keras.Model`` named ``xmc_<head>`` whose input is
      named ``"features"`` and whose head layer is named ``"output"``; its
      output is what the head layer returns (``[b, m]`` logits, or
      ``[b, R, B]`` bucket logits for MACH).

    Raises:
      ValueError: unknown ``config.model.head``, ``.encoder`` or
        ``.intermediate_activation``, or ``config.loss`` not made for the
        head.  (``config.model.wide_connections`` is ignored, with a log
        line, for heads without a wide path: MACH, sampled, SCENT; it is
        cut, with a log line, to :func:`xmc_tf.job.wide.wide_fan_in`
        connections per label when ``config.model.wide_max_mib`` is too
        small for it.)
    """
    return build_network(config, num_features, num_labels, sparse_input,
                         head)[0]


#: Values of ``config.train.schedule``.
SCHEDULES = ("plateau", "cosine")


def learning_rate(config, steps_per_epoch: int | None = None):
    """The learning rate the optimizer starts with: a float, or a schedule.

    ``config.train.schedule="plateau"``: ``config.train.learning_rate``
    (halved on plateaus by :class:`xmc_tf.callbacks.ReduceLROnPlateau`, see
    :func:`xmc_tf.job.fit.make_callbacks`); ``"cosine"``: a
    ``keras.optimizers.schedules.CosineDecay`` from ``learning_rate`` to
    ``min_learning_rate`` over ``config.train.epochs * steps_per_epoch``
    steps (Loshchilov & Hutter, SGDR, 2017, Eq. 5 without restarts), read at
    the optimizer's step counter, so a resumed run continues on the same
    curve.

    Args:
      config: the job config (``config.train``).
      steps_per_epoch: training steps per epoch (needed for ``"cosine"``).

    Returns:
      float or ``keras.optimizers.schedules.LearningRateSchedule``.

    Raises:
      ValueError: unknown ``config.train.schedule``, or ``"cosine"`` without
        ``steps_per_epoch``.
    """
    tc = config.train
    schedule = tc.get("schedule", "plateau")
    if schedule == "plateau":
        return float(tc.learning_rate)
    if schedule != "cosine":
        raise ValueError(f"config.train.schedule={schedule!r}; expected one "
                         f"of {SCHEDULES}")
    if not steps_per_epoch:
        raise ValueError("config.train.schedule='cosine' needs the number "
                         "of steps per epoch")
    lr = float(tc.learning_rate)
    return keras.optimizers.schedules.CosineDecay(
        lr, decay_steps=max(1, int(tc.epochs) * int(steps_per_epoch)),
        alpha=min(1.0, float(tc.min_learning_rate) / lr))


def build_optimizer(config, steps_per_epoch: int | None = None
                    ) -> keras.optimizers.Optimizer:
    """The optimizer ``config.train`` names, at ``config.train.learning_rate``
    (or the schedule of ``config.train.schedule``: :func:`learning_rate`).

    ``"lazy_adam"`` (default): :class:`xmc_tf.optimizers.LazyAdam` -- Adam
    on dense gradients, and on ``IndexedSlices`` gradients (the sparse-input
    encoder, sampled heads) updates of the present rows only;
    ``"lazy_adamw"``: :class:`xmc_tf.optimizers.LazyAdamW`, the same with
    decoupled weight decay ``config.train.weight_decay`` (per step
    ``w -= learning_rate * weight_decay * w``, on the present rows only for
    ``IndexedSlices``); ``"adam"``: ``keras.optimizers.Adam`` (densifies
    ``IndexedSlices``).

    Args:
      config: the job config (``config.train``).
      steps_per_epoch: training steps per epoch (for a schedule).

    Raises:
      ValueError: unknown ``config.train.optimizer`` or ``.schedule``.
    """
    from xmc_tf.optimizers import LazyAdam, LazyAdamW
    tc = config.train
    name = tc.optimizer
    lr = learning_rate(config, steps_per_epoch)
    if name == "lazy_adam":
        return LazyAdam(learning_rate=lr)
    if name == "lazy_adamw":
        return LazyAdamW(learning_rate=lr, weight_decay=tc.weight_decay)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=lr)
    raise ValueError(f"config.train.optimizer={name!r}; expected one of "
                     f"{OPTIMIZERS}")
