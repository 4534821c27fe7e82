"""The packaged config ``uniform_sparse`` (xmc_tf/configs/uniform_sparse.py; ``--config=uniform_sparse``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("uniform_sparse")
