"""The error types xmc_tf raises for problems its user can fix.

Hierarchy::

    Exception
    +-- UserError                       fixable by the user; one line
    |   +-- ConfigError (ValueError)    a bad config value
    |   +-- DataError (ValueError)      a bad data file or spec
    |   +-- WorkdirError                the workdir forbids the command
    |   |   +-- WorkdirBusy             another process holds its lock
    |   |   +-- WorkdirFinished         it holds a finished run
    |   |   +-- IncompleteWorkdir       it holds no complete model
    |   |   +-- CheckpointError         its backup cannot be used
    |   +-- TrainingDiverged            the training loss became NaN/inf
    |   +-- DistributeError             a bad TF_CONFIG, a lost or failed
    |                                   worker of a data-parallel run
    |   +-- OpNotRegisteredError (ImportError)
    |                                   a saved model's op is not registered
    +-- ImportError
        +-- OpLibraryError              the op library is missing or stale

The ``xmc-tf`` command prints a :class:`UserError` or an
:class:`OpLibraryError` as one line (``xmc-tf: error: MESSAGE``, exit
status 2; ``--debug`` adds the traceback); any other exception is a bug and
keeps its traceback.  Messages name what to fix (the config field, the file
and line, the workdir and how to discard it).

This module imports nothing from xmc_tf, so every module can raise these
errors without import cycles.  Import the classes from here (the modules
that raise them do not re-export them).
"""

from __future__ import annotations

__all__ = ["UserError", "ConfigError", "DataError", "WorkdirError",
           "WorkdirBusy", "WorkdirFinished", "IncompleteWorkdir",
           "CheckpointError", "TrainingDiverged", "DistributeError",
           "OpNotRegisteredError",
           "OpLibraryError"]


class UserError(Exception):
    """An error the user can fix (config, data, paths, workdir state).

    The ``xmc-tf`` command prints it as one line ``xmc-tf: error: MESSAGE``
    and exits with status 2 (``--debug`` adds the traceback); internal
    errors keep their traceback.
    """


class ConfigError(UserError, ValueError):
    """A config value is invalid (the message names the field).

    Raised by :func:`xmc_tf.job.checks.check_config` and while building the model
    and optimizer from a config; the ``xmc-tf train`` command prefixes the
    config file.
    """


class DataError(UserError, ValueError):
    """A data file or spec is invalid (names the file, and line if known).

    Raised by :mod:`xmc_tf.job.run` when it loads the training, validation or
    test data (wrapping the readers' ``ValueError``/``OSError``), or when a
    data set does not fit the trained model.
    """


class WorkdirError(UserError):
    """The work directory is in a state that forbids the command
    (:mod:`xmc_tf.job.workdir`)."""


class WorkdirBusy(WorkdirError):
    """Another process holds the workdir lock (the message names the owner,
    and ``--force`` when the owner is gone)."""


class WorkdirFinished(WorkdirError):
    """``train`` into a workdir that holds a finished run (rerun with
    ``--overwrite`` to replace it)."""


class IncompleteWorkdir(WorkdirError):
    """The workdir holds no complete model (``evaluate``/``predict``,
    :func:`xmc_tf.job.artifacts.load_model`)."""


class CheckpointError(WorkdirError):
    """The backup cannot be used: unreadable, or written for another
    model/config.  The message names the file and how to discard it
    (:mod:`xmc_tf.job.checkpoint`, the best-weights files of
    :class:`xmc_tf.callbacks.EarlyStopping`)."""


class TrainingDiverged(UserError):
    """The training loss became NaN or infinite (raised by
    :class:`xmc_tf.job.fit.StopOnNonFinite`, naming the epoch)."""


class DistributeError(UserError):
    """A data-parallel run (``xmc-tf train --strategy``) cannot go on: a
    missing or malformed ``TF_CONFIG``, a worker that cannot start, the
    chief stopping with an error the other workers report, or a worker
    losing contact with the others (:mod:`xmc_tf.job.cluster`,
    :mod:`xmc_tf.job.run`).  Rerunning the same command on every worker
    resumes from the chief's backup."""


class OpNotRegisteredError(UserError, ImportError):
    """A saved model uses an xmc_tf op that this process has not registered
    (the message says to ``import xmc_tf`` first and which TensorFlow the op
    library was built for; raised by :mod:`xmc_tf.saving`)."""


class OpLibraryError(ImportError):
    """The op library is missing, or was built for another TensorFlow
    (:mod:`xmc_tf.ops._loader`; ``import xmc_tf`` turns it into a warning
    and the first use of an op raises it)."""
