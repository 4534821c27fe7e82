"""MACH output head and decoder as Keras 3 layers.

MACH (Medini et al., "Extreme Classification in Log Memory using Count-Min
Sketch: A Case Study of Amazon Search with 50M Products", NeurIPS 2019,
Sec. 3, Algorithms 1-2) replaces an ``m``-way output layer by ``R``
independent ``B``-way meta-classifiers over hashed labels
``h_r(j) = ((a_r j + b_r) mod p) mod B``: the head holds ``R d B`` weights
instead of ``d m``.  Schultheis & Babbar ("Towards Memory-Efficient Training
for Extremely Large Output Spaces", Sec. 5) read MACH's decoding as a fixed,
very sparse ``[m, R B]`` 0/1 matrix ``C`` applied to the concatenated
meta-probabilities; :class:`MachDecoder` evaluates the top-k of ``C phi / R``
exactly without forming it.

* :class:`MachHead`: ``[batch, d]`` -> logits ``[batch, R, B]``; one batched
  kernel ``[R, d, B]`` (the R meta-classifiers are its leading-axis slices,
  so they can be sharded across workers along R).
* :class:`MachDecoder`: logits/probabilities ``[batch, R, B]`` -> exact
  top-k ``(ids int32 [batch, k], scores float32 [batch, k])`` via the fused
  op ``Xmc>MachTopK``; usable in a SavedModel for serving (in TensorFlow's
  own ops when traced inside :func:`xmc_tf.ops.stock.stock_ops`).

Train with :class:`xmc_tf.losses.mach.MachSoftmaxCrossentropy` (multi-class,
the paper's setting) or :class:`xmc_tf.losses.mach.MachBinaryCrossentropy`
(multi-label).  Compile with ``jit_compile=False`` (XLA cannot compile the
custom decoder op).

Example:
  >>> import keras
  >>> head = MachHead(num_labels=100_000, num_buckets=256,
  ...                 num_repetitions=8, seed=0)
  >>> inputs = keras.Input((64,))
  >>> logits = head(inputs)
  >>> tuple(logits.shape)
  (None, 8, 256)
  >>> ids, scores = MachDecoder.from_head(head, k=5)(logits)
  >>> tuple(ids.shape)
  (None, 5)
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.ops.mach import (ACTIVATIONS, PRIME, MachHashing, mach_top_k,
                             meta_probabilities)

__all__ = ["MachHead", "MachDecoder"]


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachHead(keras.layers.Layer):
    """R independent B-way meta-classifiers over hashed labels (MACH).

    ``logits[..., r, c] = sum_i x[..., i] * kernel[r, i, c] + bias[r, c]``:
    meta-classifier ``r`` scores bucket ``c``, which holds the labels ``j``
    with ``h_r(j) = c`` (Medini et al. 2019, Sec. 3).  The hash parameters
    ``a_r, b_r`` are drawn from ``seed`` at construction and stored in
    :meth:`get_config`, so a reloaded model hashes (and decodes) identically.

    Args:
      num_labels: number of labels ``m`` (``1 <= m <= prime``).
      num_buckets: buckets per repetition ``B``.
      num_repetitions: number of repetitions ``R``.
      seed: seed of the hash parameters (``numpy.random.default_rng``);
        ``None`` draws them from OS entropy.  Ignored when ``hash_a`` and
        ``hash_b`` are given.
      hash_a, hash_b: explicit hash parameters (``R`` ints each; what
        :meth:`get_config` stores).
      prime: hash modulus, a prime ``<= 2^31 - 1`` (default ``2^31 - 1``).
      use_bias: add a bias ``[R, B]``.
      decode_activation: how :meth:`decode` and :meth:`MachDecoder.from_head`
        turn logits into meta-probabilities by default: ``"softmax"`` (head
        trained with :class:`~xmc_tf.losses.mach.MachSoftmaxCrossentropy`)
        or ``"sigmoid"`` (:class:`~xmc_tf.losses.mach.MachBinaryCrossentropy`);
        stored in the config so a reloaded head decodes as it was trained.
      kernel_initializer, kernel_regularizer, kernel_constraint: as for
        ``keras.layers.Dense``; they receive the full shape ``[R, d, B]``
        (Keras' fan-in/out rules then treat R as a receptive field, so
        ``glorot_uniform`` is ``sqrt(R)`` narrower than R separate
        ``Dense(B)`` layers).
      bias_initializer, bias_regularizer, bias_constraint: as for
        ``keras.layers.Dense``; they receive the full shape ``[R, B]``.
      **kwargs: base ``keras.layers.Layer`` arguments (``name``, ``dtype``,
        ``activity_regularizer``, ...).

    Input shape: ``[..., d]`` float.
    Output shape: ``[..., R, B]`` logits (no activation; losses take logits).

    Attributes:
      hashing: the :class:`xmc_tf.ops.mach.MachHashing` of the head.
      kernel: ``[R, d, B]`` weight (after ``build``).
      bias: ``[R, B]`` weight or ``None``.

    Raises:
      ValueError: invalid sizes or hash parameters; input without a known
        last dimension.

    Example:
      >>> head = MachHead(num_labels=1000, num_buckets=32,
      ...                 num_repetitions=4, seed=1)
      >>> head.buckets(tf.constant([[5, -1]])).shape.as_list()
      [1, 2, 4]
    """

    def __init__(self, num_labels, num_buckets, num_repetitions, seed=0,
                 hash_a=None, hash_b=None, prime=PRIME, use_bias=True,
                 decode_activation="softmax",
                 kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer=None,
                 bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        if (hash_a is None) != (hash_b is None):
            raise ValueError("pass both hash_a and hash_b, or neither")
        if hash_a is None:
            self.hashing = MachHashing.random(num_labels, num_buckets,
                                              num_repetitions, seed, prime)
        else:
            self.hashing = MachHashing(num_labels, num_buckets, hash_a,
                                       hash_b, prime)
            if self.hashing.num_repetitions != int(num_repetitions):
                raise ValueError(
                    f"len(hash_a)={self.hashing.num_repetitions} != "
                    f"num_repetitions={num_repetitions}")
        self.num_labels = int(num_labels)
        self.num_buckets = int(num_buckets)
        self.num_repetitions = int(num_repetitions)
        self.seed = seed
        self.use_bias = bool(use_bias)
        if decode_activation not in ("softmax", "sigmoid"):
            raise ValueError("decode_activation must be 'softmax' or "
                             f"'sigmoid', got {decode_activation!r}")
        self.decode_activation = decode_activation
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.kernel = None
        self.bias = None

    def build(self, input_shape):
        d = input_shape[-1]
        if d is None:
            raise ValueError("MachHead needs a known last input dimension, "
                             f"got {input_shape}")
        self.kernel = self.add_weight(
            name="kernel",
            shape=(self.num_repetitions, int(d), self.num_buckets),
            initializer=self.kernel_initializer,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint)
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.num_repetitions, self.num_buckets),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2, axes={-1: d})

    def call(self, inputs):
        """``[..., d]`` (dense) or ``[batch, d]`` (``tf.SparseTensor``) ->
        logits ``[..., R, B]``."""
        R, B = self.num_repetitions, self.num_buckets
        kernel = tf.convert_to_tensor(self.kernel)
        d = kernel.shape[1]
        if isinstance(inputs, tf.SparseTensor):
            flat_kernel = tf.reshape(tf.transpose(kernel, [1, 0, 2]),
                                     [d, R * B])
            logits = tf.reshape(
                tf.sparse.sparse_dense_matmul(inputs, flat_kernel), [-1, R, B])
        else:
            # One broadcast batched matmul [1, N, d] x [R, d, B] -> [R, N, B]
            # (an einsum with "..." here had a ~100x slower gradient).
            x = tf.convert_to_tensor(inputs)
            lead = tf.shape(x)[:-1]
            y = tf.linalg.matmul(tf.reshape(x, [1, -1, d]), kernel)
            logits = tf.reshape(tf.transpose(y, [1, 0, 2]),
                                tf.concat([lead, [R, B]], axis=0))
        if self.use_bias:
            logits = logits + self.bias
        return logits

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.num_repetitions,
                                          self.num_buckets)

    def buckets(self, label_ids):
        """Buckets of label ids: int32 ``[..., R]``, ``-1`` for ids < 0.

        Computed on the fly from the hash parameters (no ``[R, m]`` table).
        See :meth:`xmc_tf.ops.mach.MachHashing.buckets`.
        """
        return self.hashing.buckets(label_ids)

    def decode(self, logits, k, activation=None, method="threshold"):
        """Exact top-k labels of head logits (eager/graph helper).

        Args:
          logits: ``[batch, R, B]`` output of this head.
          k: labels per row.
          activation: ``"softmax"`` (over buckets; multi-class training),
            ``"sigmoid"`` (multi-label training), ``"linear"`` (average
            the raw logits) or ``None``: the head's ``decode_activation``.
          method: ``"threshold"`` or ``"brute_force"``.

        Returns:
          ``(ids int32 [batch, k], scores float32 [batch, k])``.
        """
        if activation is None:
            activation = self.decode_activation
        return mach_top_k(meta_probabilities(logits, activation), k, self.hashing,
                          method=method)

    def head_bytes(self) -> int:
        """Bytes of the head's weights (kernel + bias) in their dtype."""
        return int(sum(int(w.numpy().nbytes) for w in self.weights))

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_labels": self.num_labels,
            "num_buckets": self.num_buckets,
            "num_repetitions": self.num_repetitions,
            "seed": self.seed,
            "hash_a": list(self.hashing.hash_a),
            "hash_b": list(self.hashing.hash_b),
            "prime": self.hashing.prime,
            "use_bias": self.use_bias,
            "decode_activation": self.decode_activation,
            "kernel_initializer":
                keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer":
                keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer":
                keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer":
                keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint":
                keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint":
                keras.constraints.serialize(self.bias_constraint),
        })
        return config


