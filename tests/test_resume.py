"""A killed ``xmc-tf train`` resumes exactly (xmc_tf.job.checkpoint).

One run goes uninterrupted; another is SIGKILLed mid-epoch (SET rewiring
every 3 steps), then killed again while exporting, then rerun to the end.
The final connectivity, weights, metrics and history must equal the
uninterrupted run's exactly.

Determinism pinned in the training processes (``_SCRIPT``): one inter-op
and one intra-op thread, ``tf.config.experimental.enable_op_determinism()``;
the job itself calls ``keras.utils.set_random_seed(config.seed)`` and seeds
the dropout layers, the SET RNG and the shuffle (keyed by (seed, epoch)).
"""

import csv
import json
import os
import signal
import subprocess
import sys

import keras
import numpy as np
import pytest

import xmc_tf  # noqa: F401  (Keras classes for loading the models)
from xmc_tf.job import checkpoint as ckpt
from xmc_tf.job.workdir import IncompleteWorkdir, Workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_SCRIPT = r'''
import os, signal, sys
import tensorflow as tf
tf.config.threading.set_inter_op_parallelism_threads(1)
tf.config.threading.set_intra_op_parallelism_threads(1)
tf.config.experimental.enable_op_determinism()
import keras
from xmc_tf import saving
from xmc_tf.job import fit
from xmc_tf_cli import cli

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

kill_at = int(os.environ.get("KILL_AT_STEP", "0"))
if kill_at:
    class Kill(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if int(self.model.optimizer.iterations) == kill_at:
                die()
    make = fit.make_callbacks
    fit.make_callbacks = lambda *a, **k: make(*a, **k) + [Kill()]
if os.environ.get("KILL_IN_EXPORT"):  # after model.keras is in place
    saving.export_saved_model = die
sys.exit(cli.main(["xmc-tf"] + sys.argv[1:]))
'''

# 300 instances, 10 % validation: 270 / 32 -> 9 steps per epoch.
SYN = "synthetic:num_instances=300,num_features=80,num_labels=20,seed=1"
ARGS = ["train", "--config=configs/uniform_sparse.py",
        f"--config.data.train={SYN}", f"--config.data.test={SYN}",
        "--config.train.epochs=5", "--config.model.encoder_dims=(16,)",
        "--config.model.intermediate_dim=32",
        "--config.model.connections_per_label=8",
        "--config.set.every_n_steps=3", "--config.set.fraction=0.25",
        "--config.train.batch_size=32", "--config.train.lr_patience=1",
        # all five epochs run (the LR still halves on plateaus)
        "--config.train.early_stopping_patience=5",
        "--config.train.verbose=0"]
STEPS_PER_EPOCH = 9


def _start(tmp_path, workdir, extra=(), **env):
    script = tmp_path / "det_train.py"
    script.write_text(_SCRIPT)
    return subprocess.Popen(
        [sys.executable, str(script), *ARGS, *extra,
         f"--workdir={workdir}"],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3",
                 **{k: str(v) for k, v in env.items()}),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)


def _train(tmp_path, workdir, extra=(), **env):
    """Runs to the end (or the kill); returns (exit status, stderr)."""
    proc = _start(tmp_path, workdir, extra, **env)
    _, err = proc.communicate()
    return proc.returncode, err[-3000:]


def _history(workdir):
    with open(os.path.join(workdir, "history.csv")) as f:
        return list(csv.DictReader(f))


# "fused": the schedule follows the validation P@k of the network fused
# with the label tree (fit before training, reloaded by the resume);
# "cosine": the learning rate follows a per-step cosine (read at the
# optimizer's restored step counter) instead of halving on plateaus.
# "fused_adam": the head steps its bfloat16 kernel in the backward
# (config.model.head_update, head_dtype): the fused state, its step count
# and the bfloat16 variables go through the checkpoint too.
@pytest.mark.parametrize("monitor,schedule,head_update", [
    ("auto", "plateau", "optimizer"), ("fused", "plateau", "optimizer"),
    ("auto", "cosine", "optimizer"), ("auto", "plateau", "fused_adam")])
