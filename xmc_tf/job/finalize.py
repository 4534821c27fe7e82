"""Finalize phase of the main job: the fused model to evaluate and export.

The trained network is fused with the scorers the plan turns on (the kinds
of :mod:`xmc_tf.job.scorers`: the label tree, the label centroids, the
neighbour votes) as ``network + sum of weight * scorer``
(:class:`xmc_tf.layers.FusedScores`), behind the feature normalisation, so
the exported model takes raw features.  Where the plan turns the shortlist
on (:func:`xmc_tf.job.plan.shortlist_plan`) the fused model ranks, per
instance, the labels its shortlisting scorers shortlist (the tree's beam
search, the votes), and so does everything that reads it: the fusion
weights (read on the validation rows' shortlists), the fused monitor of
each epoch (:class:`FusedValidation`), the test metrics and the
SavedModel's ``serve``.  Without it, every label is scored exactly and the
weights are read on the union of each part's best labels.

Sources: shortlist and re-rank, Astec / DeepXML (Dahiya et al., WSDM 2021,
Sec. 3); the scorers' own in their modules.
"""

from __future__ import annotations

import dataclasses
import time

import keras
import numpy as np
from absl import logging

from xmc_tf import data as xdata
from xmc_tf.job import preprocessing as xprep
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.inputs import subset
from xmc_tf.job.workdir import Workdir
from xmc_tf.layers import FusedScores, candidate_scorer
from xmc_tf.metrics import evaluator as xevaluation
from xmc_tf.shortlist.fusion import (NETWORK, ShortlistScores,
                                     choose_fusion_weights, exact_blocks,
                                     shortlist_blocks)

__all__ = ["FUSION_VALIDATION_ROWS", "FUSION_TOP", "FUSION_ROUNDS",
           "FUSED_MONITOR", "NETWORK_MONITOR", "FUSED_MODEL", "NETWORK_PAIRS",
           "FusionPlan",
           "FusedValidation", "prepare_fusion", "finalize", "row_blocks"]

#: At most this many validation instances are scored to read the weights.
FUSION_VALIDATION_ROWS = 8192
#: Without a shortlist: the labels each part keeps per validation instance
#: (the weights are read on the union of the parts' best labels).
FUSION_TOP = 100
#: At most this many rounds of coordinate ascent.
FUSION_ROUNDS = 4
#: The log key of :class:`FusedValidation`: the fused model's mean
#: validation P@k (a fraction in [0, 1], as the network's
#: ``val_precision_at_k``; ``config.train.min_delta`` is in its units).
FUSED_MONITOR = "val_fused_precision"
#: The log key of the network alone's mean P@k on those instances.
NETWORK_MONITOR = "val_network_precision"
#: The name of the exported fused layer (and of its model).
FUSED_MODEL = "fused"
#: The network scores the validation shortlists in blocks of at most this
#: many (instance, label) pairs (a dense head gathers a row per pair).
NETWORK_PAIRS = 2**17


def row_blocks(rows: xdata.XCDataset, batch: int):
    """Yields ``(part, x)`` per block of ``batch`` instances of ``rows``:
    the block's :class:`~xmc_tf.data.XCDataset` and its features as the
    model takes them (a ``tf.SparseTensor`` or a dense tensor)."""
    for start in range(0, rows.num_instances, max(1, int(batch))):
        part = subset(rows, np.arange(start, min(start + batch,
                                                 rows.num_instances)))
        yield part, next(iter(xdata.make_tf_dataset(part,
                                                    part.num_instances)))[0]


def _batches(rows, batch: int):
    for part, x in row_blocks(rows, batch):
        yield x, part.labels


