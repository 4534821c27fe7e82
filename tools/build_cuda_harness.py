"""Builds the framework-free CUDA launchers alone into a test shared library.

The uniform-sparse CUDA launchers (``ops/uniform_sparse/*.cu.cc``) include no
TensorFlow header, so they can be compiled with nvcc alone, linked with the
static CUDA runtime, and called through ``ctypes`` on a GPU machine that has
no TensorFlow (``tests/gpu/``, ``benchmarks/uniform_sparse_gpu.py``)::

    python tools/build_cuda_harness.py --output build/libxmc_uniform_sparse_cuda.so
    python tools/build_cuda_harness.py --archs native   # the local GPU only

The nvcc flags are those of the op library (``tools/build_ops.py``): CUDA
discovery (``find_cuda``) and ``-gencode`` flags (``cuda_gencode_flags``) are
imported from there, not duplicated.  The library exports the three
``extern "C"`` launchers of ``ops/uniform_sparse/uniform_sparse_kernels.h``.
Loading it needs no GPU (the CUDA runtime is linked statically and talks to
the driver only when a launcher is called).

Environment variables: ``XMC_TF_CUDA_ARCHS`` (default archs, as for
build_ops.py), ``NVCC`` / ``CUDA_HOME`` (override the tools).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

_TOOLS = os.path.dirname(os.path.abspath(__file__))
if _TOOLS not in sys.path:
    sys.path.insert(0, _TOOLS)

import build_ops  # noqa: E402  (tools/build_ops.py; imports no TensorFlow)

ROOT = build_ops.ROOT
# The uniform-sparse launchers: gradients (with the design comment), forward,
# and the host helpers and workspace query both use.
DEFAULT_SOURCES = tuple(
    os.path.join("ops", "uniform_sparse", name)
    for name in ("uniform_sparse_kernels.cu.cc",
                 "uniform_sparse_cuda_forward.cu.cc",
                 "uniform_sparse_cuda_common.cu.cc"))
DEFAULT_OUTPUT = os.path.join(ROOT, "build", "libxmc_uniform_sparse_cuda.so")


def arch_flags(archs: str) -> list:
    """nvcc architecture flags.

    Args:
      archs: ``"native"`` (the GPUs of this machine, ``-arch=native``) or
        semicolon-separated SM versions such as ``"75;90"`` (SASS for each,
        PTX for the last, see ``build_ops.cuda_gencode_flags``).

    Returns:
      A list of nvcc flags.
    """
    if archs.strip() == "native":
        return ["-arch=native"]
    return build_ops.cuda_gencode_flags(archs)


def build(output: str = DEFAULT_OUTPUT, archs: str | None = None,
          sources=DEFAULT_SOURCES, verbose: bool = True) -> str:
    """Compiles and links the CUDA launchers into a shared library.

    Args:
      output: path of the ``.so`` to write (parent folders are created).
      archs: see ``arch_flags``; default ``$XMC_TF_CUDA_ARCHS`` or
        ``build_ops.DEFAULT_CUDA_ARCHS``.
      sources: ``.cu.cc`` files relative to the repository root.
      verbose: print the command and the elapsed seconds.

    Returns:
      The absolute path of the library.

    Raises:
      RuntimeError: nvcc / the static CUDA runtime was not found, or nvcc
        failed (its output is in the message).
    """
    nvcc, cuda_root = build_ops.find_cuda()
    if nvcc is None:
        raise RuntimeError("nvcc and libcudart_static.a not found "
                           "(set NVCC / CUDA_HOME)")
    archs = archs or os.environ.get("XMC_TF_CUDA_ARCHS",
                                    build_ops.DEFAULT_CUDA_ARCHS)
    output = os.path.abspath(output)
    os.makedirs(os.path.dirname(output), exist_ok=True)
    # Same compile flags as build_ops.build(); nvcc links the static CUDA
    # runtime (-cudart=static) into the shared object.
    cmd = [nvcc, "-x", "cu", "-std=c++17", "-O3", "--threads", "0",
           "-Xcompiler", "-fPIC", f"-I{ROOT}", *arch_flags(archs), "-shared",
           "-cudart=static",
           *[os.path.join(ROOT, s) for s in sources], "-o", output,
           "-ldl", "-lrt", "-lpthread"]
    start = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError("command failed:\n  " + " ".join(cmd) + "\n" +
                           proc.stdout + proc.stderr)
    if verbose:
        print(" ".join(cmd), flush=True)
        print(f"built {output} in {time.time() - start:.1f} s "
              f"(CUDA root {cuda_root})", flush=True)
    return output


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", "-o", default=DEFAULT_OUTPUT,
                        help="shared library to write (default: %(default)s)")
    parser.add_argument("--archs", default=None,
                        help='"native" or SM versions like "75;90" (default: '
                             '$XMC_TF_CUDA_ARCHS or '
                             f'"{build_ops.DEFAULT_CUDA_ARCHS}")')
    args = parser.parse_args(argv)
    try:
        build(args.output, args.archs)
    except RuntimeError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
