r"""Builds DebDocNextWord: extreme multi-class next-word prediction, >= 100k classes.

A larger sibling of ``ManNextWord`` (``/work/shared/data/README.md``), whose
man-page vocabulary runs out at 18k classes seen in training.  The text is the
English documentation and dictionaries that Debian ships in ``main``; the
default package set (about 110 MB of ``.deb`` files) is::

    mkdir -p debs && cd debs && apt-get download dict-gcide dict-foldoc \
        dict-jargon linux-doc-6.1 python3.11-doc perl-doc postgresql-doc-15 \
        octave-doc maxima-doc debian-reference-en gnu-standards sbcl-doc

Then::

    python benchmarks/datasets/make_large_class.py --input=debs \
        --output_dir=/work/runs/corpus/DebDocNextWord

Task (the ManNextWord recipe, with a larger label space):

* Documents: every dictd entry of a ``*.dict.dz`` dictionary (one headword
  group per document), every HTML page, reStructuredText source, POD file
  and plain-text file of the packages (man pages, changelogs and copyright
  files are skipped; HTML pages of a package that ships Sphinx ``_sources``
  are skipped, the sources carry the same text).  Documents whose token
  sequence is identical to an earlier one are dropped.
* Tokens: lower-cased ``[a-z][a-z0-9_]*('[a-z]+)?`` runs (numbers and
  punctuation are dropped).
* Split: by document, train if the BLAKE2 hash of ``package/path[#entry]``
  falls in the first ``100 - --test_percent`` percent, so no text is shared
  between train and test and the split does not depend on the input order.
* One instance per token position ``i >= 1`` of a document: the label is the
  token, one of the ``--max_labels`` most frequent tokens of the training
  documents that occur there at least ``--min_label_count`` times; the
  features are the previous ``--context`` tokens, one binary feature per
  (position, word) pair, id = ``position * --feature_vocab + rank`` (rank
  among the ``--feature_vocab`` most frequent training tokens; rarer context
  words give no feature).  The class is never among its own features: a
  position whose word also occurs among its ``--context`` previous words is
  dropped, as is a position without features.
* Sampling: the label frequencies are Zipfian, so a uniform sample of 1M
  positions would hold some 50k distinct words.  Each split keeps at most
  ``--class_cap`` random positions per class (the per-word cap of
  class-balanced sampling; a word with fewer positions keeps them all), then
  a uniform sample of ``--max_train`` / ``--max_test`` of those; rows are
  written in a random order (a prefix is a random subsample).

Outputs in ``--output_dir``: ``train.txt.gz`` and ``test.txt.gz`` (XC repo
format, written by :func:`xmc_tf.data.write_xc`), ``classes.txt`` (the word
of each class id), ``features.txt`` (the word of each feature rank) and
``README.md`` (sizes, the packages and their versions, this recipe).
Deterministic for the same inputs and flags.
"""

from __future__ import annotations

import gzip
import hashlib
import html
import io
import os
import re
import subprocess
import sys
import tarfile
import time
import zlib
from collections.abc import Iterable, Iterator

import numpy as np

TOKEN = re.compile(r"[a-z][a-z0-9_]*(?:'[a-z]+)?")
_SCRIPT = re.compile(r"<(script|style)\b[^>]*>.*?</\1\s*>", re.S | re.I)
_TAG = re.compile(r"<[^>]*>", re.S)
_COMMENT = re.compile(r"<!--.*?-->", re.S)
TEXT_SUFFIXES = (".html", ".htm", ".txt", ".rst", ".pod", "")
SKIP_PARTS = ("/usr/share/man/", "/_static/", "/_images/", "/changelog",
              "/copyright", "/genindex", "/search.html", "/py-modindex",
              "/NEWS", "/lintian/", "/objects.inv")
