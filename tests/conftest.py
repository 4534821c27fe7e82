"""Suite-wide pytest hooks: the ``needs_ops`` mark (``op_requirements.py``)."""

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from op_requirements import (REQUIRE_ENV, missing_ops,  # noqa: E402
                             ops_required, skip_or_fail)


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "needs_ops(*op_names): needs these ops of the compiled "
        f"library; skipped without them, failed when {REQUIRE_ENV}=1")


def pytest_report_header(config):
    if ops_required():
        return f"{REQUIRE_ENV}=1: a test needing a missing op fails"
    return (f"{REQUIRE_ENV} unset: tests needing a missing op are skipped "
            "(-rs lists them)")


def _missing(item):
    names = [name for mark in item.iter_markers("needs_ops")
             for name in mark.args]
    return missing_ops(*names) if names else None


def pytest_collection_modifyitems(config, items):
    # Skips as marks on the tests: `-rs` then names each test's own file.
    if ops_required():
        return
    for item in items:
        reason = _missing(item)
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_runtest_setup(item):
    reason = _missing(item)
    if reason is not None:
        skip_or_fail(reason)  # fails: XMC_TF_REQUIRE_OPS=1
