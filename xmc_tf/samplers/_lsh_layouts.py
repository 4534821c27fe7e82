"""How :class:`~xmc_tf.samplers.LshNegativeSampler` reads the head's label
vectors: one strategy per weight layout, chosen once at ``bind()``.

:func:`label_weights` turns a head's
:class:`~xmc_tf.layers.scorer.LabelLayout` into one of

* :class:`LabelMajorWeights`: a dense ``kernel [m, d]``
  (:class:`~xmc_tf.layers.LabelDense` or a stand-in);
* :class:`FeatureMajorWeights`: a dense ``kernel [d, m]``
  (``keras.layers.Dense``);
* :class:`SparseWeights`: uniform-sparse ``indices`` / ``kernel [m, s]``
  into ``input_dim`` features (:class:`~xmc_tf.layers.UniformSparseDense`),
  read without densifying.

Each keeps the layout's variables (no copy) and gives what the sampler
needs: the codes of all or some labels (:meth:`~LabelMajorWeights.hash`),
the candidates' dot products with the head inputs and the cosines between
candidates and positives (the inclusion probability of
``inclusion="cosine"``), and label-major NumPy copies
(:meth:`~LabelMajorWeights.numpy_rows`, for
:class:`xmc_tf.callbacks.Rehash`).  Private to the LSH sampler.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.ops.lsh import lsh_sparse_cosine

CPU = "/CPU:0"
_EPS = 1e-30


def read(variable):
    """Dense read of a variable (aliases its buffer).

    Rows are then taken with ``tf.gather`` on the tensor, never on the
    variable: a ``ResourceGather`` puts a TensorFlow resource variable in
    copy-on-read mode, after which *every* dense read copies the whole
    buffer (measured: 0.4 s per read of a [10^6, 50] int32 variable).
    """
    return tf.convert_to_tensor(variable)


def label_weights(layout):
    """The strategy of a :class:`~xmc_tf.layers.scorer.LabelLayout`."""
    if layout.sparse:
        return SparseWeights(layout)
    if layout.feature_major:
        return FeatureMajorWeights(layout)
    return LabelMajorWeights(layout)


class LabelMajorWeights:
    """Dense label-major ``kernel [m, d]``: label ``j`` is ``kernel[j]``."""

    def __init__(self, layout):
        self.kernel = layout.kernel

    def vectors(self, rows=None):
        """Label vectors ``[r, d]`` of ``rows`` (all when None), as stored."""
        kernel = read(self.kernel)
        return kernel if rows is None else tf.gather(kernel, rows)

    def rows(self, ids):
        """Current label vectors ``[..., d]`` of the ids (any shape)."""
        return tf.gather(read(self.kernel), ids)

    def hash(self, family, params, rows=None):
        """Codes ``[r, L]`` of the label vectors (all when ``rows`` is None).

        The rows are gathered where the head lives (a GPU head sends only
        the ``r`` rows to the CPU); the hash ops run on the CPU.

        Args:
          family: the :class:`~xmc_tf.ops.lsh.LshHashFamily`.
          params: its parameters variable.
          rows: int32 ``[r]`` label ids, or None.
        """
        vectors = self.vectors(rows)
        with tf.device(CPU):
            return family.hash_dense(tf.cast(vectors, tf.float32), read(params))

    def embedding_dot(self, x, ids):
        """``<w_j, x_b>`` and ``|w_j|`` of every candidate: ``[b, k]`` each.

        Args:
          x: float32 ``[b, d]`` head inputs.
          ids: int ``[b, k]`` candidates.
        """
        w = tf.cast(self.rows(ids), tf.float32)  # [b, k, d]
        dot = tf.einsum("bkd,bd->bk", w, x)
        return dot, tf.norm(w, axis=-1)

    def label_cosines(self, ids, positives):
        """Cosines ``[b, k, n]`` of the candidates with the positives.

        Args:
          ids: int ``[b, k]`` candidates.
          positives: int ``[b, n]`` label ids, padding already replaced by
            a valid id (its cosines are masked by the caller).
        """
        w = tf.cast(self.rows(ids), tf.float32)  # [b, k, d]
        v = tf.cast(self.rows(positives), tf.float32)
        dot = tf.einsum("bkd,bnd->bkn", w, v)
        norms = (tf.norm(w, axis=-1)[:, :, None] *
                 tf.norm(v, axis=-1)[:, None, :])
        return dot / tf.maximum(norms, _EPS)

    def _numpy_kernel(self):
        return np.asarray(keras.ops.convert_to_numpy(self.kernel), np.float32)

    def numpy_rows(self) -> dict:
        """``{"weights": float32 [m, d]}`` label-major NumPy copy."""
        return {"weights": np.ascontiguousarray(self._numpy_kernel())}


class FeatureMajorWeights(LabelMajorWeights):
    """Dense feature-major ``kernel [d, m]``: label ``j`` is ``kernel[:, j]``."""

    def vectors(self, rows=None):
        kernel = read(self.kernel)
        return (tf.transpose(kernel) if rows is None
                else tf.transpose(tf.gather(kernel, rows, axis=1)))

    def rows(self, ids):
        rows = tf.gather(read(self.kernel), tf.reshape(ids, [-1]), axis=1)
        rows = tf.transpose(rows)
        return tf.reshape(rows, tf.concat([tf.shape(ids), [-1]], 0))

    def numpy_rows(self) -> dict:
        return {"weights": np.ascontiguousarray(self._numpy_kernel().T)}


class SparseWeights:
    """Uniform-sparse rows: label ``j`` has ``kernel[j, k]`` at input
    coordinate ``indices[j, k]`` (distinct within a row)."""

    def __init__(self, layout):
        self.kernel = layout.kernel
        self.indices = layout.indices
        self.input_dim = int(layout.input_dim)

    def hash(self, family, params, rows=None):
        """As :meth:`LabelMajorWeights.hash`, from the sparse rows."""
        indices, kernel = read(self.indices), read(self.kernel)
        if rows is not None:
            indices, kernel = tf.gather(indices, rows), tf.gather(kernel, rows)
        with tf.device(CPU):
            return family.hash_sparse(
                tf.cast(indices, tf.int32), tf.cast(kernel, tf.float32),
                read(params))

    def embedding_dot(self, x, ids):
        """As :meth:`LabelMajorWeights.embedding_dot`, without densifying."""
        idx = tf.gather(tf.cast(read(self.indices), tf.int32), ids)
        w = tf.cast(tf.gather(read(self.kernel), ids), tf.float32)
        xv = tf.gather(x, idx, batch_dims=1)  # [b, k, s]
        dot = tf.reduce_sum(xv * w, axis=-1)
        # UniformSparseDense rows have distinct indices.
        return dot, tf.norm(w, axis=-1)

    def label_cosines(self, ids, positives):
        """As :meth:`LabelMajorWeights.label_cosines` (the CPU op)."""
        indices = tf.cast(read(self.indices), tf.int32)
        kernel = tf.cast(read(self.kernel), tf.float32)
        rows = [tf.gather(indices, ids), tf.gather(kernel, ids),
                tf.gather(indices, positives), tf.gather(kernel, positives)]
        with tf.device(CPU):
            return lsh_sparse_cosine(*rows, self.input_dim)

    def numpy_rows(self) -> dict:
        """``{"weights": float32 [m, s], "indices": int32 [m, s]}`` copies."""
        kernel = np.asarray(keras.ops.convert_to_numpy(self.kernel), np.float32)
        return {"weights": kernel.copy(),
                "indices": np.asarray(keras.ops.convert_to_numpy(
                    self.indices), np.int32).copy()}
