"""The packaged config ``lsh`` (xmc_tf/configs/lsh.py; ``--config=lsh``)."""

from xmc_tf.config import get_config as _packaged


def get_config():
    return _packaged("lsh")
