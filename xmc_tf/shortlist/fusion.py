"""Fusion weights read on shortlists: the P@k of weighted sums of scorers
over each instance's shortlist, and the coordinate ascent that chooses the
weights.

A fused model ranks ``network + sum_i w_i * scorer_i`` over a shortlist of
labels per instance (:class:`xmc_tf.layers.FusedScores`).  Its weights are
read on validation instances: every part scores every label of the
instances' shortlists once (:class:`ShortlistScores`), after which the P@k
of any weighted sum is a NumPy reduction over ``[instances, shortlist]``
arrays (:meth:`ShortlistScores.precision`), so a whole grid of weights
costs no second pass of any scorer.  A positive outside the shortlist is a
miss at every weight (no upper bound on what the full ranking would give).

:func:`choose_fusion_weights` reads each part's weight (and variant) in
turn given the others, the first round in the parts' order, later rounds
given all the others, until a round changes nothing (coordinate ascent on
the validation P@k).  Sources: Astec / DeepXML (Dahiya et al., WSDM 2021,
Sec. 3: scorers re-rank a shortlist); coordinate ascent for ranking
feature weights (Metzler & Croft, Information Retrieval 2007).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.ops.pairs import merge_shortlists

__all__ = ["NETWORK", "FusionPart", "FusionChoice", "ShortlistScores",
           "choose_fusion_weights", "shortlist_blocks", "exact_blocks"]

#: The name of the network's scores in :class:`ShortlistScores` (weight 1).
NETWORK = "network"


def _hits(labels, ids):
    """bool ``[b, w]``: ``labels[i, ids[i, j]] != 0`` (False at ids < 0)."""
    y = sp.csr_matrix(labels)
    safe = np.maximum(ids, 0)
    look = y[np.arange(ids.shape[0])[:, None], safe]
    dense = (look.toarray() if sp.issparse(look) else np.asarray(look)) != 0
    return dense & (ids >= 0)


def _top_positions(scores, k: int):
    """int ``[n, k]``: each row's ``k`` largest entries, best first, ties
    to the lower position (``tf.math.top_k``, as
    :meth:`xmc_tf.layers.FusedScores.top_k` ranks a shortlist)."""
    if k <= 0 or scores.shape[0] == 0:
        return np.zeros((scores.shape[0], 0), np.int64)
    return tf.math.top_k(scores, k=k).indices.numpy().astype(np.int64)


def _pad(a, width, value):
    if a.shape[1] >= width:
        return a
    return np.pad(a, [(0, 0), (0, width - a.shape[1])], constant_values=value)


class ShortlistScores:
    """Several scorers' scores of the labels of the same instances'
    shortlists, and the positives among those labels.

    Memory: ``(parts + 2) x instances x width`` values.

    Args:
      ids: int ``[n, w]`` label ids per instance (-1: padding).
      hits: bool ``[n, w]``, the label is a positive of the instance.
      scores: ``{name: float32 [n, w]}`` (0 at padding).
      positives: int ``[n]``, each instance's positives (the denominators
        of recall; None: the hits').
      sources: None, or ``{name: bool [n, w]}``: which scorer shortlisted
        each label.  A weighted sum is then ranked over the labels the
        sources it names shortlisted (:meth:`shortlisted`), or over all
        when it names none.

    Raises:
      ValueError: shapes that disagree.
    """

    def __init__(self, ids, hits, scores: dict, positives=None,
                 sources=None):
        self.ids = np.asarray(ids, np.int64)
        self.hits = np.asarray(hits, bool)
        self.scores = {k: np.asarray(v, np.float32) for k, v in scores.items()}
        self.sources = ({k: np.asarray(v, bool) for k, v in sources.items()}
                        if sources else None)
        shape = self.ids.shape
        arrays = list(self.scores.values()) + list((self.sources or {}).values())
        if self.hits.shape != shape or any(v.shape != shape for v in arrays):
            raise ValueError(f"ids {shape}, hits {self.hits.shape}, scores and "
                             "sources must have one shape")
        self.positives = (np.asarray(positives, np.int64)
                          if positives is not None else self.hits.sum(1))
        self._shortlisted = {}  # named sources -> their mask

    @property
    def num_instances(self) -> int:
        return int(self.ids.shape[0])

    @property
    def width(self) -> int:
        """Labels per shortlist (padded)."""
        return int(self.ids.shape[1])

    @classmethod
    def collect(cls, blocks) -> "ShortlistScores":
        """Reads ``blocks``: an iterable of ``(ids, {name: scores}, labels,
        sources)`` per block of instances -- int ``[b, w]`` shortlists (-1
        padding; widths may differ between blocks), float ``[b, w]`` scores
        (the same names in every block), ``scipy.sparse`` ``[b, m]`` labels
        and ``{name: bool [b, w]}`` sources or None (the same in every
        block).

        Raises:
          ValueError: no blocks, or blocks that disagree.
        """
        parts = []
        for ids, scores, labels, sources in blocks:
            ids = np.asarray(ids, np.int64)
            y = sp.csr_matrix(labels)
            if y.shape[0] != ids.shape[0]:
                raise ValueError(f"{ids.shape[0]} shortlists for "
                                 f"{y.shape[0]} instances")
            parts.append((ids, {k: np.asarray(v, np.float32)
                                for k, v in scores.items()},
                          _hits(y, ids), np.diff(y.indptr), sources or {}))
        if not parts:
            raise ValueError("no instances to read the fusion weights on")
        names = sorted(parts[0][1])
        kinds = sorted(parts[0][4])
        if any(sorted(p[1]) != names or sorted(p[4]) != kinds for p in parts):
            raise ValueError("every block must hold the same scorers and "
                             "sources")
        width = max(p[0].shape[1] for p in parts)

        def stack(i, key, value):
            return np.concatenate([_pad(p[i][key] if key else p[i], width,
                                        value) for p in parts])
        return cls(stack(0, None, -1), stack(2, None, False),
                   {n: stack(1, n, 0.0) for n in names},
                   positives=np.concatenate([p[3] for p in parts]),
                   sources={n: stack(4, n, False) for n in kinds})

    def with_scores(self, name: str, blocks) -> "ShortlistScores":
        """These scores with ``name``'s (added, or replaced) from ``blocks``:
        float ``[b, w']`` scores of the same shortlists in order, in blocks
        of any size (``w' <= width``; the rest is padding).  The network's
        scores after each epoch are added this way: the other scorers are
        scored once.

        Raises:
          ValueError: the blocks do not cover the instances.
        """
        parts, start = [], 0
        for block in blocks:
            s = np.asarray(block, np.float32)
            if s.shape[1] > self.width or start + s.shape[0] > self.num_instances:
                raise ValueError(f"scores {s.shape} at instance {start} do not "
                                 f"fit {self.num_instances} x {self.width}")
            parts.append(_pad(s, self.width, 0.0))
            start += s.shape[0]
        if start != self.num_instances:
            raise ValueError(f"{name!r} scored {start} of the "
                             f"{self.num_instances} instances")
        scores = dict(self.scores)
        scores[name] = np.where(self.ids >= 0, np.concatenate(parts), 0.0)
        return ShortlistScores(self.ids, self.hits, scores, self.positives,
                               self.sources)

    def shortlisted(self, weights: dict):
        """bool ``[n, w]``: the labels the sum ``weights`` ranks: those the
        sources it names shortlisted (at any weight, 0 included: a
        shortlisting part of a fused model shortlists whatever its
        weight), or every label held when it names none or there are no
        sources."""
        weighted = tuple(sorted(n for n in weights
                                if self.sources and n in self.sources))
        if weighted not in self._shortlisted:
            valid = self.ids >= 0
            self._shortlisted[weighted] = (valid & np.logical_or.reduce(
                [self.sources[n] for n in weighted]) if weighted else valid)
        return self._shortlisted[weighted]

    def recall(self, weights: dict | None = None) -> float:
        """The fraction of the instances' positives in their shortlists
        (recall@width, in percent): all of them, or those ``weights``
        ranks (:meth:`shortlisted`)."""
        total = int(self.positives.sum())
        held = self.hits if weights is None else (
            self.hits & self.shortlisted(weights))
        return 100.0 * float(held.sum()) / max(total, 1)

    def precision(self, weights: dict, ks) -> dict:
        """``{k: P@k in percent}`` of ``sum of weights[name] *
        scores[name]`` ranked over the shortlist :meth:`shortlisted` gives
        (ties: the earlier position); a positive outside it is a miss.

        Raises:
          KeyError: a weighted name without scores.
        """
        return self._precision(self._sum(weights), weights, ks)

    def _sum(self, weights: dict, skip: str | None = None):
        fused = np.zeros(self.ids.shape, np.float32)
        for name, w in weights.items():
            if w and name != skip:
                fused += np.float32(w) * self.scores[name]
        return fused

    def _precision(self, fused, weights: dict, ks) -> dict:
        """P@k of the summed scores ``fused`` (changed in place) of the sum
        ``weights``."""
        ks = tuple(int(k) for k in ks)
        np.copyto(fused, np.float32(-np.inf),
                  where=~self.shortlisted(weights))
        top = _top_positions(fused, min(max(ks), fused.shape[1]))
        hits = np.take_along_axis(self.hits, top, 1)
        n = max(self.num_instances, 1)
        return {k: 100.0 * float(hits[:, :k].sum()) / (k * n) for k in ks}

    def choose(self, base: dict, name: str, candidates, ks):
        """The weight ``a`` of ``base + a * scores[name]`` with the best
        mean P@k over ``ks`` (ties: the smaller weight).

        Returns:
          ``(weight, {weight: {k: P@k}})``.
        """
        rest = self._sum(base, skip=name)
        table = {}
        for a in candidates:
            weights = {**base, name: float(a)}
            fused = rest + np.float32(a) * self.scores[name] if a else (
                rest.copy())
            table[float(a)] = self._precision(fused, weights, ks)
        best = max(table, key=lambda a: (np.mean(list(table[a].values())),
                                          -a))
        return best, table


def shortlist_blocks(fused, batches):
    """The blocks of :meth:`ShortlistScores.collect` of a
    :class:`xmc_tf.layers.FusedScores` that shortlists: per ``(x, labels)``
    of ``batches`` (features as the layer takes them, ``scipy.sparse``
    labels), the merged shortlist with its sources
    (:meth:`~xmc_tf.layers.FusedScores.shortlist_sources`) and each
    scorer's scores of it (not the network's: add them with
    :meth:`ShortlistScores.with_scores`)."""
    names = [s.name for s in fused.scorers]
    for x, labels in batches:
        ids, sources = fused.shortlist_sources(x)
        scores = fused.component_scores(x, ids, network=False)[1:]
        yield (ids.numpy(), {n: s.numpy() for n, s in zip(names, scores)},
               labels, {n: v.numpy() for n, v in sources.items()})


def exact_blocks(fused, batches, top: int = 100):
    """The blocks of :meth:`ShortlistScores.collect` without a shortlist:
    per ``(x, labels)`` of ``batches``, each part's (the network's, as
    :data:`NETWORK`, and every scorer's of the
    :class:`xmc_tf.layers.FusedScores` ``fused``) exact scores of the union
    of their ``top`` best labels.  For the top ``k <= top`` of one part
    this is its exact ranking; for a weighted sum it misses only a label
    outside every part's ``top`` that the sum would rank in its top
    ``k``.  Cost: every part's ``[batch, num_labels]`` scores."""
    parts = [(NETWORK, fused.network)] + [(s.name, s) for s in fused.scorers]
    for x, labels in batches:
        full = {name: tf.cast(layer(x), tf.float32) for name, layer in parts}
        keep = min(int(top), fused.num_labels)
        ids = merge_shortlists([tf.math.top_k(s, keep, sorted=False).indices
                                for s in full.values()])
        safe = tf.maximum(ids, 0)
        yield (ids.numpy(),
               {n: tf.where(ids >= 0, tf.gather(s, safe, batch_dims=1),
                            0.0).numpy() for n, s in full.items()},
               labels, None)


