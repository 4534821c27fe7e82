"""The paper's baseline: the uniform-sparse model with a dense output layer.

A fully connected head, ``4 (d + 1) m`` bytes; better than the
uniform-sparse head on Delicious' validation splits, worse on Bibtex's
(docs/notes/defaults.md).
"""

from xmc_tf_cli.schema import base


def get_config():
    return base("dense")
