"""Quick start: the uniform-sparse model on the bundled Bibtex (< 2 min, 2 cores).

Same model as configs/uniform_sparse.py, at most 10 epochs (the full
config early-stops after 10-25 on Bibtex).

    xmc-tf train --config=configs/quickstart.py --workdir=workdir/quickstart
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uniform_sparse  # noqa: E402


def get_config():
    c = uniform_sparse.get_config()
    c.data.train = "bibtex:train"
    c.data.test = "bibtex:test"
    c.train.epochs = 10
    c.train.verbose = 1
    return c
