"""Finalize phase of the main job: what is added to the trained network
before it is evaluated and exported -- the label tree fused with its scores
(:mod:`xmc_tf.job.tree`), the labels' nearest-centroid scores
(:func:`xmc_tf.layers.label_centroids`) and the feature normalisation in
front (:mod:`xmc_tf.job.preprocessing`), so the exported model takes raw
features.

Sources: the label tree is a one-vs-rest tree of linear classifiers in the
manner of Parabel / Bonsai (Prabhu et al., WWW 2018; Khandagale et al.,
2019); the centroids are the labels' PIFA vectors (Parabel; PECOS, Yu et
al. JMLR 2022) scored as a nearest-centroid classifier (Snell et al.,
Prototypical Networks, NeurIPS 2017); each is fused with the network's
scores by a weight read on validation.
"""

from __future__ import annotations

import os
import time

import keras
import numpy as np
from absl import logging

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.metrics import evaluator as xevaluation
from xmc_tf.job import tree as xlabel_tree
from xmc_tf.job import preprocessing as xprep
from xmc_tf.job.inputs import subset
from xmc_tf.job.plan import fusion_weight, label_tree_plan, tree_weight
from xmc_tf.layers import FeatureNormalization, label_centroids
from xmc_tf.layers.label_tree import (LabelTreeScores, fuse_scores,
                                      fuse_with_tree)
from xmc_tf.job.workdir import Workdir
from xmc_tf.samplers.registry import auto_bool
from xmc_tf.files import atomic_path

__all__ = ["LABEL_TREE_FILE", "CENTROID_WEIGHTS", "CENTROID_VALIDATION_ROWS",
           "MULTI_CLASS_TREE_WEIGHTS", "TREE_VALIDATION_ROWS",
           "tree_validation_blocks", "attach_label_tree", "attach_centroids",
           "finalize"]

#: The weights of the nearest-centroid scores that
#: :func:`attach_centroids` tries (0: the model alone).  The centroid scores
#: are cosines in [-1, 1]; a network's scores are logits (softmax, SCENT)
#: or margins near [-1, 1] (squared hinge), hence the wide range.
CENTROID_WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0)
#: At most this many validation instances are scored to choose the
#: centroids' weight (each weight ranks all labels of every instance).
CENTROID_VALIDATION_ROWS = 8192

#: The weights of the label tree's log-scores that :func:`attach_label_tree`
#: tries on multi-class data (0: the model alone): there the network's
#: scores are softmax logits, whose spread is tens of units, where on
#: multi-label data they are sigmoid logits or margins
#: (:data:`xmc_tf.job.tree.FUSION_WEIGHTS`).
MULTI_CLASS_TREE_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)
#: At most this many validation instances are scored to choose the tree's
#: weight (the tree scores every label of every instance).
TREE_VALIDATION_ROWS = 8192

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


def _fusion_weight(config, model, layer, val_data, info: dict,
                   multi_class: bool) -> float:
    """``config.tree.weight``, or (``"auto"``) the weight whose fused
    scores give the best validation P@k on at most
    :data:`TREE_VALIDATION_ROWS` instances
    (:func:`xmc_tf.job.tree.choose_fusion_weight`; candidates
    :data:`MULTI_CLASS_TREE_WEIGHTS` on multi-class data, else
    :data:`xmc_tf.job.tree.FUSION_WEIGHTS`), its table recorded in
    ``info["validation"]``."""
    weight = tree_weight(config.tree.weight)
    if weight is not None:
        return weight
    weight, table = xlabel_tree.choose_fusion_weight(
        tree_validation_blocks(model, layer, val_data, config.eval.batch_size,
                               max_rows=TREE_VALIDATION_ROWS),
        ks=tuple(config.eval.ks),
        weights=(MULTI_CLASS_TREE_WEIGHTS if multi_class
                 else xlabel_tree.FUSION_WEIGHTS))
    info["validation"] = {str(a): {f"P@{k}": round(v, 2)
                                   for k, v in row.items()}
                          for a, row in table.items()}
    # The best weight and the deep model alone on one short line; the whole
    # table (8 weights) is in metrics.json ("label_tree" -> "validation").
    ks = "/".join(f"P@{k}" for k in next(iter(table.values())))
    line = {a: "/".join(f"{v:.2f}" for v in row.values())
            for a, row in table.items()}
    logging.info("label tree: weight %s, validation %s %s (weight 0: %s; "
                 "every weight's in metrics.json)", weight, ks, line[weight],
                 line.get(0.0, "-"))
    return weight


