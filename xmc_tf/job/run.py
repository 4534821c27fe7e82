"""The main job: check -> plan -> build -> fit -> finalize -> export, in a
work directory that keeps its promises.

``train_and_evaluate(config, workdir)`` trains the model of
:func:`xmc_tf.job.build.build_model` on the data of ``config.data`` (or
in-memory data sets: :class:`JobData`, what
:class:`xmc_tf.ExtremeClassifier` passes), evaluates it on the test set
and writes ``model.keras``, ``saved_model/`` and, last, ``metrics.json``.
The config is checked once, as given, before any data is read
(:func:`xmc_tf.job.checks.check`: a frozen
:class:`xmc_tf.job.checks.Checked`, what every later step reads instead of
the config).  Each phase is then a function from the value of the one
before, all of them reading the process's :class:`Job` (workdir, cluster,
backup, callbacks):

* :func:`plan` (:mod:`xmc_tf.job.plan`): data -> a frozen
  :class:`xmc_tf.job.plan.Plan`, the config resolved from a summary of the
  training data;
* :func:`split` (:mod:`xmc_tf.job.inputs`): plan -> :class:`Splits`, the
  validation split and the normalisation;
* :func:`build` (:mod:`xmc_tf.job.fit`): -> :class:`Built`, the model, its
  optimizer, callbacks and checkpointer;
* :func:`fit` (:mod:`xmc_tf.job.fit`, :mod:`xmc_tf.job.resume`): restore a
  backup or start fresh, ``model.fit`` (``Built``'s models, in place);
* :func:`finalize` (:mod:`xmc_tf.job.finalize`): -> :class:`Fused`, the
  label tree, the label centroids, the neighbour votes and the
  normalisation added to the trained network;
* :func:`export`: test metrics (:mod:`xmc_tf.job.report`), the model files
  and the completion marker (the step an ensemble ends with too).

The work directory keeps its promises (:mod:`xmc_tf.job.workdir`,
:mod:`xmc_tf.job.checkpoint`): one run at a time (a lock), a finished run is
not retrained unless ``overwrite``, a killed run resumes exactly from
``workdir/backup`` (kept until the export is complete), and every file is
renamed into place when complete.  Under a ``tf.distribute`` strategy
(:mod:`xmc_tf.job.cluster`) every worker runs the same phases; the chief
writes the workdir, the others a temporary directory, and only the chief
finalizes and exports.  Nothing here branches on the head's name: see
:mod:`xmc_tf.job.heads`.

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 3.4 and 4.1.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import shutil
import tempfile

import keras
from absl import logging

from xmc_tf.job import artifacts
from xmc_tf.job import checkpoint as xckpt
from xmc_tf.job import checks as xchecks
from xmc_tf import data as xdata
from xmc_tf.job import cluster as xcluster
from xmc_tf.job import ensemble as xensemble
from xmc_tf.errors import ConfigError, DataError, DistributeError
from xmc_tf.job import finalize as xfinalize
from xmc_tf.job import fit as xfit
from xmc_tf.job import inputs as xinputs
from xmc_tf.job import plan as xplan
from xmc_tf.job import memory as xmemory
from xmc_tf.job import report as xreport
from xmc_tf.job import resume as xresume
from xmc_tf.job.scoring import evaluate_model
from xmc_tf.job.inputs import JobData
from xmc_tf.job.workdir import Workdir
from xmc_tf.files import atomic_path, write_bytes_atomic

__all__ = ["JobData", "Job", "Splits", "Built", "Fused", "plan", "split",
           "build", "fit", "train", "finalize", "export",
           "train_and_evaluate", "member_config", "MEMBERS_DIR"]


@dataclasses.dataclass(frozen=True)
class Job:
    """Where one process runs the job: what every phase may read besides
    the value of the phase before.

    Attributes:
      wd: the :class:`~xmc_tf.job.workdir.Workdir` this process writes (a
        temporary one on a non-chief worker).
      cluster: the :class:`xmc_tf.job.cluster.Cluster`.
      ckpt: the :class:`xmc_tf.job.checkpoint.Checkpoint` to resume, or None.
      callbacks: the caller's Keras callbacks (run before the checkpointer).
    """

    wd: Workdir
    cluster: xcluster.Cluster
    ckpt: object = None
    callbacks: tuple = ()

    def scope(self):
        """The strategy's scope (entered once per use), or a null one."""
        strategy = self.cluster.strategy
        return (strategy.scope() if strategy is not None
                else contextlib.nullcontext())


