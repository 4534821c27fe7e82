"""Quick start: the uniform-sparse model on the bundled Bibtex (< 2 min, 2 cores).

    xmc-tf train --config=quickstart --workdir=workdir/quickstart
"""

from xmc_tf_cli.schema import base


def get_config():
    c = base("uniform_sparse")
    c.train.epochs = 10  # the full config early-stops after about 9 on Bibtex
    c.train.verbose = 1  # a progress bar
    return c
