"""The results pages, the README's results table and the figures are what
``tools/results_docs.py`` makes of ``benchmarks/results/*.json`` now.

A JSON file changed without rerunning the script (or a page edited by
hand) fails here: the pages and the table are compared as text; each
figure is checked against the SHA-256 of the JSON files it was drawn from
(``docs/results/figures/sources.json``), so drawing them needs matplotlib
only where they are regenerated, not here.  The fix is
``python tools/results_docs.py``.
"""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _script():
    spec = importlib.util.spec_from_file_location(
        "results_docs", os.path.join(ROOT, "tools", "results_docs.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_pages_table_and_figures_are_current():
    stale = _script().check()
    assert not stale, ("stale (run `python tools/results_docs.py`): "
                       + ", ".join(stale))


def test_readme_table_lists_ours_and_the_peers():
    script = _script()
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    table = readme[readme.index(script.BEGIN):readme.index(script.END)]
    result = script.load("real_data.json")
    for key, ds in result["datasets"].items():
        assert f"{ds['mean']['P@1']:.2f}" in table, key
        for peer in ds["peers"]:
            assert f"{peer['P@1']:.2f}" in table, (key, peer["method"])
