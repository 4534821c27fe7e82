"""Feature normalisation as the first layer of a model (tf-idf, l2).

XC-repo feature files hold raw counts / binary values or tf-idf weights;
:func:`xmc_tf.data.normalize_features` weights the columns by their idf
(fitted on the training instances) and scales each row to unit l2 norm.
:class:`FeatureNormalization` does the same inside the graph, with the idf
vector a non-trainable weight, so an exported model (``model.keras``, the
SavedModel) takes the raw feature values of the data files and needs no
side file.

Source: the smoothed idf of scikit-learn's ``TfidfTransformer``
(``idf_j = ln((1 + N) / (1 + df_j)) + 1``), as in
:func:`xmc_tf.data.normalize_features`.
"""

from __future__ import annotations

import keras
import numpy as np
import tensorflow as tf

__all__ = ["FeatureNormalization", "METHODS"]

#: Normalisations: column idf weights then row l2, row l2 only, nothing.
METHODS = ("tfidf", "l2", "none")


@keras.saving.register_keras_serializable(package="xmc_tf")
class FeatureNormalization(keras.layers.Layer):
    """Row normalisation of feature vectors: ``x * idf``, then ``x / |x|_2``.

    Input: float32 ``tf.SparseTensor`` or dense tensor ``[batch, D]``;
    output: the same kind and shape, float32.  ``"tfidf"`` multiplies
    column ``j`` by ``idf[j]`` then scales each row to unit l2 norm;
    ``"l2"`` only scales rows; ``"none"`` passes the input through.  Rows
    of zeros stay zero.  A sparse row's norm is taken over its stored
    values, as :func:`xmc_tf.data.normalize_features` does, so both give
    the same numbers (up to float32 rounding).

    Args:
      num_features: D.
      method: one of :data:`METHODS`.
      idf: optional float ``[D]`` idf weights (``"tfidf"``); else ones
        until :meth:`set_idf`.  Kept as a non-trainable float32 weight
        ``idf`` (saved with the model).
      **kwargs: ``keras.layers.Layer`` arguments (``name``, ...).

    Raises:
      ValueError: an unknown ``method``, ``num_features < 1``, or an
        ``idf`` of another length.

    Example:
        >>> import numpy as np
        >>> layer = FeatureNormalization(2, "tfidf",
        ...                              idf=np.array([3., 1.], np.float32))
        >>> out = layer(np.array([[1., 4.], [0., 0.]], np.float32)).numpy()
        >>> out.astype(float).round(6).tolist()
        [[0.6, 0.8], [0.0, 0.0]]
    """

    def __init__(self, num_features: int, method: str = "l2", idf=None,
                 **kwargs):
        super().__init__(**kwargs)
        if method not in METHODS:
            raise ValueError(f"FeatureNormalization: method={method!r}; "
                             f"expected one of {METHODS}")
        if int(num_features) < 1:
            raise ValueError(f"FeatureNormalization: num_features="
                             f"{num_features} must be >= 1")
        self.num_features = int(num_features)
        self.method = method
        self.supports_masking = False
        self._initial_idf = None if idf is None else self._check_idf(idf)
        self.idf = None

    def _check_idf(self, idf) -> np.ndarray:
        idf = np.asarray(idf, np.float32).reshape(-1)
        if idf.shape[0] != self.num_features:
            raise ValueError(f"FeatureNormalization: idf has {idf.shape[0]} "
                             f"entries, num_features={self.num_features}")
        return idf

    def build(self, input_shape=None):
        self.idf = self.add_weight(name="idf", shape=(self.num_features,),
                                   initializer="ones", trainable=False)
        if self._initial_idf is not None:
            self.idf.assign(self._initial_idf)
        self.built = True

    def set_idf(self, idf) -> None:
        """Assigns the idf weights (float ``[D]``; builds the layer).

        Raises:
          ValueError: an ``idf`` of another length.
        """
        idf = self._check_idf(idf)
        if not self.built:
            self.build()
        self.idf.assign(idf)

    def call(self, inputs):
        # Computed in float32 (float64 norms), returned in the compute
        # dtype (float16 under mixed_float16: raw counts times the idf
        # could overflow it before the division).
        dtype = self.compute_dtype
        if isinstance(inputs, tf.SparseTensor):
            values = tf.cast(inputs.values, tf.float32)
            if self.method == "tfidf":
                values = values * tf.cast(
                    tf.gather(self.idf, inputs.indices[:, 1]), tf.float32)
            if self.method != "none":
                rows = inputs.indices[:, 0]
                sq = tf.math.unsorted_segment_sum(
                    tf.square(tf.cast(values, tf.float64)), rows,
                    tf.cast(inputs.dense_shape[0], tf.int64))
                norms = tf.sqrt(sq)
                norms = tf.where(norms > 0, norms, tf.ones_like(norms))
                values = values / tf.cast(tf.gather(norms, rows), tf.float32)
            return tf.SparseTensor(inputs.indices, tf.cast(values, dtype),
                                   inputs.dense_shape)
        x = tf.cast(tf.convert_to_tensor(inputs), tf.float32)
        if self.method == "none":
            return tf.cast(x, dtype)
        if self.method == "tfidf":
            x = x * tf.cast(self.idf, tf.float32)
        norms = tf.norm(tf.cast(x, tf.float64), axis=-1, keepdims=True)
        norms = tf.where(norms > 0, norms, tf.ones_like(norms))
        return tf.cast(x / tf.cast(norms, tf.float32), dtype)

    def compute_output_shape(self, input_shape):
        return input_shape

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(inputs.shape, dtype=self.compute_dtype,
                                 sparse=getattr(inputs, "sparse", False))

    def get_config(self):
        config = super().get_config()
        config.update(num_features=self.num_features, method=self.method)
        return config
