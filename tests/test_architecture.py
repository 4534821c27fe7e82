"""The package's layering holds: ``lint-imports`` (import-linter) keeps the
contracts of ``[tool.importlinter]`` in pyproject.toml -- the library never
imports the job (``xmc_tf.job``, ``xmc_tf.config``) but
for the listed imports that are to go, and the library's subpackages import
only the layers below them.

Runs the ``lint-imports`` console script installed beside the interpreter
(or, without it, the same command through import-linter's Python API; not
``python -m importlinter.cli``, which has no ``__main__`` and checks
nothing) from the repository root, without its cache.
"""

import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONTRACTS = ["The library never imports the job",
             "Library layers: each imports only the layers below it"]


def _command() -> list:
    script = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    if os.path.exists(script):
        return [script, "--no-cache"]
    pytest.importorskip("importlinter")  # the "test" extra installs it
    return [sys.executable, "-c",
            "import sys; from importlinter.cli import lint_imports; "
            "sys.exit(lint_imports(no_cache=True))"]


def test_import_contracts_are_kept():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(
            os.pathsep) if p]))
    proc = subprocess.run(_command(), cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, "lint-imports failed:\n" + output
    for name in CONTRACTS:  # both checked (not, say, an empty config)
        assert f"{name} KEPT" in output, output
    assert "0 broken" in output, output
