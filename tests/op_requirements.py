"""Tests that need ops of the compiled library: skip, or fail under CI.

A test that needs a custom op the op library lacks (not built, built
without an op family, or for another TensorFlow) is skipped with the reason
when a developer runs the suite on a partial build.  With the environment
variable ``XMC_TF_REQUIRE_OPS=1`` (set by ``.ci/run``, which builds every
family) the same test FAILS with that reason instead, so CI cannot pass
with a library that silently lost an op.  ``pytest -rs`` lists every skip
and its reason.  GPU tests (``tests/gpu``) do not use this: they skip
without a GPU whatever the variable says.

Use, in a test module (``tests/`` is on ``sys.path`` through
``tests/conftest.py``)::

    from op_requirements import needs_ops
    pytestmark = needs_ops("xmc_mach_top_k")      # or on single tests

or, when the module itself touches the ops at import time,
``require_ops_for_module("xmc_lsh_query")`` before that code.
"""

from __future__ import annotations

import os

import pytest

#: The environment variable that turns a missing op into a failure.
REQUIRE_ENV = "XMC_TF_REQUIRE_OPS"


def ops_required() -> bool:
    """Whether ``XMC_TF_REQUIRE_OPS`` is set to a true value (1/true/yes)."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in (
        "1", "true", "yes", "on")


def missing_ops(*op_names: str) -> str | None:
    """Why the op library cannot run ``op_names``, or None when it can.

    Args:
      op_names: snake-case op wrappers of the library
        (``"xmc_mach_top_k"`` for ``Xmc>MachTopK``).

    Returns:
      None, or one line: the loader's error, or the missing ops.
    """
    from xmc_tf.errors import OpLibraryError
    from xmc_tf.ops import _loader
    try:
        library = _loader.load()
    except OpLibraryError as e:
        return f"xmc_tf op library not available: {e}"
    missing = [name for name in op_names if not hasattr(library, name)]
    if missing:
        return (f"op library built without {', '.join(missing)}: rebuild it "
                "(pip install -e ., or python tools/build_ops.py; "
                "XMC_TF_LIBRARY_PATH picks another build)")
    return None


def skip_or_fail(reason: str, module_level: bool = False):
    """Skips with ``reason``, or fails with it under ``XMC_TF_REQUIRE_OPS``.

    Raises:
      pytest.skip.Exception or pytest.fail.Exception (always).
    """
    if ops_required():
        pytest.fail(f"{REQUIRE_ENV}=1 and {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=module_level)


def needs_ops(*op_names: str):
    """The mark ``pytest.mark.needs_ops(*op_names)``: before each marked
    test, ``tests/conftest.py`` skips it (or fails it, under
    ``XMC_TF_REQUIRE_OPS=1``) when :func:`missing_ops` gives a reason."""
    return pytest.mark.needs_ops(*op_names)


def require_ops_for_module(*op_names: str) -> None:
    """At a test module's top level: skip the whole module (or fail its
    collection under ``XMC_TF_REQUIRE_OPS=1``) when ops are missing."""
    reason = missing_ops(*op_names)
    if reason is not None:
        skip_or_fail(reason, module_level=True)
