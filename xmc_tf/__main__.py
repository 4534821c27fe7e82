"""``python -m xmc_tf``: the ``xmc-tf`` command."""

from xmc_tf.cli import run

run()
