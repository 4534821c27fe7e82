"""xmc_tf: extreme multi-label classification layers and ops for TensorFlow.

Import this package before loading a SavedModel or ``.keras`` file that uses
xmc_tf: the import loads the op library, registers the ops' gradients and the
Keras classes.  XLA cannot compile the custom ops: the layers that use them
set ``supports_jit = False``, so Keras' default ``jit_compile="auto"`` keeps
XLA off for their models, and the trainers of :mod:`xmc_tf.models` compile
with ``jit_compile=False``.
"""

import warnings

try:
    import tensorflow  # noqa: F401
except ModuleNotFoundError as _e:
    if _e.name != "tensorflow":
        raise
    # The wheel leaves the TensorFlow wheel to the user: an extra.
    raise ModuleNotFoundError(
        "xmc_tf needs TensorFlow, which its cpu and gpu extras install: pip "
        "install 'xmc_tf[cpu]' (or [gpu]); they pin the TensorFlow release "
        "that the op library is built for", name="tensorflow") from _e

from xmc_tf.errors import OpLibraryError  # noqa: E402
from xmc_tf.ops import _loader  # noqa: E402

try:
    _loader.load()
except OpLibraryError as _e:  # re-raised at the first op use
    warnings.warn(str(_e))

from xmc_tf import callbacks, layers, losses, metrics, models, ops  # noqa: E402
from xmc_tf import initializers  # noqa: E402
from xmc_tf import optimizers  # noqa: E402
from xmc_tf import saving  # noqa: E402  (load_saved_model, load_model)
from xmc_tf import decoding  # noqa: E402  (top_k_function)
from xmc_tf import config  # noqa: E402  (the config schema; no TensorFlow)

__version__ = "0.1.0"
__all__ = ["callbacks", "layers", "losses", "metrics", "models", "ops"]
__all__ += ["optimizers"]
__all__ += ["saving"]
__all__ += ["decoding"]
__all__ += ["initializers"]
__all__ += ["config"]
__all__ += ["ExtremeClassifier"]


def __getattr__(name):
    """``xmc_tf.ExtremeClassifier`` (:class:`xmc_tf.job.classifier.
    ExtremeClassifier`), imported at its first use: the library's modules
    (``import xmc_tf.layers``) do not load the job."""
    if name == "ExtremeClassifier":
        from xmc_tf.job.classifier import ExtremeClassifier
        return ExtremeClassifier
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"ExtremeClassifier"})