@dataclasses.dataclass(frozen=True)
class Splits:
    """The split phase's value (:func:`split`).

    Attributes:
      fit_data: the normalised :class:`xmc_tf.data.XCDataset` trained on.
      val_data: the normalised validation set, or None.
      norm: the feature normalisation fitted on ``fit_data``
        (:func:`xmc_tf.job.inputs.prepare_splits`).
    """

    fit_data: xdata.XCDataset
    val_data: xdata.XCDataset | None
    norm: object


@dataclasses.dataclass(frozen=True)
class Built:
    """The build phase's value (:func:`build`); :func:`fit` trains its
    models in place.

    Attributes:
      model: the Keras model the config describes (features -> scores).
      layer: its output layer (the head's).
      fit_model: what ``fit`` trains (``model``, or a trainer around it).
      fusion: the fused scorers' plan prepared before training
        (``config.train.monitor="fused"``), or None.
      callbacks: the job's callbacks and the caller's.
      stateful: what the checkpointer saves besides the model.
      checkpointer: the :class:`xmc_tf.job.checkpoint.Checkpointer`.
    """

    model: keras.Model
    layer: keras.layers.Layer
    fit_model: keras.Model
    fusion: object
    callbacks: list
    stateful: dict
    checkpointer: xckpt.Checkpointer


@dataclasses.dataclass(frozen=True)
class Fused:
    """The finalize phase's value (:func:`finalize`).

    Attributes:
      model: the model exported: the network with the fused scorers and the
        normalisation added.
      info: what ``metrics.json`` reports of them (tree, centroids,
        neighbours, fusion weights).
      seconds: the fused scorers' fit and weight reading, seconds.
    """

    model: keras.Model
    info: dict
    seconds: float


def plan(job: Job, checked: xchecks.Checked,
         data: JobData | None) -> xplan.Plan:
    """Seeds, reads the data, writes ``config.json`` and the PSP weights,
    and makes the :class:`xmc_tf.job.plan.Plan` (the config resolved from
    the training data).

    Args:
      job: the :class:`Job`.
      checked: the :class:`xmc_tf.job.checks.Checked` config as given.
      data: the :class:`JobData`, or None to read ``config.data``.

    Raises:
      DataError: unreadable or inconsistent data files.
      DistributeError: workers read different data.
      CheckpointError: a backup whose data or resolved values differ.
      ConfigError: a batch size the plan chose that the replicas do not
        split.
    """
    given = checked.config
    keras.utils.set_random_seed(given.seed)
    if data is None:
        data = JobData(*xinputs.read_datasets(given))
    train, test = data.train, data.test
    logging.info("train: %s", train)
    logging.info("test: %s", test)
    inv_prop = xinputs.save_inv_propensities(given, train, job.wd.path)
    summary = xplan.summarize(train)
    job.cluster.check_same("data", {
        "train": summary.to_json(),
        "test": [test.num_instances, test.num_features, test.num_labels]
        if test is not None else None})
    # config.json and the checkpoint's config are the config as given (a
    # resume and an ensemble's members are checked against it); the
    # values the data chose are kept beside it ("regime").
    write_bytes_atomic(job.wd.file(Workdir.CONFIG),
                       given.to_json_best_effort(indent=2).encode())
    planned = xplan.make_plan(checked, data, summary, inv_prop)
    # Checked once, as given, for both label regimes (xchecks.check); only
    # a batch size the plan chose is new here.
    if (job.cluster.strategy is not None and planned.config.train.batch_size
            != given.train.batch_size):  # by regime, or capped
        xchecks.check_batch_split(planned.config.train.batch_size,
                                  job.cluster)
    xresume.check_same_data(job.ckpt, planned.regime, summary.to_json())
    return planned


def split(job: Job, planned: xplan.Plan) -> Splits:
    """The validation split and the feature normalisation fitted on the fit
    part (:func:`xmc_tf.job.inputs.prepare_splits`), saved to the workdir."""
    fit_data, val_data, norm = xinputs.prepare_splits(
        planned.config, planned.data.train, job.wd.path,
        planned.data.validation)
    return Splits(fit_data, val_data, norm)


