"""The fast path of the XC text readers: :func:`read_xc`,
:func:`read_xc_labels`, :func:`read_xc_xy`.

The grammar, semantics and errors are documented in
:mod:`xmc_tf.data.xc_format`.  Files are
read in chunks of ~16 MiB of whole lines, each parsed with NumPy array
operations (byte classes, tokens, ids and values); a chunk that fails is
handed to :mod:`xmc_tf.data.xc_diagnostics`, which finds its first bad line
and says what is wrong with it.
"""

from __future__ import annotations

import gzip
import os
import re
import zlib

import numpy as np
import scipy.sparse as sp

from xmc_tf.data.dataset import PathLike, XCDataset
from xmc_tf.data.xc_diagnostics import locate_error
from xmc_tf.data.xc_grammar import (BLANKS, DECIMAL_POINT, DIGITS,
                                    EXPONENT_MARKS, LIST_SEPARATOR, MAX_DIM,
                                    PAIR_SEPARATOR, SIGNS, ChunkError,
                                    line_error, show_line)

__all__ = ["read_xc", "read_xc_xy", "read_xc_labels",
           "PROGRESS_MIN_INSTANCES"]

# Bytes read per parsing chunk (approximately; whole lines).
_CHUNK_BYTES = 1 << 24
# Deflate cannot expand one compressed byte into more than 1032 bytes.
_DEFLATE_MAX_RATIO = 1032
# Longest header line read (bytes).
_MAX_HEADER_BYTES = 4096

_GZIP_ERRORS = (gzip.BadGzipFile, EOFError, zlib.error)


# ---------------------------------------------------------------------------
# Errors and file access.


def _gzip_error(path, lineno: int, e: Exception) -> ValueError:
    return ValueError(
        f"{os.fspath(path)}: corrupt or truncated gzip file (failed after "
        f"{lineno - 1} complete lines: {type(e).__name__}: {e})")


def _open_binary(path: PathLike):
    path = os.fspath(path)
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    return open(path, "rb")


# ---------------------------------------------------------------------------
# The header.

# header = [blank] count (blank count){k-1} [blank] EOL
_BLANK_B = f"[{BLANKS}]".encode()
_COUNT_B = f"([{DIGITS}]+)".encode()
_HEADER_RE = {k: re.compile(_BLANK_B + b"*" + _COUNT_B
                            + (_BLANK_B + b"+" + _COUNT_B) * (k - 1)
                            + _BLANK_B + rb"*\r?\n?")
              for k in (2, 3)}


def _parse_header(line: bytes, path, names: tuple[str, ...],
                  body_capacity: int | None) -> list[int]:
    """Parses and bounds the header line.

    Args:
      line: the raw first line (with its newline, if any).
      names: the header fields, e.g. ``("num_instances", "num_labels")``.
      body_capacity: an upper bound of the number of instance lines the
        rest of the file can hold, or ``None`` when unknown.

    Raises:
      ValueError: ``"<path>, line 1: ..."``.
    """
    m = _HEADER_RE[len(names)].fullmatch(line)
    if m is None:
        raise line_error(
            path, 1, f"malformed header {show_line(line)!r}: expected "
            f"{len(names)} non-negative integers '{' '.join(names)}' "
            "separated by spaces or tabs")
    values = [int(g) for g in m.groups()]
    for name, v in zip(names[1:], values[1:]):
        if v > MAX_DIM:
            raise line_error(path, 1, f"{name} = {v} in the header exceeds "
                             f"2**31 - 1 = {MAX_DIM} (ids are int32)")
    if body_capacity is not None and values[0] > body_capacity:
        raise line_error(
            path, 1, f"num_instances = {values[0]} in the header exceeds the "
            f"at most {body_capacity} lines the rest of the file can hold")
    return values


def _body_capacity(path, header_bytes: int) -> int | None:
    """Upper bound of the instance lines after the header (None: unknown)."""
    try:
        size = os.stat(os.fspath(path)).st_size
    except OSError:
        return None
    # Every instance line holds at least one byte (its LF, or one byte of
    # a last line without LF).
    if os.fspath(path).endswith(".gz"):
        return size * _DEFLATE_MAX_RATIO
    return max(0, size - header_bytes)


