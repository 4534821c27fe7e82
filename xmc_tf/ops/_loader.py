"""Loads the compiled xmc_tf op library once per process.

The library (`xmc_tf/_xmc_ops*.so`, built by `pip install .`) holds every op
family.  `load()` is called by `import xmc_tf` so that a SavedModel using our
ops can be loaded afterwards; failures are remembered and re-raised, with the
reason, at the first use of an op.

Set ``XMC_TF_LIBRARY_PATH`` to load a library from another path (a
development build from ``python tools/build_ops.py --output PATH``).
"""

from __future__ import annotations

import glob
import json
import os
import re
import threading

import tensorflow as tf

from xmc_tf.errors import OpLibraryError

_LOCK = threading.Lock()
_MODULE = None
_ERROR = None
_PACKAGE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def library_path() -> str:
    """Path of the op library that `load()` uses.

    Returns:
      ``$XMC_TF_LIBRARY_PATH`` if set, else the `_xmc_ops*.so` inside the
      installed package.

    Raises:
      OpLibraryError: no library file exists.
    """
    env = os.environ.get("XMC_TF_LIBRARY_PATH")
    if env:
        if not os.path.exists(env):
            raise OpLibraryError(f"XMC_TF_LIBRARY_PATH={env} does not exist")
        return env
    found = sorted(glob.glob(os.path.join(_PACKAGE_DIR, "_xmc_ops*.so")))
    if not found:
        raise OpLibraryError(
            "xmc_tf op library not found in "
            f"{_PACKAGE_DIR}: install with `pip install .` (compiles the ops) "
            "or build it with `python tools/build_ops.py`.")
    return found[0]


def build_info(path: str) -> dict:
    """The build record embedded in the library by tools/build_ops.py (or
    by the Bazel build, ``third_party/build_info.bzl``: the same record).

    Args:
      path: the library file.

    Returns:
      ``{"tf_version": str, "cuda": bool, "cuda_archs": str | None}``, or
      ``{}`` for a library built without one.
    """
    with open(path, "rb") as f:
        blob = f.read()
    match = re.search(rb"xmc_tf_build_info:(\{[^\x00]*\})", blob)
    return json.loads(match.group(1)) if match else {}


def load():
    """Loads the op library (once) and returns its generated op module.

    Returns:
      The Python module from `tf.load_op_library`; op ``Xmc>FooBar`` is its
      attribute ``xmc_foo_bar``.

    Raises:
      OpLibraryError: missing library, or built for another TF version (the
        C++ ABI of TensorFlow ops is tied to the exact TF release).
    """
    global _MODULE, _ERROR
    with _LOCK:
        if _MODULE is not None:
            return _MODULE
        if _ERROR is not None:
            raise _ERROR
        try:
            path = library_path()
            built_for = build_info(path).get("tf_version")
            if built_for and built_for != tf.__version__:
                raise OpLibraryError(
                    f"{path} was built for TensorFlow {built_for} but "
                    f"TensorFlow {tf.__version__} is running; reinstall "
                    "xmc_tf (`pip install .`) against this TensorFlow.")
            try:
                _MODULE = tf.load_op_library(path)
            except tf.errors.NotFoundError as e:
                raise OpLibraryError(
                    f"could not load {path}: {e}. If TensorFlow changed since "
                    "xmc_tf was installed, reinstall xmc_tf (`pip install .`)."
                ) from e
        except OpLibraryError as e:
            _ERROR = e
            raise
        return _MODULE
