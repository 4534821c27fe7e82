"""Keras initializers of xmc_tf: an output bias that matches the loss.

An extreme classifier's output layer whose bias starts at 0 scores every
label as "undecided".  Under the squared hinge
(:class:`xmc_tf.losses.SquaredHinge`, the package's default loss) all ``m``
labels then violate the margin of their negatives: the loss is about ``m``
per instance, and the first epochs only push every score below ``-1``.
Measured with the README's toy model (``Dense(512, leaky_relu)`` ->
``UniformSparseDense(5000, connections_per_label=32)``, Adam, 20 epochs on
2,048 instances with 3 labels each): train P@1 stays at 0.002 with a zero
bias and reaches 1.0 with a bias of -1.  :class:`PriorBias` starts the
bias at the loss's best score for a model that ignores its input (the prior
initialisation of Lin et al., "Focal Loss for Dense Object Detection", ICCV
2017, Sec. 4.1), computed by the loss's own
:meth:`~xmc_tf.losses.SquaredHinge.prior_scores`.  It is the default bias
initializer of :class:`xmc_tf.layers.UniformSparseDense` and
:class:`xmc_tf.layers.LabelDense` (the registered name ``"hinge_prior"``:
``-1``, the squared hinge's prior for a rare label).  That default is safe
with the other losses: a softmax is unchanged by a constant shift of all
its logits, and for the binary cross-entropy ``-1`` is no worse than ``0``
(neither learns the toy above; its own prior, ``log(p / (1 - p))``, does:
pass ``BinaryCrossentropy().bias_initializer(labels_per_instance)``).

The training job (``xmc-tf train``) goes further and sets each label's
bias from its own training frequency (``config.model.output_bias_init=
"prior"``, :class:`xmc_tf.job.heads.dense.LabelWiseHead`).

:func:`chunked_initial_value` draws a large matrix from a Keras
initializer's distribution a block of rows at a time, for the layers whose
weights reach gigabytes (the uniform-sparse head's kernel at millions of
labels, an embedding of hundreds of thousands of features).
"""

from __future__ import annotations

import math

import keras
import numpy as np

__all__ = ["PriorBias", "PRIOR_LOSSES", "chunked_initial_value",
           "large_matrix_initializer", "CHUNKED_INIT_BYTES"]

#: Matrices of at least this many bytes are drawn by
#: :func:`chunked_initial_value` in the layers that use it.
CHUNKED_INIT_BYTES = 256 << 20
#: The bytes of one block of :func:`chunked_initial_value`.
CHUNK_BYTES = 64 << 20

#: ``PriorBias(loss=...)`` values: the losses with a constant-score prior.
PRIOR_LOSSES = ("squared_hinge", "bce", "softmax")


#: ``PriorBias(loss=...)`` value -> the loss class's registered Keras name
#: (looked up in Keras' registry: the losses build their own PriorBias,
#: so importing them here would be an import cycle).
_LOSS_CLASSES = {"squared_hinge": "xmc_tf>SquaredHinge",
                 "bce": "xmc_tf>BinaryCrossentropy",
                 "softmax": "xmc_tf>SoftmaxCrossentropy"}


def _loss(name, margin):
    cls = keras.saving.get_registered_object(_LOSS_CLASSES[name])
    if cls is None:  # pragma: no cover - `import xmc_tf` registers them
        raise ValueError(f"PriorBias: loss {name!r} is not registered; "
                         "import xmc_tf first")
    return cls(margin=margin) if name == "squared_hinge" else cls()


