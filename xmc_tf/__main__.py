"""``python -m xmc_tf``: the ``xmc-tf`` command."""

from xmc_tf.job.cli import run

if __name__ == "__main__":  # not when imported (e.g. by a test or a tool)
    run()
