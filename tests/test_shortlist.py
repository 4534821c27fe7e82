"""Shortlist and re-rank in the library: the label tree's beam search and
path scores (ops and stock formulations) against the NumPy reference of
:class:`xmc_tf.shortlist.LabelTree`, the topology, the kNN op against a
brute force, the scorers of given labels against gathers of their full
scores, :class:`xmc_tf.layers.FusedScores` (its top k against a NumPy
re-rank of its shortlist, saving, the SavedModel's signatures, portable
export) and the P@k engine of :mod:`xmc_tf.shortlist.fusion` against brute
force."""

import itertools
import zipfile

import h5py
import keras
from hypothesis import given, settings
from hypothesis import strategies as st
import numpy as np
import pytest
import scipy.sparse as sp
import tensorflow as tf

import xmc_tf
from xmc_tf import config as xconfig
from xmc_tf import decoding, saving
from xmc_tf.data import make_synthetic, normalize_features
from xmc_tf.job import build as xbuild
from xmc_tf.layers import (FeatureNormalization, FusedScores,
                           LabelTreeScores, NearestNeighbourScores,
                           NormalizedScorer, UniformSparseDense,
                           candidate_scorer, label_centroids,
                           merge_shortlists)
from xmc_tf.ops import label_tree as olt
from xmc_tf.ops import stock
from xmc_tf.ops.neighbours import nearest_neighbours
from xmc_tf.ops.sparse_candidates import sparse_input_sampled_matmul
from xmc_tf.shortlist import (TreeTopology, fit_centroid_tree,
                              fit_label_tree)
from xmc_tf.shortlist.fusion import (NETWORK, FusionPart, ShortlistScores,
                                     choose_fusion_weights)


def _sparse(x, shuffle=None):
    c = sp.coo_matrix(x)
    order = (np.arange(c.nnz) if shuffle is None
             else np.random.default_rng(shuffle).permutation(c.nnz))
    return tf.SparseTensor(
        np.stack([c.row, c.col], 1)[order].astype(np.int64),
        c.data[order].astype(np.float32), c.shape)


@pytest.fixture(scope="module")
def data():
    d = make_synthetic(1200, 300, 150, labels_per_instance=2, seed=0)
    x, _ = normalize_features(d.features, "l2")
    return sp.csr_matrix(x), d.labels


@pytest.fixture(scope="module")
def trees(data):
    x, y = data
    one = sp.csr_matrix((np.ones(y.shape[0]), (np.arange(y.shape[0]),
                                                y.tocsr().indices[y.indptr[:-1]])),
                        shape=y.shape)
    return {"multi-label": fit_label_tree(x[:1000], y[:1000], leaf_size=8),
            "multi-class": fit_label_tree(x[:1000], one[:1000], leaf_size=8)}


def test_centroid_tree_columns_are_the_labels_centroids(data):
    """fit_centroid_tree: a label's column is its normalised PIFA row kept
    at its strongest features, a node's the normalised sum of its labels'
    PIFA rows kept the same way; the beam over them reaches each training
    instance's labels far more often than chance."""
    x, y = data
    tree = fit_centroid_tree(x[:1000], y[:1000], leaf_size=8,
                             node_features=20, label_features=6)
    assert (tree.bias == 0).all()
    t = tree.topology()  # a consistent tree
    assert t.num_nodes == tree.num_columns - tree.num_labels + 1
    yy = sp.csr_matrix(y[:1000], dtype=np.float32)
    yy.data[:] = 1
    pifa = (yy.T @ x[:1000]).toarray()
    pifa /= np.maximum(np.linalg.norm(pifa, axis=1, keepdims=True), 1e-12)
    cols = tree.weights.T.toarray()  # [columns, D]

    def kept(v, keep):
        out = np.zeros_like(v)
        top = np.argsort(-np.abs(v), kind="stable")[:keep]
        out[top] = v[top]
        return out / max(np.linalg.norm(out), 1e-12)
    own = tree.paths[np.arange(tree.num_labels),
                     (tree.paths < tree.num_columns).sum(1) - 1]
    for label in range(0, tree.num_labels, 11):
        np.testing.assert_allclose(cols[own[label]], kept(pifa[label], 6),
                                   atol=1e-5)
    # a node column: the labels under it
    node_col = tree.paths[0][0]
    under = [l for l in range(tree.num_labels) if tree.paths[l][0] == node_col]
    np.testing.assert_allclose(cols[node_col],
                               kept(pifa[under].sum(0), 20), atol=1e-5)
    ids, _ = tree.beam_search(x[:200], 2, 15)
    truth = y[:200].toarray()
    recall = np.mean([truth[i, ids[i][ids[i] >= 0]].sum() / truth[i].sum()
                      for i in range(200)])
    assert recall > 3 * 15 / tree.num_labels  # 3x a random shortlist
    with pytest.raises(ValueError, match="node_features"):
        fit_centroid_tree(x, y, node_features=0)


