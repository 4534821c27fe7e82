"""CUDA in the Bazel build: `cuda_objects` compiles *.cu.cc files with nvcc.

CUDA_ENABLED / CUDA_ARCHS come from @local_config_cuda (see
cuda_configure.bzl): the same nvcc, flags and archs as tools/build_ops.py.
"""

load(
    "@local_config_cuda//:config.bzl",
    _CUDA_ARCHS = "CUDA_ARCHS",
    _CUDA_ENABLED = "CUDA_ENABLED",
    _NVCC = "NVCC",
    _NVCC_FLAGS = "NVCC_FLAGS",
)

CUDA_ENABLED = _CUDA_ENABLED
CUDA_ARCHS = _CUDA_ARCHS

def _cuda_objects_impl(ctx):
    if not _CUDA_ENABLED:
        if ctx.files.srcs:
            fail("cuda_objects: CUDA is not configured (see @local_config_cuda)")
        return [DefaultInfo(files = depset())]

    # -I<repository root>, as build_ops.py's -I<ROOT>: sources include
    # "ops/<family>/<family>_kernels.h".
    include = ctx.label.workspace_root or "."
    prefix = ctx.label.package + "/" if ctx.label.package else ""
    objects = []
    for src in ctx.files.srcs:
        rel = src.short_path[len(prefix):] if src.short_path.startswith(prefix) else src.basename
        if rel.endswith(".cc"):
            rel = rel[:-len(".cc")]

        # .pic.o: linked into the shared object as a position-independent
        # object (nvcc -Xcompiler -fPIC).
        out = ctx.actions.declare_file("_cuda_objs/%s/%s.pic.o" % (ctx.label.name, rel))
        args = ctx.actions.args()
        args.add_all(_NVCC_FLAGS)
        args.add("-I" + include)
        args.add("-c", src)
        args.add("-o", out)
        ctx.actions.run(
            executable = _NVCC,
            arguments = [args],
            inputs = [src, ctx.file._nvcc_version] + ctx.files.hdrs,
            outputs = [out],
            # PATH for nvcc's host compiler (g++), as for Bazel's own compiles.
            use_default_shell_env = True,
            mnemonic = "NvccCompile",
            progress_message = "Compiling %s with nvcc" % src.short_path,
        )
        objects.append(out)
    return [DefaultInfo(files = depset(objects))]

cuda_objects = rule(
    implementation = _cuda_objects_impl,
    doc = "Object files (.pic.o) of `srcs` compiled by nvcc; put the target in a cc_binary's srcs.",
    attrs = {
        "srcs": attr.label_list(allow_files = [".cu.cc", ".cu"]),
        "hdrs": attr.label_list(allow_files = [".h", ".cuh"]),
        "_nvcc_version": attr.label(
            default = Label("@local_config_cuda//:nvcc_version.txt"),
            allow_single_file = True,
        ),
    },
)
