"""Tests of the XC repo readers/writers, bundled data and load_dataset."""

import gzip
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

from xmc_tf import data
from xmc_tf.data import xc_reader

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"

# (relative path, N, D, L, number of instances without labels)
REAL_FILES = [
    ("Bibtex/xc/bibtex_xcsplit_train.txt.gz", 4880, 1836, 159, 0),
    ("Bibtex/xc/bibtex_xcsplit_test.txt.gz", 2515, 1836, 159, 0),
    ("Delicious/xc/delicious_xcsplit_train.txt.gz", 12920, 500, 983, 12),
    ("Delicious/xc/delicious_xcsplit_test.txt.gz", 3185, 500, 983, 2),
]


def _random_dataset(rng, n=57, d=40, num_labels=23):
    """Random data with empty label rows, empty feature rows and odd values."""
    x = sp.random(n, d, density=0.2, format="csr", dtype=np.float32,
                  random_state=rng)
    x.data = rng.choice(
        np.array([1, 2, 0.1, -3.25, 1e-8, 3.4e38, 123456.7, 1 / 3],
                 np.float32), size=x.nnz)
    y = sp.random(n, num_labels, density=0.15, format="csr",
                  dtype=np.float32, random_state=rng)
    y.data[:] = 1.0
    # Row 0: no labels; row 1: no features; row 2: neither.
    x = x.tolil()
    y = y.tolil()
    y[0, :] = 0
    y[2, :] = 0
    x[1, :] = 0
    x[2, :] = 0
    x, y = x.tocsr(), y.tocsr()
    x.eliminate_zeros()
    y.eliminate_zeros()
    return data.XCDataset(features=x, labels=y)


def _assert_same(a: data.XCDataset, b: data.XCDataset):
    assert a.features.shape == b.features.shape
    assert a.labels.shape == b.labels.shape
    for m1, m2 in ((a.features, b.features), (a.labels, b.labels)):
        assert isinstance(m2, sp.csr_matrix)
        assert m2.dtype == np.float32
        assert m2.has_sorted_indices
        np.testing.assert_array_equal(m1.indptr, m2.indptr)
        np.testing.assert_array_equal(m1.indices, m2.indices)
        np.testing.assert_array_equal(m1.data, m2.data)


@pytest.mark.parametrize("name", ["data.txt", "data.txt.gz"])
def test_round_trip(tmp_path, name):
    ds = _random_dataset(np.random.default_rng(0))
    path = tmp_path / name
    data.write_xc(path, ds)
    back = data.read_xc(path)
    _assert_same(ds, back)
    assert back.labels.data.min() == 1.0
    raw = path.read_bytes()
    assert (raw[:2] == b"\x1f\x8b") == name.endswith(".gz")
    text = (gzip.decompress(raw) if name.endswith(".gz") else raw).decode()
    lines = text.split("\n")
    assert lines[0] == "57 40 23"
    assert lines[1].startswith(" ")       # row 0 has no labels
    assert lines[3] == " "                # row 2 has nothing
    assert ":1 " in text or text.count(":1\n")  # integers written as "1"


def test_round_trip_xy_and_labels_file(tmp_path):
    ds = _random_dataset(np.random.default_rng(1))
    data.write_xc_labels(tmp_path / "y.txt", ds.labels)
    # X file written by hand from the combined writer's feature fields.
    data.write_xc(tmp_path / "c.txt", ds)
    lines = (tmp_path / "c.txt").read_text().split("\n")
    x_lines = [f"{ds.num_instances} {ds.num_features}"]
    x_lines += [ln.partition(" ")[2] for ln in lines[1:-1]]
    (tmp_path / "x.txt").write_text("\n".join(x_lines) + "\n")
    _assert_same(ds, data.read_xc_xy(tmp_path / "x.txt", tmp_path / "y.txt"))