# ---------------------------------------------------------------------------
# Vectorised parsing of a chunk of lines.

# Byte classes.
_BAD, _DIGIT, _BLANK, _NL, _COMMA, _COLON, _DOT, _EXP, _SIGN, _CR = range(10)
_CLASS = np.zeros(256, np.uint8)  # _CLASS[byte]: its class (0: bad)
for _chars, _cls in ((DIGITS, _DIGIT), (BLANKS, _BLANK), ("\n", _NL),
                     (LIST_SEPARATOR, _COMMA), (PAIR_SEPARATOR, _COLON),
                     (DECIMAL_POINT, _DOT), (EXPONENT_MARKS, _EXP),
                     (SIGNS, _SIGN), ("\r", _CR)):
    _CLASS[[ord(c) for c in _chars]] = _cls
del _chars, _cls

_P10_INT = 10 ** np.arange(16, dtype=np.int64)
_P10_FLOAT = np.array([float(10**k) for k in range(23)])  # exact: <= 1e22
_EMPTY_IDS = np.zeros(0, np.int32)
_EMPTY_VALS = np.zeros(0, np.float32)


def _first(mask: np.ndarray, pos: np.ndarray | None = None) -> int | None:
    """Smallest byte position flagged by ``mask`` (over ``pos``), or None."""
    if not mask.any():
        return None
    if pos is None:
        return int(np.argmax(mask))
    return int(pos[mask].min())


def _raise_first(*checks):
    """Raises ChunkError at the smallest position among (pos, msg) pairs."""
    hits = [(p, m) for p, m in checks if p is not None]
    if hits:
        p, m = min(hits, key=lambda h: h[0])
        raise ChunkError(p, m)


# Digit strings are converted eight bytes at a time (SWAR): a uint64 view
# with stride 1 over the padded chunk loads the 8 bytes ending at any
# offset; the bytes before the string are masked to 0 (leading zeros).
_PAD = 16
_LANE_MASK = np.array(
    [0] + [(2**64 - 1) ^ ((1 << (8 * (8 - n))) - 1) for n in range(1, 9)],
    np.uint64)


def _words(buf: bytes) -> np.ndarray:
    """uint64 view: ``words[j]`` = little-endian bytes ``buf[j - _PAD:
    j - _PAD + 8]`` (zero padding outside ``buf``)."""
    padded = np.zeros(len(buf) + _PAD + 8, np.uint8)
    padded[_PAD:_PAD + len(buf)] = np.frombuffer(buf, np.uint8)
    return np.ndarray(shape=(padded.size - 7,), dtype="<u8", buffer=padded,
                      strides=(1,))


def _eight_digits(w: np.ndarray) -> np.ndarray:
    """Values of 8 ASCII digits per uint64 (first digit in the low byte;
    zero bytes count as leading zeros).  The multiply-shift reduction of
    pairs, quads and octets used by simdjson / fast_float (Lemire)."""
    w = ((w & 0x0F0F0F0F0F0F0F0F) * 2561) >> 8
    w = ((w & 0x00FF00FF00FF00FF) * 6553601) >> 16
    return ((w & 0x0000FFFF0000FFFF) * 42949672960001) >> 32


def _digits(words: np.ndarray, end: np.ndarray,
            length: np.ndarray) -> np.ndarray:
    """uint64 values of the digit strings ending at ``end`` (exclusive) of
    ``length`` <= 16 bytes (validated digits)."""
    if length.size == 0 or not length.any():
        return np.zeros(length.size, np.uint64)
    longest = int(length.max())
    lo_len = np.minimum(length, 8) if longest > 8 else length
    lo = _eight_digits(words[end + (_PAD - 8)] & _LANE_MASK[lo_len])
    if longest <= 8:
        return lo
    hi = _eight_digits(words[end + (_PAD - 16)] & _LANE_MASK[length - lo_len])
    return hi * 100000000 + lo


