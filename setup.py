"""Build hook: compiles the xmc_tf op library during `pip install`.

All metadata lives in pyproject.toml.  The op library is a plain TensorFlow
custom-op shared object, not a CPython extension; it is declared as an
Extension only so that setuptools builds a platform wheel and copies it in
place for editable installs.  The compile itself is tools/build_ops.py
(g++ with tf.sysconfig flags, and nvcc when available: see that file for the
XMC_TF_CUDA* environment variables).  With XMC_TF_PREBUILT_LIBRARY=PATH a
library that script built already is copied instead (no compiler).  Either
way the library's TensorFlow version must be the one pyproject.toml pins,
so a wheel always requires the TensorFlow it was built against.
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
        # The build record (TF version, CUDA) is embedded in the .so.
        output = self.get_ext_fullpath(ext.name)
        prebuilt = os.environ.get("XMC_TF_PREBUILT_LIBRARY")
        if prebuilt:
            info = build_ops.copy_prebuilt(prebuilt, output)
        else:
            info = build_ops.build(output)
        build_ops.check_pin(info, output)


setup(ext_modules=[Extension("xmc_tf._xmc_ops", sources=[])],
      cmdclass={"build_ext": BuildOps})