def attach_label_tree(config, wd: Workdir, head, model, fit_data, val_data,
                      sparse_input: bool):
    """Fits (or reloads) the label tree and fuses it with ``model``.

    The tree is fit on the (normalised) fit split and saved in the backup
    directory, so a run killed during evaluation or export reloads it; its
    weight is read on the validation split (``config.tree.weight="auto"``:
    :func:`xmc_tf.job.tree.choose_fusion_weight`).

    Returns:
      ``(model_to_export, info, seconds)``: ``model`` itself when the tree
      is off or its weight is 0, else
      :func:`xmc_tf.layers.label_tree.fuse_with_tree` of it; ``info`` is the
      dict for ``metrics.json`` (``{}`` when off; ``fit_seconds``: the fit's,
      also after a reload); ``seconds``: the fit's plus this call's weight
      choice, for ``train_seconds``.
    """
    multi_class = xconfig.is_multi_class(fit_data.labels)
    enabled, why = label_tree_plan(
        config, head, fit_data.num_labels, sparse_input, val_data is not None,
        multi_class)
    if enabled and val_data is None and tree_weight(config.tree.weight) is None:
        enabled, why = False, ("config.tree.weight='auto' and the validation "
                               "split is empty")
    logging.info("label tree: %s (%s)", "on" if enabled else "off", why)
    if not enabled:
        return model, {}, 0.0
    path = os.path.join(wd.backup_dir, LABEL_TREE_FILE)
    tree, fit_seconds = _load_tree(path, fit_data)
    if tree is None:
        tree, fit_seconds = _fit_tree(config, path, fit_data)
    choose_start = time.time()
    layer = LabelTreeScores.from_tree(tree, name="label_tree")
    info = {"columns": tree.num_columns, "weights": int(tree.weights.nnz),
            "depth": int(tree.paths.shape[1]),
            "bytes": xlabel_tree.label_tree_bytes(tree),
            "fit_seconds": round(fit_seconds, 2)}
    weight = _fusion_weight(config, model, layer, val_data, info,
                            multi_class)
    info["weight"] = float(weight)
    logging.info("label tree: %d classifiers, %d weights (%.1f MiB), depth "
                 "%d, %.1f s", info["columns"], info["weights"],
                 info["bytes"] / 2**20, info["depth"], fit_seconds)
    seconds = fit_seconds + (time.time() - choose_start)
    if not weight:
        return model, info, seconds
    return fuse_with_tree(model, layer, float(weight)), info, seconds


def _centroid_scorer(fit_data, fan_in: int, seed, idf: bool):
    """The labels' centroid scorer of the normalised features: the
    :func:`xmc_tf.layers.label_centroids` layer (named
    ``"label_centroids"``) of the fit split's rows, or with ``idf`` a model
    ``"idf_centroids"`` whose :class:`~xmc_tf.layers.FeatureNormalization`
    ``"tfidf"`` (the fit split's idf, :func:`xmc_tf.data.normalize_features`)
    weights each row by the idf and renormalises it before that layer, built
    on the rows weighted the same way."""
    if not idf:
        return label_centroids(fit_data.features, fit_data.labels, fan_in,
                               seed=seed, name="label_centroids")
    weighted, idf_values = xdata.normalize_features(fit_data.features,
                                                    "tfidf")
    layer = label_centroids(weighted, fit_data.labels, fan_in, seed=seed,
                            name="label_centroids")
    inputs = keras.Input(shape=(fit_data.num_features,), sparse=True,
                         name="features")
    norm = FeatureNormalization(fit_data.num_features, "tfidf",
                                idf=idf_values, name="centroid_idf")
    return keras.Model(inputs, layer(norm(inputs)), name="idf_centroids")