def test_unsorted_duplicates_blank_trailing_lines_crlf(tmp_path):
    p = tmp_path / "u.txt"
    p.write_bytes(b"3 6 5\r\n4,1,4 5:1 2:2 2:0.5 3:0\r\n 0:1\r\n\r\n\r\n  \n")
    ds = data.read_xc(p)
    assert ds.labels.toarray().tolist() == [
        [0, 1, 0, 0, 1], [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]]
    # duplicates summed, explicit zero dropped, indices sorted
    assert ds.features[0].indices.tolist() == [2, 5]
    assert ds.features[0].data.tolist() == [2.5, 1.0]
    assert ds.features[1].indices.tolist() == [0]
    assert ds.features[2].nnz == 0


@pytest.mark.parametrize("rel,n,d,num_labels,empty", REAL_FILES)
def test_real_files(rel, n, d, num_labels, empty):
    path = SHARED / rel
    if not path.exists():
        pytest.skip(f"{path} not available")
    ds = data.read_xc(path)
    assert (ds.num_instances, ds.num_features, ds.num_labels) == (
        n, d, num_labels)
    assert int((ds.labels.getnnz(axis=1) == 0).sum()) == empty
    # Independent, naive per-line parse of the same file.
    with gzip.open(path, "rt") as f:
        assert f.readline().split() == [str(n), str(d), str(num_labels)]
        rows = f.read().split("\n")
    rows = [r for r in rows if r]
    assert len(rows) == n
    lab_nnz = feat_nnz = 0
    for i in (0, 1, n // 2, n - 1):
        lab, _, feat = rows[i].partition(" ")
        labs = sorted(int(t) for t in lab.split(",") if t)
        pairs = sorted((int(t.split(":")[0]), float(t.split(":")[1]))
                       for t in feat.split())
        assert ds.labels[i].indices.tolist() == labs
        assert ds.features[i].indices.tolist() == [p[0] for p in pairs]
        assert ds.features[i].data.tolist() == [p[1] for p in pairs]
    for r in rows:
        lab, _, feat = r.partition(" ")
        lab_nnz += len([t for t in lab.split(",") if t])
        feat_nnz += len(feat.split())
    assert ds.labels.nnz == lab_nnz
    assert ds.features.nnz == feat_nnz
    assert set(np.unique(ds.features.data).tolist()) == {1.0}


def test_label_counts():
    """XCDataset.label_counts against a count over the dense label rows;
    an explicitly stored 0 is no label."""
    rng = np.random.default_rng(3)
    ds = _random_dataset(rng)
    dense = ds.labels.toarray()
    np.testing.assert_array_equal(ds.label_counts(),
                                  np.count_nonzero(dense, axis=0))
    y = sp.csr_matrix((np.array([1.0, 0.0, 1.0], np.float32),
                       np.array([0, 2, 2]), np.array([0, 2, 3])), shape=(2, 3))
    counts = data.XCDataset(np.zeros((2, 1), np.float32), y).label_counts()
    assert counts.dtype == np.int64 and counts.tolist() == [1, 0, 1]


def test_bundled_bibtex_matches_shared_copy():
    tr = data.load_bundled("bibtex", "train")
    te = data.load_dataset("bibtex:test")
    assert (tr.num_instances, tr.num_features, tr.num_labels) == (
        4880, 1836, 159)
    assert te.num_instances == 2515
    assert data.load_dataset("bibtex").num_instances == 4880
    path = SHARED / "Bibtex/xc/bibtex_xcsplit_train.txt.gz"
    if path.exists():
        _assert_same(data.read_xc(path), tr)
    with pytest.raises(ValueError, match="unknown bundled"):
        data.load_bundled("nope")
    with pytest.raises(ValueError, match="unknown split"):
        data.load_bundled("bibtex", "valid")


def test_load_dataset_specs(tmp_path):
    ds = _random_dataset(np.random.default_rng(2))
    data.write_xc(tmp_path / "c.txt.gz", ds)
    _assert_same(ds, data.load_dataset(str(tmp_path / "c.txt.gz")))
    _assert_same(ds, data.load_dataset(tmp_path / "c.txt.gz"))  # PathLike
    data.write_xc_labels(tmp_path / "y.txt", ds.labels)
    emb = np.random.default_rng(0).normal(size=(ds.num_instances, 8))
    np.save(tmp_path / "e.npy", emb)
    got = data.load_dataset(f"{tmp_path / 'e.npy'}|{tmp_path / 'y.txt'}")
    np.testing.assert_array_equal(got.features, emb.astype(np.float32))
    with pytest.raises(ValueError, match=r"EMBEDDINGS\.npy\|LABELS"):
        data.load_dataset(str(tmp_path / "e.npy"))
    syn = data.load_dataset(
        "synthetic:num_instances=50,num_features=30,num_labels=1000,seed=3")
    assert (syn.num_instances, syn.num_features, syn.num_labels) == (
        50, 30, 1000)
    with pytest.raises(ValueError, match="key=value"):
        data.load_dataset("synthetic:50")


def _write(tmp_path, name, text):
    p = tmp_path / name
    if name.endswith(".gz"):
        with gzip.open(p, "wt") as f:
            f.write(text)
    else:
        p.write_text(text)
    return p


# (file content, expected 1-based line, message regex)
MALFORMED_XC = [
    ("", 1, "empty file"),
    ("3 x 4\n", 1, "malformed header"),
    ("3 4\n0 1:1\n", 1, "malformed header"),
    ("-3 4 5\n", 1, "malformed header"),
    ("3 4 5 6\n", 1, "malformed header"),
    ("2 5 4\n0 1:1\n7 1:1\n", 3, r"label id 7 out of range \[0, 4\)"),
    ("2 5 4\n0 1:1\n-1 1:1\n", 3, "label id -1 out of range"),
    ("2 5 4\n0 1:1\n1 5:1\n", 3, r"feature id 5 out of range \[0, 5\)"),
    ("2 5 4\n0 1:1\n1 -2:1\n", 3, "feature id -2 out of range"),
    ("2 5 4\n0 1:1\n1 2:abc\n", 3, "non-numeric feature value 'abc'"),
    ("2 5 4\n0 1:nan\n1 2:1\n", 2, "non-finite feature value"),
    ("2 5 4\n0 1:1\n1 2:1e50\n", 3, "non-finite feature value"),
    ("2 5 4\n0 1:1\n1 2\n", 3, "malformed feature token '2'"),
    ("2 5 4\n0 1:1:1\n1 2:1\n", 2, "malformed feature token '1:1:1'"),
    ("2 5 4\n0 1:\n1 2:1\n", 2, "malformed feature token '1:'"),
    ("2 5 4\n0 :1\n1 2:1\n", 2, "malformed feature token ':1'"),
    ("2 5 4\n0 1.5:1\n1 2:1\n", 2, "non-integer feature id '1.5'"),
    ("2 5 4\n0 1:1\nx 2:1\n", 3, "non-integer label id 'x'"),
    ("2 5 4\n0,,1 1:1\n1 2:1\n", 2, "non-integer label id ''"),
    ("2 5 4\n0 1:1\n1:1 2:1\n", 3, "must start with a space"),
    ("3 5 4\n0 1:1\n1 2:1\n", 4, "declares 3 instances but only 2"),
    ("1 5 4\n0 1:1\n1 2:1\n", 3, "more instance lines than the 1"),
    ("1 5 4\n0 1:1\n\n1 2:1\n", 4, "more instance lines"),
]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("content,line,msg", MALFORMED_XC)
def test_malformed_xc(tmp_path, content, line, msg, gz):
    name = "bad.txt.gz" if gz else "bad.txt"
    p = _write(tmp_path, name, content)
    with pytest.raises(ValueError) as e:
        data.read_xc(p)
    text = str(e.value)
    assert text.startswith(f"{p}, line {line}:"), text
    assert re.search(msg, text), text


def test_error_line_number_in_later_chunk(tmp_path, monkeypatch):
    monkeypatch.setattr(xc_reader, "_CHUNK_BYTES", 64)
    lines = [f"{i % 7},{(i + 3) % 7} {i % 11}:1 {(i * 5) % 11 + 11}:2"
             for i in range(500)]
    lines[377] = "1 3:1 oops"
    p = _write(tmp_path, "big.txt", "500 22 7\n" + "\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"{p}, line 379:")):
        data.read_xc(p)
    lines[377] = "1 3:1"
    p = _write(tmp_path, "big.txt", "500 22 7\n" + "\n".join(lines) + "\n")
    ds = data.read_xc(p)  # many chunks, all parsed
    assert ds.num_instances == 500
    assert ds.labels.nnz == 999 and ds.features.nnz == 999
    assert ds.labels[378].indices.tolist() == [0, 3]
    assert ds.labels[377].indices.tolist() == [1]
    monkeypatch.setattr(xc_reader, "_CHUNK_BYTES", 1 << 24)
    _assert_same(ds, data.read_xc(p))


def test_not_gzip_or_not_text(tmp_path):
    p = tmp_path / "fake.txt.gz"
    p.write_text("1 2 3\n0 1:1\n")
    with pytest.raises(ValueError, match=re.escape(str(p))):
        data.read_xc(p)
    p = tmp_path / "bin.txt"
    p.write_bytes(b"1 2 3\n\xff\xfe 1:1\n")
    with pytest.raises(ValueError, match=re.escape(str(p))):
        data.read_xc(p)


def test_xy_variant_label_forms(tmp_path):
    x = _write(tmp_path, "x.txt", "3 4\n0:1 3:0.5\n\n2:2\n")
    y_ids = _write(tmp_path, "y1.txt.gz", "3 5\n4,0\n\n2\n")
    y_vals = _write(tmp_path, "y2.txt", "3 5\n0:1 4:1\n\n2:1 3:0\n")
    y_mixed = _write(tmp_path, "y3.txt", "3 5\n0:1 4:1\n\n2\n")
    want = [[1, 0, 0, 0, 1], [0, 0, 0, 0, 0], [0, 0, 1, 0, 0]]
    for y in (y_ids, y_vals, y_mixed):
        ds = data.read_xc_xy(x, y)
        assert ds.labels.toarray().tolist() == want
        assert ds.labels.dtype == np.float32
    np.testing.assert_array_equal(
        ds.features.toarray(),
        np.array([[1, 0, 0, 0.5], [0, 0, 0, 0], [0, 0, 2, 0]], np.float32))


MALFORMED_X = [
    ("3 4 5\n", 1, "malformed header"),
    ("2 4\n0:1\n1\n", 3, "malformed feature token '1'"),
    ("2 4\n0:1\n4:1\n", 3, "feature id 4 out of range"),
    ("2 4\n0:1\n", 3, "declares 2 instances but only 1"),
]
MALFORMED_Y = [
    ("2\n", 1, "malformed header"),
    ("2 5\n0,1\n5\n", 3, "label id 5 out of range"),
    ("2 5\n0,1\n1:x\n", 3, "non-numeric label value 'x'"),
    ("2 5\n0 1\n1\n", 2, "malformed label list"),
    ("2 5\n0,1\n9:1\n", 3, "label id 9 out of range"),
    ("2 5\n0\n1\n2\n", 4, "more instance lines"),
]


@pytest.mark.parametrize("content,line,msg", MALFORMED_X)
def test_malformed_x_file(tmp_path, content, line, msg):
    x = _write(tmp_path, "x.txt", content)
    y = _write(tmp_path, "y.txt", "2 5\n0\n1\n")
    with pytest.raises(ValueError) as e:
        data.read_xc_xy(x, y)
    assert str(e.value).startswith(f"{x}, line {line}:"), str(e.value)
    assert re.search(msg, str(e.value))


@pytest.mark.parametrize("content,line,msg", MALFORMED_Y)
def test_malformed_y_file(tmp_path, content, line, msg):
    x = _write(tmp_path, "x.txt", "2 4\n0:1\n1:1\n")
    y = _write(tmp_path, "y.txt", content)
    with pytest.raises(ValueError) as e:
        data.read_xc_xy(x, y)
    assert str(e.value).startswith(f"{y}, line {line}:"), str(e.value)
    assert re.search(msg, str(e.value))


def test_xy_count_mismatch(tmp_path):
    x = _write(tmp_path, "x.txt", "2 4\n0:1\n1:1\n")
    y = _write(tmp_path, "y.txt", "3 5\n0\n1\n2\n")
    with pytest.raises(ValueError, match="has 2 instances but .*y.txt has 3"):
        data.read_xc_xy(x, y)


def test_xcdataset_validation():
    with pytest.raises(ValueError, match="rows"):
        data.XCDataset(np.zeros((3, 2), np.float32),
                       sp.csr_matrix((4, 5), dtype=np.float32))
    with pytest.raises(ValueError, match="scipy.sparse"):
        data.XCDataset(np.zeros((3, 2), np.float32), np.zeros((3, 5)))
    ds = data.XCDataset(sp.coo_matrix(np.eye(3, dtype=np.float32)),
                        sp.csc_matrix(np.eye(3, dtype=np.float32)))
    assert isinstance(ds.features, sp.csr_matrix)
    assert isinstance(ds.labels, sp.csr_matrix)
    assert "num_instances=3" in repr(ds)


def test_write_rejects_non_finite(tmp_path):
    ds = data.XCDataset(
        sp.csr_matrix(np.array([[np.inf, 1]], np.float32)),
        sp.csr_matrix((1, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="non-finite"):
        data.write_xc(tmp_path / "o.txt", ds)


# ---------------------------------------------------------------------------
# Strict grammar (issue 14): every malformed input is a ValueError naming the
# file and line; nothing is stripped or skipped silently.

STRICT_XC = [
    # Unicode / control characters inside or between tokens.
    ("2 5 4\n0 1:\u00a01\n1 2:1\n", 2, r"U\+00A0 \(NO-BREAK SPACE\) at column 5"),
    ("2 5 4\n0 1:1\n1\u30002:1\n", 3, r"U\+3000 \(IDEOGRAPHIC SPACE\)"),
    ("2 5 4\n0 1:1\u2003 2:1\n1 2:1\n", 2, r"U\+2003"),
    ("2 5 4\n0 1:1\x0b2:1\n1 2:1\n", 2, r"U\+000B"),
    ("2 5 4\n0 1:1 \x0c\n1 2:1\n", 2, r"U\+000C"),
    ("2 5 4\n0 1:1\r2:1\n1 2:1\n", 2, r"U\+000D"),   # CR not before LF
    ("2 5 4\n0 1:1\n1 2:1\x00\n", 3, r"U\+0000"),
    ("2 5 4\n\u00a00 1:1\n1 2:1\n", 2, r"U\+00A0"),
    ("2 5 4\n0\u00a0 1:1\n1 2:1\n", 2, r"U\+00A0"),
    ("2 5 4\n0,\u00a01 1:1\n1 2:1\n", 2, r"U\+00A0"),
    ("2 5 4\n\u0661 1:1\n1 2:1\n", 2, r"U\+0661"),    # Arabic-Indic digit
    ("\ufeff2 5 4\n0 1:1\n1 2:1\n", 1, "malformed header"),  # BOM
    ("2\u00a05 4\n0 1:1\n1 2:1\n", 1, "malformed header"),
    # Signs, underscores, words.
    ("2 5 4\n+0 1:1\n1 2:1\n", 2, "non-integer label id '\\+0'"),
    ("2 5 4\n0 +1:1\n1 2:1\n", 2, "non-integer feature id '\\+1'"),
    ("2 5 4\n0 -0:1\n1 2:1\n", 2, "non-integer feature id '-0'"),
    ("2 5 4\n0 1:1_0\n1 2:1\n", 2, "non-numeric feature value '1_0'"),
    ("2 5 4\n0 1:inf\n1 2:1\n", 2, "non-finite feature value 'inf'"),
    ("2 5 4\n0 1:1e\n1 2:1\n", 2, "non-numeric feature value '1e'"),
    ("2 5 4\n0 1:.\n1 2:1\n", 2, "non-numeric feature value '.'"),
    ("2 5 4\n0 1:--1\n1 2:1\n", 2, "non-numeric feature value '--1'"),
    ("2 5 4\n0 1:0x10\n1 2:1\n", 2, "non-numeric feature value '0x10'"),
    ("2 5 4\n0, 1:1\n1 2:1\n", 2, "non-integer label id ''"),
    ("2 5 4\n,0 1:1\n1 2:1\n", 2, "non-integer label id ''"),
    ("2 5 4\n0 1:1 2:1,\n1 2:1\n", 2, "non-numeric feature value '1,'"),
    # Header bounds.
    ("2 99999999999999999999 4\n0 1:1\n1 2:1\n", 1,
     r"num_features = 99999999999999999999 .* exceeds 2\*\*31 - 1"),
    ("2 5 2147483648\n0 1:1\n1 2:1\n", 1, "num_labels = 2147483648"),
    ("2 100000000000 4\n0 1:1\n1 2:1\n", 1, "num_features = 100000000000"),
    ("99999999 5 4\n0 1:1\n", 1, r"num_instances = 99999999 .* at most 6 lines"),
    ("99999999999999999999 5 4\n0 1:1\n", 1, "num_instances"),
    ("2 5 4 " + " " * 5000 + "\n", 1, "header line longer"),
    # Ids beyond int32 / float32 sums.
    ("2 5 4\n0 99999999999999999999:1\n1 2:1\n", 2,
     "feature id 99999999999999999999 out of range"),
    ("2 5 4\n0 1:3e38 1:3e38\n1 2:1\n", 2, "duplicate feature id 1"),
    ("2 5 4\n0 1:1\n1 2:1\n \x0b\n", 4, "more instance lines"),
]


@pytest.mark.parametrize("gz", [False, True])
@pytest.mark.parametrize("content,line,msg", STRICT_XC)
def test_strict_grammar(tmp_path, content, line, msg, gz):
    p = tmp_path / ("bad.txt.gz" if gz else "bad.txt")
    raw = content.encode("utf-8")
    if gz:
        raw = gzip.compress(raw)
        if "num_instances" in msg and "at most" in msg:
            msg = "num_instances = 99999999"  # the gzip bound is larger
    p.write_bytes(raw)
    with pytest.raises(ValueError) as e:
        data.read_xc(p)
    text = str(e.value)
    assert text.startswith(f"{p}, line {line}:"), text
    assert re.search(msg, text), text


def test_accepted_spellings(tmp_path):
    """CR LF, tabs, blank runs, trailing blanks, leading zeros, value forms,
    an empty label field, blank trailing lines and a last line without LF."""
    p = tmp_path / "ok.txt"
    p.write_bytes(b"\t4 \t 6  5 \r\n"
                  b"004,1\t 5:1.  0:+.5\t\r\n"
                  b" 1:-2E-1 2:3e+0 \r\n"
                  b"\t\r\n"
                  b"3 3:1e2 3:-50\n"
                  b" \t\n\r\n")
    ds = data.read_xc(p)
    np.testing.assert_array_equal(ds.labels.toarray(), [
        [0, 1, 0, 0, 1], [0] * 5, [0] * 5, [0, 0, 0, 1, 0]])
    np.testing.assert_array_equal(ds.features.toarray(), np.array([
        [0.5, 0, 0, 0, 0, 1], [0, -0.2, 3, 0, 0, 0], [0] * 6,
        [0, 0, 0, 50, 0, 0]], np.float32))
    q = tmp_path / "last.txt.gz"
    q.write_bytes(gzip.compress(b"2 3 2\n0 1:1\n1 2:1"))
    assert data.read_xc(q).features.nnz == 2


def test_values_are_correctly_rounded(tmp_path):
    """float32(float(text)) for every value spelling (fast and slow paths)."""
    rng = np.random.default_rng(3)
    texts = ["0.1", "1e-45", "7e-46", "3.4028235e38", "1.17549435e-38",
             "123456789012345678", "0.000000000000000000001234567",
             "9007199254740993", "1e22", "1e23", "4.9406564584124654e-324",
             "2.5e-8", "1.0000000596046448", "16777217", "-0.0"]
    texts += [repr(float(v)) for v in rng.normal(0, 1e5, 200)]
    texts += ["%.9g" % v for v in rng.random(200).astype(np.float32)]
    line = " ".join(f"{i}:{t}" for i, t in enumerate(texts))
    p = tmp_path / "v.txt"
    p.write_text(f"1 {len(texts)}\n{line}\n")
    got = data.read_xc_xy(p, _write(tmp_path, "y.txt", "1 1\n0\n")).features
    want = np.array([np.float32(float(t)) for t in texts], np.float32)
    dense = got.toarray()[0]
    np.testing.assert_array_equal(dense.view(np.uint32),
                                  np.where(want == 0, 0, want).view(np.uint32))


def test_duplicate_labels_in_value_form_count_once(tmp_path):
    """An l:v label id is a label when any of its entries is non-zero."""
    y = _write(tmp_path, "y.txt", "1 4\n1:1 1:-1 2:0 3:0 3:2\n")
    assert data.read_xc_labels(y).toarray().tolist() == [[0, 1, 0, 1]]


def test_corrupt_and_truncated_gzip(tmp_path):
    good = gzip.compress(b"100 5 4\n" + b"0 1:1\n" * 100, mtime=0)
    bad = bytearray(good)
    bad[20:30] = b"\x00" * 10
    p = tmp_path / "corrupt.txt.gz"
    for payload in (bytes(bad), good[: len(good) // 2], good[:5],
                    good + b"garbage!"):
        p.write_bytes(payload)
        with pytest.raises(ValueError,
                           match=f"^{re.escape(str(p))}: corrupt or "
                                 "truncated gzip"):
            data.read_xc(p)


def test_error_line_is_first_bad_line_across_check_stages(tmp_path,
                                                          monkeypatch):
    """A later line with a cheaper-to-detect error (a bad character) must
    not hide an earlier line's out-of-range id, in any chunking."""
    lines = ["0 1:1"] * 40
    lines[5] = "0 9:1"          # out of range (found by the last stage)
    lines[30] = "0 1:\u00a01"   # bad character (found by the first stage)
    content = "40 5 4\n" + "\n".join(lines) + "\n"
    for chunk in (1 << 24, 64, 7):
        monkeypatch.setattr(xc_reader, "_CHUNK_BYTES", chunk)
        p = _write(tmp_path, "stages.txt", content)
        with pytest.raises(ValueError, match=re.escape(f"{p}, line 7:")):
            data.read_xc(p)


def test_writer_rejects_ids_beyond_int32(tmp_path):
    ds = data.XCDataset(sp.csr_matrix((1, 2**31), dtype=np.float32),
                        sp.csr_matrix((1, 2), dtype=np.float32))
    with pytest.raises(ValueError, match="num_features"):
        data.write_xc(tmp_path / "o.txt", ds)
