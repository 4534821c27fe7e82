"""Sampled heads: train a full-scoring layer on positives + sampled negatives.

During training the head layer scores, per instance, only its positive
labels and ``k`` candidate negatives drawn by a
:class:`~xmc_tf.samplers.NegativeSampler` (uniform, in-batch, ANN hard
negatives, ASTRA's hard + uniform mix, LSH), through the layer's
``score_candidates`` (the op ``Xmc>UniformSparseSampledMatmul`` for a
uniform-sparse layer, gather + einsum for a label-major dense layer).  The
gradient of the label weights is an ``IndexedSlices`` over the scored rows,
so with a row-sparse optimizer (:class:`xmc_tf.optimizers.LazyAdam`) a step
costs ``O(b (n + k) s)`` instead of ``O(b m s)``.  The sampled losses of
:mod:`xmc_tf.losses.sampled` weight the candidates so that the loss is an
estimate of the full one-vs-all loss (importance weights, ASTRA Eq. 2) or
of the full softmax (log-Q correction).

Evaluation stays exact: the trained model is an ordinary model whose head
layer scores every label (decoded by :mod:`xmc_tf.decoding`), and held-out P@k is computed once per
epoch over all labels by :class:`xmc_tf.callbacks.TopKEvaluation`.

Labels reach the head inside ``fit`` through :class:`SampledTrainer`, a
:class:`~xmc_tf.models.CandidateTrainer` wrapping the functional
model with its own ``train_step`` (Keras passes a loss only ``(y_true,
y_pred)``, which cannot express per-instance candidates).  The sampler is
made by the kind registered under ``config.sampler.kind``
(:mod:`xmc_tf.job.samplers`), which also brings its refresh callbacks.

Config (``config.model.head = "sampled"``):

* ``config.model.sampled_layer``: ``"uniform_sparse"`` (fan-in
  ``config.model.connections_per_label``) or ``"dense"`` (a label-major
  :class:`~xmc_tf.layers.LabelDense`).
* ``config.loss``: ``"squared_hinge"``, ``"bce"``, ``"softmax"`` or
  ``"auto"`` (read from the training labels by :func:`regime_choices`:
  the sampled softmax on multi-class data, the squared hinge on
  multi-label data).
* ``config.sampler``: ``kind`` (``"uniform"``, ``"in_batch"``, ``"ann"``,
  ``"mixture"``, ``"lsh"``), ``num_negatives`` (k of uniform / in-batch /
  ann / lsh), ``num_hard`` / ``num_uniform`` (k_h / k_r of the mixture),
  ``index`` / ``nprobe`` (faiss), ``refresh_start_epoch`` (tau_s),
  ``refresh_every_epochs`` (tau_r), ``refresh_every_steps``,
  ``max_fraction`` (optional cap on the candidates per row relative to m,
  see :func:`sampler_sizes`), and for LSH ``hash``, ``K``, ``L``,
  ``query`` (``K = 0``: :func:`lsh_auto_K`), ``weighting`` (``"inverse_probability"`` or ``"none"``),
  ``min_probability`` (floor of the inclusion probability, i.e. a cap
  ``1 / min_probability`` on the weights; 0 = the sampler's ``1 / m``),
  ``rehash_every_steps`` and ``rehash_decay`` (the table update period and
  its decay), ``shared`` (one candidate set per batch scored by every row
  in one matrix product, kinds ``"uniform"``, ``"mixture"`` and ``"lsh"``
  (a shared mixture whose pool the LSH tables retrieve: ``num_hard`` per
  row, plus ``num_uniform`` uniform draws); see
  :mod:`xmc_tf.samplers.base`; ``"auto"``: shared on multi-class data, per
  row on multi-label data, :func:`regime_choices`) and ``pool_positives`` (shared mixture: the
  batch's positives join the exactly scored pool, see
  :mod:`xmc_tf.samplers.mixture`).

Source: ASTRA (Mehta et al.), Algorithm 1 and Eq. 2; the LSH paper
(``lsh-constant-time-negative-sampling``), Algorithm 1.
"""

from __future__ import annotations

from absl import logging


from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import register
from xmc_tf.job.heads.candidates import CandidateHead
from xmc_tf.models.sampled import SampledTrainer
from xmc_tf.losses.sampled import (SampledBinaryCrossentropy,
                                   SampledSoftmax, SampledSquaredHinge)
from xmc_tf.config import AUTO
from xmc_tf.data import is_multi_class
from xmc_tf.job.samplers import (make_sampler, sampler_kind, shared_kinds,
                                 shared_setting as _shared_setting)

__all__ = ["SampledHead", "SAMPLED_LOSSES", "regime_choices"]

#: ``config.loss`` -> sampled loss class.
SAMPLED_LOSSES = {"squared_hinge": SampledSquaredHinge,
                  "bce": SampledBinaryCrossentropy,
                  "softmax": SampledSoftmax}


