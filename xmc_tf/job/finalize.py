"""Finalize phase of the main job: what is added to the trained network
before it is evaluated and exported -- the label tree fused with its scores
(:mod:`xmc_tf.job.tree`), the labels' nearest-centroid scores
(:func:`xmc_tf.layers.label_centroids`), the nearest training instances'
votes (:class:`xmc_tf.layers.NearestNeighbourScores`) and the feature
normalisation in front (:mod:`xmc_tf.job.preprocessing`), so the exported
model takes raw features.

Sources: the label tree is a one-vs-rest tree of linear classifiers in the
manner of Parabel / Bonsai (Prabhu et al., WWW 2018; Khandagale et al.,
2019); the centroids are the labels' PIFA vectors (Parabel; PECOS, Yu et
al. JMLR 2022) scored as a nearest-centroid classifier (Snell et al.,
Prototypical Networks, NeurIPS 2017); the votes are a kNN classifier
(SiameseXML, Dahiya et al. ICML 2021); each is fused with the network's
scores by a weight read on validation.
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf
from absl import logging

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.metrics import evaluator as xevaluation
from xmc_tf.shortlist import tree as xlabel_tree
from xmc_tf.job import preprocessing as xprep
from xmc_tf.job.inputs import subset
from xmc_tf.job.plan import fusion_weight, label_tree_plan, tree_weight
from xmc_tf.layers import (FeatureNormalization, NearestNeighbourScores,
                            label_centroids)
from xmc_tf.layers.label_tree import (LabelTreeScores, fuse_scores,
                                      fuse_with_tree)
from xmc_tf.job.workdir import Workdir
from xmc_tf.samplers.registry import auto_bool
from xmc_tf.files import atomic_path

__all__ = ["LABEL_TREE_FILE", "CENTROID_WEIGHTS", "NEIGHBOUR_WEIGHTS",
           "MULTI_CLASS_TREE_WEIGHTS", "FUSION_VALIDATION_ROWS",
           "FUSION_SHORTLIST", "FUSION_ROUNDS", "FUSED_MONITOR",
           "NETWORK_MONITOR", "FusionScores", "FusionPlan",
           "FusedValidation", "choose_fusion_weights", "prepare_fusion",
           "tree_validation_blocks", "finalize"]

#: The weights of the nearest-centroid scores that :func:`finalize` tries
#: (0: the model alone).  The centroid scores are cosines in [-1, 1]; a
#: network's scores are logits (softmax, SCENT) or margins near [-1, 1]
#: (squared hinge), hence the wide range.
CENTROID_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
                    128.0, 256.0)
#: The weights of the nearest-neighbour votes that :func:`finalize` tries
#: (0: the model alone); a vote sums up to ``config.neighbours.k`` squared
#: cosines.
NEIGHBOUR_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
                     128.0, 256.0)
#: The weights of the label tree's log-scores that :func:`finalize` tries on
#: multi-class data (0: the model alone): there the network's scores are
#: softmax logits, whose spread is tens of units, where on multi-label data
#: they are sigmoid logits or margins
#: (:data:`xmc_tf.job.tree.FUSION_WEIGHTS`).
MULTI_CLASS_TREE_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: At most this many validation instances are scored, once, to choose the
#: fusion weights (every scorer ranks all labels of each).
FUSION_VALIDATION_ROWS = 8192
#: Labels kept per validation instance and scorer (:class:`FusionScores`).
FUSION_SHORTLIST = 100
#: At most this many rounds of choosing each fusion weight given the others
#: (coordinate ascent on the validation P@k).
FUSION_ROUNDS = 4

#: The fitted tree, kept in the backup directory until the export is done.
LABEL_TREE_FILE = "label_tree.npz"


def tree_validation_blocks(model, tree_layer, val_data, batch_size: int,
                           max_rows: int | None = None):
    """Yields ``(deep scores, tree log-scores, labels)`` per block of
    ``val_data`` (normalised): NumPy ``[b, m]`` float32 twice and the
    ``scipy.sparse`` labels, as
    :func:`xmc_tf.job.tree.choose_fusion_weight` takes them; ``b`` is
    ``batch_size`` capped by :func:`xmc_tf.metrics.evaluator.score_batch_size`.
    ``tree_layer`` may be any scorer of the normalised features (the label
    centroids too); ``max_rows``: only the first ones (None: all)."""
    batch = xevaluation.score_batch_size(batch_size, model)
    rows = val_data.num_instances
    if max_rows is not None:
        rows = min(rows, max_rows)
    for start in range(0, rows, batch):
        part = subset(val_data, np.arange(start, min(start + batch, rows)))
        x = next(iter(xdata.make_tf_dataset(part, part.num_instances)))[0]
        yield (model(x, training=False).numpy(), tree_layer(x).numpy(),
               part.labels)


def _load_tree(path: str, fit_data):
    """The tree saved at ``path`` and its fit seconds, or ``(None, None)``
    when there is none or it was fit on data of another shape."""
    if not os.path.exists(path):
        return None, None
    with np.load(path) as saved:
        tree = xlabel_tree.LabelTree.from_arrays(saved)
        fit_seconds = float(saved["fit_seconds"])
    if (tree.num_features, tree.num_labels) != (fit_data.num_features,
                                                fit_data.num_labels):
        return None, None
    logging.info("label tree: reloaded %s (fit in %.1f s)", path, fit_seconds)
    return tree, fit_seconds


def _fit_tree(config, path: str, fit_data):
    """Fits the tree on the (normalised) fit split, saves it at ``path``
    and returns it with its fit seconds (progress logged every 10 s)."""
    tc = config.tree
    start = time.time()
    last = [start]

    def progress(line):
        if time.time() - last[0] >= 10:
            last[0] = time.time()
            logging.info(line)
    tree = xlabel_tree.fit_label_tree(
        fit_data.features, fit_data.labels, leaf_size=tc.leaf_size,
        c=float(tc.c), tol=float(tc.tol), threshold=float(tc.threshold),
        seed=config.seed, progress=progress)
    fit_seconds = time.time() - start
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, fit_seconds=fit_seconds, **tree.to_arrays())
    return tree, fit_seconds


def _idf_scorer(fit_data, build, prefix: str):
    """A model ``"idf_<prefix>"``: a :class:`~xmc_tf.layers.FeatureNormalization`
    ``"tfidf"`` (named ``"<prefix>_idf"``; the fit split's idf) weights
    each row by the idf and renormalises it, then the layer ``build``
    makes of the fit split's rows weighted the same way."""
    weighted, idf_values = xdata.normalize_features(fit_data.features,
                                                    "tfidf")
    layer = build(weighted)
    inputs = keras.Input(shape=(fit_data.num_features,), sparse=True,
                         name="features")
    norm = FeatureNormalization(fit_data.num_features, "tfidf",
                                idf=idf_values, name=f"{prefix}_idf")
    return keras.Model(inputs, layer(norm(inputs)), name=f"idf_{prefix}s")


def _centroid_scorer(fit_data, fan_in: int, seed, idf: bool):
    """The labels' centroid scorer of the normalised features: the
    :func:`xmc_tf.layers.label_centroids` layer (named
    ``"label_centroids"``) of the fit split's rows, or with ``idf`` the
    model ``"idf_centroids"`` of :func:`_idf_scorer` around it (the rare
    features a few-shot label is recognised by weigh more)."""
    def build(rows):
        return label_centroids(rows, fit_data.labels, fan_in, seed=seed,
                               name="label_centroids")
    return (_idf_scorer(fit_data, build, "centroid") if idf
            else build(fit_data.features))


def _neighbour_scorer(fit_data, k: int, power: float, idf: bool):
    """The nearest-neighbour scorer of the normalised features: a
    :class:`xmc_tf.layers.NearestNeighbourScores` (named
    ``"label_neighbours"``) of the fit split's rows, or with ``idf`` the
    model ``"idf_neighbours"`` of :func:`_idf_scorer` around it."""
    def build(rows):
        return NearestNeighbourScores.from_data(
            rows, fit_data.labels, neighbours=k, power=power,
            name="label_neighbours")
    return (_idf_scorer(fit_data, build, "neighbour") if idf
            else build(fit_data.features))


def _top_ids(scores, t: int):
    """int64 ``[b, t]``: the ids of each row's ``t`` highest scores, in no
    order (``tf.math.top_k``: several times NumPy's ``argpartition`` at
    10^5 labels)."""
    return tf.math.top_k(np.asarray(scores, np.float32), k=t,
                         sorted=False).indices.numpy().astype(np.int64)


def _hits(labels, ids):
    """bool ``[b, w]``: ``labels[i, ids[i, j]] != 0``."""
    look = sp.csr_matrix(labels)[np.arange(ids.shape[0])[:, None], ids]
    return (look.toarray() if sp.issparse(look) else np.asarray(look)) != 0


class FusionScores:
    """Several scorers' scores of the same validation instances, kept at a
    shortlist of labels per instance, to rank any weighted sum of them.

    The shortlist of an instance is the union of each scorer's top
    ``shortlist`` labels; a weighted sum (weights ``>= 0``) is ranked among
    those labels.  For the top ``k <= shortlist`` of a sum of one scorer
    this is exact; for a mix it misses only a label outside every scorer's
    top ``shortlist`` that the sum would put in its top ``k``.  One pass
    over the validation instances then serves every weight tried
    (Astec / DeepXML score a shortlist the same way: Dahiya et al., WSDM
    2021, Sec. 3).

    Memory: ``(scorers + 2) x rows x scorers x shortlist`` values.

    Args:
      ids: int64 ``[n, w]`` label ids per instance (sorted; repeats masked).
      valid: bool ``[n, w]``, False at repeats.
      hits: bool ``[n, w]``, the label is a positive of the instance.
      scores: ``{name: float32 [n, w]}``, each scorer's scores at ``ids``.
      floors: ``{name: float32 [n]}``, each scorer's lowest shortlisted
        score per instance (:meth:`with_scorer`), or None.
      labels: ``scipy.sparse`` ``[n, m]``, the instances' labels, or None.
    """

    def __init__(self, ids, valid, hits, scores: dict, floors=None,
                 labels=None):
        self.ids, self.valid, self.hits = ids, valid, hits
        self.scores = scores
        self.floors, self.labels = floors, labels

    @property
    def num_instances(self) -> int:
        return int(self.ids.shape[0])

    @classmethod
    def collect(cls, blocks, shortlist: int = FUSION_SHORTLIST
                ) -> "FusionScores":
        """Reads ``blocks``: an iterable of ``(scores, labels)`` per block of
        instances, ``scores`` ``{name: float [b, m]}`` (the same names in
        every block) and ``labels`` ``scipy.sparse`` ``[b, m]``.

        Raises:
          ValueError: no blocks, no scorers, or shapes that disagree.
        """
        parts = []
        for scores, labels in blocks:
            y = sp.csr_matrix(labels)
            if not scores:
                raise ValueError("no scorers to fuse")
            arrays = {name: np.asarray(s) for name, s in sorted(scores.items())}
            for name, s in arrays.items():
                if s.shape != y.shape:
                    raise ValueError(f"scorer {name!r} gave {s.shape}, the "
                                     f"labels are {y.shape}")
            t = min(int(shortlist), y.shape[1])
            tops = {name: _top_ids(s, t) for name, s in arrays.items()}
            ids = np.sort(np.concatenate(list(tops.values()), axis=1), axis=1)
            valid = np.ones(ids.shape, bool)
            valid[:, 1:] = ids[:, 1:] != ids[:, :-1]
            parts.append((ids, valid, _hits(y, ids),
                          {name: np.take_along_axis(s, ids, 1).astype(
                              np.float32) for name, s in arrays.items()},
                          {name: np.take_along_axis(s, tops[name], 1).min(
                              axis=1).astype(np.float32)
                           for name, s in arrays.items()}, y))
        if not parts:
            raise ValueError("no validation instances to choose the weights "
                             "on")
        names = list(parts[0][3])
        if any(list(p[3]) != names for p in parts):
            raise ValueError("every block must hold the same scorers")
        return cls(np.concatenate([p[0] for p in parts]),
                   np.concatenate([p[1] for p in parts]),
                   np.concatenate([p[2] for p in parts]),
                   {n: np.concatenate([p[3][n] for p in parts])
                    for n in names},
                   floors={n: np.concatenate([p[4][n] for p in parts])
                           for n in names},
                   labels=sp.vstack([p[5] for p in parts], format="csr"))

    def with_scorer(self, name: str, blocks,
                    shortlist: int = FUSION_SHORTLIST) -> "FusionScores":
        """These scores and one more scorer's, of the same instances.

        The instances' shortlists grow by the new scorer's top
        ``shortlist`` labels.  The new scorer's scores are exact at every
        label; a scorer held here keeps its exact score at every label of
        the held shortlists, and at a label only the new scorer
        shortlisted takes its lowest shortlisted score of that instance
        (an upper bound of the score it would have there).  So the other
        scorers are scored once and a scorer that changes (the network,
        from epoch to epoch) is added in one pass of its own.

        Args:
          name: the new scorer's name (not one held here).
          blocks: an iterable of its float ``[b, m]`` scores of these
            instances, in order, in blocks of any size.
          shortlist: its labels kept per instance.

        Returns:
          A new :class:`FusionScores`.

        Raises:
          ValueError: ``name`` is held already, this object was not made
            by :meth:`collect`, or the blocks do not cover the instances.
        """
        if name in self.scores:
            raise ValueError(f"scorer {name!r} is held already")
        if self.labels is None or self.floors is None:
            raise ValueError("with_scorer needs scores made by collect")
        parts, start, width = [], 0, self.ids.shape[1]
        for block in blocks:
            s = np.asarray(block)
            stop = start + s.shape[0]
            if stop > self.num_instances or s.shape[1] != self.labels.shape[1]:
                raise ValueError(f"scorer {name!r} gave {s.shape} at instance "
                                 f"{start}; {self.num_instances} instances "
                                 f"of {self.labels.shape[1]} labels are held")
            rows = slice(start, stop)
            top = _top_ids(s, min(int(shortlist), s.shape[1]))
            both = np.concatenate([self.ids[rows], top], axis=1)
            # stable: a label held already keeps its own (exact) column
            order = np.argsort(both, axis=1, kind="stable")
            ids = np.take_along_axis(both, order, 1)
            valid = np.ones(ids.shape, bool)
            valid[:, 1:] = ids[:, 1:] != ids[:, :-1]
            held = order < width
            column = np.minimum(order, width - 1)
            scores = {n: np.where(held, np.take_along_axis(v[rows], column, 1),
                                  self.floors[n][rows, None])
                      for n, v in self.scores.items()}
            scores[name] = np.take_along_axis(s, ids, 1).astype(np.float32)
            floor = np.take_along_axis(s, top, 1).min(axis=1).astype(
                np.float32)
            parts.append((ids, valid, _hits(self.labels[rows], ids), scores,
                          floor))
            start = stop
        if start != self.num_instances:
            raise ValueError(f"scorer {name!r} scored {start} of the "
                             f"{self.num_instances} instances")
        names = list(self.scores) + [name]
        floors = dict(self.floors)
        floors[name] = np.concatenate([p[4] for p in parts])
        return FusionScores(np.concatenate([p[0] for p in parts]),
                            np.concatenate([p[1] for p in parts]),
                            np.concatenate([p[2] for p in parts]),
                            {n: np.concatenate([p[3][n] for p in parts])
                             for n in names},
                            floors=floors, labels=self.labels)

    def precision(self, weights: dict, ks) -> dict:
        """``{k: P@k in percent}`` of ``sum of weights[name] *
        scores[name]`` (names absent or at weight 0 left out)."""
        ks = tuple(int(k) for k in ks)
        fused = np.zeros(self.ids.shape, np.float32)
        for name, w in weights.items():
            if w:
                fused += np.float32(w) * self.scores[name]
        fused = np.where(self.valid, fused, -np.inf)
        top_k = min(max(ks), fused.shape[1])
        top = np.argpartition(-fused, top_k - 1, axis=1)[:, :top_k]
        order = np.argsort(-np.take_along_axis(fused, top, 1), axis=1,
                           kind="stable")
        top = np.take_along_axis(top, order, 1)
        hits = np.take_along_axis(self.hits, top, 1)
        n = max(self.num_instances, 1)
        return {k: 100.0 * float(hits[:, :k].sum()) / (k * n) for k in ks}

    def choose(self, base: dict, name: str, candidates, ks):
        """The weight ``a`` of ``base + a * scores[name]`` with the best
        mean P@k over ``ks`` (ties: the smaller weight).

        Returns:
          ``(weight, {weight: {k: P@k}})``.
        """
        table = {float(a): self.precision({**base, name: float(a)}, ks)
                 for a in candidates}
        best = max(table, key=lambda a: (np.mean(list(table[a].values())),
                                          -a))
        return best, table


def _fusion_blocks(scorers: dict, rows, batch_size: int):
    """Yields ``({name: scorer scores...}, labels)`` per block of the
    instances ``rows`` (normalised features), as
    :meth:`FusionScores.collect` reads them; a block holds ``len(scorers)``
    float32 ``[b, m]`` arrays within twice
    :data:`xmc_tf.metrics.evaluator.SCORE_BLOCK_BYTES` in all."""
    per_row = 4 * rows.num_labels * max(len(scorers), 1)
    batch = max(1, min(int(batch_size),
                       2 * xevaluation.SCORE_BLOCK_BYTES // per_row))
    start_time = last = time.time()
    for start in range(0, rows.num_instances, batch):
        part = subset(rows, np.arange(start, min(start + batch,
                                                 rows.num_instances)))
        x = next(iter(xdata.make_tf_dataset(part, part.num_instances)))[0]
        scores = {name: np.asarray(scorer(x))
                  for name, scorer in scorers.items()}
        if time.time() - last >= 30:
            last = time.time()
            logging.info("fusion weights: scored %d / %d validation "
                         "instances (%.0f s)", start, rows.num_instances,
                         last - start_time)
        yield scores, part.labels


def _network_blocks(model, rows, batch_size: int):
    """Yields the network's float32 ``[b, m]`` scores of ``rows``
    (normalised features), block by block
    (:func:`xmc_tf.metrics.evaluator.score_batch_size`)."""
    batch = xevaluation.score_batch_size(batch_size, model)
    for start in range(0, rows.num_instances, batch):
        part = subset(rows, np.arange(start, min(start + batch,
                                                 rows.num_instances)))
        x = next(iter(xdata.make_tf_dataset(part, part.num_instances)))[0]
        yield model(x, training=False).numpy()


def _table_json(table: dict) -> dict:
    return {str(a): {f"P@{k}": round(v, 2) for k, v in row.items()}
            for a, row in table.items()}


def _log_choice(what: str, weight: float, table: dict) -> None:
    ks = "/".join(f"P@{k}" for k in next(iter(table.values())))
    line = {a: "/".join(f"{v:.2f}" for v in row.values())
            for a, row in table.items()}
    logging.info("%s: weight %s, validation %s %s (weight 0: %s; every "
                 "weight's in metrics.json)", what, weight, ks, line[weight],
                 line.get(0.0, "-"))


def _label_tree(config, wd: Workdir, head, fit_data, val_data,
                sparse_input: bool, multi_class: bool):
    """The label tree's layer, fit (or reloaded from the backup directory)
    when the plan turns it on (:func:`xmc_tf.job.plan.label_tree_plan`):
    ``(layer or None, info, fit seconds)``."""
    enabled, why = label_tree_plan(
        config, head, fit_data.num_labels, sparse_input, val_data is not None,
        multi_class)
    if enabled and val_data is None and tree_weight(config.tree.weight) is None:
        enabled, why = False, ("config.tree.weight='auto' and the validation "
                               "split is empty")
    logging.info("label tree: %s (%s)", "on" if enabled else "off", why)
    if not enabled:
        return None, {}, 0.0
    path = os.path.join(wd.backup_dir, LABEL_TREE_FILE)
    tree, fit_seconds = _load_tree(path, fit_data)
    if tree is None:
        tree, fit_seconds = _fit_tree(config, path, fit_data)
    layer = LabelTreeScores.from_tree(tree, name="label_tree")
    info = {"columns": tree.num_columns, "weights": int(tree.weights.nnz),
            "depth": int(tree.paths.shape[1]),
            "bytes": xlabel_tree.label_tree_bytes(tree),
            "fit_seconds": round(fit_seconds, 2)}
    logging.info("label tree: %d classifiers, %d weights (%.1f MiB), depth "
                 "%d, %.1f s", info["columns"], info["weights"],
                 info["bytes"] / 2**20, info["depth"], fit_seconds)
    return layer, info, fit_seconds


def _variants(section, field: str, weight):
    """The idf variants to build: ``(False, True)`` for ``idf="auto"`` with
    the weight read on validation, else the one the config names (the
    plain one for "auto" at a fixed weight)."""
    idf = auto_bool(section.get("idf", "auto"), f"config.{field}.idf")
    if idf is None:
        return (False, True) if weight is None else (False,)
    return (bool(idf),)


def choose_fusion_weights(fusion, parts, fixed: dict, ks,
                          max_rounds: int = FUSION_ROUNDS):
    """Each scorer's weight (and variant) by coordinate ascent on the
    validation P@k of ``deep + sum of weight * scorer``.

    Args:
      fusion: a :class:`FusionScores` holding ``"deep"`` and every scorer
        named in ``parts`` (None when every weight is fixed).
      parts: ``[(part, [(scorer name, idf)...], candidate weights)]`` in
        fusion order; a part's variants are its scorers (``idf`` None,
        True or False).
      fixed: ``{part: weight or None}``; None is read here.
      ks: the P@k cut-offs averaged.
      max_rounds: at most this many rounds.

    Returns:
      ``(chosen, tables, variants, rounds)``: ``chosen`` ``{part: (scorer
      name, idf, weight)}``; ``tables`` ``{part: {weight: {k: P@k}}}`` of
      the part's chosen variant given the others, from the last round that
      read it; ``variants`` ``{part: {"plain"/"idf": {"weight",
      "mean_P@k"}}}`` for parts with idf variants; ``rounds`` run.  The
      first round reads each part given the ones before it (the later ones
      at 0); each further round reads each given all the others, until a
      round changes nothing.
    """
    chosen = {part: (*variants[0], fixed[part] or 0.0)
              for part, variants, _ in parts}
    tables, variant_tables, rounds = {}, {}, 0
    while fusion is not None and rounds < max_rounds:
        rounds += 1
        changed = False
        for part, variants, grid in parts:
            if fixed[part] is not None:
                continue
            base = {"deep": 1.0}
            base.update({n: w for p, (n, _, w) in chosen.items()
                         if p != part})
            best, read = None, {}
            for name, idf in variants:
                w, table = fusion.choose(base, name, grid, ks)
                mean = float(np.mean(list(table[w].values())))
                if idf is not None:
                    read["idf" if idf else "plain"] = {
                        "weight": float(w), "mean_P@k": round(mean, 2)}
                if best is None or mean > best[0]:  # ties: the first
                    best = (mean, name, idf, w, table)
            _, name, idf, weight, tables[part] = best
            changed |= (name, weight) != (chosen[part][0], chosen[part][2])
            chosen[part] = (name, idf, weight)
            if read:
                variant_tables[part] = read
        if not changed:
            break
    return chosen, tables, variant_tables, rounds


class FusionPlan:
    """The scorers fused with the network and what reading their weights
    on validation needs, made by :func:`prepare_fusion` (before training
    when the fused model's validation P@k drives it, else after).

    Attributes:
      scorers: ``{name: scorer of the normalised features}``: ``"tree"``,
        ``"centroids"``, ``"centroids_idf"``, ``"neighbours"``,
        ``"neighbours_idf"`` (those on).
      parts: ``[(section, [(scorer name, idf)...], candidate weights)]`` in
        fusion order (``"label_tree"``, ``"centroids"``, ``"neighbours"``).
      fixed: ``{section: weight or None}`` (None: read on validation).
      info: ``{section: dict}`` for ``metrics.json``.
      tree_layer: the label tree's :class:`LabelTreeScores`, or None.
      others: a :class:`FusionScores` of every scorer (the network too when
        :func:`prepare_fusion` was given it) on the first
        :data:`FUSION_VALIDATION_ROWS` validation instances, or
        None when no weight is read (nothing to fuse, every weight fixed,
        or no validation instances).
      rows: those validation instances (:class:`xmc_tf.data.XCDataset`,
        normalised), or None.
      seconds: seconds :func:`prepare_fusion` took (the tree's fit, the
        scorers' construction, the one pass of the scorers).
    """

    def __init__(self, scorers, parts, fixed, info, tree_layer, others, rows,
                 seconds):
        self.scorers, self.parts, self.fixed = scorers, parts, fixed
        self.info, self.tree_layer = info, tree_layer
        self.others, self.rows, self.seconds = others, rows, seconds

    @property
    def reads_weights(self) -> bool:
        """Whether some weight is read on validation instances."""
        return self.others is not None

    def fusion_scores(self, model, batch_size: int) -> FusionScores:
        """``others`` with the network ``model``'s scores (named
        ``"deep"``) of the same instances: one pass of the network
        (:meth:`FusionScores.with_scorer`), or ``others`` itself when
        it holds the network's scores already."""
        if "deep" in self.others.scores:
            return self.others
        return self.others.with_scorer(
            "deep", _network_blocks(model, self.rows, batch_size))

    def choose(self, fusion, ks):
        """:func:`choose_fusion_weights` of these parts on ``fusion``."""
        return choose_fusion_weights(fusion, self.parts, self.fixed, ks)


def prepare_fusion(config, wd: Workdir, head, fit_data, val_data,
                   sparse_input: bool, network=None) -> FusionPlan:
    """The scorers :func:`finalize` fuses with the network, built from the
    fit split (normalised), and their scores of the validation instances
    the weights are read on.

    * The label tree (:mod:`xmc_tf.job.tree`, ``config.tree``) is fit and
      saved in the backup directory, so a run killed later reloads it.
    * The centroids (:func:`xmc_tf.layers.label_centroids`,
      ``config.centroids``) are the labels' PIFA rows of the fit split,
      ``config.centroids.connections`` features each.
    * The neighbour votes (:class:`xmc_tf.layers.NearestNeighbourScores`,
      ``config.neighbours``) hold the fit split's rows.
    * Centroids and neighbours come as they are or over rows weighted by
      the fit split's idf once more (``idf``; "auto": both are read on
      validation and the better kept, ties the plain one).

    When a weight is left "auto" and validation instances exist, every
    scorer scores the first :data:`FUSION_VALIDATION_ROWS` of them once
    (``FusionPlan.others``).  A trained ``network`` (Keras model of
    the normalised features) is scored in the same pass, as ``"deep"``, so
    every score there is exact; without it the network is added per read
    by :meth:`FusionPlan.fusion_scores`.

    Returns:
      A :class:`FusionPlan`.
    """
    start = time.time()
    multi_class = xconfig.is_multi_class(fit_data.labels)
    tree_layer, tree_info, _ = _label_tree(
        config, wd, head, fit_data, val_data, sparse_input, multi_class)
    scorers, fixed, info, groups = {}, {}, {}, {}
    if tree_layer is not None:
        scorers["tree"] = tree_layer
        groups["label_tree"] = [("tree", None)]
        fixed["label_tree"] = tree_weight(config.tree.weight)
        info["label_tree"] = tree_info
    cc = config.get("centroids")
    if cc is not None and auto_bool(cc.enabled,
                                    "config.centroids.enabled") is True:
        t0 = time.time()
        fan_in = min(int(cc.connections), fit_data.num_features)
        weight = fusion_weight(cc.weight, "config.centroids.weight")
        groups["centroids"] = []
        for idf in _variants(cc, "centroids", weight):
            name = "centroids_idf" if idf else "centroids"
            scorers[name] = _centroid_scorer(fit_data, fan_in, config.seed,
                                             idf)
            groups["centroids"].append((name, idf))
        fixed["centroids"] = weight
        info["centroids"] = {"connections": fan_in,
                             "bytes": 8 * fit_data.num_labels * fan_in,
                             "build_seconds": round(time.time() - t0, 2)}
    nc = config.get("neighbours")
    if nc is not None and auto_bool(nc.enabled,
                                    "config.neighbours.enabled") is True:
        t0 = time.time()
        weight = fusion_weight(nc.weight, "config.neighbours.weight")
        groups["neighbours"] = []
        for idf in _variants(nc, "neighbours", weight):
            name = "neighbours_idf" if idf else "neighbours"
            scorers[name] = _neighbour_scorer(fit_data, int(nc.k),
                                              float(nc.power), idf)
            groups["neighbours"].append((name, idf))
        fixed["neighbours"] = weight
        x = sp.csr_matrix(fit_data.features)
        info["neighbours"] = {
            "k": int(nc.k), "power": float(nc.power),
            "bytes": int(8 * (fit_data.num_features + x.shape[0])
                         + 8 * x.nnz + 4 * fit_data.labels.nnz),
            "build_seconds": round(time.time() - t0, 2)}
    others = rows = None
    if val_data is None or not val_data.num_instances:
        for part, weight in fixed.items():
            if weight is None:  # "auto" with nothing to read it on
                logging.info("%s: weight 0 (no validation instances to "
                             "read it on)", part)
                fixed[part] = 0.0
    elif any(w is None for w in fixed.values()):
        t0 = time.time()
        rows = subset(val_data, np.arange(min(val_data.num_instances,
                                              FUSION_VALIDATION_ROWS)))
        scoring = dict(scorers)
        if network is not None:
            scoring["deep"] = lambda x: network(x, training=False)
        others = FusionScores.collect(_fusion_blocks(
            scoring, rows, config.eval.batch_size))
        logging.info("fusion weights: %d validation instances scored by %s "
                     "in %.1f s", others.num_instances, ", ".join(scoring),
                     time.time() - t0)
    # (section, [(scorer name, idf)], candidate weights), in fusion order
    parts = []
    if tree_layer is not None:
        parts.append(("label_tree", groups["label_tree"],
                      MULTI_CLASS_TREE_WEIGHTS if multi_class
                      else xlabel_tree.FUSION_WEIGHTS))
    for section, grid in (("centroids", CENTROID_WEIGHTS),
                          ("neighbours", NEIGHBOUR_WEIGHTS)):
        if section in groups:
            parts.append((section, groups[section], grid))
    return FusionPlan(scorers, parts, fixed, info, tree_layer, others, rows,
                      time.time() - start)


#: The log key of :class:`FusedValidation`: the fused model's mean
#: validation P@k (a fraction in [0, 1], as the network's
#: ``val_precision_at_k``; ``config.train.min_delta`` is in its units) at
#: the weights read on the same instances.
FUSED_MONITOR = "val_fused_precision"
#: The log key of the network alone's mean P@k on those instances.
NETWORK_MONITOR = "val_network_precision"


class FusedValidation(keras.callbacks.Callback):
    """Reads the fused model's validation P@k at every epoch end.

    The model exported is the network fused with the label tree, the
    centroids and the votes (:func:`finalize`), so that is what the LR
    schedule and early stopping should follow: once the other scorers
    carry the few-shot labels, epochs that lift the network alone can
    leave the fused model where it was.  At each epoch end the network
    scores the plan's validation instances (the other scorers' scores were
    taken once, :func:`prepare_fusion`), the fusion weights are chosen on
    them as :func:`finalize` will (:func:`choose_fusion_weights`), and the
    mean P@k over ``ks`` (a fraction) of the fused model at those weights
    is logged as :data:`FUSED_MONITOR` (that of the network alone as
    :data:`NETWORK_MONITOR`).  Source: early stopping on a held-out score
    of the model that is kept (Prechelt, "Early Stopping -- But When?",
    1998).

    Args:
      plan: a :class:`FusionPlan` that reads weights
        (:attr:`FusionPlan.reads_weights`).
      model: the network (inference model; the callback's own
        ``self.model`` may be a training wrapper).
      ks: the P@k cut-offs averaged (``config.eval.ks``).
      batch_size: instances per block of the network's pass.

    Raises:
      ValueError: the plan reads no weight.
    """

    def __init__(self, plan: FusionPlan, model, ks, batch_size: int):
        super().__init__()
        if not plan.reads_weights:
            raise ValueError("FusedValidation needs a FusionPlan that reads "
                             "weights on validation instances")
        self.plan, self.network = plan, model
        self.ks, self.batch_size = tuple(int(k) for k in ks), int(batch_size)

    def on_epoch_end(self, epoch, logs=None):
        start = time.time()
        fusion = self.plan.fusion_scores(self.network, self.batch_size)
        chosen, _, _, _ = self.plan.choose(fusion, self.ks)
        weights = {"deep": 1.0}
        weights.update({name: w for name, _, w in chosen.values()})
        fused = fusion.precision(weights, self.ks)
        alone = fusion.precision({"deep": 1.0}, self.ks)
        if logs is not None:  # fractions, as Keras' P@k metrics
            logs[FUSED_MONITOR] = float(np.mean(list(fused.values()))) / 100
            logs[NETWORK_MONITOR] = float(np.mean(list(alone.values()))) / 100
        logging.info(
            "epoch %d: fused validation %s %s (network alone %s) at %s, "
            "%d instances, %.1f s", epoch + 1,
            "/".join(f"P@{k}" for k in self.ks),
            "/".join(f"{v:.2f}" for v in fused.values()),
            "/".join(f"{v:.2f}" for v in alone.values()),
            ", ".join(f"{n} x{w:g}" for n, _, w in chosen.values()),
            fusion.num_instances, time.time() - start)


def finalize(config, wd: Workdir, head, model, fit_data, val_data,
             sparse_input: bool, norm, plan: FusionPlan | None = None):
    """The model to evaluate and export: ``model`` fused with the label
    tree, the label centroids and the nearest-neighbour votes (each where
    the plan turns it on), behind the feature normalisation ``norm``
    (:func:`xmc_tf.job.preprocessing.with_normalization`).

    The scorers come from ``plan`` (:func:`prepare_fusion`; made here when
    None).  Weights left "auto" are read on the plan's validation
    instances (at most :data:`FUSION_VALIDATION_ROWS`; the network's
    scores added to the others', :meth:`FusionPlan.fusion_scores`) by
    coordinate ascent: the tree's weight (candidates
    :data:`MULTI_CLASS_TREE_WEIGHTS` on multi-class data, else
    :data:`xmc_tf.job.tree.FUSION_WEIGHTS`), then the centroids'
    (:data:`CENTROID_WEIGHTS`, and their variant) given it, then the
    neighbours' (:data:`NEIGHBOUR_WEIGHTS`) given both, each the best mean
    validation P@k over ``config.eval.ks`` given the others (ties: the
    smaller weight, the plain variant); then again each given the others,
    until a round changes nothing (at most :data:`FUSION_ROUNDS` rounds;
    a scorer helpful alone can become redundant once a later one is in).
    A part at weight 0 is left out of the exported model.

    Returns:
      ``(exported_model, info, seconds)``: ``info`` holds ``"label_tree"``,
      ``"centroids"`` and ``"neighbours"`` (each when on; with
      ``"weight"`` and, when read on validation, ``"validation"``: P@k per
      weight, given the others' final weights) and ``"fusion"`` (when
      weights were read: the validation instances scored, the rounds, the
      seconds of the plan and this call) for ``metrics.json``;
      ``seconds``: the plan's (``FusionPlan.seconds``) and this call's,
      for ``train_seconds``.
    """
    if plan is None:
        plan = prepare_fusion(config, wd, head, fit_data, val_data,
                              sparse_input, network=model)
    start = time.time()
    info = {section: dict(part) for section, part in plan.info.items()}
    fusion = (plan.fusion_scores(model, config.eval.batch_size)
              if plan.reads_weights else None)
    ks = tuple(config.eval.ks)
    current, rounds = {}, 0
    if plan.parts:
        current, tables, variants, rounds = plan.choose(fusion, ks)
        for section, table in tables.items():
            info[section]["validation"] = _table_json(table)
        for section, table in variants.items():
            info[section]["variants"] = table
    if fusion is not None:
        info["fusion"] = {"validation_instances": fusion.num_instances,
                          "rounds": rounds}
    exported = model
    for section, _, _ in plan.parts:
        name, idf, weight = current[section]
        part = info[section]
        part["weight"] = float(weight)
        what = {"label_tree": "label tree", "centroids": "label centroids",
                "neighbours": "neighbour votes"}[section]
        if idf is not None:
            part["idf"] = bool(idf)
            what += " of idf-weighted rows" if idf else ""
        if "validation" in part:
            table = {float(a): {int(k[2:]): v for k, v in row.items()}
                     for a, row in part["validation"].items()}
            _log_choice(what, float(weight), table)
        if not weight:
            continue
        if section == "label_tree":
            exported = fuse_with_tree(exported, plan.tree_layer,
                                      float(weight))
        else:
            exported = fuse_scores(
                exported, plan.scorers[name], float(weight),
                name={"centroids": "centroid_fused",
                      "neighbours": "neighbour_fused"}[section],
                weight_name={"centroids": "centroid_weight",
                             "neighbours": "neighbour_weight"}[section])
    seconds = plan.seconds + time.time() - start
    if fusion is not None:
        info["fusion"]["seconds"] = round(seconds, 2)
    return xprep.with_normalization(exported, norm), info, seconds
