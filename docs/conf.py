"""Sphinx configuration of the xmc_tf documentation.

Build (offline, warnings are errors; the test suite runs the same command in
``tests/test_docs_build.py``)::

    .venv/bin/python -m sphinx -W --keep-going -b html docs docs/_build/html

The pages are Markdown (MyST); the API reference (``docs/api/``) is
generated from the docstrings by autodoc + napoleon (Google style).
"""

import os
import sys

from sphinx.ext import napoleon
from sphinx.util.nodes import make_refnode

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

project = "xmc_tf"
author = "xmc_tf authors"
copyright = "xmc_tf authors"  # noqa: A001  (Sphinx's name)
release = version = "0.1.0"

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "README.md"]
html_theme = "alabaster"
html_static_path = []
html_theme_options = {"nosidebar": False}

# Cross-references: a reference to an xmc_tf object that does not exist is a
# warning (an error under -W).  Names of other libraries (TensorFlow, Keras,
# NumPy, SciPy, ...) are not documented here and intersphinx would need the
# network: they are not checked.
nitpicky = True
nitpick_ignore_regex = [
    (r"py:.*", r"(tf|tensorflow|keras|np|numpy|scipy|sp|faiss|ml_collections"
               r"|absl|collections|typing|os|pathlib|dataclasses|concurrent"
               r"|contextlib|threading|enum|abc|json|io)(\..*)?"),
    (r"py:.*", r"(optional|callable|int|float|str|bool|bytes|dict|list|tuple"
               r"|set|object|None|Any|Callable|Sequence|Mapping|Iterable"
               r"|Iterator|type|array-like|array_like|ndarray)"),
]

autodoc_default_options = {
    "members": True,
    "show-inheritance": True,
    "member-order": "bysource",
}
autodoc_typehints = "signature"
# An override without a docstring of its own (``from_config``) shows none
# rather than Keras' (whose markup is not napoleon's).
autodoc_inherit_docstrings = False
autodoc_mock_imports = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# "Attributes:" sections as fields: the attributes that autodoc documents
# as members too (named tuple fields, properties) are not described twice.
napoleon_use_ivar = True
# Sections of the docstrings beyond napoleon's own: argument-like lists.
napoleon_custom_sections = [
    ("Call arguments", "params_style"),
    ("Extra call arguments", "params_style"),
    ("Members", "params_style"),
    ("Methods", "params_style"),
]

myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence"]
suppress_warnings = []


def _public_bases(app, name, obj, options, bases):
    """Show-inheritance lists public bases only: a private base
    (``_MultiLabelLoss``) is replaced by its own bases, recursively."""
    out = []
    for base in bases:
        if getattr(base, "__name__", "").startswith("_"):
            _public_bases(app, name, obj, options, list(base.__bases__))
            out.extend(b for b in base.__bases__ if b not in out)
        elif base not in out:
            out.append(base)
    bases[:] = out


def _napoleon_except_attributes(app, what, name, obj, options, lines):
    """Napoleon, but not on attribute docstrings: ``#: 16 MiB: ...`` is a
    description, not napoleon's ``type: description``."""
    if what not in ("attribute", "data", "property"):
        napoleon._process_docstring(app, what, name, obj, options, lines)


def _resolve_short_names(app, env, node, contnode):
    """A Python reference by a short name (``:func:`read_xc```, written in a
    module that imports it from elsewhere) resolves to the one documented
    object of that name, as Sphinx does for ``.read_xc``; the public path
    (fewest dots) wins when the object is documented twice.  A name with
    no object (a stale reference) stays a warning."""
    if node.get("refdomain") != "py":
        return None
    target = node["reftarget"].lstrip("~.")
    domain = env.get_domain("py")
    matches = domain.find_obj(env, node.get("py:module"), node.get("py:class"),
                              target, node.get("reftype"), 1)
    if not matches:
        return None
    name, obj = min(matches, key=lambda m: (m[0].count("."), m[0]))
    return make_refnode(app.builder, node["refdoc"], obj.docname,
                        obj.node_id, contnode, name)


def setup(app):
    app.connect("autodoc-process-bases", _public_bases)
    for listener in list(app.events.listeners["autodoc-process-docstring"]):
        if listener.handler is napoleon._process_docstring:
            app.disconnect(listener.id)
    app.connect("autodoc-process-docstring", _napoleon_except_attributes)
    app.connect("missing-reference", _resolve_short_names)