@dataclasses.dataclass(frozen=True)
class FusionPart:
    """One part of a fused model whose weight is read (or fixed).

    Attributes:
      name: the part (e.g. ``"label_tree"``).
      variants: the scorer names it may use (e.g. the plain and the idf
        centroids); the first is kept at a tie.
      grid: the candidate weights (0: the part left out).
      weight: a fixed weight, or None to read it.
    """

    name: str
    variants: tuple
    grid: tuple
    weight: float | None = None


@dataclasses.dataclass
class FusionChoice:
    """What :func:`choose_fusion_weights` chose.

    Attributes:
      scorer: ``{part: scorer name}``, each part's variant.
      weight: ``{part: weight}``.
      tables: ``{part: {weight: {k: P@k}}}`` of the chosen variant given
        the others, from the last round that read the part.
      variants: ``{part: {scorer name: {"weight", "mean_P@k"}}}`` for
        parts with several variants.
      rounds: rounds run.
    """

    scorer: dict
    weight: dict
    tables: dict
    variants: dict
    rounds: int

    def weights(self) -> dict:
        """``{scorer name: weight}`` of the fused sum, the network at 1."""
        out = {NETWORK: 1.0}
        for part, name in self.scorer.items():
            out[name] = self.weight[part]
        return out


def choose_fusion_weights(scores: ShortlistScores | None, parts, ks,
                          max_rounds: int = 4) -> FusionChoice:
    """Each part's weight and variant by coordinate ascent on the mean P@k
    over ``ks`` of ``network + sum of weight * scorer``.

    The first round reads each part given the ones before it (the later
    ones at 0); each further round reads each given all the others, until
    a round changes nothing or ``max_rounds`` ran.  Ties: the smaller
    weight, the earlier variant.

    Args:
      scores: a :class:`ShortlistScores` holding :data:`NETWORK` and every
        variant of the parts whose weight is read (None when every weight
        is fixed).
      parts: :class:`FusionPart` s in fusion order.
      ks: the P@k cut-offs averaged.
      max_rounds: at most this many rounds (>= 1).

    Returns:
      A :class:`FusionChoice`.
    """
    scorer = {p.name: p.variants[0] for p in parts}
    weight = {p.name: float(p.weight or 0.0) for p in parts}
    tables, variant_tables, rounds = {}, {}, 0
    readable = [p for p in parts if p.weight is None]
    while scores is not None and readable and rounds < max_rounds:
        rounds += 1
        changed = False
        for part in readable:
            base = {NETWORK: 1.0}
            base.update({scorer[o.name]: weight[o.name] for o in parts
                         if o.name != part.name})
            best, read = None, {}
            for name in part.variants:
                w, table = scores.choose(base, name, part.grid, ks)
                mean = float(np.mean(list(table[w].values())))
                read[name] = {"weight": float(w), "mean_P@k": round(mean, 2)}
                if best is None or mean > best[0]:  # ties: the first
                    best = (mean, name, w, table)
            _, name, w, tables[part.name] = best
            changed |= (name, w) != (scorer[part.name], weight[part.name])
            scorer[part.name], weight[part.name] = name, float(w)
            if len(part.variants) > 1:
                variant_tables[part.name] = read
        if not changed:
            break
    return FusionChoice(scorer, weight, tables, variant_tables, rounds)
