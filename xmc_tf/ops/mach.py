"""MACH hashing and the fused exact top-k decoder op.

MACH (Medini, Huang, Wang, Shrivastava, "Extreme Classification in Log Memory
using Count-Min Sketch: A Case Study of Amazon Search with 50M Products",
NeurIPS 2019, Sec. 3) merges ``m`` labels into ``B`` buckets with ``R``
independent 2-universal hash functions (Sec. 2)::

    h_r(j) = ((a_r * j + b_r) mod p) mod B,     r = 0 .. R-1,

trains ``R`` B-way meta-classifiers, and ranks label ``j`` of instance ``x``
by the average of its buckets' probabilities (Eq. 2, whose affine map
``B / (B - 1) * (. - 1 / B)`` does not change the ranking)::

    score(x, j) = (1 / R) * sum_r P_r(h_r(j) | x).

This module holds the hash family (:class:`MachHashing`, shared by
:class:`xmc_tf.layers.mach.MachHead`, the MACH losses and
:class:`xmc_tf.layers.mach.MachDecoder`) and :func:`mach_top_k`, the wrapper
of the compiled op ``Xmc>MachTopK`` that returns the exact top-k labels
without materialising ``[batch, m]`` scores.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import tensorflow as tf

from xmc_tf.errors import OpLibraryError
from xmc_tf.ops import _loader, stock

#: The default hash modulus: the Mersenne prime 2^31 - 1 (the op has a
#: division-free fast path for it).  Products ``a_r * j`` stay below 2^62.
PRIME = 2**31 - 1

__all__ = ["ACTIVATIONS", "PRIME", "MachHashing", "mach_top_k",
           "mach_top_k_stock", "meta_probabilities"]

#: Stock decoder (:func:`mach_top_k_stock`): gathered elements per block of
#: labels (16 MiB of float32).
STOCK_BLOCK_ELEMENTS = 1 << 22
#: Stock decoder: bucket tables of up to this many entries (``R m``, int32)
#: are graph constants; larger ones are hashed on every call (a SavedModel
#: graph must stay under protobuf's 2 GB).
STOCK_TABLE_ENTRIES = 1 << 26


def _is_prime(p: int) -> bool:
    if p < 2:
        return False
    if p < 4:
        return True
    if p % 2 == 0 or p % 3 == 0:
        return False
    d = 5
    while d * d <= p:
        if p % d == 0 or p % (d + 2) == 0:
            return False
        d += 6
    return True


class MachHashing:
    """The R 2-universal hash functions of a MACH model (immutable).

    ``h_r(j) = ((hash_a[r] * j + hash_b[r]) mod prime) mod num_buckets``,
    evaluated in int64 without overflow (``a_r, j < prime <= 2^31 - 1``).
    Source: Medini et al. 2019, Sec. 2 ("2-Universal Hashing") and Sec. 3.

    Args:
      num_labels: number of labels ``m``, ``1 <= m <= prime``.
      num_buckets: buckets per repetition ``B``, ``1 <= B <= prime``.
      hash_a: ``R`` ints in ``[1, prime - 1]``.
      hash_b: ``R`` ints in ``[0, prime - 1]``.
      prime: the modulus ``p``, a prime ``<= 2^31 - 1`` (default
        :data:`PRIME`).

    Raises:
      ValueError: a parameter is out of range, ``hash_a`` and ``hash_b``
        differ in length or are empty, or ``prime`` is not prime.

    Example:
      >>> h = MachHashing.random(num_labels=10, num_buckets=4,
      ...                        num_repetitions=2, seed=0)
      >>> h.buckets_numpy([3, -1]).shape
      (2, 2)
      >>> bool((h.buckets_numpy([-1]) == -1).all())
      True
    """

    def __init__(self, num_labels: int, num_buckets: int,
                 hash_a: Sequence[int], hash_b: Sequence[int],
                 prime: int = PRIME):
        self._num_labels = int(num_labels)
        self._num_buckets = int(num_buckets)
        self._hash_a = tuple(int(a) for a in hash_a)
        self._hash_b = tuple(int(b) for b in hash_b)
        self._prime = int(prime)
        p = self._prime
        if not 2 <= p <= PRIME or not _is_prime(p):
            raise ValueError(f"prime must be a prime in [2, 2^31 - 1], got {p}")
        if not 1 <= self._num_labels <= p:
            raise ValueError(
                f"num_labels must be in [1, prime={p}], got {num_labels}")
        if not 1 <= self._num_buckets <= p:
            raise ValueError(
                f"num_buckets must be in [1, prime={p}], got {num_buckets}")
        if not self._hash_a or len(self._hash_a) != len(self._hash_b):
            raise ValueError(
                "hash_a and hash_b must have the same non-zero length, got "
                f"{len(self._hash_a)} and {len(self._hash_b)}")
        for r, (a, b) in enumerate(zip(self._hash_a, self._hash_b)):
            if not 1 <= a < p:
                raise ValueError(f"hash_a[{r}] must be in [1, prime - 1], "
                                 f"got {a}")
            if not 0 <= b < p:
                raise ValueError(f"hash_b[{r}] must be in [0, prime - 1], "
                                 f"got {b}")

    @classmethod
    def random(cls, num_labels: int, num_buckets: int, num_repetitions: int,
               seed: int | None = None, prime: int = PRIME) -> "MachHashing":
        """Draws ``a_r ~ U[1, p-1]``, ``b_r ~ U[0, p-1]`` from ``seed``.

        Args:
          num_labels, num_buckets, prime: as for the constructor.
          num_repetitions: ``R >= 1``.
          seed: seed of ``numpy.random.default_rng``; ``None`` draws from OS
            entropy.  Store :meth:`get_config` (not the seed) to reproduce a
            model: it holds the drawn ``a_r``, ``b_r`` themselves.

        Returns:
          A :class:`MachHashing`.

        Raises:
          ValueError: ``num_repetitions < 1`` or as for the constructor.
        """
        if int(num_repetitions) < 1:
            raise ValueError(
                f"num_repetitions must be >= 1, got {num_repetitions}")
        rng = np.random.default_rng(seed)
        a = rng.integers(1, int(prime), size=int(num_repetitions))
        b = rng.integers(0, int(prime), size=int(num_repetitions))
        return cls(num_labels, num_buckets, a.tolist(), b.tolist(), prime)

    @classmethod
    def from_any(cls, spec: Any) -> "MachHashing":
        """Accepts a :class:`MachHashing`, an object with a ``hashing``
        attribute (a :class:`~xmc_tf.layers.mach.MachHead`), or a config dict.

        Raises:
          TypeError: ``spec`` is none of these.
        """
        if isinstance(spec, MachHashing):
            return spec
        hashing = getattr(spec, "hashing", None)
        if isinstance(hashing, MachHashing):
            return hashing
        if isinstance(spec, Mapping):
            return cls.from_config(spec)
        raise TypeError("expected a MachHashing, a MachHead or a MachHashing "
                        f"config dict, got {type(spec).__name__}")

    num_labels = property(lambda self: self._num_labels,
                          doc="Number of labels m.")
    num_buckets = property(lambda self: self._num_buckets,
                           doc="Buckets per repetition B.")
    num_repetitions = property(lambda self: len(self._hash_a),
                               doc="Number of repetitions R.")
    hash_a = property(lambda self: self._hash_a, doc="Multipliers a_r.")
    hash_b = property(lambda self: self._hash_b, doc="Offsets b_r.")
    prime = property(lambda self: self._prime, doc="The modulus p.")

    def buckets(self, label_ids) -> tf.Tensor:
        """Buckets of label ids in every repetition, computed on the fly.

        Args:
          label_ids: integer tensor ``[...]`` of ids in ``[0, m)``; negative
            ids (padding, e.g. ``-1``) are allowed.  Ids ``>= m`` are not
            checked (they hash like any id below ``prime``).

        Returns:
          int32 tensor ``[..., R]``: ``h_r(label_ids[...])``, and ``-1``
          where the id is negative.

        Raises:
          TypeError: ``label_ids`` is not an integer tensor.
        """
        ids = tf.convert_to_tensor(label_ids)
        if not ids.dtype.is_integer:
            raise TypeError(f"label_ids must be integers, got {ids.dtype}")
        ids = tf.cast(ids, tf.int64)[..., tf.newaxis]
        a = tf.constant(self._hash_a, tf.int64)
        b = tf.constant(self._hash_b, tf.int64)
        safe = tf.maximum(ids, 0)
        h = tf.math.floormod(tf.math.floormod(a * safe + b, self._prime),
                             self._num_buckets)
        h = tf.where(ids >= 0, h, -tf.ones_like(h))
        return tf.cast(h, tf.int32)

    def buckets_numpy(self, label_ids) -> np.ndarray:
        """NumPy twin of :meth:`buckets`: int64 ``[..., R]``, -1 for ids < 0."""
        ids = np.asarray(label_ids, dtype=np.int64)[..., None]
        a = np.asarray(self._hash_a, np.int64)
        b = np.asarray(self._hash_b, np.int64)
        h = ((a * np.maximum(ids, 0) + b) % self._prime) % self._num_buckets
        return np.where(ids >= 0, h, -1)

    def inverted_lists(self) -> tuple[np.ndarray, np.ndarray]:
        """Bucket -> labels lists in CSR layout (NumPy; ``O(R m)`` memory).

        Returns:
          ``(offsets, labels)``: int64 ``[R, B + 1]`` and int32 ``[R, m]``;
          the labels of bucket ``c`` of repetition ``r`` are
          ``labels[r, offsets[r, c]:offsets[r, c + 1]]`` in increasing order
          (the layout the decoder kernel builds and caches internally).
        """
        h = self.buckets_numpy(np.arange(self._num_labels)).T  # [R, m]
        order = np.argsort(h, axis=1, kind="stable").astype(np.int32)
        counts = np.stack([np.bincount(row, minlength=self._num_buckets)
                           for row in h])
        offsets = np.concatenate(
            [np.zeros((len(h), 1), np.int64), np.cumsum(counts, axis=1)],
            axis=1)
        return offsets, order

    def get_config(self) -> dict:
        """JSON-serialisable dict; ``MachHashing.from_config`` inverts it."""
        return {"num_labels": self._num_labels,
                "num_buckets": self._num_buckets,
                "hash_a": list(self._hash_a),
                "hash_b": list(self._hash_b),
                "prime": self._prime}

    @classmethod
    def from_config(cls, config: Mapping) -> "MachHashing":
        return cls(**dict(config))

    def __eq__(self, other):
        return (isinstance(other, MachHashing)
                and self.get_config() == other.get_config())

    def __hash__(self):
        return hash((self._num_labels, self._num_buckets, self._hash_a,
                     self._hash_b, self._prime))

    def __repr__(self):
        return (f"MachHashing(num_labels={self._num_labels}, "
                f"num_buckets={self._num_buckets}, "
                f"num_repetitions={self.num_repetitions}, "
                f"prime={self._prime})")


ACTIVATIONS = ("softmax", "sigmoid", "linear")


def meta_probabilities(logits, activation="softmax") -> tf.Tensor:
    """Meta-class probabilities ``[..., R, B]`` float32 from head logits.

    Args:
      logits: float ``[..., R, B]`` outputs of a
        :class:`~xmc_tf.layers.mach.MachHead`.
      activation: ``"softmax"`` over the B buckets of each repetition (the
        head was trained with the per-repetition softmax cross-entropy,
        Medini et al. 2019, Algorithm 1), ``"sigmoid"`` per bucket (binary
        cross-entropy, the multi-label variant) or ``"linear"``/``None``
        (the input already holds probabilities).

    Returns:
      float32 tensor of the shape of ``logits``.

    Raises:
      ValueError: unknown ``activation``.
    """
    if activation == "softmax":
        return tf.nn.softmax(tf.cast(logits, tf.float32), axis=-1)
    if activation == "sigmoid":
        return tf.sigmoid(tf.cast(logits, tf.float32))
    if activation in ("linear", None):
        return tf.cast(logits, tf.float32)
    raise ValueError(
        f"activation must be one of {ACTIVATIONS}, got {activation!r}")


def mach_top_k(probs, k: int, hashing, *, method: str = "threshold",
               brute_force_fallback: bool = True, name: str | None = None):
    """Exact top-k labels under MACH's estimator (op ``Xmc>MachTopK``).

    ``score[i, j] = (sum_r probs[i, r, h_r(j)]) / R`` (Medini et al. 2019,
    Eq. 2 up to a monotone affine map), summed in float32 in repetition
    order; the ``k`` best labels per row are returned best first, ties broken
    by the lower label id.  No ``[batch, m]`` tensor is created.

    ``method="threshold"`` runs Fagin's threshold algorithm over
    per-repetition inverted lists bucket -> labels (built on the first call
    of each op instance and cached in the kernel: ``4 R (m + B)`` bytes);
    ``method="brute_force"`` scores every label (``O(m R)`` per row).  Both
    are exact and return identical ids and scores.  Not differentiable.
    Inside :func:`xmc_tf.ops.stock.stock_ops` (portable SavedModels) this
    is :func:`mach_top_k_stock`, TensorFlow's ops only (same ids and
    scores; ``method`` and ``brute_force_fallback`` do not apply).

    Special values: ``probs`` must be finite (NaN or +-inf raise
    ``InvalidArgumentError``).  Finite ``probs`` near the float32 limit can
    still overflow a score to ``+inf`` or ``-inf``; such a score ranks as
    that float does (``+inf`` first, ``-inf`` after every finite score, ties
    by the lower label id), identically in both methods.  A NaN score cannot
    occur: a float32 sum of finite values saturates at +-inf and never
    computes ``inf - inf``.

    Args:
      probs: float ``[batch, R, B]`` meta-class probabilities (cast to
        float32); softmax or sigmoid outputs of the R meta-classifiers (any
        finite values are accepted and averaged the same way).
      k: labels per row, ``1 <= k <= m``.
      hashing: the hash family: a :class:`MachHashing`, a
        :class:`~xmc_tf.layers.mach.MachHead`, or a ``MachHashing`` config.
      method: ``"threshold"`` (default) or ``"brute_force"``.
      brute_force_fallback: with ``method="threshold"``, use brute force
        where it is cheaper (same output): small label sets (``m <= 16 B``)
        and scans past ``2 m`` label visits (near-uniform rows).  ``False``
        forces the pure threshold algorithm (for testing).
      name: op name.

    Returns:
      ``(top_ids, top_scores)``: int32 ``[batch, k]`` and float32
      ``[batch, k]``.

    Raises:
      ValueError: ``k`` out of range, ``method`` unknown, or the static shape
        of ``probs`` does not match ``[batch, R, B]``.
      tf.errors.InvalidArgumentError: (at run time) ``probs`` has a wrong
        shape or holds NaN/inf.
      xmc_tf.errors.OpLibraryError: the op library is not available.

    Example:
      >>> h = MachHashing.random(1000, 32, 4, seed=0)
      >>> probs = tf.nn.softmax(tf.random.normal([2, 4, 32]), axis=-1)
      >>> ids, scores = mach_top_k(probs, 5, h)
      >>> ids.shape.as_list(), scores.dtype.name
      ([2, 5], 'float32')
    """
    hashing = MachHashing.from_any(hashing)
    k = _check_k(k, hashing)
    if method not in ("threshold", "brute_force"):
        raise ValueError(
            f"method must be 'threshold' or 'brute_force', got {method!r}")
    if stock.stock_formulations():
        return mach_top_k_stock(probs, k, hashing, name=name)
    with tf.name_scope(name or "mach_top_k"):
        probs = _checked_probs(probs, hashing)
        lib = _loader.load()
        if not hasattr(lib, "xmc_mach_top_k"):
            raise OpLibraryError(
                f"{_loader.library_path()} has no Xmc>MachTopK op (built "
                "without ops/mach): rebuild the op library")
        try:
            return lib.xmc_mach_top_k(
                probs, k=k, num_labels=hashing.num_labels,
                num_buckets=hashing.num_buckets, hash_a=list(hashing.hash_a),
                hash_b=list(hashing.hash_b), prime=hashing.prime,
                method=method,
                brute_force_fallback=bool(brute_force_fallback))
        except TypeError as e:  # an op library older than this wrapper
            raise OpLibraryError(
                f"{_loader.library_path()}: Xmc>MachTopK does not match "
                f"this xmc_tf ({e}); rebuild the op library") from e


tf.no_gradient("Xmc>MachTopK")


def _check_k(k, hashing: MachHashing) -> int:
    k = int(k)
    if not 1 <= k <= hashing.num_labels:
        raise ValueError(
            f"k must be in [1, num_labels={hashing.num_labels}], got {k}")
    return k


def _checked_probs(probs, hashing: MachHashing) -> tf.Tensor:
    """``probs`` as float32, its static shape checked against [b, R, B]."""
    probs = tf.convert_to_tensor(probs)
    if probs.dtype != tf.float32:
        probs = tf.cast(probs, tf.float32)
    shape = probs.shape
    if shape.rank is not None:
        want = [None, hashing.num_repetitions, hashing.num_buckets]
        if shape.rank != 3 or any(
                w is not None and s is not None and w != s
                for w, s in zip(want, shape.as_list())):
            raise ValueError(
                "probs must have shape [batch, R="
                f"{hashing.num_repetitions}, B={hashing.num_buckets}], "
                f"got {shape}")
    return probs


def _bucket_rows(hashing: MachHashing) -> tf.Tensor:
    """int32 ``[m, R]``: row ``r * B + h_r(j)`` of ``probs`` transposed to
    ``[R B, batch]`` for label ``j`` and repetition ``r``; a constant up to
    ``STOCK_TABLE_ENTRIES`` entries, else hashed in the graph."""
    m, R, B = (hashing.num_labels, hashing.num_repetitions,
               hashing.num_buckets)
    if m * R <= STOCK_TABLE_ENTRIES:
        rows = hashing.buckets_numpy(np.arange(m)) + np.arange(R) * B
        return tf.constant(rows.astype(np.int32))
    return hashing.buckets(tf.range(m)) + tf.range(R) * B


def mach_top_k_stock(probs, k: int, hashing, name: str | None = None):
    """:func:`mach_top_k` in TensorFlow's own ops (no ``Xmc>`` op).

    The same definition and results as ``Xmc>MachTopK``: ``score[i, j] =
    (sum_r probs[i, r, h_r(j)]) / R`` (Medini et al. 2019, Eq. 2 up to a
    monotone affine map), summed in float32 in repetition order from 0 and
    then divided by ``R`` as the op does (identical scores, bitwise), the
    ``k`` best per row best first, ties (equal scores, ``+-inf`` included)
    by the lower label id; non-finite ``probs`` raise.  For SavedModels
    that load without xmc_tf (:func:`xmc_tf.saving.export_saved_model`).

    Brute force over blocks of labels (a ``tf.while_loop``; about
    :data:`STOCK_BLOCK_ELEMENTS` / (R * batch) labels each): a block's
    bucket values are gathered from the transposed ``probs`` ``[R B,
    batch]`` (``[L, R, batch]``), summed over ``r`` in order, and the
    block's top ``k`` (``tf.math.top_k``) is kept; the blocks' candidates,
    in label order, are merged by a last ``tf.math.top_k`` (ties still go
    to the lower id: within a block ``top_k`` ranks equal scores by id, and
    the merge ranks equal ones by position).  ``O(batch m R)`` time (the
    op's threshold algorithm usually scores far fewer labels), no
    ``[batch, m]`` tensor.  The bucket table ``[m, R]`` int32 is a graph
    constant (``4 R m`` bytes per trace in a SavedModel's graph; hashing
    it on every call took longer than decoding a batch of one) up to
    ``STOCK_TABLE_ENTRIES`` entries, else hashed on every call.

    Args:
      probs: float ``[batch, R, B]`` meta-class probabilities (cast to
        float32), finite.
      k: labels per row, ``1 <= k <= m``.
      hashing: a :class:`MachHashing`, a
        :class:`~xmc_tf.layers.mach.MachHead`, or a ``MachHashing`` config.
      name: name scope.

    Returns:
      ``(top_ids, top_scores)``: int32 ``[batch, k]`` and float32
      ``[batch, k]``.

    Raises:
      ValueError: ``k`` out of range or a static shape of ``probs`` other
        than ``[batch, R, B]``.
      tf.errors.InvalidArgumentError: (at run time) ``probs`` holds NaN or
        inf, or has another shape.

    Example:
      >>> h = MachHashing.random(1000, 32, 4, seed=0)
      >>> probs = tf.nn.softmax(tf.random.normal([2, 4, 32]), axis=-1)
      >>> ids, scores = mach_top_k_stock(probs, 5, h)
      >>> ids.shape.as_list(), scores.dtype.name
      ([2, 5], 'float32')
    """
    hashing = MachHashing.from_any(hashing)
    k = _check_k(k, hashing)
    m, R, B = (hashing.num_labels, hashing.num_repetitions,
               hashing.num_buckets)
    with tf.name_scope(name or "mach_top_k_stock"):
        probs = _checked_probs(probs, hashing)
        probs = tf.debugging.assert_all_finite(
            probs, "probs must be finite (MACH top-k)")
        batch = tf.shape(probs)[0]
        with tf.control_dependencies([tf.debugging.assert_equal(
                tf.shape(probs)[1:], tf.constant([R, B]),
                message=f"probs must have shape [batch, R={R}, B={B}]")]):
            p_t = tf.reshape(tf.transpose(probs, [1, 2, 0]), [R * B, batch])
        rows = _bucket_rows(hashing)  # [m, R]
        block = tf.maximum(k, STOCK_BLOCK_ELEMENTS // tf.maximum(1, R * batch))
        block = tf.minimum(block, m)
        num_blocks = (m + block - 1) // block
        r_float = tf.constant(float(R), tf.float32)

        def body(i, values, ids):
            lo = i * block
            hi = tf.minimum(m, lo + block)
            gathered = tf.gather(p_t, rows[lo:hi])  # [L, R, b]
            total = gathered[:, 0]
            for r in range(1, R):  # float32, in repetition order, as the op
                total = total + gathered[:, r]
            scores = tf.transpose(total / r_float)  # [b, L]
            # The last block is padded to `block` columns (>= k) with -inf
            # after its labels: they rank after every real label.
            scores = tf.pad(scores, [[0, 0], [0, block - (hi - lo)]],
                            constant_values=-np.inf)
            top = tf.math.top_k(scores, k=k, sorted=True)
            return (i + 1, values.write(i, top.values),
                    ids.write(i, top.indices + lo))

        values = tf.TensorArray(tf.float32, size=num_blocks,
                                element_shape=tf.TensorShape([None, k]))
        ids = tf.TensorArray(tf.int32, size=num_blocks,
                             element_shape=tf.TensorShape([None, k]))
        _, values, ids = tf.while_loop(lambda i, *_: i < num_blocks, body,
                                       [tf.constant(0), values, ids])
        # [blocks, b, k] -> [b, blocks * k], in label order of the blocks.
        values = tf.reshape(tf.transpose(values.stack(), [1, 0, 2]),
                            [batch, -1])
        ids = tf.reshape(tf.transpose(ids.stack(), [1, 0, 2]), [batch, -1])
        top = tf.math.top_k(values, k=k, sorted=True)
        top_ids = tf.gather(ids, top.indices, batch_dims=1)
        top_ids.set_shape([probs.shape[0], k])
        top_scores = tf.identity(top.values)
        top_scores.set_shape([probs.shape[0], k])
        return top_ids, top_scores