def build(job: Job, planned: xplan.Plan, splits: Splits) -> Built:
    """Builds and compiles the model, and makes the callbacks and the
    checkpointer.

    Raises:
      DataError: the head rejects the fit data (``head.prepare``).
      ConfigError: ``config.train.monitor="fused"`` that cannot be
        monitored (``_fusion_before_fit``).
    """
    config, head = planned.config, planned.head
    try:
        head.prepare(splits.fit_data)  # e.g. SCENT's per-instance duals
    except ValueError as e:
        raise DataError(" ".join(str(e).split())) from e
    with job.scope():
        model, layer, fit_model = xfit.build_and_compile(
            config, head, splits.fit_data.num_features,
            splits.fit_data.num_labels, planned.summary.sparse,
            distributed=job.cluster.strategy is not None,
            fit_data=splits.fit_data)
    model.summary(print_fn=logging.info)
    # What parsing, normalising and initialising freed stays resident
    # in malloc's heaps otherwise, under training's peak.
    _return_free_memory("the data and the model are built")
    fusion, fused_cb = _fusion_before_fit(job, planned, splits, model)
    cbs = xfit.make_callbacks(config, job.wd.path, head, layer,
                              splits.val_data, job.cluster, fused=fused_cb)
    callbacks = cbs + list(job.callbacks)
    stateful = xckpt.stateful_objects(callbacks, fit_model)
    meta = xresume.start_meta(planned.given, planned.regime,
                              planned.summary.to_json(), job.ckpt)
    checkpointer = xckpt.Checkpointer(
        job.wd.backup_dir, stateful, job.wd.file(Workdir.HISTORY), meta)
    return Built(model, layer, fit_model, fusion, callbacks, stateful,
                 checkpointer)


def _fusion_before_fit(job: Job, planned: xplan.Plan, splits: Splits, model):
    """The fused scorers' plan and its
    :class:`~xmc_tf.job.finalize.FusedValidation` when the fused
    model's validation P@k drives the schedule and early stopping
    (:func:`xmc_tf.job.plan.monitor_plan`), else ``(None, None)``
    (:func:`xmc_tf.job.finalize.finalize` prepares the scorers after
    training).

    Raises:
      ConfigError: ``config.train.monitor="fused"`` set by the user
        under a strategy, or with no validation instances or no weight
        read on them.
    """
    config, val_data = planned.config, splits.val_data
    monitor = config.train.get("monitor", "network")
    if monitor == "fused" and job.cluster.strategy is not None:
        if planned.given.train.get("monitor", "auto") == "fused":
            raise ConfigError(
                "config.train.monitor='fused' is not supported under a "
                "tf.distribute strategy; use 'network' or "
                "--strategy=none")
        logging.info("config.train.monitor: 'network' under a "
                     "tf.distribute strategy")
        monitor = "network"
    if monitor != "fused":
        return None, None
    if val_data is None or not val_data.num_instances:
        raise ConfigError("config.train.monitor='fused' needs validation "
                          "instances (config.data.validation_fraction > "
                          "0 or a validation file)")
    fusion = xfinalize.prepare_fusion(config, job.wd, splits.fit_data,
                                      val_data)
    if not fusion.reads_weights:
        raise ConfigError(
            "config.train.monitor='fused' needs a scorer fused with its "
            "weight read on validation (config.tree, config.centroids or "
            "config.neighbours on with weight 'auto')")
    return fusion, xfinalize.FusedValidation(fusion, model, config.eval.ks)


def fit(job: Job, planned: xplan.Plan, splits: Splits, built: Built) -> None:
    """Restores the backup (if any) and trains ``built``'s models for the
    remaining epochs (in place)."""
    with job.scope():  # the optimizer's variables, if it builds them
        first, last = xresume.restore_run(
            job.ckpt, built.fit_model, built.stateful, built.checkpointer,
            job.wd.file(Workdir.HISTORY), planned.config.train.epochs)
    if job.ckpt is not None and job.ckpt.meta["phase"] == "trained":
        return
    # the fused pass replaces the network's own validation pass
    val_data = splits.val_data if built.fusion is None else None
    xfit.fit_model(built.fit_model, planned.config, planned.head,
                   splits.fit_data, val_data, built.model, job.cluster,
                   built.callbacks + [built.checkpointer], first, last)


