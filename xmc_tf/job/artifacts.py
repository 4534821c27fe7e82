"""The model files of a work directory: ``model.keras`` and
``saved_model/`` written into place (:func:`export_model`) and the trained
model read back after its completion marker is checked (:func:`load_model`).
"""

from __future__ import annotations

import keras
from absl import logging

from xmc_tf import saving
from xmc_tf.errors import IncompleteWorkdir
from xmc_tf.files import atomic_path
from xmc_tf.job.workdir import Workdir

__all__ = ["export_model", "load_model"]


def export_model(model: keras.Model, workdir: str, k: int = 5) -> None:
    """Writes ``WORKDIR/model.keras`` and ``WORKDIR/saved_model/``, each to a
    temporary sibling renamed into place (see
    :func:`xmc_tf.files.atomic_path`): a kill leaves the old or the new
    version of each, never a torn one.  Write ``metrics.json`` (the
    completion marker, :meth:`xmc_tf.job.workdir.Workdir.mark_complete`)
    after this returns.

    Args:
      model: the trained model.
      workdir: the work directory.
      k: labels per instance of the ``serve`` signature
        (:func:`xmc_tf.saving.export_saved_model`).
    """
    wd = Workdir(workdir)
    with atomic_path(wd.file(Workdir.MODEL)) as tmp:
        saving.save_keras_file(model, tmp)
    with atomic_path(wd.file(Workdir.SAVED_MODEL)) as tmp:
        portable = saving.export_saved_model(model, tmp, k=k)
    logging.info("%s: %s", wd.file(Workdir.SAVED_MODEL),
                 "stock TensorFlow ops only (loads without xmc_tf)" if portable
                 else "uses xmc_tf ops (load after `import xmc_tf`)")


def load_model(workdir: str, verify: bool = True) -> keras.Model:
    """The trained Keras model of a work directory (``model.keras``).

    Args:
      workdir: a work directory written by ``xmc-tf train`` (or
        :class:`xmc_tf.ExtremeClassifier`).
      verify: check the completion marker of ``metrics.json`` and the model
        file's fingerprint first (:meth:`Workdir.check_complete`).

    Returns:
      The uncompiled ``keras.Model``.

    Raises:
      IncompleteWorkdir: no complete run in ``workdir`` (``verify``), or no
        ``model.keras``.
      OpNotRegisteredError: the op library is unavailable.
    """
    wd = Workdir(workdir)
    if verify:
        wd.check_complete()
    try:
        return saving.load_keras_file(wd.file(Workdir.MODEL))
    except FileNotFoundError as e:
        raise IncompleteWorkdir(str(e)) from None
