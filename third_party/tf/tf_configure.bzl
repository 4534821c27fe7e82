"""Repository rule `tf_configure`: the installed TensorFlow as @local_config_tf.

Asks the Python interpreter for TensorFlow's header directory, its
libtensorflow_framework.so.2 and the preprocessor defines of
`tf.sysconfig.get_compile_flags()` (-D_GLIBCXX_USE_CXX11_ABI=1,
-DEIGEN_MAX_ALIGN_BYTES=64, ...), symlinks the first two into the repository
and writes a BUILD file from BUILD.tpl with two targets:

  @local_config_tf//:tf_header_lib        headers + defines (propagated)
  @local_config_tf//:libtensorflow_framework   the shared library to link

and @local_config_tf//:version.bzl with TF_VERSION (tf.__version__).

The interpreter is $PYTHON_BIN_PATH, else `python3` on PATH (so an active
virtual environment is used).  The rule re-runs when PYTHON_BIN_PATH or
VIRTUAL_ENV changes; after installing another TensorFlow into the same
interpreter run `bazel sync --configure` (or `bazel clean --expunge`).
"""

_PYTHON_BIN_PATH = "PYTHON_BIN_PATH"

# Prints one "XMC_TF_<KEY>=<value>" line per item (TF's import logs go to
# stderr; the lines are picked out of stdout by their prefix).
_QUERY = """
import os, tensorflow as tf
cflags = tf.sysconfig.get_compile_flags()
lflags = tf.sysconfig.get_link_flags()
libdir = [f[2:] for f in lflags if f.startswith("-L")][0]
libname = [f[3:] if f.startswith("-l:") else "lib" + f[2:] + ".so"
           for f in lflags if f.startswith("-l")][0]
print("XMC_TF_INCLUDE=" + tf.sysconfig.get_include())
print("XMC_TF_LIB=" + os.path.join(libdir, libname))
print("XMC_TF_DEFINES=" + " ".join(f[2:] for f in cflags if f.startswith("-D")))
print("XMC_TF_VERSION=" + tf.__version__)
"""

def _fail(msg):
    fail("\n%sTensorFlow configuration error:%s %s\n" % ("\033[0;31m", "\033[0m", msg))

def _python_bin(repository_ctx):
    python = repository_ctx.os.environ.get(_PYTHON_BIN_PATH)
    if python:
        return python
    for name in ["python3", "python"]:
        found = repository_ctx.which(name)
        if found:
            return str(found)
    _fail("no Python found: set %s to the interpreter that has TensorFlow." % _PYTHON_BIN_PATH)

def _tf_configure_impl(repository_ctx):
    python = _python_bin(repository_ctx)
    result = repository_ctx.execute(
        [python, "-c", _QUERY],
        environment = {"TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout = 300,
    )
    if result.return_code != 0:
        _fail("`%s -c 'import tensorflow'` failed (set %s):\n%s" %
              (python, _PYTHON_BIN_PATH, result.stderr))
    config = {}
    for line in result.stdout.splitlines():
        if line.startswith("XMC_TF_") and "=" in line:
            key, _, value = line.partition("=")
            config[key[len("XMC_TF_"):].lower()] = value.strip()
    for key in ["include", "lib", "defines", "version"]:
        if key not in config:
            _fail("`%s` printed no XMC_TF_%s:\n%s\n%s" %
                  (python, key.upper(), result.stdout, result.stderr))
    config["defines"] = [d for d in config["defines"].split(" ") if d]

    repository_ctx.symlink(config["include"], "include")
    lib_name = config["lib"].split("/")[-1]
    repository_ctx.symlink(config["lib"], "lib/" + lib_name)
    # For `load("@local_config_tf//:version.bzl", "TF_VERSION")`: the op
    # library's build record (//third_party:build_info.bzl) names it.
    repository_ctx.file("version.bzl", "TF_VERSION = %s\n" % repr(config["version"]))
    repository_ctx.template("BUILD", repository_ctx.attr._build_tpl, {
        "%{TF_DEFINES}": repr(config["defines"]),
        "%{TF_LIB}": "lib/" + lib_name,
        "%{TF_VERSION}": config["version"],
        "%{PYTHON}": python,
    })

tf_configure = repository_rule(
    implementation = _tf_configure_impl,
    # Re-run when the interpreter (or the active virtual environment) changes.
    environ = [_PYTHON_BIN_PATH, "VIRTUAL_ENV"],
    local = True,
    configure = True,
    attrs = {
        "_build_tpl": attr.label(default = Label("//third_party/tf:BUILD.tpl")),
    },
)
