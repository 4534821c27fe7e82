"""The main job: train, evaluate and export an extreme classifier.

``train_and_evaluate(config, workdir)`` reads an XC-repo data set, builds

    input (sparse TF-IDF or dense embeddings)
      -> encoder Dense layers (ReLU)            [learned features]
      -> intermediate Dense (ReLU)              [Sec. 3.4 of the paper]
      -> output head: UniformSparseDense | Dense   [num_labels scores]
                    | MachHead                     [R x B bucket logits]

trains it with ``model.fit`` (Adam; learning rate halved when validation P@3
stops improving, down to a floor, then early stopping: Sec. 4.1), rewires the
sparse head with SET, evaluates P@k, nDCG@k, PSP@k and recall@k on the test
set, and writes ``metrics.json``, ``model.keras`` and ``saved_model/`` to the
work directory.  Training resumes from ``workdir/backup`` after a crash.

With ``model.head = "mach"`` the output is MACH's ``R`` meta-classifiers
over ``B`` hashed buckets (Medini et al., NeurIPS 2019, Sec. 3); top-k
labels (validation P@k once per epoch via ``TopKEvaluation``, evaluation,
``predict``, the SavedModel) then come from the exact decoder op
``Xmc>MachTopK`` and no ``[batch, num_labels]`` tensor is formed.

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 3.4 and 4.1.
"""

from __future__ import annotations

import json
import os
import resource
import time

import keras
import numpy as np
import tensorflow as tf
from absl import logging

from xmc_tf import data as xdata
from xmc_tf import metrics as xmetrics
from xmc_tf.callbacks import SetRewiring, TopKEvaluation
from xmc_tf.layers import MachDecoder, MachHead, UniformSparseDense
from xmc_tf.losses import (BinaryCrossEntropy, MachBinaryCrossentropy,
                           MachSoftmaxCrossentropy, SquaredHinge)
from xmc_tf.predict import evaluate_model, mach_head

HEADS = ("uniform_sparse", "dense", "mach")
#: config.loss -> loss class, for the heads that score every label.
LOSSES = {"squared_hinge": SquaredHinge, "bce": BinaryCrossEntropy}
#: config.loss -> (loss class, decoding activation) for the MACH head:
#: "bce" over bucket indicators (multi-label), "softmax" per repetition.
MACH_LOSSES = {"bce": (MachBinaryCrossentropy, "sigmoid"),
               "softmax": (MachSoftmaxCrossentropy, "softmax")}


def _check_head_and_loss(config):
    head, loss = config.model.head, config.loss
    if head not in HEADS:
        raise ValueError(f"config.model.head={head!r}; expected one of {HEADS}")
    allowed = MACH_LOSSES if head == "mach" else LOSSES
    if loss not in allowed:
        raise ValueError(f"config.loss={loss!r} does not fit head {head!r}; "
                         f"expected one of {tuple(allowed)}")


def peak_memory_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def subset(dataset: xdata.XCDataset, rows: np.ndarray) -> xdata.XCDataset:
    """The instances `rows` of `dataset` (a new XCDataset)."""
    return xdata.XCDataset(features=dataset.features[rows],
                           labels=dataset.labels[rows])


def build_model(config, num_features: int, num_labels: int,
                sparse_input: bool) -> keras.Model:
    """Builds the (uncompiled) Keras model described by ``config.model``.

    Args:
      config: the ml_collections config (uses ``config.model``, ``config.seed``).
      num_features: input dimension D.
      num_labels: number of labels m.
      sparse_input: whether the input is a ``tf.SparseTensor``.

    Returns:
      A functional ``keras.Model`` mapping ``[batch, D]`` to ``[batch, m]``
      scores (logits), or for the MACH head to ``[batch, R, B]`` bucket
      logits (``config.model.num_repetitions``, ``num_buckets``).  The head
      layer is named ``"output"``.

    Raises:
      ValueError: unknown ``config.model.head``, or ``config.loss`` not
        made for it.
    """
    _check_head_and_loss(config)
    mc = config.model
    inputs = keras.Input(shape=(num_features,), sparse=sparse_input,
                         name="features")
    x = inputs
    for i, units in enumerate(mc.encoder_dims):
        x = keras.layers.Dense(units, activation="relu", name=f"encoder_{i}")(x)
        if mc.dropout:
            x = keras.layers.Dropout(mc.dropout, seed=config.seed)(x)
    if mc.intermediate_dim:
        x = keras.layers.Dense(mc.intermediate_dim, activation="relu",
                               name="intermediate")(x)
    if mc.head == "uniform_sparse":
        fan_in = min(mc.connections_per_label, x.shape[-1])
        outputs = UniformSparseDense(num_labels, fan_in, seed=config.seed,
                                     name="output")(x)
    elif mc.head == "mach":
        outputs = MachHead(num_labels, mc.num_buckets, mc.num_repetitions,
                           seed=config.seed,
                           decode_activation=MACH_LOSSES[config.loss][1],
                           name="output")(x)
    else:
        outputs = keras.layers.Dense(num_labels, name="output")(x)
    return keras.Model(inputs, outputs, name=f"xmc_{mc.head}")