def _decimal(a: np.ndarray, words: np.ndarray, start: np.ndarray,
             end: np.ndarray, limit: int, what: str):
    """Integer values of the digit strings ``a[start:end]`` (validated).

    Returns int64 values; raises ChunkError at the first id >= ``limit``.
    Strings longer than 16 digits are >= 10**16 unless their leading digits
    are zeros (checked one by one; rare).
    """
    length = end - start
    if len(start) == 0:
        return np.zeros(0, np.int64)
    values = _digits(words, end, np.minimum(length, 16)).astype(np.int64)
    for i in np.flatnonzero(length > 16):
        head = a[start[i]:end[i] - 16]
        if (head != ord("0")).any():
            values[i] = limit  # out of range (beyond int32)
    bad = values >= limit
    if bad.any():
        k = int(np.argmax(bad))
        raise ChunkError(start[k], f"{what} id out of range [0, {limit})")
    return values


def _values(buf: bytes, a: np.ndarray, words: np.ndarray, cls: np.ndarray,
            vstart: np.ndarray, vend: np.ndarray, epos: np.ndarray,
            has_exp: np.ndarray, dpos: np.ndarray,
            has_dot: np.ndarray) -> np.ndarray:
    """float32 values of the validated ``value`` tokens ``buf[vstart:vend]``.

    Single-digit values (binary bag-of-words data) are read directly.
    Otherwise the fast path (Clinger): a mantissa of <= 15 digits is an
    exact integer in float64, and 10**k is exact for |k| <= 22, so one IEEE
    multiplication or division gives the correctly rounded float64, as
    ``float(text)`` does.  The rest (long mantissas, large exponents; rare)
    is converted with ``float``.  Then float64 -> float32.
    """
    out = np.empty(len(vstart), np.float64)
    one = vend == vstart + 1
    out[one] = a[vstart[one]].astype(np.float64) - 48.0
    rest = np.flatnonzero(~one)
    if rest.size == 0:
        return out.astype(np.float32)
    vstart, vend, epos = vstart[rest], vend[rest], epos[rest]
    has_exp, dpos, has_dot = has_exp[rest], dpos[rest], has_dot[rest]
    has_sign = cls[vstart] == _SIGN
    neg = has_sign & (a[vstart] == ord("-"))
    ms = vstart + has_sign
    int_end = np.where(has_dot, dpos, epos)
    int_len = int_end - ms
    frac_len = np.where(has_dot, epos - 1 - dpos, 0)
    exp_at = np.minimum(epos + 1, len(a) - 1)
    exp_sign = has_exp & (cls[exp_at] == _SIGN)
    exp_neg = exp_sign & (a[exp_at] == ord("-"))
    exp_len = np.where(has_exp, vend - (epos + 1 + exp_sign), 0)
    fast = (int_len + frac_len <= 15) & (exp_len <= 4)
    int_val = _digits(words, int_end, np.where(fast, int_len, 0))
    frac_val = _digits(words, epos, np.where(fast, frac_len, 0))
    mant = (int_val * _P10_INT[np.where(fast, frac_len, 0)].astype(np.uint64)
            + frac_val)
    expo = _digits(words, vend, np.where(fast, exp_len, 0)).astype(np.int64)
    k10 = np.where(exp_neg, -expo, expo) - frac_len
    fast &= (mant == 0) | ((k10 >= -22) & (k10 <= 22))
    m = mant.astype(np.float64)
    val = np.where(k10 >= 0, m * _P10_FLOAT[np.clip(k10, 0, 22)],
                   m / _P10_FLOAT[np.clip(-k10, 0, 22)])
    val = np.where(neg, -val, val)
    for i in np.flatnonzero(~fast):
        val[i] = float(buf[vstart[i]:vend[i]])
    out[rest] = val
    with np.errstate(over="ignore"):
        return out.astype(np.float32)


def _counts_per_line(pos: np.ndarray, nl: np.ndarray) -> np.ndarray:
    """int64 [len(nl)]: entries of the sorted positions ``pos`` per line."""
    upto = np.searchsorted(pos, nl)
    return np.diff(upto, prepend=0).astype(np.int64)


