"""``xmc-tf train --strategy=multi_worker|mirrored``: data parallel through
``tf.distribute``, against one process.

Two workers are two ``python -m xmc_tf train`` processes on free localhost
ports (``TF_CONFIG`` naming both), each with its own ``--workdir`` (as on
two machines without a shared disk) and its own ``TMPDIR``.  Checked: both
exit 0 and print the same metrics; only the chief (worker 0) wrote its
workdir, and worker 1 left nothing behind; the metrics match one process
on the same config; a run killed after its first epoch resumes, on every
worker, to exactly the uninterrupted run's model; ``--strategy=mirrored``
on two logical CPUs computes what the two workers compute; a bad
``TF_CONFIG`` and workers started with different configs stop with one
line each (the message when configs differ is checked with a stand-in
for the collective steps).

Why the comparison with one process can be tight: the config has no
dropout (whose masks are drawn per replica, so they differ from one
process's) and 540 fit instances in batches of 36, so every global batch
splits into two chunks of 18.  A data-parallel step then computes the
one-process gradient -- the mean of the two chunk means is the batch mean
-- up to the order of float additions, and SET rewires the same
connections on the same steps.  Measured: epoch losses equal to 1e-6
(relative), test P@1 equal (67.0).  Asserted: losses to 1e-4, P@1 to 1.0
point (4 of the 400 test instances).  The losses are the sharp check: one
process trained on half of every batch -- what a worker whose gradient
were left out of the all-reduce would train -- ends at P@1 67.25, but its
epoch losses differ by 0.5, 4 and 7 %.
"""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from local_cluster import free_ports
from xmc_tf import data as xdata
from xmc_tf.job.workdir import Workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EPOCHS = 3
SMALL = [f"--config.train.epochs={EPOCHS}",
         "--config.model.encoder_dims=(32,)",
         "--config.model.intermediate_dim=64",
         "--config.model.connections_per_label=8",
         "--config.model.wide_connections=16",
         "--config.model.dropout=0.0",
         "--config.set.every_n_steps=4",
         "--config.train.batch_size=36",  # 540 fit instances: 15 x 36
         "--config.train.learning_rate=0.005",
         "--config.train.early_stopping_patience=5",
         "--config.train.verbose=0"]
STEPS_PER_EPOCH = 15


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """XC-repo train (600 instances) and test (400) files."""
    tmp = tmp_path_factory.mktemp("data")
    data = xdata.make_synthetic(1000, 200, 40, labels_per_instance=3,
                                features_per_instance=12, noise=0.7, seed=3)
    xdata.write_xc(tmp / "train.txt", xdata.XCDataset(
        features=data.features[:600], labels=data.labels[:600]))
    xdata.write_xc(tmp / "test.txt", xdata.XCDataset(
        features=data.features[600:], labels=data.labels[600:]))
    return [f"--config.data.train={tmp / 'train.txt'}",
            f"--config.data.test={tmp / 'test.txt'}"]


def _args(files, workdir, *extra):
    return (["train", "--config=uniform_sparse", f"--workdir={workdir}"]
            + files + SMALL + list(extra))


