"""The process-memory helpers of the job (:mod:`xmc_tf.job.memory`):
``return_free_memory`` (between the job's phases) and
``limit_malloc_heaps`` (``xmc-tf train``)."""

import ctypes

import numpy as np
import pytest

from xmc_tf.job import memory


def _glibc() -> bool:
    try:
        ctypes.CDLL(None).malloc_trim  # noqa: B018
    except (OSError, AttributeError):
        return False
    return True


def test_return_free_memory_gives_back_freed_heap():
    if not _glibc():
        pytest.skip("not glibc")
    # Many small blocks (below any mmap threshold) freed below a block that
    # stays: free() can only trim the heap's top, so they stay resident
    # until malloc_trim (whatever heap state earlier tests left).
    blocks = [np.ones(512) for _ in range(100_000)]  # ~0.4 GB
    kept = np.ones(512)
    del blocks
    assert memory.return_free_memory() > 50 << 20
    assert memory.return_free_memory() >= 0
    assert kept.sum() == 512


def test_limit_malloc_heaps_respects_the_environment(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert memory.limit_malloc_heaps() is False
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_")
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.mmap_threshold=65536")
    assert memory.limit_malloc_heaps() is False
    monkeypatch.delenv("GLIBC_TUNABLES")
    assert memory.limit_malloc_heaps() is _glibc()
