"""The packaged config ``quickstart`` (xmc_tf/configs/quickstart.py; ``--config=quickstart``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("quickstart")
