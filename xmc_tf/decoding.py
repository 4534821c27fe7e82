"""Top-k labels from a trained model, decoded by the type of the layer
that scores the labels.

A model's *scoring layer* is found structurally, never by a layer name:
from the model's output, nested models are entered (the feature
normalisation wrapper, an ensemble's members, the deep side of a model
fused with a label tree) and a layer with several inputs is followed
through its first one (an ensemble's average, the fusion's sum, the wide
path's sum: each lists the scores it wraps first), as is an
``Activation``; the first other layer reached scores the labels.

A scoring layer whose type has a registered decoder
(:func:`register_decoder`) is decoded by it -- MACH's
:class:`~xmc_tf.layers.MachHead` by the exact count-min decoder
(:class:`~xmc_tf.layers.MachDecoder`, Medini et al., NeurIPS 2019, Eq. 2);
a fused model (:class:`~xmc_tf.layers.FusedScores` applied to the model's
input, possibly behind single-input layers such as the feature
normalisation) by shortlist and re-rank
(:meth:`~xmc_tf.layers.FusedScores.top_k`);
every other model outputs a score per label ``[b, m]`` and is decoded by
:func:`xmc_tf.ops.topk.top_k` (``Xmc>TopK`` on the CPU).

Example:
    >>> import keras, numpy as np
    >>> from xmc_tf import decoding
    >>> x = keras.Input((4,))
    >>> model = keras.Model(x, keras.layers.Dense(6, name="scores")(x))
    >>> decoding.scoring_layer(model).name, decoding.scores_every_label(model)
    ('scores', True)
    >>> ids, scores = decoding.top_k_function(model, 2)(np.ones((3, 4), "float32"))
    >>> ids.shape, scores.shape
    (TensorShape([3, 2]), TensorShape([3, 2]))
"""

from __future__ import annotations

import keras

from xmc_tf.layers import FusedScores, MachDecoder, MachHead

__all__ = ["register_decoder", "inference_model", "scoring_layer",
           "scores_every_label", "top_k_function"]

#: Scoring-layer class -> ``((model, layer, k) -> top_k, scores every
#: label)`` (see :func:`register_decoder`).
_DECODERS: dict[type, tuple] = {}


def register_decoder(layer_type: type, make_top_k,
                     scores_every_label: bool = False) -> None:
    """Registers how models whose scoring layer is a ``layer_type`` are
    decoded.

    Args:
      layer_type: a Keras layer class (subclasses match too).
      make_top_k: ``(model, layer, k) -> top_k``, where ``top_k`` maps a
        feature batch to ``(ids int32 [b, k], scores float32 [b, k])``,
        best first; it raises ValueError for a ``k`` out of range.
      scores_every_label: whether such a model's output is still a score
        per label ``[b, m]`` (a shortlisting decoder of full scores), so
        that :func:`scores_every_label` holds for it.
    """
    _DECODERS[layer_type] = (make_top_k, bool(scores_every_label))


def inference_model(model):
    """The model that scores labels: ``model.inference_model`` for a
    training wrapper (:class:`xmc_tf.models.CandidateTrainer`), else
    ``model``."""
    return getattr(model, "inference_model", None) or model


def scoring_layer(model):
    """The layer that scores the labels of ``model`` (see the module
    docstring for how it is found).

    Args:
      model: a functional ``keras.Model`` (or a training wrapper).

    Returns:
      The Keras layer.

    Raises:
      ValueError: the model has no functional outputs to follow.
    """
    model = inference_model(model)
    outputs = getattr(model, "outputs", None)
    if not outputs:
        raise ValueError(f"model {getattr(model, 'name', model)!r} has no "
                         "functional outputs to decode")
    tensor = outputs[0]
    while True:
        operation, node_index, _ = tensor._keras_history
        if isinstance(operation, keras.Model) and operation.outputs:
            tensor = operation.outputs[0]
            continue
        inputs = operation._inbound_nodes[node_index].input_tensors
        if len(inputs) > 1 or (inputs and isinstance(
                operation, keras.layers.Activation)):
            tensor = inputs[0]
            continue
        return operation


def _registered(layer):
    for layer_type, entry in _DECODERS.items():
        if isinstance(layer, layer_type):
            return entry
    return None


def _decoder(layer):
    entry = _registered(layer)
    return entry[0] if entry is not None else None


def scores_every_label(model) -> bool:
    """Whether ``model`` outputs a score per label ``[b, m]`` (no
    registered decoder for its scoring layer, or one registered with
    ``scores_every_label``)."""
    entry = _registered(scoring_layer(model))
    return entry is None or entry[1]


def _full_scores_top_k(model, layer, k: int):
    del layer
    num_labels = model.outputs[0].shape[-1] if model.outputs else None
    if k < 1 or (num_labels is not None and k > num_labels):
        raise ValueError(f"k={k} must be in [1, num_labels={num_labels}]")
    from xmc_tf.ops.topk import top_k as select_top_k

    def top_k(x):
        top = select_top_k(model(x, training=False), k)
        return top.indices, top.values
    return top_k


def top_k_function(model, k: int):
    """``x -> (ids int32 [b, k], scores float32 [b, k])``, best first, for
    any model trained with xmc_tf (or a Keras model whose output scores
    labels): the registered decoder of its scoring layer, else the top
    ``k`` of its ``[b, m]`` scores (ties go to the lower label id).

    Raises:
      ValueError: ``k`` out of range (``[1, m]``), or a model without
        functional outputs.
    """
    model = inference_model(model)
    layer = scoring_layer(model)
    return (_decoder(layer) or _full_scores_top_k)(model, layer, int(k))


def _mach_top_k(model, layer, k: int):
    decoder = MachDecoder.from_head(layer, k=k)
    return lambda x: decoder(model(x, training=False))


def _front_layers(model, layer):
    """The layers between ``model``'s input and ``layer`` when ``model``
    is ``layer`` applied to them (a chain of single-input layers, e.g. the
    feature normalisation), input side first; None when ``model`` does
    more (``layer``'s output is not the model's, or a layer on the way
    has several inputs or is a model)."""
    outputs, inputs = getattr(model, "outputs", None), model.inputs
    if not outputs or len(outputs) != 1 or len(inputs) != 1:
        return None
    operation, node_index, _ = outputs[0]._keras_history
    if operation is not layer:
        return None
    chain = []
    while True:
        node = operation._inbound_nodes[node_index]
        if len(node.input_tensors) != 1:
            return None
        tensor = node.input_tensors[0]
        if tensor is inputs[0]:
            return chain[::-1]
        operation, node_index, _ = tensor._keras_history
        if isinstance(operation, keras.Model):
            return None
        chain.append(operation)


def _fused_top_k(model, layer, k: int):
    # Shortlist and re-rank where the model is the fused layer behind a
    # chain of single-input layers; a model that wraps it in more (an
    # ensemble's average) ranks its exact scores.
    front = _front_layers(model, layer)
    if front is None:
        return _full_scores_top_k(model, layer, k)
    if not 1 <= k <= layer.num_labels:
        raise ValueError(f"k={k} must be in [1, num_labels="
                         f"{layer.num_labels}]")

    def top_k(x):
        for step in front:
            x = step(x)
        return layer.top_k(x, k)
    return top_k


register_decoder(MachHead, _mach_top_k)
register_decoder(FusedScores, _fused_top_k, scores_every_label=True)
