"""MACH training under tf.distribute.MirroredStrategy on two logical CPUs.

Logical devices must be configured before TensorFlow initialises its
devices, which pytest's process has long done; the body therefore runs in a
fresh interpreter (``sys.executable -c``).
"""

import json
import os
import subprocess
import sys
import textwrap

from op_requirements import missing_ops, skip_or_fail

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = textwrap.dedent(r"""
    import json
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(
        cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

    import keras
    import numpy as np
    from xmc_tf.layers.mach import MachHead
    from xmc_tf.losses.mach import MachBinaryCrossentropy
    from xmc_tf.errors import OpLibraryError
    from xmc_tf.ops import _loader

    keras.utils.set_random_seed(0)
    rng = np.random.default_rng(0)
    m, d, n = 300, 32, 4000
    protos = rng.normal(size=(m, d)).astype(np.float32)
    y = np.stack([rng.integers(0, m, n), rng.integers(0, m, n)], 1)
    y[::2, 1] = -1  # label ids padded with -1
    x = protos[y[:, 0]] + np.where(y[:, 1:] >= 0, protos[y[:, 1]], 0)
    x = (x + 0.3 * rng.normal(size=x.shape)).astype(np.float32)
    ds = tf.data.Dataset.from_tensor_slices(
        (x[:3500], y[:3500].astype(np.int32))).batch(128)

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    with strategy.scope():
        inputs = keras.Input((d,))
        hidden = keras.layers.Dense(128, activation="relu")(inputs)
        head = MachHead(m, 32, 6, seed=3, name="mach_head")
        model = keras.Model(inputs, head(hidden))
        model.compile(optimizer=keras.optimizers.Adam(0.005),
                      loss=MachBinaryCrossentropy(head), jit_compile=False)
    hist = model.fit(ds, epochs=4, verbose=0)
    out = {"replicas": strategy.num_replicas_in_sync,
           "loss": [float(v) for v in hist.history["loss"]],
           "kernel_shape": list(head.kernel.shape)}
    try:
        has_op = hasattr(_loader.load(), "xmc_mach_top_k")
    except OpLibraryError:
        has_op = False
    if not has_op:
        out["p1"] = None
    else:
        ids, _ = head.decode(model.predict(x[3500:], verbose=0), 1,
                             activation="sigmoid")
        top = ids.numpy()[:, 0]
        out["p1"] = float(np.mean((top == y[3500:, 0]) | (top == y[3500:, 1])))
    print("RESULT " + json.dumps(out))
""")


def test_mirrored_strategy_two_logical_cpus_trains():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    line = [l for l in proc.stdout.splitlines() if l.startswith("RESULT ")]
    assert line, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(line[-1][len("RESULT "):])
    assert result["replicas"] == 2
    assert result["kernel_shape"] == [6, 128, 32]
    losses = result["loss"]
    assert all(l == l for l in losses)  # no NaN
    assert losses[-1] < 0.7 * losses[0], losses
    if result["p1"] is None:  # trained, but cannot decode
        skip_or_fail("decoding: " + missing_ops("xmc_mach_top_k"))
    assert result["p1"] > 0.3, result  # chance < 1 %
