"""End-to-end test of the `xmc-tf` command on small synthetic XC-repo files.

Checks the documented contract: `train` with --config.data.train/test writes
metrics.json (required keys), model.keras and saved_model/; `evaluate`
reproduces the metrics; `predict` writes top-k ids whose P@1, recomputed here
from the file and the true labels, equals the reported P@1.  Then the
promises around it: `--help` without TensorFlow, user errors as one line
with exit status 2 naming the file (and line), the workdir lock, a finished
workdir refused unless --overwrite, Ctrl-C.  Error cases run `cli.main` in
this process (no TensorFlow start-up per case); the full runs go through
the console script's module (`python -m xmc_tf_cli`).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from xmc_tf.job import artifacts
from xmc_tf import data as xdata

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMALL = ["--config.train.epochs=2", "--config.model.encoder_dims=(32,)",
         "--config.model.intermediate_dim=64",
         "--config.model.connections_per_label=8",
         "--config.set.every_n_steps=3", "--config.train.batch_size=32",
         "--config.train.verbose=0"]


def xmc_tf_cmd(*args, stderr=False):
    """Runs the console script's module in a new process; returns stdout,
    or ``(stdout, stderr)`` with ``stderr=True``."""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-m", "xmc_tf_cli", *args],
                          env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return (proc.stdout, proc.stderr) if stderr else proc.stdout


def xmc_tf_main(*args):
    """Runs `xmc-tf ARGS` in this process (no TensorFlow start-up); returns
    stdout."""
    import contextlib
    import io
    from xmc_tf_cli import cli
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["xmc-tf", *args])
    assert code == 0, out.getvalue()[-3000:] + err.getvalue()[-3000:]
    return out.getvalue()


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cli")
    data = xdata.make_synthetic(600, 200, 50, seed=3)
    train = xdata.XCDataset(features=data.features[:450], labels=data.labels[:450])
    test = xdata.XCDataset(features=data.features[450:], labels=data.labels[450:])
    xdata.write_xc(tmp / "train.txt.gz", train)
    xdata.write_xc(tmp / "test.txt", test)
    workdir = tmp / "run"
    # verbose=1 (the quick start's progress bar), here on a pipe; the
    # absl INFO lines go to stderr.  13 steps an epoch and a rewire every
    # 20: one SET rewire, in epoch 2.
    out, err = xmc_tf_cmd("train", "--config=configs/uniform_sparse.py",
                          f"--config.data.train={tmp / 'train.txt.gz'}",
                          f"--config.data.test={tmp / 'test.txt'}",
                          f"--workdir={workdir}",
                          *[a for a in SMALL if "verbose" not in a
                            and "every_n_steps" not in a],
                          "--config.set.every_n_steps=20",
                          "--config.train.verbose=1", stderr=True)
    return tmp, workdir, test, out + err


def test_train_outputs(trained):
    _, workdir, test, out = trained
    metrics = json.loads((workdir / "metrics.json").read_text())
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5", "train_seconds",
                "epochs", "num_labels", "peak_memory_bytes"]:
        assert key in metrics, key
    assert metrics["num_labels"] == 50
    assert metrics["epochs"] == 2
    assert 0.0 <= metrics["P@1"] <= 100.0
    assert metrics["peak_memory_bytes"] > 10 * 2**20
    assert (workdir / "model.keras").is_file()
    assert (workdir / "saved_model" / "saved_model.pb").is_file()
    assert "P@1" in out  # the printed results table


def test_train_prints_no_long_lines(trained):
    """A run prints its progress, results and choices in short lines: no
    SavedModel input renames (~600 characters a signature), no progress
    bar redrawn with carriage returns into one line an epoch (~19,000
    characters in a log file), no two datasets or a table on one line."""
    _, workdir, _, out = trained
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 300, max(lines, key=len)
    assert "\r" not in out and "\b" not in out
    assert "unsupported characters" not in out
    # the progress (one line per epoch), the choices and results stay
    assert "Epoch 1/2" in lines and "Epoch 2/2" in lines, out
    # The epoch line shows SET's keys only in the epoch that rewired
    # (history.csv keeps them in both).
    epochs = [line for line in lines if line.startswith("13/13 - ")]
    assert ["set_moved: " in line for line in epochs] == [False, True], out
    header, *rows = (workdir / "history.csv").read_text().splitlines()
    assert "set_moved" in header.split(",") and len(rows) == 2
    assert any("label tree: weight" in line for line in lines), out
    assert any(line.startswith("INFO:absl:test: XCDataset(") for line in lines)


def test_evaluate_reproduces_metrics(trained):
    tmp, workdir, _, _ = trained
    out = xmc_tf_main("evaluate", f"--workdir={workdir}",
                      f"--data={tmp / 'test.txt'}")
    evaluated = json.loads(out.strip().splitlines()[-1])
    metrics = json.loads((workdir / "metrics.json").read_text())
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5"]:
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-6)


def test_predict_file_matches_reported_precision(trained):
    tmp, workdir, test, _ = trained
    pred = tmp / "pred.txt"
    xmc_tf_main("predict", f"--workdir={workdir}",
                f"--data={tmp / 'test.txt'}", f"--output={pred}", "--k=3")
    lines = pred.read_text().splitlines()
    assert len(lines) == test.num_instances
    top1 = np.array([int(line.split()[0].split(":")[0]) for line in lines])
    assert all(len(line.split()) == 3 for line in lines)
    hits = np.asarray(test.labels[np.arange(len(top1)), top1]).ravel()
    hits = hits.astype(np.float64)  # the reported metrics are float64
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert 100.0 * hits.mean() == pytest.approx(metrics["P@1"], abs=1e-6)


def test_saved_model_serves_in_new_process(trained):
    tmp, workdir, test, _ = trained
    features = xdata.normalize_features(test.features[:4], "none")[0]
    np.save(tmp / "dense_x.npy", features.toarray())
    script = f"""