@keras.saving.register_keras_serializable(package="xmc_tf")
class PriorBias(keras.initializers.Initializer):
    """Constant bias at a loss's best score for a label of average frequency.

    Every entry of the ``[units]`` bias is ``loss.prior_scores(p)`` with
    ``p = min(labels_per_instance / units, 1)``, the frequency of a label
    when every label is equally frequent:

    * ``"squared_hinge"``: ``margin * (2 p - 1)``; with
      ``labels_per_instance=None``, the rare-label limit ``p -> 0``:
      ``-margin`` whatever the number of labels (the default, registered
      as ``"hinge_prior"``);
    * ``"bce"``: ``log(p / (1 - p))`` (about ``-7.4`` for 3 labels of
      5,000);
    * ``"softmax"``: ``log p`` (any constant gives the same softmax; for
      completeness).

    Source: Lin et al., "Focal Loss for Dense Object Detection", ICCV 2017,
    Sec. 4.1 (prior initialisation); the formulas are the losses' own
    ``prior_scores`` (:mod:`xmc_tf.losses.hinge`,
    :mod:`xmc_tf.losses.softmax`).

    Args:
      loss: one of :data:`PRIOR_LOSSES`.
      labels_per_instance: float > 0, the mean number of positive labels
        per instance; None (squared hinge only): rare labels, ``p -> 0``.
      margin: float > 0, the squared hinge's margin (ignored otherwise).

    Called with ``shape`` (the last axis is the number of labels, >= 1) and
    a float ``dtype``; returns that shape filled with the prior.

    Raises:
      ValueError: an unknown ``loss``; ``labels_per_instance`` not > 0, or
        None for a loss other than the squared hinge; ``margin`` not > 0;
        at call time, an empty last axis.

    >>> import keras, xmc_tf
    >>> init = keras.initializers.get("hinge_prior")
    >>> init
    PriorBias(loss='squared_hinge', labels_per_instance=None, margin=1.0)
    >>> keras.ops.convert_to_numpy(init((3,)))
    array([-1., -1., -1.], dtype=float32)
    >>> bce = xmc_tf.losses.BinaryCrossentropy().bias_initializer(3)
    >>> round(float(bce((5000,))[0]), 3)  # log(p / (1 - p)), p = 3 / 5000
    -7.418
    """

    def __init__(self, loss="squared_hinge", labels_per_instance=None,
                 margin=1.0):
        if loss not in PRIOR_LOSSES:
            raise ValueError(f"PriorBias: loss={loss!r}; expected one of "
                             f"{PRIOR_LOSSES}")
        if labels_per_instance is None:
            if loss != "squared_hinge":
                raise ValueError(
                    f"PriorBias: loss={loss!r} needs labels_per_instance "
                    "(the mean number of labels per instance; only the "
                    "squared hinge has a rare-label limit)")
        elif not float(labels_per_instance) > 0:
            raise ValueError("PriorBias: labels_per_instance must be > 0, "
                             f"got {labels_per_instance}")
        if not float(margin) > 0:
            raise ValueError(f"PriorBias: margin must be > 0, got {margin}")
        self.loss = loss
        self.labels_per_instance = (None if labels_per_instance is None
                                    else float(labels_per_instance))
        self.margin = float(margin)

    def value(self, num_labels: int) -> float:
        """The prior score of each of ``num_labels`` labels (a float).

        Raises:
          ValueError: ``num_labels`` < 1.
        """
        if int(num_labels) < 1:
            raise ValueError(f"PriorBias: needs >= 1 label, got {num_labels}")
        p = (0.0 if self.labels_per_instance is None
             else min(self.labels_per_instance / int(num_labels), 1.0))
        return float(_loss(self.loss, self.margin).prior_scores([p])[0])

    def __call__(self, shape, dtype=None):
        shape = tuple(int(d) for d in shape)
        num_labels = shape[-1] if shape else 1
        value = self.value(num_labels)
        dtype = keras.backend.standardize_dtype(dtype)
        return keras.ops.full(shape, value, dtype=dtype)

    def get_config(self):
        return {"loss": self.loss,
                "labels_per_instance": self.labels_per_instance,
                "margin": self.margin}

    def __repr__(self):
        return (f"PriorBias(loss={self.loss!r}, labels_per_instance="
                f"{self.labels_per_instance!r}, margin={self.margin!r})")


# keras.initializers.get("hinge_prior") (and bias_initializer="hinge_prior"
# in any layer) resolves to PriorBias(): the squared hinge's -margin.
keras.saving.get_custom_objects()["hinge_prior"] = PriorBias


def _seed_stream(seed):
    """A ``keras.random.SeedGenerator`` that advances between blocks (an int
    seed given to every block would repeat the same values)."""
    if isinstance(seed, keras.random.SeedGenerator):
        return seed
    return keras.random.SeedGenerator(seed)


#: The initializers whose distribution :func:`_block_sampler` knows.
_BLOCK_INITIALIZERS = (
    keras.initializers.VarianceScaling, keras.initializers.RandomUniform,
    keras.initializers.TruncatedNormal, keras.initializers.RandomNormal,
    keras.initializers.Zeros, keras.initializers.Ones,
    keras.initializers.Constant)


