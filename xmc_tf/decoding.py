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
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.layers import FusedScores, MachDecoder, MachHead

__all__ = ["register_decoder", "inference_model", "scoring_layer",
           "scores_every_label", "label_output", "as_model_inputs",
           "top_k_function"]

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


def _output_entries(model):
    """``[(key, layer name, output tensor)]`` of ``model``'s outputs in
    ``model.outputs`` order (key: the dict key of dict outputs, else the
    position)."""
    outputs = list(getattr(model, "outputs", None) or [])
    struct = getattr(model, "_outputs_struct", None)
    keys = {}
    if isinstance(struct, dict):
        keys = {id(t): key for key, t in struct.items()}
    names = list(getattr(model, "output_names", None) or [])
    return [(keys.get(id(t), i), names[i] if i < len(names) else None, t)
            for i, t in enumerate(outputs)]


def _scores_labels(layer) -> bool:
    """Whether ``layer`` is one of xmc_tf's label-scoring layers (it scores
    given labels, or a decoder is registered for its type)."""
    return hasattr(layer, "score_candidates") or _registered(layer) is not None


def label_output(model, output=None):
    """``model`` reduced to its label-scoring output: a functional model
    with ``model``'s inputs and that one output (``model`` itself when it
    has one output).

    Args:
      model: a functional ``keras.Model`` (or a training wrapper).
      output: which output scores the labels: a dict output's key, an
        output layer's name, or a position in ``model.outputs``; None
        (default) finds it structurally: the one output whose
        :func:`scoring_layer` is an xmc_tf label-scoring layer, else the
        one widest output.

    Returns:
      The single-output ``keras.Model`` (its layers are ``model``'s).

    Raises:
      ValueError: ``output`` names no output, or None and several outputs
        qualify equally (the message lists them: pass ``output=``).
    """
    model = inference_model(model)
    entries = _output_entries(model)
    if output is None and len(entries) <= 1:
        return model
    if output is not None:
        chosen = [e for e in entries if output in (e[0], e[1])
                  or (isinstance(output, int) and not isinstance(output, bool)
                      and 0 <= output < len(entries) and e is entries[output])]
        if not chosen:
            raise ValueError(
                f"output={output!r} is not an output of model "
                f"{model.name!r}; its outputs: "
                f"{[e[0] for e in entries]} (layers {[e[1] for e in entries]})")
    else:
        subs = [(e, keras.Model(model.inputs, e[2])) for e in entries]
        chosen = [e for e, sub in subs if _scores_labels(scoring_layer(sub))]
        if not chosen:
            widest = max(e[2].shape[-1] or 0 for e in entries)
            chosen = [e for e in entries if (e[2].shape[-1] or 0) == widest]
        if len(chosen) > 1:
            raise ValueError(
                f"model {model.name!r} has {len(entries)} outputs and "
                f"{[e[0] for e in chosen]} could each score the labels: pass "
                "output= (a key, an output layer's name or a position)")
    key, _, tensor = chosen[0]
    return keras.Model(getattr(model, "_inputs_struct", model.inputs), tensor,
                       name=f"{model.name}_{key}")


def _as_input(value, spec):
    if isinstance(value, tf.SparseTensor) or tf.is_tensor(value):
        return value
    if sp.issparse(value):
        coo = sp.coo_matrix(value)
        order = np.lexsort((coo.col, coo.row))
        return tf.SparseTensor(
            np.stack([coo.row[order], coo.col[order]], 1).astype(np.int64),
            coo.data[order].astype(np.float32), np.asarray(coo.shape, np.int64))
    dtype = getattr(spec, "dtype", None) or "float32"
    value = tf.convert_to_tensor(np.asarray(value), dtype=dtype)
    return tf.sparse.from_dense(value) if getattr(spec, "sparse", False) \
        else value


def as_model_inputs(model, x):
    """``x`` as ``model`` takes it: a scipy sparse matrix becomes a
    float32 ``tf.SparseTensor`` (rows in order), a NumPy array or nested
    list a tensor of the input's dtype; for a model with several inputs,
    ``x`` is a dict by input name (or a list in ``model.inputs`` order) of
    such values.  Tensors pass unchanged.

    Args:
      model: a functional ``keras.Model`` (or a training wrapper).
      x: ``[batch, ...]`` values of each input (scipy sparse, NumPy,
        nested lists, tensors), one value or a dict / list of them.

    Returns:
      A ``tf.SparseTensor`` (float32, for scipy input or a sparse input
      given dense values) or ``tf.Tensor`` of the input's dtype, or a dict
      / list of them.

    Raises:
      ValueError: a dict that lacks one of the model's inputs, or a
        non-dict for a model with dict inputs.
    """
    model = inference_model(model)
    struct = getattr(model, "_inputs_struct", None)
    if isinstance(struct, dict):
        if not isinstance(x, dict):
            raise ValueError(f"model {model.name!r} takes a dict of inputs "
                             f"{sorted(struct)}, got {type(x).__name__}")
        missing = sorted(set(struct) - set(x))
        if missing:
            raise ValueError(f"model {model.name!r} needs the inputs "
                             f"{missing} too")
        return {key: _as_input(x[key], spec) for key, spec in struct.items()}
    inputs = list(getattr(model, "inputs", None) or [])
    if len(inputs) > 1 and isinstance(x, (list, tuple)):
        return [_as_input(v, spec) for v, spec in zip(x, inputs)]
    return _as_input(x, inputs[0] if inputs else None)


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


def top_k_function(model, k: int, output=None):
    """``x -> (ids int32 [b, k], scores float32 [b, k])``, best first, for
    any model trained with xmc_tf (or a Keras model whose output scores
    labels): the registered decoder of its scoring layer, else the top
    ``k`` of its ``[b, m]`` scores (ties go to the lower label id).

    ``x`` is what ``model.predict`` takes: a ``tf.SparseTensor``, a scipy
    sparse matrix, a dense array or tensor, or for a model with several
    inputs a dict by input name (:func:`as_model_inputs`).  A model with
    several outputs is decoded at its label-scoring output
    (:func:`label_output`).

    Args:
      model: a functional Keras model (or a training wrapper).
      k: labels per row, ``1 <= k <= num_labels``.
      output: as :func:`label_output` (None: found structurally).

    Raises:
      ValueError: ``k`` out of range (``[1, m]``), a model without
        functional outputs, or no single label-scoring output.
    """
    model = label_output(model, output)
    layer = scoring_layer(model)
    top_k = (_decoder(layer) or _full_scores_top_k)(model, layer, int(k))

    def decode(x):
        ids, scores = top_k(as_model_inputs(model, x))
        return ids, tf.cast(scores, tf.float32)
    return decode


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