def attach_centroids(config, model, fit_data, val_data):
    """Adds the labels' nearest-centroid scores to ``model``'s when
    ``config.centroids.enabled`` (resolved by the plan:
    :func:`xmc_tf.job.plan.centroid_plan`) is True.

    The centroids are the labels' PIFA rows of the (normalised) fit split,
    ``config.centroids.connections`` features each
    (:func:`xmc_tf.layers.label_centroids`, seed ``config.seed``: the same
    layer on a resume), of the rows as they are or, with
    ``config.centroids.idf``, of the rows weighted by the fit split's idf
    once more (the scorer then weights its input the same way): this
    favours the rare features a few-shot label is recognised by, which
    helps on some data sets and not on others (docs/notes/tail.md), so
    ``"auto"`` builds both.  The weight is ``config.centroids.weight`` or
    (``"auto"``) the one of :data:`CENTROID_WEIGHTS` whose fused scores give
    the best mean validation P@k over ``config.eval.ks`` on at most
    :data:`CENTROID_VALIDATION_ROWS` validation instances
    (:func:`xmc_tf.job.tree.choose_fusion_weight`); with ``idf="auto"``
    the variant with the better best mean is kept (ties: the plain one),
    and at a fixed weight the plain one.

    Returns:
      ``(model_to_export, info, seconds)``: ``model`` itself when off or
      at weight 0, else :func:`xmc_tf.layers.fuse_scores` of it (named
      ``"centroid_fused"``); ``info`` for ``metrics.json`` (``{}`` when
      off; ``"idf"``: the variant kept, ``"validation"``: its table of
      validation P@k per weight, ``"variants"``: each variant's best weight
      and mean P@k when both were read); ``seconds`` spent, for
      ``train_seconds``.
    """
    cc = config.get("centroids")
    if cc is None or auto_bool(cc.enabled,
                               "config.centroids.enabled") is not True:
        return model, {}, 0.0
    start = time.time()
    fan_in = min(int(cc.connections), fit_data.num_features)
    info = {"connections": fan_in,
            "bytes": 8 * fit_data.num_labels * fan_in}
    weight = fusion_weight(cc.weight, "config.centroids.weight")
    idf = auto_bool(cc.get("idf", "auto"), "config.centroids.idf")
    if idf is None:
        variants = (False, True) if weight is None else (False,)
    else:
        variants = (idf,)
    if weight is None:
        best = None
        info["variants"] = {}
        for variant in variants:
            scorer = _centroid_scorer(fit_data, fan_in, config.seed, variant)
            chosen, table = xlabel_tree.choose_fusion_weight(
                tree_validation_blocks(model, scorer, val_data,
                                       config.eval.batch_size,
                                       max_rows=CENTROID_VALIDATION_ROWS),
                ks=tuple(config.eval.ks), weights=CENTROID_WEIGHTS)
            mean = float(np.mean(list(table[chosen].values())))
            info["variants"]["idf" if variant else "plain"] = {
                "weight": float(chosen), "mean_P@k": round(mean, 2)}
            if best is None or mean > best[0]:
                best = (mean, variant, chosen, table, scorer)
        _, idf, weight, table, scorer = best
        info["validation"] = {str(a): {f"P@{k}": round(v, 2)
                                       for k, v in row.items()}
                              for a, row in table.items()}
        top = table[weight]
        logging.info("label centroids%s: weight %s (validation P@%d %.2f; "
                     "%.2f at weight 0)", " of idf-weighted rows" if idf
                     else "", weight, min(top), top[min(top)],
                     table[0.0][min(top)])
    else:
        idf = variants[0]
        scorer = _centroid_scorer(fit_data, fan_in, config.seed, idf)
    info["idf"] = bool(idf)
    info["weight"] = float(weight)
    seconds = time.time() - start
    info["seconds"] = round(seconds, 2)
    if not weight:
        return model, info, seconds
    return (fuse_scores(model, scorer, float(weight), name="centroid_fused",
                        weight_name="centroid_weight"), info, seconds)


def finalize(config, wd: Workdir, head, model, fit_data, val_data,
             sparse_input: bool, norm):
    """The model to evaluate and export: ``model`` fused with the label
    tree (:func:`attach_label_tree`) and the label centroids
    (:func:`attach_centroids`), behind the feature normalisation ``norm``
    (:func:`xmc_tf.job.preprocessing.with_normalization`).

    Returns:
      ``(exported_model, info, seconds)``: ``info`` holds ``"label_tree"``
      and ``"centroids"`` (each when on) for ``metrics.json``; ``seconds``
      is their fit and weight choice, for ``train_seconds``.
    """
    scorer, tree_info, tree_seconds = attach_label_tree(
        config, wd, head, model, fit_data, val_data, sparse_input)
    scorer, centroid_info, centroid_seconds = attach_centroids(
        config, scorer, fit_data, val_data)
    info = {}
    if tree_info:
        info["label_tree"] = tree_info
    if centroid_info:
        info["centroids"] = centroid_info
    return (xprep.with_normalization(scorer, norm), info,
            tree_seconds + centroid_seconds)
