"""Why a line of an XC text file is malformed: the slow, exact path.

Run only when the vectorised reader (:mod:`xmc_tf.data.xc_reader`) finds a
chunk malformed: :func:`locate_error` finds the first bad line of the chunk
and :func:`diagnose_line` says what is wrong with it (a bad character and
its column, a malformed token, an id out of range, a value that is not
finite in float32), for the one-line ``ValueError`` "<file>, line <n>: ...".
The grammar is :mod:`xmc_tf.data.xc_format`'s; its terminals come from
:mod:`xmc_tf.data.xc_grammar`.
"""

from __future__ import annotations

import re
import unicodedata

import numpy as np

from xmc_tf.data.xc_grammar import (BLANKS, DECIMAL_POINT, DIGITS,
                                    EXPONENT_MARKS, LIST_SEPARATOR,
                                    PAIR_SEPARATOR, SIGNS, ChunkError,
                                    line_error, show_line)

__all__ = ["diagnose_line", "locate_error"]


# The grammar's productions as regular expressions over the terminals.
_DIGIT = f"[{DIGITS}]"
_SIGN = f"[{SIGNS}]"
_POINT = re.escape(DECIMAL_POINT)
_DIGITS_RE = re.compile(f"{_DIGIT}+")                       # id, count
_NEG_RE = re.compile(f"-{_DIGIT}+")                         # a signed id
_VALUE_RE = re.compile(                                     # value
    f"{_SIGN}?(?:{_DIGIT}+(?:{_POINT}{_DIGIT}*)?|{_POINT}{_DIGIT}+)"
    f"(?:[{EXPONENT_MARKS}]{_SIGN}?{_DIGIT}+)?")
_BLANK_RE = re.compile(f"[{BLANKS}]")
_NON_FINITE_WORDS = {"nan", "inf", "infinity"}


def _check_int(tok: str, what: str, limit: int) -> str | None:
    digits = _DIGITS_RE.fullmatch(tok) is not None
    if digits or (_NEG_RE.fullmatch(tok) and int(tok) < 0):
        v = int(tok)
        if not 0 <= v < limit:
            shown = str(v) if len(tok) <= 24 else tok[:21] + "..."
            return f"{what} id {shown} out of range [0, {limit})"
        return None
    return (f"non-integer {what} id {tok!r} (ids are decimal digits "
            "0-9 only)")


def _check_pair(tok: str, what: str, limit: int) -> str | None:
    i, sep, v = tok.partition(PAIR_SEPARATOR)
    if not sep or PAIR_SEPARATOR in v or not i or not v:
        return (f"malformed {what} token {tok!r}: expected "
                f"'{what}_id:value'")
    msg = _check_int(i, what, limit)
    if msg:
        return msg
    if not _VALUE_RE.fullmatch(v):
        if v.lstrip("+-").lower() in _NON_FINITE_WORDS:
            return f"non-finite {what} value {v!r} in {tok!r}"
        return f"non-numeric {what} value {v!r} in {tok!r}"
    with np.errstate(over="ignore"):
        fv = np.float32(float(v))
    if not np.isfinite(fv):
        return f"non-finite {what} value {v!r} in {tok!r} (float32)"
    return None


def _check_id_list(field: str, what: str, limit: int) -> str | None:
    if not field:
        return None
    if PAIR_SEPARATOR in field:
        return (f"label field {field!r} contains ':' -- a line without "
                "labels must start with a space")
    for tok in field.split(LIST_SEPARATOR):
        msg = _check_int(tok, what, limit)
        if msg:
            return msg
    return None


def _describe_char(ch: str) -> str:
    name = unicodedata.name(ch, "")
    return f"U+{ord(ch):04X}" + (f" ({name})" if name else "")


