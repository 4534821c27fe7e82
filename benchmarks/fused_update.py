"""The head's backward + update: the model's optimizer against the fused op.

What it measures
----------------
One training backward of a uniform-sparse head at the shapes of
``benchmarks/scale.py`` (Amazon-670K: m = 670,091, s = 32; Amazon-3M:
m = 2,812,281, s = 96; an intermediate of e = 32,768, batch 32), from an
upstream signal with a fraction ``--densities`` of non-zero entries (the
squared hinge's signal: a few positives and the violating negatives per
instance; most of it early in training, a small share later), for

* ``optimizer``: what ``UniformSparseDense`` without ``fused_update`` runs:
  ``Xmc>UniformSparseMatmulGrad`` (both gradients; a dense ``[m, s]``
  float32 weights gradient) and then the in-place Adam step on the whole
  kernel (``Xmc>ResourceApplyAdam``, what
  :class:`xmc_tf.optimizers.LazyAdam` runs on a dense gradient);
* ``fused_adam_*``, ``fused_lazy_adam_*``, ``fused_sgd_bf16``:
  ``Xmc>UniformSparseGradApply`` (the features gradient and the step, in
  one op: of every label for ``fused_adam``, as Adam on the dense
  gradient; of the labels with signal only for the lazy rule and SGD) on a
  float32 / bfloat16 kernel (Kahan steps for bfloat16).

Reported per method: the median of ``--repeats`` calls (after one warm-up)
in ms, the bytes of the kernel and its optimizer state, and the bytes the
call allocates beyond them (the dense gradient for ``optimizer``), from the
shapes.  The whole-process picture of a training run is
``benchmarks/memory_parts.py``'s.

Usage::

    python benchmarks/fused_update.py --out benchmarks/results/fused_update.json
    python benchmarks/fused_update.py --scales 670k --repeats 3

Times are milliseconds on this machine's cores (TensorFlow's intra-op
pool); bytes are bytes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import ml_dtypes
import numpy as np

SCALES = {"670k": (670_091, 32), "3m": (2_812_281, 96), "tiny": (5_000, 8)}
METHODS = ("optimizer", "fused_adam_f32", "fused_lazy_adam_f32",
           "fused_adam_bf16", "fused_lazy_adam_bf16", "fused_sgd_bf16")


def _signal(rng, batch, m, density):
    """``[batch, m]`` float32 with ``density`` of its entries non-zero."""
    out = np.zeros((batch, m), np.float32)
    nnz = max(1, int(density * batch * m))
    rows = rng.integers(0, batch, nnz)
    cols = rng.integers(0, m, nnz)
    out[rows, cols] = rng.normal(size=nnz).astype(np.float32)
    return out


def measure(scale: str, batch: int, e: int, density: float, repeats: int,
            seed: int = 0) -> dict:
    import tensorflow as tf

    from xmc_tf.ops import resource_apply_adam, uniform_sparse_grad_apply
    from xmc_tf.ops._loader import load

    m, s = SCALES[scale]
    rng = np.random.default_rng(seed)
    indices = tf.constant(rng.integers(0, e, size=(m, s), dtype=np.int32))
    features32 = tf.constant(rng.normal(size=(batch, e)).astype(np.float32))
    back32 = tf.constant(_signal(rng, batch, m, density))
    w0 = (rng.normal(size=(m, s)) * 0.01).astype(np.float32)
    lib = load()
    rows = {}
    for method in METHODS:
        bf16 = method.endswith("bf16")
        dtype = ml_dtypes.bfloat16 if bf16 else np.float32
        kernel = tf.Variable(w0.astype(dtype))
        features = tf.cast(features32, tf.bfloat16) if bf16 else features32
        back = tf.cast(back32, tf.bfloat16) if bf16 else back32
        if method == "optimizer":
            state = [tf.Variable(tf.zeros_like(kernel)) for _ in range(2)]

            @tf.function(jit_compile=False)
            def step():
                gx, gw = lib.xmc_uniform_sparse_matmul_grad(
                    backward=back, features=features, indices=indices,
                    weights=kernel)
                resource_apply_adam(kernel, state[0], state[1], 1e-3, 0.9,
                                    0.999, 1e-7, gw)
                return tf.reduce_sum(gx[:1])
            extra = 4 * m * s  # the dense [m, s] float32 weights gradient
        else:
            rule = "sgd" if method.startswith("fused_sgd") else "adam"
            lazy = "lazy" in method or rule == "sgd"
            count = (1 if bf16 else 0) + (2 if rule == "adam" else 0)
            state = [tf.Variable(tf.zeros_like(kernel)) for _ in range(count)]

            @tf.function(jit_compile=False)
            def step():
                gx = uniform_sparse_grad_apply(
                    back, features, indices, kernel, state, 1e-3, rule=rule,
                    kahan=bf16, lazy=lazy)
                return tf.reduce_sum(gx[:1])
            extra = 0
        step().numpy()  # warm-up (tracing)
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            step().numpy()
            times.append(time.perf_counter() - t)
        item = np.dtype(dtype).itemsize
        rows[method] = {
            "ms": round(1e3 * statistics.median(times), 2),
            "kernel_bytes": item * m * s,
            "state_bytes": item * m * s * len(state),
            "transient_bytes": extra}
        del kernel, state, step
    labels_with_signal = int(np.count_nonzero(back32.numpy().any(axis=0)))
    return {"scale": scale, "num_labels": m, "fan_in": s, "batch": batch,
            "num_features": e, "density": density,
            "labels_with_signal": labels_with_signal, "methods": rows}


def print_table(row: dict) -> None:
    gib = 2 ** 30
    print(f"\n{row['scale']}: m={row['num_labels']:,}, s={row['fan_in']}, "
          f"e={row['num_features']:,}, batch {row['batch']}, signal "
          f"density {row['density']} ({row['labels_with_signal']:,} labels "
          "with signal)")
    print("| method | ms | kernel GiB | state GiB | dense gradient GiB |")
    print("|---|---|---|---|---|")
    for name, r in row["methods"].items():
        print(f"| {name} | {r['ms']} | {r['kernel_bytes'] / gib:.3f} | "
              f"{r['state_bytes'] / gib:.3f} | "
              f"{r['transient_bytes'] / gib:.3f} |")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--scales", default="670k,3m")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--features", type=int, default=32768)
    p.add_argument("--densities", default="0.001,0.05",
                   help="fractions of non-zero signal entries, comma-separated")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default=None, help="write the results as JSON")
    args = p.parse_args(argv)
    rows = []
    for scale in args.scales.split(","):
        for density in args.densities.split(","):
            row = measure(scale, args.batch, args.features, float(density),
                          args.repeats)
            print_table(row)
            rows.append(row)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"machine": os.uname().nodename, "runs": rows}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
