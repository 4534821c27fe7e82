"""The label tree as a fused scorer (``config.tree``): a Parabel-style tree
of linear rankers (:func:`xmc_tf.shortlist.fit_label_tree`) fit on the fit
split, fused as its path log-scores and shortlisting by beam search
(:class:`xmc_tf.layers.LabelTreeScores`).

Sources: Prabhu et al., "Parabel" (WWW 2018), Sec. 3 (the tree, its
squared-hinge probabilities) and Sec. 3.3 (beam search); Omikuji's
defaults (C = 1, tolerance 0.1, leaves of 100 labels, beam 10).
"""

from __future__ import annotations

import os
import time

import numpy as np
from absl import logging

from xmc_tf.files import atomic_path
from xmc_tf.job.scorers.base import (BuiltScorer, FusedScorer, Variant,
                                     register)
from xmc_tf.config import check_int, check_nonnegative
from xmc_tf.layers import LabelTreeScores
from xmc_tf.shortlist import (LabelTree, fit_centroid_tree, fit_label_tree,
                              label_tree_bytes)

__all__ = ["LabelTreeScorer", "LABEL_TREE_FILE", "MULTI_LABEL_WEIGHTS",
           "MULTI_CLASS_WEIGHTS", "RANKERS"]

#: The fitted tree, kept in the backup directory until the export is done.
LABEL_TREE_FILE = "label_tree.npz"
#: The tree's weights tried on multi-label data (0: the network alone):
#: the network's scores are sigmoid logits or squared-hinge margins.
MULTI_LABEL_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)
#: ... on multi-class data, where the network's scores are softmax logits,
#: whose spread is tens of units.
MULTI_CLASS_WEIGHTS = (0.0, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0)


def _load(path: str, fit_data):
    """The tree saved at ``path`` and its fit seconds, or ``(None, None)``
    when there is none or it was fit on data of another shape."""
    if not os.path.exists(path):
        return None, None
    with np.load(path) as saved:
        tree = LabelTree.from_arrays(saved)
        fit_seconds = float(saved["fit_seconds"])
    if (tree.num_features, tree.num_labels) != (fit_data.num_features,
                                                fit_data.num_labels):
        return None, None
    logging.info("label tree: reloaded %s (fit in %.1f s)", path, fit_seconds)
    return tree, fit_seconds


def _fit(config, path: str, fit_data):
    """Fits the tree on the (normalised) fit split with the config's
    rankers, saves it at ``path`` and returns it with its fit seconds
    (progress logged every 10 s)."""
    tc = config.tree
    start = time.time()
    last = [start]

    def progress(line):
        if time.time() - last[0] >= 10:
            last[0] = time.time()
            logging.info(line)
    if tc.get("rankers", "linear") == "centroids":
        tree = fit_centroid_tree(fit_data.features, fit_data.labels,
                                 leaf_size=tc.leaf_size, seed=config.seed,
                                 progress=progress)
    else:
        tree = fit_label_tree(
            fit_data.features, fit_data.labels, leaf_size=tc.leaf_size,
            c=float(tc.c), tol=float(tc.tol), threshold=float(tc.threshold),
            seed=config.seed, progress=progress)
    fit_seconds = time.time() - start
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, fit_seconds=fit_seconds, **tree.to_arrays())
    return tree, fit_seconds


#: The values of ``config.tree.rankers``.
RANKERS = ("auto", "linear", "centroids")


def _limit_field(summary) -> str:
    return "max_classes" if summary.multi_class else "max_labels"


def _noun(summary) -> str:
    return "classes" if summary.multi_class else "labels"


def _linear_fits(section, summary) -> bool:
    """Whether liblinear rankers are within the config's limits."""
    return summary.num_labels <= section.get(_limit_field(summary), 0)


def _rankers(config, summary, head, has_validation):
    """``config.tree.rankers="auto"``: linear rankers up to
    ``max_labels`` labels (multi-label) / ``max_classes`` classes, the
    labels' centroids above (no training: at 670k labels one liblinear
    solve per label would cost more than the network)."""
    del head, has_validation
    section = config.tree
    if _linear_fits(section, summary):
        return "linear", (f"{summary.num_labels} {_noun(summary)} <= "
                          f"config.tree.{_limit_field(summary)}")
    return "centroids", (f"{summary.num_labels} {_noun(summary)} > "
                         f"config.tree.{_limit_field(summary)}: one solve "
                         "per label costs too much")