import numpy as np, tensorflow as tf, keras
import xmc_tf
from xmc_tf.job.preprocessing import load_for_model
sm = xmc_tf.saving.load_saved_model({str(workdir / 'saved_model')!r})
model = keras.models.load_model({str(workdir / 'model.keras')!r}, compile=False)
data = load_for_model({str(tmp / 'test.txt')!r}, {str(workdir)!r})
x = data.features[:4].tocoo()
sp = tf.SparseTensor(np.stack([x.row, x.col], 1).astype(np.int64),
                     x.data.astype(np.float32), x.shape)
sp = tf.sparse.reorder(sp)
b = model(sp).numpy()
parts = dict(indices=sp.indices, values=sp.values, dense_shape=sp.dense_shape)
a = sm.score_all_labels(**parts)["label_scores"].numpy()
assert a.shape == (4, 50), a.shape
np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)
top = sm.signatures["serve"](**parts)      # the named serving signature
ids, scores = top["label_ids"].numpy(), top["scores"].numpy()
assert ids.shape == (4, 5), ids.shape
np.testing.assert_allclose(scores, -np.sort(-b, axis=1)[:, :5], rtol=1e-5,
                           atol=1e-5)
np.testing.assert_allclose(np.take_along_axis(b, ids, 1), scores, rtol=1e-5,
                           atol=1e-5)
print("OK")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]


def test_saved_model_stores_each_weight_once(trained):
    """The SavedModel's checkpoint holds the model's weights once (Keras'
    ExportArchive stored them twice: Keras issue #23553), and the loaded
    object still lists every variable, with the model.keras values."""
    import keras
    import tensorflow as tf
    from xmc_tf import saving
    _, workdir, _, _ = trained
    model = artifacts.load_model(str(workdir))
    reader = tf.train.load_checkpoint(
        str(workdir / "saved_model" / "variables" / "variables"))
    stored = {k: s for k, s in reader.get_variable_to_shape_map().items()
              if k.endswith("VARIABLE_VALUE")}
    assert not [k for k in stored if k.startswith("_all_variables/")], stored
    weights = sorted(int(np.prod(v.shape)) for v in model.variables)
    assert sorted(int(np.prod(s)) for s in stored.values()) == weights
    loaded = saving.load_saved_model(str(workdir / "saved_model"))
    assert len(loaded.variables) == len(model.variables)
    # Dropout's seed-generator state is not restored from model.keras.
    got = [v.numpy() for v in loaded.variables
           if "seed_generator" not in v.name]
    want = [keras.ops.convert_to_numpy(v) for v in model.variables
            if "seed_generator" not in v.path]
    assert len(got) == len(want) > 0
    # Same multiset of arrays (sizes can repeat: compare within each size).
    for size in {a.size for a in want}:
        g = sorted(a.ravel().tobytes() for a in got if a.size == size)
        w = sorted(a.ravel().tobytes() for a in want if a.size == size)
        assert g == w, size