_B64 = {c: i for i, c in enumerate(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/")}


# ---------------------------------------------------------------------------
# Pure functions (tests/test_make_large_class.py).


def tokenize(text: str) -> list[str]:
    """Lower-cased word tokens of ``text``.

    Args:
      text: any text.

    Returns:
      The ``[a-z][a-z0-9_]*('[a-z]+)?`` runs of the lower-cased text, in
      order (numbers, punctuation and markup characters are dropped).
    """
    return TOKEN.findall(text.lower())


def strip_html(text: str) -> str:
    """The text of an HTML page: scripts, styles, comments and tags removed,
    entities unescaped (tags become spaces, so words never merge)."""
    text = _COMMENT.sub(" ", _SCRIPT.sub(" ", text))
    return html.unescape(_TAG.sub(" ", text))


def dictd_number(s: str) -> int:
    """A dictd index number (base 64, ``A-Za-z0-9+/``, most significant
    first)."""
    v = 0
    for c in s:
        v = v * 64 + _B64[c]
    return v


def dictd_entries(index_text: str, body: bytes) -> list[tuple[str, str]]:
    """The entries of a dictd dictionary.

    Args:
      index_text: the ``.index`` file (``headword<TAB>offset<TAB>length``).
      body: the decompressed ``.dict`` file.

    Returns:
      ``(first headword, text)`` per distinct (offset, length), in offset
      order; the ``00-database-*`` header entries are left out.
    """
    spans = {}
    for line in index_text.splitlines():
        parts = line.split("\t")
        if len(parts) < 3 or parts[0].startswith("00-database"):
            continue
        span = (dictd_number(parts[1]), dictd_number(parts[2]))
        spans.setdefault(span, parts[0])
    return [(word, body[a:a + n].decode("utf-8", "replace"))
            for (a, n), word in sorted(spans.items())]


def is_test_document(key: str, test_percent: float) -> bool:
    """Whether the document ``key`` goes to the test split (hash-based, so
    independent of the input order; ``test_percent`` of the keys)."""
    h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"),
                                       digest_size=8).digest(), "little")
    return (h % 10_000) < test_percent * 100


def frequency_ranks(counts: np.ndarray, size: int,
                    min_count: int = 1) -> np.ndarray:
    """Rank of every word id by descending count (ties: smaller id first).

    Args:
      counts: ``[V]`` count of each word id.
      size: keep the ``size`` most frequent words.
      min_count: words counted fewer times get no rank.

    Returns:
      ``[V]`` int64, the rank in ``[0, size)`` or -1.
    """
    order = np.lexsort((np.arange(len(counts)), -counts))
    order = order[counts[order] >= min_count][:size]
    rank = np.full(len(counts), -1, np.int64)
    rank[order] = np.arange(len(order))
    return rank


def position_instances(tokens: np.ndarray, doc_start: np.ndarray,
                       label_rank: np.ndarray, feature_rank: np.ndarray,
                       context: int, feature_vocab: int):
    """Candidate next-word instances of a concatenation of documents.

    Args:
      tokens: ``[T]`` word ids of the documents, concatenated.
      doc_start: ``[D]`` index in ``tokens`` of each document's first token
        (ascending, ``doc_start[0] == 0``).
      label_rank: ``[V]`` class id of each word id (-1: not a class).
      feature_rank: ``[V]`` feature rank of each word id (-1: none).
      context: number of previous words used as features.
      feature_vocab: ranks per position (feature id = position *
        feature_vocab + rank; position 0 is the previous word).

    Returns:
      ``(positions, labels, features)``: the kept token positions (``[n]``,
      ascending), their class ids (``[n]``) and ``[n, context]`` feature ids
      (-1 where that context word has no feature).  A position is kept when
      it is not a document's first token, its word is a class, it has at
      least one feature, and its word is not among its ``context`` previous
      words of the same document (the class is never among its own
      features).
    """
    tokens = np.asarray(tokens, np.int64)
    n = len(tokens)
    starts = np.zeros(n, np.int64)
    if n:
        lengths = np.diff(np.append(doc_start, n))
        starts = np.repeat(np.asarray(doc_start, np.int64), lengths)
    pos = np.arange(n) - starts
    labels = label_rank[tokens] if n else np.zeros(0, np.int64)
    idx = np.nonzero((pos >= 1) & (labels >= 0))[0]
    feats = np.full((len(idx), context), -1, np.int64)
    clash = np.zeros(len(idx), bool)
    for p in range(1, context + 1):
        ok = pos[idx] >= p
        prev = np.where(ok, tokens[idx - p] if len(idx) else idx, -1)
        clash |= ok & (prev == tokens[idx])
        r = np.where(ok, feature_rank[np.maximum(prev, 0)], -1)
        feats[:, p - 1] = np.where(r >= 0, (p - 1) * feature_vocab + r, -1)
    keep = ~clash & (feats >= 0).any(axis=1)
    return idx[keep], labels[idx][keep], feats[keep]


