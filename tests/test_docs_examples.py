"""Every ```python block of README.md and docs/**/*.md runs, and its asserts hold.

Blocks are found by their fence (```python; shell blocks are ```bash or
plain and are not run, nor are ```text blocks).  Each block is executed on
its own, in a fresh namespace, with a temporary directory as the working
directory (what an example writes stays there) and the repository root on
``sys.path``, like a user running it from a checkout; the examples state
their claims as ``assert`` statements.  Three kinds of block need more:

* a block whose first line is ``# with ... from the block above`` continues
  an earlier block of the same page: it runs in the namespace left by the
  nearest block above it without that line (which is run first), so a page
  can set up its data once and show each technique in a few lines;
* a block whose first line is ``# NAME.py`` is a file of a script: it is
  written to the temporary directory and the script is run in a fresh
  interpreter from the repository root with the arguments in
  :data:`SCRIPT_RUNS` (``tf.distribute.MultiWorkerMirroredStrategy`` must
  be created before TensorFlow initialises, which pytest's process has
  long done);
* a block that reads ``workdir/quickstart`` (the serving example)
  runs where ``workdir/quickstart`` holds a finished quick-start run
  (``xmc-tf train --config=configs/quickstart.py``; one small epoch),
  trained here.

Also checked: the README's test command is the one ``.ci/run`` runs.
"""

import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = ["README.md"] + sorted(
    os.path.relpath(os.path.join(folder, f), ROOT)
    for folder, dirs, files in os.walk(os.path.join(ROOT, "docs"))
    if "_build" not in os.path.relpath(folder, ROOT).split(os.sep)
    for f in files if f.endswith(".md"))

#: First line of a block that continues the block above it (see the module
#: docstring).
CONTINUED = re.compile(r"#\s*with\b.*\bfrom the block above\s*$")

#: Script blocks (``# NAME.py`` first line) -> the command-line arguments
#: of their test run (small: a few seconds on 2 cores).
SCRIPT_RUNS = {
    "train_mw.py": ["synthetic:num_instances=640,num_features=300,"
                    "num_labels=100,labels_per_instance=3", "3"],
}


def python_blocks(rel):
    """``[(line, code)]`` of the ```python blocks of ``rel`` (1-based line
    of the opening fence)."""
    blocks, code, start = [], None, 0
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            stripped = line.strip()
            if code is None:
                if stripped == "```python":
                    code, start = [], number
            elif stripped.startswith("```"):
                blocks.append((start, "".join(code)))
                code = None
            else:
                code.append(line)
    assert code is None, f"{rel}:{start}: unclosed ```python block"
    return blocks


def _script_name(code):
    match = re.match(r"#\s*([\w.]+\.py)\b", code)
    return match.group(1) if match else None


def _continued(code):
    return bool(CONTINUED.match(code.split("\n", 1)[0]))


BLOCKS = [(rel, line, code) for rel in DOCS
          for line, code in python_blocks(rel)]


def _base_block(rel, line):
    """The code of the block a continued block at ``rel:line`` runs after."""
    base = None
    for other_rel, other_line, code in BLOCKS:
        if other_rel == rel and other_line < line and not _continued(code):
            base = code
    assert base is not None, f"{rel}:{line}: no block above to continue"
    return base
SCRIPTS = {name: code for _, _, code in BLOCKS
           if (name := _script_name(code))}


def test_every_doc_with_python_has_blocks_found():
    """The fence parser sees the blocks (a test of the harness itself)."""
    found = {rel for rel, _, _ in BLOCKS}
    fences = 0
    for rel in DOCS:
        with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
            text = f.read()
        if "```python" in text:
            assert rel in found, rel
        fences += sum(line.strip() == "```python"
                      for line in text.splitlines())
    # Every fence is a block (20 when the guide was written: README 7,
    # docs/guide 13 or more, the lab notes 6).
    assert len(BLOCKS) == fences >= 20
    assert any(rel.startswith(os.path.join("docs", "guide")) for rel in found)
    assert set(SCRIPT_RUNS) <= set(SCRIPTS), (
        f"SCRIPT_RUNS names scripts no doc has: {set(SCRIPT_RUNS) - set(SCRIPTS)}")


