"""The config schema of ``xmc-tf train``: every field and its one default.

The schema lives in the TensorFlow-free package of the command line
(:mod:`xmc_tf_cli.schema`, where ``xmc-tf --help`` and config files read it
without TensorFlow); ``xmc_tf.config`` is the same module under its library
name (this file makes the name point at it), so ``from xmc_tf.config import
base`` in a config file, ``xmc_tf_cli.schema.base`` and a test's
``monkeypatch.setattr(xmc_tf.config, ...)`` all reach one set of objects
(``xmc_tf.config is xmc_tf_cli.schema``; tests/test_config.py checks it).
"""

import sys

from xmc_tf_cli import schema as _schema

sys.modules[__name__] = _schema
