"""The config schema of ``xmc-tf train``: every field and its one default.

The schema lives in the TensorFlow-free package of the command line
(:mod:`xmc_tf_cli.schema`, where ``xmc-tf --help`` and config files read it
without TensorFlow); this module is its name in the library, with the same
objects: ``from xmc_tf.config import base`` in a config file and
``xmc_tf_cli.schema.base`` are one function.

Example:
    >>> from xmc_tf import config as xconfig
    >>> from xmc_tf_cli import schema
    >>> xconfig.base is schema.base and xconfig.HEAD_DEFAULTS is schema.HEAD_DEFAULTS
    True
"""

from xmc_tf_cli import schema as _schema
from xmc_tf_cli.schema import *  # noqa: F401,F403  (the schema's __all__)

__all__ = list(_schema.__all__)