def cap_per_class(labels: np.ndarray, cap: int,
                  rng: np.random.Generator) -> np.ndarray:
    """Indices of a random subset with at most ``cap`` rows per class.

    Args:
      labels: ``[n]`` class of each row.
      cap: the most rows kept per class (a class with fewer keeps all).
      rng: the random generator.

    Returns:
      Ascending indices into ``labels``.
    """
    labels = np.asarray(labels)
    perm = rng.permutation(len(labels))
    order = perm[np.argsort(labels[perm], kind="stable")]
    sorted_labels = labels[order]
    first = np.searchsorted(sorted_labels, sorted_labels, side="left")
    rank = np.arange(len(labels)) - first
    return np.sort(order[rank < cap])


# ---------------------------------------------------------------------------
# Reading the packages.


def _wanted(path: str, has_sources: bool) -> bool:
    if any(s in path for s in SKIP_PARTS) or "/usr/share/doc-base/" in path:
        return False
    base = path[:-3] if path.endswith(".gz") else path
    if has_sources and base.endswith((".html", ".htm")):
        return False
    name = os.path.basename(base)
    suffix = os.path.splitext(name)[1] if "." in name else ""
    if base.endswith(".rst.txt"):
        return True
    return suffix in TEXT_SUFFIXES and not name.startswith(".")


def _decode(path: str, data: bytes):
    if path.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            return None
        path = path[:-3]
    if b"\0" in data[:4096]:
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("latin-1")
    if path.endswith((".html", ".htm")):
        text = strip_html(text)
    return text


def _deb_members(deb: str) -> tuple[str, str, dict]:
    """(package, version, {path: bytes}) of a .deb file's regular files."""
    fields = subprocess.run(["dpkg-deb", "-f", deb, "Package", "Version"],
                            check=True, capture_output=True, text=True).stdout
    info = dict(line.split(": ", 1) for line in fields.splitlines())
    tar = subprocess.run(["dpkg-deb", "--fsys-tarfile", deb], check=True,
                         capture_output=True).stdout
    files = {}
    with tarfile.open(fileobj=io.BytesIO(tar)) as tf:
        for m in tf:
            if m.isfile():
                files[m.name.lstrip(".")] = tf.extractfile(m).read()
    return info["Package"], info["Version"], files


def _dir_members(root: str) -> tuple[str, str, dict]:
    files = {}
    for d, _, names in os.walk(root):
        for name in names:
            p = os.path.join(d, name)
            if os.path.isfile(p) and not os.path.islink(p):
                with open(p, "rb") as f:
                    files["/" + os.path.relpath(p, root)] = f.read()
    return os.path.basename(os.path.normpath(root)), "(directory)", files


