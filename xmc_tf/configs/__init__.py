"""The packaged configs of ``xmc-tf train``: short overrides of the schema.

Each module's ``get_config()`` starts from :func:`xmc_tf.config.base` (or
another packaged config) and sets what differs, one line each with the
reason; the measurements are in ``docs/notes/defaults.md``.  Load one with
``xmc_tf.config.get_config(NAME)`` or ``xmc-tf train --config=NAME``; the
repository's ``configs/NAME.py`` files name the same configs.
"""
