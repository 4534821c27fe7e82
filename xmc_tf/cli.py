"""The ``xmc-tf`` command (also ``python -m xmc_tf``): train, evaluate, predict.

Usage::

    xmc-tf train --config=configs/uniform_sparse.py --workdir=DIR \\
        [--config.data.train=TRAIN.txt.gz --config.data.test=TEST.txt.gz] \\
        [--config.KEY=VALUE ...]
    xmc-tf evaluate --workdir=DIR --data=TEST.txt.gz
    xmc-tf predict --workdir=DIR --data=FILE --output=PRED.txt [--k=5]

``train`` writes ``DIR/metrics.json``, ``DIR/model.keras`` and
``DIR/saved_model/``; with no data flags it trains on the bundled Bibtex data
set.  Data specs are those of :func:`xmc_tf.data.load_dataset` (XC-repo files,
``X.txt|Y.txt``, ``EMB.npy|LABELS.txt``, ``bibtex:test``, ``synthetic:...``).
"""

import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_DEFAULT_CONFIG = os.path.join(
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
    "quickstart.py")
COMMANDS = ("train", "evaluate", "predict")

config_flags.DEFINE_config_file(
    "config", _DEFAULT_CONFIG if os.path.exists(_DEFAULT_CONFIG) else None,
    "Experiment config file (configs/*.py); override fields with "
    "--config.KEY=VALUE.", lock_config=True)
flags.DEFINE_string("workdir", None, "Output / model directory.")
flags.DEFINE_string("data", None, "evaluate/predict: the data set spec.")
flags.DEFINE_string("output", None, "predict: output file (one line per "
                    "instance: 'id:score id:score ...').")
flags.DEFINE_integer("k", 5, "predict: labels per instance.")
FLAGS = flags.FLAGS


def _load_model(workdir):
    import keras
    import xmc_tf  # noqa: F401  (registers ops, gradients, Keras classes)
    return keras.models.load_model(os.path.join(workdir, "model.keras"),
                                   compile=False)


def _train():
    from xmc_tf import train
    if FLAGS.config is None:
        raise app.UsageError("--config is required (e.g. configs/quickstart.py)")
    results = train.train_and_evaluate(FLAGS.config, FLAGS.workdir)
    print("\n" + train.format_table(results))
    print(f"\nwrote {os.path.join(FLAGS.workdir, 'metrics.json')}")


def _evaluate():
    import numpy as np
    from xmc_tf import train
    model = _load_model(FLAGS.workdir)
    dataset = train.load_for_model(FLAGS.data, FLAGS.workdir)
    inv_prop = np.load(os.path.join(FLAGS.workdir, train.INV_PROPENSITIES_FILE))
    results = train.evaluate_model(model, dataset, inv_prop)
    print(train.format_table(results))
    print(json.dumps(results))


def _predict():
    from xmc_tf import predict, train
    if not FLAGS.output:
        raise app.UsageError("predict needs --output")
    model = _load_model(FLAGS.workdir)
    dataset = train.load_for_model(FLAGS.data, FLAGS.workdir)
    count = 0
    with open(FLAGS.output, "w") as f:
        for ids, scores in predict.predict_top_k(model, dataset, FLAGS.k):
            for row_ids, row_scores in zip(ids, scores):
                f.write(" ".join(f"{i}:{s:.6g}" for i, s in
                                 zip(row_ids, row_scores)) + "\n")
                count += 1
    print(f"wrote top-{FLAGS.k} labels of {count} instances to {FLAGS.output}")


def main(argv):
    if len(argv) != 2 or argv[1] not in COMMANDS:
        raise app.UsageError(f"usage: xmc-tf {{{'|'.join(COMMANDS)}}} --workdir=DIR "
                             "[flags]; see --help")
    if not FLAGS.workdir:
        raise app.UsageError("--workdir is required")
    if argv[1] != "train" and not FLAGS.data:
        raise app.UsageError(f"{argv[1]} needs --data")
    logging.set_verbosity(logging.INFO)
    {"train": _train, "evaluate": _evaluate, "predict": _predict}[argv[1]]()


def run():
    """Console-script entry point."""
    app.run(main)


if __name__ == "__main__":
    sys.exit(run())