def train(job: Job, checked: xchecks.Checked, data: JobData | None):
    """The phases every worker runs: plan, split, build, fit.

    Returns:
      ``(plan, splits, built)``, ``built``'s models trained.
    """
    planned = plan(job, checked, data)
    splits = split(job, planned)
    built = build(job, planned, splits)
    fit(job, planned, splits, built)
    return planned, splits, built


def finalize(job: Job, planned: xplan.Plan, splits: Splits,
             built: Built) -> Fused:
    """Releases the optimizer state and adds the fused scorers and the
    normalisation to the trained network
    (:func:`xmc_tf.job.finalize.finalize`)."""
    # Training is over and checkpointed: the optimizer's moments are
    # not needed for evaluation and export (nor wanted in model.keras).
    released = xfit.release_optimizer(built.fit_model)
    if released:
        logging.info("released the optimizer state (%.2f GiB) before "
                     "evaluation and export", released / 2**30)
    _return_free_memory("training is over")
    model, info, seconds = xfinalize.finalize(
        planned.config, job.wd, built.model, splits.fit_data,
        splits.val_data, splits.norm, plan=built.fusion)
    return Fused(model, info, seconds)


def export(job: Job, planned: xplan.Plan, built: Built, fused: Fused) -> dict:
    """Evaluates the fused model on the test set, exports it and marks the
    workdir complete (the chief only).

    Returns:
      The ``metrics.json`` dict.
    """
    test, config = planned.data.test, planned.config
    metrics = (evaluate_model(fused.model, test, planned.inv_prop,
                              tuple(config.eval.ks), config.eval.batch_size)
               if test is not None else {})
    extra = dict(planned.head.results(built.layer))
    cluster = job.cluster
    if cluster.strategy is not None:
        extra.update(strategy=cluster.kind, num_workers=cluster.num_workers,
                     num_replicas=cluster.num_replicas)
    extra.update(fused.info)  # tree, centroids, neighbours, fusion
    checkpointer = built.checkpointer
    results = xreport.run_report(
        config, planned.summary, test.num_instances if test else 0,
        built.model, metrics=metrics,
        # the fused scorers' fit and weights included
        train_seconds=checkpointer.train_seconds + fused.seconds,
        epochs=len(checkpointer.history),
        head_bytes=xreport.layer_bytes(built.layer),
        regime=planned.regime, **extra)
    meta = checkpointer.meta
    done = _write_outputs(job.wd, fused.model, config, results,
                          checkpointer.peak_memory_bytes, meta["run_id"],
                          meta["resumes"])
    # The backup goes only now that the export is complete.
    shutil.rmtree(job.wd.backup_dir, ignore_errors=True)
    return done


def _write_outputs(wd: Workdir, model, config, results: dict,
                   peak_memory_bytes: int, run_id: str, resumes: int) -> dict:
    """The export step every run ends with (an ensemble's too): the model
    files (:func:`xmc_tf.job.artifacts.export_model`), then
    ``metrics.json``, the completion marker
    (:meth:`~xmc_tf.job.workdir.Workdir.mark_complete`).

    Returns:
      The ``metrics.json`` dict.
    """
    artifacts.export_model(model, wd.path, k=max(config.eval.ks))
    results["peak_memory_bytes"] = peak_memory_bytes
    return wd.mark_complete(results, run_id, resumes=resumes)


def _return_free_memory(when: str) -> None:
    """:func:`xmc_tf.job.memory.return_free_memory`, logged."""
    returned = xmemory.return_free_memory()
    if returned >= 2**20:
        logging.info("returned %.2f GiB of freed memory to the system (%s)",
                     returned / 2**30, when)


