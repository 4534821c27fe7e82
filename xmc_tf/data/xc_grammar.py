"""Pieces of the XC text grammar shared by the reader, its diagnostics and
the writer.

The grammar is documented in :mod:`xmc_tf.data.xc_format`.  It is parsed
twice, on purpose: by the vectorised fast path (:mod:`xmc_tf.data.xc_reader`,
byte classes and array operations) and, only for a chunk that fails, line by
line (:mod:`xmc_tf.data.xc_diagnostics`, regular expressions) to find the
first bad line and say what is wrong with it.  The two restate the grammar's
productions independently, so each checks the other; what they share is
defined here once: the terminals (from which the fast path's byte-class
table and the diagnostics' regular expressions are both built), the bounds,
and the form of the error messages.
"""

from __future__ import annotations

import os

__all__ = ["BLANKS", "DIGITS", "SIGNS", "EXPONENT_MARKS", "DECIMAL_POINT",
           "PAIR_SEPARATOR", "LIST_SEPARATOR", "MAX_DIM", "ChunkError",
           "line_error", "show_line"]

# Terminals (``blank = 1*(SP | TAB)``, ``DIGIT``, ``sign``, the exponent
# mark, the decimal point, ``id ":" value``, ``id *("," id)``).  Any other
# byte in a line -- including every other whitespace character -- is an
# error.
#: The only separators.
BLANKS = " \t"
#: The characters of counts, ids, mantissas and exponents.
DIGITS = "0123456789"
#: Signs of a value and of its exponent (never of an id).
SIGNS = "+-"
#: Exponent marks of a value.
EXPONENT_MARKS = "eE"
#: Decimal point of a value.
DECIMAL_POINT = "."
#: Between the id and the value of a pair.
PAIR_SEPARATOR = ":"
#: Between the ids of a list.
LIST_SEPARATOR = ","

#: Largest ``num_features`` / ``num_labels``: ids are int32 (as in the ops).
MAX_DIM = 2**31 - 1


class ChunkError(ValueError):
    """The fast path's report that a chunk of lines failed to parse.

    Attributes:
      pos: byte offset, in the chunk, inside a bad line (not necessarily the
        first bad line: :func:`xmc_tf.data.xc_diagnostics.locate_error`
        finds that one).
      msg: what the failing check found.
    """

    def __init__(self, pos: int, msg: str):
        super().__init__(msg)
        self.pos = int(pos)
        self.msg = msg


def line_error(path, lineno: int, msg: str) -> ValueError:
    """The readers' error: ``ValueError("<path>, line <lineno>: <msg>")``
    (1-based line number; the header is line 1)."""
    return ValueError(f"{os.fspath(path)}, line {lineno}: {msg}")


def show_line(raw: bytes, limit: int = 80) -> str:
    """A raw line (bytes, its LF dropped) as text for a message: undecodable
    bytes as ``\\xNN`` escapes, cut to ``limit`` characters with ``...``."""
    text = raw.rstrip(b"\n").decode("utf-8", errors="backslashreplace")
    return text if len(text) <= limit else text[:limit - 3] + "..."
