"""Tests of dense .npy/.npz embeddings plus an XC labels file."""

import re

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data

LABELS = "3 6\n5,0\n\n2:1 3:1\n"
WANT = [[1, 0, 0, 0, 0, 1], [0] * 6, [0, 0, 1, 1, 0, 0]]


@pytest.fixture
def labels_file(tmp_path):
    p = tmp_path / "labels.txt"
    p.write_text(LABELS)
    return p


def _emb():
    return np.arange(12, dtype=np.float64).reshape(3, 4) / 7


def _check(ds):
    assert isinstance(ds.features, np.ndarray)
    assert ds.features.dtype == np.float32
    assert ds.features.flags.c_contiguous
    np.testing.assert_array_equal(ds.features, _emb().astype(np.float32))
    assert isinstance(ds.labels, sp.csr_matrix)
    assert ds.labels.toarray().tolist() == WANT
    assert (ds.num_instances, ds.num_features, ds.num_labels) == (3, 4, 6)
    assert not ds.is_sparse


def test_npy(tmp_path, labels_file):
    np.save(tmp_path / "e.npy", _emb())
    _check(data.read_embeddings(tmp_path / "e.npy", labels_file))


@pytest.mark.parametrize("key", ["embeddings", "arr_0", "whatever"])
def test_npz_keys(tmp_path, labels_file, key):
    np.savez(tmp_path / "e.npz", **{key: _emb()})
    _check(data.read_embeddings(tmp_path / "e.npz", labels_file))


def test_npz_prefers_embeddings_key(tmp_path, labels_file):
    np.savez(tmp_path / "e.npz", other=np.zeros((3, 4)), embeddings=_emb())
    _check(data.read_embeddings(tmp_path / "e.npz", labels_file))
    np.savez(tmp_path / "f.npz", a=_emb(), b=_emb())
    with pytest.raises(ValueError, match=r"f\.npz.*found keys \['a', 'b'\]"):
        data.read_embeddings(tmp_path / "f.npz", labels_file)


def test_gzipped_labels(tmp_path):
    import gzip
    with gzip.open(tmp_path / "l.txt.gz", "wt") as f:
        f.write(LABELS)
    np.save(tmp_path / "e.npy", _emb())
    _check(data.read_embeddings(tmp_path / "e.npy", tmp_path / "l.txt.gz"))


def test_errors(tmp_path, labels_file):
    np.save(tmp_path / "one_d.npy", np.zeros(3))
    with pytest.raises(ValueError, match=r"one_d\.npy: .*2-D"):
        data.read_embeddings(tmp_path / "one_d.npy", labels_file)
    bad = _emb()
    bad[1, 2] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    with pytest.raises(ValueError, match=r"nan\.npy: non-finite .* row 1"):
        data.read_embeddings(tmp_path / "nan.npy", labels_file)
    np.save(tmp_path / "str.npy", np.array([["a"]]))
    with pytest.raises(ValueError, match="real numbers"):
        data.read_embeddings(tmp_path / "str.npy", labels_file)
    np.save(tmp_path / "four.npy", np.zeros((4, 2)))
    with pytest.raises(ValueError, match=r"four\.npy has 4 rows .* 3"):
        data.read_embeddings(tmp_path / "four.npy", labels_file)
    (tmp_path / "e.txt").write_text("x")
    with pytest.raises(ValueError, match=r"\.npy or \.npz"):
        data.read_embeddings(tmp_path / "e.txt", labels_file)
    np.save(tmp_path / "e.npy", _emb())
    bad_labels = tmp_path / "bad_labels.txt"
    bad_labels.write_text("3 6\n5,0\n6\n\n")
    with pytest.raises(ValueError) as e:
        data.read_embeddings(tmp_path / "e.npy", bad_labels)
    assert str(e.value).startswith(f"{bad_labels}, line 3:")
    assert re.search("label id 6 out of range", str(e.value))
