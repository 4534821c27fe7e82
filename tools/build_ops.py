"""Compiles the xmc_tf op library (one shared object for every op family).

Used by ``setup.py`` (``pip install .`` / ``pip install -e .``) and usable by
hand for development::

    python tools/build_ops.py --output xmc_tf/_xmc_ops.so

Sources are discovered, not listed: every ``ops/<family>/*.cc`` that is not a
``*.cu.cc`` file is compiled with g++ and TensorFlow's own compile flags
(``tf.sysconfig``); every ``ops/<family>/*.cu.cc`` is compiled with nvcc when
CUDA is enabled.  A new op family therefore only needs a new folder.

Environment variables:
  XMC_TF_CUDA: ``auto`` (default: build the CUDA kernels when ``nvcc`` is
    found), ``1`` (require nvcc) or ``0`` (CPU only).
  XMC_TF_CUDA_ARCHS: semicolon-separated SM versions to emit SASS for
    (default ``75;80;86;89;90``); PTX of the last one is embedded too, so
    newer GPUs JIT-compile it.
  XMC_TF_JOBS: parallel compile jobs (default: number of CPUs).
  XMC_TF_OP_FAMILIES: comma-separated op families (folders under ops/) to
    build; default all.  For development builds of one family only.
  XMC_TF_PREBUILT_LIBRARY: (setup.py only) path of a library this script
    built already: ``pip install``/``python -m build`` copy it instead of
    compiling (CI builds its wheel from the library it tested).
  CXX / NVCC / CUDA_HOME: override the tools.

The library is tied to the TensorFlow release it was compiled against, and
the package's metadata pins that release (pyproject.toml: the build
requirement and the ``cpu``/``gpu`` extras): setup.py refuses a library
whose embedded TensorFlow version differs from the pin (check_pin).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_INFO_MARKER = "xmc_tf_build_info:"
DEFAULT_CUDA_ARCHS = "75;80;86;89;90"
# -fno-math-errno: no kernel reads errno, and with it set GCC cannot
# vectorise std::sqrt (the Adam update ran 3.2x slower, scalar sqrtss);
# results are unchanged (IEEE sqrt is correctly rounded either way).
CXX_FLAGS = ["-std=c++17", "-O3", "-fno-math-errno", "-fPIC", "-Wall",
             "-Wno-sign-compare", "-Wno-deprecated-declarations",
             "-Wno-unused-function"]
# Static CUDA runtime, after -L<cuda lib dir> on the link line.
CUDA_LINK_LIBS = ["-l:libcudart_static.a", "-ldl", "-lrt", "-lpthread"]


def _tf_flags():
    """Returns (compile_flags, link_flags, tf_version) of the installed TF."""
    code = ("import json, tensorflow as tf; print(json.dumps(["
            "tf.sysconfig.get_compile_flags(), tf.sysconfig.get_link_flags(), "
            "tf.__version__]))")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    out = subprocess.run([sys.executable, "-c", code], check=True, env=env,
                         capture_output=True, text=True).stdout
    compile_flags, link_flags, version = json.loads(out.strip().splitlines()[-1])
    # TF's flags say --std=c++17; we add ours and drop the duplicate.
    compile_flags = [f for f in compile_flags if not f.startswith("--std")]
    return compile_flags, link_flags, version


def find_cuda():
    """Returns (nvcc, cuda_root) or (None, None) when CUDA is not available."""
    nvcc = os.environ.get("NVCC") or shutil.which("nvcc")
    if not nvcc:
        return None, None
    candidates = [os.environ.get("CUDA_HOME", ""),
                  os.path.dirname(os.path.dirname(os.path.realpath(nvcc))),
                  "/usr/local/cuda"] + sorted(glob.glob("/usr/local/cuda-*"),
                                              reverse=True)
    for root in candidates:
        if root and any(os.path.exists(os.path.join(root, d,
                                                    "libcudart_static.a"))
                        for d in ("lib64", "lib")):
            return nvcc, root
    return None, None


def cuda_gencode_flags(archs: str):
    """nvcc -gencode flags: SASS for each arch, PTX for the last one."""
    arch_list = [a.strip() for a in archs.split(";") if a.strip()]
    flags = []
    for arch in arch_list:
        flags.append(f"-gencode=arch=compute_{arch},code=sm_{arch}")
    flags.append(f"-gencode=arch=compute_{arch_list[-1]},"
                 f"code=compute_{arch_list[-1]}")
    return flags


def nvcc_flags(archs: str):
    """nvcc flags for one ``*.cu.cc`` launcher, before ``-I``/``-c``/``-o``.

    Shared with the Bazel build (third_party/cuda/cuda_configure.bzl).
    """
    # --threads 0: the architectures of one file compile in parallel, one
    # per CPU (each is a separate cicc/ptxas run; the same code either way).
    return ["-x", "cu", "-std=c++17", "-O3", "--threads", "0", "-Xcompiler",
            "-fPIC", *cuda_gencode_flags(archs)]


def cuda_config(cuda: str = None):
    """The CUDA part of a build: None for CPU only, else a dict.

    Args:
      cuda: "auto", "1" or "0"; default from $XMC_TF_CUDA or "auto".

    Returns:
      None when CUDA is off or (with "auto") not found; else ``{"nvcc",
      "cuda_root", "cuda_libdir", "archs", "nvcc_flags", "link_libs"}``:
      ``link_libs`` follow ``-L<cuda_libdir>`` on the link line.  Used by
      build() and by the Bazel build (third_party/cuda/cuda_configure.bzl),
      so both find the same nvcc and use the same flags and archs.

    Raises:
      RuntimeError: CUDA was required ("1") and not found.
    """
    cuda = (cuda or os.environ.get("XMC_TF_CUDA", "auto")).lower()
    nvcc, cuda_root = find_cuda() if cuda != "0" else (None, None)
    if cuda == "1" and not nvcc:
        raise RuntimeError("XMC_TF_CUDA=1 but nvcc/libcudart_static.a not found")
    if not nvcc:
        return None
    archs = os.environ.get("XMC_TF_CUDA_ARCHS", DEFAULT_CUDA_ARCHS)
    libdir = next(os.path.join(cuda_root, d) for d in ("lib64", "lib")
                  if os.path.exists(os.path.join(cuda_root, d,
                                                 "libcudart_static.a")))
    return {"nvcc": nvcc, "cuda_root": cuda_root, "cuda_libdir": libdir,
            "archs": archs, "nvcc_flags": nvcc_flags(archs),
            "link_libs": CUDA_LINK_LIBS}


def _run(cmd):
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("command failed:\n  " + " ".join(cmd) + "\n" +
                           proc.stdout + proc.stderr)
    return cmd


def build(output: str, cuda: str = None, verbose: bool = True) -> dict:
    """Compiles every op family into one shared object at `output`.

    Args:
      output: path of the `.so` to write.
      cuda: "auto", "1" or "0"; default from $XMC_TF_CUDA or "auto".
      verbose: print each command.

    Returns:
      The build record (tf_version, cuda, cuda_archs), also embedded in the
      library as a string after BUILD_INFO_MARKER.

    Raises:
      RuntimeError: a compiler failed, or CUDA was required and not found.
    """
    cxx = os.environ.get("CXX", "g++")
    tf_cflags, tf_lflags, tf_version = _tf_flags()
    cuda_cfg = cuda_config(cuda)
    nvcc = cuda_cfg["nvcc"] if cuda_cfg else None
    archs = os.environ.get("XMC_TF_CUDA_ARCHS", DEFAULT_CUDA_ARCHS)

    families = [f for f in os.environ.get("XMC_TF_OP_FAMILIES", "*").split(",")
                if f]
    all_cc = sorted(set(sum((glob.glob(os.path.join(ROOT, "ops", fam, "*.cc"))
                             for fam in families), [])))
    cc_sources = [s for s in all_cc if not s.endswith(".cu.cc")]
    cu_sources = [s for s in all_cc if s.endswith(".cu.cc")] if nvcc else []
    with_cuda = bool(cu_sources)
    if not cc_sources:
        raise RuntimeError(f"no op sources under {ROOT}/ops")

    tmp = tempfile.mkdtemp(prefix="xmc_tf_build_")
    defines = ["-DXMC_TF_WITH_CUDA=1"] if with_cuda else []
    jobs = []
    objects = []
    for src in cc_sources:
        obj = os.path.join(tmp, os.path.relpath(src, ROOT).replace(os.sep, "_")
                           + ".o")
        jobs.append([cxx, *CXX_FLAGS, *defines, f"-I{ROOT}", *tf_cflags, "-c",
                     src, "-o", obj])
        objects.append(obj)
    for src in cu_sources:
        obj = os.path.join(tmp, os.path.relpath(src, ROOT).replace(os.sep, "_")
                           + ".o")
        jobs.append([nvcc, *cuda_cfg["nvcc_flags"], f"-I{ROOT}", "-c", src,
                     "-o", obj])
        objects.append(obj)
    # The build record is embedded in the library itself (read back by
    # xmc_tf/ops/_loader.py), so it travels with the .so in every install mode.
    info = {"tf_version": tf_version, "cuda": with_cuda,
            "cuda_archs": archs if with_cuda else None}
    info_src = os.path.join(tmp, "build_info.cc")
    with open(info_src, "w") as f:
        f.write('extern "C" __attribute__((used)) const char '
                'xmc_tf_build_info[] = "' + BUILD_INFO_MARKER +
                json.dumps(info).replace('"', '\\"') + '";\n')
    jobs.append([cxx, "-fPIC", "-c", info_src, "-o", info_src + ".o"])
    objects.append(info_src + ".o")
    n_jobs = int(os.environ.get("XMC_TF_JOBS", os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(max_workers=n_jobs) as pool:
        for cmd in pool.map(_run, jobs):
            if verbose:
                print(" ".join(cmd), flush=True)

    link = [cxx, "-shared", *objects, "-o", output, *tf_lflags]
    if with_cuda:
        link += [f"-L{cuda_cfg['cuda_libdir']}", *cuda_cfg["link_libs"]]
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    _run(link)
    if verbose:
        print(" ".join(link), flush=True)
    shutil.rmtree(tmp, ignore_errors=True)
    return info


def embedded_build_info(path: str) -> dict:
    """The build record that build() embedded in the library at ``path``
    (``{}`` for a library without one); xmc_tf/ops/_loader.py reads it the
    same way at run time."""
    with open(path, "rb") as f:
        match = re.search(re.escape(BUILD_INFO_MARKER.encode()) +
                          rb"(\{[^\x00]*\})", f.read())
    return json.loads(match.group(1)) if match else {}


def pinned_tf_version(pyproject: str = os.path.join(ROOT, "pyproject.toml")
                      ) -> str:
    """The one TensorFlow release that pyproject.toml pins (``tensorflow``
    and ``tensorflow-cpu``, ``==``: build requirement and extras).

    Raises:
      RuntimeError: no pin, or pins of different releases.
    """
    with open(pyproject) as f:
        pins = set(re.findall(r'"tensorflow(?:-cpu)?==([^"]+)"', f.read()))
    if len(pins) != 1:
        raise RuntimeError(f"{pyproject} must pin one TensorFlow release "
                           f"(tensorflow==X, tensorflow-cpu==X); found "
                           f"{sorted(pins) or 'none'}")
    return pins.pop()


def check_pin(info: dict, path: str) -> None:
    """Refuses a library built for another TensorFlow than the package pins.

    Args:
      info: the library's build record (build(), embedded_build_info()).
      path: the library, for the message.

    Raises:
      RuntimeError: its TensorFlow version differs from pinned_tf_version():
        the package would require a TensorFlow that cannot load it.
    """
    pin = pinned_tf_version()
    if info.get("tf_version") != pin:
        raise RuntimeError(
            f"{path} is built for TensorFlow {info.get('tf_version')} but "
            f"pyproject.toml pins TensorFlow {pin}, the release the package "
            f"requires: build against TensorFlow {pin} (pip's isolated build "
            "installs it: build-system.requires) or change the pins")


def copy_prebuilt(source: str, output: str) -> dict:
    """Uses a library built before (XMC_TF_PREBUILT_LIBRARY) as ``output``.

    Returns:
      Its build record.

    Raises:
      RuntimeError: ``source`` is missing or has no build record.
    """
    if not os.path.isfile(source):
        raise RuntimeError(f"XMC_TF_PREBUILT_LIBRARY={source} does not exist")
    info = embedded_build_info(source)
    if not info:
        raise RuntimeError(f"{source} has no build record: not built by "
                           "tools/build_ops.py or the Bazel build")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    if not (os.path.exists(output) and os.path.samefile(source, output)):
        shutil.copyfile(source, output)
    print(f"copied {source} to {output}: {info}", flush=True)
    return info


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=os.path.join(ROOT, "xmc_tf",
                                                         "_xmc_ops.so"))
    parser.add_argument("--cuda", default=None, choices=["auto", "0", "1"])
    args = parser.parse_args(argv)
    info = build(args.output, args.cuda)
    print(f"built {args.output}: {info}")


if __name__ == "__main__":
    main()