def test_export_command_writes_another_k(trained, capsys):
    """`xmc-tf export` re-exports the workdir's model: serve returns the
    top --k labels of the model's scores."""
    import tensorflow as tf
    from xmc_tf import saving
    tmp, workdir, test, _ = trained
    out_dir = tmp / "sm_k2"
    code, err = run_cli(capsys, "export", f"--workdir={workdir}",
                        f"--output={out_dir}", "--k=2")
    assert code == 0, err
    model = artifacts.load_model(str(workdir))
    sm = saving.load_saved_model(str(out_dir))
    features = xdata.normalize_features(test.features[:3], "none")[0].tocoo()
    sp = tf.sparse.reorder(tf.SparseTensor(
        np.stack([features.row, features.col], 1).astype(np.int64),
        features.data.astype(np.float32), features.shape))
    top = sm.signatures["serve"](indices=sp.indices, values=sp.values,
                                 dense_shape=sp.dense_shape)
    scores = model(sp).numpy()
    assert top["label_ids"].shape == (3, 2)
    np.testing.assert_allclose(top["scores"].numpy(),
                               -np.sort(-scores, 1)[:, :2], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("case", ["k", "no_output"])
def test_export_errors_are_one_line(trained, case, capsys, tmp_path):
    _, workdir, _, _ = trained
    out = f"--output={tmp_path / 'sm'}"
    args, names = {
        "k": ([out, "--k=51"], ["k", "51"]),
        "no_output": ([], ["export needs --output"]),
    }[case]
    code, err = run_cli(capsys, "export", f"--workdir={workdir}", *args)
    assert_one_line_error(code, err, *names)
    assert not (tmp_path / "sm").exists()


# --------------------------------------------------------------------------
# The MACH head through the same command (configs/mach.py).

MACH_SMALL = ["--config.train.epochs=2", "--config.model.encoder_dims=(32,)",
              "--config.model.intermediate_dim=16",
              "--config.model.num_buckets=8",
              "--config.model.num_repetitions=4",
              "--config.train.batch_size=32", "--config.train.verbose=0"]


@pytest.fixture(scope="module")
def trained_mach(trained):
    tmp = trained[0]
    workdir = tmp / "mach"
    xmc_tf_cmd("train", "--config=configs/mach.py",
               f"--config.data.train={tmp / 'train.txt.gz'}",
               f"--config.data.test={tmp / 'test.txt'}",
               f"--workdir={workdir}", *MACH_SMALL)
    return tmp, workdir, trained[2]


def _mach_brute_force_top_k(workdir, data_path, k):
    """Top-k by scoring all labels in NumPy from the saved model's logits."""
    import keras
    import tensorflow as tf
    import xmc_tf
    from xmc_tf.job.preprocessing import load_for_model
    model = keras.models.load_model(workdir / "model.keras", compile=False)
    head = xmc_tf.decoding.scoring_layer(model)  # inside the normalising model
    assert isinstance(head, xmc_tf.layers.MachHead)
    data = load_for_model(str(data_path), str(workdir))
    x = data.features.tocoo()
    sp = tf.sparse.reorder(tf.SparseTensor(
        np.stack([x.row, x.col], 1).astype(np.int64),
        x.data.astype(np.float32), x.shape))
    z = model(sp).numpy().astype(np.float64)  # [n, R, B]
    assert head.decode_activation == "sigmoid"  # the config's loss is bce
    p = 1.0 / (1.0 + np.exp(-z))
    h = head.hashing
    m = h.num_labels
    scores = np.zeros((z.shape[0], m))
    for r, (a, b) in enumerate(zip(h.hash_a, h.hash_b)):
        buckets = ((a * np.arange(m, dtype=np.int64) + b) % h.prime) % h.num_buckets
        scores += p[:, r, buckets]
    scores /= h.num_repetitions
    return np.array([sorted(range(m), key=lambda j: (-row[j], j))[:k]
                     for row in scores]), head


def test_mach_train_outputs_and_evaluate(trained_mach):
    tmp, workdir, _ = trained_mach
    metrics = json.loads((workdir / "metrics.json").read_text())
    assert metrics["head"] == "mach"
    assert (metrics["num_buckets"], metrics["num_repetitions"]) == (8, 4)
    # kernel [R, d, B] + bias [R, B], float32.
    assert metrics["output_layer_bytes"] == 4 * 4 * 8 * (16 + 1)
    assert metrics["model_bytes"] > metrics["output_layer_bytes"]
    history = (workdir / "history.csv").read_text()
    assert "val_precision_at_3" in history  # the LR schedule's monitor
    out = xmc_tf_main("evaluate", f"--workdir={workdir}",
                      f"--data={tmp / 'test.txt'}")
    evaluated = json.loads(out.strip().splitlines()[-1])
    for key in ["P@1", "P@3", "P@5", "nDCG@5", "PSP@5"]:
        assert evaluated[key] == pytest.approx(metrics[key], abs=1e-6)


def test_mach_predict_and_saved_model_match_brute_force(trained_mach):
    tmp, workdir, test = trained_mach
    pred = tmp / "mach_pred.txt"
    xmc_tf_main("predict", f"--workdir={workdir}",
                f"--data={tmp / 'test.txt'}", f"--output={pred}", "--k=3")
    got = np.array([[int(t.split(":")[0]) for t in line.split()]
                    for line in pred.read_text().splitlines()])
    expected, _ = _mach_brute_force_top_k(workdir, tmp / "test.txt", 5)
    # Labels sharing all R buckets tie exactly in both (lower id first).
    np.testing.assert_array_equal(got, expected[:, :3])
    metrics = json.loads((workdir / "metrics.json").read_text())
    hits = np.asarray(test.labels[np.arange(len(got)), got[:, 0]]).ravel()
    assert 100.0 * hits.astype(np.float64).mean() == pytest.approx(
        metrics["P@1"], abs=1e-6)
    script = f"""
import numpy as np, tensorflow as tf
import xmc_tf
from xmc_tf.job.preprocessing import load_for_model
sm = tf.saved_model.load({str(workdir / 'saved_model')!r})
data = load_for_model({str(tmp / 'test.txt')!r}, {str(workdir)!r})
x = data.features.tocoo()
sp = tf.sparse.reorder(tf.SparseTensor(
    np.stack([x.row, x.col], 1).astype(np.int64), x.data.astype(np.float32),
    x.shape))
out = sm.signatures["serve"](indices=sp.indices, values=sp.values,
                             dense_shape=sp.dense_shape)
np.save({str(tmp / 'served.npy')!r}, out["label_ids"].numpy())
print("OK", out["scores"].shape)
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    proc = subprocess.run([sys.executable, "-c", script], env=env,
                          capture_output=True, text=True)
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr[-3000:]
    np.testing.assert_array_equal(np.load(tmp / "served.npy"), expected)


@pytest.mark.parametrize("which", ["uniform_sparse", "mach"])
def test_export_portable_yes_and_no(trained, trained_mach, which, capsys,
                                    tmp_path):
    """`--portable=yes` works for the uniform-sparse model (wide path
    included) and MACH: no Xmc> op in the SavedModel; the default
    (`auto`, as `xmc-tf train` writes) and `--portable=no` keep the Xmc>
    ops."""
    from tensorflow.core.protobuf import saved_model_pb2
    from xmc_tf.ops import stock
    workdir = trained[1] if which == "uniform_sparse" else trained_mach[1]

    def ops(path):
        proto = saved_model_pb2.SavedModel()
        proto.ParseFromString((path / "saved_model.pb").read_bytes())
        return stock.custom_op_types(mg.graph_def for mg in proto.meta_graphs)

    want = {"uniform_sparse": "Xmc>UniformSparseMatmul",
            "mach": "Xmc>MachTopK"}[which]
    assert want in ops(workdir / "saved_model")  # auto: the fast ops
    from xmc_tf_cli import cli
    capsys.readouterr()
    code = cli.main(["xmc-tf", "export", f"--workdir={workdir}",
                     f"--output={tmp_path / 'p'}", "--portable=yes"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "TensorFlow's own ops only" in out, out
    assert ops(tmp_path / "p") == []
    code, err = run_cli(capsys, "export", f"--workdir={workdir}",
                        f"--output={tmp_path / 'x'}", "--portable=no")
    assert code == 0, err
    assert want in ops(tmp_path / "x")


def test_mach_head_rejects_label_wise_loss(tmp_path, capsys):
    code, err = run_cli(capsys, "train", "--config=configs/mach.py",
                        "--config.loss=squared_hinge", f"--workdir={tmp_path}")
    assert code == 2
    assert "does not fit head 'mach'" in err and "configs/mach.py" in err


# --------------------------------------------------------------------------
# Help, errors, the workdir's promises.

def run_cli(capsys, *args):
    """Runs `xmc-tf ARGS` in this process; returns (exit status, stderr)."""
    from xmc_tf_cli import cli
    capsys.readouterr()
    code = cli.main(["xmc-tf", *args])
    return code, capsys.readouterr().err


def assert_one_line_error(code, err, *names):
    lines = err.strip().splitlines()
    assert code == 2, err
    assert 1 <= len(lines) <= 3 and lines[0].startswith("xmc-tf: error: "), err
    assert "Traceback" not in err
    for name in names:
        assert str(name) in err, (name, err)


def _help_without_tensorflow(*args):
    code = (f"import sys; sys.argv = ['xmc-tf', *{list(args)!r}]; "
            "import xmc_tf_cli; rc = xmc_tf_cli.main(); "
            "assert 'tensorflow' not in sys.modules, 'imported TF'; "
            "assert 'keras' not in sys.modules, 'imported keras'; "
            "print('EXIT', rc)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return proc


def test_train_help_by_name_lists_the_fields_without_tensorflow():
    """The config by name, through the schema loaded without the package."""
    proc = _help_without_tensorflow("train", "--help", "--config=astra")
    assert "--config.sampler.num_hard=32\n" in proc.stdout
    assert "--config.model.head='sampled'\n" in proc.stdout
    assert "EXIT 0" in proc.stdout


def test_help_lists_commands_without_tensorflow():
    proc = _help_without_tensorflow("--help")
    for command in ("train", "evaluate", "predict", "export"):
        assert f"\n  {command} " in proc.stdout
    for flag in ("--workdir=DIR", "--overwrite", "--force", "--data=SPEC",
                 "--debug"):
        assert flag in proc.stdout
    assert "EXIT 0" in proc.stdout


def test_train_help_lists_config_fields_of_chosen_file():
    def train_help(*extra):
        proc = subprocess.run(
            [sys.executable, "-m", "xmc_tf_cli", "train", "--help", *extra],
            capture_output=True, text=True, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        return proc.stdout

    out = train_help()
    assert "config fields of" in out and "quickstart.py" in out
    assert "--config.train.epochs=10\n" in out  # quickstart's own default
    assert "--config.model.connections_per_label=64\n" in out
    out = train_help("--config=configs/mach.py", "--config.train.epochs=3")
    assert "--config.model.num_buckets=" in out
    assert "--config.train.epochs=3\n" in out and "--overwrite" in out
    assert train_help("--config=mach", "--config.train.epochs=3") == out.replace(
        "config fields of configs/mach.py", "config fields of mach (" +
        os.path.join(REPO, "xmc_tf", "configs", "mach.py") + ")")


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "header.txt").write_text("three 5 2\n0 1:1\n")
    (tmp / "line3.txt").write_text("2 5 3\n0 1:1\nx 2:1\n")
    (tmp / "syntax_config.py").write_text(
        "import ml_collections\ndef get_config():\n    c = 1 +\n")
    return tmp


@pytest.mark.parametrize("case", [
    "config_typo", "bad_head", "bad_dropout", "bad_normalize",
    "bad_activation", "missing_data",
    "bad_header", "bad_line",
    "missing_config", "config_syntax", "unknown_flag", "no_command"])
def test_user_errors_are_one_line(case, bad_files, tmp_path, capsys):
    work = f"--workdir={tmp_path / 'run'}"
    args, names = {
        "config_typo": (["train", "--config.trian.epochs=2", work],
                        ["--config.trian.epochs", "quickstart", "train"]),
        "bad_head": (["train", "--config=configs/dense.py",
                      "--config.model.head=dnse", work],
                     ["configs/dense.py", "config.model.head='dnse'"]),
        "bad_dropout": (["train", "--config.model.intermediate_dropout=1.5",
                         work], ["config.model.intermediate_dropout=1.5",
                                 "[0, 1)"]),
        "bad_normalize": (["train", "--config.data.normalize=tf-idf", work],
                          ["config.data.normalize", "'tf-idf'", "'auto'"]),
        "bad_activation": (
            ["train", "--config.model.intermediate_activation=elu", work],
            ["config.model.intermediate_activation='elu'", "'leaky_relu'"]),
        "missing_data": (["train", f"--config.data.train={bad_files}/no.txt",
                          work], [f"{bad_files}/no.txt", "No such file"]),
        "bad_header": (["train", f"--config.data.train={bad_files}/header.txt",
                        work], [f"{bad_files}/header.txt, line 1", "header"]),
        "bad_line": (["train", f"--config.data.train={bad_files}/line3.txt",
                      work], [f"{bad_files}/line3.txt, line 3"]),
        "missing_config": (["train", "--config=configs/nope.py", work],
                           ["configs/nope.py"]),
        "config_syntax": (["train", f"--config={bad_files}/syntax_config.py",
                           work], [f"{bad_files}/syntax_config.py:3"]),
        "unknown_flag": (["train", "--wrokdir=x"], ["wrokdir"]),
        "no_command": (["fly", work], ["fly", "train"]),
    }[case]
    code, err = run_cli(capsys, *args)
    assert_one_line_error(code, err, *names)
    code, err = run_cli(capsys, *args, "--debug")
    assert code == 2
    if case in ("bad_head", "missing_data", "bad_header"):
        assert "Traceback" in err  # --debug shows where it came from


def test_errors_in_a_fresh_process_stay_one_line(tmp_path):
    """The console script quiets TensorFlow's start-up lines too."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    proc = subprocess.run(
        [sys.executable, "-m", "xmc_tf_cli", "train",
         f"--config.data.train={tmp_path}/missing.txt.gz",
         f"--workdir={tmp_path}/run"],
        env=env, capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) <= 3, proc.stderr
    assert f"{tmp_path}/missing.txt.gz" in lines[-1]


