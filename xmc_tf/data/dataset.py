"""The in-memory multi-label data set container shared by every reader.

:class:`XCDataset` holds instance features (CSR or dense) and the CSR label
matrix.  It lives in its own module so that the readers
(:mod:`xmc_tf.data.xc_format`, :mod:`xmc_tf.data.embeddings`), the
synthetic generator and the pipelines import it without importing each
other.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Union

import numpy as np
import scipy.sparse as sp

__all__ = ["PathLike", "XCDataset"]

PathLike = Union[str, os.PathLike]


@dataclasses.dataclass(repr=False)
class XCDataset:
    """A multi-label data set: instance features and their label sets.

    Attributes:
      features: ``[num_instances, num_features]`` float32 -- a
        ``scipy.sparse.csr_matrix`` for sparse (bag-of-words / tf-idf)
        features, or a dense ``np.ndarray`` for dense embeddings.
      labels: ``[num_instances, num_labels]`` float32
        ``scipy.sparse.csr_matrix`` with 1.0 for every relevant label and
        sorted column indices (row ``i`` lists the label ids of instance
        ``i``).

    Raises:
      ValueError: from the constructor, when ``features`` or ``labels`` is
        not 2-D or their numbers of rows differ.

    Example:
        >>> import numpy as np, scipy.sparse as sp
        >>> ds = XCDataset(np.zeros((3, 4), np.float32),
        ...                sp.csr_matrix((3, 10), dtype=np.float32))
        >>> ds.num_instances, ds.num_features, ds.num_labels
        (3, 4, 10)
    """

    features: Union[sp.csr_matrix, np.ndarray]
    labels: sp.csr_matrix

    def __post_init__(self):
        if sp.issparse(self.features) and not isinstance(
                self.features, sp.csr_matrix):
            self.features = sp.csr_matrix(self.features)
        if sp.issparse(self.labels):
            if not isinstance(self.labels, sp.csr_matrix):
                self.labels = sp.csr_matrix(self.labels)
        else:
            raise ValueError(
                "XCDataset.labels must be a scipy.sparse matrix, got "
                f"{type(self.labels).__name__}")
        if len(self.features.shape) != 2 or len(self.labels.shape) != 2:
            raise ValueError("XCDataset.features and .labels must be 2-D")
        if self.features.shape[0] != self.labels.shape[0]:
            raise ValueError(
                f"XCDataset: features have {self.features.shape[0]} rows but "
                f"labels have {self.labels.shape[0]}")

    @property
    def num_instances(self) -> int:
        """Number of instances (rows), ``N``."""
        return int(self.features.shape[0])

    @property
    def num_features(self) -> int:
        """Feature dimension ``D`` (vocabulary size or embedding size)."""
        return int(self.features.shape[1])

    @property
    def num_labels(self) -> int:
        """Number of labels ``L`` (size of the label space)."""
        return int(self.labels.shape[1])

    def label_counts(self) -> np.ndarray:
        """Instances carrying each label (non-zero entries of each label
        column), int64 ``[num_labels]``: label frequencies for priors,
        sampling corrections and propensities.

        Example:
            >>> import numpy as np, scipy.sparse as sp
            >>> y = sp.csr_matrix(np.array([[1, 0, 1], [1, 0, 0]], np.float32))
            >>> XCDataset(np.zeros((2, 1), np.float32), y).label_counts().tolist()
            [2, 0, 1]
        """
        return np.asarray((self.labels != 0).sum(axis=0)).ravel().astype(
            np.int64)

    @property
    def is_sparse(self) -> bool:
        """True when ``features`` is a CSR matrix (False for embeddings)."""
        return sp.issparse(self.features)

    def __repr__(self) -> str:
        kind = "sparse" if self.is_sparse else "dense"
        nnz = (f", feature_nnz={self.features.nnz}" if self.is_sparse else "")
        return (f"XCDataset(num_instances={self.num_instances}, "
                f"num_features={self.num_features} ({kind}), "
                f"num_labels={self.num_labels}{nnz}, "
                f"label_nnz={self.labels.nnz})")
