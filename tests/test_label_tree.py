"""The label tree (:mod:`xmc_tf.shortlist.tree`,
:class:`xmc_tf.layers.LabelTreeScores`, ``config.tree``): the tree's
structure, its classifiers against scikit-learn's LinearSVC fit directly,
its scores against a per-label loop over dense weights, the layer against
NumPy, and the job (fused export, reload, SavedModel with and without a
shortlist, config checks).  The beam search and the fusion weights are
tested in tests/test_shortlist.py."""

import dataclasses
import json
import os

import keras
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.job import artifacts
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf import saving
from xmc_tf.job import heads
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.plan import summarize
from xmc_tf.shortlist import tree as lt
from xmc_tf.layers import LabelTreeScores
from xmc_tf import decoding
from xmc_tf.layers import UniformSparseDense
from xmc_tf.errors import ConfigError
from xmc_tf.job.preprocessing import load_for_model
from xmc_tf.job.checks import check_config
from xmc_tf.job.run import train_and_evaluate

SYN = "synthetic:num_instances=400,num_features=120,num_labels=24,seed=3"


def _data(n=300, d=60, m=16, seed=0):
    """Each label owns 3 features; an instance has 1-2 labels and their
    features plus noise features."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(d)[:3 * m].reshape(m, 3)
    x = np.zeros((n, d), np.float32)
    y = np.zeros((n, m), np.float32)
    for i in range(n):
        labs = rng.choice(m, 1 + (rng.random() < 0.5), replace=False)
        y[i, labs] = 1
        for l in labs:
            x[i, owner[l]] = rng.random(3) + 0.5
        x[i, rng.choice(d, 4)] += rng.random(4)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return sp.csr_matrix(x), sp.csr_matrix(y)


def _sparse_tensor(x):
    c = sp.coo_matrix(x)
    return tf.SparseTensor(np.stack([c.row, c.col], 1).astype(np.int64),
                           c.data.astype(np.float32), c.shape)


def test_tree_structure_is_balanced_with_one_column_per_label():
    x, y = _data()
    tree = lt.fit_label_tree(x, y, leaf_size=4)
    m = y.shape[1]
    own = tree.paths[np.arange(m), (tree.paths < tree.num_columns).sum(1) - 1]
    assert len(set(own.tolist())) == m  # every label its own last column
    # 16 labels, leaves of <= 4: two levels of halving, then the label
    assert tree.paths.shape == (m, 3) and (tree.paths < tree.num_columns).all()
    assert tree.num_columns == m + 2 + 4
    # siblings share their path up to the leaf; leaves hold <= 4 labels
    leaves = {}
    for label in range(m):
        leaves.setdefault(tuple(tree.paths[label, :-1]), []).append(label)
    assert sorted(len(v) for v in leaves.values()) == [4, 4, 4, 4]


def test_classifiers_match_linearsvc_on_the_nodes_instances():
    from sklearn.svm import LinearSVC
    x, y = _data()
    tree = lt.fit_label_tree(x, y, leaf_size=4, threshold=0.0)
    w = tree.weights.toarray()
    ycsc = y.tocsc()
    # the root's first child: trained on every instance, positive where
    # the instance has a label under that child
    child = tree.paths[:, 0] == tree.paths[0, 0]
    target = (np.asarray(ycsc[:, child].sum(1)).ravel() > 0).astype(int)
    ref = LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=0.1,
                    fit_intercept=False, random_state=0).fit(x, target)
    np.testing.assert_allclose(w[:, tree.paths[0, 0]], ref.coef_.ravel(),
                               rtol=1e-5, atol=1e-6)
    # label 0's own classifier: trained on the instances that reach its
    # leaf (those with a label under every node of its path)
    reach = np.ones(x.shape[0], bool)
    for depth in range(tree.paths.shape[1] - 1):
        under = tree.paths[:, depth] == tree.paths[0, depth]
        reach &= np.asarray(ycsc[:, under].sum(1)).ravel() > 0
    ref = LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=0.1,
                    fit_intercept=False, random_state=0).fit(
        x[reach], y[reach][:, 0].toarray().ravel().astype(int))
    np.testing.assert_allclose(w[:, tree.paths[0, -1]], ref.coef_.ravel(),
                               rtol=1e-5, atol=1e-6)


def test_node_solves_on_its_columns_match_a_solve_over_all_features():
    """Two blocks of labels on disjoint feature blocks: below the root a
    node's instances use one block only, and the tree solves on those
    columns; every label's classifier must still be LinearSVC's solution
    over all D features on the instances that reach its leaf."""
    from sklearn.svm import LinearSVC
    rng = np.random.default_rng(4)
    n, d, m = 240, 50, 8
    block = np.arange(m) // 4  # labels 0-3 on features 0-24, 4-7 on 25-49
    x = np.zeros((n, d), np.float32)
    y = np.zeros((n, m), np.float32)
    for i in range(n):
        b = i % 2
        labs = rng.choice(np.flatnonzero(block == b), 1 + (i % 3 == 0),
                          replace=False)
        y[i, labs] = 1
        cols = 25 * b + rng.choice(25, 6, replace=False)  # noise
        x[i, cols] = rng.random(cols.size) + 0.2
        x[i, 25 * b + 3 * (labs % 4)] += 1.0
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x, y = sp.csr_matrix(x), sp.csr_matrix(y)
    tree = lt.fit_label_tree(x, y, leaf_size=2, threshold=0.0)
    w = tree.weights.toarray()
    ycsc = y.tocsc()
    compacted = 0
    for label in range(m):
        reach = np.ones(n, bool)
        for depth in range(tree.paths.shape[1] - 1):
            under = tree.paths[:, depth] == tree.paths[label, depth]
            reach &= np.asarray(ycsc[:, under].sum(1)).ravel() > 0
        target = y[reach][:, label].toarray().ravel().astype(int)
        ref = LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=0.1,
                        fit_intercept=False, random_state=0).fit(
            x[reach], target)
        np.testing.assert_allclose(w[:, tree.paths[label, -1]],
                                   ref.coef_.ravel(), rtol=1e-5, atol=1e-6)
        compacted += np.unique(x[reach].indices).size < d
    assert compacted > 0  # some leaves solved on fewer than D columns


def test_non_finite_features_are_refused():
    x, y = _data()
    x = x.copy()
    x.data[3] = np.nan
    with pytest.raises(ValueError, match="NaN or infinite"):
        lt.fit_label_tree(x, y, leaf_size=4)


def _multi_class_data(n=600, d=80, m=40, seed=1):
    """One label per instance (labels m-2, m-1 have none); each label owns
    two features, plus noise features."""
    rng = np.random.default_rng(seed)
    owner = rng.permutation(d)[:2 * m].reshape(m, 2)
    labels = rng.integers(0, m - 2, n)
    x = np.zeros((n, d), np.float32)
    for i, label in enumerate(labels):
        x[i, owner[label]] = rng.random(2) + 0.5
        x[i, rng.choice(d, 5)] += rng.random(5)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = sp.csr_matrix((np.ones(n, np.float32), (np.arange(n), labels)),
                      shape=(n, m))
    return sp.csr_matrix(x), y, labels


def test_multi_class_tree_solves_the_per_label_problems():
    """On one label per instance the fit takes a leaf's labels in one
    one-vs-rest call and an internal node's second child as the negated
    first; each column must still be LinearSVC's solution of that
    column's own problem, fit directly."""
    from sklearn.svm import LinearSVC
    x, y, labels = _multi_class_data()
    tree = lt.fit_label_tree(x, y, leaf_size=6, threshold=0.0, tol=1e-6)
    w = tree.weights.toarray()
    m, ncols = y.shape[1], tree.num_columns
    depth = (tree.paths < ncols).sum(1)
    assert len(set(tree.paths[np.arange(m), depth - 1].tolist())) == m

    def reaches(label):
        """Instances under every internal node of ``label``'s path."""
        keep = np.ones(x.shape[0], bool)
        for d in range(depth[label] - 1):
            under = np.flatnonzero(tree.paths[:, d] == tree.paths[label, d])
            keep &= np.isin(labels, under)
        return keep

    def svc(rows, target):
        return LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=1e-6,
                         fit_intercept=False, random_state=0,
                         max_iter=10_000).fit(x[rows], target).coef_.ravel()

    for label in (0, 7, 20, 37):
        rows = reaches(label)
        target = (labels[rows] == label).astype(int)
        if target.min() == target.max():
            continue
        np.testing.assert_allclose(w[:, tree.paths[label, depth[label] - 1]],
                                   svc(rows, target), atol=2e-4)
    # the root's two children: one problem, the second column its negation
    first = tree.paths[:, 0] == tree.paths[0, 0]
    target = np.isin(labels, np.flatnonzero(first)).astype(int)
    want = svc(np.ones(x.shape[0], bool), target)
    np.testing.assert_allclose(w[:, tree.paths[0, 0]], want, atol=2e-4)
    other = tree.paths[~first][0, 0]
    np.testing.assert_allclose(w[:, other], -want, atol=2e-4)
    # labels without instances: all-negative classifiers (bias -1, w 0)
    for label in (m - 2, m - 1):
        col = tree.paths[label, depth[label] - 1]
        assert tree.bias[col] == -1.0 and not w[:, col].any()
    # and the tree ranks the planted labels
    top = tree.log_scores(x).argmax(1)
    assert (top == labels).mean() > 0.9