def _check_duplicate_sums(pos, counts, ids, vals) -> None:
    """Raises ChunkError when duplicate feature ids of a line sum (in
    float64, as the CSR matrix does) beyond the float32 range.  Only lines
    whose absolute values sum to >= FLT_MAX can; they are checked exactly.

    Args:
      pos: byte offsets of the entries; counts: entries per line; ids,
        vals: the entries in line order.
    """
    if vals.size == 0:
        return
    line = np.repeat(np.arange(counts.size), counts)
    total = np.bincount(line, weights=np.abs(vals.astype(np.float64)),
                        minlength=counts.size)
    for li in np.flatnonzero(total >= float(np.finfo(np.float32).max)):
        sel = np.flatnonzero(line == li)
        order = np.argsort(ids[sel], kind="stable")
        sums = {}
        for k in sel[order]:
            sums[int(ids[k])] = sums.get(int(ids[k]), 0.0) + float(vals[k])
        with np.errstate(over="ignore"):
            if not np.isfinite(np.float32(list(sums.values()))).all():
                raise ChunkError(pos[sel[0]], "duplicate feature ids sum "
                                  "to a value beyond the float32 range")


def _parse_chunk(buf: bytes, kind: str, num_features: int, num_labels: int):
    """Parses whole instance lines (``buf`` ends with ``b"\\n"``).

    Vectorised over the chunk: after one pass that classifies every byte,
    the work is on the non-digit bytes (separators, ':', ',', '.', ...)
    and on per-token arrays.

    Args:
      buf: the lines, each ending with LF.
      kind: ``"xc"`` (``labels features``), ``"x"`` (features only) or
        ``"y"`` (labels only).

    Returns:
      ``(labels, features)``, each ``None`` or ``(counts, ids, values)``:
      int64 ``[num_lines]`` entries per line, int32 ids and float32 values
      in line order.

    Raises:
      ChunkError: malformed input, with a byte offset inside a bad line.
    """
    a = np.frombuffer(buf, np.uint8)
    n = a.size
    cls = _CLASS[a]

    # Stage 1: characters.  A CR is valid only right before LF (then it is
    # a trailing blank).
    _raise_first((_first(cls == _BAD), "invalid character"))
    nd = np.flatnonzero(cls != _DIGIT)      # non-digit bytes (sorted)
    ncls = cls[nd]
    is_cr = ncls == _CR
    if is_cr.any():
        cr = nd[is_cr]
        _raise_first((_first(cls[cr + 1] != _NL, cr),
                      "carriage return inside a line"))
        ncls[is_cr] = _BLANK
    is_sep = (ncls == _BLANK) | (ncls == _NL)
    nl = nd[ncls == _NL]
    num_lines = nl.size

    # Tokens: maximal runs of non-separator bytes, between separators.
    sep_idx = np.flatnonzero(is_sep)        # indices into nd
    sep = nd[sep_idx]
    prev = np.empty_like(sep)
    prev[0] = -1
    prev[1:] = sep[:-1]
    gap = sep - prev > 1                    # a token ends at sep[i]
    starts = prev[gap] + 1
    ends = sep[gap]
    num_tok = starts.size
    # Token id of every non-digit byte: count token-opening separators.
    # Token i > 0 (or any, when the chunk does not start with a token)
    # opens at the separator sep[i - 1]; a byte's token id is the number of
    # opening separators before it, minus one, plus the token at offset 0.
    opens = np.zeros(nd.size, np.int32)
    opens[sep_idx[:-1][gap[1:]]] = 1
    tokid = np.cumsum(opens, dtype=np.int32) - 1 + int(gap[0])
    inner = np.flatnonzero(~is_sep)         # non-digit bytes inside tokens
    q = nd[inner]
    qcls = ncls[inner]
    qtok = tokid[inner]

    # Which tokens are id lists (else id:value pairs).
    if kind == "xc":
        is_list = np.ones(num_tok, bool)
        later = starts > 0
        is_list[later] = cls[starts[later] - 1] == _NL
    elif kind == "x":
        is_list = np.zeros(num_tok, bool)
    elif kind == "y":
        colon_at = q[qcls == _COLON]
        line_has_pairs = np.zeros(num_lines, bool)
        line_has_pairs[np.searchsorted(nl, colon_at)] = True
        tok_line = np.searchsorted(nl, starts)
        is_list = ~line_has_pairs[tok_line]
    else:
        raise AssertionError(kind)
    q_list = is_list[qtok]

    # Stage 2: token shapes.  Id lists: digits and commas between digits.
    # Pairs: exactly one ':' and no ','.  Y files: one id list per line.
    is_comma = qcls == _COMMA
    checks = [(_first(q_list & ~is_comma, q), "malformed id list"),
              (_first(~q_list & is_comma, q), "',' in an id:value pair")]
    commas = q[q_list & is_comma]
    if commas.size:
        ok = (cls[np.maximum(commas - 1, 0)] == _DIGIT) & (commas > 0)
        ok &= cls[commas + 1] == _DIGIT
        checks.append((_first(~ok, commas), "empty list element"))
    colon_idx = np.flatnonzero(qcls == _COLON)
    colon_tok = qtok[colon_idx]
    pair_tok = np.flatnonzero(~is_list)
    # Exactly one colon per pair token <=> the colons' tokens are the pair
    # tokens, in order (cheap); else locate the first bad token.
    if colon_tok.size != pair_tok.size or (colon_tok != pair_tok).any():
        per_tok = np.bincount(colon_tok, minlength=num_tok)
        checks.append((_first(per_tok[pair_tok] != 1, starts[pair_tok]),
                       "expected one ':' per pair"))
    if kind == "y":
        lists_per_line = np.bincount(tok_line[is_list], minlength=num_lines)
        if (lists_per_line > 1).any():
            line = int(np.argmax(lists_per_line > 1))
            checks.append((0 if line == 0 else int(nl[line - 1]) + 1,
                           "several label lists on one line"))
    _raise_first(*checks)

    # Stage 3: pair grammar  id ":" value.  Index pairs 0..P-1.
    ps, pe = starts[pair_tok], ends[pair_tok]
    cpos = q[colon_idx]                     # one per pair, in order
    punct = np.flatnonzero((qcls != _COLON) & ~q_list)  # . e E + -
    pq, pcls = q[punct], qcls[punct]
    if pair_tok.size == num_tok:
        ppair = qtok[punct]
    else:
        pair_of_tok = np.full(num_tok, -1, np.int64)
        pair_of_tok[pair_tok] = np.arange(pair_tok.size)
        ppair = pair_of_tok[qtok[punct]]
    checks = [(_first(cpos == ps, ps), "empty id"),
              (_first(pe == cpos + 1, ps), "empty value"),
              (_first(pq < cpos[ppair], pq), "non-digit id")]
    _raise_first(*checks)
    is_exp, is_dot = pcls == _EXP, pcls == _DOT
    is_sign = pcls == _SIGN
    exp_pair, dot_pair = ppair[is_exp], ppair[is_dot]
    signs, sign_pair = pq[is_sign], ppair[is_sign]
    sign_ok = (signs == cpos[sign_pair] + 1) | (cls[signs - 1] == _EXP)
    # Pairs indices are sorted: a repeat means two of a kind in one pair.
    _raise_first((_first(np.diff(exp_pair) == 0, ps[exp_pair[1:]]),
                  "several exponents"),
                 (_first(np.diff(dot_pair) == 0, ps[dot_pair[1:]]),
                  "several decimal points"),
                 (_first(~sign_ok, signs), "misplaced sign"))
    n_exp = np.zeros(ps.size, np.int64)
    n_exp[exp_pair] = 1
    n_dot = np.zeros(ps.size, np.int64)
    n_dot[dot_pair] = 1
    has_exp = n_exp == 1
    epos = pe.copy()
    epos[exp_pair] = pq[is_exp]
    has_dot = n_dot == 1
    dpos = np.full(ps.size, -1, np.int64)
    dpos[dot_pair] = pq[is_dot]
    vstart = cpos + 1
    ms = vstart + (cls[vstart] == _SIGN)
    exp_at = np.minimum(epos + 1, n - 1)
    exp_digits = np.where(has_exp,
                          pe - epos - 1 - (cls[exp_at] == _SIGN), 1)
    _raise_first((_first(has_dot & (dpos > epos), ps),
                  "decimal point in exponent"),
                 (_first(epos - ms - has_dot < 1, ps), "no digit in mantissa"),
                 (_first(exp_digits < 1, ps), "no digit in exponent"))

    # Stage 4: numbers.
    words = _words(buf)

    def list_ids(limit, what):
        lt = np.flatnonzero(is_list)
        rs = np.sort(np.concatenate([starts[lt], commas + 1]))
        re_ = np.sort(np.concatenate([ends[lt], commas]))
        return rs, _decimal(a, words, rs, re_, limit, what)

    def pairs(limit, what):
        ids = _decimal(a, words, ps, cpos, limit, what)
        vals = _values(buf, a, words, cls, vstart, pe, epos, has_exp, dpos,
                       has_dot)
        bad = ~np.isfinite(vals)
        if bad.any():
            raise ChunkError(ps[int(np.argmax(bad))],
                              f"non-finite {what} value (float32)")
        return ids, vals

    labels = features = None
    if kind == "xc":
        rs, lab = list_ids(num_labels, "label")
        labels = (_counts_per_line(rs, nl), lab.astype(np.int32),
                  np.ones(lab.size, np.float32))
    if kind in ("xc", "x"):
        fid, fval = pairs(num_features, "feature")
        counts = _counts_per_line(ps, nl)
        _check_duplicate_sums(ps, counts, fid, fval)
        features = (counts, fid.astype(np.int32), fval)
    if kind == "y":
        rs, lab = list_ids(num_labels, "label")
        pid, pval = pairs(num_labels, "label")
        pos = np.concatenate([rs, ps])
        order = np.argsort(pos, kind="stable")
        labels = (_counts_per_line(pos[order], nl),
                  np.concatenate([lab, pid])[order].astype(np.int32),
                  np.concatenate([np.ones(lab.size, np.float32),
                                  pval])[order])
    return labels, features


