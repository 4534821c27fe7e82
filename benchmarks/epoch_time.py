"""Epoch time of the default uniform-sparse model at two versions of the code.

What it measures
----------------
For each ``--code NAME=DIR`` (a checkout with its op library built, e.g.
``git worktree add DIR COMMIT`` then ``python tools/build_ops.py``) and each
shared multi-label set (Bibtex and Delicious' ``xcsplit``,
WordNetHypernyms), ``xmc-tf train --config=uniform_sparse`` runs
``--epochs`` epochs with the fused scorers off (``tree.enabled=False``,
and where the code has them ``centroids.enabled=False``,
``neighbours.enabled=False``), one run at a time, and Keras' own epoch
line gives the seconds and milliseconds per step of each epoch (batch 64,
the config's).  The first epoch holds the tracing; the later ones are the
steady state to compare.  The machine's load average is recorded.

Usage::

    python benchmarks/epoch_time.py --shared ../shared \\
        --code old=/tmp/old --code new=. \\
        --out benchmarks/results/epoch_time_463f2e6_main.json

Output: one line per run on stdout and the JSON of ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

SETS = {
    "bibtex": ("Bibtex/xc/bibtex_xcsplit_train.txt.gz",
               "Bibtex/xc/bibtex_xcsplit_test.txt.gz"),
    "delicious": ("Delicious/xc/delicious_xcsplit_train.txt.gz",
                  "Delicious/xc/delicious_xcsplit_test.txt.gz"),
    "wordnet": ("WordNetHypernyms/train.txt.gz",
                "WordNetHypernyms/test.txt.gz"),
}
EPOCH_LINE = re.compile(r"^\d+/\d+ - (\d+)s - (\d+)ms/step", re.M)


def _has_field(code_dir: str, section: str) -> bool:
    with open(os.path.join(code_dir, "xmc_tf", "config.py")) as f:
        return f"{section}=ml_collections.ConfigDict" in f.read()


def run_one(code_dir: str, train: str, test: str, epochs: int,
            workdir: str) -> dict:
    """One training run: ``{"s_by_epoch", "ms_per_step_by_epoch"}``."""
    overrides = [f"--config.data.train={train}", f"--config.data.test={test}",
                 f"--config.train.epochs={epochs}",
                 "--config.tree.enabled=False"]
    for section in ("centroids", "neighbours"):
        if _has_field(code_dir, section):
            overrides.append(f"--config.{section}.enabled=False")
    env = dict(os.environ, PYTHONPATH=code_dir, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(
        [sys.executable, "-m", "xmc_tf", "train", "--config=uniform_sparse",
         f"--workdir={workdir}", "--overwrite", *overrides],
        cwd=code_dir, env=env, capture_output=True, text=True, check=False)
    lines = EPOCH_LINE.findall(proc.stdout + proc.stderr)
    if proc.returncode or not lines:
        raise RuntimeError(f"{code_dir}: exit {proc.returncode}\n"
                           f"{proc.stderr[-2000:]}")
    return {"s_by_epoch": [int(s) for s, _ in lines],
            "ms_per_step_by_epoch": [int(ms) for _, ms in lines]}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shared", default=os.path.join(
        os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..",
        "shared"), help="the shared folder (holds data/)")
    parser.add_argument("--code", action="append", required=True,
                        help="NAME=DIR, a checkout with its ops built")
    parser.add_argument("--sets", default=",".join(SETS))
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    rows, load = [], [os.getloadavg()[0]]
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.sets.split(","):
            train, test = (os.path.join(args.shared, "data", p)
                           for p in SETS[name])
            for spec in args.code:
                code, code_dir = spec.split("=", 1)
                row = {"data": name, "code": code,
                       **run_one(os.path.abspath(code_dir), train, test,
                                 args.epochs, os.path.join(tmp, f"{name}_{code}"))}
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
