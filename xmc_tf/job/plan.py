"""Plan phase of the main job: summarise the training data and resolve
every field the config leaves to the data.

The job (:mod:`xmc_tf.job.run`) runs the phases
check -> plan -> splits -> build -> fit -> finalize -> export, each a
function from the value of the one before; this module makes the plan from
the checked config (:class:`xmc_tf.job.checks.Checked`), a frozen
:class:`Plan` (:func:`make_plan`): the config as given and resolved to
concrete values (:func:`resolve_config`), what the data chose, the head
bound to the resolved config, and a :class:`DataSummary` of the training
data that the resume check and ``metrics.json`` keep.

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
Extremely Large Output Spaces", Sec. 4.1 (the schedule the configs use).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import numpy as np
from absl import logging

from xmc_tf import config as xconfig
from xmc_tf import data as xdata
from xmc_tf.job import heads as xheads
from xmc_tf.job import scorers as xscorers
from xmc_tf.job.scorers.base import shortlist_plan
from xmc_tf.config import AUTO, auto_bool

__all__ = ["DataSummary", "Plan", "make_plan", "summarize", "resolve_config",
           "automatic", "automatic_fields", "is_auto", "monitor_plan",
           "shortlist_plan", "validation_rows"]


@dataclasses.dataclass(frozen=True)
class DataSummary:
    """What the plan reads from the training data (no arrays).

    Attributes:
      num_instances: training instances (rows), int.
      num_features: feature columns (sparse) or embedding width (dense).
      num_labels: label columns, m.
      sparse: True for sparse (CSR) features, False for dense embeddings.
      multi_class: every instance has at most one label
        (:func:`xmc_tf.data.is_multi_class`).
      feature_nnz: stored feature values (``n * d`` for dense features).
      label_nnz: stored labels (positives).
      whole_features: every stored feature value is a whole number >= 0
        (counts or binary; :func:`xmc_tf.data.resolve_normalization`).
      label_instances_median: the median number of training instances of
        the labels that have any (0.0 without labels): the tail profile
        that the centroids' and the votes' plan rules read
        (:mod:`xmc_tf.job.scorers`).
      postings_per_instance: the stored training entries an instance's
        features meet, averaged over the training instances
        (``sum over features of df ** 2 / n``; 0.0 for dense features): the
        cost per query of :class:`xmc_tf.layers.NearestNeighbourScores`,
        which the votes' plan rule reads.
    """

    num_instances: int
    num_features: int
    num_labels: int
    sparse: bool
    multi_class: bool
    feature_nnz: int
    label_nnz: int
    whole_features: bool
    label_instances_median: float = 0.0
    postings_per_instance: float = 0.0

    @property
    def regime(self) -> str:
        """``"multi-class"`` or ``"multi-label"``."""
        return "multi-class" if self.multi_class else "multi-label"

    def to_json(self) -> dict:
        """The summary as a JSON-able dict (``metrics.json`` ``"data"``)."""
        return dataclasses.asdict(self)


def summarize(train: xdata.XCDataset) -> DataSummary:
    """The :class:`DataSummary` of a raw training set."""
    features = train.features
    nnz = (int(features.nnz) if train.is_sparse
           else int(np.prod(features.shape)))
    counts = train.label_counts()
    counts = counts[counts > 0]
    postings = 0.0
    if train.is_sparse and train.num_instances:
        df = np.bincount(features.indices, minlength=train.num_features)
        postings = float(np.square(df.astype(np.float64)).sum()
                         / train.num_instances)
    return DataSummary(
        num_instances=int(train.num_instances),
        num_features=int(train.num_features),
        num_labels=int(train.num_labels), sparse=bool(train.is_sparse),
        multi_class=bool(xdata.is_multi_class(train.labels)),
        feature_nnz=nnz, label_nnz=int(train.labels.nnz),
        whole_features=xdata.resolve_normalization(
            "auto", features) == "tfidf",
        label_instances_median=(float(np.median(counts)) if counts.size
                                else 0.0),
        postings_per_instance=postings)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The plan phase's value: what every later phase reads.

    Attributes:
      given: the config as given (``ml_collections.ConfigDict``; what
        ``config.json``, the resume check and ensemble members compare).
      config: the config resolved from the data (:func:`resolve_config`);
        ``given`` itself when nothing was left to the data.
      regime: ``{"labels", "fields"}`` of the values the data chose (JSON;
        ``{}`` when none), kept by the checkpoint and ``metrics.json``.
      head: the :class:`xmc_tf.job.heads.Head` bound to ``config``.
      summary: the training data's :class:`DataSummary`.
      data: the run's data (:class:`xmc_tf.job.inputs.JobData`, raw
        feature values).
      inv_prop: float32 ``[num_labels]`` inverse label propensities of the
        training labels (PSP@k), or None without a test set.
    """

    given: object
    config: object
    regime: dict
    head: xheads.Head
    summary: DataSummary
    data: object
    inv_prop: object = None


