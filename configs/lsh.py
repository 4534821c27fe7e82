"""The packaged config ``lsh`` (xmc_tf/configs/lsh.py; ``--config=lsh``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("lsh")
