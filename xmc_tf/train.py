"""The main job: train, evaluate and export an extreme classifier.

``train_and_evaluate(config, workdir)`` reads an XC-repo data set, builds
the model of :func:`xmc_tf.models.build_model`

    input (sparse TF-IDF or dense embeddings)
      -> encoder layers (ReLU)                  [learned features]
      -> intermediate Dense (ReLU)              [Sec. 3.4 of the paper]
      -> output head (xmc_tf.heads registry: uniform_sparse | dense | mach)

trains it with ``model.fit`` (Adam; learning rate halved when the head's
monitor -- validation P@3 -- stops improving, down to a floor, then early
stopping: Sec. 4.1) with the head's own callbacks (SET rewiring for the
uniform-sparse head, held-out P@k for heads without full scores in
training), evaluates P@k, nDCG@k, PSP@k and recall@k on the test set with
the head's decoder, and writes ``metrics.json``, ``model.keras`` and
``saved_model/`` to the work directory.  Training resumes from
``workdir/backup`` after a crash.  Nothing here branches on the head's
name: see :mod:`xmc_tf.heads`.

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
from xmc_tf import heads as xheads
from xmc_tf import metrics as xmetrics
from xmc_tf.models import build_model
from xmc_tf.predict import evaluate_model

__all__ = ["train_and_evaluate", "build_model", "export_saved_model",
           "load_for_model", "format_table"]


def peak_memory_bytes() -> int:
    """Peak resident set size of this process so far, in bytes (Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def subset(dataset: xdata.XCDataset, rows: np.ndarray) -> xdata.XCDataset:
    """The instances `rows` of `dataset` (a new XCDataset)."""
    return xdata.XCDataset(features=dataset.features[rows],
                           labels=dataset.labels[rows])


def export_saved_model(model: keras.Model, path: str, k: int = 5) -> None:
    """Writes a TF SavedModel whose signatures have named inputs and outputs.

    Signatures (``tf.saved_model.load(path).signatures[...]``, also callable
    as methods of the loaded object):

    * ``serve``: the top ``k`` labels, ``{"label_ids": int32 [batch, k],
      "scores": float32 [batch, k]}``, best first, decoded by the model's
      head (``tf.math.top_k`` of the scores, or MACH's exact decoder).
    * ``score_all_labels`` (heads that score every label):
      ``{"label_scores": float32 [batch, num_labels]}``.

    Inputs, for a model on sparse features: the parts of a
    ``tf.SparseTensor`` ``[batch, num_features]`` in row-major order,
    ``indices`` int64 ``[nnz, 2]``, ``values`` float32 ``[nnz]``,
    ``dense_shape`` int64 ``[2]``; for dense features ``features`` float32
    ``[batch, num_features]``.  Load it after ``import xmc_tf`` (the op
    library must be registered), e.g. with
    :func:`xmc_tf.saving.load_saved_model`.

    Args:
      model: a model built by :func:`xmc_tf.models.build_model`.
      path: output directory (created or replaced).
      k: labels per instance of ``serve``.
    """
    spec = model.inputs[0]
    num_features = spec.shape[-1]
    head = xheads.head_for_model(model)
    top_k = head.top_k_function(model, k)
    archive = keras.export.ExportArchive()
    archive.track(model)

    def top(x):
        ids, scores = top_k(x)
        return {"label_ids": ids, "scores": scores}

    def all_scores(x):
        return {"label_scores": model(x, training=False)}

    # Named parameters name the signature inputs; tf.functions with their own
    # signatures because ExportArchive would make a sparse input dense.
    if spec.sparse:
        signature = [tf.TensorSpec([None, 2], tf.int64, name="indices"),
                     tf.TensorSpec([None], tf.float32, name="values"),
                     tf.TensorSpec([2], tf.int64, name="dense_shape")]

        def serve(indices, values, dense_shape):
            return top(tf.SparseTensor(indices, values, dense_shape))

        def score_all_labels(indices, values, dense_shape):
            return all_scores(tf.SparseTensor(indices, values, dense_shape))
    else:
        signature = [tf.TensorSpec([None, num_features], tf.float32,
                                   name="features")]

        def serve(features):
            return top(features)

        def score_all_labels(features):
            return all_scores(features)

    archive.add_endpoint("serve", tf.function(serve,
                                              input_signature=signature))
    if head.full_scores_in_training:
        archive.add_endpoint("score_all_labels", tf.function(
            score_all_labels, input_signature=signature))
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


def _callbacks(config, workdir, head, layer, val_data):
    """The head's own callbacks (SET, held-out P@k, ...) first, so their
    epoch logs reach the rest; then checkpoint/resume, CSV log, LR halving
    and early stopping on the head's monitor (val P@3 when a validation
    split exists)."""
    tc = config.train
    monitor, mode = head.monitor(val_data is not None)
    cbs = head.callbacks(layer, val_data) + [
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

    head = xheads.get_head(config)
    model = build_model(config, train.num_features, train.num_labels,
                        train.is_sparse, head)
    layer = xheads.output_layer(model)
    tc = config.train
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=tc.learning_rate),
        loss=head.make_loss(layer), metrics=head.train_metrics(layer),
        jit_compile=False)  # XLA cannot compile the custom ops
    model.summary(print_fn=logging.info)

    train_ds = xdata.make_tf_dataset(fit_data, tc.batch_size, shuffle=True,
                                     seed=config.seed)
    val_ds = (xdata.make_tf_dataset(val_data, config.eval.batch_size)
              if val_data is not None else None)
    start = time.perf_counter()
    history = model.fit(train_ds, validation_data=val_ds, epochs=tc.epochs,
                        shuffle=False,  # make_tf_dataset shuffles per epoch
                        callbacks=_callbacks(config, workdir, head, layer,
                                             val_data),
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
    results.update(head.results(layer))
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
