"""CI: serves the quick start's SavedModel in a fresh process, from an
installed xmc_tf (the wheel's venv), and checks what it serves.

Usage: python .ci/serve_from_wheel.py WORKDIR

Imports xmc_tf (which must come from site-packages, not from a checkout),
loads WORKDIR/saved_model with xmc_tf.saving.load_saved_model, sends the
bundled Bibtex test set through the ``serve`` signature in batches and
checks: label ids in range, scores best first and equal to the top of
``score_all_labels``, and P@1 equal to the P@1 that the training run wrote
to WORKDIR/metrics.json (same model, same data; a few ties may break the
other way).
"""

import json
import os
import sys

import numpy as np
import tensorflow as tf

import xmc_tf

BATCH = 512


def main(workdir: str) -> None:
    where = os.path.dirname(xmc_tf.__file__)
    assert "site-packages" in where, f"xmc_tf imported from {where}"
    sm = xmc_tf.saving.load_saved_model(os.path.join(workdir, "saved_model"))
    data = xmc_tf.data.load_dataset("bibtex:test")  # raw values, as trained
    hits = 0
    for start in range(0, data.num_instances, BATCH):
        x = data.features[start:start + BATCH].tocoo()
        batch = tf.sparse.reorder(tf.SparseTensor(
            np.stack([x.row, x.col], 1).astype(np.int64),
            x.data.astype(np.float32), x.shape))
        parts = dict(indices=batch.indices, values=batch.values,
                     dense_shape=batch.dense_shape)
        top = sm.signatures["serve"](**parts)
        ids, best = top["label_ids"].numpy(), top["scores"].numpy()
        scores = sm.signatures["score_all_labels"](**parts)[
            "label_scores"].numpy()
        n = x.shape[0]
        assert ids.shape == best.shape == (n, 5), ids.shape
        assert ((ids >= 0) & (ids < data.num_labels)).all()
        assert (np.diff(best, axis=1) <= 0).all()  # best first
        np.testing.assert_allclose(np.take_along_axis(scores, ids, 1), best,
                                   rtol=1e-6)
        np.testing.assert_allclose(-np.sort(-scores, 1)[:, :5], best,
                                   rtol=1e-6)
        labels = data.labels[start:start + BATCH]
        hits += int(labels[np.arange(n), ids[:, 0]].sum())
    p1 = 100.0 * hits / data.num_instances
    with open(os.path.join(workdir, "metrics.json")) as f:
        reported = json.load(f)["P@1"]
    assert abs(p1 - reported) <= 0.2, (p1, reported)
    print(f"served {workdir}/saved_model with xmc_tf from {where}: "
          f"P@1 {p1:.2f} on {data.num_instances} test instances "
          f"(metrics.json: {reported:.2f})")


if __name__ == "__main__":
    main(sys.argv[1])
