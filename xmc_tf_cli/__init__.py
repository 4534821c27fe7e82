"""The TensorFlow-free part of ``xmc-tf``: the command line and what it reads
before TensorFlow is needed.

``import xmc_tf`` imports TensorFlow and loads the op library -- by contract,
so that a SavedModel using the ops loads afterwards -- which takes 10-20 s.
This package imports neither, so that ``xmc-tf --help``, ``xmc-tf train
--help`` and every argument check answer at once:

* :mod:`xmc_tf_cli.cli` -- the command table, flags, help, argument checks,
  errors and exit statuses (the commands' work is :mod:`xmc_tf.job.cli`,
  imported when a command runs);
* :mod:`xmc_tf_cli.schema` -- the config schema and the packaged configs
  (``xmc_tf/configs/``), which config files import; the library
  re-exports it as :mod:`xmc_tf.config`;
* :mod:`xmc_tf_cli.tf_config` -- the ``TF_CONFIG`` check of
  ``--strategy=multi_worker`` (re-exported by :mod:`xmc_tf.job.cluster`).

:func:`main` (the ``xmc-tf`` console script) also quiets TensorFlow's C++
start-up log lines (``TF_CPP_MIN_LOG_LEVEL=1`` unless set) so that errors
stay on one line.  ``python -m xmc_tf`` runs the same command line.
"""

import os
import sys

__all__ = ["main"]


def main() -> int:
    """Runs ``xmc-tf`` with ``sys.argv``; returns the exit status (0 ok,
    2 user error, 130 interrupted; see :mod:`xmc_tf_cli.cli`)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from xmc_tf_cli import cli
    return cli.main(sys.argv)


if __name__ == "__main__":
    sys.exit(main())