def _arrays(tree):
    a, t = tree.to_arrays(), tree.topology()
    return olt.TreeArrays(a["indptr"], a["indices"], a["data"], a["bias"],
                          a["paths"], t.child_indptr, t.children,
                          t.column_node, t.column_label)


def _assert_same_ranking(ids, scores, ref_ids, ref_scores):
    """Equal ids where the reference's scores are not tied within float32
    rounding; equal scores (to rounding) everywhere."""
    np.testing.assert_allclose(np.where(np.isinf(ref_scores), 0, scores),
                               np.where(np.isinf(ref_scores), 0, ref_scores),
                               rtol=1e-5, atol=1e-5)
    assert np.array_equal(np.isinf(scores), np.isinf(ref_scores))
    gap = np.abs(np.diff(np.where(np.isinf(ref_scores), -1e9, ref_scores),
                         axis=1))
    clear = np.ones(ids.shape, bool)
    clear[:, 1:] &= gap > 1e-4
    clear[:, :-1] &= gap > 1e-4
    assert (ids[clear] == ref_ids[clear]).all()


def test_topology_of_the_paths(trees):
    for tree in trees.values():
        t = tree.topology()
        assert t.num_nodes == tree.num_columns - tree.num_labels + 1
        # every column is the child of one node; labels own their column
        assert sorted(t.children.tolist()) == list(range(tree.num_columns))
        own = tree.paths[np.arange(tree.num_labels),
                         (tree.paths < tree.num_columns).sum(1) - 1]
        assert (t.column_label[own] == np.arange(tree.num_labels)).all()
        assert ((t.column_label >= 0) != (t.column_node >= 1)).all()
        # walking down: the children of a path's column hold its next one
        for label in range(0, tree.num_labels, 7):
            node = 0
            for c in tree.paths[label][tree.paths[label] < tree.num_columns]:
                kids = t.children[t.child_indptr[node]:t.child_indptr[node + 1]]
                assert c in kids
                node = t.column_node[c]
    with pytest.raises(ValueError, match="two parents"):
        TreeTopology.from_paths(np.array([[0, 2], [1, 2]]), 3)
    with pytest.raises(ValueError, match="no label's path"):
        TreeTopology.from_paths(np.array([[0, 3], [1, 3]]), 3)
    with pytest.raises(ValueError, match="must hold columns"):
        TreeTopology.from_paths(np.array([[0, 5]]), 3)


@pytest.mark.parametrize("kind,beam,k", [("multi-label", 1, 5),
                                         ("multi-label", 4, 40),
                                         ("multi-class", 3, 200),
                                         ("multi-class", 50, 150)])
def test_beam_search_op_and_stock_match_numpy(data, trees, kind, beam, k):
    x, _ = data
    tree = trees[kind]
    q = sp.vstack([x[1000:1100], sp.csr_matrix((1, x.shape[1]))]).tocsr()
    ref_ids, ref_scores = tree.beam_search(q, beam, k)
    st = _sparse(q, shuffle=1)  # entries in any order
    for stock_only in (False, True):
        with stock.stock_ops(stock_only):
            ids, scores = olt.label_tree_beam_search(st, _arrays(tree), beam, k)
        _assert_same_ranking(ids.numpy(), scores.numpy(), ref_ids, ref_scores)
    # the full beam reaches every label: its path scores are the full ones
    if beam >= 50:
        full = tree.log_scores(q)
        np.testing.assert_allclose(
            np.sort(scores.numpy(), 1)[:, ::-1],
            np.sort(full, 1)[:, ::-1][:, :k], rtol=1e-5, atol=1e-5)


