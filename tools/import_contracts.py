"""An import-linter contract type: library modules that know nothing of the
job's config.

``lint-imports`` (pyproject.toml, ``[tool.importlinter]``) keeps the import
contracts; this one goes further than imports, because a module can read the
job's config without importing it (a function handed ``config.sampler``
reads ``sampler_config.num_negatives``).  For every module of
``source_modules`` (and their submodules) it parses the source with
:mod:`ast`, without importing it, and reports:

* a name in ``forbidden_names`` used as a name, attribute, argument or
  imported name (``AUTO``, ``auto_bool``, ``sampler_config``);
* an import of a module in ``forbidden_imports`` (``ml_collections``);
* an attribute read ``config.<section>`` of a name in ``config_names``,
  where ``<section>`` is one of ``config_sections`` (``config.sampler``,
  ``config.model``).

Strings and docstrings are not code and are not read.  Registered in
pyproject.toml as ``contract_types = ["no_job_config:
tools.import_contracts.NoJobConfigContract"]`` (``lint-imports`` puts the
working directory on ``sys.path``; run it from the repository root).
"""

from __future__ import annotations

import ast
import importlib.util
import os

from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck
from importlinter.application import output

__all__ = ["NoJobConfigContract", "config_reads"]


def config_reads(source: str, forbidden_names, forbidden_imports,
                 config_names, config_sections) -> list[tuple[int, str]]:
    """The job-config reads in one module's source.

    Args:
      source: the module's Python source.
      forbidden_names: identifiers the module must not use.
      forbidden_imports: top-level modules it must not import.
      config_names: names whose ``.<section>`` attribute is a config read.
      config_sections: the config's section names.

    Returns:
      ``[(line, what)]``, sorted by line; empty when the module reads none.

    >>> config_reads("def f(sampler_config): return config.model.x",
    ...              {"sampler_config"}, set(), {"config"}, {"model"})
    [(1, 'config.model'), (1, 'name sampler_config')]
    >>> config_reads("def get_config(self, config): return config['a']",
    ...              set(), set(), {"config"}, {"model"})
    []
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        names = []
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.arg):
            names = [node.arg]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
            base = node.value
            if (isinstance(base, ast.Name) and base.id in config_names
                    and node.attr in config_sections):
                found.append((node.lineno, f"{base.id}.{node.attr}"))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            modules = ([a.name for a in node.names]
                       if isinstance(node, ast.Import) else [node.module or ""])
            for module in modules:
                if module.split(".")[0] in forbidden_imports:
                    found.append((node.lineno, f"import {module}"))
            if isinstance(node, ast.ImportFrom):
                names = [a.asname or a.name for a in node.names]
        for name in names:
            if name in forbidden_names:
                found.append((node.lineno, f"name {name}"))
    return sorted(set(found))


def _module_files(module: str) -> list[str]:
    """The source files of ``module`` and, for a package, its submodules,
    found from the top-level package's folder (importing nothing: the
    package's ``__init__`` loads TensorFlow)."""
    top, *parts = module.split(".")
    spec = importlib.util.find_spec(top)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"no package {top!r}")
    path = os.path.join(list(spec.submodule_search_locations)[0], *parts)
    if os.path.isfile(path + ".py"):
        return [path + ".py"]
    if not os.path.isfile(os.path.join(path, "__init__.py")):
        raise ValueError(f"no module {module!r} (looked for {path})")
    paths = []
    for directory, dirs, files in os.walk(path):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "__")))
        paths += [os.path.join(directory, f) for f in sorted(files)
                  if f.endswith(".py")]
    return paths


class NoJobConfigContract(Contract):
    """Library modules read no field of the job's config (see the module
    docstring for what counts as a read)."""

    source_modules = fields.ListField(subfield=fields.StringField())
    forbidden_names = fields.ListField(subfield=fields.StringField())
    forbidden_imports = fields.ListField(subfield=fields.StringField())
    config_names = fields.ListField(subfield=fields.StringField())
    config_sections = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        del graph, verbose  # reads source, not the import graph
        reads = {}
        for module in self.source_modules:
            for path in _module_files(module):
                with open(path, encoding="utf-8") as f:
                    found = config_reads(
                        f.read(), set(self.forbidden_names),
                        set(self.forbidden_imports), set(self.config_names),
                        set(self.config_sections))
                if found:
                    reads[os.path.relpath(path)] = found
        return ContractCheck(kept=not reads, metadata={"reads": reads})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for path, found in sorted(check.metadata["reads"].items()):
            for line, what in found:
                output.print_error(f"{path}:{line}: {what}", bold=False)
                output.new_line()