@pytest.mark.parametrize("leaf_size", [6, 64])
def test_multi_class_tree_with_unlabelled_instances(leaf_size):
    """Instances without a label are negatives of the root's children (two
    solves there) or, when the root is a leaf, of every label's
    classifier; the columns still match LinearSVC on their own problem."""
    from sklearn.svm import LinearSVC
    x, y, labels = _multi_class_data()
    y = y.tolil()
    y[:50] = 0  # 50 instances without a label
    y = y.tocsr()
    labels = np.where(np.arange(len(labels)) < 50, -1, labels)
    tree = lt.fit_label_tree(x, y, leaf_size=leaf_size, threshold=0.0,
                             tol=1e-6)
    w = tree.weights.toarray()

    def svc(target):
        return LinearSVC(C=1.0, loss="squared_hinge", dual=True, tol=1e-6,
                         fit_intercept=False, random_state=0,
                         max_iter=10_000).fit(x, target).coef_.ravel()

    if leaf_size >= y.shape[1]:  # the root is the leaf: columns are labels
        for label in (0, 11):
            np.testing.assert_allclose(
                w[:, tree.paths[label, 0]],
                svc((labels == label).astype(int)), atol=2e-4)
        return
    for first in (tree.paths[0, 0],
                  tree.paths[tree.paths[:, 0] != tree.paths[0, 0]][0, 0]):
        under = np.flatnonzero(tree.paths[:, 0] == first)
        np.testing.assert_allclose(
            w[:, first], svc(np.isin(labels, under).astype(int)), atol=2e-4)