def train_and_evaluate(config, workdir: str, *, data: JobData | None = None,
                       overwrite: bool = False, force: bool = False,
                       callbacks=(), strategy=None) -> dict:
    """Runs the main job; see the module docstring.

    Holds the workdir lock throughout.  If ``workdir/backup`` holds a
    checkpoint of an unfinished run with the same config and data, the run
    resumes from it exactly (weights, optimizer, callback states, epoch,
    seconds, history); a finished workdir is refused unless ``overwrite``.

    Under a ``tf.distribute`` ``strategy`` the model is trained data
    parallel; only the chief locks and writes ``workdir`` (the others
    receive its backup, checkpoint into a temporary directory and wait for
    its export; see the module docstring).

    Args:
      config: ml_collections ConfigDict (see ``configs/uniform_sparse.py``).
      workdir: output directory (created; on the chief only).
      data: the :class:`JobData` to train on (raw feature values); None
        reads ``config.data.train`` / ``config.data.test``.
      overwrite: retrain into a workdir that holds a finished run (its
        results, history and backup are deleted first).
      force: take over a stale workdir lock
        (:class:`xmc_tf.job.workdir.WorkdirLock`).
      callbacks: extra Keras callbacks, run after the job's own and before
        the checkpointer (their ``get_state``/``set_state`` are
        checkpointed too).
      strategy: None (one process, one device) or the
        ``tf.distribute.Strategy`` to train under, created before TensorFlow
        ran any op.

    Returns:
      The ``workdir/metrics.json`` dict (:func:`xmc_tf.job.report.run_report`:
      P@k, nDCG@k, PSP@k, R@k in percent, ``train_seconds``, ``epochs``,
      ``peak_memory_bytes``, sizes; and ``run``, the completion marker); a
      non-chief worker returns the chief's (it wrote no file).

    Raises:
      ConfigError: a bad config value, or one the strategy cannot train.
      DataError: unreadable or inconsistent data files.
      WorkdirBusy, WorkdirFinished: a locked workdir; a finished one
        without ``overwrite``.
      CheckpointError: an unreadable backup, or one of another config or
        data.
      DistributeError: (multi-worker) the chief stopped, workers differ,
        or a worker lost contact.
    """
    cluster = xcluster.Cluster(strategy)
    checked = xchecks.check(config, cluster)
    try:
        if not cluster.is_chief:
            return _worker_job(checked, data, list(callbacks), cluster)
        return _chief_job(checked, workdir, data, list(callbacks), cluster,
                          overwrite=overwrite, force=force)
    except Exception as e:
        lost = _lost_contact(e) if cluster.multi_worker else None
        if lost is None:
            raise
        raise _lost_error(cluster, lost) from e


def _lost_error(cluster, lost: str) -> DistributeError:
    return DistributeError(
        f"{cluster.name} lost contact with the other workers ({lost}); "
        "rerun the same command on every worker: the run resumes from the "
        "chief's backup")


def _lost_contact(error) -> str | None:
    """The gist of a collective-op error from a worker that went away
    (TensorFlow's health check aborts the pending all-reduce), else None."""
    import tensorflow as tf
    if not isinstance(error, (tf.errors.UnavailableError,
                              tf.errors.DeadlineExceededError,
                              tf.errors.CancelledError)):
        return None
    # TensorFlow's message: "Graph execution error:", "Detected at node
    # ... defined at", indented stack lines, then the cause ("Socket
    # closed", "... is down"), then gRPC details.
    skip = ("Graph execution error", "Detected at node", "Additional GRPC",
            ":UNKNOWN:", "The error could be", "[[")
    lines = [line.strip() for line in
             str(getattr(error, "message", error)).splitlines()
             if line.strip() and not line[:1].isspace()
             and not line.strip().startswith(skip)]
    text = " ".join((lines[0] if lines else type(error).__name__).split())
    return text[:200]


def _open_workdir(checked: xchecks.Checked, wd: Workdir, stack, *,
                  overwrite: bool, force: bool):
    """Locks and prepares the chief's workdir; returns the backup to
    resume (checked against the config) or None."""
    lock = stack.enter_context(wd.lock(force=force))
    if lock.previous_owner:
        logging.warning("workdir %s: the previous run (pid %s) ended "
                        "without releasing its lock", wd.path,
                        lock.previous_owner.get("pid"))
    wd.prepare_training(overwrite)
    if checked.config.model.ensemble_size > 1:
        return None
    ckpt = xckpt.load(wd.backup_dir)
    if ckpt is not None:
        xresume.check_resumable(ckpt, checked.config)
    return ckpt