def regime_choices(config, labels) -> dict:
    """The loss and candidate mode of a sampled head, read from the data.

    Multi-class training data (every instance has at most one label) trains
    with the sampled softmax on one candidate set shared by the batch (as
    ``tf.nn.sampled_softmax_loss`` does: the weighted squared hinge of
    ASTRA's Eq. 2 gave P@1 0.03 after an epoch on a 50k-class set, loss
    7,286, the weights ``m / k_r`` being ~200); multi-label data with the
    squared hinge on per-row candidates (Bibtex equal, Delicious val P@1
    70.0 per row vs 67.6 shared: docs/notes/sampled.md).  Only ``"auto"`` values
    are replaced; a value the config sets is kept.

    Args:
      config: the job config (``config.loss``, ``config.sampler.kind`` and
        ``.shared``).
      labels: ``scipy.sparse`` CSR ``[n, m]`` training labels.

    Returns:
      ``{"loss": str, "shared": bool, "multi_class": bool}``.

    Raises:
      ValueError: a ``config.sampler.shared`` value that is not a bool or
        ``"auto"``.

    >>> import ml_collections, scipy.sparse as sp
    >>> c = ml_collections.ConfigDict(dict(loss="auto", sampler=dict(
    ...     kind="mixture", shared="auto")))
    >>> regime_choices(c, sp.identity(3, format="csr"))
    {'loss': 'softmax', 'shared': True, 'multi_class': True}
    >>> regime_choices(c, sp.csr_matrix([[1, 1], [0, 1]]))
    {'loss': 'squared_hinge', 'shared': False, 'multi_class': False}
    """
    multi_class = is_multi_class(labels)
    loss = config.loss
    if loss == AUTO:
        loss = "softmax" if multi_class else "squared_hinge"
    shared = _shared_setting(config.sampler.shared)
    if shared is None:
        shared = multi_class and config.sampler.kind in shared_kinds()
    return {"loss": loss, "shared": bool(shared), "multi_class": multi_class}


@register
class SampledHead(CandidateHead):
    """``config.model.head = "sampled"``: see the module docstring."""

    name = "sampled"
    config_defaults = xconfig.HEAD_DEFAULTS["sampled"]
    losses = tuple(SAMPLED_LOSSES)

    def __init__(self, config):
        super().__init__(config)
        self._sampler = None
        self._choices = None

    def check_config(self):
        if self.config.loss != AUTO:
            super().check_config()
        else:
            self.check_sampled_layer()
        sc = self.config.sampler
        kind = sampler_kind(sc.kind)  # ValueError: unknown kind
        if _shared_setting(sc.shared) and not kind.shared:
            raise ValueError(f"config.sampler.shared=True needs kind in "
                             f"{shared_kinds()}, got {kind.name!r}")
        for module in kind.missing():
            # Before any work: without faiss the first index refresh, an
            # epoch in, would fail.
            raise ValueError(f"config.sampler.kind={kind.name!r} needs "
                             f"{module}, an optional dependency: "
                             f"{kind.requires[module]}")

    def prepare(self, train_data):
        """Resolves ``"auto"`` loss and candidate mode from the training
        labels (:func:`regime_choices`) and logs the choice."""
        self._choices = regime_choices(self.config, train_data.labels)
        c = self._choices
        if self.config.loss == AUTO or _shared_setting(
                self.config.sampler.shared) is None:
            logging.info(
                "sampled head: %s training data -> loss %r, %s candidates "
                "(config.loss=%r, config.sampler.shared=%r)",
                "multi-class" if c["multi_class"] else "multi-label",
                c["loss"], "shared" if c["shared"] else "per-row",
                self.config.loss, self.config.sampler.shared)

    def choices(self) -> dict:
        """``{"loss", "shared", "multi_class"}`` in force: those of
        :meth:`prepare`, or the config's own values (``"auto"`` read as a
        multi-label regime) before it."""
        if self._choices is None:
            c = self.config
            shared = _shared_setting(c.sampler.shared)
            return {"loss": "squared_hinge" if c.loss == AUTO else c.loss,
                    "shared": bool(shared), "multi_class": False}
        return self._choices

    def sampler(self, layer):
        """The head's sampler (made once, for ``layer.num_labels`` labels)."""
        if self._sampler is None:
            self._sampler = make_sampler(self.config.sampler,
                                         layer.num_labels, self.config.seed,
                                         shared=self.choices()["shared"])
        return self._sampler

    def make_loss(self, layer):
        return SAMPLED_LOSSES[self.choices()["loss"]]()

    def training_model(self, model, layer):
        return SampledTrainer(model, self.sampler(layer),
                              self.make_loss(layer),
                              shared=self.choices()["shared"],
                              name=f"{model.name}_trainer")

    def candidate_callbacks(self, layer, set_callback):
        """The refresh callbacks of the sampler's kind (ANN index refresh,
        LSH rehash; see :mod:`xmc_tf.job.samplers`)."""
        sc = self.config.sampler
        return sampler_kind(sc.kind).refresh_callbacks(
            self.sampler(layer), sc, set_callback)

    def results(self, layer):
        c = self.choices()
        return {"sampler": repr(self.sampler(layer)), **super().results(layer),
                "loss": c["loss"], "shared_candidates": c["shared"]}
