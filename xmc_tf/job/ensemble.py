"""Ensembles of trained xmc_tf models: the average of their label scores.

Tree methods for extreme classification train a few trees and average their
scores (Parabel, Bonsai and Omikuji use 3 by default); DiSMEC and AttentionXML
average several models too.  ``config.model.ensemble_size = n`` makes
``xmc-tf train`` train ``n`` members that differ only in their random seed
(initial weights, SET draws, batch order; the validation split is the same)
and export one model that averages their ``[batch, num_labels]`` scores
(:func:`average_scores`).  The averaged model is an ordinary Keras model: it
saves, reloads, exports to a SavedModel and is decoded like its members
(``tf.math.top_k`` of the averaged scores).

Source: Prabhu et al., "Parabel", WWW 2018, Sec. 3 (an ensemble of 3 trees);
Lakshminarayanan et al., "Simple and Scalable Predictive Uncertainty
Estimation using Deep Ensembles", NeurIPS 2017 (members that differ only in
their random initialisation).

Example:
    >>> import keras, numpy as np
    >>> def member(bias):
    ...     x = keras.Input((3,))
    ...     return keras.Model(x, keras.layers.Dense(
    ...         2, kernel_initializer="ones",
    ...         bias_initializer=keras.initializers.Constant(bias))(x))
    >>> model = average_scores([member(0.0), member(2.0)])
    >>> model(np.ones((1, 3), np.float32)).numpy().tolist()
    [[4.0, 4.0]]
"""

from __future__ import annotations

import keras

from xmc_tf.layers import ScoreAverage

__all__ = ["average_scores", "ENSEMBLE_MODEL", "MEMBER_PREFIX"]

#: Name of the averaged model built by :func:`average_scores`.
ENSEMBLE_MODEL = "ensemble"
#: Members of an averaged model are renamed ``member_0``, ``member_1``, ...
MEMBER_PREFIX = "member_"


def average_scores(models: list[keras.Model]) -> keras.Model:
    """One Keras model whose output is the mean of ``models``' outputs.

    Args:
      models: trained models with one input of one spec (sparse or dense
        ``[batch, num_features]``) and one float32 output
        ``[batch, num_labels]`` of one shape -- models built by
        :func:`xmc_tf.job.build.build_model` with a head that scores every
        label.  They are renamed ``member_0``, ``member_1``, ... (the names
        must be unique inside the new model).

    Returns:
      A functional ``keras.Model`` named ``"ensemble"``: input as the
      members', output float32 ``[batch, num_labels]`` (the last layer, a
      :class:`xmc_tf.layers.ScoreAverage`, is named ``"output"``).

    Raises:
      ValueError: no models, or models whose inputs or outputs differ in
        shape.
    """
    if not models:
        raise ValueError("average_scores needs at least one model")
    spec = models[0].inputs[0]
    for m in models[1:]:
        other = m.inputs[0]
        if (tuple(other.shape) != tuple(spec.shape)
                or bool(other.sparse) != bool(spec.sparse)):
            raise ValueError(f"models take different inputs: {spec.shape} "
                             f"(sparse={spec.sparse}) and {other.shape} "
                             f"(sparse={other.sparse})")
    x = keras.Input(shape=tuple(spec.shape[1:]), sparse=bool(spec.sparse),
                    dtype=spec.dtype, name="features")
    outputs = []
    for i, m in enumerate(models):
        m.name = f"{MEMBER_PREFIX}{i}"
        outputs.append(m(x))
    return keras.Model(x, ScoreAverage(name="output")(outputs),
                       name=ENSEMBLE_MODEL)
