"""A label tree of L2-regularised linear rankers (a Parabel-style second scorer).

The tree splits the labels recursively in two balanced halves by spherical
2-means on their PIFA vectors (the normalised sum of the features of each
label's positive instances) until a node holds at most ``leaf_size``
labels.  Every child of an internal node gets a linear classifier that says
whether an instance has a label under that child, trained on the instances
that reach the parent; every label of a leaf gets one trained on the
instances that reach the leaf.  All classifiers minimise the L2-regularised
squared hinge loss (liblinear's dual coordinate descent through
scikit-learn's ``LinearSVC``); weights below ``threshold`` in magnitude are
dropped.  A label's score is the log of the product, along its path, of
``exp(-max(0, 1 - w . x)^2)``.

Sources: Prabhu et al., "Parabel: Partitioned Label Trees for Extreme
Classification" (WWW 2018), Sec. 3 (balanced 2-means on label
representations, node and leaf classifiers trained on the parent's
instances, squared-hinge probabilities); Babbar & Schoelkopf, "DiSMEC"
(WSDM 2017), Sec. 3 (weight pruning at 0.1 on tf-idf input); Omikuji's
defaults (C = 1, tolerance 0.1, leaves of 100 labels).

In xmc_tf it is the second stage of shortlist-and-rerank (Dahiya et al.,
DeepXML/Astec, WSDM 2021): its log-scores are added to the deep model's
scores with a weight read on the validation split
(:func:`choose_fusion_weight`, used by ``xmc_tf.job``), and the tree is
a non-trainable layer of the exported model
(:class:`xmc_tf.layers.LabelTreeScores`).
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable

import numpy as np
import scipy.sparse as sp

from xmc_tf.config import is_multi_class

__all__ = ["LabelTree", "fit_label_tree", "label_tree_bytes",
           "choose_fusion_weight", "FUSION_WEIGHTS"]

#: The weights :func:`choose_fusion_weight` tries (0: the deep model alone).
FUSION_WEIGHTS = (0.0, 0.05, 0.1, 0.2, 0.3, 0.5, 0.7, 1.0)


@dataclasses.dataclass
class LabelTree:
    """A fitted label tree.

    Attributes:
      weights: ``scipy.sparse`` CSR ``[num_features, num_columns]`` float32:
        column ``j`` is classifier ``j`` (internal-node children and the
        leaves' labels), feature-major so that an instance's score gathers
        only the rows of its own features.
      bias: float32 ``[num_columns]``: 0, or +1 / -1 for a classifier whose
        training instances were all positive / all negative.
      paths: int32 ``[num_labels, depth]``: the columns on each label's path
        (root child first, the label's own column last), padded with
        ``num_columns`` (a column whose log-score is 0).
    """
    weights: sp.csr_matrix
    bias: np.ndarray
    paths: np.ndarray

    @property
    def num_labels(self) -> int:
        return int(self.paths.shape[0])

    @property
    def num_features(self) -> int:
        return int(self.weights.shape[0])

    @property
    def num_columns(self) -> int:
        return int(self.weights.shape[1])

    def column_scores(self, features: sp.spmatrix) -> np.ndarray:
        """``[n, num_columns]`` float32 ``x . w_j + bias_j``."""
        s = np.asarray((sp.csr_matrix(features, dtype=np.float32)
                        @ self.weights).todense(), dtype=np.float32)
        return s + self.bias

    def log_scores(self, features: sp.spmatrix) -> np.ndarray:
        """The labels' log-scores, ``[n, num_labels]`` float32 (<= 0).

        NumPy reference of :class:`xmc_tf.layers.LabelTreeScores`.

        Raises:
          ValueError: ``features`` has not ``num_features`` columns.
        """
        if features.shape[1] != self.num_features:
            raise ValueError(f"features have {features.shape[1]} columns, the "
                             f"label tree was fit on {self.num_features}")
        col = -np.square(np.maximum(0.0, 1.0 - self.column_scores(features)))
        col = np.concatenate([col, np.zeros((col.shape[0], 1), np.float32)], 1)
        return col[:, self.paths].sum(-1).astype(np.float32)

    def to_arrays(self) -> dict:
        """The arrays that define the tree (for ``np.savez``)."""
        w = self.weights
        return {"indptr": w.indptr.astype(np.int64),
                "indices": w.indices.astype(np.int32),
                "data": w.data.astype(np.float32),
                "shape": np.array(w.shape, np.int64),
                "bias": self.bias, "paths": self.paths}

    @classmethod
    def from_arrays(cls, a) -> "LabelTree":
        """Inverse of :meth:`to_arrays` (a dict or an ``np.load`` result)."""
        shape = tuple(int(v) for v in a["shape"])
        w = sp.csr_matrix((a["data"], a["indices"], a["indptr"]), shape=shape)
        return cls(w, np.asarray(a["bias"], np.float32),
                   np.asarray(a["paths"], np.int32))


def label_tree_bytes(tree: LabelTree) -> int:
    """Bytes of the tree's arrays (as the exported layer holds them)."""
    return int(sum(np.asarray(v).nbytes for v in tree.to_arrays().values()))


def _fit_column(features, y, c, tol, threshold, seed):
    """One L2 squared-hinge classifier; ``(weights float32 [D], bias)``."""
    if y.size == 0:  # no instance reaches the node
        return np.zeros(features.shape[1], np.float32), -1.0
    if y.min() == y.max():  # liblinear needs both classes
        return np.zeros(features.shape[1], np.float32), (1.0 if y[0] else -1.0)
    from sklearn.svm import LinearSVC  # pylint: disable=import-outside-toplevel
    svm = LinearSVC(C=c, loss="squared_hinge", dual=True, tol=tol,
                    fit_intercept=False, random_state=seed, max_iter=1000)
    w = svm.fit(features, y).coef_.ravel().astype(np.float32)
    w[np.abs(w) < threshold] = 0.0
    return w, 0.0


def _fit_leaf_multi_class(features, classes, num_labels, c, tol, threshold,
                          seed):
    """The classifiers of a leaf's ``num_labels`` labels on multi-class
    instances (``classes[i]``: instance ``i``'s label, in ``[0,
    num_labels)``, or -1 for an instance without a label, a negative of
    every classifier): liblinear's one-vs-rest in one call, which solves
    the same per-label problems as :func:`_fit_column` would one by one.

    Returns:
      ``(weights, bias)``: ``scipy.sparse`` CSR float32 ``[num_labels, D]``
      and float32 ``[num_labels]``.
    """
    d = features.shape[1]
    b = np.full(num_labels, -1.0, np.float32)  # no instance: all negative
    # an unlabelled instance is one more class, whose classifier is dropped
    classes = np.where(classes < 0, num_labels, classes)
    present = np.unique(classes)
    if present.size == 0 or (present.size == 1 and present[0] == num_labels):
        return sp.csr_matrix((num_labels, d), dtype=np.float32), b
    if present.size == 1:
        b[present[0]] = 1.0  # every instance is positive
        return sp.csr_matrix((num_labels, d), dtype=np.float32), b
    from sklearn.svm import LinearSVC  # pylint: disable=import-outside-toplevel
    # Only the features the leaf's instances use can get a weight: solve on
    # those columns (a leaf's dense coef_ over all D features would cost
    # more than the solve).
    features = sp.csr_matrix(features)
    used = np.unique(features.indices)
    svm = LinearSVC(C=c, loss="squared_hinge", dual=True, tol=tol,
                    fit_intercept=False, random_state=seed, max_iter=1000)
    with warnings.catch_warnings():  # "more classes than 50% of samples"
        warnings.simplefilter("ignore", UserWarning)
        coef = svm.fit(features[:, used], classes).coef_.astype(np.float32)
    if present.size == 2:  # liblinear solves one problem: class 1 vs 0
        coef = np.vstack([-coef, coef])
    coef[np.abs(coef) < threshold] = 0.0
    coef = sp.coo_matrix(coef)
    rows = np.asarray(svm.classes_)[coef.row]
    keep = rows < num_labels
    b[present[present < num_labels]] = 0.0
    return sp.csr_matrix((coef.data[keep], (rows[keep], used[coef.col[keep]])),
                         shape=(num_labels, d), dtype=np.float32), b


def _split(pifa, ids, rng, iterations=10):
    """Balanced spherical 2-means of the labels ``ids``: a boolean mask."""
    p = pifa[ids]
    centers = p[rng.choice(ids.size, 2, replace=False)].toarray()
    half = ids.size // 2
    left = np.zeros(ids.size, bool)
    for _ in range(iterations):
        sim = np.asarray(p @ centers.T)
        order = np.argsort(sim[:, 1] - sim[:, 0], kind="stable")
        left[:] = False
        left[order[:half]] = True
        centers = np.vstack([np.asarray(p[left].sum(0)),
                             np.asarray(p[~left].sum(0))])
        centers /= np.linalg.norm(centers, axis=1, keepdims=True) + 1e-12
    return left


def fit_label_tree(features: sp.spmatrix, labels: sp.spmatrix, *,
                   leaf_size: int = 100, c: float = 1.0, tol: float = 0.1,
                   threshold: float = 0.1, seed: int = 0,
                   progress: Callable[[str], None] | None = None) -> LabelTree:
    """Fits a label tree of linear rankers (Parabel, Sec. 3).

    Args:
      features: ``[n, D]`` sparse float instances (as the model receives
        them: after the config's normalisation).
      labels: ``[n, m]`` sparse 0/1 labels.
      leaf_size: most labels in a leaf (>= 2).
      c: liblinear's ``C`` (inverse L2 strength), > 0.
      tol: liblinear's stopping tolerance, > 0.
      threshold: weights with smaller magnitude are dropped (>= 0).
      seed: the 2-means initialisation.
      progress: called with a one-line status now and then.

    Returns:
      The :class:`LabelTree`; cost about one liblinear solve per label on
      the instances of its leaf plus two per internal node.  On multi-class
      labels (every instance has at most one) a leaf is one one-vs-rest
      call on the features its instances use, which solves the same
      per-label problems, and an internal node's second child is the
      first one negated (the same problem with the classes swapped; two
      solves where instances without a label reach the node).

    Raises:
      ValueError: shapes that do not match, or a bad argument.
      ImportError: scikit-learn is missing (``pip install scikit-learn``).
    """
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows, labels "
                         f"{labels.shape[0]}")
    if leaf_size < 2 or c <= 0 or tol <= 0 or threshold < 0:
        raise ValueError("need leaf_size >= 2, c > 0, tol > 0, threshold >= 0;"
                         f" got {leaf_size}, {c}, {tol}, {threshold}")
    x = sp.csr_matrix(features, dtype=np.float32)
    y = sp.csc_matrix(labels, dtype=np.float32)
    y.data[:] = 1.0
    m = y.shape[1]
    pifa = sp.csr_matrix(y.T @ x)
    norms = np.sqrt(np.asarray(pifa.multiply(pifa).sum(1)).ravel())
    pifa = sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ pifa)
    rng = np.random.default_rng(seed)
    columns, bias = [], []
    paths = [[] for _ in range(m)]
    start, done = time.time(), [0]

    def add(w, b):
        columns.append(sp.csr_matrix(w if w.ndim == 2 else w[None, :],
                                     dtype=np.float32))
        bias.extend(np.atleast_1d(b).tolist())
        return len(bias) - 1

    def report():
        if progress is not None:
            progress(f"label tree: {done[0]}/{m} labels, "
                     f"{time.time() - start:.0f} s")

    def build_multi_class(ids, inst, path):
        # Every instance has at most one label: a leaf's labels are one
        # liblinear call, and an internal node's second child is the
        # negation of the first (a labelled row that reaches a node is in
        # exactly one child; unlabelled rows only reach the root).
        xs = x[inst]
        where = np.full(m + 1, -1, np.int64)  # [m]: no label
        where[ids] = np.arange(ids.size)
        cls = where[label_of[inst]]
        if ids.size <= leaf_size:
            w, b = _fit_leaf_multi_class(xs, cls, ids.size, c, tol,
                                         threshold, seed)
            last = add(w, b)
            for j, label in enumerate(ids):
                paths[label] = path + [last - ids.size + 1 + j]
            done[0] += ids.size
            report()
            return
        left = _split(pifa, ids, rng)
        labelled = cls >= 0
        has = labelled & left[np.maximum(cls, 0)]
        other = labelled & ~has
        w, b = _fit_column(xs, has.astype(np.int32), c, tol, threshold, seed)
        if labelled.all():
            w = sp.csr_matrix(w[None, :])
            col = add(sp.vstack([w, -w]), np.array([b, -b], np.float32))
        else:  # unlabelled instances are negatives of both children
            add(w, b)
            col = add(*_fit_column(xs, other.astype(np.int32), c, tol,
                                   threshold, seed))
        build_multi_class(ids[left], inst[has], path + [col - 1])
        build_multi_class(ids[~left], inst[other], path + [col])

    def build(ids, inst, path):
        xs = x[inst]
        ys = y[inst][:, ids]
        if ids.size <= leaf_size:
            ys = ys.tocsc()
            for j, label in enumerate(ids):
                yj = np.zeros(inst.size, np.int32)
                yj[ys.indices[ys.indptr[j]:ys.indptr[j + 1]]] = 1
                col = add(*_fit_column(xs, yj, c, tol, threshold, seed))
                paths[label] = path + [col]
            done[0] += ids.size
            report()
            return
        left = _split(pifa, ids, rng)
        for part in (left, ~left):
            has = np.asarray(ys[:, part].sum(1)).ravel() > 0
            col = add(*_fit_column(xs, has.astype(np.int32), c, tol,
                                   threshold, seed))
            build(ids[part], inst[has], path + [col])

    rows = sp.csr_matrix(y)
    if is_multi_class(rows):  # the plan's test (xmc_tf.job.plan)
        label_of = np.full(rows.shape[0], m, np.int64)  # m: no label
        label_of[np.diff(rows.indptr) == 1] = rows.indices
        build_multi_class(np.arange(m), np.arange(x.shape[0]), [])
    else:
        build(np.arange(m), np.arange(x.shape[0]), [])
    depth = max((len(p) for p in paths), default=1)
    ncols = len(bias)
    padded = np.full((m, max(depth, 1)), ncols, np.int32)
    for label, p in enumerate(paths):
        padded[label, :len(p)] = p
    weights = sp.vstack(columns, format="csr").T.tocsr().astype(np.float32)
    weights.eliminate_zeros()
    return LabelTree(weights, np.asarray(bias, np.float32), padded)


