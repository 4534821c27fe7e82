"""Roofline of a uniform-sparse training step: each part against its limit.

What it measures
----------------
Issue 32 item 1.  First the machine's peaks, then, at Amazon-670K and
Amazon-3M sizes, the steady-state time of every part of a training step of
the paper's uniform-sparse model (intermediate Dense of ``e = 32,768``
units -> ``UniformSparseDense(m, s)`` -> squared hinge, ``LazyAdam``),
each divided by the time the peaks allow for its work.

**Peaks** (``machine_peaks``): loops in C++
(``benchmarks/roofline_peaks.cc``, compiled once with ``g++ -O3
-march=native`` and loaded with ``ctypes``; no TensorFlow), each run on 1
thread ("per core") and on ``os.cpu_count()`` threads ("all cores"), best
of ``repeats``:

* ``fma_gflops``: 16 independent 16-wide float FMA chains per thread
  (AVX-512 on this machine): 2 flops per lane per FMA.
* ``copy_gbs``: ``memcpy`` of 512 MiB (read + write counted: 8 bytes per
  float), the threads splitting the array; ``read_gbs``: a sum over it;
  ``add_gbs``: ``a += b`` over two such arrays (12 bytes per float);
  ``bandwidth_gbs``: the largest of the three (the limit of a part's bytes).
* ``row_gather_rows_per_s``: ``acc += w[p] * table[idx[p], :]`` over random
  rows of a ``[e, b]`` float table (4 MiB at ``e = 32,768, b = 32``: in the
  caches, as the kernels' transposed batch is), accumulators in registers:
  the inner loop of the uniform-sparse kernels at its best.
* ``element_gather_per_s``: random floats from a 256 MiB table (DRAM).

The limits use the best of each rate over the thread counts (``"all"``:
on a machine shared with other jobs the 2-thread loops can come out below
the 1-thread ones; the machine can do at least the better of the two).
For comparison the JSON also holds ``benchmarks/hinge_loss.py``'s
``stream_bandwidth`` (a single-thread NumPy copy and TensorFlow's
multi-threaded element-wise ``x * 1``) and ``tf.matmul``'s GFLOP/s on a
``[2048, 2048]`` float32 product (TensorFlow's default threads).

**Parts** (``part_models`` has the FLOP / byte / gather model of each; the
limit of a part is ``max(flops / fma, bytes / bandwidth, row gathers /
row_gather)`` with the ``"all"`` peaks, and ``fraction = measured / limit``,
1 = at the limit).  Shapes: batch ``b = 32``, intermediate width ``e``,
``m`` labels, ``s`` connections per label, ``n`` padded label ids per row;
``m_nz`` = labels whose backward column has a non-zero (the kernels skip
the others), ``rho`` = the non-zero fraction of the loss gradient, both
measured on the step's own data (the layer at its initial state: prior
bias -1, Glorot kernel, ReLU-like intermediate output):

==================  =========================  ==========================  ============
part                FLOPs                      bytes (DRAM)                row gathers
==================  =========================  ==========================  ============
forward             ``2 b m s``                ``8 m s + 4 b m + 4 b e``   ``m s``
bias                ``2 b m``                  ``12 b m + 8 m``            -
loss_grad           ``8 b m``                  ``12 b m``                  -
grad_features       ``2 b m_nz s``             ``4 b m + 8 m_nz s + 4 b e``  ``m_nz s``
grad_weights        ``2 b m_nz s``             ``4 b m + 4 m_nz s + 4 m s + 4 b e``  ``m_nz s``
adam                ``10 (m s + m)``           ``28 (m s + m)``            -
intermediate        ``6 b d e``                ``12 d e + 8 b e``          -
intermediate_adam   ``10 (d e + e)``           ``28 (d e + e)``            -
set_rewire          -                          ``32 m s``                  -
eval_topk           ``r m`` (compares)         ``4 r m``                   -
eval_topk_tf        ``r m`` (compares)         ``4 r m``                   -
==================  =========================  ==========================  ============

* ``forward``: ``Xmc>UniformSparseMatmul`` alone (indices, weights read
  once, scores written once; each connection gathers a ``b``-float row of
  the transposed batch).
* ``bias``: the layer's ``+ bias`` and the bias gradient (a column sum).
* ``loss_grad``: ``xmc_tf.losses.SquaredHinge`` on ids, value and gradient
  w.r.t. the scores (``Xmc>SquaredHingeLoss`` + its gradient op; the model
  of ``benchmarks/hinge_loss.py``: scores read twice, gradient written).
* ``grad_features`` / ``grad_weights``: ``Xmc>UniformSparseMatmulGrad
  Features`` / ``...GradWeights`` on the real loss gradient.
* ``adam``: ``LazyAdam.apply`` of the sparse layer's kernel ``[m, s]`` and
  bias ``[m]`` gradients (dense tensors: the fused ``Xmc>ResourceApplyAdam``
  on the CPU): gradient read, weights and both moments read and written.
* ``intermediate`` / ``intermediate_adam``: the intermediate
  ``Dense(e, leaky_relu)`` on the ``[b, d]`` encoder output (``d = 512``):
  forward and both gradients, then its Adam.  Not part of the head; part of
  the step.
* ``set_rewire``: one ``SetRewiring.rewire_now()`` (the op
  ``Xmc>SetRewire``, or NumPy ``rewire`` where the library lacks it, plus
  the assigns of indices, kernel and both Adam moments), per call: model =
  read and write indices, kernel and the two moments once.  The paper
  rewires every 1,000 steps: the step counts 1/1000 of it.
* ``eval_topk``: the evaluation's top 5 (``xmc_tf.ops.topk.top_k``:
  ``Xmc>TopK``'s partial selection) on one evaluation block of ``r`` rows
  (``xmc_tf.metrics.evaluator.SCORE_BLOCK_BYTES`` / ``4 m``: 100 rows at 670k),
  the scores already computed (standard normal: a trained model's rows
  are no harder, the op is ``O(m)`` per row on any input).
  ``eval_topk_tf``: ``tf.math.top_k(scores, 5)`` on the same block (what
  evaluation used before ``Xmc>TopK``).  With ``--parts`` naming only
  these two, the layer is not built (seconds, little memory), and
  ``--merge-into FILE`` puts the new parts into an existing result
  (``benchmarks/results/roofline.json``) instead of writing a new one.

**Whole step**: ``head_step`` is one ``tf.function`` doing what
``model.train_step`` does for the head: intermediate output -> layer ->
loss -> gradients (features, kernel, bias) -> ``LazyAdam.apply``; it
checks the sum of the head parts (forward, bias, loss_grad, grad_features,
grad_weights, adam).  ``step`` = ``head_step`` + ``intermediate`` +
``intermediate_adam`` + ``set_rewire / 1000``: the steady-state training
step of the output side (the encoder and the input pipeline are not in
it: ``benchmarks/scale.py``'s ``base`` run).

Every timed call is a ``tf.function`` (``jit_compile=False``) called
``--warmup`` times first (tracing), then ``--repeats`` times; reported:
the median (and min) wall seconds.  Hold the machine alone while it runs
(``flock -x /work/runs/timing.lock python benchmarks/roofline.py``): the
header prints the load average.

How to run
----------
Build the op library, then::

    PYTHONPATH=. python benchmarks/roofline.py                # 670k and 3m
    PYTHONPATH=. python benchmarks/roofline.py --scales 670k
    PYTHONPATH=. python benchmarks/roofline.py --small --out /tmp/r.json

Output: a table per scale, JSON (``--out``, default
``benchmarks/results/roofline.json``) and a bar chart of measured time
against limit per part (``--plot``, default ``.../roofline.png``).  Peak
RSS (recorded per part): 3.3 GiB at 670k, 12.3 GiB at 2.8M (building the
layer, then the SET rewire); a scale is skipped, with a note in the JSON,
when ``MemAvailable`` is below ``memory_estimate`` plus 1 GiB.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from hinge_loss import _ids, stream_bandwidth  # noqa: E402  (benchmarks/)

#: name -> batch b, intermediate width e, encoder width d, labels m,
#: fan-in s, padded label ids per row n (Amazon-670K: 5.45 labels per
#: instance; Amazon-3M: 36).
SCALES = {
    "670k": dict(b=32, e=32_768, d=512, m=670_091, s=32, n=16),
    "3m": dict(b=32, e=32_768, d=512, m=2_812_281, s=96, n=64),
    # --small: a check of the script in seconds.
    "small": dict(b=32, e=2_048, d=256, m=20_000, s=32, n=8),
}
HEAD_PARTS = ("forward", "bias", "loss_grad", "grad_features",
              "grad_weights", "adam")
EVAL_PARTS = ("eval_topk", "eval_topk_tf")
PARTS = HEAD_PARTS + ("intermediate", "intermediate_adam", "set_rewire") + \
    EVAL_PARTS
#: SET period of the paper (Sec. 4.1), steps per rewire.
SET_EVERY = 1000
#: Targets of issue 32 (seconds per steady-state step).
TARGETS = {"670k": 1.0, "3m": 10.0}
TOP_K = 5


# ---------------------------------------------------------------------------
# Machine peaks.

def peak_library(cache_dir=None):
    """Compiles ``roofline_peaks.cc`` (once per source hash) and loads it.

    Args:
      cache_dir: where the ``.so`` goes (default: the system temp dir).

    Returns:
      ``ctypes.CDLL`` with ``xr_fma``, ``xr_copy``, ``xr_read``, ``xr_add``,
      ``xr_row_gather`` and ``xr_element_gather`` (restypes set: double
      seconds).

    Raises:
      RuntimeError: ``g++`` is missing or the compile fails.
    """
    src = os.path.join(HERE, "roofline_peaks.cc")
    with open(src, "rb") as f:
        digest = hashlib.sha1(f.read()).hexdigest()[:12]
    cache_dir = cache_dir or tempfile.gettempdir()
    so = os.path.join(cache_dir, f"xmc_roofline_peaks_{digest}.so")
    if not os.path.exists(so):
        tmp = f"{so}.{os.getpid()}.tmp"
        cmd = ["g++", "-O3", "-march=native", "-std=c++17", "-shared",
               "-fPIC", "-pthread", src, "-o", tmp]
        try:
            subprocess.run(cmd, check=True, capture_output=True, text=True)
        except (OSError, subprocess.CalledProcessError) as e:
            raise RuntimeError(f"compiling the peak loops failed: {e}") from e
        os.replace(tmp, so)
    lib = ctypes.CDLL(so)
    for name in ("xr_fma", "xr_copy", "xr_read", "xr_add", "xr_row_gather",
                 "xr_element_gather"):
        getattr(lib, name).restype = ctypes.c_double
    return lib


def _ptr(a):
    return a.ctypes.data_as(ctypes.c_void_p)


def _best(fn, repeats):
    return min(fn() for _ in range(max(1, repeats)))


def machine_peaks(table_rows=32_768, row_width=32, copy_mib=512,
                  gather_table_mib=256, gathers=8_000_000,
                  fma_iters=20_000_000, repeats=5, threads=None, lib=None):
    """Peak FMA rate, copy bandwidth and gather rates, 1 thread and all.

    Args:
      table_rows, row_width: the row-gather table ``[table_rows,
        row_width]`` float32 (the kernels' transposed batch ``[e, b]``);
        ``row_width`` a multiple of 16 in [16, 128].
      copy_mib: size of the copied array, MiB.
      gather_table_mib: size of the element-gather table, MiB.
      gathers: random rows / elements per gather measurement.
      fma_iters: iterations of the FMA loop per thread (512 flops each).
      repeats: best of this many runs per measurement.
      threads: thread counts to measure (default ``[1, os.cpu_count()]``).
      lib: the loaded peak library (default :func:`peak_library`).

    Returns:
      dict: ``"per_thread_count"`` -> ``{str(threads): {"fma_gflops",
      "copy_gbs", "read_gbs", "add_gbs", "bandwidth_gbs",
      "row_gather_rows_per_s", "row_gather_gbs", "element_gather_per_s"}}``
      (GFLOP/s, GB/s = 1e9 bytes/s, rows or elements per second;
      ``bandwidth_gbs`` = max of copy, read, add), ``"per_core"`` = the
      entry of the smallest thread count, ``"all"`` = the best of every
      rate over the thread counts (what the limits use), and the
      parameters.
    """
    lib = lib or peak_library()
    threads = sorted(set(threads or [1, os.cpu_count() or 1]))
    rng = np.random.default_rng(0)
    sink = np.zeros(max(threads), np.float32)
    src = np.ones(copy_mib * 2 ** 18, np.float32)
    dst = np.empty_like(src)
    table = rng.random(table_rows * row_width, dtype=np.float32)
    row_idx = rng.integers(0, table_rows, gathers, dtype=np.int32)
    row_w = rng.random(gathers, dtype=np.float32)
    big = rng.random(gather_table_mib * 2 ** 18, dtype=np.float32)
    el_idx = rng.integers(0, big.size, gathers, dtype=np.int32)
    out = {}
    for t in threads:
        fma_s = _best(lambda: lib.xr_fma(t, ctypes.c_int64(fma_iters),
                                         _ptr(sink)), repeats)
        copy_s = _best(lambda: lib.xr_copy(t, _ptr(src), _ptr(dst),
                                           ctypes.c_int64(src.size)), repeats)
        row_s = _best(lambda: lib.xr_row_gather(
            t, _ptr(table), ctypes.c_int64(row_width), _ptr(row_idx),
            _ptr(row_w), ctypes.c_int64(gathers), _ptr(sink)), repeats)
        if row_s < 0:
            raise ValueError(f"row_width={row_width}: a multiple of 16 in "
                             "[16, 128]")
        el_s = _best(lambda: lib.xr_element_gather(
            t, _ptr(big), _ptr(el_idx), ctypes.c_int64(gathers), _ptr(sink)),
            repeats)
        read_s = _best(lambda: lib.xr_read(t, _ptr(src), ctypes.c_int64(
            src.size), _ptr(sink)), repeats)
        add_s = _best(lambda: lib.xr_add(t, _ptr(dst), _ptr(src),
                                         ctypes.c_int64(src.size)), repeats)
        rates = {
            "fma_gflops": 512 * fma_iters * t / fma_s / 1e9,
            "copy_gbs": 8 * src.size / copy_s / 1e9,
            "read_gbs": 4 * src.size / read_s / 1e9,
            "add_gbs": 12 * src.size / add_s / 1e9,
            "row_gather_rows_per_s": gathers / row_s,
            "row_gather_gbs": gathers * 4 * row_width / row_s / 1e9,
            "element_gather_per_s": gathers / el_s,
        }
        rates["bandwidth_gbs"] = max(rates["copy_gbs"], rates["read_gbs"],
                                     rates["add_gbs"])
        out[str(t)] = rates
    best = {k: max(v[k] for v in out.values()) for k in out[str(threads[0])]}
    return {"per_thread_count": out, "all": best,
            "per_core": out[str(threads[0])], "threads": threads,
            "row_table": [table_rows, row_width], "copy_mib": copy_mib,
            "gather_table_mib": gather_table_mib}


def library_rates(tf, n=2048, repeats=5, stream_mib=512):
    """TensorFlow's matmul GFLOP/s and ``hinge_loss.stream_bandwidth``.

    Args:
      tf: the tensorflow module.
      n: ``tf.matmul`` of two ``[n, n]`` float32 matrices (``2 n^3`` flops).
      repeats: best of this many.
      stream_mib: array size of the stream measurement, MiB.

    Returns:
      dict ``{"tf_matmul_gflops", "numpy_copy_gbs", "tf_elementwise_gbs"}``.
    """
    a = tf.random.normal([n, n])
    b = tf.random.normal([n, n])
    mm = tf.function(lambda x, y: tf.reduce_sum(tf.matmul(x, y)[:1, :1]))
    mm(a, b)
    best = _best(lambda: _time_call(mm, a, b), repeats)
    out = {"tf_matmul_gflops": 2 * n ** 3 / best / 1e9}
    out.update(stream_bandwidth(tf, mib=stream_mib, repeats=repeats))
    return out


def _peak_rss():
    """``VmHWM`` of this process (bytes), or None off Linux."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _mem_available():
    """``MemAvailable`` of /proc/meminfo (bytes), or None off Linux."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def memory_estimate(b, e, d, m, s, n=0):
    """Bytes a scale needs, roughly.

    The layer (indices, kernel, two Adam moments), a kernel gradient and
    two more ``[m, s]`` copies (the layer's construction, the SET rewire),
    six ``[b, m]`` float tensors and 1.5 GiB for TensorFlow and Python
    (measured peaks: 2.8 GB at m = 700k, s = 96; 12.3 GiB at 2.8M).

    Args:
      b, e, d, m, s, n: as in :data:`SCALES` (``e``, ``d``, ``n`` unused).

    Returns:
      int, bytes.
    """
    del e, d, n
    return 7 * 4 * m * s + 6 * 4 * b * m + 3 * 2 ** 29


def _time_call(fn, *args):
    t = time.perf_counter()
    out = fn(*args)
    if hasattr(out, "numpy"):
        out.numpy()
    return time.perf_counter() - t


# ---------------------------------------------------------------------------
# Work models.

def part_models(b, e, d, m, s, m_nz=None, rows=None):
    """FLOPs, DRAM bytes and row gathers of every part (module docstring).

    Args:
      b: batch size.
      e: intermediate width (the sparse layer's input width).
      d: encoder width (the intermediate Dense's input width).
      m: labels.
      s: connections per label.
      m_nz: labels with a non-zero backward column (default ``m``).
      rows: rows of the evaluation block (default ``score_rows(m)``).

    Returns:
      dict part -> ``{"flops", "bytes", "row_gathers"}`` (ints).
    """
    m_nz = m if m_nz is None else int(m_nz)
    rows = score_rows(m) if rows is None else int(rows)
    return {
        "forward": dict(flops=2 * b * m * s,
                        bytes=8 * m * s + 4 * b * m + 4 * b * e,
                        row_gathers=m * s),
        "bias": dict(flops=2 * b * m, bytes=12 * b * m + 8 * m,
                     row_gathers=0),
        "loss_grad": dict(flops=8 * b * m, bytes=12 * b * m, row_gathers=0),
        "grad_features": dict(flops=2 * b * m_nz * s,
                              bytes=4 * b * m + 8 * m_nz * s + 4 * b * e,
                              row_gathers=m_nz * s),
        "grad_weights": dict(flops=2 * b * m_nz * s,
                             bytes=(4 * b * m + 4 * m_nz * s + 4 * m * s
                                    + 4 * b * e),
                             row_gathers=m_nz * s),
        "adam": dict(flops=10 * (m * s + m), bytes=28 * (m * s + m),
                     row_gathers=0),
        "intermediate": dict(flops=6 * b * d * e,
                             bytes=12 * d * e + 8 * b * e, row_gathers=0),
        "intermediate_adam": dict(flops=10 * (d * e + e),
                                  bytes=28 * (d * e + e), row_gathers=0),
        "set_rewire": dict(flops=0, bytes=32 * m * s, row_gathers=0),
        "eval_topk": dict(flops=rows * m, bytes=4 * rows * m, row_gathers=0),
        "eval_topk_tf": dict(flops=rows * m, bytes=4 * rows * m,
                             row_gathers=0),
    }


def score_rows(m):
    """Rows of one evaluation score block at ``m`` labels.

    Args:
      m: labels.

    Returns:
      int: ``xmc_tf.metrics.evaluator.score_batch_size`` of a 1,024-row request
      (``SCORE_BLOCK_BYTES / (4 m)`` float32 rows, in ``[1, 1024]``).
    """
    from xmc_tf.metrics.evaluator import SCORE_BLOCK_BYTES
    return max(1, min(1024, SCORE_BLOCK_BYTES // (4 * m)))


def limit_seconds(model, peaks):
    """Time the peaks allow for one part's work.

    Args:
      model: ``{"flops", "bytes", "row_gathers"}`` of :func:`part_models`.
      peaks: ``{"fma_gflops", "bandwidth_gbs", "row_gather_rows_per_s"}``
        (the ``"all"`` entry of :func:`machine_peaks`).

    Returns:
      ``(seconds, bound)``: the largest of ``flops / fma``, ``bytes /
      bandwidth`` and ``row_gathers / row_gather`` and which one it is
      (``"flops"``, ``"bytes"`` or ``"gathers"``).
    """
    terms = {"flops": model["flops"] / (peaks["fma_gflops"] * 1e9),
             "bytes": model["bytes"] / (peaks["bandwidth_gbs"] * 1e9),
             "gathers": model["row_gathers"] / peaks["row_gather_rows_per_s"]}
    bound = max(terms, key=terms.get)
    return terms[bound], bound


def account(measured, models, peaks):
    """Rows of the roofline table.

    Args:
      measured: part -> ``{"median_s", "min_s"}`` (seconds).
      models: :func:`part_models`.
      peaks: the all-core peaks.

    Returns:
      part -> ``{"median_s", "min_s", "limit_s", "bound", "fraction",
      "flops", "bytes", "row_gathers"}`` for the measured parts;
      ``fraction = median_s / limit_s``.
    """
    rows = {}
    for part, times in measured.items():
        lim, bound = limit_seconds(models[part], peaks)
        rows[part] = dict(times, limit_s=lim, bound=bound,
                          fraction=times["median_s"] / lim if lim else None,
                          **models[part])
    return rows


def step_summary(parts, whole_head_s=None, set_every=SET_EVERY, target=None):
    """The steady-state step from the parts.

    Args:
      parts: output of :func:`account`.
      whole_head_s: measured ``head_step`` median (seconds) or None.
      set_every: steps per SET rewire.
      target: seconds (the issue's target) or None.

    Returns:
      dict with ``head_parts_sum_s`` (sum of the head parts' medians),
      ``head_step_s`` (measured whole head step, else the sum),
      ``step_s`` (head step + intermediate parts + SET / set_every),
      ``step_limit_s`` (the same sum of limits), ``target_s``, ``met``.
    """
    head_sum = sum(parts[p]["median_s"] for p in HEAD_PARTS if p in parts)
    head_lim = sum(parts[p]["limit_s"] for p in HEAD_PARTS if p in parts)
    head = whole_head_s if whole_head_s is not None else head_sum
    step, lim = head, head_lim
    for p in ("intermediate", "intermediate_adam"):
        if p in parts:
            step += parts[p]["median_s"]
            lim += parts[p]["limit_s"]
    if "set_rewire" in parts:
        step += parts["set_rewire"]["median_s"] / set_every
        lim += parts["set_rewire"]["limit_s"] / set_every
    return {"head_parts_sum_s": head_sum, "head_step_s": head,
            "step_s": step, "step_limit_s": lim, "set_every": set_every,
            "target_s": target,
            "met": None if target is None else bool(step <= target)}


# ---------------------------------------------------------------------------
# Timing.

def timed(fn, repeats, warmup=2, budget_s=None):
    """Median and min wall seconds of ``fn()`` after ``warmup`` calls.

    A returned tensor is read (``.numpy()``), so the time covers the work.

    Args:
      fn: callable without arguments.
      repeats: timed calls.
      warmup: untimed calls first (tracing of a ``tf.function``).
      budget_s: stop repeating once this many seconds were spent (at least
        one timed call); None: all ``repeats``.

    Returns:
      ``{"median_s", "min_s", "repeats"}``.
    """
    for _ in range(warmup):
        _time_call(fn)
    times, spent = [], 0.0
    for _ in range(max(1, repeats)):
        times.append(_time_call(fn))
        spent += times[-1]
        if budget_s is not None and spent > budget_s:
            break
    return {"median_s": statistics.median(times), "min_s": min(times),
            "repeats": len(times)}


def _checksum(tf, *tensors):
    """A scalar that depends on every tensor (so nothing is pruned) at the
    cost of reading one element of each."""
    return tf.add_n([tf.cast(tf.reshape(tf.convert_to_tensor(t), [-1])[0],
                             tf.float32) * 0.0 for t in tensors])


def measure_scale(tf, name, b, e, d, m, s, n, repeats=5, warmup=2,
                  set_repeats=3, parts=PARTS, seed=0, log=print):
    """Times every part at one size (see the module docstring).

    Args:
      tf: the tensorflow module.
      name: scale name (for the log).
      b, e, d, m, s, n: batch, intermediate width, encoder width, labels,
        connections per label, padded label ids per row.
      repeats, warmup: timed calls and untimed first calls per part.
      set_repeats: timed SET rewires (each rewires the layer again).
      parts: the parts to time (a subset of :data:`PARTS`).
      seed: data seed.
      log: a print-like function (progress).

    Returns:
      dict: ``measured`` (part -> ``{"median_s", "min_s", "repeats"}``),
      ``head_step`` (the same for the whole head step, or None),
      ``nonzero_fraction`` (rho), ``m_nz``, ``eval_rows``, ``shape``.
    """
    if set(parts) <= set(EVAL_PARTS):  # no layer needed
        out = {"shape": dict(b=b, e=e, d=d, m=m, s=s, n=n),
               "nonzero_fraction": None, "m_nz": None,
               "eval_rows": score_rows(m), "measured": {}, "head_step": None}

        def run_eval(part, fn):
            if part in parts:
                out["measured"][part] = timed(fn, repeats, warmup)
                out["measured"][part]["peak_rss_bytes"] = _peak_rss()
                log(f"  {name} {part}: "
                    f"{out['measured'][part]['median_s'] * 1e3:.1f} ms")
        eval_parts(tf, name, m, out, run_eval, seed)
        return out
    import keras
    from xmc_tf.callbacks import SetRewiring
    from xmc_tf.layers import UniformSparseDense
    from xmc_tf.losses import SquaredHinge
    from xmc_tf.ops import _loader, uniform_sparse_matmul
    from xmc_tf.optimizers import LazyAdam

    lib = _loader.load()
    rng = np.random.default_rng(seed)
    loss = SquaredHinge()
    layer = UniformSparseDense(m, connections_per_label=s,
                               bias_initializer=loss.bias_initializer(),
                               seed=seed, name="output")
    inputs = keras.Input((e,))
    model = keras.Model(inputs, layer(inputs))
    # Learning rate 0: every timed call sees the same weights (so the same
    # loss-gradient sparsity), and still computes and writes the update.
    optimizer = LazyAdam(0.0)
    model.compile(optimizer=optimizer, loss=loss, jit_compile=False)
    optimizer.build(layer.trainable_variables)
    kernel, bias, indices = layer.kernel, layer.bias, layer.indices

    # The intermediate output: leaky ReLU of a Dense on a ReLU encoder
    # output (every entry non-zero, as the default activation gives).
    h = np.maximum(rng.standard_normal((b, d)), 0).astype(np.float32)
    dense = keras.layers.Dense(e, activation="leaky_relu", name="intermediate")
    dense.build((None, d))
    x = tf.constant(dense(h).numpy())
    h = tf.constant(h)
    ids = tf.constant(_ids(rng, b, m, n))

    scores = layer(x)
    with tf.GradientTape() as tape:
        tape.watch(scores)
        value = loss(ids, scores)
    g = tape.gradient(value, scores)
    g_np = g.numpy()
    rho = float(np.count_nonzero(g_np)) / g_np.size
    m_nz = int(np.count_nonzero(np.any(g_np != 0, axis=0)))
    del g_np
    rows = score_rows(m)
    out = {"shape": dict(b=b, e=e, d=d, m=m, s=s, n=n),
           "nonzero_fraction": rho, "m_nz": m_nz, "eval_rows": rows,
           "measured": {}, "head_step": None}
    measured = out["measured"]

    def run(part, fn, reps=repeats, warm=warmup):
        if part not in parts:
            return
        measured[part] = timed(fn, reps, warm)
        measured[part]["peak_rss_bytes"] = _peak_rss()
        log(f"  {name} {part}: {measured[part]['median_s'] * 1e3:.1f} ms "
            f"(peak RSS {(_peak_rss() or 0) / 2**30:.2f} GiB)")

    fwd = tf.function(lambda: _checksum(
        tf, uniform_sparse_matmul(x, indices, kernel)))
    run("forward", fwd)

    @tf.function
    def bias_part():
        y = scores + bias
        return _checksum(tf, y, tf.reduce_sum(g, axis=0))
    run("bias", bias_part)

    @tf.function
    def loss_part():
        with tf.GradientTape() as t:
            t.watch(scores)
            v = loss(ids, scores)
        return v + _checksum(tf, t.gradient(v, scores))
    run("loss_grad", loss_part)

    run("grad_features", tf.function(lambda: _checksum(
        tf, lib.xmc_uniform_sparse_matmul_grad_features(
            backward=g, features=x, indices=indices, weights=kernel))))
    run("grad_weights", tf.function(lambda: _checksum(
        tf, lib.xmc_uniform_sparse_matmul_grad_weights(
            backward=g, features=x, indices=indices))))

    if "adam" in parts:
        gk = lib.xmc_uniform_sparse_matmul_grad_weights(
            backward=g, features=x, indices=indices)
        gb = tf.reduce_sum(g, axis=0)
        apply = tf.function(lambda: optimizer.apply([gk, gb], [kernel, bias]))
        run("adam", apply)
        del gk, gb, apply

    if "intermediate" in parts or "intermediate_adam" in parts:
        dopt = LazyAdam(0.0)
        dopt.build(dense.trainable_variables)
        gx = tf.constant(rng.standard_normal((b, e)).astype(np.float32))

        @tf.function
        def inter():
            with tf.GradientTape() as t:
                t.watch(h)
                y = dense(h)
            grads = t.gradient(y, [h] + dense.trainable_variables,
                               output_gradients=gx)
            return _checksum(tf, y, *grads)
        run("intermediate", inter)
        dgrads = [tf.constant(v.numpy() * 1e-3)
                  for v in dense.trainable_variables]
        run("intermediate_adam", tf.function(
            lambda: dopt.apply(dgrads, dense.trainable_variables)))
        del dgrads

    eval_parts(tf, name, m, out, run, seed)

    if "head_step" in parts or set(HEAD_PARTS) <= set(parts):
        @tf.function
        def head_step():
            with tf.GradientTape() as t:
                t.watch(x)
                value = loss(ids, layer(x))
            grads = t.gradient(value, [x, kernel, bias])
            optimizer.apply(grads[1:], [kernel, bias])
            return value + _checksum(tf, grads[0])
        out["head_step"] = timed(head_step, repeats, warmup)
        log(f"  {name} head_step: "
            f"{out['head_step']['median_s'] * 1e3:.1f} ms")
        del head_step

    if "set_rewire" in parts:
        del fwd, bias_part, loss_part, scores, g
        gc.collect()
        callback = SetRewiring(every_n_steps=SET_EVERY, fraction=0.1,
                               seed=seed)
        callback.set_model(model)
        run("set_rewire", callback.rewire_now, reps=set_repeats, warm=1)
    return out


def eval_parts(tf, name, m, out, run, seed=0):
    """Times ``eval_topk`` (``xmc_tf.ops.topk.top_k``) and ``eval_topk_tf``
    (``tf.math.top_k``) on one evaluation block of ``out["eval_rows"]``
    standard-normal rows, and records whether the two agree."""
    from xmc_tf.ops.topk import top_k, top_k_supported
    rows = out["eval_rows"]
    block = tf.random.stateless_normal([rows, m], seed=[seed, 3])
    run("eval_topk", tf.function(
        lambda: _checksum(tf, *top_k(block, TOP_K))))
    run("eval_topk_tf", tf.function(
        lambda: _checksum(tf, *tf.math.top_k(block, k=TOP_K))))
    out["eval_topk_op"] = "Xmc>TopK" if top_k_supported() else \
        "tf.math.top_k (no Xmc>TopK in the op library)"
    out["eval_topk_identical"] = bool(np.array_equal(
        top_k(block, TOP_K).indices.numpy(),
        tf.math.top_k(block, k=TOP_K).indices.numpy()))
    del block


# ---------------------------------------------------------------------------
# Output.

def table(name, result):
    """The roofline table of one scale.

    Args:
      name: scale name.
      result: one entry of the JSON's ``"scales"`` (with ``"parts"`` and
        ``"step"``).

    Returns:
      str: one line per part (measured ms, limit ms, fraction, bound),
      then the head step, peak RSS and steady-state step lines.
    """
    sh, parts = result["shape"], result["parts"]
    about = (f"loss-gradient non-zeros {result['nonzero_fraction']:.1%}, "
             f"labels with signal {result['m_nz']:,}"
             if result.get("nonzero_fraction") is not None
             else "evaluation parts only")
    lines = [f"{name}: b={sh['b']} e={sh['e']} m={sh['m']:,} s={sh['s']}, "
             + about,
             f"{'part':<19}{'measured ms':>12}{'limit ms':>10}{'x limit':>9}"
             f"  bound"]
    for part in PARTS:
        if part not in parts:
            continue
        r = parts[part]
        frac = f"{r['fraction']:.1f}" if r["fraction"] is not None else "-"
        lines.append(f"{part:<19}{r['median_s'] * 1e3:>12.1f}"
                     f"{r['limit_s'] * 1e3:>10.2f}{frac:>9}  {r['bound']}")
    st = result["step"]
    if not any(p in parts for p in PARTS if p not in EVAL_PARTS):
        return "\n".join(lines)  # evaluation parts only: no step
    lines.append(f"head parts sum {st['head_parts_sum_s'] * 1e3:.1f} ms; "
                 f"whole head step {st['head_step_s'] * 1e3:.1f} ms")
    met = {None: "", True: " (met)", False: " (NOT met)"}[st["met"]]
    target = f", target {st['target_s']} s{met}" if st["target_s"] else ""
    if result.get("peak_rss_bytes"):
        lines.append(f"peak RSS so far {result['peak_rss_bytes'] / 2**30:.2f} "
                     "GiB")
    lines.append(f"steady-state step {st['step_s'] * 1e3:.1f} ms (limit "
                 f"{st['step_limit_s'] * 1e3:.1f} ms; SET / "
                 f"{st['set_every']}){target}")
    return "\n".join(lines)


def plot(results, path):
    """Bar chart of measured median vs limit per part (log time axis).

    Args:
      results: scale name -> result with ``"parts"``, ``"shape"`` and
        ``"step"`` (the JSON's ``"scales"``), one panel each.
      path: PNG file to write.
    """
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(results)
    fig, axes = plt.subplots(1, len(names), figsize=(7 * len(names), 4.5),
                             squeeze=False)
    for ax, name in zip(axes[0], names):
        parts = results[name]["parts"]
        keys = [p for p in PARTS if p in parts]
        xs = np.arange(len(keys))
        ax.bar(xs - 0.2, [parts[p]["median_s"] * 1e3 for p in keys], 0.4,
               label="measured (median)")
        ax.bar(xs + 0.2, [parts[p]["limit_s"] * 1e3 for p in keys], 0.4,
               label="limit (peaks)")
        for xi, p in zip(xs, keys):
            if parts[p]["fraction"] is not None:
                ax.text(xi, parts[p]["median_s"] * 1e3 * 1.15,
                        f"{parts[p]['fraction']:.1f}x", ha="center",
                        fontsize=8)
        ax.set_xticks(xs)
        ax.set_xticklabels(keys, rotation=35, ha="right")
        ax.set_yscale("log")
        top = max(max(parts[p]["median_s"], parts[p]["limit_s"]) for p in keys)
        ax.set_ylim(top=top * 1e3 * 3)  # room for the labels
        ax.set_ylabel("ms")
        sh = results[name]["shape"]
        st = results[name]["step"]
        ax.set_title(f"{name}: m={sh['m']:,}, s={sh['s']}, b={sh['b']}; "
                     f"step {st['step_s']:.2f} s")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def merge_parts(path, new):
    """``path``'s result with the parts of ``new`` put in (re-accounted
    against ``path``'s peaks, so every fraction in the file uses the same
    limits); ``new``'s load averages are kept per merged part.

    Args:
      path: an existing result JSON of this script.
      new: a result of :func:`main` (typically ``--parts eval_topk,...``).

    Returns:
      The merged result dict (not written).
    """
    with open(path) as f:
        old = json.load(f)
    for sc, r in new["scales"].items():
        if "parts" not in r or sc not in old["scales"]:
            continue
        dest = old["scales"][sc]
        sh = dest["shape"]
        models = part_models(sh["b"], sh["e"], sh["d"], sh["m"], sh["s"],
                             m_nz=dest.get("m_nz"), rows=r["eval_rows"])
        measured = {p: {k: v for k, v in part.items() if k in (
            "median_s", "min_s", "repeats", "peak_rss_bytes")}
            for p, part in r["parts"].items()}
        for p, row in account(measured, models,
                              old["peaks"]["all"]).items():
            row["load_average"] = [new["load_average_at_start"],
                                   r.get("load_average_after")]
            dest["parts"][p] = row
        for key in ("eval_topk_op", "eval_topk_identical"):
            if key in r:
                dest[key] = r[key]
    return old


def main(argv=None):
    """Command line (see the module docstring).

    Args:
      argv: arguments (default ``sys.argv[1:]``).

    Returns:
      The result dict written to ``--out``: ``peaks``, ``scales`` (name ->
      ``parts``, ``step``, ``head_step``, ``nonzero_fraction``, ``m_nz``,
      ``eval_rows``, ``peak_rss_bytes``, or ``skipped``), load averages,
      the TensorFlow version.
    """
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scales", default="670k,3m",
                   help=f"comma-separated, of {sorted(SCALES)}")
    p.add_argument("--small", action="store_true",
                   help="the 'small' scale and small peak loops (seconds)")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--set-repeats", type=int, default=3)
    p.add_argument("--parts", default=",".join(PARTS))
    p.add_argument("--out", default=os.path.join(HERE, "results",
                                                 "roofline.json"))
    p.add_argument("--merge-into", default="",
                   help="put the measured parts into this existing result "
                        "JSON (other parts, peaks and steps kept) instead "
                        "of writing --out")
    p.add_argument("--plot", default=os.path.join(HERE, "results",
                                                  "roofline.png"),
                   help='PNG chart (needs matplotlib); "" for none')
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf
    scales = ["small"] if args.small else args.scales.split(",")
    for sc in scales:
        if sc not in SCALES:
            raise SystemExit(f"unknown scale {sc!r}; have {sorted(SCALES)}")
    load_at_start = os.getloadavg()
    print(f"# {platform.node()} cpus={os.cpu_count()} "
          f"load={load_at_start} tf={tf.__version__}", flush=True)
    widest = max(SCALES[sc]["e"] for sc in scales)
    small = dict(copy_mib=64, gather_table_mib=64, gathers=1_000_000,
                 fma_iters=2_000_000, repeats=2) if args.small else {}
    peaks = machine_peaks(table_rows=widest, row_width=SCALES[scales[0]]["b"],
                          **small)
    peaks["library"] = library_rates(
        tf, n=512 if args.small else 2048, stream_mib=64 if args.small
        else 512, repeats=2 if args.small else 5)
    for t, v in peaks["per_thread_count"].items():
        print(f"peaks, {t} thread(s): FMA {v['fma_gflops']:.0f} GFLOP/s, "
              f"copy {v['copy_gbs']:.1f} / read {v['read_gbs']:.1f} / add "
              f"{v['add_gbs']:.1f} GB/s, row gather "
              f"{v['row_gather_rows_per_s'] / 1e6:.0f} M rows/s "
              f"({v['row_gather_gbs']:.0f} GB/s), element gather "
              f"{v['element_gather_per_s'] / 1e6:.0f} M/s", flush=True)
    a = peaks["all"]
    print(f"limits use (best over thread counts): FMA {a['fma_gflops']:.0f} "
          f"GFLOP/s, bandwidth {a['bandwidth_gbs']:.1f} GB/s, row gather "
          f"{a['row_gather_rows_per_s'] / 1e6:.0f} M rows/s", flush=True)
    lib_rates = peaks["library"]
    print(f"TF matmul {lib_rates['tf_matmul_gflops']:.0f} GFLOP/s; NumPy copy "
          f"{lib_rates['numpy_copy_gbs']:.1f} GB/s, TF element-wise "
          f"{lib_rates['tf_elementwise_gbs']:.1f} GB/s", flush=True)
    parts = tuple(args.parts.split(","))
    results = {}
    for sc in scales:
        spec = SCALES[sc]
        need, avail = memory_estimate(**spec), _mem_available()
        if set(parts) <= set(EVAL_PARTS):  # one score block, twice
            need = 8 * score_rows(spec["m"]) * spec["m"]
        if avail is not None and avail < need + 2 ** 30:
            note = (f"skipped: needs about {need / 2**30:.1f} GiB, "
                    f"{avail / 2**30:.1f} GiB available")
            print(f"{sc}: {note}", flush=True)
            results[sc] = {"skipped": note}
            continue
        r = measure_scale(tf, sc, repeats=args.repeats, warmup=args.warmup,
                          set_repeats=args.set_repeats, parts=parts, **spec)
        models = part_models(spec["b"], spec["e"], spec["d"], spec["m"],
                             spec["s"], m_nz=r["m_nz"], rows=r["eval_rows"])
        r["parts"] = account(r.pop("measured"), models, peaks["all"])
        whole = r["head_step"]["median_s"] if r["head_step"] else None
        r["step"] = step_summary(r["parts"], whole, target=TARGETS.get(sc))
        r["load_average_after"] = os.getloadavg()
        r["peak_rss_bytes"] = _peak_rss()
        results[sc] = r
        print(table(sc, r), flush=True)
        gc.collect()
    result = {"peaks": peaks, "scales": results, "cpus": os.cpu_count(),
              "load_average_at_start": load_at_start,
              "tf_version": tf.__version__, "set_every": SET_EVERY}
    if args.merge_into:
        result = merge_parts(args.merge_into, result)
        args.out = args.merge_into
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"wrote {args.out}")
    if args.plot and any("parts" in r for r in results.values()):
        plot({k: r for k, r in results.items() if "parts" in r}, args.plot)
        print(f"wrote {args.plot}")
    return result


if __name__ == "__main__":
    main()