def validation_rows(config, num_instances: int) -> int:
    """Instances the validation split holds out of ``num_instances``
    (:func:`xmc_tf.job.inputs.validation_split`):
    ``round(config.data.validation_fraction * num_instances)``, with the
    fraction as resolved (by regime: :data:`xmc_tf.config.REGIME_FIELDS`).

    Args:
      config: a resolved config (``config.data.validation_fraction`` a float
        in ``[0, 1)``).
      num_instances: training instances, an int.

    Returns:
      An int in ``[0, num_instances]``.
    """
    return int(round(config.data.validation_fraction * num_instances))


def make_plan(checked, data, summary: DataSummary | None = None,
              inv_prop=None) -> Plan:
    """The :class:`Plan` of the checked config on ``data``: the config
    resolved from the training data (:func:`resolve_config`) and the
    checked head bound to it (:meth:`xmc_tf.job.heads.Head.bound_to`: no
    second check).

    Args:
      checked: the :class:`xmc_tf.job.checks.Checked` config as given.
      data: :class:`xmc_tf.job.inputs.JobData` (``train`` and, when the
        caller has one, ``validation``).
      summary: ``data.train``'s :class:`DataSummary` when the caller has it.
      inv_prop: the inverse propensities to keep in the plan (or None).

    Returns:
      The frozen :class:`Plan`.
    """
    given, head = checked.config, checked.head
    summary = summary or summarize(data.train)
    config, regime = resolve_config(given, data.train, data.validation,
                                    summary, head=head)
    return Plan(given=given, config=config, regime=regime,
                head=head.bound_to(config), summary=summary, data=data,
                inv_prop=inv_prop)


def monitor_plan(config, has_validation: bool,
                 multi_class: bool = True) -> tuple[bool, str]:
    """Whether LR halving and early stopping follow the fused model's
    validation P@k (:class:`xmc_tf.job.finalize.FusedValidation`) rather
    than the network's, and why.

    ``config.train.monitor="auto"`` picks the fused model on multi-class
    training labels when a few-shot scorer is on (a kind of
    :mod:`xmc_tf.job.scorers` with ``few_shot``: the centroids, the votes,
    as resolved by their plan rules) with its weight read on validation and
    a validation split exists: there the tree, the centroids and the votes
    carry the classes with a few instances, and the network's own P@k keeps
    rising for epochs that leave the fused model where it was
    (DebDocNextWord: 3 epochs instead of 13, 0.27x the time, P@1 within
    0.1; docs/notes/tail.md).  On multi-label labels the network carries
    the ranking and the others correct it (WordNetHypernyms: tree 0.3,
    centroids 1), the fused P@k rises less per epoch than the network's
    and stopping on it came 3 epochs early (validation P@k 56.86 against
    56.93), so the network is stopped on its own P@k there, as on data
    with many instances per label.  ``"fused"`` and ``"network"`` are
    kept; the job (:func:`xmc_tf.job.run.build`) raises
    :class:`~xmc_tf.errors.ConfigError` for ``"fused"`` without a weight
    to read, and trains a run under a ``tf.distribute`` strategy on the
    network's monitor when ``"auto"`` chose the fused one.

    Args:
      config: the job config, the scorers' ``enabled`` resolved.
      has_validation: whether the run has a validation split.
      multi_class: whether every training instance has at most one label
        (:func:`xmc_tf.data.is_multi_class`).

    Returns:
      ``(fused, why)``.
    """
    value = config.train.get("monitor", "auto")
    if value in ("network", "fused"):
        return value == "fused", f"config.train.monitor={value!r}"
    if not has_validation:
        return False, "no validation split"
    if not multi_class:
        return False, ("multi-label training labels: the network carries "
                       "the ranking")
    for kind in xscorers.kinds():
        if (kind.few_shot and kind.enabled(config) is True
                and kind.weight(config) is None):
            return True, (f"config.{kind.section} is on with its weight read "
                          "on validation: the fused model is exported")
    return False, "no few-shot scorer's weight is read on validation"


#: Automatic fields other than the regime's, in the order they are
#: resolved: dotted name -> ``(config, summary, head, has_validation) ->
#: (value, why)`` (:func:`automatic`).
_RESOLVERS: dict = {}


