"""The work of the ``xmc-tf`` commands: train, evaluate, predict, export.

The command line itself -- the command table, flags, help, argument checks,
errors and exit statuses -- is the TensorFlow-free :mod:`xmc_tf_cli.cli`;
it imports ``xmc_tf`` and then calls the function here that its
:data:`~xmc_tf_cli.cli.COMMANDS` entry names, with the parsed flags and the
config path.  ``python -m xmc_tf`` runs the same command line (:func:`run`).
"""

from __future__ import annotations

import json
import os

from xmc_tf_cli.cli import UsageError, load_config, shown_name, main, run

__all__ = ["train", "print_config", "evaluate", "predict", "export", "main",
           "run"]


def train(fv, config_path):
    """``xmc-tf train``: the config's files through
    :class:`xmc_tf.ExtremeClassifier` (:meth:`~xmc_tf.ExtremeClassifier.fit_files`)."""
    from xmc_tf.job import cluster as xcluster
    from xmc_tf.job.memory import limit_malloc_heaps
    # Large blocks mapped and returned on free, not cached in malloc's
    # heaps under training's peak (a process setting: the command's).
    limit_malloc_heaps()
    # First, before TensorFlow runs any op (MultiWorkerMirroredStrategy
    # configures the collective ops; it waits here for every worker).
    strategy = xcluster.make_strategy(fv.strategy)
    from xmc_tf import ExtremeClassifier
    from xmc_tf.errors import ConfigError
    from xmc_tf.job.scoring import format_table
    config = load_config(fv, config_path)
    if fv["print-config"].value:
        return print_config(config, config_path)
    try:
        results = ExtremeClassifier(
            config, workdir=fv.workdir, overwrite=fv.overwrite,
            force=fv.force, strategy=strategy).fit_files().metrics_
    except ConfigError as e:
        raise ConfigError(f"{shown_name(config_path)}: {e}") from e
    print("\n" + format_table(results))
    cluster = xcluster.Cluster(strategy)
    if cluster.is_chief:
        print(f"\nwrote {os.path.join(fv.workdir, 'metrics.json')}")
    else:
        print(f"\n{cluster.name}: done; the chief (worker 0) wrote "
              "metrics.json and the model to its --workdir")


def print_config(config, config_path):
    """``xmc-tf train --print-config``: the run's config after
    :func:`xmc_tf.job.plan.resolve_config` on the training data (no
    workdir is touched)."""
    from xmc_tf.errors import ConfigError
    from xmc_tf.job import checks, inputs, plan
    try:
        head = checks.check_config(config)
        train, _ = inputs.read_datasets(config)
        resolved, _ = plan.resolve_config(config, train, head=head)
    except ConfigError as e:
        raise ConfigError(f"{shown_name(config_path)}: {e}") from e
    print(resolved.to_json_best_effort(indent=2, sort_keys=True))


def evaluate(fv, _):
    import numpy as np
    from xmc_tf.job import artifacts, preprocessing, scoring
    from xmc_tf.job.workdir import Workdir
    model = artifacts.load_model(fv.workdir)
    dataset = preprocessing.load_for_model(fv.data, fv.workdir)
    inv_prop = np.load(os.path.join(fv.workdir, Workdir.INV_PROPENSITIES))
    results = scoring.evaluate_model(model, dataset, inv_prop)
    print(scoring.format_table(results))
    print(json.dumps(results))


def predict(fv, _):
    from xmc_tf.job import artifacts, preprocessing, scoring
    from xmc_tf.files import atomic_path
    model = artifacts.load_model(fv.workdir)
    dataset = preprocessing.load_for_model(fv.data, fv.workdir)
    count = 0
    with atomic_path(fv.output) as tmp:
        with open(tmp, "w") as f:
            for ids, scores in scoring.predict_top_k(model, dataset, fv.k):
                for row_ids, row_scores in zip(ids, scores):
                    f.write(" ".join(f"{i}:{s:.6g}" for i, s in
                                     zip(row_ids, row_scores)) + "\n")
                    count += 1
    print(f"wrote top-{fv.k} labels of {count} instances to {fv.output}")


def export(fv, _):
    from xmc_tf import saving
    from xmc_tf.files import atomic_path
    from xmc_tf.job import artifacts
    model = artifacts.load_model(fv.workdir)
    portable = {"auto": None, "yes": True, "no": False}[fv.portable]
    try:
        with atomic_path(fv.output) as tmp:
            stock = saving.export_saved_model(model, tmp, k=fv.k,
                                              portable=portable)
    except ValueError as e:  # k out of range, --portable=yes impossible
        raise UsageError(f"export: {e}") from e
    print(f"wrote {fv.output}: serve returns the top {fv.k} labels; "
          + ("TensorFlow's own ops only (loads without xmc_tf)" if stock
             else "uses xmc_tf ops (load after `import xmc_tf`)"))
