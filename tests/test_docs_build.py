"""The documentation site builds offline with no warning, and every public
name of xmc_tf has an API reference entry.

Runs the build command that README.md names (Sphinx: MyST pages, autodoc +
napoleon for the API reference, ``-W``: a warning -- a docstring whose
markup does not parse, a reference to an object or page that does not
exist -- fails the build) into a temporary directory, in a fresh
interpreter with the repository root first on ``sys.path``.  Nothing is
fetched: ``docs/conf.py`` uses no intersphinx.  Then reads the inventory
the build wrote (``objects.inv``) and checks that every name of the
``__all__`` of every public module (the modules of ``docs/api/``) is
documented there, under its own path or as the same object under another
public path (``xmc_tf.job.ExtremeClassifier`` is
``xmc_tf.ExtremeClassifier``).
"""

import importlib
import os
import re
import subprocess
import sys
import zlib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
API = os.path.join(ROOT, "docs", "api")

pytest.importorskip("sphinx")  # the "test" extra installs it (and myst)
pytest.importorskip("myst_parser")


def readme_build_command():
    """The README's documentation build command, as a list of words."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    match = re.search(r"```bash\n(\.venv/bin/python -m sphinx [^\n]+)\n```",
                      readme)
    assert match, "README.md names no `python -m sphinx` build command"
    return match.group(1).split()


def public_modules():
    """The modules of the API reference pages (``.. automodule::`` of
    ``docs/api/*.rst`` but the internals page)."""
    names = []
    for page in sorted(os.listdir(API)):
        if page.endswith(".rst") and page != "internals.rst":
            with open(os.path.join(API, page), encoding="utf-8") as f:
                names += re.findall(r"^\.\. automodule:: (\S+)", f.read(),
                                    re.M)
    return names


def read_inventory(path):
    """``{name: role}`` of a Sphinx ``objects.inv`` (version 2)."""
    with open(path, "rb") as f:
        for _ in range(4):
            f.readline()
        text = zlib.decompress(f.read()).decode("utf-8")
    out = {}
    for line in text.splitlines():
        match = re.match(r"(.+?)\s+(\S+):(\S+)\s+(-?\d+)\s+(\S*)\s+(.*)",
                         line)
        if match and match.group(2) == "py":
            out[match.group(1)] = match.group(3)
    return out


def _resolve(name):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        try:
            for attr in parts[i:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return None
        return obj
    return None


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("html")
    words = readme_build_command()
    assert words[:3] == [".venv/bin/python", "-m", "sphinx"] and "-W" in words
    assert words[-2:] == ["docs", "docs/_build/html"], words
    command = [sys.executable] + words[1:-1] + [str(out)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]),
        TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    proc = subprocess.run(command, cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, (
        f"the documentation build failed (rc {proc.returncode}):\n"
        + "\n".join(line for line in (proc.stdout + proc.stderr).splitlines()
                    if "WARNING" in line or "ERROR" in line
                    or "Exception" in line)[-8000:])
    return out


def test_docs_build_without_warnings(built):
    for page in ("index.html", "api/index.html", "architecture.html",
                 "guide/index.html", "results/index.html",
                 "notes/index.html"):
        assert (built / page).exists(), page


def test_every_public_name_has_a_reference_entry(built):
    inventory = read_inventory(built / "objects.inv")
    documented = {}
    for name in inventory:
        obj = _resolve(name)
        if obj is not None:
            documented.setdefault(id(obj), name)
    missing = []
    modules = public_modules()
    assert {"xmc_tf", "xmc_tf.layers", "xmc_tf.losses", "xmc_tf.samplers",
            "xmc_tf.models", "xmc_tf.data", "xmc_tf.job"} <= set(modules)
    for module_name in modules:
        module = importlib.import_module(module_name)
        assert module_name in inventory, f"no page for {module_name}"
        for name in getattr(module, "__all__", []):
            full = f"{module_name}.{name}"
            obj = getattr(module, name)
            if full in inventory or id(obj) in documented:
                continue
            if isinstance(obj, type(sys)) and obj.__name__ in inventory:
                continue  # a submodule listed in __all__ (xmc_tf.layers)
            missing.append(full)
    assert not missing, f"public names without a reference entry: {missing}"


def test_every_public_package_has_an_api_page():
    """A new public subpackage of xmc_tf gets its page in docs/api/."""
    import xmc_tf
    modules = set(public_modules())
    for name in xmc_tf.__all__:
        obj = getattr(xmc_tf, name)
        if isinstance(obj, type(sys)):
            assert obj.__name__ in modules, f"docs/api/ lacks {obj.__name__}"