def _env(**extra):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2", CUDA_VISIBLE_DEVICES="")
    env["PYTHONPATH"] = os.pathsep.join(
        [REPO] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env.pop("TF_CONFIG", None)
    env.update(extra)
    return env



def _start_workers(tmp, make_args, name):
    """Starts workers 0 and 1 (``python -m xmc_tf train``), worker ``i``
    with ``make_args(i)``, ``TMPDIR=tmp/name-tmpI``; returns the
    processes."""
    ports = free_ports(2)
    procs = []
    for index in range(2):
        tmpdir = tmp / f"{name}-tmp{index}"
        tmpdir.mkdir(exist_ok=True)
        tf_config = json.dumps({
            "cluster": {"worker": [f"localhost:{p}" for p in ports]},
            "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "xmc_tf", *make_args(index),
             "--strategy=multi_worker"],
            env=_env(TF_CONFIG=tf_config, TMPDIR=str(tmpdir)), cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _finish(procs, timeout=240):
    """Waits for the processes; returns ``[(returncode, stdout, stderr)]``
    (killing them all if one hangs)."""
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            out.append((p.returncode, stdout, stderr))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.communicate()
    return out


def _log(results):
    return "\n".join(f"--- worker {i} (exit {code}) ---\n{o[-2000:]}\n"
                     f"{e[-4000:]}" for i, (code, o, e) in enumerate(results))


def _two_workers(tmp, files, name, dirs=None):
    """Runs two workers to the end (workdirs ``dirs``, default
    ``tmp/NAME-wI``); returns (workdirs, results)."""
    dirs = dirs or [tmp / f"{name}-w{i}" for i in range(2)]
    results = _finish(_start_workers(
        tmp, lambda i: _args(files, dirs[i]), name))
    assert [code for code, _, _ in results] == [0, 0], _log(results)
    return dirs, results


def _metrics(workdir):
    return json.loads((workdir / "metrics.json").read_text())


def _history(workdir):
    lines = (workdir / "history.csv").read_text().splitlines()
    keys = lines[0].split(",")
    return [dict(zip(keys, map(float, line.split(",")))) for line in lines[1:]]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory, files):
    """The same config in this process, without a strategy."""
    from xmc_tf_cli import cli
    workdir = tmp_path_factory.mktemp("one") / "run"
    assert cli.main(["xmc-tf", *_args(files, workdir)]) == 0
    return workdir


@pytest.fixture(scope="module")
def two_workers(tmp_path_factory, files):
    tmp = tmp_path_factory.mktemp("two")
    dirs, results = _two_workers(tmp, files, "plain")
    return tmp, dirs, results


def test_two_workers_only_the_chief_writes(two_workers):
    tmp, (chief, other), results = two_workers
    # Worker 1 wrote nothing: no workdir, and its temporary directory
    # (its own checkpoints) was removed.
    assert not other.exists()
    assert os.listdir(tmp / "plain-tmp1") == []
    metrics = Workdir(str(chief)).check_complete()  # model files match
    assert metrics["strategy"] == "multi_worker"
    assert metrics["num_workers"] == 2 and metrics["num_replicas"] == 2
    assert metrics["epochs"] == EPOCHS and metrics["run"]["resumes"] == 0
    assert not (chief / "backup").exists()
    assert len(_history(chief)) == EPOCHS
    # Both print the chief's table; worker 1 says where the files are.
    (_, out0, _), (_, out1, _) = results
    row = next(line for line in out0.splitlines() if line.startswith("P@1 "))
    assert float(row.split()[1]) == pytest.approx(metrics["P@1"], abs=0.01)
    assert row in out1.splitlines()
    assert f"wrote {chief / 'metrics.json'}" in out0
    assert "worker 1 of 2: done; the chief (worker 0) wrote" in out1


def test_two_workers_match_one_process(two_workers, one_process):
    _, (chief, _), _ = two_workers
    one, two = _metrics(one_process), _metrics(chief)
    assert "strategy" not in one
    assert one["P@1"] > 60, one  # learnt (the most frequent label: 49)
    # See the module docstring for the tolerances.
    assert two["P@1"] == pytest.approx(one["P@1"], abs=1.0), (one, two)
    h1, h2 = _history(one_process), _history(chief)
    assert [r["set_rewires"] for r in h2] == [r["set_rewires"] for r in h1]
    for a, b in zip(h1, h2):
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-4), (h1, h2)
        assert b["val_precision_at_3"] == pytest.approx(
            a["val_precision_at_3"], abs=0.01), (h1, h2)
    assert h1[-1]["loss"] < 0.9 * h1[0]["loss"], h1


