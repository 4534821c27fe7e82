"""Sparse-input encoder: a TF-IDF weighted bag of feature embeddings.

XMC inputs are sparse bag-of-words / TF-IDF vectors over 10^5-10^6
features of which a batch touches a few thousand.  ``keras.layers.Dense`` on
a rank-2 ``tf.SparseTensor`` (Keras 3.15) computes the right function with
``tf.nn.embedding_lookup_sparse`` on the kernel converted to a dense tensor:
its kernel gradient is already a ``tf.IndexedSlices``, but every step reads
the whole ``[num_features, units]`` kernel, and Keras' Adam densifies the
gradient and updates every row (see :mod:`xmc_tf.optimizers.lazy`).  Once a
row-sparse optimizer has scattered into the kernel, TensorFlow copies the
whole variable on each such dense read (copy-on-read mode,
:mod:`xmc_tf.optimizers.rows`), so ``Dense`` + a lazy optimizer is not
enough.  :class:`SparseEmbeddingBag` computes the same function reading only
the rows present in the batch; with :class:`xmc_tf.optimizers.LazyAdam` a
training step costs ``O(nnz * units)`` instead of ``O(num_features * units)``.

The layer is the "sparse input layer" of the XMC networks reviewed by
Schultheis & Babbar ("Towards Memory-Efficient Training for Extremely Large
Output Spaces", Sec. 3.4: TF-IDF features -> dense intermediate layer -> output
layer) and the embedding-bag of fastText-style text encoders (Joulin et al.,
"Bag of Tricks for Efficient Text Classification", EACL 2017, Sec. 2).
"""

from __future__ import annotations

import keras
import tensorflow as tf

from xmc_tf.initializers import large_matrix_initializer
from xmc_tf.ops.embedding_bag import embedding_bag, embedding_bag_supported
from xmc_tf.optimizers.rows import gather_rows, tf_variable

__all__ = ["SparseDropout", "SparseEmbeddingBag"]

_COMBINERS = ("sum", "mean", "sqrtn")


