"""Resume of the main job: whether a backup belongs to this run, and the
state a run starts from (fresh, or restored exactly from ``workdir/backup``).

A run is resumed only with the config it was started with (fields of
:data:`RESUME_MAY_CHANGE` aside) and the same training data (its
:class:`xmc_tf.job.plan.DataSummary` and the values the data chose for
the config's automatic fields).
"""

from __future__ import annotations

import json
import os

from absl import logging

from xmc_tf import config as xconfig
from xmc_tf.job import checkpoint as xckpt
from xmc_tf.errors import CheckpointError
from xmc_tf.job.workdir import Workdir
from xmc_tf.files import discard_hint

__all__ = ["RESUME_MAY_CHANGE", "resume_config", "config_changes",
           "check_resumable", "check_same_data", "start_meta",
           "restore_run"]

#: Config fields that may change between a run and its resume (they do not
#: change what is computed; ``train.epochs`` moves the end of the run, which
#: the resume says in one line).
RESUME_MAY_CHANGE = ("train.verbose", "train.tensorboard", "train.epochs")


def resume_config(config) -> dict:
    """``config`` as the JSON dict a checkpoint keeps, fields of
    :data:`RESUME_MAY_CHANGE` removed."""
    out = json.loads(config.to_json_best_effort(sort_keys=True))
    for key in RESUME_MAY_CHANGE:
        section, field = key.split(".")
        out.get(section, {}).pop(field, None)
    return out


_MISSING = object()


def config_changes(saved: dict, config) -> list:
    """What differs between a run's saved config (``config.json``, the
    backup's) and ``config``, fields of :data:`RESUME_MAY_CHANGE` aside.

    A field the saved config lacks is no change: it was written by an
    xmc_tf from before the field joined the schema (:mod:`xmc_tf.config`),
    whose run read the code's fallback for it; such fields are logged.

    Returns:
      ``["config.K=SAVED (now NOW)", ...]``, sorted; empty if none.
    """
    a = dict(xconfig.flat_fields(saved))
    b = dict(xconfig.flat_fields(resume_config(config)))
    for key in RESUME_MAY_CHANGE:
        a.pop(key, None)
    older = sorted(set(b) - set(a))
    if older:
        logging.info("the saved config predates the fields %s; taken as "
                     "their current values", ", ".join(older))
    return [f"config.{k}={a.get(k)!r} (now {b.get(k)!r})"
            for k in sorted(a) if a[k] != b.get(k, _MISSING)]


def check_resumable(ckpt: xckpt.Checkpoint, config) -> None:
    """Raises CheckpointError unless the backup ``ckpt`` was written by a
    run of ``config`` (:func:`config_changes`; the message names up to
    four differing fields and how to discard the backup)."""
    diff = config_changes(ckpt.meta.get("config", {}), config)
    if not diff:
        return
    raise CheckpointError(
        f"the backup {ckpt.path} belongs to a run with another config: "
        f"{', '.join(diff[:4])}{' ...' if len(diff) > 4 else ''}; rerun with "
        f"that config to resume, or {discard_hint(os.path.dirname(ckpt.path))}")


def check_same_data(ckpt: xckpt.Checkpoint | None, regime: dict,
                    data: dict) -> None:
    """Raises CheckpointError when the backup ``ckpt`` was trained on other
    data: other values chosen for the config's automatic fields
    (``regime``), or another data summary (``data``:
    :meth:`xmc_tf.job.plan.DataSummary.to_json`; a backup written before
    summaries were kept is not compared)."""
    if ckpt is None:
        return
    hint = discard_hint(os.path.dirname(ckpt.path))
    if ckpt.meta.get("regime", {}) != regime:
        raise CheckpointError(
            f"the backup {ckpt.path} was trained with "
            f"{ckpt.meta.get('regime', {}).get('fields', {})} chosen from "
            f"its training labels, this run's labels give "
            f"{regime.get('fields', {})} (config.data.train changed?); {hint}")
    saved = ckpt.meta.get("data")
    if saved is not None and saved != data:
        diff = ", ".join(f"{k} {saved.get(k)} (now {v})"
                         for k, v in sorted(data.items())
                         if saved.get(k) != v)
        raise CheckpointError(f"the backup {ckpt.path} was trained on other "
                              f"data: {diff}; {hint}")


def start_meta(given, regime: dict, data: dict, ckpt) -> dict:
    """The checkpoint metadata of this run: a new run id, or the resumed
    run's id, history, seconds and peak memory (``resumes`` + 1)."""
    epochs = given.train.epochs
    meta = {"run_id": Workdir.new_run_id(), "resumes": 0,
            "config": resume_config(given), "train_epochs": epochs,
            "regime": regime, "data": data}
    if ckpt is None:
        return meta
    m = ckpt.meta
    if m.get("train_epochs", epochs) != epochs:
        logging.warning("resuming with config.train.epochs=%d (the "
                        "interrupted run had %d)", epochs, m["train_epochs"])
    meta.update(run_id=m["run_id"], resumes=m["resumes"] + 1,
                history=m["history"], train_seconds=m["train_seconds"],
                peak_memory_bytes=m["peak_memory_bytes"])
    return meta


def restore_run(ckpt, fit_model, stateful: dict, checkpointer,
                history_path: str, epochs: int) -> tuple[int, int]:
    """Restores the backup ``ckpt`` (weights, optimizer, callback states)
    into ``fit_model`` and rewrites ``history.csv`` from it; call it under
    the strategy's scope.

    Returns:
      ``(initial_epoch, last_epoch)`` of the ``fit`` still to run
      (``(0, epochs)`` for a fresh run; equal when the backup's run had
      stopped early).
    """
    if ckpt is None:
        return 0, epochs
    xckpt.restore(ckpt, fit_model, stateful)
    xckpt.write_history_csv(history_path, checkpointer.history)
    initial_epoch = ckpt.meta["epochs_done"]
    logging.info("resuming run %s from %s: %d epochs done (%s)",
                 checkpointer.meta["run_id"], ckpt.path, initial_epoch,
                 ckpt.meta["phase"])
    return initial_epoch, initial_epoch if ckpt.meta["stopped"] else epochs