@register
class LabelTreeScorer(FusedScorer):
    """``config.tree``: on for sparse input, a head that scores every label
    and a validation split to read its weight on, with linear rankers up
    to ``config.tree.max_labels`` labels on multi-label data (one liblinear
    solve per label: time grows with m) and ``config.tree.max_classes`` on
    multi-class data (one solve per leaf: DebDocNextWord's 181k classes in
    44 s; docs/notes/shortlist.md), with centroid rankers
    (:func:`xmc_tf.shortlist.fit_centroid_tree`: no training) above, up to
    ``config.tree.max_centroid_labels`` (0 by default: on the
    Amazon-670K-shaped set their shortlist held 12-21 % of the network's
    top 5).  It shortlists
    ``config.tree.shortlist`` labels per instance by a beam of
    ``config.tree.beam`` nodes."""

    section = "tree"
    part = "label_tree"
    what = "label tree"

    def check(self, config, head) -> None:
        tc = self.config(config)
        if tc is None:
            return
        check_int("tree.leaf_size", tc.leaf_size, 2)
        check_int("tree.max_labels", tc.max_labels, 1)
        check_int("tree.max_classes", tc.get("max_classes", 0), 0)
        check_int("tree.beam", tc.get("beam", 10), 1)
        check_int("tree.max_centroid_labels", tc.get("max_centroid_labels", 0),
                  0)
        if tc.get("rankers", "auto") not in RANKERS:
            raise ValueError(f"config.tree.rankers={tc.rankers!r}; expected "
                             f"one of {RANKERS}")
        check_int("tree.shortlist", tc.get("shortlist", 1), 1)
        for name in ("c", "tol"):
            if not (isinstance(tc[name], (int, float))
                    and not isinstance(tc[name], bool) and tc[name] > 0):
                raise ValueError(f"config.tree.{name}={tc[name]!r} must be a "
                                 "number > 0")
        check_nonnegative("tree.threshold", tc.threshold)
        super().check(config, head)

    def plan_data(self, section, summary, shortlists):
        del shortlists
        m = summary.num_labels
        if _linear_fits(section, summary):
            return True, (f"sparse input, {m} {_noun(summary)} <= "
                          f"config.tree.{_limit_field(summary)}="
                          f"{section.get(_limit_field(summary), 0)}")
        limit = section.get("max_centroid_labels", 0)
        if m > limit:
            return False, (f"{m} {_noun(summary)} > config.tree."
                           f"{_limit_field(summary)}="
                           f"{section.get(_limit_field(summary), 0)} and > "
                           f"config.tree.max_centroid_labels={limit}")
        return True, (f"sparse input, {m} {_noun(summary)}: centroid rankers "
                      f"(<= config.tree.max_centroid_labels={limit})")

    def resolvers(self) -> dict:
        return {"rankers": _rankers}

    def grid(self, multi_class: bool) -> tuple:
        return MULTI_CLASS_WEIGHTS if multi_class else MULTI_LABEL_WEIGHTS

    def build(self, config, wd, fit_data, multi_class: bool) -> BuiltScorer:
        """Fits the tree (or reloads it from the backup directory, so a
        run killed later does not fit it again)."""
        tc = self.config(config)
        path = os.path.join(wd.backup_dir, LABEL_TREE_FILE)
        tree, fit_seconds = _load(path, fit_data)
        if tree is None:
            tree, fit_seconds = _fit(config, path, fit_data)
        layer = LabelTreeScores.from_tree(tree, beam=int(tc.get("beam", 10)),
                                          name="label_tree")
        info = {"rankers": tc.get("rankers", "linear"),
                "columns": tree.num_columns, "weights": int(tree.weights.nnz),
                "depth": int(tree.paths.shape[1]),
                "bytes": label_tree_bytes(tree),
                "fit_seconds": round(fit_seconds, 2)}
        logging.info("label tree: %d classifiers, %d weights (%.1f MiB), "
                     "depth %d, %.1f s", info["columns"], info["weights"],
                     info["bytes"] / 2**20, info["depth"], fit_seconds)
        return BuiltScorer(self, (Variant("label_tree", layer),),
                           self.weight(config), self.grid(multi_class),
                           shortlist=int(tc.get("shortlist", 400)), info=info)