def test_killed_two_worker_run_resumes_on_every_worker(tmp_path, files,
                                                       two_workers):
    """Both workers are killed once the chief's first epoch is backed up;
    the same two commands then resume (worker 1 from the chief's backup,
    which it cannot see on disk) and end with the uninterrupted model."""
    _, (reference, _), _ = two_workers
    dirs = [tmp_path / f"w{i}" for i in range(2)]
    procs = _start_workers(tmp_path, lambda i: _args(files, dirs[i]),
                           "killed")
    backup = dirs[0] / "backup" / "checkpoint.npz"
    deadline = time.monotonic() + 240
    while not backup.exists() and all(p.poll() is None for p in procs):
        assert time.monotonic() < deadline, "no backup written"
        time.sleep(0.02)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    results = _finish(procs)
    assert [code for code, _, _ in results] == [-signal.SIGKILL] * 2, (
        _log(results))
    assert not (dirs[0] / "metrics.json").exists()
    assert not dirs[1].exists()

    _, results = _two_workers(tmp_path, files, "resumed", dirs)
    assert "resuming run" in results[1][2], _log(results)  # worker 1 too
    metrics = _metrics(dirs[0])
    assert metrics["run"]["resumes"] == 1 and metrics["epochs"] == EPOCHS
    assert not dirs[1].exists()
    assert os.listdir(tmp_path / "resumed-tmp1") == []
    ref = _metrics(reference)
    for key in ("P@1", "P@3", "P@5", "nDCG@5", "PSP@5"):
        assert metrics[key] == ref[key], key
    assert _history(dirs[0]) == _history(reference)
    import keras
    import xmc_tf  # noqa: F401  (the layers, for loading)
    a = keras.models.load_model(reference / "model.keras", compile=False)
    b = keras.models.load_model(dirs[0] / "model.keras", compile=False)
    for va, vb in zip(a.weights, b.weights):
        np.testing.assert_array_equal(np.asarray(va), np.asarray(vb),
                                      err_msg=va.path)


_MIRRORED = r"""
import sys
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(
    cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
from xmc_tf_cli import cli
sys.exit(cli.main(["xmc-tf"] + sys.argv[1:]))
"""


def test_mirrored_on_two_cpus_matches_two_workers_and_one_process(
        tmp_path, files, two_workers, one_process):
    """``--strategy=mirrored`` uses the logical CPUs of a machine without
    GPUs: two here, so its replicas get the chunks the two workers get."""
    workdir = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-c", _MIRRORED, *_args(files, workdir),
         "--strategy=mirrored"], env=_env(), cwd=REPO, capture_output=True,
        text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    metrics = _metrics(workdir)
    assert metrics["strategy"] == "mirrored"
    assert metrics["num_workers"] == 1 and metrics["num_replicas"] == 2
    _, (chief, _), _ = two_workers
    for a, b in zip(_history(chief), _history(workdir)):
        assert b == pytest.approx(a, rel=1e-5)
    assert metrics["P@1"] == pytest.approx(_metrics(chief)["P@1"], abs=0.5)
    assert metrics["P@1"] == pytest.approx(_metrics(one_process)["P@1"],
                                           abs=1.0)


class _FakeCluster:
    """A :class:`xmc_tf.job.cluster.Cluster` of two workers whose collective
    steps are given: the chief's broadcast value and how many workers
    differ (the real ones run in every two-worker run above, where the
    workers agree)."""

    def __init__(self, is_chief, chief_value, bad):
        from xmc_tf.job.cluster import Cluster
        self.cluster = Cluster()
        c = self.cluster
        c.multi_worker, c.num_workers = True, 2
        c.index, c.is_chief = (0, True) if is_chief else (1, False)
        c.broadcast_json = lambda obj=None: chief_value
        c._sum_over_workers = lambda count: bad


def test_workers_with_different_configs_stop_with_one_line():
    from xmc_tf.errors import DistributeError
    chief = {"seed": 0, "train": {"epochs": 2, "batch_size": 36}}
    mine = {"seed": 0, "train": {"epochs": 3, "batch_size": 36}}
    with pytest.raises(DistributeError) as e:
        _FakeCluster(False, chief, 1).cluster.check_same("config", mine)
    assert str(e.value).startswith(
        "worker 1 of 2 runs with another config than the chief (worker 0): "
        "train.epochs=3 (chief: 2); every worker must run the same command")
    with pytest.raises(DistributeError, match="1 of the 1 other workers run "
                                              "with another config"):
        _FakeCluster(True, chief, 1).cluster.check_same("config", chief)
    _FakeCluster(False, chief, 0).cluster.check_same("config", chief)


