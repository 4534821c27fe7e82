"""`xmc_build_info`: the op library's build record, as tools/build_ops.py writes it.

Generates a .cc file defining

  extern "C" __attribute__((used)) const char xmc_tf_build_info[] =
      "xmc_tf_build_info:{\"tf_version\": \"2.21.0\", \"cuda\": true, ...}";

byte for byte what build_ops.py writes for the same record (json.dumps
layout), so xmc_tf.ops._loader.build_info(path) reads the Bazel-built
library like the pip-built one: {"tf_version", "cuda", "cuda_archs"}.
"""

_MARKER = "xmc_tf_build_info:"  # build_ops.BUILD_INFO_MARKER

def _json_string(s):
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'

def _xmc_build_info_impl(ctx):
    record = '{"tf_version": %s, "cuda": %s, "cuda_archs": %s}' % (
        _json_string(ctx.attr.tf_version),
        "true" if ctx.attr.cuda else "false",
        _json_string(ctx.attr.cuda_archs) if ctx.attr.cuda else "null",
    )
    literal = (_MARKER + record).replace("\\", "\\\\").replace('"', '\\"')
    ctx.actions.write(
        ctx.outputs.out,
        'extern "C" __attribute__((used)) const char xmc_tf_build_info[] = "' +
        literal + '";\n',
    )

xmc_build_info = rule(
    implementation = _xmc_build_info_impl,
    attrs = {
        "out": attr.output(mandatory = True),
        "tf_version": attr.string(mandatory = True),
        "cuda": attr.bool(default = False),
        "cuda_archs": attr.string(),
    },
)