def choose_fusion_weight(blocks, ks=(1, 3, 5),
                         weights=FUSION_WEIGHTS) -> tuple[float, dict]:
    """The weight ``a`` of ``deep + a * tree`` with the best validation
    P@k, averaged over ``ks`` (ties: the smaller weight).

    Args:
      blocks: iterable of ``(deep_scores [b, m], tree_scores [b, m],
        labels)`` per block of validation instances: float arrays (the deep
        model's scores; the tree's log-scores, :meth:`LabelTree.log_scores`)
        and ``scipy.sparse`` 0/1 labels ``[b, m]``.
      ks: the cut-offs averaged (each <= m).
      weights: the candidates (>= 0).

    Returns:
      ``(weight, {weight: {k: P@k in percent}})``.

    Raises:
      ValueError: no blocks, or a block whose arrays disagree in shape.
    """
    ks = tuple(int(k) for k in ks)
    if not ks or min(ks) < 1:
        raise ValueError(f"ks must be >= 1, got {ks}")
    hits = np.zeros((len(weights), len(ks)))
    count = 0
    for deep, tree, labels in blocks:
        deep, tree = np.asarray(deep), np.asarray(tree)
        y = sp.csr_matrix(labels)
        if deep.shape != tree.shape or deep.shape != y.shape:
            raise ValueError(f"block shapes differ: deep {deep.shape}, tree "
                             f"{tree.shape}, labels {y.shape}")
        rows = np.arange(y.shape[0])[:, None]
        top_k = min(max(ks), y.shape[1])  # k > m: P@k counts m labels
        for i, a in enumerate(weights):
            s = deep + np.float32(a) * tree
            top = np.argpartition(-s, top_k - 1, axis=1)[:, :top_k]
            order = np.argsort(-np.take_along_axis(s, top, 1), axis=1,
                               kind="stable")
            top = np.take_along_axis(top, order, 1)
            for j, k in enumerate(ks):
                hits[i, j] += y[rows, top[:, :k]].sum()
        count += y.shape[0]
    if not count:
        raise ValueError("no validation instances to choose the weight on")
    table = {float(a): {k: 100.0 * hits[i, j] / (k * count)
                        for j, k in enumerate(ks)}
             for i, a in enumerate(weights)}
    best = max(table, key=lambda a: (np.mean(list(table[a].values())), -a))
    return best, table