@pytest.mark.parametrize("level", ["1", "2"])
def test_tf_startup_lines_below_the_log_level_are_dropped(capfd, monkeypatch,
                                                          level):
    """Lines written to file descriptor 2 inside ``_quiet_tf_startup``: absl's
    preamble and INFO lines go at level 1, WARNING lines too at level 2;
    anything else comes back, also when the block raises."""
    from xmc_tf_cli import cli
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", level)
    lines = [cli._ABSL_PREAMBLE + "\n",
             "I0000 00:00:1.2 9 port.cc:153] oneDNN custom operations are on\n",
             "W0000 00:00:1.2 9 foo.cc:1] a warning\n",
             "E0000 00:00:1.2 9 foo.cc:1] an error\n",
             "something else\n"]
    with pytest.raises(RuntimeError):
        with cli._quiet_tf_startup():
            for line in lines:
                os.write(2, line.encode())
            raise RuntimeError("import failed")
    err = capfd.readouterr().err
    want = lines[3:] if level == "2" else lines[2:]
    assert err == "".join(want)
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    with cli._quiet_tf_startup():
        os.write(2, lines[1].encode())
    assert capfd.readouterr().err == lines[1]


def test_workdir_locked_by_a_live_run(tmp_path, capsys):
    from xmc_tf.job.workdir import WorkdirLock
    with WorkdirLock(str(tmp_path)):
        code, err = run_cli(capsys, "train", f"--workdir={tmp_path}")
    assert_one_line_error(code, err, f"pid {os.getpid()}", str(tmp_path))