@keras.saving.register_keras_serializable(package="xmc_tf")
class MachDecoder(keras.layers.Layer):
    """Exact top-k labels from MACH meta-classifier outputs (no weights).

    Applies ``activation`` over the bucket axis, then the fused op
    ``Xmc>MachTopK``: ``score[i, j] = (1/R) sum_r P[i, r, h_r(j)]``
    (Medini et al. 2019, Eq. 2 / Algorithm 2), top-k per row, ties broken by
    the lower label id, without a ``[batch, m]`` tensor.  The op caches
    the inverted lists bucket -> labels (``4 R (m + B)`` bytes) on its first
    call.  Works in eager mode, in ``tf.function``, and in exported
    SavedModels (``import xmc_tf`` before loading one).  Traced inside
    :func:`xmc_tf.ops.stock.stock_ops` (portable SavedModels,
    :func:`xmc_tf.saving.export_saved_model`) it decodes with TensorFlow's
    ops instead (:func:`xmc_tf.ops.mach.mach_top_k_stock`: the same ids
    and scores, by brute force).

    Args:
      num_labels, num_buckets, hash_a, hash_b, prime: the hash family (use
        :meth:`from_head`).
      k: labels returned per row.
      activation: ``"softmax"`` (the head was trained with the softmax
        loss), ``"sigmoid"`` (binary cross-entropy) or ``"linear"`` (the
        input already holds probabilities).
      method: ``"threshold"`` (fast) or ``"brute_force"`` (reference).
      **kwargs: base layer arguments.

    Input shape: ``[batch, R, B]``.
    Output: ``(ids, scores)``: int32 ``[batch, k]`` and float32 ``[batch, k]``,
    best first.

    Raises:
      ValueError: invalid hash parameters, ``k``, ``activation`` or
        ``method``; input of the wrong shape.
    """

    def __init__(self, num_labels, num_buckets, hash_a, hash_b, k=5,
                 activation="softmax", prime=PRIME, method="threshold",
                 **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.hashing = MachHashing(num_labels, num_buckets, hash_a, hash_b,
                                   prime)
        self.k = int(k)
        if not 1 <= self.k <= self.hashing.num_labels:
            raise ValueError(f"k must be in [1, num_labels="
                             f"{self.hashing.num_labels}], got {k}")
        if activation is None:
            activation = "linear"
        if activation not in ACTIVATIONS:
            raise ValueError(
                f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        if method not in ("threshold", "brute_force"):
            raise ValueError(
                f"method must be 'threshold' or 'brute_force', got {method!r}")
        self.activation = activation
        self.method = method

    @classmethod
    def from_head(cls, head: MachHead, k=5, activation=None,
                  method="threshold", **kwargs) -> "MachDecoder":
        """A decoder with the hash family of ``head``; ``activation=None``
        takes the head's ``decode_activation``."""
        h = head.hashing
        if activation is None:
            activation = head.decode_activation
        return cls(h.num_labels, h.num_buckets, list(h.hash_a),
                   list(h.hash_b), k=k, activation=activation, prime=h.prime,
                   method=method, **kwargs)

    def call(self, inputs):
        probs = meta_probabilities(inputs, self.activation)
        return mach_top_k(probs, self.k, self.hashing, method=self.method)

    def compute_output_shape(self, input_shape):
        return ((input_shape[0], self.k), (input_shape[0], self.k))

    def compute_output_spec(self, inputs):
        batch = inputs.shape[0]
        return (keras.KerasTensor((batch, self.k), dtype="int32"),
                keras.KerasTensor((batch, self.k), dtype="float32"))

    def get_config(self):
        config = super().get_config()
        config.update({
            "num_labels": self.hashing.num_labels,
            "num_buckets": self.hashing.num_buckets,
            "hash_a": list(self.hashing.hash_a),
            "hash_b": list(self.hashing.hash_b),
            "prime": self.hashing.prime,
            "k": self.k,
            "activation": self.activation,
            "method": self.method,
        })
        return config