def test_killed_run_resumes_exactly(tmp_path, monitor, schedule,
                                    head_update):
    ref, run = tmp_path / "uninterrupted", tmp_path / "killed"
    extra = [f"--config.train.monitor={monitor}",
             f"--config.train.schedule={schedule}",
             f"--config.model.head_update={head_update}"]
    if head_update != "optimizer":
        extra.append("--config.model.head_dtype=bfloat16")
    reference = _start(tmp_path, ref, extra)  # runs beside the killed one

    kill_step = 2 * STEPS_PER_EPOCH + 4  # mid third epoch
    code, err = _train(tmp_path, run, extra, KILL_AT_STEP=kill_step)
    assert code == -signal.SIGKILL, err
    state = ckpt.load(os.path.join(run, "backup"))
    assert state.meta["epochs_done"] == 2 and state.meta["phase"] == "training"
    assert len(_history(run)) == 2
    assert not os.path.exists(run / "metrics.json")

    # Resumed, then killed after model.keras is written: not complete.
    code, err = _train(tmp_path, run, extra, KILL_IN_EXPORT=1)
    assert code == -signal.SIGKILL, err
    assert (run / "model.keras").exists()
    with pytest.raises(IncompleteWorkdir, match="resume"):
        Workdir(str(run)).check_complete()

    code, err = _train(tmp_path, run, extra)  # from the "trained" state
    assert code == 0, err
    assert not (run / "backup").exists()
    _, err = reference.communicate()
    assert reference.returncode == 0, err[-3000:]

    a = keras.models.load_model(ref / "model.keras", compile=False)
    b = keras.models.load_model(run / "model.keras", compile=False)
    assert [v.path for v in a.weights] == [v.path for v in b.weights]
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb),
                                      err_msg=va.path)

    ma = json.loads((ref / "metrics.json").read_text())
    mb = json.loads((run / "metrics.json").read_text())
    assert mb["run"]["resumes"] == 2 and ma["run"]["resumes"] == 0
    assert Workdir(str(run)).check_complete() == mb
    def untimed(value):  # the finalize phase's seconds are timings too
        if isinstance(value, dict):
            return {k: v for k, v in value.items()
                    if not k.endswith("seconds")}
        return value
    for key in ma:
        if key not in ("run", "train_seconds", "peak_memory_bytes"):
            assert untimed(mb[key]) == untimed(ma[key]), key
    assert mb["epochs"] == 5 and mb["train_seconds"] > 0
    # The history of all processes, each epoch once, equal to the
    # uninterrupted run's; SET really rewired many times.
    ha, hb = _history(ref), _history(run)
    assert [r["epoch"] for r in hb] == [str(e) for e in range(5)]
    assert ha == hb
    assert ("val_fused_precision" in hb[0]) == (monitor == "fused")
    assert int(float(hb[-1]["set_rewires"])) == 5 * STEPS_PER_EPOCH // 3
    assert int(float(hb[-1]["set_moved"])) == 20 * 2  # 25 % of 8 per label


def test_resume_with_another_number_of_epochs(tmp_path):
    """``train.epochs`` may change between a run and its resume: the run
    ends at the new count, and the resume says so in one line."""
    run = tmp_path / "killed"
    code, err = _train(tmp_path, run, KILL_AT_STEP=STEPS_PER_EPOCH + 2)
    assert code == -signal.SIGKILL, err
    assert ckpt.load(os.path.join(run, "backup")).meta["epochs_done"] == 1
    ARGS_3 = [a if a != "--config.train.epochs=5" else
              "--config.train.epochs=3" for a in ARGS]
    script = tmp_path / "det_train.py"
    proc = subprocess.run(
        [sys.executable, str(script), *ARGS_3, f"--workdir={run}"],
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"), capture_output=True,
        text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    said = [l for l in proc.stderr.splitlines()
            if "resuming with config.train.epochs=3" in l]
    assert len(said) == 1 and "had 5" in said[0], proc.stderr[-3000:]
    assert len(_history(run)) == 3
    assert json.loads((run / "metrics.json").read_text())["epochs"] == 3