def automatic(field: str):
    """Registers the function that resolves the automatic field ``field``
    (spelled ``"auto"`` in configs) from the data; :func:`resolve_config`
    calls it when the run's config holds ``"auto"`` there.

    The function takes ``(config, summary, head, has_validation)`` -- the
    config with the earlier fields resolved, the :class:`DataSummary`, the
    config's :class:`~xmc_tf.job.heads.Head` and whether the run has a
    validation split -- and returns ``(value, why)``, ``why`` one line for
    the log.
    """
    def register(fn):
        _RESOLVERS[field] = fn
        return fn
    return register


def automatic_fields() -> tuple[str, ...]:
    """The fields registered with :func:`automatic`, in resolution order
    (the regime's fields, :data:`xmc_tf.config.REGIME_FIELDS`, come
    first)."""
    return tuple(_RESOLVERS)


def is_auto(value) -> bool:
    """Whether a config value means "resolve from the data": ``"auto"``
    (any case) or, in the typed fields of :func:`xmc_tf.config.by_regime`,
    None."""
    return value is None or (isinstance(value, str)
                             and value.strip().lower() == AUTO)


def _field(config, dotted: str):
    node = config
    *parents, name = dotted.split(".")
    for part in parents:
        if part not in node:
            return None, None
        node = node[part]
    return (node, name) if name in node else (None, None)


@automatic("data.normalize")
def _normalize(config, summary, head, has_validation):
    if not summary.sparse:
        return "none", "dense features are used as they are"
    if summary.whole_features:
        return "tfidf", "the training features are whole numbers (counts)"
    return "l2", "the training features are weights (tf-idf)"


@automatic("loss")
def _loss(config, summary, head, has_validation):
    loss = "softmax" if summary.multi_class else "squared_hinge"
    return loss, f"{summary.regime} training labels"


@automatic("sampler.shared")
def _shared(config, summary, head, has_validation):
    from xmc_tf.job.samplers import shared_kinds
    shared = summary.multi_class and config.sampler.kind in shared_kinds()
    return bool(shared), (f"{summary.regime} training labels, sampler "
                          f"{config.sampler.kind!r}")


@automatic("sampler.index")
def _index(config, summary, head, has_validation):
    from xmc_tf.samplers.ann import auto_index_kind
    kind = auto_index_kind(summary.num_labels)
    return kind, f"{summary.num_labels} labels"


@automatic("sampler.K")
def _lsh_k(config, summary, head, has_validation):
    from xmc_tf.job.samplers import sampler_config_K
    k = sampler_config_K(config.sampler, summary.num_labels)
    return k, f"{summary.num_labels} labels, hash {config.sampler.hash!r}"


def _scorer_resolver(kind):
    def resolve(config, summary, head, has_validation):
        return kind.plan(config, head, summary, has_validation)
    return resolve


for _kind in xscorers.kinds():
    automatic(f"{_kind.section}.enabled")(_scorer_resolver(_kind))
    for _name, _resolve in _kind.resolvers().items():
        automatic(f"{_kind.section}.{_name}")(_resolve)


@automatic("shortlist.enabled")
def _shortlist(config, summary, head, has_validation):
    del head, has_validation
    return shortlist_plan(config, summary)


@automatic("train.monitor")
def _monitor(config, summary, head, has_validation):
    del head
    fused, why = monitor_plan(config, has_validation, summary.multi_class)
    return ("fused" if fused else "network"), why


def _resolve_regime(config, summary) -> tuple:
    """The regime fields (:func:`xmc_tf.config.by_regime`) filled in."""
    if not xconfig.unresolved_fields(config):
        return config, {}
    values = xconfig.regime_values(config, summary.multi_class)
    for field, value in values.items():
        logging.info("config.%s=%r: chosen for %s training labels (left to "
                     "the data's regime; docs/notes/defaults.md)", field, value,
                     summary.regime)
    return xconfig.resolve_regime(config, summary.multi_class), values