def export_saved_model(model: keras.Model, path: str, k: int = 5) -> None:
    """Writes a TF SavedModel with a ``serve`` endpoint.

    The endpoint takes what the model takes: a ``tf.SparseTensor`` float32
    ``[batch, num_features]`` for sparse inputs (``keras.Model.export`` would
    make it a dense signature), else a dense float32 tensor.  It returns the
    ``[batch, num_labels]`` scores, or for a MACH model (whose point is to
    never form those) a dict ``{"label_ids": int32 [batch, k], "scores":
    float32 [batch, k]}`` from the exact decoder.  Load it after ``import
    xmc_tf`` (the op library must be registered).
    """
    spec = model.inputs[0]
    shape = [None, spec.shape[-1]]
    signature = (tf.SparseTensorSpec(shape, tf.float32) if spec.sparse
                 else tf.TensorSpec(shape, tf.float32))
    archive = keras.export.ExportArchive()
    archive.track(model)
    head = mach_head(model)
    if head is not None:
        decoder = MachDecoder.from_head(head, k=k)

        def serve(x):
            ids, scores = decoder(model(x, training=False))
            return {"label_ids": ids, "scores": scores}
    else:
        def serve(x):
            return model(x, training=False)
    # A tf.function with its own signature: ExportArchive would turn a sparse
    # Keras input spec into a dense one.
    archive.add_endpoint("serve", tf.function(serve,
                                              input_signature=[signature]))
    archive.write_out(path, verbose=False)


def _variable_bytes(variables) -> int:
    return int(sum(np.prod(v.shape) * np.dtype(v.dtype).itemsize
                   for v in variables))


def output_layer_bytes(model: keras.Model) -> int:
    """Bytes of the output layer's variables (weights, indices, bias)."""
    return _variable_bytes(model.get_layer("output").weights)


def model_bytes(model: keras.Model) -> int:
    """Bytes of all the model's variables (every layer; no optimizer state)."""
    return _variable_bytes(model.weights)


PREPROCESSING_FILE = "preprocessing.npz"
INV_PROPENSITIES_FILE = "inv_propensities.npy"


def load_for_model(spec: str, workdir: str) -> xdata.XCDataset:
    """Loads data set `spec` and applies the feature normalisation (method
    and idf fitted on the training set) saved in `workdir` by training."""
    dataset = xdata.load_dataset(spec)
    saved = np.load(os.path.join(workdir, PREPROCESSING_FILE))
    method = str(saved["method"])
    if dataset.is_sparse:
        idf = saved["idf"] if method == "tfidf" else None
        dataset.features, _ = xdata.normalize_features(dataset.features, method,
                                                       idf)
    return dataset


def _load(config, workdir):
    dc = config.data
    train = xdata.load_dataset(dc.train)
    test = xdata.load_dataset(dc.test) if dc.test else None
    if test is not None and (test.num_labels != train.num_labels or
                             test.num_features != train.num_features):
        raise ValueError(
            f"train ({train.num_features} features, {train.num_labels} labels) "
            f"and test ({test.num_features}, {test.num_labels}) disagree")
    idf = None
    if train.is_sparse:
        train.features, idf = xdata.normalize_features(train.features,
                                                       dc.normalize)
        if test is not None:
            test.features, _ = xdata.normalize_features(test.features,
                                                        dc.normalize, idf)
    np.savez(os.path.join(workdir, PREPROCESSING_FILE), method=dc.normalize,
             idf=idf if idf is not None else np.zeros(0, np.float32))
    return train, test


def _callbacks(config, workdir, val_data, is_mach):
    """Checkpoint/resume, CSV log, LR halving and early stopping on val P@3
    (MACH: computed by TopKEvaluation; without validation data the training
    P@3, or the training loss for MACH), SET for the sparse head."""
    tc = config.train
    if val_data is not None:
        monitor, mode = "val_precision_at_3", "max"
    elif is_mach:
        monitor, mode = "loss", "min"
    else:
        monitor, mode = "precision_at_3", "max"
    cbs = [
        keras.callbacks.BackupAndRestore(os.path.join(workdir, "backup")),
        keras.callbacks.CSVLogger(os.path.join(workdir, "history.csv"),
                                  append=True),
        keras.callbacks.ReduceLROnPlateau(
            monitor=monitor, mode=mode, factor=0.5, patience=tc.lr_patience,
            min_lr=tc.min_learning_rate, verbose=1),
        keras.callbacks.EarlyStopping(
            monitor=monitor, mode=mode, patience=tc.early_stopping_patience,
            restore_best_weights=True, verbose=1),
    ]
    if is_mach and val_data is not None:
        # Before the loggers and schedules, which read its logs.
        cbs.insert(0, TopKEvaluation(val_data, ks=(1, 3),
                                     batch_size=config.eval.batch_size))
    if config.model.head == "uniform_sparse" and config.set.enabled:
        # First in the list so the statistics reach the loggers' epoch logs.
        cbs.insert(0, SetRewiring(every_n_steps=config.set.every_n_steps,
                                  fraction=config.set.fraction,
                                  seed=config.seed))
    if tc.tensorboard:
        cbs.append(keras.callbacks.TensorBoard(os.path.join(workdir,
                                                            "tensorboard")))
    return cbs


