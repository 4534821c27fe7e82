"""Shortlist and re-rank: a network fused with other label scorers.

:class:`FusedScores` is the scoring layer of a fused model: its scores are
the network's plus a weighted sum of other scorers' (the label tree, the
label centroids, the neighbour votes),

    ``scores(x) = network(x) + sum_i weights[i] * scorers[i](x)``,

exact for every label in ``call`` (``[batch, num_labels]``), and its top k
(:meth:`FusedScores.top_k`, which :mod:`xmc_tf.decoding` uses for
prediction, evaluation and the SavedModel's ``serve``) is that of the same
sum over a shortlist: the union of the labels some scorers shortlist (the
tree's beam search, the neighbours' votes), every label of it scored by
every scorer (their ``score_candidates``) and by the network
(:func:`candidate_scorer`).  The cost per instance then grows with the
shortlist, not with the label count.

Sources: shortlist-and-rerank of Astec / DeepXML (Dahiya et al., WSDM 2021,
Sec. 3) and SiameseXML (Dahiya et al., ICML 2021); the beam search of
Parabel (Prabhu et al., WWW 2018, Sec. 3.3); ASTRA (Mehta et al., Sec. 3:
an index on the classifiers shortlists, the classifiers re-rank).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.ops.pairs import merge_shortlists
from xmc_tf.ops.topk import top_k as select_top_k

__all__ = ["FusedScores", "NormalizedScorer", "candidate_scorer",
           "merge_shortlists"]


def _is_linear(layer) -> bool:
    activation = getattr(layer, "activation", None)
    return activation is None or activation is keras.activations.linear


def _sum_terms(model):
    """``[(layer, input tensor)]`` whose ``score_candidates`` add up to the
    output of the functional ``model`` (its output an ``Add`` of
    label-scoring layers with a linear activation, or one such layer), or
    None for any other structure."""
    outputs = getattr(model, "outputs", None)
    if not outputs or len(outputs) != 1:
        return None
    terms = []

    def walk(tensor) -> bool:
        operation, node_index, _ = tensor._keras_history
        inputs = operation._inbound_nodes[node_index].input_tensors
        if isinstance(operation, keras.layers.Add):
            return all(walk(t) for t in inputs)
        if (hasattr(operation, "score_candidates") and len(inputs) == 1
                and _is_linear(operation)):
            terms.append((operation, inputs[0]))
            return True
        return False

    return terms if walk(outputs[0]) else None


def candidate_scorer(model):
    """A function ``(x, ids) -> [batch, C]`` of ``model``'s scores at given
    labels: ``tf.gather(model(x), ids, batch_dims=1)`` (``ids`` int
    ``[batch, C]`` in ``[0, num_labels)``).

    Where ``model``'s output is a label-scoring layer (one with
    ``score_candidates``: :class:`~xmc_tf.layers.UniformSparseDense`,
    :class:`~xmc_tf.layers.LabelDense`, ...) or an ``Add`` of such layers
    (the job's head plus its wide path), each is scored at ``ids`` on its
    own input (one sub-model from ``model``'s input to theirs), so no
    ``[batch, num_labels]`` tensor is made: the cost is ``C`` of the
    layers' rows per instance.  Any other model is scored in full and
    gathered (exact, ``O(num_labels)``).

    Args:
      model: a functional Keras model ``[batch, D] -> [batch, m]``.

    Returns:
      The function; its scores are float32.
    """
    terms = _sum_terms(model)
    if not terms:
        def gather(x, ids):
            scores = tf.cast(model(x, training=False), tf.float32)
            return tf.gather(scores, tf.cast(ids, tf.int32), batch_dims=1)
        return gather
    prefix = keras.Model(model.inputs, [t for _, t in terms],
                         name=f"{model.name}_queries")
    layers = [layer for layer, _ in terms]

    def score(x, ids):
        queries = prefix(x, training=False)
        if not isinstance(queries, (list, tuple)):
            queries = [queries]
        total = None
        for layer, query in zip(layers, queries):
            part = tf.cast(layer.score_candidates(query, ids), tf.float32)
            total = part if total is None else total + part
        return total
    return score


@keras.saving.register_keras_serializable(package="xmc_tf")
class NormalizedScorer(keras.layers.Layer):
    """A scorer on re-normalised features: ``scorer(normalization(x))``.

    The centroids and the votes of rows weighted by the idf once more are
    a :class:`FeatureNormalization` (``"tfidf"``) before the scorer; this
    layer applies it before each of the scorer's methods (``call``,
    ``score_candidates`` and, where the scorer has it, ``shortlist``).

    Args:
      scorer: a label scorer layer on ``[batch, D]`` features.
      normalization: a layer ``[batch, D] -> [batch, D]`` (kind kept:
        sparse in, sparse out).
      **kwargs: base layer arguments (``name``...).
    """

    def __init__(self, scorer, normalization, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.scorer = scorer
        self.normalization = normalization

    def build(self, input_shape):
        for layer in (self.normalization, self.scorer):
            if not layer.built:
                layer.build(input_shape)
        super().build(input_shape)

    def call(self, inputs):
        return self.scorer(self.normalization(inputs))

    def score_candidates(self, inputs, candidates):
        """``scorer.score_candidates`` of the normalised inputs."""
        return self.scorer.score_candidates(self.normalization(inputs),
                                            candidates)

    def shortlist(self, inputs, k: int):
        """``scorer.shortlist`` of the normalised inputs."""
        return self.scorer.shortlist(self.normalization(inputs), k)

    @property
    def can_shortlist(self) -> bool:
        """Whether the wrapped scorer has a ``shortlist``."""
        return hasattr(self.scorer, "shortlist")

    def compute_output_shape(self, input_shape):
        return self.scorer.compute_output_shape(input_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            scorer=keras.saving.serialize_keras_object(self.scorer),
            normalization=keras.saving.serialize_keras_object(
                self.normalization))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("scorer", "normalization"):
            config[key] = keras.saving.deserialize_keras_object(config[key])
        return cls(**config)


def _can_shortlist(scorer) -> bool:
    return getattr(scorer, "can_shortlist", hasattr(scorer, "shortlist"))


@keras.saving.register_keras_serializable(package="xmc_tf")
class FusedScores(keras.layers.Layer):
    """``network(x) + sum_i weights[i] * scorers[i](x)``, decoded by
    shortlist and re-rank.

    ``call`` gives the exact fused scores of every label (the SavedModel's
    ``score_all_labels``).  :meth:`top_k` (prediction, evaluation, the
    ``serve`` signature: :mod:`xmc_tf.decoding` uses it) ranks the same
    sum over a shortlist: the union of the ``shortlist[i]`` best labels of
    each scorer ``i`` with ``shortlist[i] > 0`` (its ``shortlist(x, k)``:
    the label tree's beam search, the neighbours' most voted labels), each
    scored by the network (:func:`candidate_scorer`) and by every scorer
    (``score_candidates``).  A label no scorer shortlists is not ranked (a
    miss, not an approximation of its score); with every ``shortlist[i] =
    0`` the top k is taken from the exact scores of every label.

    Build it where the scorers are fitted (e.g. by :mod:`xmc_tf.job`) and
    wrap it as ``keras.Model(x, FusedScores(...)(x))``, optionally behind
    single-input layers (the feature normalisation): such a model decodes
    by shortlist; nested in a larger model (an ensemble's average) it is
    decoded from its exact scores.

    Args:
      network: a functional Keras model ``[batch, D] -> [batch, m]`` (the
        trained network).
      scorers: label scorer layers on the same features, each ``call``
        ``-> [batch, m]`` and ``score_candidates(x, ids) -> [batch, C]``;
        the shortlisters also ``shortlist(x, k) -> (ids [batch, k],
        scores)``.
      weights: one float ``>= 0`` per scorer (0: a shortlisting scorer
        only shortlists).
      shortlist: one int ``>= 0`` per scorer, the labels it shortlists
        per instance (0: it only re-ranks); None: all 0.
      **kwargs: base layer arguments (``name``...).

    Input shape:
      ``tf.SparseTensor`` float32 ``[batch, D]`` (or dense, as the network
      and the scorers take it).

    Output shape:
      float32 ``[batch, m]``.

    Raises:
      ValueError: lists of different lengths, a negative weight or size, a
        shortlisting scorer without ``shortlist``.
    """

    def __init__(self, network, scorers=(), weights=(), shortlist=None,
                 **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        scorers = list(scorers)
        weights = [float(w) for w in weights]
        shortlist = ([0] * len(scorers) if shortlist is None
                     else [int(k) for k in shortlist])
        if len(weights) != len(scorers) or len(shortlist) != len(scorers):
            raise ValueError(f"{len(scorers)} scorers need as many weights "
                             f"and shortlist sizes, got {len(weights)} and "
                             f"{len(shortlist)}")
        if any(not w >= 0 for w in weights) or any(k < 0 for k in shortlist):
            raise ValueError(f"weights and shortlist sizes must be >= 0, got "
                             f"{weights} and {shortlist}")
        for scorer, k in zip(scorers, shortlist):
            if k and not _can_shortlist(scorer):
                raise ValueError(f"{scorer.name} cannot shortlist (it has no "
                                 "shortlist method)")
        self.network = network
        self.scorers = scorers
        self.fusion_weights = weights
        self.shortlist_sizes = shortlist
        self._network_scorer = None

    @property
    def num_labels(self) -> int:
        """m, the network's output width."""
        return int(self.network.outputs[0].shape[-1])

    @property
    def shortlists(self) -> bool:
        """Whether :meth:`top_k` ranks a shortlist (some size > 0)."""
        return any(self.shortlist_sizes)

    def build(self, input_shape):
        for scorer in self.scorers:
            if not scorer.built:
                scorer.build(input_shape)
        self._network_scorer = candidate_scorer(self.network)
        super().build(input_shape)

    def call(self, inputs):
        x = inputs
        out = tf.cast(self.network(x, training=False), tf.float32)
        for scorer, weight in zip(self.scorers, self.fusion_weights):
            if weight:
                out = out + weight * tf.cast(scorer(x), tf.float32)
        return out

    def candidates(self, inputs, min_width: int = 1):
        """The shortlist of each row: int32 ``[batch, K]``, distinct label
        ids ascending, then -1 (:func:`merge_shortlists` of the
        shortlisting scorers' labels; ``K >= min_width``).

        Raises:
          ValueError: no scorer shortlists (:attr:`shortlists` False).
        """
        if not self.shortlists:
            raise ValueError("no scorer of this FusedScores shortlists")
        x = inputs
        return self._candidates(x, min_width)

    def _candidates(self, x, min_width):
        parts = [scorer.shortlist(x, k)[0]
                 for scorer, k in zip(self.scorers, self.shortlist_sizes)
                 if k]
        return merge_shortlists(parts, min_width)

    def shortlist_sources(self, inputs, min_width: int = 1):
        """:meth:`candidates` and where each label came from: ``(ids int32
        [batch, K], {scorer name: bool [batch, K]})``, True where that
        scorer shortlisted the label (so a reader can rank the shortlist a
        subset of the scorers would make).

        Raises:
          ValueError: no scorer shortlists.
        """
        if not self.shortlists:
            raise ValueError("no scorer of this FusedScores shortlists")
        x = inputs
        own = {scorer.name: tf.cast(scorer.shortlist(x, k)[0], tf.int32)
               for scorer, k in zip(self.scorers, self.shortlist_sizes) if k}
        ids = merge_shortlists(list(own.values()), min_width)
        big = tf.int32.max
        sources = {}
        for name, part in own.items():
            part = tf.sort(tf.where(part < 0, big, part), axis=1)
            pos = tf.searchsorted(part, ids, side="left")
            pos = tf.minimum(pos, tf.shape(part)[1] - 1)
            sources[name] = (ids >= 0) & tf.equal(
                tf.gather(part, pos, batch_dims=1), ids)
        return ids, sources

    def component_scores(self, inputs, ids, weighted_only: bool = False,
                         network: bool = True):
        """Each part's scores at ``ids`` (int ``[batch, C]``, -1 padding):
        ``[network, scorer 0, scorer 1, ...]``, float32 ``[batch, C]`` each
        (0 at padding); with ``weighted_only`` the scorers at weight 0 are
        None, without ``network`` the network's (from
        :func:`candidate_scorer`) are None and not computed."""
        return self._components(inputs, ids, weighted_only, network)

    def _components(self, x, ids, weighted_only, network=True):
        ids = tf.cast(ids, tf.int32)
        valid = ids >= 0
        safe = tf.maximum(ids, 0)
        if network and self._network_scorer is None:  # called before build
            self._network_scorer = candidate_scorer(self.network)
        parts = [self._network_scorer(x, safe) if network else None]
        for scorer, weight in zip(self.scorers, self.fusion_weights):
            if weighted_only and not weight:
                parts.append(None)
                continue
            parts.append(tf.cast(scorer.score_candidates(x, safe),
                                 tf.float32))
        return [None if p is None else tf.where(valid, p, 0.0) for p in parts]

    def score_candidates(self, inputs, candidates):
        """The fused scores at ``candidates`` (int ``[batch, C]``; -1:
        padding, scored -inf): float32 ``[batch, C]``."""
        return self._fused(inputs, candidates)

    def _fused(self, x, ids):
        parts = self._components(x, ids, weighted_only=True)
        total = parts[0]
        for part, weight in zip(parts[1:], self.fusion_weights):
            if part is not None:
                total = total + weight * part
        return tf.where(tf.cast(ids, tf.int32) >= 0, total, float("-inf"))

    def top_k(self, inputs, k: int):
        """The ``k`` best labels of each row: ``(ids int32 [batch, k],
        scores float32 [batch, k])``, best first (ties: the lower label
        id), by shortlist and re-rank when :attr:`shortlists` (-1 / -inf
        where the shortlist holds fewer than ``k`` labels), else from the
        exact scores of every label.

        Raises:
          ValueError: ``k`` outside ``[1, num_labels]``.
        """
        k = int(k)
        if not 1 <= k <= self.num_labels:
            raise ValueError(f"k={k} must be in [1, num_labels="
                             f"{self.num_labels}]")
        if not self.shortlists:
            top = select_top_k(self.call(inputs), k)
            return top.indices, top.values
        x = inputs
        ids = self._candidates(x, k)
        scores = self._fused(x, ids)
        # ids ascend along a row, so top_k's ties (lower position) are the
        # lower label id, as on the full scores.
        top = tf.math.top_k(scores, k=k)
        best = tf.gather(ids, top.indices, batch_dims=1)
        return (tf.where(tf.math.is_inf(top.values) & (top.values < 0), -1,
                         best), top.values)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.num_labels)

    def get_config(self):
        config = super().get_config()
        serialize = keras.saving.serialize_keras_object
        config.update(
            network=serialize(self.network),
            scorers=[serialize(s) for s in self.scorers],
            weights=list(self.fusion_weights),
            shortlist=list(self.shortlist_sizes))
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        deserialize = keras.saving.deserialize_keras_object
        config["network"] = deserialize(config["network"])
        config["scorers"] = [deserialize(s) for s in config["scorers"]]
        return cls(**config)