# ---------------------------------------------------------------------------
# Files.


#: A file whose header declares at least this many instances shows a
#: progress bar (``keras.utils.Progbar``, instances read) while it is read,
#: unless the reader is called with ``progress=False``.
PROGRESS_MIN_INSTANCES = 100_000


def _progress_reporter(progress, path, num_instances: int):
    """``None`` or a function ``(instances_read) -> None``.

    ``progress``: ``"auto"`` (a Keras progress bar for files of at least
    :data:`PROGRESS_MIN_INSTANCES` instances), ``True`` (always a bar),
    ``False``/``None`` (none), or a callable ``(instances_read,
    num_instances)``.
    """
    if callable(progress):
        return lambda done: progress(done, num_instances)
    if progress is True or (progress == "auto" and
                            num_instances >= PROGRESS_MIN_INSTANCES):
        import sys

        from keras.utils import Progbar
        print(f"reading {os.fspath(path)} ({num_instances} instances)",
              flush=True)
        bar = Progbar(num_instances, unit_name="instance",
                      interval=0.5 if sys.stdout.isatty() else 10.0)
        return lambda done: bar.update(done, finalize=done >= num_instances)
    return None


def _chunks(f, path, lineno_ref: list):
    """Yields chunks of whole lines, each ending with LF (an LF is added to
    a last line without one).  Wraps gzip errors (``lineno_ref[0]`` is the
    number of the next line, for the message)."""
    rest = b""
    while True:
        try:
            data = f.read(_CHUNK_BYTES)
        except _GZIP_ERRORS as e:
            raise _gzip_error(path, lineno_ref[0], e) from None
        if not data:
            if rest:
                yield rest + b"\n"
            return
        buf = rest + data if rest else data
        cut = buf.rfind(b"\n") + 1
        if cut == 0:
            rest = buf
            continue
        rest = buf[cut:]
        yield buf[:cut]