def test_log_scores_match_a_loop_over_paths_and_rank_the_labels():
    x, y = _data()
    tree = lt.fit_label_tree(x, y, leaf_size=4)
    w, b = tree.weights.toarray(), tree.bias
    xd = x.toarray()
    want = np.zeros(y.shape, np.float64)
    for i in range(xd.shape[0]):
        for label in range(y.shape[1]):
            for col in tree.paths[label]:
                if col < tree.num_columns:
                    s = xd[i] @ w[:, col] + b[col]
                    want[i, label] -= max(0.0, 1.0 - s) ** 2
    got = tree.log_scores(x)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    # the planted task is learnable: top-1 is a true label for most rows
    top = got.argmax(1)
    assert y[np.arange(y.shape[0]), top].mean() > 0.9
    with pytest.raises(ValueError, match="columns"):
        tree.log_scores(x[:, :10])


def test_degenerate_nodes_and_bad_arguments():
    x = sp.csr_matrix(np.eye(4, dtype=np.float32))
    y = sp.csr_matrix(np.ones((4, 2), np.float32))  # both labels everywhere
    tree = lt.fit_label_tree(x, y, leaf_size=2)
    assert tree.num_columns == 2 and (tree.bias == 1.0).all()
    np.testing.assert_array_equal(tree.log_scores(x), 0.0)
    for kwargs in (dict(leaf_size=1), dict(c=0.0), dict(tol=-1.0),
                   dict(threshold=-0.1)):
        with pytest.raises(ValueError):
            lt.fit_label_tree(x, y, **kwargs)
    with pytest.raises(ValueError, match="rows"):
        lt.fit_label_tree(x, y[:3])


def test_arrays_round_trip():
    x, y = _data()
    tree = lt.fit_label_tree(x, y, leaf_size=4)
    again = lt.LabelTree.from_arrays(tree.to_arrays())
    np.testing.assert_array_equal(again.log_scores(x), tree.log_scores(x))
    assert lt.label_tree_bytes(tree) == sum(
        v.nbytes for v in tree.to_arrays().values())


