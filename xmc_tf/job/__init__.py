"""The main job, built on the library: the ``xmc-tf`` command
(:mod:`xmc_tf.job.cli`), the model a config describes
(:mod:`xmc_tf.job.build`, the output heads :mod:`xmc_tf.job.heads`), the
work directory and its backups (:mod:`xmc_tf.job.workdir`,
:mod:`xmc_tf.job.checkpoint`), preprocessing, the label tree
(:mod:`xmc_tf.job.tree`), ensembles, data-parallel clusters
(:mod:`xmc_tf.job.cluster`) and scoring (:mod:`xmc_tf.job.scoring`).

The library half (ops, layers, losses, metrics, samplers, callbacks,
:mod:`xmc_tf.models`, saving, data) never imports this package: checked by
``lint-imports`` (``[tool.importlinter]`` in pyproject.toml, which lists the
few imports still to go).  This ``__init__`` imports none of its modules.
"""
