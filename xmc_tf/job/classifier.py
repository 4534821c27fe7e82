"""``ExtremeClassifier``: the main job as one Python object, for scipy
matrices (fit / predict / evaluate / save / load / export).

The object runs :func:`xmc_tf.job.run.train_and_evaluate` -- the same job
as ``xmc-tf train``, which reads its files and calls this object -- so
the defaults that win on real data (feature normalisation, the prior
bias, the wide path, the label tree, the learning-rate schedule and early
stopping on a validation split) come with ``fit``.  Every run has a work
directory (a temporary one unless ``workdir`` is given) and keeps its
promises: one run at a time, exact resume after a kill, outputs renamed
into place when complete.

Example:
    >>> import numpy as np, scipy.sparse as sp
    >>> from xmc_tf import ExtremeClassifier
    >>> X = sp.random(200, 50, density=0.2, format="csr", random_state=0)
    >>> Y = [[i % 7] for i in range(200)]
    >>> clf = ExtremeClassifier("linear", {"train.epochs": 1,
    ...                                    "train.verbose": 0}).fit(X, Y)
    >>> ids, scores = clf.predict(X[:3], k=2)
    >>> ids.shape, ids.dtype, bool((np.diff(scores, axis=1) <= 0).all())
    ((3, 2), dtype('int32'), True)
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import tempfile
import weakref

import ml_collections
import numpy as np
import scipy.sparse as sp

from xmc_tf.job import artifacts
from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf import saving as xsaving
from xmc_tf.job import inputs as xinputs
from xmc_tf.job.run import JobData, train_and_evaluate
from xmc_tf.job.scoring import evaluate_model, predict_top_k
from xmc_tf.job.workdir import Workdir
from xmc_tf.files import atomic_path, replace_dir

__all__ = ["ExtremeClassifier", "load_config"]


def load_config(config="uniform_sparse",
                overrides=None) -> ml_collections.ConfigDict:
    """A job config with overrides applied.

    Args:
      config: a packaged config's name (``"uniform_sparse"``, ``"mach"``,
        ``"scent"``, ...: :func:`xmc_tf.config.names`), a config file
        (``configs/mach.py``, defining ``get_config()``), or a
        ``ConfigDict`` (copied).
      overrides: ``{"train.epochs": 5, ...}`` (dotted field names, as the
        command line's ``--config.FIELD=VALUE``) or a nested dict; None for
        none.  ``"auto"`` leaves a field to the data
        (:func:`xmc_tf.job.plan.resolve_config`).

    Returns:
      A new, locked ``ml_collections.ConfigDict``.

    Raises:
      ValueError: an unknown config name or file, an unknown field, or a
        value of the wrong type (the field named).
    """
    if isinstance(config, ml_collections.ConfigDict):
        cfg = copy.deepcopy(config)
    elif isinstance(config, str):
        cfg = xconfig.config_from_file(xconfig.config_file(config))
    else:
        raise ValueError(f"config={config!r}: expected a config name, a "
                         "config file or an ml_collections.ConfigDict")
    cfg.lock()
    for field, value in xconfig.flat_fields(overrides or {}):
        _set_field(cfg, field, value)
    return cfg


def _set_field(cfg, field: str, value) -> None:
    if isinstance(value, str) and value.strip().lower() == "auto" and \
            field in xconfig.REGIME_FIELDS:
        # A typed field left to the data: a None placeholder in the schema.
        xconfig.by_regime(cfg, (field,))
        return
    *parents, name = field.split(".")
    node = cfg
    try:
        for part in parents:
            node = node[part]
        if name not in node:
            raise KeyError(name)
        node[name] = value
    except (KeyError, AttributeError):
        raise ValueError(f"config.{field}: no such field") from None
    except TypeError as e:
        raise ValueError(f"config.{field}={value!r}: "
                         f"{' '.join(str(e).split())}") from None


class ExtremeClassifier:
    """An extreme multi-label classifier trained by the main job.

    Args:
      config: a packaged config's name (default ``"uniform_sparse"``; also
        ``"quickstart"``, ``"dense"``, ``"linear"``, ``"mach"``,
        ``"astra"``, ``"lsh"``, ``"scent"``), a config file or a
        ``ConfigDict`` (:func:`load_config`).
      overrides: ``{"train.epochs": 5, "model.ensemble_size": 3, ...}``.
      workdir: directory of the run's files (``model.keras``,
        ``saved_model/``, ``metrics.json``, ``history.csv``, the backup of
        an unfinished run, which a rerun resumes); None: a temporary
        directory, deleted with the object (a second ``fit`` retrains
        there; one after an interrupted ``fit`` resumes it).
      overwrite: retrain into a ``workdir`` holding a finished run.
      force: take over a stale workdir lock.
      strategy: a ``tf.distribute`` strategy to train under, or None.
      callbacks: extra Keras callbacks for ``fit``.

    Attributes:
      config: the config as given (``ConfigDict``).
      model: the trained ``keras.Model`` (raw features ``[n, d]`` ->
        float32 scores ``[n, m]``, normalisation and label tree inside);
        None before ``fit``.
      workdir: the run's directory.
      metrics_: the run's ``metrics.json`` dict (test metrics when
        ``fit`` had ``test_data``, sizes, seconds, the resolved choices).

    Raises:
      ValueError: from the constructor, a bad config or override.

    Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
    Extremely Large Output Spaces" (the default uniform-sparse model and
    its schedule, Sec. 3-4); the other configs name their papers.
    """

    def __init__(self, config="uniform_sparse", overrides=None,
                 workdir: str | None = None, *, overwrite: bool = False,
                 force: bool = False, strategy=None, callbacks=()):
        self.config = load_config(config, overrides)
        self.overwrite, self.force = overwrite, force
        self.strategy, self.callbacks = strategy, list(callbacks)
        # A temporary workdir is the object's own: a second fit retrains.
        self._own_workdir = workdir is None
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="xmc-tf-")
            self._cleanup = weakref.finalize(self, shutil.rmtree, workdir,
                                             True)
        self.workdir = os.fspath(workdir)
        self.metrics_ = None
        self._model = None
        self._inv_prop = None

    def __repr__(self):
        return (f"ExtremeClassifier(head={self.config.model.head!r}, "
                f"workdir={self.workdir!r}, "
                f"{'fitted' if self.metrics_ is not None else 'not fitted'})")

    # -- training ---------------------------------------------------------

    def fit(self, X, Y, validation_data=None, test_data=None,
            num_labels: int | None = None) -> "ExtremeClassifier":
        """Trains on ``(X, Y)``; see :meth:`fit_datasets`.

        Args:
          X: ``[n, d]`` raw feature values: scipy sparse (bag of words,
            counts or tf-idf; normalised as ``config.data.normalize`` says)
            or a dense float array (embeddings).
          Y: ``[n, m]`` CSR / dense 0-1 label matrix, or ``n`` lists of
            label ids.
          validation_data: ``(X_val, Y_val)`` for the schedule, early
            stopping and the label tree's weight; None takes
            ``config.data.validation_fraction`` of the training rows.
          test_data: ``(X_test, Y_test)`` evaluated into ``metrics_``.
          num_labels: m, when ``Y`` is id lists whose largest id is not
            ``m - 1``.

        Returns:
          ``self``.

        Raises:
          ValueError: bad input (rows that differ, an empty matrix, a label
            id out of range, NaN values; one line), before training.
          xmc_tf.errors.UserError: a bad config, a busy or finished
            workdir (without ``overwrite``), a backup of another run.
        """
        train = xinputs.as_dataset(X, Y, num_labels, "fit")
        m = train.num_labels
        val = (xinputs.as_dataset(*validation_data, m, "validation_data")
               if validation_data is not None else None)
        test = (xinputs.as_dataset(*test_data, m, "test_data")
                if test_data is not None else None)
        data = JobData(train, test, val)
        try:
            data.check()
        except ValueError as e:
            raise ValueError(f"fit: {e}") from None
        # In-memory arrays: no file names in the run's config.json.
        self.config.data.train, self.config.data.test = "", ""
        return self.fit_datasets(data.train, data.test, data.validation)

    def fit_datasets(self, train: xdata.XCDataset,
                     test: xdata.XCDataset | None = None,
                     validation: xdata.XCDataset | None = None
                     ) -> "ExtremeClassifier":
        """Trains on :class:`xmc_tf.data.XCDataset` s (what ``xmc-tf
        train`` reads from ``config.data``), keeping ``config.data`` as
        given: :func:`xmc_tf.job.run.train_and_evaluate` in
        ``self.workdir``, then loads the trained model.

        Returns:
          ``self``.

        Raises:
          As :func:`xmc_tf.job.run.train_and_evaluate`.
        """
        return self._train(JobData(train, test, validation))

    def _train(self, data: JobData | None) -> "ExtremeClassifier":
        # The object's own workdir: a finished fit is retrained over, an
        # interrupted one resumes.
        finished = os.path.exists(Workdir(self.workdir).file(Workdir.METRICS))
        self.metrics_ = train_and_evaluate(
            self.config, self.workdir, data=data,
            overwrite=self.overwrite or (self._own_workdir and finished),
            force=self.force, callbacks=self.callbacks,
            strategy=self.strategy)
        self._model = None  # loaded from the workdir at first use
        return self

    def fit_files(self) -> "ExtremeClassifier":
        """Trains on the files of ``config.data`` (``train``, ``test``),
        read once the workdir is locked -- what ``xmc-tf train`` runs.

        Returns:
          ``self``.

        Raises:
          As :func:`xmc_tf.job.run.train_and_evaluate` (``DataError`` for
          unreadable files, naming file and line).
        """
        return self._train(None)

    @property
    def model(self):
        """The trained ``keras.Model`` (raw features ``[n, d]`` -> float32
        scores ``[n, m]``), loaded from the workdir at first use (its files
        checked against the completion marker); None before ``fit`` and on
        the non-chief workers of a multi-worker run."""
        if self._model is None and self.metrics_ is not None:
            wd = Workdir(self.workdir)
            if os.path.exists(wd.file(Workdir.METRICS)):
                self._model = artifacts.load_model(self.workdir)
                self._inv_prop = np.load(wd.file(Workdir.INV_PROPENSITIES))
        return self._model

    # -- inference --------------------------------------------------------

    @property
    def num_features(self) -> int:
        """d, the width of the features the model takes."""
        self._check_fitted("num_features")
        return int(self.model.inputs[0].shape[-1])

    @property
    def num_labels(self) -> int:
        """m, the number of labels the model scores."""
        self._check_fitted("num_labels")
        return int(self.metrics_["num_labels"])

    def _check_fitted(self, what: str) -> None:
        if self.model is None:
            raise ValueError(f"{what}: the classifier is not fitted; call "
                             "fit(X, Y) or ExtremeClassifier.load(DIR) first")

    def _dataset(self, X, Y, what: str) -> xdata.XCDataset:
        self._check_fitted(what)
        if Y is None:
            Y = sp.csr_matrix((np.shape(X)[0], self.num_labels),
                              dtype=np.float32)
        dataset = xinputs.as_dataset(X, Y, self.num_labels, what)
        if dataset.num_features != self.num_features:
            raise ValueError(f"{what}: X has {dataset.num_features} "
                             f"features; the model was trained on "
                             f"{self.num_features}")
        sparse_model = self.model.inputs[0].sparse
        if sparse_model and not dataset.is_sparse:
            dataset = xdata.XCDataset(sp.csr_matrix(dataset.features),
                                      dataset.labels)
        elif not sparse_model and dataset.is_sparse:
            dataset = xdata.XCDataset(dataset.features.toarray(),
                                      dataset.labels)
        return dataset

    def predict(self, X, k: int = 5, batch_size: int | None = None):
        """The top-``k`` labels of every row of ``X``.

        Args:
          X: ``[n, d]`` raw feature values, as for :meth:`fit`.
          k: labels per row, in ``[1, m]``.
          batch_size: rows scored at once (default
            ``config.eval.batch_size``; capped so a score block stays
            within 256 MiB).

        Returns:
          ``(label_ids int32 [n, k], scores float32 [n, k])``, scores
          descending along each row.

        Raises:
          ValueError: not fitted, ``X`` of another width, NaN values, or
            ``k`` out of range.
        """
        dataset = self._dataset(X, None, "predict")
        batch = batch_size or int(self.config.eval.batch_size)
        parts = list(predict_top_k(self.model, dataset, int(k), batch))
        ids = np.concatenate([p[0] for p in parts]).astype(np.int32)
        scores = np.concatenate([p[1] for p in parts]).astype(np.float32)
        return ids, scores

    def evaluate(self, X, Y, ks=(1, 3, 5)) -> dict:
        """P@k, nDCG@k, PSP@k and R@k (percent) on ``(X, Y)``: the metrics
        of ``xmc-tf train`` / ``xmc-tf evaluate`` (PSP with the training
        labels' propensities).

        Returns:
          ``{"P@1": ..., "nDCG@1": ..., "PSP@1": ..., "R@1": ...,
          "num_instances": n}``.

        Raises:
          ValueError: not fitted, bad input (as :meth:`fit`), a label id
            ``>= m``, or a ``k`` out of ``[1, m]``.
        """
        dataset = self._dataset(X, Y, "evaluate")
        return evaluate_model(self.model, dataset, self._inv_prop, tuple(ks),
                              int(self.config.eval.batch_size))

    # -- files ------------------------------------------------------------

    def save(self, path: str) -> None:
        """Copies the run's files (model, SavedModel, normalisation, PSP
        weights, metrics, config, history) to directory ``path``, replacing
        it whole (a kill leaves the old directory or none, never a mix).
        Nothing happens when ``path`` is the workdir itself."""
        self._check_fitted("save")
        path = os.fspath(path)
        if os.path.abspath(path) == os.path.abspath(self.workdir):
            return
        parent = os.path.dirname(os.path.abspath(path))
        os.makedirs(parent, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".save-", dir=parent)
        try:
            shutil.copytree(self.workdir, tmp, dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns(
                                Workdir.BACKUP, ".*"))
            replace_dir(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @classmethod
    def load(cls, path: str) -> "ExtremeClassifier":
        """The classifier saved in ``path`` (by :meth:`save`, or the workdir
        of a finished ``xmc-tf train``), its files checked against its
        completion marker.

        Raises:
          xmc_tf.errors.IncompleteWorkdir: no finished run in ``path``.
        """
        wd = Workdir(os.fspath(path))
        wd.check_complete()
        with open(wd.file(Workdir.CONFIG)) as f:
            config = ml_collections.ConfigDict(json.load(f))
        clf = cls(config, workdir=wd.path)
        clf.metrics_ = wd.check_complete()
        return clf

    def export(self, path: str, k: int = 5, portable: bool | None = None
               ) -> bool:
        """Writes the model as a SavedModel with the named signatures
        (``serve``: top-``k`` ids and scores; ``score_all_labels``) at
        ``path``, atomically: :func:`xmc_tf.saving.export_saved_model`.

        Returns:
          True when the SavedModel uses TensorFlow's own ops only.
        """
        self._check_fitted("export")
        with atomic_path(os.fspath(path)) as tmp:
            return xsaving.export_saved_model(self.model, tmp, k=k,
                                              portable=portable)
