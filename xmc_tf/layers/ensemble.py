"""The mean of several models' label scores, as a Keras layer.

Ensembles of XMC models (Parabel, Bonsai and Omikuji average 3 trees;
``config.model.ensemble_size`` in the job) average their members'
``[batch, num_labels]`` scores; :class:`ScoreAverage` is that average.  It is
registered with Keras (``"xmc_tf>ScoreAverage"``), so a saved ensemble loads
after ``import xmc_tf``.

Source: Prabhu et al., "Parabel", WWW 2018, Sec. 3 (an ensemble of 3 trees).

Example:
    >>> import numpy as np
    >>> ScoreAverage()([np.zeros((1, 2), np.float32),
    ...                 np.full((1, 2), 4.0, np.float32)]).numpy().tolist()
    [[2.0, 2.0]]
"""

from __future__ import annotations

import keras

__all__ = ["ScoreAverage"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class ScoreAverage(keras.layers.Layer):
    """The element-wise mean of ``n`` score tensors of one shape.

    Input: a list of ``n >= 1`` float32 tensors ``[batch, num_labels]``;
    output: float32 ``[batch, num_labels]``, their mean.  No weights.
    The model of :func:`xmc_tf.job.ensemble.average_scores` ends with it;
    :func:`xmc_tf.decoding.scoring_layer` follows its first input (the
    first member), so the model is decoded as its members are.

    Raises:
      ValueError: no inputs, or inputs of different shapes (at build).
    """

    def build(self, input_shape):
        shapes = [tuple(s) for s in input_shape]
        if not shapes or any(s != shapes[0] for s in shapes):
            raise ValueError(f"ScoreAverage needs >= 1 inputs of one shape; "
                             f"got {shapes}")
        self.built = True

    def call(self, inputs):
        total = inputs[0]
        for x in inputs[1:]:
            total = total + x
        return total / float(len(inputs))

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[0])
