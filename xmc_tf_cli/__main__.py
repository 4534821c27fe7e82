"""``python -m xmc_tf_cli``: the ``xmc-tf`` command (fast ``--help``)."""

import sys

from xmc_tf_cli import main

sys.exit(main())
