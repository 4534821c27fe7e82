"""The packaged config ``dense`` (xmc_tf/configs/dense.py; ``--config=dense``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("dense")
