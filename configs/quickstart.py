"""The packaged config ``quickstart`` (xmc_tf/configs/quickstart.py; ``--config=quickstart``)."""

from xmc_tf.config import get_config as _packaged


def get_config():
    return _packaged("quickstart")
