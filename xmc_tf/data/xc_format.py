"""Readers and writers for the Extreme Classification Repository formats.

The XC repo (http://manikvarma.org/downloads/XC/XMLRepository.html) ships
multi-label data sets as sparse text files. Three layouts are supported:

* **Combined file** (:func:`read_xc`, :func:`write_xc`). First line
  ``num_instances num_features num_labels``; then one line per instance::

      l1,l2,... f1:v1 f2:v2 ...

  with 0-based label ids ``l`` and feature ids ``f``. An instance without
  labels has an empty label field, so its line starts with a space; an
  instance with neither labels nor features is an empty (or blank) line.
* **Separate X/Y files** (:func:`read_xc_xy`). The features file has the
  header ``num_instances num_features`` and lines ``f1:v1 f2:v2 ...``; the
  labels file has the header ``num_instances num_labels`` and lines either
  ``l1,l2,...`` or ``l1:v1 l2:v2 ...`` (both forms are accepted, even mixed
  line by line). In the ``l:v`` form every entry with a non-zero value is a
  label (value 1.0); entries with an explicit zero value are not labels.
* **Dense embeddings** plus such a labels file: see
  :func:`xmc_tf.data.read_embeddings`.

The container :class:`~xmc_tf.data.XCDataset` is defined in
:mod:`xmc_tf.data.dataset`; named data sets and CLI specs are in
:mod:`xmc_tf.data.specs`.

A path ending in ``.gz`` is read and written with gzip transparently.

Accepted grammar (all readers; strict, byte-exact)::

    file      = header body trailing
    header    = [blank] count (blank count){k-1} [blank] EOL
                  (k = 3 for combined files, 2 for X and Y files)
    body      = num_instances instance lines
    trailing  = any number of lines holding only blanks (ignored)
    EOL       = LF | CR LF   (the last line may also end at end of file)
    blank     = 1*(SP | TAB)                  SP = 0x20, TAB = 0x09
    count     = 1*DIGIT                        DIGIT = "0".."9"
    id        = 1*DIGIT                        (leading zeros allowed)
    value     = [sign] (1*DIGIT ["." *DIGIT] | "." 1*DIGIT)
                [("e" | "E") [sign] 1*DIGIT]     sign = "+" | "-"
    pair      = id ":" value
    id-list   = id *("," id)
    pairs     = pair *(blank pair)

    combined line = [id-list] [blank [pairs]] [blank] EOL
                    (the label field is everything before the first blank:
                    a line whose first byte is a blank has no labels)
    X line        = [blank] [pairs] [blank] EOL
    Y line        = [blank] [id-list | pairs] [blank] EOL

So SP and TAB are the only separators: any other byte -- a non-ASCII
character (NBSP U+00A0, U+3000, ...), a control character (VT ``\\x0b``,
FF ``\\x0c``, a CR that does not end the line, ...), a byte-order mark, a
second ``:``, an empty list element (``0,,1``), a sign on an id (``+3``,
``-3``) or a letter (``nan``, ``inf``) -- is an error, never skipped.
Blank runs, trailing blanks, ``\\r\\n`` line endings, empty label fields
and empty lines are valid.

Semantics and errors:

* Every malformed input raises ``ValueError`` whose message starts with
  ``"<file>, line <n>:"`` (1-based line number; the header is line 1) or,
  where no line applies (a corrupt or truncated gzip stream), with
  ``"<file>:"``. Malformed means: a byte outside the grammar, a header that
  is not ``k`` counts, ``num_features``/``num_labels`` above ``2**31 - 1``
  (the int32 range of the id arrays and the ops), ``num_instances`` larger
  than the file can hold (checked before reading: at most one instance per
  byte after the header, and for gzip files deflate's maximal expansion of
  1032 bytes per compressed byte; then exactly: more or fewer instance
  lines than declared), an id outside ``[0, num_features)`` /
  ``[0, num_labels)``, or a value that is not finite in float32 (e.g.
  ``1e50``). Nothing proportional to a header size is allocated: memory
  follows the bytes actually read. ``OSError`` is raised only when the file
  cannot be opened.
* Unsorted ids within a line are accepted and sorted. Duplicate label ids
  count once; duplicate feature ids are summed (scipy's ``sum_duplicates``).
  Explicit zero feature values are dropped from the sparse matrix.
* Values are converted like ``numpy.float32(float(text))`` (correctly
  rounded to float64, then to float32).
* Parsing is vectorised with NumPy per chunk of ~16 MiB of bytes (character
  classes, tokens, ids and values are all decoded with array operations:
  :mod:`xmc_tf.data.xc_reader`); only when a chunk is malformed is the
  first bad line located and checked line by line for the message
  (:mod:`xmc_tf.data.xc_diagnostics`).  The writers are in
  :mod:`xmc_tf.data.xc_writer`; the terminals, bounds and message forms
  both parsers share in :mod:`xmc_tf.data.xc_grammar`.  This module holds
  no code: import the readers and writers from :mod:`xmc_tf.data` (or
  their modules).

Example:
    >>> import os, tempfile
    >>> import numpy as np, scipy.sparse as sp
    >>> from xmc_tf.data import XCDataset, read_xc, write_xc
    >>> ds = XCDataset(
    ...     features=sp.csr_matrix(np.array([[0, 2.5], [1, 0]], np.float32)),
    ...     labels=sp.csr_matrix(np.array([[1, 0, 1], [0, 0, 0]], np.float32)))
    >>> path = os.path.join(tempfile.mkdtemp(), "toy.txt.gz")
    >>> write_xc(path, ds)
    >>> back = read_xc(path)
    >>> (back.num_instances, back.num_features, back.num_labels)
    (2, 2, 3)
    >>> back.labels.indices.tolist(), back.features.data.tolist()
    ([0, 2], [2.5, 1.0])
"""

__all__ = []  # the grammar only; code: xc_reader, xc_writer
