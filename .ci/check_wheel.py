"""CI: checks the wheel that tools/build_wheel.sh wrote.

Usage: python .ci/check_wheel.py WHEEL

* its platform tag is manylinux_2_X_x86_64 with X <= 27: it installs
  wherever TensorFlow 2.21's own wheels (manylinux_2_27) do;
* it holds one shared object, the op library: nothing vendored (no
  libtensorflow_framework, no .libs folder), and the library needs
  libtensorflow_framework.so.2 (provided by the installed TensorFlow);
* its metadata requires, in the ``cpu`` and ``gpu`` extras, exactly the
  TensorFlow release the library was built for (its embedded build record);
* it holds the packaged configs and the bundled data the quick start uses.
"""

import os
import re
import subprocess
import sys
import tempfile
import zipfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "tools"))
import build_ops  # noqa: E402

TF_WHEEL_GLIBC = 27  # tensorflow(-cpu) 2.21: manylinux_2_27_x86_64


def main(path: str) -> None:
    name = os.path.basename(path)
    tag = re.search(r"-cp3\d+-cp3\d+-manylinux_2_(\d+)_x86_64\.whl$", name)
    assert tag, f"{name}: not a cpython manylinux_2_X_x86_64 wheel"
    assert int(tag.group(1)) <= TF_WHEEL_GLIBC, (
        f"{name} needs glibc 2.{tag.group(1)}, more than TensorFlow's wheels "
        f"(2.{TF_WHEEL_GLIBC}): it would not install everywhere they do")
    with zipfile.ZipFile(path) as z:
        names = z.namelist()
        libs = [n for n in names if re.search(r"\.so(\.|$)", n)]
        assert len(libs) == 1 and re.fullmatch(r"xmc_tf/_xmc_ops[^/]*\.so",
                                               libs[0]), libs
        metadata = z.read(next(n for n in names
                               if n.endswith(".dist-info/METADATA"))).decode()
        with tempfile.TemporaryDirectory() as tmp:
            lib = z.extract(libs[0], tmp)
            info = build_ops.embedded_build_info(lib)
            needed = subprocess.run(["readelf", "-d", lib], check=True,
                                    capture_output=True, text=True).stdout
    assert "[libtensorflow_framework.so.2]" in needed, needed
    tf = info.get("tf_version")
    assert tf, f"{libs[0]}: no build record"
    for extra, dist in (("cpu", "tensorflow-cpu"), ("gpu", "tensorflow")):
        want = f'Requires-Dist: {dist}=={tf}; extra == "{extra}"'
        assert want in metadata, f"METADATA lacks {want!r}"
    for want in ("xmc_tf/configs/quickstart.py", "xmc_tf_cli/__init__.py",
                 "xmc_tf/data/bundled/bibtex_xcsplit_train.txt.gz",
                 "xmc_tf/data/bundled/bibtex_xcsplit_test.txt.gz"):
        assert want in names, f"{name} lacks {want}"
    print(f"{name}: {os.path.getsize(path) / 2**20:.2f} MiB, op library "
          f"{info}, requires TensorFlow {tf} (extras cpu/gpu), nothing "
          "vendored")


if __name__ == "__main__":
    main(sys.argv[1])
