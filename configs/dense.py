"""The paper's baseline: the uniform-sparse model with a dense output layer.

Identical to configs/uniform_sparse.py except ``model.head = "dense"`` (and
no SET, which only applies to sparse heads).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import uniform_sparse  # noqa: E402


def get_config():
    c = uniform_sparse.get_config()
    c.model.head = "dense"
    c.set.enabled = False
    return c
