"""The packaged config ``scent`` (xmc_tf/configs/scent.py; ``--config=scent``)."""

from xmc_tf_cli.schema import get_config as _packaged


def get_config():
    return _packaged("scent")