def test_stale_lock_and_force(tmp_path, capsys, monkeypatch):
    """A lock held though its recorded owner is gone: refused with a hint,
    taken over with --force (the run then fails on its bad data, after the
    lock)."""
    import fcntl
    import socket
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    fd = os.open(tmp_path / ".lock", os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": dead.pid, "host": socket.gethostname(),
                             "command": "xmc-tf train"}).encode())
    try:
        args = ["train", f"--workdir={tmp_path}",
                f"--config.data.train={tmp_path}/missing.txt"]
        code, err = run_cli(capsys, *args)
        assert_one_line_error(code, err, f"pid {dead.pid}", "--force")
        code, err = run_cli(capsys, *args, "--force")
        assert_one_line_error(code, err, f"{tmp_path}/missing.txt")
    finally:
        os.close(fd)


def test_finished_workdir_refused_overwrite_retrains(trained, tmp_path, capsys):
    import shutil
    tmp, workdir, _, _ = trained
    copy = tmp_path / "run"
    shutil.copytree(workdir, copy)
    args = ["train", "--config=configs/uniform_sparse.py",
            f"--config.data.train={tmp / 'train.txt.gz'}",
            f"--config.data.test={tmp / 'test.txt'}", f"--workdir={copy}",
            *SMALL]
    before = (copy / "metrics.json").read_text()
    code, err = run_cli(capsys, *args)
    assert_one_line_error(code, err, "already holds a finished run",
                          f"xmc-tf evaluate --workdir={copy}", "--overwrite")
    assert (copy / "metrics.json").read_text() == before
    code, err = run_cli(capsys, *args, "--config.train.epochs=1",
                        "--overwrite")
    assert code == 0, err
    metrics = json.loads((copy / "metrics.json").read_text())
    assert metrics["epochs"] == 1
    assert metrics["run"]["id"] != json.loads(before)["run"]["id"]
    history = (copy / "history.csv").read_text().strip().splitlines()
    assert len(history) == 2  # header + the new run's one epoch