def test_path_scores_and_layer_methods_match_numpy(data, trees):
    x, _ = data
    q = x[1000:1060]
    rng = np.random.default_rng(0)
    for tree in trees.values():
        layer = LabelTreeScores.from_tree(tree, beam=3)
        ids = rng.integers(-1, tree.num_labels, (q.shape[0], 17)).astype(
            np.int32)
        want = tree.path_scores(q, ids)
        st = _sparse(q)
        for stock_only in (False, True):
            with stock.stock_ops(stock_only):
                got = layer.score_candidates(st, ids).numpy()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(layer(st).numpy(), tree.log_scores(q),
                                   rtol=1e-5, atol=1e-5)
        ids, scores = layer.shortlist(st, 12)
        _assert_same_ranking(ids.numpy(), scores.numpy(),
                             *tree.beam_search(q, 3, 12))
        # a dense batch is taken as the sparse one
        dense = layer.score_candidates(tf.constant(q.toarray()), ids)
        np.testing.assert_allclose(dense.numpy(), tree.path_scores(q, ids),
                                   rtol=1e-5, atol=1e-5)


def test_label_tree_ops_reject_bad_input(trees):
    tree = trees["multi-label"]
    good = _arrays(tree)
    x = tf.SparseTensor([[0, 1]], [1.0], [1, tree.num_features])
    lib_call = olt.label_tree_beam_search
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_features"):
        lib_call(tf.SparseTensor([[0, tree.num_features]], [1.0],
                                 [1, tree.num_features + 1]), good, 2, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="dense_shape"):
        lib_call(tf.SparseTensor([[0, 1]], [1.0], [1, 5]), good, 2, 3)

    def corrupt(**changes):
        fields = dict(vars(good))
        fields.update(changes)
        return olt.TreeArrays(**fields)
    cols = np.asarray(good.columns).copy()
    indptr = np.asarray(good.indptr)
    f = int(np.flatnonzero(np.diff(indptr))[0])  # a feature with weights
    cols[indptr[f]] = tree.num_columns + 7
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"weight_columns\[\d+\] = \d+ is out of range"):
        lib_call(tf.SparseTensor([[0, f]], [1.0], [1, tree.num_features]),
                 corrupt(columns=cols), 2, 3)
    kids = np.asarray(good.children).copy()
    kids[0] = -3
    with pytest.raises(tf.errors.InvalidArgumentError, match="children"):
        lib_call(x, corrupt(children=kids), 2, 3)
    # a cycle: a root child's node lists itself as its child
    first = int(np.asarray(good.children)[0])
    loop = np.asarray(good.column_node).copy()
    loop[first] = 0
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="column_node|cycle"):
        lib_call(x, corrupt(column_node=loop), 2, 3)
    with pytest.raises(tf.errors.InvalidArgumentError, match="label_ids"):
        olt.label_tree_path_scores(x, good, [[tree.num_labels]])
    paths = np.asarray(good.paths).copy()
    paths[0, 0] = -2
    with pytest.raises(tf.errors.InvalidArgumentError, match="paths"):
        olt.label_tree_path_scores(x, corrupt(paths=paths), [[0]])


def test_tree_layer_of_an_earlier_file_loads_its_topology(tmp_path, data,
                                                          trees):
    """A ``.keras`` file written before the topology variables existed
    (five arrays) loads, the topology derived from its paths."""
    x, _ = data
    tree = trees["multi-class"]
    inp = keras.Input((tree.num_features,), sparse=True)
    model = keras.Model(inp, LabelTreeScores.from_tree(tree)(inp))
    path = str(tmp_path / "tree.keras")
    model.save(path)
    old = str(tmp_path / "old.keras")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(old, "w") as dst:
        for item in src.infolist():
            blob = src.read(item.filename)
            if item.filename.endswith(".h5"):
                weights = tmp_path / "w.h5"
                weights.write_bytes(blob)
                with h5py.File(weights, "a") as f:
                    def drop(name, obj):
                        if isinstance(obj, h5py.Group) and "vars" in name:
                            for key in ("5", "6", "7", "8"):
                                if key in obj:
                                    del obj[key]
                    f.visititems(drop)
                blob = weights.read_bytes()
            dst.writestr(item, blob)
    loaded = saving.load_keras_file(old).layers[-1]
    q = _sparse(x[1000:1020])
    ids, _ = loaded.shortlist(q, 10)
    assert (ids.numpy() == tree.beam_search(x[1000:1020], 10, 10)[0]).all()