def _block_sampler(initializer, shape):
    """``draw(block_shape, dtype)`` giving blocks of rows with the
    distribution ``initializer(shape)`` has, or None when that is not known
    for this initializer (then the whole matrix must be drawn at once)."""
    init = initializer
    if isinstance(init, keras.initializers.VarianceScaling):
        from keras.src.initializers.random_initializers import compute_fans
        fan_in, fan_out = compute_fans(
            shape, input_axes=getattr(init, "input_axes", None),
            output_axes=getattr(init, "output_axes", None))
        scale = init.scale / max(1.0, {"fan_in": fan_in, "fan_out": fan_out}
                                 .get(init.mode, (fan_in + fan_out) / 2.0))
        gen = _seed_stream(init.seed)
        if init.distribution == "truncated_normal":
            std = math.sqrt(scale) / 0.87962566103423978
            return lambda b, dt: keras.random.truncated_normal(
                b, stddev=std, dtype=dt, seed=gen)
        if init.distribution == "untruncated_normal":
            return lambda b, dt: keras.random.normal(
                b, stddev=math.sqrt(scale), dtype=dt, seed=gen)
        limit = math.sqrt(3.0 * scale)
        return lambda b, dt: keras.random.uniform(
            b, minval=-limit, maxval=limit, dtype=dt, seed=gen)
    if isinstance(init, keras.initializers.RandomUniform):
        gen = _seed_stream(init.seed)
        return lambda b, dt: keras.random.uniform(
            b, minval=init.minval, maxval=init.maxval, dtype=dt, seed=gen)
    if isinstance(init, keras.initializers.TruncatedNormal):
        gen = _seed_stream(init.seed)
        return lambda b, dt: keras.random.truncated_normal(
            b, mean=init.mean, stddev=init.stddev, dtype=dt, seed=gen)
    if isinstance(init, keras.initializers.RandomNormal):
        gen = _seed_stream(init.seed)
        return lambda b, dt: keras.random.normal(
            b, mean=init.mean, stddev=init.stddev, dtype=dt, seed=gen)
    if isinstance(init, (keras.initializers.Zeros, keras.initializers.Ones,
                         keras.initializers.Constant)):
        return lambda b, dt: init(b, dt)  # the same value everywhere
    return None


def chunked_initial_value(initializer, shape, dtype="float32",
                          chunk_bytes: int | None = None):
    """A ``[rows, cols]`` initial value drawn a block of rows at a time.

    A Keras initializer draws the whole matrix in one call, through
    TensorFlow ops whose temporaries (three ``[rows, cols]`` tensors for a
    uniform draw) stay with the CPU allocator (oneDNN's, by default) after
    they are freed: at 2.8M labels and fan-in 96 a 1.0 GiB kernel left
    3.2 GiB resident.  Here each block of about ``chunk_bytes`` is drawn
    from the same distribution (the scale of a ``VarianceScaling``
    initializer, Glorot, He or LeCun, computed from the whole ``shape``) and
    copied into one NumPy array, so what remains is the array and one
    block's temporaries.  With more than one block the values are another
    draw than the one-call initializer's (the same distribution;
    reproducible for an int seed); a single block is that draw.

    Args:
      initializer: a Keras initializer (or its name / config):
        ``VarianceScaling`` and its subclasses, ``RandomUniform``,
        ``RandomNormal``, ``TruncatedNormal``, ``Zeros``, ``Ones``,
        ``Constant``.
      shape: ``(rows, cols)`` ints.
      dtype: ``"float32"`` (other dtypes: None is returned).
      chunk_bytes: bytes of one block (at least one row); default
        :data:`CHUNK_BYTES`.  A single block is the one-call draw.

    Returns:
      ``np.ndarray`` of ``shape`` and ``dtype``, or None when the
      initializer's distribution is not one of the above (draw it whole).

    Raises:
      ValueError: ``shape`` is not two non-negative ints.
    """
    rows, cols = (int(d) for d in shape)
    if rows < 0 or cols < 0:
        raise ValueError(f"shape must be two ints >= 0, got {shape}")
    if np.dtype(dtype) != np.float32:
        return None
    draw = _block_sampler(keras.initializers.get(initializer), (rows, cols))
    if draw is None:
        return None
    out = np.empty((rows, cols), np.float32)
    if chunk_bytes is None:
        chunk_bytes = CHUNK_BYTES
    step = max(1, int(chunk_bytes) // (4 * max(1, cols)))
    for j0 in range(0, rows, step):
        j1 = min(rows, j0 + step)
        out[j0:j1] = keras.ops.convert_to_numpy(
            draw((j1 - j0, cols), "float32"))
    return out


def large_matrix_initializer(initializer, shape, dtype="float32"):
    """The initializer a layer passes to ``add_weight`` for a ``[rows, cols]``
    weight: ``initializer`` itself below :data:`CHUNKED_INIT_BYTES`, else
    (where :func:`chunked_initial_value` knows its distribution) one that
    returns a block-by-block draw, made when the weight is created.

    Args:
      initializer: a Keras initializer (or its name / config).
      shape: ``(rows, cols)`` ints.
      dtype: the variable's dtype (only float32 weights are drawn in
        blocks).

    Returns:
      A Keras initializer or a callable ``(shape, dtype=None) -> array``.
    """
    init = keras.initializers.get(initializer)
    rows, cols = (int(d) for d in shape)
    if (np.dtype(keras.backend.standardize_dtype(dtype)) != np.float32
            or 4 * rows * cols < CHUNKED_INIT_BYTES
            or not isinstance(init, _BLOCK_INITIALIZERS)):
        return init

    def draw(shape, dtype=None):
        return chunked_initial_value(init, shape, "float32")

    return draw