def test_evaluate_incomplete_workdir_and_corrupt_backup(trained, tmp_path,
                                                        capsys):
    tmp = trained[0]
    data = f"--data={tmp / 'test.txt'}"
    code, err = run_cli(capsys, "evaluate", f"--workdir={tmp_path}/none", data)
    assert_one_line_error(code, err, f"{tmp_path}/none", "does not exist")
    (tmp_path / "run" / "backup").mkdir(parents=True)
    (tmp_path / "run" / "backup" / "checkpoint.npz").write_bytes(b"PK\x03\x04")
    code, err = run_cli(capsys, "evaluate", f"--workdir={tmp_path}/run", data)
    assert_one_line_error(code, err, "unfinished run", "resume")
    code, err = run_cli(capsys, "train", f"--workdir={tmp_path}/run",
                        f"--config.data.train={tmp / 'train.txt.gz'}",
                        f"--config.data.test={tmp / 'test.txt'}")
    assert_one_line_error(code, err,
                          f"{tmp_path}/run/backup/checkpoint.npz",
                          f"rm -r {tmp_path}/run/backup")


def test_missing_op_library_is_one_line(tmp_path, capsys, monkeypatch):
    from xmc_tf.errors import OpLibraryError
    from xmc_tf.ops import _loader

    def load():
        raise OpLibraryError(
            "/x/_xmc_ops.so was built for TensorFlow 2.0.0 but TensorFlow "
            "2.21.0 is running; reinstall xmc_tf")
    monkeypatch.setattr(_loader, "load", load)
    code, err = run_cli(capsys, "evaluate", f"--workdir={tmp_path}",
                        "--data=bibtex:test")
    assert_one_line_error(code, err, "/x/_xmc_ops.so", "2.0.0")


