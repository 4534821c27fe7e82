"""The process's memory between the job's phases: :func:`return_free_memory`
(after building and after training) and :func:`limit_malloc_heaps`
(``xmc-tf train``).  Measurements: docs/notes/scaling.md, benchmarks/run_memory.py.
"""

from __future__ import annotations

import ctypes
import gc
import os
import resource

__all__ = ["return_free_memory", "limit_malloc_heaps", "MMAP_THRESHOLD_BYTES"]


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
    one per thread) mapped for reuse, so what reading the data and
    building the model freed would stay resident for the whole run.  This
    collects Python's garbage, then
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
    stays resident, under training's peak.  ``mallopt`` changes this
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