@pytest.fixture(scope="module")
def quickstart_dir(tmp_path_factory):
    """A directory holding ``workdir/quickstart``: the quick start trained
    for one epoch, with a narrower encoder and intermediate layer (4 s
    instead of 10; the example reads any such run)."""
    from xmc_tf_cli import cli
    base = tmp_path_factory.mktemp("quickstart")
    code = cli.main([
        "xmc-tf", "train",
        f"--config={os.path.join(ROOT, 'configs', 'quickstart.py')}",
        f"--workdir={base / 'workdir' / 'quickstart'}",
        "--config.train.epochs=1", "--config.train.verbose=0",
        "--config.model.encoder_dims=(128,)",
        "--config.model.intermediate_dim=256"])
    assert code == 0
    return base


@pytest.mark.parametrize("rel,line,code", BLOCKS,
                         ids=[f"{rel}:{line}" for rel, line, _ in BLOCKS])
def test_python_block(rel, line, code, tmp_path, monkeypatch, request):
    name = _script_name(code)
    if name is not None:
        if name not in SCRIPT_RUNS:
            # A module the scripts import (e.g. multi_worker_fixes.py): it
            # must at least be valid, importable-looking Python.
            compile(code, f"{rel}:{line}", "exec")
            assert any(f"from {name[:-3]} import" in other or
                       f"import {name[:-3]}" in other
                       for other in SCRIPTS.values()), (
                f"{rel}:{line}: script {name} is neither run (SCRIPT_RUNS) "
                "nor imported by a script that is")
            return
        _run_script(name, tmp_path)
        return
    cwd = tmp_path
    if "workdir/quickstart" in code:
        cwd = request.getfixturevalue("quickstart_dir")
    monkeypatch.chdir(cwd)
    monkeypatch.syspath_prepend(ROOT)
    namespace = {"__name__": "__doc_example__"}
    if _continued(code):
        exec(compile(_base_block(rel, line), f"{rel} (block above {line})",
                     "exec"), namespace)
    exec(compile(code, f"{rel}:{line}", "exec"), namespace)


def _run_script(name, tmp_path):
    for script, code in SCRIPTS.items():
        (tmp_path / script).write_text(code, encoding="utf-8")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT] + [
        p for p in [env.get("PYTHONPATH")] if p])
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)  # one worker
    env["CUDA_VISIBLE_DEVICES"] = ""
    proc = subprocess.run(
        [sys.executable, str(tmp_path / name)] + SCRIPT_RUNS[name],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (
        f"{name} exited {proc.returncode}\n--- stdout ---\n"
        f"{proc.stdout[-3000:]}\n--- stderr ---\n{proc.stderr[-6000:]}")


def test_readme_test_command_is_the_one_ci_runs():
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    match = re.search(r"Run the tests[^\n]*\n\n```bash\n([^\n]+)\n```", readme)
    assert match, "README.md: no 'Run the tests' command block"
    command = match.group(1).strip()
    assert command == ".venv/bin/pytest -rs tests"
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line.strip() for line in f]
    assert command in ci
    # ... run with a missing op failing, not skipping.
    assert "export XMC_TF_REQUIRE_OPS=1" in ci[:ci.index(command)]


def test_readme_wheel_install_is_the_one_ci_runs():
    """The README's install-from-the-wheel line is run verbatim by .ci/run
    (in a folder holding only the wheel, with no compiler usable)."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        readme = f.read()
    # in a ```bash block, or inline code in the text
    lines = [line.strip() for block in re.findall(r"```bash\n(.*?)```",
                                                  readme, re.S)
             for line in block.splitlines() if ".whl" in line]
    lines += [" ".join(span.split()) for span in re.findall(
        r"(?<!`)`([^`]*pip install[^`]*\.whl[^`]*)`(?!`)", readme)]
    assert lines, "README.md: no install-from-the-wheel command"
    with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as f:
        ci = [line.strip() for line in f]
    for line in lines:
        assert line in ci, f".ci/run does not run {line!r}"