def iter_documents(sources: Iterable[str], packages: list) -> Iterator:
    """``(key, text)`` of every document of the ``.deb`` files or
    directories ``sources``; appends ``(package, version, n_docs)`` to
    ``packages``."""
    for src in sources:
        pkg, version, files = (_deb_members(src) if src.endswith(".deb")
                               else _dir_members(src))
        n = 0
        has_sources = any("/_sources/" in p for p in files)
        for path in sorted(files):
            if path.endswith(".dict.dz") or path.endswith(".dict"):
                index = path.rsplit(".dict", 1)[0] + ".index"
                if index not in files:
                    continue
                body = files[path]
                if path.endswith(".dz"):
                    body = gzip.decompress(body)
                for word, text in dictd_entries(
                        files[index].decode("utf-8", "replace"), body):
                    n += 1
                    yield f"{pkg}{path}#{word}", text
            elif _wanted(path, has_sources):
                text = _decode(path, files[path])
                if text is not None:
                    n += 1
                    yield f"{pkg}{path}", text
        packages.append((pkg, version, n))
        del files


# ---------------------------------------------------------------------------
# Building.


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _rows_to_dataset(labels, feats, num_features, num_labels):
    import scipy.sparse as sp
    from xmc_tf.data import XCDataset
    n, c = feats.shape
    valid = feats >= 0
    counts = valid.sum(axis=1)
    indptr = np.concatenate([[0], np.cumsum(counts)])
    cols = np.sort(np.where(valid, feats.astype(np.int64), num_features),
                   axis=1)
    x = sp.csr_matrix((np.ones(indptr[-1], np.float32),
                       cols[cols < num_features], indptr),
                      shape=(n, num_features))
    y = sp.csr_matrix((np.ones(n, np.float32), labels, np.arange(n + 1)),
                      shape=(n, num_labels))
    return XCDataset(x, y)


def _instances(docs, label_rank, feature_rank, context, feature_vocab,
               chunk_tokens=4_000_000):
    """:func:`position_instances` over ``docs`` in chunks of documents."""
    labels, feats, i = [], [], 0
    while i < len(docs):
        j, size = i, 0
        while j < len(docs) and (j == i or size + len(docs[j]) <= chunk_tokens):
            size += len(docs[j])
            j += 1
        chunk = docs[i:j]
        starts = np.concatenate([[0], np.cumsum([len(d) for d in chunk])[:-1]])
        _, lab, feat = position_instances(np.concatenate(chunk), starts,
                                          label_rank, feature_rank, context,
                                          feature_vocab)
        labels.append(lab.astype(np.int32))
        feats.append(feat.astype(np.int32))
        i = j
    if not labels:
        return np.zeros(0, np.int32), np.zeros((0, context), np.int32)
    return np.concatenate(labels), np.concatenate(feats)


