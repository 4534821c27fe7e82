"""The packaged config ``mach`` (xmc_tf/configs/mach.py; ``--config=mach``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("mach")
