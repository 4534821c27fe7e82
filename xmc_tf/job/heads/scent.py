"""The SCENT head: full-softmax training of a multi-class head on in-batch classes.

Training follows Algorithm 26 of ``scent-extreme-multiclass`` (Sec. 6.3): a
batch scores only its own classes ``C_t`` (the distinct labels of its
instances), :class:`xmc_tf.losses.ScentLoss` updates each instance's dual
variable ``nu_i`` in closed form and gives the loss whose gradient lives on
the rows ``W[C_t]``, and the row-sparse momentum step of
:class:`xmc_tf.optimizers.LazySGD` (``config.train.optimizer =
"scent_momentum"``: ``momentum = dampening = 1 - beta``) moves only those
rows and their momentum, as the algorithm's ``V[C_t]``/``W[C_t]`` update.
The per-instance duals need each batch's instance ids: the training data
set is built with ``make_tf_dataset(..., with_example_ids=True)``
(:meth:`~xmc_tf.job.heads.base.Head.dataset_kwargs`) and sized from the training set
(:meth:`ScentHead.prepare`).

Cost per step: ``b x |C_t| <= b^2`` scores instead of ``b x m``: the head
layer's ``score_shared`` gathers the ``|C_t|`` rows once and scores them for
the whole batch (:class:`~xmc_tf.layers.LabelDense`: ``[b, d] x [d, |C_t|]``;
:class:`~xmc_tf.layers.UniformSparseDense`: op ``Xmc>UniformSparseMatmul``
on the gathered rows, ``b |C_t| s``).  Both give ``IndexedSlices``
gradients over ``C_t``.

Evaluation is exact: the trained model is the ordinary full-scoring model,
decoded by :mod:`xmc_tf.decoding`;
held-out P@k comes from :class:`xmc_tf.callbacks.TopKEvaluation` once per
epoch.

Config (``config.model.head = "scent"``, ``config.loss = "scent"``; see
``configs/scent.py``):

* ``config.model.sampled_layer``: ``"dense"`` (LabelDense) or
  ``"uniform_sparse"`` (fan-in ``config.model.connections_per_label``; SET
  when ``config.set.enabled``).
* ``config.scent``: ``variant`` (``"scent"``/``"sox"``), ``alpha`` (dual
  step; SOX's gamma), ``negatives`` (``"multiset"``/``"unique"``),
  ``correction`` (``"none"``/``"log_q"``), ``beta`` (momentum weight of
  Algorithm 26 for ``"scent_momentum"``).
* ``config.train.optimizer``: ``"scent_momentum"`` (the paper's update),
  or any optimizer the job builds (``"lazy_adam"``...).

What the training job must do (``xmc_tf/job/run.py``), for any head::

    head.prepare(fit_data)                   # before build_and_compile
    optimizer = head.make_optimizer() or build_optimizer(config)
    train_ds = make_tf_dataset(fit_data, ..., **head.dataset_kwargs())

Multi-class only: :meth:`ScentHead.prepare` rejects training data with a
row of more than one label (``ValueError``).

Source: ``scent-extreme-multiclass``, Sec. 6.3, Algorithm 26.
"""

from __future__ import annotations

from absl import logging
import numpy as np

from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import register
from xmc_tf.job.heads.candidates import CandidateHead
from xmc_tf.models.scent import ScentTrainer, scent_optimizer
from xmc_tf.losses.scent import CORRECTIONS, NEGATIVES, VARIANTS, ScentLoss

__all__ = ["ScentHead", "SCENT_LAYERS"]

SCENT_LAYERS = ("dense", "uniform_sparse")
#: ``config.train.optimizer`` value of Algorithm 26's momentum step.
SCENT_MOMENTUM = "scent_momentum"


@register
class ScentHead(CandidateHead):
    """``config.model.head = "scent"``: see the module docstring."""

    name = "scent"
    config_defaults = xconfig.HEAD_DEFAULTS["scent"]
    losses = ("scent",)
    sampled_layers = SCENT_LAYERS

    def __init__(self, config):
        super().__init__(config)
        self._labels = None

    def check_config(self):
        super().check_config()
        sc = self.config.scent
        for field, allowed in (("variant", VARIANTS), ("negatives", NEGATIVES),
                               ("correction", CORRECTIONS)):
            if sc[field] not in allowed:
                raise ValueError(f"config.scent.{field}={sc[field]!r}; "
                                 f"expected one of {allowed}")
        if not float(sc.alpha) > 0 or not np.isfinite(float(sc.alpha)):
            raise ValueError(f"config.scent.alpha={sc.alpha!r} must be a "
                             "finite number > 0")
        if sc.correction == "log_q" and sc.negatives != "multiset":
            raise ValueError("config.scent.correction='log_q' needs "
                             "config.scent.negatives='multiset'")
        if self.config.train.optimizer == SCENT_MOMENTUM and not (
                0.0 < float(sc.beta) <= 1.0):
            raise ValueError(f"config.scent.beta={sc.beta!r} must be in "
                             "(0, 1]")

    def prepare(self, train_data):
        """Keeps the training labels (the loss is sized and, for
        ``"log_q"``, weighted from them by :meth:`ScentLoss.from_labels`).

        Raises:
          ValueError: a training row has more than one label.
        """
        labels = train_data.labels
        per_row = np.diff(labels.indptr) if hasattr(labels, "indptr") else \
            np.count_nonzero(np.asarray(labels), axis=1)
        multi = int(np.count_nonzero(per_row > 1))
        if multi:
            raise ValueError(
                f"head 'scent' is multi-class but {multi} of "
                f"{train_data.num_instances} training rows have more than one "
                "label; use a multi-label head (dense, uniform_sparse, sampled)")
        self._labels = train_data.labels
        logging.info("scent: the logged loss is SCENT's dual objective, the "
                     "cross-entropy minus the log of the number of in-batch "
                     "classes it averages over: it turns negative as the "
                     "model learns (xmc_tf.models.ScentTrainer)")

    def dataset_kwargs(self):
        return {"with_example_ids": True}

    def make_optimizer(self):
        tc = self.config.train
        if tc.optimizer == SCENT_MOMENTUM:
            return scent_optimizer(tc.learning_rate, self.config.scent.beta)
        return None

    def make_loss(self, layer):
        """The :class:`ScentLoss` of the training set.

        Raises:
          ValueError: :meth:`prepare` was not called.
        """
        if self._labels is None:
            raise ValueError("head 'scent' needs the training set size: call "
                             "head.prepare(train_data) before building the "
                             "training model")
        sc = self.config.scent
        return ScentLoss.from_labels(
            self._labels, num_labels=layer.num_labels, alpha=float(sc.alpha),
            variant=sc.variant, negatives=sc.negatives,
            correction=sc.correction, own_term=bool(sc.own_term))

    def training_model(self, model, layer):
        return ScentTrainer(model, self.make_loss(layer),
                            name=f"{model.name}_trainer")

    def results(self, layer):
        sc = self.config.scent
        return {**super().results(layer),
                "scent_variant": sc.variant, "scent_alpha": float(sc.alpha),
                "scent_negatives": sc.negatives,
                "scent_correction": sc.correction}