def build(sources, output_dir, *, context=4, feature_vocab=50_000,
          max_labels=300_000, min_label_count=2, class_cap=8,
          max_train=1_000_000, max_test=100_000, test_percent=20.0, seed=0):
    """Builds the data set (see the module docstring); returns its stats."""
    from xmc_tf.data import write_xc
    os.makedirs(output_dir, exist_ok=True)
    vocab: dict[str, int] = {}
    docs = {False: [], True: []}
    seen = set()
    packages: list = []
    n_docs = n_dupes = 0
    for key, text in iter_documents(sources, packages):
        toks = tokenize(text)
        if len(toks) < 2:
            continue
        digest = hashlib.blake2b(" ".join(toks).encode(),
                                 digest_size=16).digest()
        if digest in seen:
            n_dupes += 1
            continue
        seen.add(digest)
        ids = np.fromiter((vocab.setdefault(t, len(vocab)) for t in toks),
                          np.int64, len(toks))
        docs[is_test_document(key, test_percent)].append(ids.astype(np.int32))
        n_docs += 1
        if n_docs % 20_000 == 0:
            _log(f"{n_docs} documents, {len(vocab)} distinct words")
    for pkg, ver, n in packages:
        _log(f"  {pkg} {ver}: {n} documents")
    words = np.array(sorted(vocab, key=vocab.get), dtype=object)
    del vocab, seen
    stats = {"documents": {"train": len(docs[False]), "test": len(docs[True])},
             "duplicate_documents_dropped": n_dupes,
             "tokens": {"train": sum(map(len, docs[False])),
                        "test": sum(map(len, docs[True]))},
             "distinct_words": int(len(words))}
    _log(f"tokens: {stats['tokens']}, documents: {stats['documents']}")
    counts = np.bincount(np.concatenate(docs[False]), minlength=len(words))
    label_rank = frequency_ranks(counts, max_labels, min_label_count)
    feature_rank = frequency_ranks(counts, feature_vocab)
    num_labels = int((label_rank >= 0).sum())
    num_features = context * feature_vocab
    rng = np.random.default_rng(seed)
    out = {}
    for test, name, limit in ((False, "train", max_train),
                              (True, "test", max_test)):
        labels, feats = _instances(docs[test], label_rank, feature_rank,
                                   context, feature_vocab)
        n_cand = len(labels)
        keep = cap_per_class(labels, class_cap, rng)
        if len(keep) > limit:
            keep = np.sort(rng.choice(keep, limit, replace=False))
        keep = rng.permutation(keep)
        labels, feats = labels[keep], feats[keep]
        seen_classes = np.unique(labels)
        out[name] = (labels, feats)
        stats[name] = {"candidate_positions": int(n_cand),
                       "instances": int(len(labels)),
                       "classes_present": int(len(seen_classes)),
                       "features_per_instance": round(
                           float((feats >= 0).sum(1).mean()), 3)}
        _log(f"{name}: {n_cand} candidate positions -> {len(labels)} "
             f"instances, {len(seen_classes)} classes")
    train_classes = np.unique(out["train"][0])
    test_labels = out["test"][0]
    stats["test"]["instances_with_class_seen_in_train"] = int(
        np.isin(test_labels, train_classes).sum())
    counts_train = np.bincount(out["train"][0], minlength=num_labels)
    stats["train"]["classes_lt_5_instances"] = int(
        ((counts_train > 0) & (counts_train < 5)).sum())
    stats.update(num_labels=num_labels, num_features=num_features,
                 context=context, feature_vocab=feature_vocab,
                 class_cap=class_cap, min_label_count=min_label_count,
                 test_percent=test_percent, seed=seed,
                 packages=[{"package": p, "version": v, "documents": n}
                           for p, v, n in packages])
    for name in ("train", "test"):
        path = os.path.join(output_dir, f"{name}.txt.gz")
        _log(f"writing {path}")
        write_xc(path + ".tmp.gz", _rows_to_dataset(*out[name], num_features,
                                                    num_labels))
        os.replace(path + ".tmp.gz", path)
    by_rank = np.argsort(np.where(label_rank >= 0, label_rank, len(words)))
    with open(os.path.join(output_dir, "classes.txt"), "w") as f:
        f.writelines(w + "\n" for w in words[by_rank[:num_labels]])
    by_rank = np.argsort(np.where(feature_rank >= 0, feature_rank,
                                  len(words)))
    n_feat_words = int((feature_rank >= 0).sum())
    with open(os.path.join(output_dir, "features.txt"), "w") as f:
        f.writelines(w + "\n" for w in words[by_rank[:n_feat_words]])
    write_readme(output_dir, stats)
    return stats