def _brute_knn(x, stored, labels, k, power):
    sims = (x @ stored.T).toarray()
    votes = np.zeros((x.shape[0], labels.shape[1]))
    for i, s in enumerate(sims):
        order = [t for t in np.lexsort((np.arange(s.size), -s)) if s[t] > 0]
        for t in order[:k]:
            votes[i, labels[t].indices] += s[t] ** power
    return sims, votes


def test_knn_op_and_votes_match_a_brute_force(data):
    x, y = data
    stored, q = x[:1000], x[1000:]
    layer = NearestNeighbourScores.from_data(stored, y[:1000], neighbours=9,
                                             power=1.5)
    sims, votes = _brute_knn(q, stored, y[:1000], 9, 1.5)
    # rows whose 9th and 10th similarities differ (float32 rounding may
    # order a tie either way)
    ranked = -np.sort(-sims, axis=1)
    clear = np.abs(ranked[:, 8] - ranked[:, 9]) > 1e-5
    assert clear.mean() > 0.8
    st = _sparse(q, shuffle=2)
    for stock_only in (False, True):
        with stock.stock_ops(stock_only):
            ids, got = layer.nearest(st)
            full = layer(st).numpy()
        ids, got = ids.numpy(), got.numpy()
        for i in range(q.shape[0]):
            keep = ids[i] >= 0
            np.testing.assert_allclose(got[i][keep], sims[i, ids[i][keep]],
                                       rtol=1e-5)
            top = np.sort(sims[i][sims[i] > 0])[::-1][:9]
            np.testing.assert_allclose(np.sort(got[i][keep])[::-1], top,
                                       rtol=1e-5)
        np.testing.assert_allclose(full[clear], votes[clear], rtol=1e-4,
                                   atol=1e-5)
    full = layer(st).numpy()  # the op's own, ties as it breaks them
    cand = np.random.default_rng(3).integers(-1, y.shape[1], (q.shape[0], 30))
    want = np.where(cand >= 0, np.take_along_axis(full, np.maximum(cand, 0),
                                                  1), 0)
    np.testing.assert_allclose(layer.score_candidates(st, cand).numpy(), want,
                               rtol=1e-5, atol=1e-6)
    ids, top = layer.shortlist(st, 6)
    votes = full
    for i in range(q.shape[0]):
        held = ids.numpy()[i][ids.numpy()[i] >= 0]
        want_top = np.sort(votes[i][votes[i] > 0])[::-1][:6]
        np.testing.assert_allclose(votes[i, held], want_top, rtol=1e-4)
    with pytest.raises(tf.errors.InvalidArgumentError, match="num_features"):
        nearest_neighbours(tf.SparseTensor([[0, 400]], [1.0], [1, 401]),
                           layer.indptr, layer.instances, layer.values,
                           1000, 3)


def test_uniform_sparse_candidates_on_sparse_input():
    layer = UniformSparseDense(90, 7, seed=0, kernel_initializer="glorot_uniform",
                               bias_initializer="glorot_uniform")
    x = sp.random(20, 40, density=0.2, format="csr", random_state=0,
                  dtype=np.float32)
    # a repeated entry adds up, as in the full product
    st = tf.SparseTensor(tf.concat([_sparse(x).indices, [[0, 3]]], 0),
                         tf.concat([_sparse(x).values, [0.5]], 0), [20, 40])
    full = layer(st).numpy()
    cand = np.random.default_rng(1).integers(0, 90, (20, 11)).astype(np.int32)
    got = layer.score_candidates(st, cand).numpy()
    np.testing.assert_allclose(got, np.take_along_axis(full, cand, 1),
                               rtol=1e-5, atol=1e-6)
    with pytest.raises(tf.errors.InvalidArgumentError, match="out of range"):
        layer.score_candidates(st, cand + 90)
    # the op and its stock formulation, on bad connections too
    conn = layer.indices.numpy()
    weights = layer.kernel.numpy()
    for stock_only in (False, True):
        with stock.stock_ops(stock_only):
            got = sparse_input_sampled_matmul(st, conn, weights, cand)
        np.testing.assert_allclose(
            got.numpy(), np.take_along_axis(full - layer.bias.numpy(), cand,
                                            1), rtol=1e-5, atol=1e-6)
    bad = conn.copy()
    bad[cand[2, 3], 1] = 40
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"connections\[\d+, 1\] = 40 is out of range"):
        sparse_input_sampled_matmul(st, bad, weights, cand)
    with pytest.raises(tf.errors.InvalidArgumentError, match="candidates"):
        sparse_input_sampled_matmul(st, conn, weights, cand - 1 - cand.max())


