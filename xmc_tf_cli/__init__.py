"""Entry point of the ``xmc-tf`` console script, outside the ``xmc_tf`` package.

``import xmc_tf`` imports TensorFlow and loads the op library -- by contract,
so that a SavedModel using the ops loads afterwards -- which takes 10-20 s.
The console script starts here instead, so that ``xmc-tf --help`` and
``xmc-tf train --help`` answer at once: :func:`main` runs
``xmc_tf/job/cli.py`` (which imports neither TensorFlow nor the package at
module level) without executing ``xmc_tf/__init__.py``; the commands themselves
import ``xmc_tf`` when they run.  It also quiets TensorFlow's C++ start-up
log lines (``TF_CPP_MIN_LOG_LEVEL=1`` unless set) so that errors stay on
one line.

``python -m xmc_tf`` runs the same command through the package (slower
``--help``).
"""

import importlib.util
import os
import sys

__all__ = ["main"]


def _cli_module():
    """``xmc_tf.job.cli``, loaded from its file if the package is not imported
    yet (registered under its own name, so it is never loaded twice)."""
    if "xmc_tf.job.cli" in sys.modules:
        return sys.modules["xmc_tf.job.cli"]
    spec = None if "xmc_tf" in sys.modules else importlib.util.find_spec(
        "xmc_tf")
    locations = list(spec.submodule_search_locations or []) if spec else []
    path = (os.path.join(locations[0], "job", "cli.py") if locations
            else None)
    if path is None or not os.path.exists(path):
        import xmc_tf.job.cli  # pylint: disable=import-outside-toplevel
        return xmc_tf.job.cli
    cli_spec = importlib.util.spec_from_file_location("xmc_tf.job.cli", path)
    module = importlib.util.module_from_spec(cli_spec)
    sys.modules["xmc_tf.job.cli"] = module
    cli_spec.loader.exec_module(module)
    return module


def main() -> int:
    """Runs ``xmc-tf`` with ``sys.argv``; returns the exit status (0 ok,
    2 user error, 130 interrupted; see :mod:`xmc_tf.job.cli`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    return _cli_module().main(sys.argv)


if __name__ == "__main__":
    sys.exit(main())