def _chief_job(checked: xchecks.Checked, workdir, data, callbacks, cluster, *,
               overwrite, force) -> dict:
    """The job of the chief (or the only process): lock and prepare the
    workdir, tell the other workers whether and from what to resume, train,
    evaluate and export, and tell them the outcome."""
    wd = Workdir(workdir)
    with contextlib.ExitStack() as stack:
        try:
            ckpt = _open_workdir(checked, wd, stack, overwrite=overwrite,
                                 force=force)
            if checked.config.model.ensemble_size > 1:
                return _run_ensemble(Job(wd, cluster), checked, data,
                                     overwrite=overwrite, force=force,
                                     callbacks=callbacks)
        except BaseException as e:
            cluster.broadcast_json({"error": _one_line(e)})
            raise
        names = (sorted(n for n in os.listdir(wd.backup_dir)
                        if not n.startswith(".") and
                        os.path.isfile(os.path.join(wd.backup_dir, n)))
                 if ckpt is not None else [])
        cluster.broadcast_json({"error": None})
        cluster.check_same("config", _config_dict(checked.config))
        cluster.broadcast_files(wd.backup_dir, names)
        job = Job(wd, cluster, ckpt, tuple(callbacks))
        planned, splits, built = train(job, checked, data)
        try:
            metrics = export(job, planned, built,
                             finalize(job, planned, splits, built))
        except BaseException as e:
            cluster.broadcast_json({"error": _one_line(e)})
            raise
        cluster.broadcast_json({"metrics": metrics})
        return metrics


def _worker_job(checked: xchecks.Checked, data, callbacks, cluster) -> dict:
    """The job of a non-chief worker: train beside the chief from the
    chief's backup, in a temporary directory (nothing in the workdir), then
    wait for the chief's evaluation and export."""
    with tempfile.TemporaryDirectory(
            prefix=f"xmc-tf-worker{cluster.index}-") as tmp:
        wd = Workdir(tmp)
        start = cluster.broadcast_json()
        if start["error"] is not None:
            raise DistributeError(f"the chief (worker 0) stopped: "
                                  f"{start['error']}")
        cluster.check_same("config", _config_dict(checked.config))
        names = cluster.broadcast_files(wd.backup_dir)
        ckpt = xckpt.load(wd.backup_dir) if names else None
        train(Job(wd, cluster, ckpt, tuple(callbacks)), checked, data)
        logging.info("%s: trained; waiting for the chief (worker 0) to "
                     "evaluate and export the model", cluster.name)
        done = cluster.broadcast_json()
        if "error" in done:
            raise DistributeError(f"the chief (worker 0) stopped after "
                                  f"training: {done['error']}")
        return done["metrics"]


def _config_dict(config) -> dict:
    """Every field of ``config`` (workers must agree on all of them:
    ``train.epochs`` too, which a resume may change)."""
    return json.loads(config.to_json_best_effort(sort_keys=True))


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text or type(error).__name__


# ---------------------------------------------------------------------------
# Ensembles.

#: Sub-directory of an ensemble's workdir holding one workdir per member.
MEMBERS_DIR = "members"


def member_config(config, index: int):
    """The config of ensemble member ``index`` (0-based): ``config`` with
    ``seed = config.seed + index``, the ensemble's validation split
    (``data.split_seed``, default ``config.seed``) and ``ensemble_size 1``.

    Members differ only in their random streams (initial weights, SET
    draws, batch order), as in deep ensembles (Lakshminarayanan et al.,
    NeurIPS 2017); sharing the split keeps the ensemble's validation
    metrics clean."""
    member = copy.deepcopy(config)
    split_seed = config.data.split_seed
    member.seed = int(config.seed) + int(index)
    member.data.split_seed = int(config.seed if split_seed is None
                                 else split_seed)
    member.model.ensemble_size = 1
    return member


