"""Data sets and input pipelines for extreme multi-label classification.

* :mod:`xmc_tf.data.dataset` -- the :class:`XCDataset` container.
* :mod:`xmc_tf.data.xc_format` -- the Extreme Classification Repository
  (XC repo) sparse text formats: their grammar; the readers
  (:mod:`~xmc_tf.data.xc_reader`: :func:`read_xc`, :func:`read_xc_xy`,
  :func:`read_xc_labels`) and writers (:mod:`~xmc_tf.data.xc_writer`:
  :func:`write_xc`, :func:`write_xc_labels`).
* :mod:`xmc_tf.data.specs` -- the bundled Bibtex data
  (:func:`load_bundled`) and :func:`load_dataset` (string specs for the CLI).
* :mod:`xmc_tf.data.embeddings` -- dense ``.npy``/``.npz`` embeddings plus
  an XC labels file (:func:`read_embeddings`).
* :mod:`xmc_tf.data.labels` -- label matrices as padded label ids
  (:func:`padded_label_ids`) and back (:func:`label_matrix`).
* :mod:`xmc_tf.data.synthetic` -- power-law synthetic data with a planted,
  linearly learnable signal (:func:`make_synthetic`).
* :mod:`xmc_tf.data.pipeline` -- :func:`normalize_features` (l2 / tf-idf),
  :func:`resolve_normalization` (``"auto"``: tf-idf for counts, else l2)
  and :func:`make_tf_dataset` (``tf.data`` batches of sparse features and
  ``-1``-padded int32 label ids).

Example:
    >>> from xmc_tf import data
    >>> train = data.load_dataset("bibtex:train")
    >>> train.features, idf = data.normalize_features(train.features, "tfidf")
    >>> ds = data.make_tf_dataset(train, 256, shuffle=True, seed=0)
"""

from xmc_tf.data.embeddings import load_embedding_array, read_embeddings
from xmc_tf.data.labels import is_multi_class, label_matrix, padded_label_ids
from xmc_tf.data.pipeline import (count_non_finite, distribute_tf_dataset,
                                  fit_idf, make_tf_dataset,
                                  normalize_features, resolve_normalization)
from xmc_tf.data.synthetic import make_synthetic
from xmc_tf.data.dataset import XCDataset
from xmc_tf.data.specs import BUNDLED_DATASETS, load_bundled, load_dataset
from xmc_tf.data.xc_reader import read_xc, read_xc_labels, read_xc_xy
from xmc_tf.data.xc_writer import write_xc, write_xc_labels

__all__ = [
    "BUNDLED_DATASETS",
    "XCDataset",
    "count_non_finite",
    "distribute_tf_dataset",
    "fit_idf",
    "is_multi_class",
    "label_matrix",
    "load_bundled",
    "load_dataset",
    "load_embedding_array",
    "make_synthetic",
    "make_tf_dataset",
    "normalize_features",
    "padded_label_ids",
    "read_embeddings",
    "read_xc",
    "read_xc_labels",
    "read_xc_xy",
    "resolve_normalization",
    "write_xc",
    "write_xc_labels",
]
