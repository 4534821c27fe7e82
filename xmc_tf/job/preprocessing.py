"""Feature normalisation of a run: fitted on the fit split, kept in the model.

``xmc-tf train`` splits the training file into the part ``fit`` trains on
and the validation part, *then* fits the normalisation (the ``"auto"``
choice between tf-idf and l2, and the idf weights) on the fit part only, so
no validation row leaks into it.  The network trains on features
normalised once in NumPy (:func:`normalize`); the exported model
(:func:`with_normalization`) starts with a
:class:`~xmc_tf.layers.FeatureNormalization` layer holding the same idf,
so ``model.keras`` and the SavedModel take the raw feature values of the
data files.  ``preprocessing.npz`` in the work directory records the
choice (``in_model=True``); work directories written before keep their
normalisation outside the model, and :func:`load_for_model` applies it for
them.

Source: the smoothed idf of scikit-learn's ``TfidfTransformer``, as in
:func:`xmc_tf.data.normalize_features`.
"""

from __future__ import annotations

import dataclasses
import os

import keras
import numpy as np

from xmc_tf import data as xdata
from xmc_tf.errors import DataError
from xmc_tf.layers.normalization import FeatureNormalization
from xmc_tf.job.workdir import Workdir
from xmc_tf.files import atomic_path

__all__ = ["Normalization", "fit_normalization", "normalize",
           "with_normalization", "load_spec",
           "load_for_model", "save", "NORMALIZATION_LAYER",
           "behind_normalization"]

#: Name of the normalisation layer of an exported model.
NORMALIZATION_LAYER = "feature_normalization"


@dataclasses.dataclass(frozen=True)
class Normalization:
    """A fitted normalisation.

    Attributes:
      method: ``"tfidf"``, ``"l2"`` or ``"none"`` (``"auto"`` resolved).
      idf: float32 ``[D]`` idf weights (``"tfidf"``), else None.
      num_features: D.
      sparse: whether it applies to sparse features (dense features --
        embeddings -- are not normalised).
    """
    method: str
    idf: np.ndarray | None
    num_features: int
    sparse: bool = True


def fit_normalization(method: str, fit_data: xdata.XCDataset) -> Normalization:
    """Resolves ``method`` (``"auto"``:
    :func:`xmc_tf.data.resolve_normalization`) and fits the idf on ``fit_data``'s features.

    Args:
      method: ``config.data.normalize``.
      fit_data: the instances ``fit`` trains on (raw feature values).

    Returns:
      A :class:`Normalization`; for dense features ``method`` unresolved
      and no idf (they are used as they are).

    Raises:
      ValueError: an unknown ``method``.
    """
    if not fit_data.is_sparse:
        return Normalization(method, None, fit_data.num_features, sparse=False)
    method = xdata.resolve_normalization(method, fit_data.features)
    idf = xdata.fit_idf(fit_data.features) if method == "tfidf" else None
    return Normalization(method, idf, fit_data.num_features)


def normalize(dataset: xdata.XCDataset, norm: Normalization) -> xdata.XCDataset:
    """``dataset`` with normalised features (a new data set; labels shared).

    Raises:
      DataError: the data set's width differs from the fitted one.
    """
    if dataset.num_features != norm.num_features:
        raise DataError(f"the data set has {dataset.num_features} features; "
                        f"the model was trained on {norm.num_features}")
    if not (dataset.is_sparse and norm.sparse):
        return dataset
    features, _ = xdata.normalize_features(
        dataset.features, norm.method,
        norm.idf if norm.method == "tfidf" else None)
    return xdata.XCDataset(features=features, labels=dataset.labels)


def with_normalization(model: keras.Model, norm: Normalization) -> keras.Model:
    """The model that takes raw features: ``FeatureNormalization`` then
    ``model`` (nested, weights shared).  Dense-feature models are returned
    as they are.

    Args:
      model: a model on normalised features (one input).
      norm: the fitted :class:`Normalization`.

    Returns:
      ``keras.Model`` with ``model``'s input spec and output; its layer
      ``"feature_normalization"`` holds the idf.
    """
    if not norm.sparse:
        return model
    return behind_normalization(model, norm, model, f"{model.name}_raw_input")


def behind_normalization(like: keras.Model, norm: Normalization, scorer,
                         name: str) -> keras.Model:
    """``keras.Model(x, scorer(normalization(x)))`` on raw features of
    ``like``'s input spec, its layer ``"feature_normalization"`` holding
    the idf (no normalisation for dense features): the exported model's
    front, before a nested model (:func:`with_normalization`) or a layer
    of its own (the fused scores of :func:`xmc_tf.job.finalize.finalize`,
    which :mod:`xmc_tf.decoding` reaches through the normalisation)."""
    spec = like.inputs[0]
    x = keras.Input(shape=tuple(spec.shape[1:]), sparse=bool(spec.sparse),
                    dtype=spec.dtype, name="raw_features")
    h = (FeatureNormalization(norm.num_features, norm.method, idf=norm.idf,
                              name=NORMALIZATION_LAYER)(x)
         if norm.sparse else x)
    return keras.Model(x, scorer(h), name=name)


def save(norm: Normalization, workdir: str) -> None:
    """Writes ``WORKDIR/preprocessing.npz`` (``method``, ``idf``,
    ``in_model``) atomically."""
    with atomic_path(Workdir(workdir).file(Workdir.PREPROCESSING)) as tmp:
        with open(tmp, "wb") as f:
            np.savez(f, method=norm.method, in_model=norm.sparse,
                     idf=norm.idf if norm.idf is not None
                     else np.zeros(0, np.float32))


def load_spec(spec: str, what: str) -> xdata.XCDataset:
    """``xmc_tf.data.load_dataset(spec)`` with user errors as one-line
    :class:`~xmc_tf.errors.DataError` (file and line named).

    Args:
      spec: a data set spec (XC file, ``X.txt|Y.txt``, ``bibtex:test``...).
      what: the flag or field it came from, for the message.
    """
    try:
        return xdata.load_dataset(spec)
    except OSError as e:
        raise DataError(f"{what}: {e.filename or spec}: "
                        f"{e.strerror or e}") from e
    except ValueError as e:
        msg = " ".join(str(e).split())
        raise DataError(msg if msg.startswith(str(spec)) else
                        f"{what}={spec!r}: {msg}") from e


def load_for_model(spec: str, workdir: str) -> xdata.XCDataset:
    """Data set ``spec`` as the work directory's model takes it: raw
    feature values when the model normalises them itself (runs written
    since the normalisation moved into the model), else normalised with
    the method and idf saved in ``preprocessing.npz`` (older runs).

    Raises:
      DataError: an unreadable or malformed data set (file and line
        named), or one whose width differs from the training set's.
      OSError: the workdir has no ``preprocessing.npz``.
    """
    dataset = load_spec(spec, "--data")
    saved = np.load(os.path.join(workdir, Workdir.PREPROCESSING))
    method = str(saved["method"])
    idf = saved["idf"] if method == "tfidf" else None
    if idf is not None and idf.shape[0] != dataset.num_features:
        raise DataError(f"--data={spec!r} has {dataset.num_features} "
                        f"features; the model was trained on {idf.shape[0]}")
    if ("in_model" in saved.files and bool(saved["in_model"])) or (
            not dataset.is_sparse):
        return dataset
    features, _ = xdata.normalize_features(dataset.features, method, idf)
    return xdata.XCDataset(features=features, labels=dataset.labels)
