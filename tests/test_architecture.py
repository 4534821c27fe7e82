"""The package's layering holds: ``lint-imports`` (import-linter) keeps the
contracts of ``[tool.importlinter]`` in pyproject.toml -- the library never
imports the job (``xmc_tf.job``, ``xmc_tf.config``), reads no field of the
job's config (``tools/import_contracts.py``), and the library's subpackages
import only the layers below them; ``import xmc_tf.layers`` loads no job
module.

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
             "The library reads no field of the job's config",
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


def _contract_options(contract_id: str) -> dict:
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        contracts = tomllib.load(f)["tool"]["importlinter"]["contracts"]
    (options,) = [c for c in contracts if c["id"] == contract_id]
    return options


def test_config_contract_lists_every_config_section():
    """The sections the contract looks for are those of every head's
    config: a new section cannot slip past it."""
    import ml_collections
    from xmc_tf import config as xconfig
    sections = set()
    for head in xconfig.HEAD_DEFAULTS:
        sections |= {k for k, v in xconfig.base(head).items()
                     if isinstance(v, ml_collections.ConfigDict)}
    options = _contract_options("library-no-job-config")
    assert set(options["config_sections"]) == sections
    assert set(options["source_modules"]) == set(
        _contract_options("library-not-job")["source_modules"])


def test_config_contract_breaks_on_a_config_read(tmp_path, monkeypatch):
    """The contract type reports each kind of read in a made-up package
    (and keeps a module with none)."""
    pytest.importorskip("importlinter")
    sys.path.insert(0, ROOT)
    try:
        from tools.import_contracts import NoJobConfigContract
    finally:
        sys.path.remove(ROOT)
    pkg = tmp_path / "fake_xmc_pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "clean.py").write_text(
        "def get_config(self, config):\n    return config['model']\n"
        "# config.model in a comment\nDOC = 'config.sampler.kind'\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "reads.py").write_text(
        "import ml_collections\n"
        "from xmc_tf.config import auto_bool\n"
        "def make(sampler_config):\n    return sampler_config.kind\n"
        "def build(config):\n    return config.model.width\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    options = _contract_options("library-no-job-config")

    def check(modules):
        contract = NoJobConfigContract(
            "t", {}, {**{k: v for k, v in options.items()
                         if k not in ("id", "name", "type")},
                      "source_modules": modules})
        return contract.check(None, False)

    assert check(["fake_xmc_pkg.clean"]).kept
    result = check(["fake_xmc_pkg"])
    assert not result.kept
    (found,) = result.metadata["reads"].values()
    assert found == [(1, "import ml_collections"), (2, "name auto_bool"),
                     (3, "name sampler_config"), (4, "name sampler_config"),
                     (6, "config.model")]


def test_library_import_loads_no_job_module():
    """``import xmc_tf.layers`` (and ``import xmc_tf``) load no module of the
    job; ``xmc_tf.ExtremeClassifier`` is imported at its first use."""
    code = ("import sys, xmc_tf.layers\n"
            "job = sorted(m for m in sys.modules if m.startswith('xmc_tf.job'))\n"
            "assert not job, job\n"
            "import xmc_tf\n"
            "assert 'ExtremeClassifier' in dir(xmc_tf)\n"
            "from xmc_tf import ExtremeClassifier\n"
            "assert ExtremeClassifier.__module__ == 'xmc_tf.job.classifier'\n"
            "assert 'xmc_tf.job.classifier' in sys.modules\n"
            "try:\n    xmc_tf.NoSuchThing\n"
            "except AttributeError:\n    pass\n"
            "else:\n    raise AssertionError('no AttributeError')\n")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _sources(package: str):
    for directory, _, files in os.walk(os.path.join(ROOT, package)):
        for name in sorted(files):
            if name.endswith(".py"):
                yield os.path.join(directory, name)


def test_no_module_is_loaded_from_its_file_path():
    """The packages import their modules normally (no
    ``spec_from_file_location`` trick to dodge ``xmc_tf/__init__``)."""
    hits = [path for package in ("xmc_tf", "xmc_tf_cli")
            for path in _sources(package)
            if "spec_from_file_location" in open(path, encoding="utf-8").read()]
    assert not hits, hits


def test_the_command_line_package_imports_no_tensorflow_at_module_level():
    """``xmc_tf_cli`` (schema, TF_CONFIG check, argument parsing) imports
    neither TensorFlow, keras nor the ``xmc_tf`` package at the top of any
    module: the commands import them when they run."""
    import ast
    bad = []
    for path in _sources("xmc_tf_cli"):
        tree = ast.parse(open(path, encoding="utf-8").read())
        for node in tree.body:  # module level only
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            bad += [(os.path.relpath(path, ROOT), n) for n in names
                    if n.split(".")[0] in ("tensorflow", "keras", "xmc_tf")]
    assert not bad, bad


def test_job_functions_are_at_most_60_lines():
    """No function of the job (``xmc_tf/job``) is longer than 60 lines,
    docstring included: a longer one holds more than one step."""
    import ast
    long = []
    for path in _sources(os.path.join("xmc_tf", "job")):
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > 60:
                    long.append((os.path.relpath(path, ROOT), node.name, n))
    assert not long, long