def _network(num_features, num_labels, head="uniform_sparse", wide=16):
    c = xconfig.base(head)
    c.model.update(encoder_dims=(24,), wide_connections=wide)
    if head == "uniform_sparse":
        c.model.update(intermediate_dim=32, connections_per_label=6)
    return xbuild.build_network(c, num_features, num_labels, True)[0]


def test_candidate_scorer_equals_gathered_full_scores(data):
    x, _ = data
    st = _sparse(x[:30])
    cand = np.random.default_rng(2).integers(0, 150, (30, 13))
    for model in (_network(300, 150), _network(300, 150, wide=0)):
        keras.utils.set_random_seed(0)
        for layer in model.layers:  # non-zero wide kernels and biases
            for v in layer.weights:
                if v.dtype == "float32":
                    v.assign(np.random.default_rng(5).normal(
                        size=v.shape).astype(np.float32) * 0.3)
        full = model(st).numpy()
        got = candidate_scorer(model)(st, cand).numpy()
        np.testing.assert_allclose(got, np.take_along_axis(full, cand, 1),
                                   rtol=1e-4, atol=1e-5)
    inp = keras.Input((300,))
    dense = keras.Model(inp, keras.layers.Dense(150, activation="sigmoid")(inp))
    got = candidate_scorer(dense)(tf.constant(x[:30].toarray()), cand)
    np.testing.assert_allclose(
        got.numpy(), np.take_along_axis(dense(x[:30].toarray()).numpy(),
                                        cand, 1), rtol=1e-5)


def test_merge_shortlists():
    a = np.array([[5, 2, -1], [7, 7, 1]], np.int32)
    b = np.array([[2, 9], [-1, -1]], np.int32)
    got = merge_shortlists([a, b], min_width=7).numpy()
    assert got.tolist() == [[2, 5, 9, -1, -1, -1, -1],
                            [1, 7, -1, -1, -1, -1, -1]]


@pytest.fixture(scope="module")
def fused_model(data, trees):
    x, y = data
    tree = LabelTreeScores.from_tree(trees["multi-label"], beam=4,
                                     name="label_tree")
    votes = NearestNeighbourScores.from_data(x[:1000], y[:1000], neighbours=12,
                                             name="label_neighbours")
    weighted, idf = normalize_features(x[:1000], "tfidf")
    centroids = NormalizedScorer(
        label_centroids(weighted, y[:1000], 12, seed=0, name="inner"),
        FeatureNormalization(300, "tfidf", idf=idf, name="inner_norm"),
        name="idf_centroids")
    network = _network(300, 150)
    for v in network.weights:
        if v.dtype == "float32":
            v.assign(np.random.default_rng(6).normal(size=v.shape).astype(
                np.float32) * 0.3)
    layer = FusedScores(network, [tree, centroids, votes], [0.4, 2.0, 0.3],
                        shortlist=[20, 0, 10], name="fused")
    inp = keras.Input((300,), sparse=True)
    return keras.Model(inp, layer(inp)), layer


def test_fused_scores_top_k_reranks_the_shortlist(data, fused_model):
    x, _ = data
    model, layer = fused_model
    q = x[1000:1080]
    st = _sparse(q)
    full = model(st).numpy()
    parts = [layer.network(st).numpy()] + [s(st).numpy()
                                           for s in layer.scorers]
    np.testing.assert_allclose(
        full, parts[0] + 0.4 * parts[1] + 2.0 * parts[2] + 0.3 * parts[3],
        rtol=1e-4, atol=1e-4)
    ids, sources = layer.shortlist_sources(st, 5)
    ids = ids.numpy()
    tree_ids = layer.scorers[0].shortlist(st, 20)[0].numpy()
    vote_ids = layer.scorers[2].shortlist(st, 10)[0].numpy()
    for i in range(q.shape[0]):
        union = sorted((set(tree_ids[i]) | set(vote_ids[i])) - {-1})
        assert ids[i][ids[i] >= 0].tolist() == union
        assert (sources["label_tree"].numpy()[i] ==
                np.isin(ids[i], tree_ids[i]) & (ids[i] >= 0)).all()
    top_ids, top_scores = decoding.top_k_function(model, 5)(st)
    for i in range(q.shape[0]):
        held = ids[i][ids[i] >= 0]
        order = held[np.lexsort((held, -full[i, held]))][:5]
        assert top_ids.numpy()[i].tolist() == order.tolist()
        np.testing.assert_allclose(top_scores.numpy()[i], full[i, order],
                                   rtol=1e-4, atol=1e-4)