def batch_cap(config, num_labels: int, head=None) -> int | None:
    """The batch size ``config.train.batch_scores_mib`` allows, or None.

    For heads that score every label in training (a ``[batch, num_labels]``
    float32 score matrix, and as many for the loss signal and the
    gradient), the largest batch whose scores take at most
    ``batch_scores_mib`` MiB (at least 1), when ``config.train.batch_size``
    is larger; None when it fits, when the field is None, or for heads that
    score a few labels per instance (sampled, MACH, SCENT).

    Args:
      config: the job config.
      num_labels: ``m``.
      head: the config's :class:`~xmc_tf.job.heads.Head` (None: made from
        the config).

    Returns:
      int or None.
    """
    mib = config.train.get("batch_scores_mib")
    if mib is None:
        return None
    if not (head or xheads.get_head(config)).full_scores_in_training:
        return None
    cap = max(1, int(mib) * 2**20 // (4 * max(1, int(num_labels))))
    return cap if int(config.train.batch_size) > cap else None


def resolve_config(config, train: xdata.XCDataset,
                   validation: xdata.XCDataset | None = None,
                   summary: DataSummary | None = None, head=None):
    """The one resolver of automatic settings: the run's config with every
    field left to the data filled in, one log line per field.

    First the fields left to the label regime (:func:`xmc_tf.config.by_regime`),
    then each ``"auto"`` field registered with :func:`automatic`
    (:func:`automatic_fields`), then the batch cap (``batch_cap``).  The
    fused scorers' ``weight`` and ``idf`` are the only ``"auto"`` left (read
    on validation after training, :func:`xmc_tf.job.finalize.finalize`).
    Values the config sets are kept; one of
    :data:`xmc_tf.config.AUTO_BOOL_FIELDS` given as a string (``"True"``
    from the command line) becomes the bool.

    Args:
      config: the job config (checked by :func:`~xmc_tf.job.checks.check`).
      train: the raw training set.
      validation: the validation set the caller gives, or None (the run
        splits ``config.data.validation_fraction`` of ``train``).
      summary: ``train``'s :class:`DataSummary` when the caller has it
        (:func:`summarize` reads every feature value).
      head: the :class:`~xmc_tf.job.heads.Head` that
        :func:`xmc_tf.job.checks.check_config` returned for ``config``
        (None: made from the config); the resolvers
        read it bound to the config resolved so far.

    Returns:
      ``(run_config, resolved)``: the config the run trains with (``config``
      itself when nothing is automatic) and ``{"labels": "multi-class" |
      "multi-label", "fields": {field: value}}`` (JSON values; ``{}`` when
      nothing is automatic), which the checkpoint and ``metrics.json``
      keep.
    """
    summary = summary or summarize(train)
    run, values = _resolve_regime(config, summary)
    run = _CopyOnWrite(run, copied=run is not config)
    has_validation = validation is not None or bool(
        validation_rows(run.config, summary.num_instances))
    for field, resolve in _RESOLVERS.items():
        node, name = _field(run.config, field)
        if node is None or not is_auto(node[name]):
            continue
        head = head or xheads.get_head(run.config)
        value, why = resolve(run.writable(), summary,
                             head.bound_to(run.config), has_validation)
        run.set(field, value)
        values[field] = value
        logging.info("config.%s=%r: chosen from the data (%s)", field, value,
                     why)
    for field in xconfig.AUTO_BOOL_FIELDS:  # "True" from the command line
        node, name = _field(run.config, field)
        if node is not None and isinstance(node[name], str) and not is_auto(
                node[name]):
            run.set(field, auto_bool(node[name], f"config.{field}"))
    _cap_batch(run, summary, head, values)
    if not values:
        return run.config, {}  # config itself unless a bool string was read
    return run.config, {"labels": summary.regime, "fields": json.loads(
        json.dumps(values, sort_keys=True))}


class _CopyOnWrite:
    """A config and a deep copy of it made at the first write (so that
    :func:`resolve_config` returns the given config itself when nothing
    changes)."""

    def __init__(self, config, copied: bool = False):
        self.config, self._copied = config, copied

    def writable(self):
        """The config, copied first if it is still the caller's."""
        if not self._copied:
            self.config, self._copied = copy.deepcopy(self.config), True
        return self.config

    def set(self, field: str, value) -> None:
        """Sets the dotted ``field`` (which the config has)."""
        node, name = _field(self.writable(), field)
        node[name] = value


def _cap_batch(run: _CopyOnWrite, summary, head, values: dict) -> None:
    """Cuts ``train.batch_size`` to :func:`batch_cap` (logged, recorded in
    ``values``) when the scores of a batch would exceed the cap."""
    config = run.config
    cap = batch_cap(config, summary.num_labels, head)
    if cap is None:
        return
    logging.info(
        "config.train.batch_size=%d: cut from %d so that a batch's "
        "[batch, %d] float32 scores stay under "
        "config.train.batch_scores_mib=%d MiB", cap, config.train.batch_size,
        summary.num_labels, config.train.batch_scores_mib)
    run.set("train.batch_size", cap)
    values["train.batch_size"] = cap