def write_readme(output_dir: str, stats: dict) -> None:
    """``README.md`` with the sizes and package versions of ``stats``."""
    import json
    tr, te = stats["train"], stats["test"]
    pk = "\n".join(f"| {p['package']} | {p['version']} | {p['documents']:,} |"
                   for p in stats["packages"])
    text = f"""# DebDocNextWord

Extreme multi-class next-word prediction over the English documentation and
dictionaries of Debian 12 (bookworm) `main` packages, built by
`benchmarks/datasets/make_large_class.py` of xmc_tf (its docstring has the
recipe and the `apt-get download` line).  XC repo format; one label per
instance; binary features = the previous {stats['context']} words, id =
position * {stats['feature_vocab']} + word rank.  Documents, not positions,
are split {100 - stats['test_percent']:.0f}/{stats['test_percent']:.0f}
(no text shared); at most {stats['class_cap']} positions per class per split;
the class word is never among its own features.

- `train.txt.gz`: {tr['instances']:,} instances from
  {stats['documents']['train']:,} documents ({stats['tokens']['train']:,}
  tokens, {tr['candidate_positions']:,} candidate positions),
  {stats['num_features']:,} features, {stats['num_labels']:,} classes declared
  (words seen >= {stats['min_label_count']} times in the training documents),
  **{tr['classes_present']:,} of them occur in train**
  ({tr['classes_lt_5_instances']:,} fewer than 5 times).
- `test.txt.gz`: {te['instances']:,} instances from
  {stats['documents']['test']:,} other documents, {te['classes_present']:,}
  classes; {te['instances_with_class_seen_in_train']:,} instances have a class
  seen in train.
- `classes.txt`: the word of each class id; `features.txt`: the word of each
  feature rank.
- {stats['duplicate_documents_dropped']:,} documents identical to an earlier
  one were dropped; {stats['distinct_words']:,} distinct words in all.

| package | version | documents |
|---|---|---|
{pk}

Licenses: those of the packages (`/usr/share/doc/<package>/copyright` in
each `.deb`): GCIDE and FOLDOC GPL, the Jargon File public domain, the
documentation that of each project.

```json
{json.dumps(stats, indent=1)}
```
"""
    with open(os.path.join(output_dir, "README.md"), "w") as f:
        f.write(text)


def _expand(inputs: list[str]) -> list[str]:
    out = []
    for item in inputs:
        if os.path.isdir(item) and any(n.endswith(".deb")
                                       for n in os.listdir(item)):
            out += sorted(os.path.join(item, n) for n in os.listdir(item)
                          if n.endswith(".deb"))
        elif os.path.exists(item):
            out.append(item)
        else:
            raise FileNotFoundError(f"--input: {item} does not exist")
    return out


def main(argv):
    del argv
    from absl import flags
    f = flags.FLAGS
    try:
        sources = _expand(f.input)
    except FileNotFoundError as e:
        sys.exit(str(e))
    if not sources:
        sys.exit("--input: no .deb files or directories given")
    _log(f"{len(sources)} inputs")
    stats = build(sources, f.output_dir, context=f.context,
                  feature_vocab=f.feature_vocab, max_labels=f.max_labels,
                  min_label_count=f.min_label_count, class_cap=f.class_cap,
                  max_train=f.max_train, max_test=f.max_test,
                  test_percent=f.test_percent, seed=f.seed)
    _log(f"done: train {stats['train']}, test {stats['test']}")


if __name__ == "__main__":
    from absl import app, flags as _flags
    _flags.DEFINE_list("input", None, ".deb files, directories of .deb "
                       "files, or directories of extracted text (one per "
                       "package)", required=True)
    _flags.DEFINE_string("output_dir", None, "where the files go",
                         required=True)
    _flags.DEFINE_integer("context", 4, "previous words used as features")
    _flags.DEFINE_integer("feature_vocab", 50_000,
                          "context words with a feature (most frequent)")
    _flags.DEFINE_integer("max_labels", 300_000, "most classes")
    _flags.DEFINE_integer("min_label_count", 2,
                          "least count of a class word in the training "
                          "documents")
    _flags.DEFINE_integer("class_cap", 8,
                          "most positions kept per class and split")
    _flags.DEFINE_integer("max_train", 1_000_000, "most training instances")
    _flags.DEFINE_integer("max_test", 100_000, "most test instances")
    _flags.DEFINE_float("test_percent", 20.0, "percent of test documents")
    _flags.DEFINE_integer("seed", 0, "sampling seed")
    app.run(main)