def _check_trailing(buf: bytes, path, first_lineno: int,
                    num_instances: int) -> None:
    """Lines after the declared instances may hold only blanks (and a CR
    right before LF)."""
    if not buf.translate(None, b" \t\n") or (
            not buf.translate(None, b" \t\r\n") and
            buf.count(b"\r") == buf.count(b"\r\n")):
        return
    c = _CLASS[np.frombuffer(buf, np.uint8)]
    bad = (c != _BLANK) & (c != _NL)
    cr = np.flatnonzero(c == _CR)
    bad[cr[c[cr + 1] == _NL]] = False
    bad = int(np.argmax(bad))
    start = buf.rfind(b"\n", 0, bad) + 1
    lineno = first_lineno + buf.count(b"\n", 0, start)
    line = buf[start:buf.index(b"\n", start)]
    raise line_error(path, lineno, f"more instance lines than the "
                     f"{num_instances} declared in the header; line: "
                     f"{show_line(line)!r}")


def _read_sparse_text(path: PathLike, kind: str, progress="auto"):
    """Reads one XC-style file (``progress``: see :func:`_progress_reporter`).

    Returns:
      ``(header, labels, features)`` where ``header`` is the list of header
      integers and ``labels``/``features`` are ``(counts, ids, values)`` over
      all instances, or ``None`` when the file kind has no such field.
    """
    names = {"xc": ("num_instances", "num_features", "num_labels"),
             "x": ("num_instances", "num_features"),
             "y": ("num_instances", "num_labels")}[kind]
    with _open_binary(path) as f:
        try:
            header_line = f.readline(_MAX_HEADER_BYTES)
        except _GZIP_ERRORS as e:
            raise _gzip_error(path, 1, e) from None
        if not header_line:
            raise line_error(path, 1, "empty file; expected the header '" +
                             " ".join(names) + "'")
        if (len(header_line) == _MAX_HEADER_BYTES and
                not header_line.endswith(b"\n")):
            raise line_error(path, 1, f"header line longer than "
                             f"{_MAX_HEADER_BYTES} bytes; expected '" +
                             " ".join(names) + "'")
        header = _parse_header(header_line, path, names,
                               _body_capacity(path, len(header_line)))
        num_instances = header[0]
        num_features = header[1] if kind in ("xc", "x") else 0
        num_labels = header[-1] if kind in ("xc", "y") else 0
        lab_parts, feat_parts = [], []
        report = _progress_reporter(progress, path, num_instances)
        n_read = 0             # instance lines consumed
        next_lineno = [2]      # 1-based number of the next line
        for buf in _chunks(f, path, next_lineno):
            lines = buf.count(b"\n")
            take = max(0, min(lines, num_instances - n_read))
            extra = b""
            if take < lines:  # lines after the declared instances
                cut = 0
                if take:
                    cut = int(np.flatnonzero(
                        np.frombuffer(buf, np.uint8) == 10)[take - 1]) + 1
                buf, extra = buf[:cut], buf[cut:]
            if take:
                try:
                    lab, feat = _parse_chunk(buf, kind, num_features,
                                             num_labels)
                except ChunkError as e:
                    raise locate_error(
                        buf, e, lambda b: _parse_chunk(
                            b, kind, num_features, num_labels),
                        kind, num_features, num_labels, path,
                        next_lineno[0]) from None
                if lab is not None:
                    lab_parts.append(lab)
                if feat is not None:
                    feat_parts.append(feat)
            if extra:
                _check_trailing(extra, path, next_lineno[0] + take,
                                num_instances)
            n_read += take
            next_lineno[0] += lines
            if report is not None:
                report(n_read)
        if n_read < num_instances:
            raise line_error(
                path, next_lineno[0],
                f"unexpected end of file: the header declares "
                f"{num_instances} instances but only {n_read} lines "
                "follow it")

    def _cat(parts):
        if not parts:
            return (np.zeros(num_instances, np.int64), _EMPTY_IDS,
                    _EMPTY_VALS)
        return tuple(np.concatenate(p) for p in zip(*parts))

    labels = _cat(lab_parts) if kind in ("xc", "y") else None
    features = _cat(feat_parts) if kind in ("xc", "x") else None
    return header, labels, features


