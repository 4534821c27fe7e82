"""xmc_tf.errors: the hierarchy, and its one import path."""

import importlib

import pytest

from xmc_tf import errors

# Modules that raise these errors; none re-exports them (one import path:
# xmc_tf.errors).
RAISERS = ["xmc_tf.job.workdir", "xmc_tf.job.checkpoint", "xmc_tf.saving",
           "xmc_tf.ops", "xmc_tf.ops._loader", "xmc_tf.job.cluster"]


def test_errors_are_defined_in_xmc_tf_errors():
    for name in errors.__all__:
        assert getattr(errors, name).__module__ == "xmc_tf.errors", name


@pytest.mark.parametrize("module", RAISERS)
def test_raisers_do_not_re_export_the_errors(module):
    exported = set(getattr(importlib.import_module(module), "__all__", ()))
    assert not exported & set(errors.__all__)


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
    from xmc_tf.job import cli as commands
    from xmc_tf_cli import cli
    for name in errors.__all__:
        cls = getattr(errors, name)

        def fail(fv, config_path, cls=cls):
            raise cls(f"the {cls.__name__} message")

        monkeypatch.setattr(commands, "evaluate", fail)  # COMMANDS' run
        status = cli.main(["xmc-tf", "evaluate", "--workdir=/nonexistent",
                           "--data=x"])
        err = capsys.readouterr().err
        assert status == cli.EXIT_USER, name
        assert err == f"xmc-tf: error: the {name} message\n", name
