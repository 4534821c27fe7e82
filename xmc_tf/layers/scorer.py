"""The ``LabelScorer`` protocol: a head layer that scores chosen labels.

Candidate-based training (the sampled and SCENT heads,
:mod:`xmc_tf.job.heads.candidates`) and the negative samplers that follow the
head's weights (ANN index, LSH tables: :mod:`xmc_tf.samplers`) need more
of the head layer than its full ``[batch, num_labels]`` output: the scores
of a few labels per row, and the labels' weight vectors.  A layer that
provides them implements :class:`LabelScorer`;
:class:`~xmc_tf.layers.LabelDense` and
:class:`~xmc_tf.layers.UniformSparseDense` do.  The samplers read a
layer's weights through ``LabelScorer.label_layout()`` (which of the two
storage layouts it uses is the layer's to say, not the sampler's to guess).

Source: ASTRA (Mehta et al.), Sec. 3.1 ("build ANNS-indices on classifier
weights") and Algorithm 1 (score only positives and candidates).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import keras
import numpy as np

__all__ = ["LabelLayout", "LabelScorer", "check_label_scorer", "label_layout",
           "scatter_label_rows"]

#: The members a :class:`LabelScorer` must have (for error messages).
SCORER_MEMBERS = ("num_labels", "label_layout", "label_vectors",
                  "score_candidates", "score_shared")


@dataclasses.dataclass(frozen=True)
class LabelLayout:
    """How a head layer stores its labels' weights (no copy is made).

    Attributes:
      kernel: the kernel variable: label-major ``[m, s]`` values of the
        sparse connections (``indices`` given), label-major ``[m, d]`` rows
        (``feature_major`` False) or feature-major ``[d, m]`` columns
        (``keras.layers.Dense``).
      bias: the ``[m]`` bias variable, or None.
      input_dim: e, width of the layer's input (for sparse connections the
        number of features the indices point into).
      indices: int ``[m, s]`` variable of sparse connections (label ``l``
        has ``kernel[l, k]`` at input coordinate ``indices[l, k]``), or
        None for a dense kernel.
      feature_major: the dense kernel is ``[d, m]``.
    """

    kernel: Any
    bias: Any
    input_dim: int
    indices: Any = None
    feature_major: bool = False

    @property
    def num_labels(self) -> int:
        """m, read from the kernel's shape."""
        return int(self.kernel.shape[1 if self.feature_major else 0])

    @property
    def sparse(self) -> bool:
        """Whether the labels are sparse connections (``indices``)."""
        return self.indices is not None


@runtime_checkable
class LabelScorer(Protocol):
    """A head layer that scores chosen labels and exposes their weights.

    Members:
      num_labels: int m (the layer's ``units``).
      label_layout(): :class:`LabelLayout` of the built layer's weights.
      label_vectors(include_bias=False): NumPy float32 ``[m, e]`` (``+ 1``
        bias column) exact dense label vectors, ``<[x, 1], v_l>`` = the
        logit of label ``l``.
      score_candidates(inputs, candidates): ``[b, e]`` x int ``[b, k]`` ->
        ``[b, k]`` logits of per-row candidates.
      score_shared(inputs, ids): ``[b, e]`` x int ``[C]`` -> ``[b, C]``
        logits of one candidate set scored by every row.
    """

    @property
    def num_labels(self) -> int: ...

    def label_layout(self) -> LabelLayout: ...

    def label_vectors(self, include_bias: bool = False) -> np.ndarray: ...

    def score_candidates(self, inputs, candidates): ...

    def score_shared(self, inputs, ids): ...


def check_label_scorer(layer, needed_by: str = "candidate training"):
    """Returns ``layer`` if it is a :class:`LabelScorer`.

    Args:
      layer: a head layer.
      needed_by: what needs it (for the message).

    Returns:
      ``layer``.

    Raises:
      ValueError: ``layer`` lacks members of the protocol (they are named).

    >>> import keras
    >>> check_label_scorer(keras.layers.Dense(3))
    Traceback (most recent call last):
    ...
    ValueError: Dense cannot score candidates: candidate training needs a LabelScorer (LabelDense, UniformSparseDense); it lacks num_labels, label_layout, label_vectors, score_candidates, score_shared
    """
    if isinstance(layer, LabelScorer):
        return layer
    missing = [name for name in SCORER_MEMBERS if not hasattr(layer, name)]
    raise ValueError(
        f"{type(layer).__name__} cannot score candidates: {needed_by} needs "
        "a LabelScorer (LabelDense, UniformSparseDense); it lacks "
        f"{', '.join(missing)}")


def label_layout(layer) -> LabelLayout:
    """The :class:`LabelLayout` of a built head layer.

    A :class:`LabelScorer` gives its own.  Any other layer is read as a
    plain dense layer through its 2-d ``kernel``: feature-major ``[d, m]``
    for a ``keras.layers.Dense``, label-major ``[m, d]`` otherwise (e.g. a
    stand-in for :class:`~xmc_tf.layers.LabelDense`); its ``bias`` if any.

    Raises:
      ValueError: the layer is not built or has no 2-d ``kernel``.
    """
    if isinstance(layer, LabelScorer):
        return layer.label_layout()
    kernel = getattr(layer, "kernel", None)
    if kernel is None or len(kernel.shape) != 2:
        raise ValueError(f"{type(layer).__name__} is not a built head layer "
                         "with a 2-d kernel")
    feature_major = isinstance(layer, keras.layers.Dense)
    return LabelLayout(kernel=kernel, bias=getattr(layer, "bias", None),
                       input_dim=int(kernel.shape[0 if feature_major else 1]),
                       feature_major=feature_major)


def scatter_label_rows(indices, values, width: int, out=None) -> np.ndarray:
    """Dense ``[m, width]`` rows of sparse connections.

    Row ``l`` holds ``values[l, k]`` at column ``indices[l, k]``; repeated
    columns in a row add up (as the uniform-sparse op sums them).

    Args:
      indices: int ``[m, s]`` columns in ``[0, width)``.
      values: float ``[m, s]``.
      width: number of columns (>= every index + 1).
      out: optional float32 ``[m, >= width]`` zero array to write into (its
        first ``width`` columns); a new one otherwise.

    Returns:
      float32 ``[m, width]`` (``out`` when given).

    >>> scatter_label_rows(np.array([[0, 2], [1, 1]]),
    ...                    np.array([[1., 2.], [3., 4.]]), 3).tolist()
    [[1.0, 0.0, 2.0], [0.0, 7.0, 0.0]]
    """
    indices = np.asarray(indices).astype(np.int64, copy=False)
    values = np.asarray(values, np.float32)
    if out is None:
        out = np.zeros((indices.shape[0], int(width)), np.float32)
    rows = np.broadcast_to(np.arange(indices.shape[0])[:, None], indices.shape)
    ordered = np.sort(indices, axis=1)
    if np.any(ordered[:, 1:] == ordered[:, :-1]):
        # Repeated sources (never drawn by the layer itself) add up;
        # np.add.at is exact but ~10x slower.
        np.add.at(out, (rows, indices), values)
    else:
        out[rows, indices] = values
    return out
