"""benchmarks/datasets/make_large_class.py: its pure functions on inline toy
text (no network, no Debian packages), against plain-Python references."""

import collections

import numpy as np

from repo_module import load_repo_module


def _load():
    return load_repo_module("benchmarks/datasets/make_large_class.py",
                            "make_large_class")


mlc = _load()

TEXT = ("The cat sat on the mat. The dog's bone, 42 times: the_cat_id "
        "<b>bold</b> &amp; x86 9lives")


def test_tokenize():
    assert mlc.tokenize(TEXT) == [
        "the", "cat", "sat", "on", "the", "mat", "the", "dog's", "bone",
        "times", "the_cat_id", "b", "bold", "b", "amp", "x86", "lives"]


def test_strip_html_keeps_words_apart_and_drops_scripts():
    page = ("<html><head><style>p {color: red}</style><script>var x = 1;"
            "</script></head><body><p>one<br>two</p><!-- hidden -->"
            "<a href='x'>three&nbsp;&lt;four&gt;</a></body></html>")
    assert mlc.tokenize(mlc.strip_html(page)) == ["one", "two", "three",
                                                  "four"]


def _dictd_number(v):
    # dictd writes numbers in base 64 with the base64 alphabet, no padding.
    digits = []
    while True:
        digits.append(v % 64)
        v //= 64
        if not v:
            break
    chars = ("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
             "0123456789+/")
    return "".join(chars[d] for d in reversed(digits))


def test_dictd_entries():
    entries = [("apple", "Apple: a fruit of the rose family.\n"),
               ("bank", "Bank: the land beside a river.\n"),
               ("zebra", "Zebra: a striped horse, " + "z" * 5000 + "\n")]
    body, index, offset = b"", [], 0
    header = "00-database-short\n   A toy\n".encode()
    body += header
    index.append(f"00-database-short\t{_dictd_number(0)}\t"
                 f"{_dictd_number(len(header))}")
    offset = len(header)
    for word, text in entries:
        raw = text.encode()
        index.append(f"{word}\t{_dictd_number(offset)}\t"
                     f"{_dictd_number(len(raw))}")
        body += raw
        offset += len(raw)
    # A second headword of the "bank" entry: one document, first name kept.
    index.append(index[2].replace("bank", "banks"))
    got = mlc.dictd_entries("\n".join(sorted(index)) + "\n", body)
    assert got == entries


def test_split_is_by_key_deterministic_and_near_the_fraction():
    keys = [f"pkg/usr/share/doc/file{i}.html" for i in range(4000)]
    test = [mlc.is_test_document(k, 20.0) for k in keys]
    assert test == [mlc.is_test_document(k, 20.0) for k in keys]
    assert 0.17 < np.mean(test) < 0.23
    assert not any(mlc.is_test_document(k, 0.0) for k in keys)
    assert all(mlc.is_test_document(k, 100.0) for k in keys)


def test_frequency_ranks():
    counts = np.array([3, 9, 1, 9, 0, 5])
    # Descending count, ties by id: 1, 3 (9), 5 (5), 0 (3), 2 (1); word 4
    # never occurs (below the default min_count 1): no rank.
    np.testing.assert_array_equal(mlc.frequency_ranks(counts, 10),
                                  [3, 0, 4, 1, -1, 2])
    np.testing.assert_array_equal(mlc.frequency_ranks(counts, 3),
                                  [-1, 0, -1, 1, -1, 2])
    np.testing.assert_array_equal(mlc.frequency_ranks(counts, 10, 3),
                                  [3, 0, -1, 1, -1, 2])


def _reference_instances(docs, label_rank, feature_rank, context, fv):
    """Plain loops over documents and positions."""
    out = []
    for doc in docs:
        for i in range(1, len(doc)):
            word = doc[i]
            if label_rank[word] < 0:
                continue
            prev = doc[max(0, i - context):i][::-1]  # position 0 = previous
            if word in prev:
                continue  # the class among its own features
            feats = [p * fv + feature_rank[w] for p, w in enumerate(prev)
                     if feature_rank[w] >= 0]
            if feats:
                out.append((label_rank[word], sorted(feats)))
    return out


def test_position_instances_against_loops():
    vocab, docs = {}, []
    for text in ("the cat sat on the mat and the cat ran",
                 "a dog saw the cat",
                 "cat",
                 "rare words here then the mat again mat"):
        docs.append([vocab.setdefault(t, len(vocab))
                     for t in mlc.tokenize(text)])
    v = len(vocab)
    counts = np.bincount(np.concatenate(docs), minlength=v)
    label_rank = mlc.frequency_ranks(counts, 6)
    feature_rank = mlc.frequency_ranks(counts, 4)
    context, fv = 3, 4
    flat = np.concatenate(docs)
    starts = np.cumsum([0] + [len(d) for d in docs[:-1]])
    pos, labels, feats = mlc.position_instances(
        flat, starts, label_rank, feature_rank, context, fv)
    got = [(int(lab), sorted(int(f) for f in row if f >= 0))
           for lab, row in zip(labels, feats)]
    want = _reference_instances(docs, label_rank, feature_rank, context, fv)
    assert got == want and len(want) > 5
    # The rule itself: the class word never among its own context words.
    words = np.array(sorted(vocab, key=vocab.get))
    inv_label = {int(r): w for w, r in zip(words, label_rank[:v]) if r >= 0}
    inv_feat = {p * fv + int(r): w for w, r in zip(words, feature_rank)
                if r >= 0 for p in range(context)}
    for lab, row in got:
        assert inv_label[lab] not in {inv_feat[f] for f in row}


def test_cap_per_class():
    rng = np.random.default_rng(0)
    labels = np.array([5] * 20 + [7] * 3 + [1] * 9 + [2])
    rng.shuffle(labels)
    keep = mlc.cap_per_class(labels, 4, np.random.default_rng(1))
    assert np.all(np.diff(keep) > 0)
    assert collections.Counter(labels[keep].tolist()) == {5: 4, 7: 3, 1: 4,
                                                          2: 1}
    # Different seeds pick different rows of the capped class.
    other = mlc.cap_per_class(labels, 4, np.random.default_rng(2))
    assert collections.Counter(labels[other].tolist()) == \
        collections.Counter(labels[keep].tolist())