def _to_csr(parsed, num_cols: int, binary: bool, path) -> sp.csr_matrix:
    """CSR [num_instances, num_cols] float32 from ``(counts, ids, values)``.

    ``binary``: an id is a label when any of its entries is non-zero (value
    1.0).  Otherwise duplicate ids are summed in float64 and rounded once to
    float32; explicit zeros (also sums rounding to 0) are dropped.
    """
    counts, ids, vals = parsed
    indptr = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=indptr[1:])
    shape = (len(counts), num_cols)
    if binary:
        m = sp.csr_matrix(((vals != 0).astype(np.float32), ids, indptr),
                          shape=shape)
        m.eliminate_zeros()
        m.sum_duplicates()  # sorts indices; merges duplicates
        m.data[:] = 1.0
        return m
    m = sp.csr_matrix((vals.astype(np.float64), ids, indptr), shape=shape)
    m.sum_duplicates()
    with np.errstate(over="ignore"):
        data = m.data.astype(np.float32)
    bad = ~np.isfinite(data)
    if bad.any():  # caught per chunk already; kept as a guard
        row = int(np.searchsorted(m.indptr, int(np.argmax(bad)),
                                  side="right")) - 1
        raise line_error(path, row + 2, "duplicate feature ids sum to a "
                         "value beyond the float32 range")
    m = sp.csr_matrix((data, m.indices, m.indptr), shape=shape)
    m.eliminate_zeros()
    return m