@dataclasses.dataclass
class FusionPlan:
    """The fused scorers of a run and what reading their weights needs,
    made by :func:`prepare_fusion` (before training when the fused
    model's validation P@k drives it, else after).

    Attributes:
      scorers: the :class:`~xmc_tf.job.scorers.BuiltScorer` s, in fusion
        order.
      shortlist: whether the fused model ranks shortlists.
      rows: the validation instances the weights are read on (normalised),
        or None when no weight is read.
      multi_class: the training labels' regime.
      batch_size: instances per block of the validation passes.
      seconds: seconds :func:`prepare_fusion` took.
    """

    scorers: list
    shortlist: bool
    rows: xdata.XCDataset | None
    multi_class: bool
    batch_size: int
    seconds: float = 0.0
    _scorer_scores: ShortlistScores | None = None

    @property
    def reads_weights(self) -> bool:
        """Whether some weight is read on validation instances."""
        return self.rows is not None

    def parts(self) -> list:
        """The :class:`~xmc_tf.shortlist.fusion.FusionPart` s."""
        return [s.part() for s in self.scorers]

    def fused(self, network, choice=None) -> FusedScores:
        """A :class:`~xmc_tf.layers.FusedScores` of ``network``: with every
        variant of every scorer (``choice`` None: what the validation
        passes score), or the variants and weights of ``choice`` (a
        :class:`~xmc_tf.shortlist.fusion.FusionChoice`), the parts at
        weight 0 left out unless they shortlist (then they shortlist and
        do not score)."""
        layers, weights, sizes = [], [], []
        for built in self.scorers:
            if choice is None:
                picked = [(v, 1.0) for v in built.variants]
            else:  # at weight 0 a shortlisting part only shortlists
                weight = choice.weight[built.kind.part]
                keep = weight or (self.shortlist and built.shortlist)
                picked = ([(built.variant(choice.scorer[built.kind.part]),
                            weight)] if keep else [])
            for variant, weight in picked:
                layers.append(variant.layer)
                weights.append(weight)
                sizes.append(built.shortlist if self.shortlist else 0)
        return FusedScores(network, layers, weights, sizes, name=FUSED_MODEL)

    def shortlist_scores(self, network) -> ShortlistScores:
        """The validation rows' shortlists scored by every scorer and by
        ``network`` (:data:`~xmc_tf.shortlist.fusion.NETWORK`).  With a
        shortlist the scorers score once per plan (the shortlist does not
        depend on the network) and the network once per call; without,
        each call scores every part exactly."""
        fused = self.fused(network)
        if not self.shortlist:
            batch = self._exact_batch(len(fused.scorers) + 1)
            return ShortlistScores.collect(exact_blocks(
                fused, _batches(self.rows, batch), FUSION_TOP))
        if self._scorer_scores is None:
            self._scorer_scores = ShortlistScores.collect(shortlist_blocks(
                fused, _batches(self.rows, self.batch_size)))
        held = self._scorer_scores
        score = candidate_scorer(network)
        # a dense head gathers [rows, width, hidden] rows: blocks of at
        # most NETWORK_PAIRS (row, label) pairs
        batch = max(1, min(self.batch_size, NETWORK_PAIRS // held.width))

        def blocks():
            for start, (_, x) in zip(range(0, held.num_instances, batch),
                                     row_blocks(self.rows, batch)):
                ids = held.ids[start:start + batch]
                yield score(x, np.maximum(ids, 0)).numpy()
        return held.with_scores(NETWORK, blocks())

    def _exact_batch(self, parts: int) -> int:
        per_row = 4 * self.rows.num_labels * max(parts, 1)
        return max(1, min(self.batch_size,
                          2 * xevaluation.SCORE_BLOCK_BYTES // per_row))

    def choose(self, scores: ShortlistScores | None, ks):
        """:func:`~xmc_tf.shortlist.fusion.choose_fusion_weights` of these
        parts on ``scores`` (None: every weight fixed)."""
        return choose_fusion_weights(scores, self.parts(), ks,
                                     max_rounds=FUSION_ROUNDS)


def _built_scorers(config, wd: Workdir, fit_data, has_validation: bool,
                   multi_class: bool) -> list:
    """Every kind the (resolved) config turns on, built; on dense features
    none, and a kind whose weight is "auto" with no validation instances
    to read it on is left out (logged)."""
    built = []
    for kind in xscorers.kinds():
        if kind.enabled(config) is not True:
            continue
        if not fit_data.is_sparse:  # the scorers read sparse features
            logging.info("%s: off (dense input features)", kind.what)
            continue
        if not has_validation and kind.weight(config) is None:
            logging.info("%s: off (weight 'auto' and no validation "
                         "instances to read it on)", kind.what)
            continue
        start = time.time()
        built.append(kind.build(config, wd, fit_data, multi_class))
        logging.info("%s: built in %.1f s", kind.what, time.time() - start)
    return built


def prepare_fusion(config, wd: Workdir, fit_data, val_data) -> FusionPlan:
    """The scorers :func:`finalize` fuses with the network, built from the
    fit split (normalised; the tree is fit, or reloaded from the backup
    directory), and the validation instances their weights are read on
    (the first :data:`FUSION_VALIDATION_ROWS`, when some weight is
    "auto" and validation instances exist).

    Returns:
      A :class:`FusionPlan`.
    """
    start = time.time()
    multi_class = xdata.is_multi_class(fit_data.labels)
    has_validation = val_data is not None and val_data.num_instances > 0
    built = _built_scorers(config, wd, fit_data, has_validation, multi_class)
    sc = config.get("shortlist")
    # the plan left a bool there (xmc_tf.job.plan.resolve_config)
    shortlist = bool(sc is not None and sc.enabled is True
                     and any(b.shortlist for b in built))
    logging.info("shortlist: %s", "on (%s)" % ", ".join(
        f"{b.kind.what} {b.shortlist}" for b in built if b.shortlist)
        if shortlist else "off (every label is scored)")
    rows = None
    if has_validation and any(b.weight is None for b in built):
        rows = subset(val_data, np.arange(min(val_data.num_instances,
                                              FUSION_VALIDATION_ROWS)))
    return FusionPlan(built, shortlist, rows, multi_class,
                      int(config.eval.batch_size), time.time() - start)


class FusedValidation(keras.callbacks.Callback):
    """Reads the fused model's validation P@k at every epoch end.

    The model exported is the network fused with the other scorers
    (:func:`finalize`), so that is what the LR schedule and early stopping
    should follow: once the other scorers carry the few-shot labels, epochs
    that lift the network alone can leave the fused model where it was.
    At each epoch end the network scores the plan's validation shortlists
    (the other scorers scored them once, :meth:`FusionPlan.shortlist_scores`),
    the fusion weights are chosen on them as :func:`finalize` will, and the
    mean P@k over ``ks`` (a fraction) of the fused model at those weights
    is logged as :data:`FUSED_MONITOR` (that of the network alone as
    :data:`NETWORK_MONITOR`).  Source: early stopping on a held-out score
    of the model that is kept (Prechelt, "Early Stopping -- But When?",
    1998).

    Args:
      plan: a :class:`FusionPlan` that reads weights.
      model: the network (inference model; the callback's own
        ``self.model`` may be a training wrapper).
      ks: the P@k cut-offs averaged (``config.eval.ks``).

    Raises:
      ValueError: the plan reads no weight.
    """

    def __init__(self, plan: FusionPlan, model, ks):
        super().__init__()
        if not plan.reads_weights:
            raise ValueError("FusedValidation needs a FusionPlan that reads "
                             "weights on validation instances")
        self.plan, self.network = plan, model
        self.ks = tuple(int(k) for k in ks)

    def on_epoch_end(self, epoch, logs=None):
        start = time.time()
        scores = self.plan.shortlist_scores(self.network)
        choice = self.plan.choose(scores, self.ks)
        fused = scores.precision(choice.weights(), self.ks)
        alone = scores.precision({NETWORK: 1.0}, self.ks)
        if logs is not None:  # fractions, as Keras' P@k metrics
            logs[FUSED_MONITOR] = float(np.mean(list(fused.values()))) / 100
            logs[NETWORK_MONITOR] = float(np.mean(list(alone.values()))) / 100
        logging.info(
            "epoch %d: fused validation %s %s (network alone %s) at %s, "
            "%d instances, %.1f s", epoch + 1,
            "/".join(f"P@{k}" for k in self.ks),
            "/".join(f"{v:.2f}" for v in fused.values()),
            "/".join(f"{v:.2f}" for v in alone.values()),
            ", ".join(f"{choice.scorer[p]} x{w:g}"
                      for p, w in choice.weight.items()),
            scores.num_instances, time.time() - start)


def _table_json(table: dict) -> dict:
    return {str(a): {f"P@{k}": round(v, 2) for k, v in row.items()}
            for a, row in table.items()}


def _report(plan: FusionPlan, choice, scores, ks) -> dict:
    """``metrics.json``'s entries of the fused parts and of the fusion,
    each weight's choice logged."""
    info = {}
    for built in plan.scorers:
        part = built.kind.part
        entry = dict(built.info, weight=choice.weight[part])
        variant = built.variant(choice.scorer[part])
        if variant.idf is not None:
            entry["idf"] = bool(variant.idf)
        if part in choice.tables:
            entry["validation"] = _table_json(choice.tables[part])
            row = choice.tables[part][choice.weight[part]]
            logging.info("%s: weight %g (%s), validation %s", built.kind.what,
                         choice.weight[part], variant.name,
                         "/".join(f"P@{k} {v:.2f}" for k, v in row.items()))
        if part in choice.variants:
            entry["variants"] = choice.variants[part]
        info[part] = entry
    if scores is not None:
        weights = choice.weights()
        info["fusion"] = {
            "validation_instances": scores.num_instances,
            "rounds": choice.rounds, "shortlist": plan.shortlist,
            "shortlist_width": scores.width,
            "validation_recall": round(scores.recall(weights), 2),
            "validation": {f"P@{k}": round(v, 2) for k, v in
                           scores.precision(weights, ks).items()}}
        logging.info("fusion: %d validation instances, shortlists of %d "
                     "labels holding %.1f %% of their positives",
                     scores.num_instances, scores.width,
                     info["fusion"]["validation_recall"])
    return info


def finalize(config, wd: Workdir, model, fit_data, val_data, norm,
             plan: FusionPlan | None = None):
    """The model to evaluate and export: ``model`` fused with the scorers
    of ``plan`` (:func:`prepare_fusion`; made here when None), their
    weights (and variants) read on the plan's validation shortlists by
    coordinate ascent (:meth:`FusionPlan.choose`), behind the feature
    normalisation ``norm``.  Without a part at a weight > 0 and without a
    shortlist it is ``model`` behind the normalisation; with a shortlist,
    its shortlisting parts stay at any weight (at 0 they only shortlist).

    Returns:
      ``(exported_model, info, seconds)``: ``info`` holds each fused part's
      entry (``"label_tree"``, ``"centroids"``, ``"neighbours"``: sizes,
      ``"weight"``, the validation P@k per weight) and ``"fusion"`` (the
      validation instances, rounds, the shortlist's width and recall, the
      fused validation P@k, seconds) for ``metrics.json``; ``seconds``:
      the plan's and this call's, for ``train_seconds``.
    """
    if plan is None:
        plan = prepare_fusion(config, wd, fit_data, val_data)
    start = time.time()
    ks = tuple(config.eval.ks)
    scores = plan.shortlist_scores(model) if plan.reads_weights else None
    choice = plan.choose(scores, ks)
    info = _report(plan, choice, scores, ks)
    seconds = plan.seconds + time.time() - start
    if "fusion" in info:
        info["fusion"]["seconds"] = round(seconds, 2)
    fused = plan.fused(model, choice)
    if not fused.scorers:
        return xprep.with_normalization(model, norm), info, seconds
    return (xprep.behind_normalization(model, norm, fused,
                                       f"{FUSED_MODEL}_model"),
            info, seconds)
