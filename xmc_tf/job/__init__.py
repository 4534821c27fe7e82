"""The main job, built on the library: files or scipy matrices -> a trained,
evaluated and exported extreme classifier.

Phases, run in this order by :mod:`xmc_tf.job.run` as functions from one
frozen value to the next (checked -> plan -> splits -> built -> trained ->
fused -> exported), each phase's work in its module:

* :mod:`xmc_tf.job.checks` -- the config as given checked once, before any
  data is read (:class:`xmc_tf.job.checks.Checked`);
* :mod:`xmc_tf.job.plan` -- the checked config resolved from a summary of
  the training data into a :class:`xmc_tf.job.plan.Plan`;
* :mod:`xmc_tf.job.inputs` -- user arrays checked, files read, the
  validation split and the feature normalisation;
* :mod:`xmc_tf.job.build` -- the Keras model and optimizer a config
  describes;
* :mod:`xmc_tf.job.fit` -- compile, callbacks, data streams, ``fit``;
* :mod:`xmc_tf.job.resume` -- whether a backup belongs to the run, and
  restoring it;
* :mod:`xmc_tf.job.finalize` -- the fused scorers
  (:mod:`xmc_tf.job.scorers`: the label tree, the label centroids, the
  neighbour votes) and the normalisation added to the trained network,
  their weights read on the validation rows' shortlists;
* :mod:`xmc_tf.job.report` -- the ``metrics.json`` dict.

Beside them: the work of the ``xmc-tf`` commands (:mod:`xmc_tf.job.cli`; the
command line itself is the TensorFlow-free :mod:`xmc_tf_cli`), the output
heads a config names (:mod:`xmc_tf.job.heads`) and the samplers' config
adapters (:mod:`xmc_tf.job.samplers`), the work directory and its
backups (:mod:`xmc_tf.job.workdir`, :mod:`xmc_tf.job.checkpoint`), the
fused scorers' registry (:mod:`xmc_tf.job.scorers`), ensembles, data-parallel
clusters (:mod:`xmc_tf.job.cluster`) and decoding / evaluation of a trained
model (:mod:`xmc_tf.job.scoring`).

:class:`xmc_tf.job.classifier.ExtremeClassifier` is the Python entry
(also ``xmc_tf.ExtremeClassifier``); ``xmc-tf train`` reads files and calls
it.  The library half (layers, losses, samplers, callbacks,
:mod:`xmc_tf.models`, saving, data) never imports this package: checked by
``lint-imports`` (``[tool.importlinter]`` in pyproject.toml), which also
checks that no library module reads a field of the job's config.  Names are loaded on
first use, so importing one phase does not import the others.
"""

import importlib

_NAMES = {
    "ExtremeClassifier": "classifier",
    "load_config": "classifier",
    "train_and_evaluate": "run",
    "JobData": "run",
}

__all__ = sorted(_NAMES)


def __getattr__(name):
    if name in _NAMES:
        module = importlib.import_module(f"xmc_tf.job.{_NAMES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'xmc_tf.job' has no attribute {name!r}")