def read_xc(path: PathLike, progress="auto") -> XCDataset:
    """Reads a combined XC repo file (``N D L`` header, ``labels features``).

    The accepted grammar is given in the module docstring.

    Args:
      path: file path; a ``.gz`` suffix means gzip.
      progress: ``"auto"`` (a Keras progress bar on stdout for files of at
        least ``PROGRESS_MIN_INSTANCES`` = 100,000 instances), ``True``,
        ``False``, or a callable ``(instances_read, num_instances)`` called
        after every 16 MB chunk.

    Returns:
      An :class:`XCDataset` with float32 CSR ``features`` ``[N, D]`` (sorted
      int32 indices, explicit zeros dropped, duplicates summed) and float32
      CSR ``labels`` ``[N, L]`` of 1.0 entries.

    Raises:
      ValueError: malformed input; the message starts with
        ``"<path>, line <n>:"`` (1-based, header = line 1), or with
        ``"<path>:"`` for a corrupt or truncated gzip stream.
      OSError: the file cannot be opened.

    Example:
        >>> from xmc_tf.data import load_bundled
        >>> ds = load_bundled("bibtex", "train")   # wraps read_xc
        >>> ds.features.shape, ds.labels.shape
        ((4880, 1836), (4880, 159))
    """
    header, labels, features = _read_sparse_text(path, "xc", progress)
    _, num_features, num_labels = header
    return XCDataset(
        features=_to_csr(features, num_features, binary=False, path=path),
        labels=_to_csr(labels, num_labels, binary=True, path=path))


def read_xc_labels(path: PathLike, progress="auto") -> sp.csr_matrix:
    """Reads an XC labels file (header ``N L``; ``l1,l2`` or ``l:v`` lines).

    Args:
      path: file path; a ``.gz`` suffix means gzip.
      progress: as for :func:`read_xc`.

    Returns:
      float32 CSR ``[N, L]`` with 1.0 entries and sorted indices. In the
      ``l:v`` form, entries with value 0 are not labels.

    Raises:
      ValueError: malformed input (message starts with ``"<path>, line
        <n>:"`` or ``"<path>:"``, see :func:`read_xc`).
      OSError: the file cannot be opened.
    """
    header, labels, _ = _read_sparse_text(path, "y", progress)
    return _to_csr(labels, header[1], binary=True, path=path)


def read_xc_xy(features_path: PathLike, labels_path: PathLike,
               progress="auto") -> XCDataset:
    """Reads the separate-file XC variant: an X (features) and a Y file.

    Args:
      features_path: header ``num_instances num_features``, then one line
        ``f1:v1 f2:v2 ...`` per instance (an empty line: no features).
      labels_path: header ``num_instances num_labels``, then one line
        ``l1,l2,...`` or ``l1:v1 l2:v2 ...`` per instance.
      progress: as for :func:`read_xc` (one bar per file).

    Returns:
      An :class:`XCDataset` (CSR float32 features and 1.0-valued labels).

    Raises:
      ValueError: malformed input in either file (file name and line in the
        message, see :func:`read_xc`), or the two headers disagree on
        ``num_instances``.
      OSError: a file cannot be opened.
    """
    xh, _, features = _read_sparse_text(features_path, "x", progress)
    labels = read_xc_labels(labels_path, progress)
    if labels.shape[0] != xh[0]:
        raise ValueError(
            f"{os.fspath(features_path)} has {xh[0]} instances but "
            f"{os.fspath(labels_path)} has {labels.shape[0]}")
    return XCDataset(
        features=_to_csr(features, xh[1], binary=False, path=features_path),
        labels=labels)
