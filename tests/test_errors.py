"""xmc_tf.errors: the hierarchy, and the old import paths of every error."""

import importlib

import pytest

from xmc_tf import errors

# (module, name) pairs users may import from today; each must be the class
# defined in xmc_tf.errors, not a copy (``except`` clauses must match).
OLD_HOMES = [
    ("xmc_tf.job.workdir", "UserError"),
    ("xmc_tf.job.workdir", "ConfigError"),
    ("xmc_tf.job.workdir", "DataError"),
    ("xmc_tf.job.workdir", "WorkdirError"),
    ("xmc_tf.job.workdir", "WorkdirBusy"),
    ("xmc_tf.job.workdir", "WorkdirFinished"),
    ("xmc_tf.job.workdir", "IncompleteWorkdir"),
    ("xmc_tf.job.checkpoint", "CheckpointError"),
    ("xmc_tf.train", "TrainingDiverged"),
    ("xmc_tf.saving", "OpNotRegisteredError"),
    ("xmc_tf.ops", "OpLibraryError"),
    ("xmc_tf.ops._loader", "OpLibraryError"),
]


@pytest.mark.parametrize("module,name", OLD_HOMES)
def test_old_import_paths_give_the_same_class(module, name):
    assert getattr(importlib.import_module(module), name) is getattr(
        errors, name)
    assert name in errors.__all__


def test_hierarchy():
    user = [errors.ConfigError, errors.DataError, errors.WorkdirError,
            errors.WorkdirBusy, errors.WorkdirFinished,
            errors.IncompleteWorkdir, errors.CheckpointError,
            errors.TrainingDiverged, errors.DistributeError,
            errors.OpNotRegisteredError]
    assert all(issubclass(c, errors.UserError) for c in user)
    for c in (errors.WorkdirBusy, errors.WorkdirFinished,
              errors.IncompleteWorkdir, errors.CheckpointError):
        assert issubclass(c, errors.WorkdirError)
    # Callers catching the builtin kinds keep working.
    assert issubclass(errors.ConfigError, ValueError)
    assert issubclass(errors.DataError, ValueError)
    assert issubclass(errors.OpNotRegisteredError, ImportError)
    assert issubclass(errors.OpLibraryError, ImportError)
    assert not issubclass(errors.OpLibraryError, errors.UserError)
    for name in errors.__all__:
        assert getattr(errors, name).__doc__, name


def test_cli_prints_every_error_as_one_line(capsys, monkeypatch):
    # An error raised by a command is one line on stderr, exit status 2.
    from xmc_tf.job import cli
    for name in errors.__all__:
        cls = getattr(errors, name)

        def fail(fv, config_path, cls=cls):
            raise cls(f"the {cls.__name__} message")

        monkeypatch.setitem(cli._RUN, "evaluate", fail)
        status = cli.main(["xmc-tf", "evaluate", "--workdir=/nonexistent",
                           "--data=x"])
        err = capsys.readouterr().err
        assert status == cli.EXIT_USER, name
        assert err == f"xmc-tf: error: the {name} message\n", name
