"""Runs the op fuzz targets of ``op_fuzz.py``, each in a child process.

A kernel that crashes (segfault, abort) kills only the child: the test then
fails naming the target, the signal and the last ``CASE`` line the child
printed (the example that crashed), with the child's native traceback
(``faulthandler``).  A property failure shows hypothesis' shrunk example.

``XMC_TF_FUZZ_OP_EXAMPLES`` (default 60) sets the examples per property;
the op library under test is the one ``XMC_TF_LIBRARY_PATH`` or the
package points to (the environment is inherited).
"""

import os
import subprocess
import sys

import pytest

import op_fuzz
from op_requirements import skip_or_fail

RUNNER = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                      "op_fuzz.py")
EXAMPLES = int(os.environ.get("XMC_TF_FUZZ_OP_EXAMPLES", "60"))


@pytest.mark.parametrize("target", sorted(op_fuzz.TARGETS))
def test_op_fuzz_target(target):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    root = os.path.dirname(os.path.dirname(os.path.dirname(RUNNER)))
    env["PYTHONPATH"] = os.pathsep.join(
        [root] + [p for p in [env.get("PYTHONPATH")] if p])
    proc = subprocess.run([sys.executable, RUNNER, target, str(EXAMPLES)],
                          capture_output=True, text=True, env=env,
                          timeout=900, cwd=root)
    if proc.returncode == op_fuzz.SKIP:
        skip_or_fail(proc.stdout.strip().splitlines()[-1])
    cases = [ln for ln in proc.stdout.splitlines() if ln.startswith("CASE ")]
    last = cases[-1] if cases else "(none started)"
    if proc.returncode < 0:
        how = f"killed by signal {-proc.returncode}"
    else:
        how = f"exit code {proc.returncode}"
    assert proc.returncode == 0, (
        f"op fuzz target {target!r}: {how} after {len(cases)} cases; last "
        f"case: {last}\n--- stdout (tail) ---\n{proc.stdout[-3000:]}\n"
        f"--- stderr (tail) ---\n{proc.stderr[-6000:]}")
    assert "PASSED" in proc.stdout