def test_interrupt_says_what_was_kept(tmp_path, capsys, monkeypatch):
    from xmc_tf.job import classifier
    backup = tmp_path / "backup"

    def interrupted(config, workdir, **kwargs):
        backup.mkdir(exist_ok=True)
        (backup / "checkpoint.npz").write_bytes(b"")
        raise KeyboardInterrupt
    monkeypatch.setattr(classifier, "train_and_evaluate", interrupted)
    code, err = run_cli(capsys, "train", f"--workdir={tmp_path}")
    assert code == 130
    assert err.strip().splitlines() == [
        f"xmc-tf: interrupted; the backup in {backup} resumes the run: "
        "rerun the same command"]


def test_load_saved_model_explains_unregistered_op(trained, monkeypatch):
    import tensorflow as tf
    from xmc_tf import saving
    from xmc_tf.errors import OpNotRegisteredError

    def unregistered(path):
        raise tf.errors.NotFoundError(
            None, None, "Op type not registered 'XmcUniformSparseMatmul' in "
            "binary running on host. Make sure the Op and Kernel are "
            "registered in the binary running in this process. ... "
            "tf.contrib ...")
    monkeypatch.setattr(tf.saved_model, "load", unregistered)
    with pytest.raises(OpNotRegisteredError) as e:
        saving.load_saved_model(str(trained[1] / "saved_model"))
    msg = str(e.value)
    assert "XmcUniformSparseMatmul" in msg and "import xmc_tf" in msg
    assert f"TensorFlow {tf.__version__}" in msg and "built for" in msg


