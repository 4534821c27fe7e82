"""The packaged config ``linear`` (xmc_tf/configs/linear.py; ``--config=linear``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("linear")
