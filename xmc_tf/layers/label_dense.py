"""Dense output layer with a label-major kernel, for sampled training.

A ``keras.layers.Dense(units)`` stores its kernel ``[input_dim, units]``: one
label's classifier vector is a strided column.  :class:`LabelDense` stores the
transpose, ``[units, input_dim]``, so that the vector of label ``l`` is the
contiguous row ``kernel[l]``.  That makes three things of sampled training
cheap (ASTRA, Mehta et al., Sec. 3.1 "build ANNS-indices on classifier
weights" and Algorithm 1 steps 17-18):

* scoring only candidate labels (:meth:`LabelDense.score_candidates`: a
  ``tf.gather`` of rows and a batched dot product);
* sparse updates: the gradient w.r.t. the kernel is a ``tf.IndexedSlices``
  over the candidate rows, which Keras' TensorFlow optimizers apply with
  row scatters;
* indexing the labels for maximum-inner-product search
  (:meth:`LabelDense.label_vectors`, rows are the vectors).
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf import initializers  # noqa: F401  (registers "hinge_prior")
from xmc_tf.layers.scorer import LabelLayout
from xmc_tf.ops.sampled import (check_shared_candidates,
                                dense_sampled_matmul, gather_label_rows)


@keras.saving.register_keras_serializable(package="xmc_tf")
class LabelDense(keras.layers.Layer):
    """``keras.layers.Dense(units)`` with the kernel stored label-major.

    ``outputs = activation(inputs @ transpose(kernel) + bias)`` with
    ``kernel`` ``[units, input_dim]`` (row ``l`` = classifier vector of label
    ``l``) and ``bias`` ``[units]``: the same outputs as
    ``keras.layers.Dense(units)`` whose kernel is ``transpose(kernel)`` and
    whose bias is ``bias``.

    The bias starts at -1 by default (``"hinge_prior"``, see
    ``bias_initializer`` below), not at Dense's 0.  The kernel's
    initialisation matches ``keras.layers.Dense``: the kernel initializer is
    called with Dense's shape ``(input_dim, units)`` -- so Keras reads
    fan_in = input_dim, fan_out = units, as for Dense (``he_normal``,
    ``lecun_normal`` ... depend on it) -- and its result is transposed; a
    seeded initializer gives exactly the transpose of the Dense kernel.  This
    materialises the kernel twice during ``build`` (``2 * 4 * units *
    input_dim`` bytes transiently).  Regularizers and constraints see the
    label-major ``[units, input_dim]`` kernel.

    Args:
      units: number of labels m (>= 1).
      activation: Keras activation of ``call``, default linear (logits).
        :meth:`score_candidates` never applies it.
      use_bias: add a bias per label.
      bias_initializer: default ``"hinge_prior"``
        (:class:`xmc_tf.initializers.PriorBias`): -1 for every label, the
        squared hinge's best constant score for a rare label, so that
        ``model.fit`` with :class:`xmc_tf.losses.SquaredHinge` learns out of
        the box (a zero bias puts every label inside its margin: see
        :class:`~xmc_tf.layers.UniformSparseDense`).  Harmless for a
        softmax; for the binary cross-entropy pass
        ``BinaryCrossentropy().bias_initializer(labels_per_instance)``.
        Saved models reload with the initializer they were saved with.
      kernel_initializer: as in ``keras.layers.Dense``.
      kernel_regularizer, bias_regularizer, activity_regularizer: as in
        ``keras.layers.Dense``.
      kernel_constraint, bias_constraint: as in ``keras.layers.Dense``.

    Input shape: ``[..., input_dim]`` float (rank >= 2).
    Output shape: ``[..., units]``.

    Mixed precision (``"mixed_float16"``, ``"mixed_bfloat16"`` policies):
    the variables stay float32 and are cast to the compute dtype
    (:meth:`score_candidates` / :meth:`score_shared` cast only the gathered
    rows), so the outputs are float16 / bfloat16 (tests/test_mixed_precision.py).

    Raises:
      ValueError: ``units`` < 1; at build, an unknown last input dimension.

    >>> import keras, numpy as np, xmc_tf
    >>> layer = xmc_tf.layers.LabelDense(1000)
    >>> x = keras.ops.ones((2, 64))
    >>> layer(x).shape, tuple(layer.kernel.shape)
    (TensorShape([2, 1000]), (1000, 64))
    >>> layer.score_candidates(x, np.array([[3, 7], [0, 3]], np.int32)).shape
    TensorShape([2, 2])
    """

    def __init__(self, units, activation=None, use_bias=True,
                 kernel_initializer="glorot_uniform",
                 bias_initializer="hinge_prior",
                 kernel_regularizer=None, bias_regularizer=None,
                 activity_regularizer=None, kernel_constraint=None,
                 bias_constraint=None, **kwargs):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        if int(units) < 1:
            raise ValueError(f"units must be >= 1, got {units}")
        self.units = int(units)
        self.activation = keras.activations.get(activation)
        self.use_bias = bool(use_bias)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2)

    def build(self, input_shape):
        input_dim = input_shape[-1]
        if input_dim is None:
            raise ValueError("LabelDense needs inputs with a known last "
                             f"dimension, got {input_shape}")
        self.input_dim = int(input_dim)
        dense_init = self.kernel_initializer

        def label_major_init(shape, dtype=None):
            # Dense's shape (input_dim, units): Dense's fans, then transpose.
            return keras.ops.transpose(dense_init((shape[1], shape[0]),
                                                  dtype=dtype))

        self.kernel = self.add_weight(
            name="kernel", shape=(self.units, self.input_dim),
            initializer=label_major_init,
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint)
        self.bias = None
        if self.use_bias:
            self.bias = self.add_weight(
                name="bias", shape=(self.units,),
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint)
        self.input_spec = keras.layers.InputSpec(min_ndim=2,
                                                 axes={-1: self.input_dim})

    def call(self, inputs):
        kernel = keras.ops.cast(self.kernel, inputs.dtype)
        flat = tf.reshape(inputs, [-1, self.input_dim])
        outputs = tf.matmul(flat, kernel, transpose_b=True)
        if self.bias is not None:
            outputs = tf.nn.bias_add(outputs,
                                     keras.ops.cast(self.bias, outputs.dtype))
        if inputs.shape.rank != 2:
            outputs = tf.reshape(outputs, tf.concat(
                [tf.shape(inputs)[:-1], [self.units]], 0))
        return self.activation(outputs)

    def score_candidates(self, inputs, candidates):
        """Logits of per-instance candidate labels (no activation).

        ``scores[i, j] = inputs[i] . kernel[candidates[i, j]] +
        bias[candidates[i, j]]``: equal to
        ``tf.gather(logits, candidates, batch_dims=1)`` of the full layer
        without computing the ``[batch, units]`` logits.  Only the candidate
        rows of ``kernel`` and ``bias`` are read (``ResourceGather``); their
        gradient is a ``tf.IndexedSlices`` over the flattened candidates (see
        :func:`xmc_tf.ops.dense_sampled_matmul`).

        Args:
          inputs: ``[batch, input_dim]`` float.
          candidates: integer ``[batch, num_candidates]`` label ids in
            ``[0, units)``, repeats allowed.

        Returns:
          ``[batch, num_candidates]`` logits, dtype of ``inputs``.

        Raises:
          ValueError: the layer is not built (call it once first), or bad
            static ranks.
          tf.errors.InvalidArgumentError: a candidate is out of range (the
            message gives its position and value).
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built: call the layer on an "
                             "input (or build it) before score_candidates")
        # The variables themselves: their candidate rows are read with
        # ResourceGather (and cast to the inputs' dtype), never the whole
        # kernel, which the sparse updates put in copy-on-read mode.
        return dense_sampled_matmul(inputs, self.kernel, candidates,
                                    self.bias)

    def score_shared(self, inputs, candidates):
        """Logits of one candidate set scored by every row (no activation).

        ``scores[i, j] = inputs[i] . kernel[candidates[j]] +
        bias[candidates[j]]``: the ``C`` candidate rows are read once
        (``ResourceGather``) and multiplied in one ``[b, d] x [d, C]``
        product; the kernel and bias gradients are ``tf.IndexedSlices`` over
        the candidates.  Used by sampled training with shared candidates
        (:meth:`xmc_tf.samplers.NegativeSampler.sample_shared`).

        Args:
          inputs: ``[batch, input_dim]`` float.
          candidates: integer ``[C]`` label ids in ``[0, units)``.

        Returns:
          ``[batch, C]`` logits, dtype of ``inputs``.

        Raises:
          ValueError: the layer is not built.
          tf.errors.InvalidArgumentError: a candidate is out of range.

        >>> import keras, numpy as np, xmc_tf
        >>> layer = xmc_tf.layers.LabelDense(10)
        >>> x = keras.ops.ones((2, 4))
        >>> _ = layer(x)
        >>> layer.score_shared(x, np.array([3, 7, 3], np.int32)).shape
        TensorShape([2, 3])
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built: call the layer on an "
                             "input (or build it) before score_shared")
        inputs = tf.convert_to_tensor(inputs)
        ids = check_shared_candidates(candidates, self.units)
        rows = gather_label_rows(self.kernel, ids, inputs.dtype)  # [C, d]
        scores = tf.matmul(inputs, rows, transpose_b=True)
        if self.bias is not None:
            scores += gather_label_rows(self.bias, ids, scores.dtype)[None, :]
        return scores

    @property
    def num_labels(self) -> int:
        """m, the number of labels (``units``):
        :class:`~xmc_tf.layers.scorer.LabelScorer`."""
        return self.units

    def label_layout(self) -> LabelLayout:
        """Label-major dense rows: ``kernel [units, input_dim]``, ``bias``.

        Raises:
          ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built")
        return LabelLayout(kernel=self.kernel, bias=self.bias,
                           input_dim=int(self.kernel.shape[1]))

    def label_vectors(self, include_bias=False):
        """The classifier vectors of all labels, for an inner-product index.

        Args:
          include_bias: append the bias as a last column (pair it with
            queries ``[x, 1]`` so that the inner product is the logit).

        Returns:
          C-contiguous NumPy float32 ``[units, input_dim]`` (``+ 1`` column
          with ``include_bias`` and a bias), a copy of the kernel rows.

        Raises:
          ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built")
        vectors = np.array(keras.ops.convert_to_numpy(self.kernel),
                           dtype=np.float32)
        if include_bias and self.bias is not None:
            bias = np.asarray(keras.ops.convert_to_numpy(self.bias),
                              dtype=np.float32)
            vectors = np.concatenate([vectors, bias[:, None]], axis=1)
        return np.ascontiguousarray(vectors)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.units,)

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
        })
        return config
