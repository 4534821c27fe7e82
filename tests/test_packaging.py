"""The package's TensorFlow pin and the op library agree (tools/build_ops.py,
setup.py): the wheel requires the TensorFlow its library was built for.

The wheel itself is built, repaired, installed into a fresh venv without a
compiler and run by ``.ci/run`` (tools/build_wheel.sh, .ci/check_wheel.py,
.ci/serve_from_wheel.py); these tests check the pieces that decide what it
holds.
"""

import os

import pytest
import tensorflow as tf

from repo_module import REPO, load_repo_module
from xmc_tf.ops import _loader

build_ops = load_repo_module("tools/build_ops.py", "build_ops_under_test")


def test_one_tensorflow_pin_the_running_one():
    # build requirement and both extras: one release, the one running here
    # (the test venv is installed from these pins)
    assert build_ops.pinned_tf_version() == tf.__version__


def test_pin_check_refuses_another_release(tmp_path):
    pin = build_ops.pinned_tf_version()
    build_ops.check_pin({"tf_version": pin}, "lib.so")
    with pytest.raises(RuntimeError, match=f"built for TensorFlow 2.0.0 but "
                       f"pyproject.toml pins TensorFlow {pin}"):
        build_ops.check_pin({"tf_version": "2.0.0"}, "lib.so")
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text('requires = ["tensorflow-cpu==2.21.0"]\n'
                         'gpu = ["tensorflow==2.20.0"]\n')
    with pytest.raises(RuntimeError, match="one TensorFlow release"):
        build_ops.pinned_tf_version(str(pyproject))


def test_prebuilt_library_is_copied_with_its_build_record(tmp_path):
    """XMC_TF_PREBUILT_LIBRARY: the library built before is used as is
    (CI packages the library it compiled, without compiling again)."""
    try:
        source = _loader.library_path()
    except Exception as e:  # pragma: no cover - no library built
        pytest.skip(f"no op library: {e}")
    info = build_ops.embedded_build_info(source)
    assert info == _loader.build_info(source) and info["tf_version"]
    out = tmp_path / "pkg" / "_xmc_ops.so"
    assert build_ops.copy_prebuilt(source, str(out)) == info
    assert out.read_bytes() == open(source, "rb").read()
    assert build_ops.copy_prebuilt(str(out), str(out)) == info  # in place
    with pytest.raises(RuntimeError, match="does not exist"):
        build_ops.copy_prebuilt(str(tmp_path / "missing.so"), str(out))
    plain = tmp_path / "plain.so"
    plain.write_bytes(b"\x7fELF no record")
    with pytest.raises(RuntimeError, match="no build record"):
        build_ops.copy_prebuilt(str(plain), str(out))


def test_wheel_scripts_exist_and_ci_runs_them():
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        ci = f.read()
    for name in ("tools/build_wheel.sh", ".ci/check_wheel.py",
                 ".ci/serve_from_wheel.py"):
        assert os.path.exists(os.path.join(REPO, name)), name
        assert name in ci, f".ci/run does not run {name}"


def test_missing_tensorflow_names_the_extras(tmp_path):
    """The wheel installs TensorFlow only through its cpu/gpu extra: without
    it, ``import xmc_tf`` and ``xmc-tf`` say which to install (one line
    from the command, exit status 2)."""
    import subprocess
    import sys
    block = "import sys; sys.modules['tensorflow'] = None; "
    env = dict(os.environ, PYTHONPATH=REPO)
    proc = subprocess.run([sys.executable, "-c", block + "import xmc_tf"],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 1
    assert "pip install 'xmc_tf[cpu]'" in proc.stderr.splitlines()[-1]
    run = ("import xmc_tf_cli; sys.argv = ['xmc-tf', 'train', "
           f"'--config=quickstart', '--workdir={tmp_path / 'run'}']; "
           "sys.exit(xmc_tf_cli.main())")
    proc = subprocess.run([sys.executable, "-c", block + run],
                          capture_output=True, text=True, env=env, cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "xmc-tf: error: xmc_tf needs TensorFlow"), proc.stderr
