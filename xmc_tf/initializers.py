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
"""

from __future__ import annotations

import keras

__all__ = ["PriorBias", "PRIOR_LOSSES"]

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
