"""The packaged config ``astra`` (xmc_tf/configs/astra.py; ``--config=astra``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("astra")