def test_fused_scores_save_export_and_portable_serve(tmp_path, data,
                                                     fused_model):
    x, _ = data
    model, layer = fused_model
    st = tf.sparse.reorder(_sparse(x[1000:1050]))
    want_ids, want_scores = decoding.top_k_function(model, 4)(st)
    path = str(tmp_path / "fused.keras")
    model.save(path)
    loaded = saving.load_keras_file(path)
    got = decoding.top_k_function(loaded, 4)(st)
    assert (got[0].numpy() == want_ids.numpy()).all()
    np.testing.assert_allclose(loaded(st).numpy(), model(st).numpy(),
                               rtol=1e-5, atol=1e-5)
    for portable in (False, True):
        out = str(tmp_path / f"sm_{portable}")
        assert saving.export_saved_model(model, out, k=4,
                                         portable=portable) == portable
        sm = (tf.saved_model.load(out) if portable
              else saving.load_saved_model(out))
        top = sm.signatures["serve"](indices=st.indices, values=st.values,
                                     dense_shape=st.dense_shape)
        assert (top["label_ids"].numpy() == want_ids.numpy()).all()
        np.testing.assert_allclose(top["scores"].numpy(), want_scores.numpy(),
                                   rtol=1e-4, atol=1e-4)
        every = sm.signatures["score_all_labels"](
            indices=st.indices, values=st.values, dense_shape=st.dense_shape)
        np.testing.assert_allclose(every["label_scores"].numpy(),
                                   model(st).numpy(), rtol=1e-4, atol=1e-4)


def test_fused_scores_without_shortlist_and_nested(data, fused_model):
    x, _ = data
    model, layer = fused_model
    exact = FusedScores(layer.network, layer.scorers, layer.fusion_weights)
    assert not exact.shortlists
    inp = keras.Input((300,), sparse=True)
    exact_model = keras.Model(inp, exact(inp))
    st = _sparse(x[1000:1030])
    top = decoding.top_k_function(exact_model, 5)(st)
    want = tf.math.top_k(exact_model(st), 5)
    assert (top[0].numpy() == want.indices.numpy()).all()
    # inside a larger model the fused layer is ranked on its exact scores
    wrapped = keras.Model(inp, keras.layers.Activation("linear")(model(inp)))
    top = decoding.top_k_function(wrapped, 5)(st)
    want = tf.math.top_k(model(st), 5)
    assert (top[0].numpy() == want.indices.numpy()).all()
    with pytest.raises(ValueError, match="shortlist"):
        FusedScores(layer.network, [layer.scorers[1]], [1.0], shortlist=[5])
    with pytest.raises(ValueError, match=">= 0"):
        FusedScores(layer.network, [layer.scorers[0]], [-1.0])


def _brute_precision(scores, ids, labels, k):
    y = labels.toarray()
    hits = 0
    for i in range(scores.shape[0]):
        valid = ids[i] >= 0
        order = sorted(np.flatnonzero(valid), key=lambda j: (-scores[i, j], j))
        hits += sum(y[i, ids[i, j]] for j in order[:k])
    return 100.0 * hits / (k * scores.shape[0])