def train_and_evaluate(config, workdir: str) -> dict:
    """Runs the main job; see the module docstring.

    Args:
      config: ml_collections ConfigDict (see ``configs/uniform_sparse.py``).
      workdir: output directory (created).

    Returns:
      The metrics dict also written to ``workdir/metrics.json``: ``P@k``,
      ``nDCG@k``, ``PSP@k``, ``R@k`` (percent), ``train_seconds``, ``epochs``,
      ``num_labels``, ``peak_memory_bytes`` (process peak RSS, bytes),
      ``output_layer_bytes`` and ``model_bytes`` (variables of the head /
      of the whole model, bytes), the data set sizes, and for MACH
      ``num_buckets`` and ``num_repetitions``.

    Raises:
      ValueError: bad config values or inconsistent data files.
    """
    os.makedirs(workdir, exist_ok=True)
    keras.utils.set_random_seed(config.seed)
    train, test = _load(config, workdir)
    logging.info("train: %s; test: %s", train, test)
    inv_prop = xmetrics.inverse_propensities(train.labels, A=config.eval.propensity_a,
                                             B=config.eval.propensity_b)
    np.save(os.path.join(workdir, INV_PROPENSITIES_FILE), inv_prop)
    with open(os.path.join(workdir, "config.json"), "w") as f:
        f.write(config.to_json_best_effort(indent=2))

    rng = np.random.default_rng(config.seed)
    order = rng.permutation(train.num_instances)
    num_val = int(round(config.data.validation_fraction * train.num_instances))
    fit_data = subset(train, np.sort(order[num_val:])) if num_val else train
    val_data = subset(train, np.sort(order[:num_val])) if num_val else None

    model = build_model(config, train.num_features, train.num_labels,
                        train.is_sparse)
    tc = config.train
    head = mach_head(model)
    if head is not None:
        loss = MACH_LOSSES[config.loss][0](head)
        # Decoding every training batch would cost O(m R) per row while the
        # head is untrained; TopKEvaluation decodes the validation set once
        # per epoch instead.
        train_metrics = []
    else:
        loss = LOSSES[config.loss]()
        train_metrics = [xmetrics.PrecisionAtK(1), xmetrics.PrecisionAtK(3)]
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=tc.learning_rate),
        loss=loss, metrics=train_metrics,
        jit_compile=False)  # XLA cannot compile the custom ops
    model.summary(print_fn=logging.info)

    train_ds = xdata.make_tf_dataset(fit_data, tc.batch_size, shuffle=True,
                                     seed=config.seed)
    val_ds = (xdata.make_tf_dataset(val_data, config.eval.batch_size)
              if val_data is not None else None)
    start = time.perf_counter()
    history = model.fit(train_ds, validation_data=val_ds, epochs=tc.epochs,
                        shuffle=False,  # make_tf_dataset shuffles per epoch
                        callbacks=_callbacks(config, workdir, val_data,
                                             head is not None),
                        verbose=tc.verbose)
    train_seconds = time.perf_counter() - start

    results = {}
    if test is not None:
        results = evaluate_model(model, test, inv_prop, tuple(config.eval.ks),
                                 config.eval.batch_size)
    results.update({
        "train_seconds": round(train_seconds, 2),
        "epochs": len(history.history.get("loss", [])),
        "num_labels": train.num_labels,
        "num_features": train.num_features,
        "num_train_instances": train.num_instances,
        "num_test_instances": test.num_instances if test is not None else 0,
        "output_layer_bytes": output_layer_bytes(model),
        "model_bytes": model_bytes(model),
        "head": config.model.head,
    })
    if head is not None:
        results.update(num_buckets=head.num_buckets,
                       num_repetitions=head.num_repetitions)
    model.save(os.path.join(workdir, "model.keras"))
    export_saved_model(model, os.path.join(workdir, "saved_model"),
                       k=max(config.eval.ks))
    results["peak_memory_bytes"] = peak_memory_bytes()
    with open(os.path.join(workdir, "metrics.json"), "w") as f:
        json.dump(results, f, indent=2, sort_keys=True)
    return results


def format_table(results: dict) -> str:
    """A plain-text table of the metrics dict (percent metrics first)."""
    keys = [k for k in results if "@" in k] + [k for k in results if "@" not in k]
    width = max(len(k) for k in keys)
    lines = []
    for k in keys:
        v = results[k]
        lines.append(f"{k:<{width}}  {v:.2f}" if isinstance(v, float)
                     else f"{k:<{width}}  {v}")
    return "\n".join(lines)