def diagnose_line(raw: bytes, kind: str, num_features: int,
                  num_labels: int) -> str | None:
    """Why one line breaks the grammar, or None if it does not.

    A line-by-line restatement of the grammar of
    :mod:`xmc_tf.data.xc_format`, independent of the vectorised parser.

    Args:
      raw: the line's bytes, without its LF (a CR before it is allowed).
      kind: ``"xc"`` (``labels features``), ``"x"`` (features) or ``"y"``
        (labels).
      num_features: bound of the feature ids (``kind`` "xc", "x").
      num_labels: bound of the label ids (``kind`` "xc", "y").

    Returns:
      The reason (with the column of a bad character, the bad token, or
      the duplicate feature id whose values overflow float32), or None.
    """
    try:
        s = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        return (f"invalid byte 0x{raw[e.start]:02x} at column {e.start + 1} "
                "(not UTF-8 text; the format is ASCII)")
    if s.endswith("\r"):
        s = s[:-1]  # CR LF line ending
    for col, ch in enumerate(s, 1):
        if ch not in BLANKS and not "!" <= ch <= "~":
            return (f"invalid character {_describe_char(ch)} at column "
                    f"{col}: only ASCII space and tab separate tokens, and "
                    "tokens are printable ASCII")
    if kind in ("xc", "x"):
        feat = s
        if kind == "xc":
            m = _BLANK_RE.search(s)
            lab, feat = (s, "") if m is None else (s[:m.start()],
                                                   s[m.end():])
            msg = _check_id_list(lab, "label", num_labels)
            if msg:
                return msg
        sums = {}
        for tok in feat.split():
            msg = _check_pair(tok, "feature", num_features)
            if msg:
                return msg
            i, _, v = tok.partition(PAIR_SEPARATOR)
            sums[int(i)] = sums.get(int(i), 0.0) + float(np.float32(float(v)))
        with np.errstate(over="ignore"):
            for i, v in sums.items():
                if not np.isfinite(np.float32(v)):
                    return (f"duplicate feature id {i}: its values sum to "
                            f"{v:.6g}, beyond the float32 range")
        return None
    toks = s.split()
    if PAIR_SEPARATOR in s:
        for tok in toks:
            msg = _check_pair(tok, "label", num_labels)
            if msg:
                return msg
        return None
    if len(toks) > 1:
        return (f"malformed label list {s.strip()!r}: expected 'l1,l2,...' "
                "or 'l1:v1 l2:v2 ...'")
    return _check_id_list(toks[0] if toks else "", "label", num_labels)


def locate_error(buf: bytes, error: ChunkError, parse, kind: str,
                 num_features: int, num_labels: int, path,
                 first_lineno: int) -> ValueError:
    """The ValueError for the first bad line of a chunk that failed.

    The fast path reports a position in *a* bad line, found by its first
    failing check stage; an earlier line may fail a later stage, so the
    prefix before the reported line is parsed again with ``parse`` until it
    passes (at most one round per check stage).  The line found is then
    explained by :func:`diagnose_line`.

    Args:
      buf: the chunk: whole lines, each ending with LF.
      error: the fast path's :class:`~xmc_tf.data.xc_grammar.ChunkError`.
      parse: the fast path on a prefix of ``buf`` (``bytes -> None``,
        raising ``ChunkError``): passed in, so that this module does not
        import the reader that calls it.
      kind, num_features, num_labels: as for :func:`diagnose_line`.
      path: the file, for the message.
      first_lineno: the file's line number of the chunk's first line.

    Returns:
      ``ValueError("<path>, line <n>: <reason>; line: '<the line>'")``.
    """
    while True:
        start = buf.rfind(b"\n", 0, error.pos) + 1
        if start == 0:
            break
        try:
            parse(buf[:start])
        except ChunkError as e:
            error = e
            continue
        break
    end = buf.index(b"\n", start)
    line = buf[start:end]
    msg = diagnose_line(line, kind, num_features, num_labels)
    if msg is None:  # the two parsers disagree: report the vectorised one
        msg = (f"malformed input ({error.msg} at column "
               f"{error.pos - start + 1})")
    lineno = first_lineno + buf.count(b"\n", 0, start)
    return line_error(path, lineno, f"{msg}; line: {show_line(line)!r}")