def test_non_finite_loss_stops_before_the_epoch_is_checkpointed():
    import keras
    import numpy as np
    from xmc_tf.errors import TrainingDiverged, UserError
    from xmc_tf.job.fit import StopOnNonFinite

    class Recorder(keras.callbacks.Callback):  # stands in for Checkpointer
        epochs = []

        def on_epoch_end(self, epoch, logs=None):
            self.epochs.append(epoch)

    x = np.ones((8, 3), np.float32)
    y = np.ones((8, 1), np.float32)
    for every, where in ((1, "batch 1"), (1000, "epoch 1;")):
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        # sqrt of a negative: NaN from the first batch on.
        model.compile(optimizer="sgd",
                      loss=lambda t, p: keras.ops.sqrt(p * 0.0 - 1.0))
        Recorder.epochs = []
        with pytest.raises(TrainingDiverged, match=where) as info:
            model.fit(x, y, batch_size=4, epochs=2, verbose=0,
                      callbacks=[StopOnNonFinite(every), Recorder()])
        assert isinstance(info.value, UserError)
        assert "learning_rate" in str(info.value)
        assert Recorder.epochs == []


def test_print_config_resolves_every_automatic_field_and_trains_nothing(
        tmp_path, capsys):
    from xmc_tf_cli import cli
    capsys.readouterr()
    code = cli.main(["xmc-tf", "train", "--config=lsh", "--print-config",
                     f"--workdir={tmp_path / 'wd'}"])
    out = capsys.readouterr().out
    assert code == 0
    printed = json.loads(out)
    assert printed["sampler"]["K"] >= 1 and printed["sampler"]["index"] in (
        "flat", "ivf_flat")
    assert printed["data"]["normalize"] == "tfidf"  # Bibtex: counts
    assert isinstance(printed["sampler"]["shared"], bool)
    assert isinstance(printed["tree"]["enabled"], bool)
    assert printed["model"]["encoder_dims"] == [1024]  # multi-label regime
    assert not os.path.exists(tmp_path / "wd")