@keras.saving.register_keras_serializable(package="xmc_tf")
class SparseEmbeddingBag(keras.layers.Layer):
    """``activation(sum_f x[f] * kernel[f] + bias)`` with a row-sparse gradient.

    For a batch ``x`` (``tf.SparseTensor`` ``[batch, num_features]``, e.g.
    TF-IDF weights) the output row ``i`` is ``activation(sum_f w_if *
    kernel[f, :] + bias)`` over the stored entries ``(i, f)`` of ``x``, where
    ``w_if = x[i, f]`` (``combiner="sum"``), ``x[i, f] / sum_g x[i, g]``
    (``"mean"``) or ``x[i, f] / sqrt(sum_g x[i, g]^2)`` (``"sqrtn"``), as in
    ``tf.nn.embedding_lookup_sparse``.  Repeated ``(i, f)`` entries add up;
    a row without entries gives ``activation(bias)`` (the combiners give 0
    there, not NaN).

    Relation to ``keras.layers.Dense``: with ``combiner="sum"`` this is the
    same function as ``Dense(units)`` applied to the same sparse input — same
    weight names (``kernel [num_features, units]``, ``bias [units]``), same
    shapes, same default initializers (``glorot_uniform`` on the full
    ``[num_features, units]`` shape, i.e. limit ``sqrt(6 / (num_features +
    units))``, so equal seeds give equal tables; ``keras.layers.Embedding``
    instead defaults to ``uniform(-0.05, 0.05)``), so ``set_weights`` moves
    weights between the two.  What differs is how the table is read and
    differentiated: the forward pass gathers only the ``u`` distinct feature
    rows of the batch (``ResourceGather``, never a read of the whole table)
    and multiplies the remapped ``[batch, u]`` sparse input with them; the
    gradient w.r.t. ``kernel`` is a ``tf.IndexedSlices`` with exactly the
    ``u`` features of the batch as unique indices and values ``[u, units]``.
    On the CPU (float32/float64) that product and its gradient are the
    multi-threaded ops ``Xmc>EmbeddingBag`` / ``Xmc>EmbeddingBagGradTable``
    (:mod:`xmc_tf.ops.embedding_bag`); elsewhere
    ``tf.sparse.sparse_dense_matmul``.
    (Keras 3.15's ``Dense`` also yields an ``IndexedSlices``, with indices
    that include feature 0 whenever a row is empty, but reads the whole
    kernel every step.)  Train it with :class:`xmc_tf.optimizers.LazyAdam` /
    ``LazySGD``: Keras' Adam would densify the gradient.

    A dense input ``[..., num_features]`` is accepted too (``matmul`` with the
    whole kernel; dense gradient), e.g. for a ``keras.Input`` without
    ``sparse=True``.

    Args:
      units: output width ``d`` (positive int).
      activation: Keras activation (name or callable); ``None``: identity.
      use_bias: add a bias ``[units]``.
      combiner: ``"sum"`` (default; TF-IDF weighted sum, = ``Dense``),
        ``"mean"`` or ``"sqrtn"``.
      kernel_initializer, bias_initializer: as ``keras.layers.Dense``;
        a kernel of at least
        :data:`xmc_tf.initializers.CHUNKED_INIT_BYTES` is drawn a block
        of rows at a time (:func:`xmc_tf.initializers.chunked_initial_value`).
      kernel_regularizer, kernel_constraint: as ``Dense``, but both read and
        (regularizer) differentiate the **whole** table every step, so the
        kernel gradient becomes dense again and, after the first sparse
        update, each dense read copies the table (TensorFlow's copy-on-read
        mode).  Prefer the optimizer's row-lazy ``weight_decay``
        (:class:`xmc_tf.optimizers.LazyAdamW`).
      bias_regularizer, bias_constraint: as ``Dense``.
      **kwargs: base layer arguments (``name``, ``dtype``, ...).

    Input shape:
      ``tf.SparseTensor`` float ``[batch, num_features]`` (rank 2, int64
      indices; any entry order), or a dense float tensor ``[..., num_features]``.

    Output shape:
      ``[batch, units]`` (``[..., units]`` for dense input), compute dtype.

    Attributes:
      kernel: ``[num_features, units]`` embedding table (after ``build``).
      bias: ``[units]`` or ``None``.
      num_features: ``D``, from the last input dimension at ``build``.

    Raises:
      ValueError: ``units < 1``, unknown ``combiner``, unknown last input
        dimension at build, or a sparse input of rank other than 2.
      tf.errors.InvalidArgumentError: at run time, a sparse input with a
        feature id outside ``[0, num_features)``.

    Example:
      >>> import numpy as np
      >>> layer = SparseEmbeddingBag(4, kernel_initializer="ones")
      >>> x = tf.SparseTensor([[0, 1], [0, 7], [2, 3]], [0.5, 2.0, 1.0],
      ...                     [3, 10])
      >>> layer(x).numpy()[:, 0].tolist()  # rows: 0.5 + 2.0, empty, 1.0
      [2.5, 0.0, 1.0]
      >>> with tf.GradientTape() as tape:
      ...     y = tf.reduce_sum(layer(x))
      >>> g = tape.gradient(y, layer.kernel)
      >>> type(g).__name__, sorted(g.indices.numpy().tolist())
      ('IndexedSlices', [1, 3, 7])
    """

    def __init__(self, units, activation=None, use_bias=True, combiner="sum",
                 kernel_initializer="glorot_uniform",
                 bias_initializer="zeros", kernel_regularizer=None,
                 bias_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(**kwargs)
        if int(units) < 1:
            raise ValueError(f"units must be >= 1, got {units}")
        if combiner not in _COMBINERS:
            raise ValueError(f"combiner must be one of {_COMBINERS}, got "
                             f"{combiner!r}")
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.combiner = combiner
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.num_features = None
        self.kernel = None
        self.bias = None

    def build(self, input_shape):
        num_features = input_shape[-1]
        if num_features is None:
            raise ValueError("SparseEmbeddingBag needs a known last input "
                             f"dimension (num_features), got {input_shape}")
        self.num_features = int(num_features)
        self.kernel = self.add_weight(
            name="kernel", shape=(self.num_features, self.units),
            initializer=large_matrix_initializer(
                self.kernel_initializer, (self.num_features, self.units),
                self.variable_dtype),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint)
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.units,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint)
        self.input_spec = keras.layers.InputSpec(
            min_ndim=2, axes={-1: self.num_features})

    def _sparse_call(self, x):
        if x.shape.rank is not None and x.shape.rank != 2:
            raise ValueError("SparseEmbeddingBag takes a rank-2 SparseTensor "
                             f"[batch, num_features], got shape {x.shape}")
        dtype = self.compute_dtype
        rows, ids = x.indices[:, 0], x.indices[:, 1]
        batch = x.dense_shape[0]
        weights = tf.cast(x.values, dtype)
        in_range = tf.logical_or(
            tf.equal(tf.size(ids), 0),
            tf.logical_and(tf.reduce_min(ids) >= 0,
                           tf.reduce_max(ids) < self.num_features))
        check = tf.debugging.Assert(in_range, [
            "SparseEmbeddingBag: feature id outside [0, num_features); "
            "num_features =", self.num_features, "min id =",
            tf.reduce_min(ids), "max id =", tf.reduce_max(ids)])
        with tf.control_dependencies([check]):
            ids = tf.identity(ids)
        if self.combiner != "sum":
            squares = self.combiner == "sqrtn"
            totals = tf.math.unsorted_segment_sum(
                tf.square(weights) if squares else weights, rows, batch)
            if squares:
                totals = tf.sqrt(totals)
            weights = tf.math.divide_no_nan(weights, tf.gather(totals, rows))
        unique_ids, positions = tf.unique(ids, out_idx=tf.int64)
        # The only read of the table: its u distinct rows (gradient:
        # IndexedSlices over unique_ids).
        table_rows = gather_rows(self.kernel, unique_ids, dtype=dtype)
        if embedding_bag_supported(dtype, tf_variable(self.kernel).device):
            # Multi-threaded CPU kernels (Xmc>EmbeddingBag and its gradient).
            return embedding_bag(rows, positions, weights, table_rows, batch)
        local = tf.SparseTensor(
            tf.stack([rows, positions], axis=1), weights,
            tf.stack([batch, tf.size(unique_ids, out_type=tf.int64)]))
        return tf.sparse.sparse_dense_matmul(local, table_rows)

    def _dense_call(self, x):
        x = tf.cast(x, self.compute_dtype)
        if self.combiner == "mean":
            x = tf.math.divide_no_nan(x, tf.reduce_sum(x, -1, keepdims=True))
        elif self.combiner == "sqrtn":
            x = tf.math.divide_no_nan(
                x, tf.sqrt(tf.reduce_sum(tf.square(x), -1, keepdims=True)))
        return keras.ops.matmul(x, self.kernel)

    def call(self, inputs):
        """Applies the layer (see the class docstring for shapes/errors)."""
        if isinstance(inputs, tf.SparseTensor):
            outputs = self._sparse_call(inputs)
        else:
            outputs = self._dense_call(inputs)
        if self.bias is not None:
            outputs = tf.nn.bias_add(outputs, tf.cast(self.bias,
                                                      outputs.dtype))
        if self.activation is not None:
            outputs = self.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "combiner": self.combiner,
            "kernel_initializer": keras.initializers.serialize(
                self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(
                self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(
                self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(
                self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(
                self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(
                self.bias_constraint),
        })
        return config


@keras.saving.register_keras_serializable(package="xmc_tf")
class SparseDropout(keras.layers.Layer):
    """Dropout on the stored entries of a sparse input (input-feature dropout).

    In training, each stored entry ``(i, f)`` of a ``tf.SparseTensor`` is
    removed with probability ``rate`` and the kept values are scaled by
    ``1 / (1 - rate)``, so the expected input is unchanged; at inference the
    input passes through.  A dense input gets ``keras.layers.Dropout``'s
    behaviour (zeros instead of removed entries).

    Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
    Extremely Large Output Spaces", Sec. 4.1 ("we apply dropout to the
    input features, dropping 10 % ... and 20 %"); word dropout on
    bag-of-words inputs.

    Args:
      rate: float in ``[0, 1)``, the probability of dropping an entry.
      seed: int seed of the dropout draws (None: random).
      **kwargs: base layer arguments (``name``, ...).

    Input shape: ``tf.SparseTensor`` or dense float ``[batch, num_features]``.
    Output shape: the input's (a ``tf.SparseTensor`` with fewer entries in
    training).

    Raises:
      ValueError: ``rate`` outside ``[0, 1)``.

    Example:
      >>> x = tf.SparseTensor([[0, 1], [0, 7], [1, 3]], [1.0, 2.0, 4.0], [2, 10])
      >>> SparseDropout(0.5, seed=0)(x, training=False).values.numpy().tolist()
      [1.0, 2.0, 4.0]
      >>> kept = SparseDropout(0.5, seed=0)(x, training=True).values.numpy()
      >>> set(kept.tolist()) <= {2.0, 4.0, 8.0}
      True
    """

    def __init__(self, rate, seed=None, **kwargs):
        super().__init__(**kwargs)
        if not 0.0 <= float(rate) < 1.0:
            raise ValueError(f"rate must be in [0, 1), got {rate}")
        self.rate = float(rate)
        self.seed = seed
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True

    def call(self, inputs, training=False):
        if not training or self.rate == 0.0:
            return inputs
        if not isinstance(inputs, tf.SparseTensor):
            return keras.random.dropout(inputs, self.rate,
                                        seed=self.seed_generator)
        keep = keras.random.uniform(tf.shape(inputs.values),
                                    seed=self.seed_generator) >= self.rate
        kept = tf.sparse.retain(inputs, keep)
        scale = tf.cast(1.0 / (1.0 - self.rate), kept.values.dtype)
        return tf.SparseTensor(kept.indices, kept.values * scale,
                               kept.dense_shape)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs, training=False):
        del training
        return keras.KerasTensor(inputs.shape, dtype=inputs.dtype,
                                 sparse=getattr(inputs, "sparse", False))

    def get_config(self):
        config = super().get_config()
        config.update({"rate": self.rate, "seed": self.seed})
        return config