@pytest.mark.parametrize("tf_config,message", [
    (None, "TF_CONFIG is not set"),
    ("{'cluster': []}", "TF_CONFIG is not JSON"),
    ('{"cluster": {"worker": ["localhost:1"]}}', 'TF_CONFIG has no "task"'),
    ('{"cluster": {"worker": ["localhost"]}, "task": {"type": "worker", '
     '"index": 0}}', '"host:port" strings'),
    ('{"cluster": {"worker": ["a:1", "b:2"]}, "task": {"type": "worker", '
     '"index": 2}}', "task index 2 is not an index"),
    ('{"cluster": {"worker": ["a:1"], "ps": ["b:2"]}, "task": {"type": '
     '"worker", "index": 0}}', "names tasks ['ps']"),
])
def test_bad_tf_config_is_one_line(tmp_path, tf_config, message):
    env = _env()
    if tf_config is not None:
        env["TF_CONFIG"] = tf_config
    proc = subprocess.run(
        [sys.executable, "-m", "xmc_tf_cli", "train", "--config=quickstart",
         f"--workdir={tmp_path / 'run'}", "--strategy=multi_worker"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("xmc-tf: error: --strategy=multi_worker: ")
    assert message in lines[0]
    assert not (tmp_path / "run").exists()


def test_strategy_flag_rejects_unknown_values(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "xmc_tf_cli", "train",
         f"--workdir={tmp_path / 'run'}", "--strategy=tpu"],
        env=_env(), cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr == ("xmc-tf: error: flag --strategy=tpu: value should "
                           "be one of <none|mirrored|multi_worker>\n")


class _TwoReplicas:
    """What :func:`xmc_tf.job.checks.check_strategy` reads of a Cluster."""
    num_replicas = 2


@pytest.mark.parametrize("overrides,message", [
    ({"train.batch_size": 33}, "batch_size=33 must be a multiple of the 2 "
                               "replicas"),
    ({"model.ensemble_size": 3}, "ensembles are trained without a strategy"),
])
def test_check_strategy(overrides, message):
    from xmc_tf import config as xconfig
    from xmc_tf.job import checks
    from xmc_tf.errors import ConfigError
    config = xconfig.get_config("uniform_sparse")
    for key, value in overrides.items():
        section, field = key.split(".")
        config[section][field] = value
    head = checks.check_config(config)
    with pytest.raises(ConfigError, match=message):
        checks.check_strategy(config, head, _TwoReplicas())
    config.model.ensemble_size, config.train.batch_size = 1, 64
    checks.check_strategy(config, head, _TwoReplicas())  # fine


@pytest.mark.parametrize("name", ["astra", "lsh", "scent"])
def test_check_strategy_refuses_heads_with_per_process_state(name):
    from xmc_tf import config as xconfig
    from xmc_tf.job import checks
    from xmc_tf.errors import ConfigError
    from xmc_tf.job import heads
    config = xconfig.get_config(name)
    with pytest.raises(ConfigError, match="cannot be trained under a "
                                          "tf.distribute strategy"):
        checks.check_strategy(config, heads.get_head(config), _TwoReplicas())


def test_parse_tf_config_with_a_chief_task():
    from xmc_tf.job.cluster import parse_tf_config
    cluster = {"chief": ["c:1"], "worker": ["a:1", "b:2"]}
    infos = [parse_tf_config(json.dumps({"cluster": cluster, "task": task}))
             for task in ({"type": "chief", "index": 0},
                          {"type": "worker", "index": 0},
                          {"type": "worker", "index": 1})]
    assert [(i["index"], i["is_chief"], i["address"]) for i in infos] == [
        (0, True, "c:1"), (1, False, "a:1"), (2, False, "b:2")]
    assert {i["num_workers"] for i in infos} == {3}
