"""Loading a script of the repository (benchmarks/, configs/) as a module
in the tests: they are files, not packages on the import path."""

import importlib.util
import os

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_repo_module(relative_path: str, name: str):
    """The module of ``REPO/relative_path``, executed, named ``name``."""
    spec = importlib.util.spec_from_file_location(
        name, os.path.join(REPO, relative_path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