def _check_member(member_wd: Workdir, config) -> dict:
    """The metrics of a finished member workdir, after checking that it
    was trained with ``config`` (fields of
    :data:`xmc_tf.job.resume.RESUME_MAY_CHANGE` aside).

    Raises:
      ConfigError: the member was trained with another config.
      IncompleteWorkdir: its model files do not match its metrics.json.
    """
    metrics = member_wd.check_complete()
    try:
        with open(member_wd.file(Workdir.CONFIG)) as f:
            saved = json.load(f)
    except (OSError, ValueError):
        saved = None
    if saved is None or xresume.config_changes(saved, config):
        raise ConfigError(
            f"ensemble member {member_wd.path} was trained with another "
            "config; rerun with that config, or pass --overwrite (from "
            "Python: overwrite=True) to retrain every member")
    return metrics


def _train_members(config, wd: Workdir, data, *, overwrite: bool,
                   force: bool, callbacks: list):
    """Trains (or finds finished) every member in ``WORKDIR/members/<i>``;
    returns their metrics and workdirs."""
    n = int(config.model.ensemble_size)
    members_dir = wd.file(MEMBERS_DIR)
    if overwrite:
        shutil.rmtree(members_dir, ignore_errors=True)
    member_metrics, member_dirs = [], []
    for i in range(n):
        mc = member_config(config, i)
        mdir = os.path.join(members_dir, str(i))
        mwd = Workdir(mdir)
        if mwd.completion() is not None:
            metrics = _check_member(mwd, mc)
            logging.info("ensemble member %d/%d (seed %d) already trained in "
                         "%s", i + 1, n, mc.seed, mdir)
        else:
            logging.info("ensemble member %d/%d (seed %d): training in %s",
                         i + 1, n, mc.seed, mdir)
            metrics = train_and_evaluate(mc, mdir, data=data, force=force,
                                         callbacks=callbacks)
        member_metrics.append(metrics)
        member_dirs.append(mdir)
        keras.backend.clear_session()  # the member's graphs and variables
    return member_metrics, member_dirs


def _run_ensemble(job: Job, checked: xchecks.Checked, data, *,
                  overwrite: bool, force: bool, callbacks: list) -> dict:
    """Trains ``config.model.ensemble_size`` members one after the other,
    each a complete run of its own in ``WORKDIR/members/<i>`` (so a killed
    ensemble resumes inside the member it was training, and finished
    members are not retrained), then exports the model that averages their
    scores (:func:`xmc_tf.job.ensemble.average_scores`) with its validation
    and test metrics; ``metrics.json`` also lists each member's."""
    wd = job.wd
    member_metrics, member_dirs = _train_members(
        checked.config, wd, data, overwrite=overwrite, force=force,
        callbacks=callbacks)
    planned = plan(job, checked, data)  # the members' plan, once more
    config, test = planned.config, planned.data.test
    # Members share the split (and so the normalisation, inside each
    # member's model): the raw validation rows are theirs too.
    val_data = planned.data.validation
    if val_data is None:
        _, val_data = xinputs.validation_split(planned.data.train,
                                               member_config(config, 0))
    with atomic_path(wd.file(Workdir.PREPROCESSING)) as tmp:
        shutil.copyfile(os.path.join(member_dirs[0], Workdir.PREPROCESSING),
                        tmp)
    model = xensemble.average_scores(
        [artifacts.load_model(d) for d in member_dirs])
    ks, batch = tuple(config.eval.ks), config.eval.batch_size
    metrics = {}
    if val_data is not None:
        val = evaluate_model(model, val_data, None, ks, batch)
        metrics.update({f"val_{k}": v for k, v in val.items() if "@" in k})
    if test is not None:
        metrics.update(evaluate_model(model, test, planned.inv_prop, ks,
                                      batch))
    results = xreport.run_report(
        config, planned.summary, test.num_instances if test else 0,
        model, metrics=metrics,
        train_seconds=sum(m["train_seconds"] for m in member_metrics),
        epochs=sum(m["epochs"] for m in member_metrics),
        head_bytes=sum(m["output_layer_bytes"] for m in member_metrics),
        regime=planned.regime, ensemble_size=len(member_dirs),
        members={str(i): {k: v for k, v in m.items()
                          if k in xreport.MEMBER_KEYS}
                 for i, m in enumerate(member_metrics)})
    peak = max([xreport.peak_memory_bytes()]
               + [m.get("peak_memory_bytes", 0) for m in member_metrics])
    return _write_outputs(wd, model, config, results, peak,
                          Workdir.new_run_id(), resumes=0)
