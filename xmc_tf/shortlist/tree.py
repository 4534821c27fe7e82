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

In xmc_tf the tree is a shortlister and a scorer of the fused model
(:class:`xmc_tf.layers.LabelTreeScores`): its beam search (Parabel,
Sec. 3.3) shortlists a few hundred labels per instance, every scorer
re-ranks them (Dahiya et al., DeepXML/Astec, WSDM 2021, Sec. 3), and its
path log-scores join the weighted sum (:class:`xmc_tf.layers.FusedScores`).
This module is NumPy / scikit-learn only; :meth:`LabelTree.beam_search`
and :meth:`LabelTree.log_scores` are the references of the layer's ops.
"""

from __future__ import annotations

import dataclasses
import time
import warnings
from typing import Callable

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.labels import is_multi_class

__all__ = ["LabelTree", "TreeTopology", "fit_label_tree",
           "fit_centroid_tree", "label_tree_bytes"]


@dataclasses.dataclass(frozen=True)
class TreeTopology:
    """The shape of a :class:`LabelTree` as its beam search walks it.

    Node 0 is the root; node ``n >= 1`` is the internal column ``c`` with
    ``column_node[c] = n`` (an internal node's classifier is the column its
    parent scores it by).  The children of node ``n`` are the columns
    ``children[child_indptr[n]:child_indptr[n + 1]]``, in column order;
    every column is the child of exactly one node.  A column with
    ``column_label[c] = l >= 0`` is label ``l``'s own classifier.

    Attributes:
      child_indptr: int64 ``[num_nodes + 1]``.
      children: int32 ``[num_columns]``.
      column_node: int32 ``[num_columns]``, the node of an internal column,
        -1 for a label's column.
      column_label: int32 ``[num_columns]``, the label of a label's column,
        -1 for an internal one.
    """

    child_indptr: np.ndarray
    children: np.ndarray
    column_node: np.ndarray
    column_label: np.ndarray

    @property
    def num_nodes(self) -> int:
        """Nodes, the root included (``1 +`` internal columns)."""
        return int(self.child_indptr.size - 1)

    @classmethod
    def from_paths(cls, paths, num_columns: int) -> "TreeTopology":
        """The topology of the label paths ``paths`` (int ``[m, depth]``,
        padded with ``num_columns``; a :class:`LabelTree`'s ``paths``).

        Raises:
          ValueError: a column on two labels' paths at different places
            (two parents), a label's own column on another path, a column
            on no path, or a label without a column.
        """
        paths = np.asarray(paths, np.int64)
        m, depth = paths.shape if paths.ndim == 2 else (0, 0)
        c = int(num_columns)
        valid = (paths >= 0) & (paths < c)
        if np.any((paths < 0) | (paths > c)):
            raise ValueError(f"paths must hold columns in [0, {c}] "
                             f"({c}: padding)")
        lengths = valid.sum(1)
        if m and (lengths.min() < 1 or np.any(valid[:, 1:] & ~valid[:, :-1])):
            raise ValueError("every label needs a path of >= 1 columns, "
                             "padding only at its end")
        parent = np.full(c, -2, np.int64)  # -2: not seen, -1: the root
        rows, steps = np.nonzero(valid)
        cols = paths[rows, steps]
        pars = np.where(steps > 0, paths[rows, np.maximum(steps - 1, 0)], -1)
        order = np.argsort(cols, kind="stable")
        cols, pars = cols[order], pars[order]
        first = np.ones(cols.size, bool)
        first[1:] = cols[1:] != cols[:-1]
        same = pars == np.repeat(pars[first], np.diff(np.append(
            np.flatnonzero(first), cols.size)))
        if not same.all():
            bad = int(cols[~same][0])
            raise ValueError(f"column {bad} has two parents in paths")
        parent[cols[first]] = pars[first]
        if np.any(parent == -2):
            raise ValueError(f"column {int(np.flatnonzero(parent == -2)[0])} "
                             "is on no label's path")
        own = paths[np.arange(m), lengths - 1] if m else np.zeros(0, np.int64)
        column_label = np.full(c, -1, np.int32)
        column_label[own] = np.arange(m, dtype=np.int32)
        if np.unique(own).size != m:
            raise ValueError("two labels share their own column")
        internal = np.zeros(c, bool)
        internal[pars[pars >= 0]] = True
        if np.any(internal & (column_label >= 0)):
            raise ValueError("a label's own column is an internal node of "
                             "another path")
        column_node = np.full(c, -1, np.int32)
        column_node[internal] = np.arange(1, internal.sum() + 1,
                                          dtype=np.int32)
        node_of_parent = np.where(parent < 0, 0,
                                  column_node[np.maximum(parent, 0)])
        children = np.argsort(node_of_parent, kind="stable").astype(np.int32)
        counts = np.bincount(node_of_parent, minlength=int(internal.sum()) + 1)
        child_indptr = np.concatenate([[0], np.cumsum(counts)]).astype(
            np.int64)
        return cls(child_indptr, children, column_node, column_label)


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

    def topology(self) -> TreeTopology:
        """The :class:`TreeTopology` of ``paths``."""
        return TreeTopology.from_paths(self.paths, self.num_columns)

    def path_scores(self, features: sp.spmatrix, label_ids) -> np.ndarray:
        """The log-scores of given labels, float32 ``[n, k]``: row ``i`` of
        :meth:`log_scores` at ``label_ids[i]`` (int ``[n, k]``; -1: padding,
        scored 0).  NumPy reference of
        :meth:`xmc_tf.layers.LabelTreeScores.score_candidates`."""
        ids = np.asarray(label_ids, np.int64)
        full = self.log_scores(features)
        out = np.take_along_axis(full, np.maximum(ids, 0), 1)
        return np.where(ids >= 0, out, 0.0).astype(np.float32)

    def beam_search(self, features: sp.spmatrix, beam: int,
                    k: int) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best labels of each instance by beam search (Parabel,
        Sec. 3.3), in NumPy, one instance at a time: the reference of
        :meth:`xmc_tf.layers.LabelTreeScores.shortlist`.

        From the root, level by level, every child of the frontier is
        scored (its parent's path log-score plus its own column's); a
        label's column makes the label a candidate, an internal column
        competes for the next frontier's ``beam`` places (ties: the lower
        node id).

        Returns:
          ``(ids int32 [n, k], scores float32 [n, k])``, best first (ties:
          the lower label id); -1 / -inf where fewer than ``k`` labels were
          reached.
        """
        topo = self.topology()
        col = -np.square(np.maximum(0.0, 1.0 - self.column_scores(features)))
        n = col.shape[0]
        ids = np.full((n, k), -1, np.int32)
        scores = np.full((n, k), -np.inf, np.float32)
        for i in range(n):
            frontier, found = [(0.0, 0)], []
            while frontier:
                step = []
                for score, node in frontier:
                    lo, hi = topo.child_indptr[node], topo.child_indptr[node + 1]
                    for c in topo.children[lo:hi]:
                        s = np.float32(score) + np.float32(col[i, c])
                        if topo.column_label[c] >= 0:
                            found.append((float(s), int(topo.column_label[c])))
                        else:
                            step.append((float(s), int(topo.column_node[c])))
                frontier = sorted(step, key=lambda t: (-t[0], t[1]))[:beam]
            best = sorted(found, key=lambda t: (-t[0], t[1]))[:k]
            for j, (s, label) in enumerate(best):
                ids[i, j], scores[i, j] = label, s
        return ids, scores

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


@dataclasses.dataclass(frozen=True)
class _Node:
    """A node's instances on the feature columns they use: ``features``
    CSR float32 ``[n, len(used)]``, the columns ``used`` (sorted int ids)
    of the ``num_features`` = D features.  A liblinear solve on them gives
    the weights of a solve over all D (a column no instance uses keeps the
    zero weight dual coordinate descent starts from; every dot product
    sums the same entries in the same order), at a cost that follows the
    node's entries, not D."""

    features: sp.csr_matrix
    used: np.ndarray
    num_features: int

    @classmethod
    def of(cls, rows: sp.csr_matrix) -> "_Node":
        rows = sp.csr_matrix(rows)
        used = np.unique(rows.indices)
        return cls(rows[:, used], used, rows.shape[1])

    def row(self, w=None) -> sp.csr_matrix:
        """CSR float32 ``[1, D]``: ``w`` (over ``used``; zeros dropped)
        at its columns, or zeros."""
        if w is None:
            return sp.csr_matrix((1, self.num_features), dtype=np.float32)
        keep = np.flatnonzero(w)
        return sp.csr_matrix((w[keep], self.used[keep], [0, keep.size]),
                             shape=(1, self.num_features), dtype=np.float32)


def _fit_column(node: _Node, y, c, tol, threshold, seed):
    """One L2 squared-hinge classifier on ``node``'s instances (labels
    ``y``, 0/1 int ``[n]``); ``(weights CSR float32 [1, D], bias)``, weights
    below ``threshold`` in magnitude dropped."""
    if y.size == 0:  # no instance reaches the node
        return node.row(), -1.0
    if y.min() == y.max():  # liblinear needs both classes
        return node.row(), (1.0 if y[0] else -1.0)
    if node.used.size == 0:  # no features: liblinear's w stays 0
        return node.row(), 0.0
    from sklearn.svm import LinearSVC  # pylint: disable=import-outside-toplevel
    svm = LinearSVC(C=c, loss="squared_hinge", dual=True, tol=tol,
                    fit_intercept=False, random_state=seed, max_iter=1000)
    w = svm.fit(node.features, y).coef_.ravel().astype(np.float32)
    w[np.abs(w) < threshold] = 0.0
    return node.row(w), 0.0


def _fit_leaf_multi_class(node: _Node, classes, num_labels, c, tol,
                          threshold, seed):
    """The classifiers of a leaf's ``num_labels`` labels on ``node``'s
    multi-class instances (``classes[i]``: instance ``i``'s label, in ``[0,
    num_labels)``, or -1 for an instance without a label, a negative of
    every classifier): liblinear's one-vs-rest in one call, which solves
    the same per-label problems as :func:`_fit_column` would one by one.

    Returns:
      ``(weights, bias)``: ``scipy.sparse`` CSR float32 ``[num_labels, D]``
      and float32 ``[num_labels]``.
    """
    d = node.num_features
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
    # On the node's columns (a leaf's dense coef_ over all D features would
    # cost more than the solve).
    used = node.used
    svm = LinearSVC(C=c, loss="squared_hinge", dual=True, tol=tol,
                    fit_intercept=False, random_state=seed, max_iter=1000)
    with warnings.catch_warnings():  # "more classes than 50% of samples"
        warnings.simplefilter("ignore", UserWarning)
        coef = svm.fit(node.features, classes).coef_.astype(np.float32)
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
    """Balanced spherical 2-means of the labels ``ids``: a boolean mask.

    Computed on the columns the labels use (a node deep in the tree uses
    a few of the D features): the same sums and cosines as over all D, at
    a cost that follows the node's entries, not D."""
    p = pifa[ids]
    used = np.unique(p.indices)
    p = sp.csr_matrix((p.data, np.searchsorted(used, p.indices), p.indptr),
                      shape=(p.shape[0], used.size))
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
      ValueError: shapes that do not match, a bad argument, or features
        that are not finite.
      ImportError: scikit-learn is missing (``pip install scikit-learn``).
    """
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows, labels "
                         f"{labels.shape[0]}")
    if leaf_size < 2 or c <= 0 or tol <= 0 or threshold < 0:
        raise ValueError("need leaf_size >= 2, c > 0, tol > 0, threshold >= 0;"
                         f" got {leaf_size}, {c}, {tol}, {threshold}")
    x = sp.csr_matrix(features, dtype=np.float32)
    if not np.isfinite(x.data).all():
        raise ValueError("features hold NaN or infinite values")
    y = sp.csc_matrix(labels, dtype=np.float32)
    y.data[:] = 1.0
    m = y.shape[1]
    pifa = _pifa(x, y)
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
        node = _Node.of(x[inst])
        where = np.full(m + 1, -1, np.int64)  # [m]: no label
        where[ids] = np.arange(ids.size)
        cls = where[label_of[inst]]
        if ids.size <= leaf_size:
            w, b = _fit_leaf_multi_class(node, cls, ids.size, c, tol,
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
        w, b = _fit_column(node, has.astype(np.int32), c, tol, threshold,
                           seed)
        if labelled.all():
            col = add(sp.vstack([w, -w]), np.array([b, -b], np.float32))
        else:  # unlabelled instances are negatives of both children
            add(w, b)
            col = add(*_fit_column(node, other.astype(np.int32), c, tol,
                                   threshold, seed))
        build_multi_class(ids[left], inst[has], path + [col - 1])
        build_multi_class(ids[~left], inst[other], path + [col])

    def build(ids, inst, path):
        node = _Node.of(x[inst])
        ys = y[inst][:, ids]
        if ids.size <= leaf_size:
            ys = ys.tocsc()
            for j, label in enumerate(ids):
                yj = np.zeros(inst.size, np.int32)
                yj[ys.indices[ys.indptr[j]:ys.indptr[j + 1]]] = 1
                col = add(*_fit_column(node, yj, c, tol, threshold, seed))
                paths[label] = path + [col]
            done[0] += ids.size
            report()
            return
        left = _split(pifa, ids, rng)
        for part in (left, ~left):
            has = np.asarray(ys[:, part].sum(1)).ravel() > 0
            col = add(*_fit_column(node, has.astype(np.int32), c, tol,
                                   threshold, seed))
            build(ids[part], inst[has], path + [col])

    rows = sp.csr_matrix(y)
    import sklearn  # pylint: disable=import-outside-toplevel
    # The arguments are checked above, once: scikit-learn's own checks of
    # every LinearSVC call (its parameters, the features' finiteness) cost
    # about as much as a small node's solve.
    with sklearn.config_context(skip_parameter_validation=True,
                                assume_finite=True):
        if is_multi_class(rows):
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


def _pifa(features, labels):
    """The labels' l2-normalised PIFA rows, CSR float32 ``[m, D]`` (the sum
    of each label's positive instances)."""
    x = sp.csr_matrix(features, dtype=np.float32)
    y = sp.csc_matrix(labels, dtype=np.float32)
    y.data[:] = 1.0
    return _normalize_rows(sp.csr_matrix(y.T @ x))


def _normalize_rows(rows: sp.csr_matrix) -> sp.csr_matrix:
    """``rows`` scaled to unit l2 norm each (a zero row stays zero)."""
    norms = np.sqrt(np.asarray(rows.multiply(rows).sum(1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ rows)


def _column_sums(rows: sp.csr_matrix) -> sp.csr_matrix:
    """The column sums of ``rows`` as a sparse ``[1, D]`` row (its cost
    follows the entries, not D)."""
    cols, inverse = np.unique(rows.indices, return_inverse=True)
    sums = np.bincount(inverse, weights=rows.data,
                       minlength=cols.size).astype(np.float32)
    return sp.csr_matrix((sums, cols, [0, cols.size]),
                         shape=(1, rows.shape[1]))


def _top_entries(rows: sp.csr_matrix, keep: int) -> sp.csr_matrix:
    """Each row's ``keep`` entries of largest magnitude (ties: the lower
    feature id), the row then scaled to unit l2 norm (a zero row stays
    zero)."""
    rows = sp.csr_matrix(rows, dtype=np.float32)
    rows.sort_indices()
    lengths = np.diff(rows.indptr)
    mask = np.ones(rows.nnz, bool)
    for i in np.flatnonzero(lengths > keep):  # ties: the lower feature id
        lo, hi = rows.indptr[i], rows.indptr[i + 1]
        drop = np.argsort(-np.abs(rows.data[lo:hi]), kind="stable")[keep:]
        mask[lo + drop] = False
    kept = sp.csr_matrix((rows.data * mask, rows.indices, rows.indptr),
                         shape=rows.shape)
    kept.eliminate_zeros()
    return _normalize_rows(kept).astype(np.float32)


def fit_centroid_tree(features: sp.spmatrix, labels: sp.spmatrix, *,
                      leaf_size: int = 100, node_features: int = 256,
                      label_features: int = 64, seed: int = 0,
                      progress: Callable[[str], None] | None = None
                      ) -> LabelTree:
    """A label tree whose rankers are centroids: no classifier is trained.

    The same balanced spherical 2-means hierarchy of the labels' PIFA
    vectors as :func:`fit_label_tree` (Parabel, Sec. 3.1); a child's column
    is its labels' normalised PIFA centroid, a label's its own PIFA vector,
    each kept at its strongest ``node_features`` / ``label_features``
    features, bias 0.  A column then scores ``-max(0, 1 - cos)^2`` (the
    cosine of the instance and the centroid, for l2-normalised inputs) and
    a beam search descends to the labels whose centroids the instance is
    nearest, in the manner of a hierarchical k-means index over the label
    vectors (an ANN index: Auvolat et al., "Clustering is Efficient for
    Approximate Maximum Inner Product Search", 2015; PECOS's PIFA
    clustering, Yu et al. JMLR 2022).  It is a shortlister for label
    counts where training a ranker per label costs too much (one liblinear
    solve per label: Amazon-670K), the network re-ranking its shortlist.

    Args:
      features: ``[n, D]`` sparse float instances (normalised).
      labels: ``[n, m]`` sparse 0/1 labels.
      leaf_size: most labels in a leaf (>= 2).
      node_features, label_features: features kept per node / label
        column (>= 1).
      seed: the 2-means initialisation.
      progress: called with a one-line status now and then.

    Returns:
      The :class:`LabelTree`.  Cost: the 2-means passes (``O(nnz(PIFA))``
      per level) and a selection per column; memory ``8 x`` the kept
      entries.

    Raises:
      ValueError: shapes that do not match, or a bad argument.
    """
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows, labels "
                         f"{labels.shape[0]}")
    if leaf_size < 2 or node_features < 1 or label_features < 1:
        raise ValueError("need leaf_size >= 2, node_features >= 1, "
                         f"label_features >= 1; got {leaf_size}, "
                         f"{node_features}, {label_features}")
    pifa = _pifa(features, labels)
    m = pifa.shape[0]
    rng = np.random.default_rng(seed)
    columns, paths = [], [[] for _ in range(m)]
    count, start, done = [0], time.time(), [0]

    def add(rows):
        columns.append(rows)
        count[0] += rows.shape[0]
        return count[0] - rows.shape[0]

    stack = [(np.arange(m), [])]
    while stack:
        ids, path = stack.pop()
        if ids.size <= leaf_size:
            first = add(_top_entries(pifa[ids], label_features))
            for j, label in enumerate(ids):
                paths[label] = path + [first + j]
            done[0] += ids.size
            if progress is not None:
                progress(f"centroid tree: {done[0]}/{m} labels, "
                         f"{time.time() - start:.0f} s")
            continue
        left = _split(pifa, ids, rng)
        sums = sp.vstack([_column_sums(pifa[ids[left]]),
                          _column_sums(pifa[ids[~left]])])
        first = add(_top_entries(sums, node_features))
        stack.append((ids[~left], path + [first + 1]))
        stack.append((ids[left], path + [first]))
    depth = max((len(p) for p in paths), default=1)
    ncols = count[0]
    padded = np.full((m, max(depth, 1)), ncols, np.int32)
    for label, p in enumerate(paths):
        padded[label, :len(p)] = p
    weights = sp.vstack(columns, format="csr").T.tocsr().astype(np.float32)
    return LabelTree(weights, np.zeros(ncols, np.float32), padded)
