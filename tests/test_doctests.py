"""The ``>>>`` examples of every xmc_tf module run as doctests.

One test per module that has examples (found by importing every ``.py``
module of the package, ``__main__`` aside, which runs the command line),
run with ``doctest`` in the module's namespace, ``ELLIPSIS`` and
``NORMALIZE_WHITESPACE``, from a temporary working directory.  A failed
example fails the test with doctest's report.  Examples that use the op
library fail too; only when the library is missing altogether (a
developer's partial build) is the module skipped, or failed with
``XMC_TF_REQUIRE_OPS=1`` (``tests/op_requirements.py``).  Examples that use
faiss (an extra, installed with ``.[test]``) need it.
"""

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import xmc_tf
import xmc_tf_cli
from op_requirements import missing_ops, skip_or_fail

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE

#: Modules whose examples need an optional package.
NEEDS = {"xmc_tf.callbacks": "faiss", "xmc_tf.samplers.ann": "faiss",
         "xmc_tf.samplers.mixture": "faiss"}


def _modules():
    names = []
    for info in [*pkgutil.walk_packages(xmc_tf.__path__, "xmc_tf."),
                 *pkgutil.walk_packages(xmc_tf_cli.__path__, "xmc_tf_cli.")]:
        if info.name.endswith("__main__"):
            continue
        spec = importlib.util.find_spec(info.name)
        if spec is None or not (spec.origin or "").endswith(".py"):
            continue  # the compiled op library
        names.append(info.name)
    return sorted(names)


def _tests(name):
    module = importlib.import_module(name)
    return [t for t in doctest.DocTestFinder().find(module, name)
            if t.examples]


MODULES = [name for name in _modules() if _tests(name)]


def test_modules_with_examples_are_found():
    # 44 when this was written; a drop means the discovery broke.
    assert len(MODULES) >= 40, MODULES
    assert {"xmc_tf.layers.uniform_sparse", "xmc_tf.losses.hinge",
            "xmc_tf.ops.mach", "xmc_tf.initializers", "xmc_tf_cli.schema",
            "xmc_tf_cli.tf_config"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name, tmp_path, monkeypatch):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name])
    monkeypatch.chdir(tmp_path)
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    report = []
    for test in _tests(name):
        runner.run(test, out=report.append)
    result = runner.summarize(verbose=False)
    assert result.attempted > 0, f"{name}: every example is skipped"
    if result.failed:
        reason = missing_ops()
        if reason is not None:
            skip_or_fail(f"{name} examples: {reason}")
        pytest.fail(f"{result.failed} of {result.attempted} examples of "
                    f"{name} failed:\n" + "".join(report), pytrace=False)