def test_shortlist_scores_precision_against_brute_force():
    rng = np.random.default_rng(4)
    n, m, w = 40, 30, 9
    labels = sp.csr_matrix((rng.random((n, m)) < 0.15).astype(np.float32))
    ids = np.stack([np.sort(rng.choice(m, w, replace=False))
                    for _ in range(n)])
    ids[:, -2:] = -1  # padding
    a = rng.normal(size=(n, w)).astype(np.float32)
    b = rng.normal(size=(n, w)).astype(np.float32)
    src = rng.random((n, w)) < 0.6
    blocks = [(ids[:15], {"a": a[:15], "b": b[:15]}, labels[:15],
               {"b": src[:15]}),
              (ids[15:, :-1], {"a": a[15:, :-1], "b": b[15:, :-1]},
               labels[15:], {"b": src[15:, :-1]})]
    held = ShortlistScores.collect(blocks)
    held = held.with_scores(NETWORK, [a[:20] * 0, a[20:] * 0])
    # "b" shortlists: a sum that names it, at any weight, ranks only its
    # labels; one that does not name it ranks every label held
    for wa, wb in itertools.product((0.0, 0.5, 2.0), (None, 0.0, 1.0)):
        weights = {"a": wa} if wb is None else {"a": wa, "b": wb}
        got = held.precision(weights, (1, 3))
        fused = wa * a + (wb or 0.0) * b
        mask = np.where((ids >= 0) & (src if wb is not None else True), ids,
                        -1)
        for k in (1, 3):
            assert got[k] == pytest.approx(
                _brute_precision(fused, mask, labels, k))
    y = labels.toarray()
    positives = y.sum()
    inside = sum(y[i, ids[i][ids[i] >= 0]].sum() for i in range(n))
    assert held.recall() == pytest.approx(100 * inside / positives)
    with pytest.raises(ValueError, match="scored"):
        held.with_scores("c", [a[:10]])
    with pytest.raises(ValueError, match="no instances"):
        ShortlistScores.collect([])


def test_coordinate_ascent_ends_at_a_coordinate_optimum():
    rng = np.random.default_rng(7)
    n, m = 120, 40
    labels = sp.csr_matrix((rng.random((n, m)) < 0.1).astype(np.float32))
    truth = labels.toarray()
    ids = np.tile(np.arange(m), (n, 1))
    scores = {NETWORK: rng.normal(size=(n, m)).astype(np.float32),
              "t": (truth + rng.normal(size=(n, m))).astype(np.float32),
              "c1": (truth * 0.5 + rng.normal(size=(n, m))).astype(np.float32),
              "c2": rng.normal(size=(n, m)).astype(np.float32)}
    held = ShortlistScores.collect([(ids, scores, labels, None)])
    grid = (0.0, 0.5, 1.0, 2.0, 4.0)
    parts = [FusionPart("tree", ("t",), grid),
             FusionPart("centroids", ("c1", "c2"), grid),
             FusionPart("fixed", ("c2",), grid, weight=0.5)]
    choice = choose_fusion_weights(held, parts, (1, 3), max_rounds=10)
    assert choice.weight["fixed"] == 0.5
    assert choice.weights()[NETWORK] == 1.0
    best = np.mean(list(held.precision(choice.weights(), (1, 3)).values()))
    for part in parts[:2]:
        for name, w in itertools.product(part.variants, grid):
            trial = dict(choice.weights())
            trial.pop(choice.scorer[part.name])
            trial[name] = w
            mean = np.mean(list(held.precision(trial, (1, 3)).values()))
            assert mean <= best + 1e-9
    assert choose_fusion_weights(None, parts, (1,)).weight["tree"] == 0.0


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_label_tree_ops_never_crash_on_corrupt_arrays(trees, data):
    """Any one entry of any array set to any int: the ops answer or raise
    InvalidArgumentError (the kernels range-check what they read)."""
    tree = trees["multi-label"]
    good = _arrays(tree)
    name = data.draw(st.sampled_from(["indptr", "columns", "paths",
                                      "child_indptr", "children",
                                      "column_node", "column_label"]))
    array = np.array(getattr(good, name))
    flat = array.reshape(-1)
    where = data.draw(st.integers(0, flat.size - 1))
    flat[where] = data.draw(st.integers(-2**31, 2**31 - 1))
    fields = dict(vars(good))
    fields[name] = array
    broken = olt.TreeArrays(**fields)
    x = tf.SparseTensor([[0, 0], [0, 5], [1, 7]], [1.0, 0.5, 2.0],
                        [2, tree.num_features])
    for call in (lambda: olt.label_tree_beam_search(x, broken, 3, 7),
                 lambda: olt.label_tree_path_scores(
                     x, broken, [[0, 3, -1], [5, 1, 2]])):
        try:
            ids = call()
        except tf.errors.InvalidArgumentError:
            continue
        assert ids is not None
