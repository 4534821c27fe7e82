"""PECOS XR-Linear with its defaults, run by PECOS's own interpreter.

libpecos pins NumPy < 2 and SciPy < 1.14, which TensorFlow 2.21's
environment does not allow, so :func:`peers.run_pecos` runs this script
with the Python named by ``XMC_PECOS_PYTHON`` (a venv with
``pip install "numpy<2" "scipy<1.14" scikit-learn`` and
``pip install --no-deps libpecos==1.2.8``; XR-Linear needs no PyTorch).

Input: ``--data`` a ``.npz`` with the training features ``x_*`` and labels
``y_*`` and the test features ``t_*`` (CSR arrays: data, indices, indptr,
shape).  Output: ``--out`` a ``.npz`` with ``ids`` (int64 ``[n_test, k]``,
-1 = none), ``train_s`` and ``predict_s`` (wall seconds).

The model is PECOS's documented default pipeline (Yu et al., "PECOS:
Prediction for Enormous and Correlated Output Spaces", JMLR 2022, Sec. 4):
PIFA label embeddings, hierarchical k-means into a label tree
(``Indexer.gen``), one XR-Linear ranker per level
(``XLinearModel.train``), beam search at prediction
(``XLinearModel.predict``, beam 10).  Feature rows are L2-normalised, as
PECOS's tf-idf inputs are.
"""

import argparse
import time

import numpy as np
import scipy.sparse as sp
from sklearn.preprocessing import normalize


def _csr(saved, prefix):
    return sp.csr_matrix((saved[prefix + "data"], saved[prefix + "indices"],
                          saved[prefix + "indptr"]),
                         shape=tuple(saved[prefix + "shape"]))


def main():
    from pecos.xmc import Indexer, LabelEmbeddingFactory
    from pecos.xmc.xlinear.model import XLinearModel
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--k", type=int, default=5)
    args = parser.parse_args()
    with np.load(args.data) as saved:
        x = normalize(_csr(saved, "x_").astype(np.float32))
        y = _csr(saved, "y_").astype(np.float32)
        t = normalize(_csr(saved, "t_").astype(np.float32))
    start = time.perf_counter()
    label_feat = LabelEmbeddingFactory.create(y, x, method="pifa")
    chain = Indexer.gen(label_feat, threads=args.threads)
    model = XLinearModel.train(x, y, C=chain, threads=args.threads)
    train_s = time.perf_counter() - start
    start = time.perf_counter()
    pred = model.predict(t, beam_size=10, only_topk=args.k,
                         threads=args.threads).tocsr()
    predict_s = time.perf_counter() - start
    ids = np.full((t.shape[0], args.k), -1, np.int64)
    for i in range(t.shape[0]):
        lo, hi = pred.indptr[i], pred.indptr[i + 1]
        order = np.argsort(-pred.data[lo:hi], kind="stable")[:args.k]
        ids[i, :order.size] = pred.indices[lo:hi][order]
    np.savez(args.out, ids=ids, train_s=train_s, predict_s=predict_s)


if __name__ == "__main__":
    main()
