"""The job's data: user arrays checked into data sets, files read, the
validation split, and the feature normalisation fitted on the fit part.

:func:`as_dataset` is where every bad input of
:class:`xmc_tf.ExtremeClassifier` becomes one ``ValueError`` before anything
is trained; :func:`read_datasets` is what ``xmc-tf train`` reads from
``config.data``.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import scipy.sparse as sp
from absl import logging

from xmc_tf import data as xdata
from xmc_tf import metrics as xmetrics
from xmc_tf.job import preprocessing as xprep
from xmc_tf.job.plan import validation_rows
from xmc_tf.errors import ConfigError, DataError
from xmc_tf.job.workdir import Workdir
from xmc_tf.files import atomic_path

__all__ = ["JobData", "as_dataset", "read_datasets", "check_compatible", "subset",
           "validation_split", "prepare_splits",
           "save_inv_propensities"]


@dataclasses.dataclass
class JobData:
    """The data of a run, raw feature values (the job fits the
    normalisation).

    Attributes:
      train: :class:`xmc_tf.data.XCDataset` to train on.
      test: data set evaluated into ``metrics.json``, or None.
      validation: data set for the schedule, early stopping and the label
        tree's weight; None takes ``config.data.validation_fraction`` of
        ``train`` (:func:`xmc_tf.job.inputs.validation_split`).
    """

    train: xdata.XCDataset
    test: xdata.XCDataset | None = None
    validation: xdata.XCDataset | None = None

    def check(self) -> None:
        """Raises ValueError when test or validation differ from train in
        their numbers of features or labels."""
        check_compatible(self.train, self.test, "the training data",
                                 "the test data")
        check_compatible(self.train, self.validation,
                                 "the training data", "the validation data")


def _features(X, what: str):
    """``X`` as float32 CSR or a dense float32 ``[n, d]`` array."""
    if sp.issparse(X):
        if X.ndim != 2:
            raise ValueError(f"{what}: X must be 2-D, got shape {X.shape}")
        features = sp.csr_matrix(X, dtype=np.float32)
    else:
        try:
            features = np.asarray(X, dtype=np.float32)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{what}: X must be a scipy sparse matrix or a "
                             f"2-D numeric array ({e})") from None
        if features.ndim != 2:
            raise ValueError(f"{what}: X must be 2-D [instances, features], "
                             f"got shape {features.shape}")
    if 0 in features.shape:
        raise ValueError(f"{what}: X is empty (shape {features.shape})")
    bad = xdata.count_non_finite(features)
    if bad:
        raise ValueError(f"{what}: X holds {bad} NaN or infinite values")
    return features


def as_dataset(X, Y, num_labels: int | None = None,
               what: str = "fit") -> xdata.XCDataset:
    """Checks a user's features and labels and makes the data set.

    Args:
      X: ``[n, d]`` raw feature values: a scipy sparse matrix (bag of words,
        tf-idf) or a dense array (embeddings); converted to float32.
      Y: the labels in any form of :func:`xmc_tf.data.label_matrix`: a
        ``[n, m]`` CSR / dense 0-1 matrix, or ``n`` lists of label ids.
      num_labels: m when known (a trained model's); None reads it from
        ``Y`` (a matrix's width, else the largest id + 1).
      what: the call, for messages (``"fit"``, ``"evaluate"``).

    Returns:
      :class:`xmc_tf.data.XCDataset` with float32 CSR labels.

    Raises:
      ValueError: one line naming the problem: ``X`` not 2-D or empty,
        NaN / infinite values, unreadable labels, a label id out of
        ``[0, num_labels)``, a label matrix of another width, no labels,
        or row counts that differ.
    """
    features = _features(X, what)
    try:
        labels = xdata.label_matrix(Y, num_labels)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{what}: Y: {' '.join(str(e).split())}") from None
    if labels.shape[0] != features.shape[0]:
        raise ValueError(f"{what}: X has {features.shape[0]} rows but Y has "
                         f"{labels.shape[0]}")
    if labels.shape[1] == 0:
        raise ValueError(f"{what}: Y has no labels (0 columns)")
    return xdata.XCDataset(features=features, labels=labels)


def read_datasets(config):
    """Reads ``config.data.train`` and ``config.data.test`` (raw feature
    values; specs of :func:`xmc_tf.data.load_dataset`).

    Returns:
      ``(train, test_or_None)``.

    Raises:
      ConfigError: ``config.data.train`` is empty.
      DataError: unreadable or malformed files (file and line named), or
        train and test of different widths.
    """
    dc = config.data
    if not dc.train:
        raise ConfigError("config.data.train is empty; set "
                          "--config.data.train=FILE")
    train = xprep.load_spec(dc.train, "config.data.train")
    test = xprep.load_spec(dc.test, "config.data.test") if dc.test else None
    try:
        check_compatible(train, test, "config.data.train", "config.data.test")
    except ValueError as e:
        raise DataError(f"config.data.train={dc.train!r} and "
                        f"config.data.test={dc.test!r}: {e}") from None
    return train, test


def check_compatible(train: xdata.XCDataset, other, train_name: str,
                     other_name: str) -> None:
    """Raises ValueError unless ``other`` (a data set or None) has
    ``train``'s numbers of features and labels (both named)."""
    if other is None:
        return
    if (other.num_labels, other.num_features) != (train.num_labels,
                                                  train.num_features):
        raise ValueError(
            f"{train_name} has {train.num_features} features and "
            f"{train.num_labels} labels, {other_name} {other.num_features} "
            f"and {other.num_labels}")


def save_inv_propensities(config, train: xdata.XCDataset,
                          workdir: str) -> np.ndarray:
    """Computes the PSP weights from all training labels (as the XC repo
    does: :func:`xmc_tf.metrics.inverse_propensities` with
    ``config.eval.propensity_a`` / ``_b``) and saves them
    (``WORKDIR/inv_propensities.npy``).

    Returns:
      float32 ``[m]`` inverse propensities.
    """
    inv_prop = xmetrics.inverse_propensities(
        train.labels, A=config.eval.propensity_a, B=config.eval.propensity_b)
    with atomic_path(Workdir(workdir).file(Workdir.INV_PROPENSITIES)) as tmp:
        with open(tmp, "wb") as f:
            np.save(f, inv_prop)
    return inv_prop


def subset(dataset: xdata.XCDataset, rows: np.ndarray) -> xdata.XCDataset:
    """The instances `rows` of `dataset` (a new XCDataset)."""
    return xdata.XCDataset(features=dataset.features[rows],
                           labels=dataset.labels[rows])


def validation_split(train: xdata.XCDataset, config):
    """Splits the training set into the part ``fit`` trains on and the
    validation part (``config.data.validation_fraction`` of the instances,
    drawn with ``config.data.split_seed``, default ``config.seed``).

    Returns:
      ``(fit_data, val_data_or_None)``, rows in file order.
    """
    seed = config.data.split_seed
    rng = np.random.default_rng(config.seed if seed is None else seed)
    order = rng.permutation(train.num_instances)
    num_val = validation_rows(config, train.num_instances)
    if not num_val:
        return train, None
    return (subset(train, np.sort(order[num_val:])),
            subset(train, np.sort(order[:num_val])))


def prepare_splits(config, train: xdata.XCDataset, workdir: str,
                   validation: xdata.XCDataset | None = None):
    """Splits the raw training set (:func:`validation_split`; a given
    ``validation`` set is used instead, and all of ``train`` fits), fits the
    feature normalisation on the fit part only (``"auto"`` resolved there:
    :func:`xmc_tf.data.resolve_normalization`; idf from the fit rows),
    saves it (``preprocessing.npz``) and normalises both parts.

    Returns:
      ``(fit_data, val_data_or_None, normalization)``: normalised data
      sets and the :class:`xmc_tf.job.preprocessing.Normalization`.

    Raises:
      ConfigError: an unknown ``config.data.normalize``.
    """
    if validation is None:
        fit_raw, val_raw = validation_split(train, config)
    else:
        fit_raw, val_raw = train, validation
    try:
        norm = xprep.fit_normalization(config.data.normalize, fit_raw)
    except ValueError as e:
        raise ConfigError(f"config.data.normalize: {e}") from e
    if norm.sparse and config.data.normalize == "auto":
        logging.info("config.data.normalize='auto': %s (the training "
                     "features are %s)", norm.method,
                     "whole numbers" if norm.method == "tfidf" else "weights")
    xprep.save(norm, workdir)
    fit_data = xprep.normalize(fit_raw, norm)
    val_data = xprep.normalize(val_raw, norm) if val_raw is not None else None
    return fit_data, val_data, norm
