"""Per-variable optimizer state ("slots") of the optimizers xmc_tf knows.

The one place that knows the attribute names under which Keras 3 optimizers
keep one state variable per trainable variable (Keras 3.15:
``Adam``/``AdamW`` ``_momentums``, ``_velocities``, ``_velocity_hats``;
``SGD`` ``momentums``).  The lazy optimizers of :mod:`xmc_tf.optimizers.lazy`
subclass those and keep the same names, so code that resets the state of some
weights (``xmc_tf.callbacks.SetRewiring``) works with either.
"""

from __future__ import annotations

import keras

__all__ = ["slot_names", "slot_variables"]

# Subclasses come before their bases (AdamW is an Adam; LazyAdam is an Adam).
_SLOT_NAMES = (
    (keras.optimizers.AdamW, ("_momentums", "_velocities", "_velocity_hats")),
    (keras.optimizers.Adam, ("_momentums", "_velocities", "_velocity_hats")),
    (keras.optimizers.SGD, ("momentums",)),
)


def slot_names(optimizer) -> tuple:
    """Names of the optimizer's lists of per-variable state.

    Args:
      optimizer: a Keras optimizer instance.

    Returns:
      Tuple of attribute names; each attribute, when present and non-empty,
      is a list with one variable per trainable variable, in the order of
      ``optimizer._get_variable_index``.

    Raises:
      ValueError: an optimizer that is not (a subclass of) Adam, AdamW or
        SGD, whose state layout is unknown.

    >>> slot_names(keras.optimizers.SGD(momentum=0.9))
    ('momentums',)
    """
    for cls, names in _SLOT_NAMES:
        if isinstance(optimizer, cls):
            return names
    raise ValueError(
        "per-variable optimizer state is known for Adam, AdamW and SGD and "
        f"their subclasses (e.g. xmc_tf.optimizers.LazyAdam); got "
        f"{type(optimizer).__name__}")


def slot_variables(optimizer, variable) -> list:
    """The optimizer state variables of one trainable variable.

    Args:
      optimizer: a Keras optimizer instance (see :func:`slot_names`).
      variable: a trainable variable the optimizer was built with.

    Returns:
      List of ``keras.Variable`` with ``variable``'s shape and dtype (e.g.
      Adam's first and second moments); empty before the optimizer is built
      and for stateless configurations (SGD without momentum).

    Raises:
      ValueError: as :func:`slot_names`.
      KeyError: ``variable`` is not one the optimizer was built with.

    >>> v = keras.Variable([[1.0, 2.0]])
    >>> opt = keras.optimizers.Adam()
    >>> opt.build([v])
    >>> [tuple(s.shape) for s in slot_variables(opt, v)]
    [(1, 2), (1, 2)]
    """
    names = slot_names(optimizer)
    if not optimizer.built:
        return []
    index = optimizer._get_variable_index(variable)  # pylint: disable=protected-access
    slots = []
    for name in names:
        values = getattr(optimizer, name, None)
        if values:  # absent or empty (SGD without momentum, no amsgrad)
            slot = values[index]
            if slot is not None:  # None for overwrite_with_gradient variables
                slots.append(slot)
    return slots
