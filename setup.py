"""Build hook: compiles the xmc_tf op library during `pip install`.

All metadata lives in pyproject.toml.  The op library is a plain TensorFlow
custom-op shared object, not a CPython extension; it is declared as an
Extension only so that setuptools builds a platform wheel and copies it in
place for editable installs.  The compile itself is tools/build_ops.py
(g++ with tf.sysconfig flags, and nvcc when available: see that file for the
XMC_TF_CUDA* environment variables).
"""

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "tools"))
import build_ops  # noqa: E402


class BuildOps(build_ext):
    """Runs tools/build_ops.py instead of the default extension compiler."""

    def build_extension(self, ext):
        # Writes the .so and, beside it, _build_info.json (TF version, CUDA).
        build_ops.build(self.get_ext_fullpath(ext.name))


setup(ext_modules=[Extension("xmc_tf._xmc_ops", sources=[])],
      cmdclass={"build_ext": BuildOps})