def test_layer_matches_numpy_on_unordered_duplicate_and_empty_rows():
    x, y = _data()
    tree = lt.fit_label_tree(x, y, leaf_size=4)
    layer = LabelTreeScores.from_tree(tree)
    keep = np.ones(20, np.float32)
    keep[5] = 0  # an empty row
    batch = sp.csr_matrix(sp.diags(keep) @ x[:20])
    batch.eliminate_zeros()
    np.testing.assert_allclose(layer(_sparse_tensor(batch)).numpy(),
                               tree.log_scores(batch), rtol=1e-5, atol=1e-5)
    # entries in reverse order, one entry split in two: the same function
    c = batch.tocoo()
    idx = np.stack([c.row, c.col], 1)[::-1]
    vals = c.data[::-1].copy()
    idx = np.concatenate([idx, idx[:1]])
    vals[0] /= 2
    vals = np.concatenate([vals, vals[:1]])
    st = tf.SparseTensor(idx.astype(np.int64), vals, batch.shape)
    np.testing.assert_allclose(layer(st).numpy(), tree.log_scores(batch),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(layer(batch.toarray()).numpy(),
                               tree.log_scores(batch), rtol=1e-5, atol=1e-5)
    # scored 3 rows at a time (the empty row inside a chunk), and inside a
    # traced function; an empty batch
    small = LabelTreeScores.from_tree(tree, chunk_rows=3)
    np.testing.assert_allclose(tf.function(small)(st).numpy(),
                               tree.log_scores(batch), rtol=1e-5, atol=1e-5)
    empty = tf.SparseTensor(np.zeros((0, 2), np.int64), np.zeros(0, np.float32),
                            [0, x.shape[1]])
    assert small(empty).shape == (0, y.shape[1])
    bad = tf.SparseTensor([[0, x.shape[1]]], [1.0], [1, x.shape[1] + 1])
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_features"):
        layer(bad)
    other = lt.fit_label_tree(x, y, leaf_size=8)
    with pytest.raises(ValueError, match="sizes"):
        layer.set_tree(other)


def _config(**overrides):
    c = xconfig.get_config("uniform_sparse")
    c.data.train = SYN
    c.data.test = SYN.replace("seed=3", "seed=4")
    c.model.update(encoder_dims=(32,), intermediate_dim=32,
                   connections_per_label=8)
    c.train.update(epochs=2, batch_size=32, verbose=0)
    c.tree.leaf_size = 4
    for key, value in overrides.items():
        section, name = key.split(".")
        c[section][name] = value
    return c


def _fused_pieces(model):
    """(the fused layer, its network, its tree layer) of an exported
    model fused with the tree."""
    fused = model.layers[-1]
    tree_layer, = [s for s in fused.scorers
                   if isinstance(s, LabelTreeScores)]
    return fused, fused.network, tree_layer


@pytest.mark.parametrize("shortlist", [False, True])
def test_fused_job_exports_deep_plus_weighted_tree(tmp_path, shortlist):
    wd = str(tmp_path / "run")
    config = _config(**{"tree.weight": 0.5,  # a fixed weight: always fused
                        "shortlist.enabled": shortlist,
                        "tree.shortlist": 6, "tree.beam": 2})
    result = train_and_evaluate(config, wd)
    info = result["label_tree"]
    assert info["weight"] == 0.5 and info["columns"] >= 24
    assert not os.path.exists(os.path.join(wd, "backup"))

    model = artifacts.load_model(wd)
    assert decoding.scores_every_label(model)
    fused, deep, tree_layer = _fused_pieces(model)
    assert fused.shortlists == shortlist
    test = load_for_model(config.data.test, wd)
    x, _ = xdata.make_tf_dataset(test, 64).take(1).get_single_element()
    # the reloaded pieces, recombined by hand
    norm_x = model.layers[1](x)
    want = deep(norm_x).numpy() + 0.5 * tree_layer(norm_x).numpy()
    np.testing.assert_allclose(model(x).numpy(), want, rtol=1e-5, atol=1e-5)
    if shortlist:  # ranked within the tree's beam shortlist
        held = tree_layer.shortlist(norm_x, 6, beam=2)[0].numpy()
        rows = np.arange(want.shape[0])[:, None]
        masked = np.full_like(want, -np.inf)
        masked[rows, np.maximum(held, 0)] = np.where(
            held >= 0, want[rows, np.maximum(held, 0)], -np.inf)
        want = masked
    loaded = saving.load_saved_model(os.path.join(wd, "saved_model"))
    out = loaded.serve(x.indices, x.values, x.dense_shape)
    top = tf.math.top_k(want, k=5)
    np.testing.assert_allclose(out["scores"].numpy(), top.values.numpy(),
                               rtol=1e-5, atol=1e-5)
    assert (out["label_ids"].numpy() == top.indices.numpy()).all()
    every = loaded.score_all_labels(x.indices, x.values, x.dense_shape)
    np.testing.assert_allclose(every["label_scores"].numpy(),
                               model(x).numpy(), rtol=1e-5, atol=1e-5)
    saved = json.load(open(os.path.join(wd, "metrics.json")))
    assert saved["label_tree"]["weight"] == 0.5


def test_auto_weight_is_read_on_validation(tmp_path):
    result = train_and_evaluate(_config(), str(tmp_path / "auto"))
    info = result["label_tree"]
    table = info["validation"]
    best = max(table, key=lambda a: (np.mean(list(table[a].values())),
                                     -float(a)))
    assert info["weight"] == float(best)


def test_tree_off_exports_the_plain_model(tmp_path):
    wd = str(tmp_path / "off")
    result = train_and_evaluate(_config(**{"tree.enabled": False}), wd)
    assert "label_tree" not in result
    model = artifacts.load_model(wd)
    nested = [l for l in model.layers if isinstance(l, keras.Model)]
    assert not any(isinstance(l, LabelTreeScores)
                   for m in [model] + nested for l in m.layers)


def test_tree_config_checks_and_plan():
    for key, bad in (("tree.enabled", "yes"), ("tree.weight", -1.0),
                     ("tree.leaf_size", 1), ("tree.c", 0),
                     ("tree.threshold", -0.5), ("tree.max_labels", 0),
                     ("tree.max_classes", -1), ("tree.beam", 0),
                     ("tree.shortlist", 0), ("tree.rankers", "svm")):
        with pytest.raises(ConfigError, match=key):
            check_config(_config(**{key: bad}))
    mach = xconfig.get_config("mach")
    mach.tree.enabled = True
    with pytest.raises(ConfigError, match="scores every label"):
        check_config(mach)
    c = _config(**{"tree.enabled": True, "data.validation_fraction": 0.0})
    with pytest.raises(ConfigError, match="validation"):
        check_config(c)
    c = _config()
    head = check_config(c)
    x, y = _data()
    base = summarize(xdata.XCDataset(x, y))

    def plan(config, head, m, sparse, has_validation, multi_class=False):
        summary = dataclasses.replace(base, num_labels=m, sparse=sparse,
                                      multi_class=multi_class)
        return xscorers.get("tree").plan(config, head, summary,
                                         has_validation)
    assert plan(c, head, 24, True, True)[0]
    assert not plan(c, head, 24, False, True)[0]  # dense input
    assert not plan(c, head, 24, True, False)[0]  # no validation
    # above max_labels (multi-label) / max_classes (multi-class, checked
    # apart): off, or centroid rankers up to max_centroid_labels (0 by
    # default)
    assert plan(c, head, 200_000, True, True, True)[0]
    assert not plan(c, head, 200_000, True, True)[0]
    c.tree.max_centroid_labels = 1_048_576
    for m, multi_class in ((200_000, False), (10**6, False),
                           (10**6, True)):
        on, why = plan(c, head, m, True, True, multi_class)
        assert on and "centroid" in why
    assert not plan(c, head, 2 * 10**6, True, True)[0]
    c.tree.max_classes = c.tree.max_centroid_labels = 0
    assert not plan(c, head, 24, True, True, True)[0]
    # the rankers the plan resolves
    for m, want in ((24, "linear"), (200_000, "centroids")):
        summary = dataclasses.replace(base, num_labels=m)
        rankers = xscorers.get("tree").resolvers()["rankers"]
        assert rankers(_config(), summary, head, True)[0] == want
    assert not plan(mach, check_config(xconfig.get_config("mach")), 24,
                    True, True)[0]
    # the command line gives these string fields strings
    off = _config(**{"tree.enabled": "False"})
    assert not plan(off, check_config(off), 24, True, True)[0]
    fixed = _config(**{"tree.enabled": "true", "tree.weight": "0.3",
                       "data.validation_fraction": 0.0})
    assert plan(fixed, check_config(fixed), 24, True, False)[0]
