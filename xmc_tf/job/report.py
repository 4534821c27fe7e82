"""The report of a run: the dict written to ``metrics.json`` (test metrics,
sizes, seconds, bytes), built by one function for single runs and
ensembles, and the byte counts it holds; and the process's memory:
:func:`return_free_memory` (between the job's phases) and
:func:`limit_malloc_heaps` (``xmc-tf train``).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import resource

import keras
import numpy as np


__all__ = ["peak_memory_bytes", "return_free_memory", "limit_malloc_heaps",
           "MMAP_THRESHOLD_BYTES", "variable_bytes", "layer_bytes",
           "model_bytes", "run_report", "MEMBER_KEYS"]

#: What an ensemble's ``metrics.json`` keeps of each member's.
MEMBER_KEYS = ("P@1", "P@3", "P@5", "train_seconds", "epochs")


def peak_memory_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _resident_bytes() -> int:
    """Current resident set size of this process in bytes (0 if unknown)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return 0


def return_free_memory() -> int:
    """Hands the memory this process has freed back to the system.

    glibc's ``malloc`` keeps freed blocks of its heaps (the main one and
    one per thread) mapped for reuse: after reading and parsing the data
    and after building the model, 0.1-0.2 GiB of such free memory stayed
    resident through the whole run (an Amazon-670K-shaped job,
    ``docs/scaling.md``).  This collects Python's garbage, then
    ``malloc_trim(0)``, which unmaps the free pages of every heap.  It
    changes no value, only the resident set; a no-op where the C library
    has no ``malloc_trim`` (not glibc).

    Returns:
      Bytes by which the resident set shrank (0 if it did not, or unknown).
    """
    before = _resident_bytes()
    gc.collect()
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return 0
    trim.argtypes = [ctypes.c_size_t]
    trim(0)
    return max(0, before - _resident_bytes())


#: ``malloc`` blocks of at least this many bytes get their own mapping
#: under ``xmc-tf train`` (:func:`limit_malloc_heaps`).
MMAP_THRESHOLD_BYTES = 1 << 20

_M_MMAP_THRESHOLD = -3  # glibc's <malloc.h>


def limit_malloc_heaps(threshold: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Serves ``malloc`` blocks of ``threshold`` bytes or more from their own
    memory mappings, returned to the system when freed.

    glibc starts with a 128 KiB threshold and raises it, up to 32 MiB, to
    the size of every mapped block that is freed; after that, TensorFlow's
    1-32 MiB tensors come from the heaps, and what they leave free there
    stays resident.  At Amazon-670K shape that was 0.2-0.25 GiB under
    training's peak (``docs/scaling.md``); with a fixed 1 MiB threshold
    the training steps took the same CPU time.  ``mallopt`` changes this
    process's allocator, so the ``xmc-tf`` command calls this and the
    library does not.  A threshold the user set (``MALLOC_MMAP_THRESHOLD_``
    or ``GLIBC_TUNABLES`` ``glibc.malloc.mmap_threshold``) is left alone.

    Args:
      threshold: bytes (> 0).

    Returns:
      True if the threshold was set; False without glibc's ``mallopt``, or
      when the environment already sets one.
    """
    if ("MALLOC_MMAP_THRESHOLD_" in os.environ
            or "mmap_threshold" in os.environ.get("GLIBC_TUNABLES", "")):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(mallopt(_M_MMAP_THRESHOLD, int(threshold)))


def variable_bytes(variables) -> int:
    """Bytes of ``variables`` (shape x dtype size, summed)."""
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                   for v in variables))


def layer_bytes(layer) -> int:
    """Bytes of a layer's variables (the head's: weights, indices, bias;
    ``metrics.json`` ``output_layer_bytes``)."""
    return variable_bytes(layer.weights)


def model_bytes(model: keras.Model) -> int:
    """Bytes of all the model's variables (every layer; no optimizer state)."""
    return variable_bytes(model.weights)


def run_report(config, summary, num_test: int, model, *, metrics: dict,
               train_seconds: float, epochs: int, head_bytes: int,
               regime: dict, **extra) -> dict:
    """The ``metrics.json`` dict of a run (before its completion marker).

    Args:
      config: the run's config (resolved: recorded as ``"config"``).
      summary: the training data's :class:`xmc_tf.job.plan.DataSummary`.
      num_test: test instances (0 without a test set).
      model: the exported model (``model_bytes``).
      metrics: the evaluation's ``P@k``, ``nDCG@k``, ``PSP@k``, ``R@k``
        (percent), and for ensembles ``val_...``; ``{}`` without a test set.
      train_seconds: seconds of training (all processes, resumes summed).
      epochs: epochs trained.
      head_bytes: bytes of the head layer(s) (:func:`layer_bytes`).
      regime: the values the data chose (``{}`` if none).
      **extra: more keys (the head's results, the label tree, the
        strategy, an ensemble's members), added last.

    Returns:
      The dict; ``peak_memory_bytes`` and ``run`` are added by the caller.
    """
    report = dict(metrics)
    report.update({
        "train_seconds": round(train_seconds, 2),
        "epochs": int(epochs),
        "num_labels": summary.num_labels,
        "num_features": summary.num_features,
        "num_train_instances": summary.num_instances,
        "num_test_instances": int(num_test),
        "output_layer_bytes": int(head_bytes),
        "model_bytes": model_bytes(model),
        "head": config.model.head,
    })
    if regime:
        report["regime"] = regime
    # The config the run trained with: every automatic field resolved.
    report["config"] = json.loads(config.to_json_best_effort())
    report.update(extra)
    return report
