"""Independent line-by-line reference reader of the XC text formats.

Implements the grammar of the :mod:`xmc_tf.data.xc_format` docstring with
one regular expression per line kind and Python's ``float``, without any of
the reader's vectorised code, so that the fuzz tests can compare the two:
same arrays for a valid file, and the same first bad line for an invalid
one.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib

import numpy as np

MAX_DIM = 2**31 - 1
DEFLATE_MAX_RATIO = 1032

_B = r"[ \t]"
_ID = r"[0-9]+"
_VALUE = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_PAIR = _ID + ":" + _VALUE
_LIST = _ID + "(?:," + _ID + ")*"
_PAIRS = _PAIR + "(?:" + _B + "+" + _PAIR + ")*"
LINE_RE = {
    "xc": re.compile(f"(?P<lab>{_LIST})?(?:{_B}+(?P<feat>{_PAIRS})?)?{_B}*"),
    "x": re.compile(f"{_B}*(?P<feat>{_PAIRS})?{_B}*"),
    "y": re.compile(f"{_B}*(?:(?P<lab>{_LIST})|(?P<feat>{_PAIRS}))?{_B}*"),
}
HEADER_RE = {k: re.compile(f"{_B}*{_ID}" + f"{_B}+{_ID}" * (k - 1) +
                           f"{_B}*")
             for k in (2, 3)}


class RefError(Exception):
    """Malformed input: ``line`` is the 1-based line, or None (no line)."""

    def __init__(self, line, msg):
        super().__init__(f"line {line}: {msg}")
        self.line = line


def _pairs(text, limit):
    out = []
    for tok in text.split():
        i, _, v = tok.partition(":")
        i = int(i)
        if i >= limit:
            return None
        with np.errstate(over="ignore"):
            f = np.float32(float(v))
        if not np.isfinite(f):
            return None
        out.append((i, f))
    return out


def _sum_duplicates(pairs):
    """{id: float32(sum of its values in float64, in file order)}."""
    acc = {}
    for i, v in pairs:
        acc[i] = acc.get(i, 0.0) + float(v)
    with np.errstate(over="ignore"):
        return {i: np.float32(v) for i, v in acc.items()}


def parse_bytes(data: bytes, kind: str, capacity: int | None = None):
    """Parses a whole (decompressed) file.

    Args:
      data: the file's bytes.
      kind: "xc", "x" or "y".
      capacity: the reader's bound on num_instances (None: none).

    Returns:
      ``(header, rows)``: the header ints and, per instance,
      ``(labels, features)`` lists of ``(id, float32 value)`` in file order.

    Raises:
      RefError: the first malformed line.
    """
    k = 3 if kind == "xc" else 2
    lines = data.split(b"\n")
    last_complete = data.endswith(b"\n")
    if last_complete:
        lines = lines[:-1]
    if not lines or (len(lines) == 1 and not lines[0] and not last_complete):
        raise RefError(1, "empty file")

    def text(raw):
        if raw.endswith(b"\r"):
            raw = raw[:-1]
        try:
            s = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
        return s

    h = text(lines[0])
    if h is None or not HEADER_RE[k].fullmatch(h):
        raise RefError(1, "malformed header")
    header = [int(t) for t in h.split()]
    if any(v > MAX_DIM for v in header[1:]):
        raise RefError(1, "header dimension beyond int32")
    n = header[0]
    if capacity is not None and n > capacity:
        raise RefError(1, "num_instances beyond the file's capacity")
    num_features = header[1] if kind in ("xc", "x") else 0
    num_labels = header[-1] if kind in ("xc", "y") else 0
    rows = []
    for idx in range(n):
        lineno = idx + 2
        if idx + 1 >= len(lines):
            raise RefError(lineno, "unexpected end of file")
        s = text(lines[idx + 1])
        m = None if s is None else LINE_RE[kind].fullmatch(s)
        if m is None:
            raise RefError(lineno, "grammar")
        lab = m.groupdict().get("lab")
        feat = m.group("feat")
        labels, features = [], []
        if lab:
            ids = [int(t) for t in lab.split(",")]
            if any(i >= num_labels for i in ids):
                raise RefError(lineno, "label id out of range")
            labels = [(i, np.float32(1.0)) for i in ids]
        if feat:
            limit = num_features if kind != "y" else num_labels
            pairs = _pairs(feat, limit)
            if pairs is None:
                raise RefError(lineno, "id out of range or non-finite")
            if kind == "y":
                labels = pairs
            else:
                features = pairs
                sums = _sum_duplicates(pairs)
                if not all(np.isfinite(v) for v in sums.values()):
                    raise RefError(lineno, "duplicate sum beyond float32")
        rows.append((labels, features))
    for j in range(n + 1, len(lines)):
        s = text(lines[j])
        if s is None or s.strip(" \t"):
            raise RefError(j + 1, "extra instance line")
    return header, rows


def read_path(path, kind: str):
    """Reads ``path`` (gzip when it ends with .gz) with the reference.

    Raises:
      RefError: with ``line=None`` for a corrupt gzip stream.
    """
    raw = open(path, "rb").read()
    if os.fspath(path).endswith(".gz"):
        try:
            data = gzip.decompress(raw)
        except (gzip.BadGzipFile, EOFError, zlib.error) as e:
            raise RefError(None, f"gzip: {e}") from None
        capacity = len(raw) * DEFLATE_MAX_RATIO
    else:
        data = raw
        capacity = len(raw) - len(raw.split(b"\n", 1)[0]) - 1
    return parse_bytes(data, kind, capacity=max(capacity, 0))


def expected_entries(header, rows, kind):
    """What the reader's CSR matrices must hold.

    Returns:
      ``(shape_x, features, shape_y, labels)``: features as ``{(row, id):
      float32}`` (duplicates summed in float64 in file order, then rounded
      to float32; zeros dropped), labels as ``{(row, id): 1.0}`` for ids
      with a non-zero entry.  Shapes are None for a missing part.
    """
    n = header[0]
    shape_x = (n, header[1]) if kind in ("xc", "x") else None
    shape_y = (n, header[-1]) if kind in ("xc", "y") else None
    feats, labs = {}, {}
    for i, (labels, features) in enumerate(rows):
        for j, v in _sum_duplicates(features).items():
            if v != 0:
                feats[(i, j)] = v
        for j, v in labels:
            if v != 0:
                labs[(i, j)] = np.float32(1.0)
    return shape_x, feats, shape_y, labs
