"""Benchmark of the label tree's fit (:func:`xmc_tf.shortlist.fit_label_tree`).

What it measures
----------------
The wall-clock seconds of one ``fit_label_tree`` call with the job's
defaults (``leaf_size=100, c=1, tol=0.1, threshold=0.1, seed=0``) on a
shared set's training file, its features L2-normalised as the job does,
for each checkout given with ``--code`` (run one after the other, each in
its own process, so two commits compare on the same machine in the same
run), and whether the trees they return are the same arrays (``same`` is
``True`` when every array of ``LabelTree.to_arrays()`` equals the first
checkout's bit for bit).  Work grows with the label count as the tree's
columns (about ``2 * num_labels``) times the instances reaching each node.

How to run
----------
::

    PYTHONPATH=. python benchmarks/tree_fit.py --code before=/path/to/old \\
        --code main=. --sets wordnet --out benchmarks/results/tree_fit.json

Each ``--code`` directory is a checkout with its ops built.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

SETS = {"bibtex": "Bibtex/xc/bibtex_xcsplit_train.txt.gz",
        "delicious": "Delicious/xc/delicious_xcsplit_train.txt.gz",
        "wordnet": "WordNetHypernyms/train.txt.gz",
        "mannextword": "ManNextWord/train.txt.gz"}

_FIT = """
import sys, time, numpy as np, sklearn.preprocessing as skp
from xmc_tf import data as xdata
from xmc_tf.shortlist import fit_label_tree
ds = xdata.load_dataset(sys.argv[1])
x = skp.normalize(ds.features.tocsr().astype(np.float32))
t = time.perf_counter()
tree = fit_label_tree(x, ds.labels, leaf_size=100, c=1.0, tol=0.1,
                      threshold=0.1, seed=0)
print("fit_seconds", time.perf_counter() - t)
np.savez(sys.argv[2], **tree.to_arrays())
"""


def run_one(code_dir: str, train: str, out: str) -> float:
    """Seconds of one fit in ``code_dir``; the tree's arrays go to ``out``."""
    env = dict(os.environ, PYTHONPATH=code_dir, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", _FIT, train, out],
                          cwd=code_dir, env=env, capture_output=True,
                          text=True, check=False)
    lines = [l for l in proc.stdout.splitlines()
             if l.startswith("fit_seconds")]
    if proc.returncode or not lines:
        raise RuntimeError(f"{code_dir}: exit {proc.returncode}\n"
                           f"{proc.stderr[-2000:]}")
    return float(lines[-1].split()[1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
        "shared"), help="the shared folder (holds data/)")
    parser.add_argument("--code", action="append", required=True,
                        help="NAME=DIR, a checkout with its ops built")
    parser.add_argument("--sets", default="wordnet")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets.split(","):
            train = os.path.join(args.shared, "data", SETS[name])
            first = None
            for spec in args.code:
                code, code_dir = spec.split("=", 1)
                path = os.path.join(tmp, f"{name}_{code}.npz")
                seconds = run_one(os.path.abspath(code_dir), train, path)
                arrays = dict(np.load(path))
                first = first or arrays
                same = all(np.array_equal(first[k], arrays[k])
                           for k in first)
                row = {"data": name, "code": code,
                       "fit_seconds": round(seconds, 2), "same": same}
                print(json.dumps(row), flush=True)
                rows.append(row)
    load.append(os.getloadavg()[0])
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "cpus": os.cpu_count(),
                       "load_average_start_end": load, "rows": rows}, f,
                      indent=1)


if __name__ == "__main__":
    main()
