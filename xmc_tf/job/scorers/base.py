"""The fused scorers of the job: the registry, and what each kind declares.

A *fused scorer* is a label scorer the job fits on the fit split and adds
to the trained network's scores with a weight (``network + weight *
scorer``; :class:`xmc_tf.layers.FusedScores`): the label tree, the label
centroids, the neighbour votes.  Each kind is one module of this package
with a :class:`FusedScorer` subclass registered by :func:`register`; it
declares

* its config section (``section``; the fields are in :mod:`xmc_tf.config`)
  and checks it (:meth:`FusedScorer.check`);
* its plan rule: whether ``enabled="auto"`` turns it on for this data, and
  why (:meth:`FusedScorer.plan`, resolved by :mod:`xmc_tf.job.plan` like
  the other automatic fields);
* how it builds its layers from the fit split
  (:meth:`FusedScorer.build` -> :class:`BuiltScorer`: one
  :class:`Variant` per layer it may be fused as, e.g. the plain and the idf
  centroids);
* its weight grid (:meth:`FusedScorer.grid`) and whether it shortlists.

The plan, the finalize phase and the fused monitor ask only this registry
(:func:`kinds`); registration order is fusion order (tree, centroids,
votes: ``xmc_tf/job/scorers/__init__.py``).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from xmc_tf.config import AUTO, auto_bool
from xmc_tf.shortlist.fusion import FusionPart

__all__ = ["Variant", "BuiltScorer", "FusedScorer", "register", "kinds",
           "get", "fusion_weight", "few_shot_limits", "shortlist_plan"]


def fusion_weight(value, field: str):
    """A fusion weight field (``config.tree.weight``...) as a float >= 0,
    or None (``"auto"``: read on validation); strings from the command
    line are read as numbers.

    Raises:
      ValueError: anything else (the message names ``field``).

    >>> fusion_weight("auto", "w"), fusion_weight("0.3", "w")
    (None, 0.3)
    """
    if isinstance(value, str) and value.strip().lower() == AUTO:
        return None
    try:
        weight = float(value)
    except (TypeError, ValueError):
        weight = float("nan")
    if isinstance(value, bool) or not weight >= 0:
        raise ValueError(f"{field}={value!r} must be 'auto' or a number >= 0")
    return weight


def few_shot_limits(section, summary, name: str, label_cap: bool = True):
    """The conditions the few-shot scorers (the centroids, the votes) share:
    at most ``max_labels`` labels (unless not ``label_cap``) and a median
    label of at most ``max_median_instances`` training instances.

    Returns:
      ``(False, why)`` where one fails, else ``(True, why)``.
    """
    if label_cap and summary.num_labels > section.max_labels:
        return False, (f"{summary.num_labels} labels > "
                       f"config.{name}.max_labels={section.max_labels}")
    median = summary.label_instances_median
    if median > section.max_median_instances:
        return False, (f"the median label has {median:g} training "
                       f"instances > config.{name}.max_median_instances="
                       f"{section.max_median_instances}")
    return True, (f"sparse input, the median label has {median:g} training "
                  f"instances <= {section.max_median_instances}")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One layer a kind may be fused as.

    Attributes:
      name: the layer's name, unique in the fused model (e.g.
        ``"label_centroids"``, ``"idf_centroids"``).
      layer: the scorer layer on the normalised features.
      idf: None, or whether the rows are weighted by the idf once more.
    """

    name: str
    layer: object
    idf: bool | None = None


@dataclasses.dataclass
class BuiltScorer:
    """A kind's layers, built from the fit split, and how they are fused.

    Attributes:
      kind: the :class:`FusedScorer`.
      variants: the :class:`Variant` s (at least one).
      weight: the config's fixed weight, or None (read on validation).
      grid: the weights tried when it is read.
      shortlist: labels per instance it shortlists (0: it only re-ranks).
      info: what ``metrics.json`` keeps of it (sizes, seconds).
    """

    kind: "FusedScorer"
    variants: tuple
    weight: float | None
    grid: tuple
    shortlist: int = 0
    info: dict = dataclasses.field(default_factory=dict)

    def part(self) -> FusionPart:
        """The :class:`xmc_tf.shortlist.fusion.FusionPart` of this scorer."""
        return FusionPart(self.kind.part, tuple(v.name for v in self.variants),
                          tuple(self.grid), self.weight)

    def variant(self, name: str) -> Variant:
        """The variant named ``name``."""
        return next(v for v in self.variants if v.name == name)


def shortlist_plan(config, summary) -> tuple[bool, str]:
    """Whether the fused model ranks shortlists
    (:class:`xmc_tf.layers.FusedScores`), and why:
    ``config.shortlist.enabled="auto"`` turns it on above
    ``config.shortlist.min_labels`` labels (below, scoring every label
    exactly costs about as much)."""
    sc = config.get("shortlist")
    enabled = (auto_bool(sc.enabled, "config.shortlist.enabled")
               if sc is not None else False)
    if enabled is not None:
        return enabled, f"config.shortlist.enabled={enabled}"
    if summary.num_labels <= sc.min_labels:
        return False, (f"{summary.num_labels} labels <= "
                       f"config.shortlist.min_labels={sc.min_labels}: every "
                       "label is scored")
    return True, (f"{summary.num_labels} labels > config.shortlist.min_labels"
                  f"={sc.min_labels}")


class FusedScorer:
    """A kind of fused scorer (subclass per kind, :func:`register`).

    Its class attributes: ``section``, the config section
    (``config.<section>``); ``part``, its name in ``metrics.json`` and
    among the fusion parts; ``what``, how the log names it; ``few_shot``,
    whether it carries labels with a few instances (the fused monitor
    follows the fused model when such a scorer's weight is read on
    multi-class data: :func:`xmc_tf.job.plan.monitor_plan`).
    """

    section: ClassVar[str] = ""
    part: ClassVar[str] = ""
    what: ClassVar[str] = ""
    few_shot: ClassVar[bool] = False

    def config(self, config):
        """``config.<section>``, or None when the config has none."""
        return config.get(self.section)

    def enabled(self, config):
        """``enabled`` as True, False or None (``"auto"``)."""
        sc = self.config(config)
        if sc is None:
            return False
        return auto_bool(sc.enabled, f"config.{self.section}.enabled")

    def weight(self, config):
        """The fixed weight, or None (``"auto"``)."""
        return fusion_weight(self.config(config).weight,
                             f"config.{self.section}.weight")

    def check(self, config, head) -> None:
        """Validates ``config.<section>`` (ValueError naming the field):
        switched on, the head must score every label, and an automatic
        weight needs a validation split; subclasses check their fields."""
        if self.config(config) is None:
            return
        enabled, weight = self.enabled(config), self.weight(config)
        if enabled is True and not head.scores_every_label:
            raise ValueError(f"config.{self.section}.enabled=True needs a head "
                             "that scores every label; head "
                             f"{head.name!r} does not")
        if (enabled is True and weight is None
                and not config.data.validation_fraction):
            raise ValueError(
                f"config.{self.section}.weight='auto' is read on the "
                "validation split: set config.data.validation_fraction > 0 "
                f"or a number for config.{self.section}.weight")

    def plan(self, config, head, summary, has_validation: bool):
        """Whether ``enabled="auto"`` turns the scorer on, and why:
        ``(enabled, one log line)``.  The base rule: off when the config
        says so, for dense features and for heads that do not score every
        label; on when the config says so; off without a validation split
        to read an automatic weight on; else :meth:`plan_data`."""
        enabled = self.enabled(config)
        if enabled is False:
            return False, f"config.{self.section}.enabled=False"
        if not summary.sparse:
            return False, "dense input features"
        if not head.scores_every_label:
            return False, f"head {head.name!r} does not score every label"
        if enabled is True:
            return True, f"config.{self.section}.enabled=True"
        if not has_validation and self.weight(config) is None:
            return False, "no validation split to read its weight on"
        return self.plan_data(self.config(config), summary,
                              shortlist_plan(config, summary)[0])

    def plan_data(self, section, summary, shortlists: bool):
        """The kind's own rule on the :class:`~xmc_tf.job.plan.DataSummary`:
        ``(enabled, why)``; ``shortlists``: whether the fused model ranks
        shortlists (:func:`shortlist_plan`), so that no part scores every
        label outside the exact ``score_all_labels``."""
        raise NotImplementedError

    def resolvers(self) -> dict:
        """The kind's automatic fields besides ``enabled``: ``{field:
        (config, summary, head, has_validation) -> (value, why)}`` (as
        :func:`xmc_tf.job.plan.automatic` takes them), resolved after
        ``enabled``."""
        return {}

    def grid(self, multi_class: bool) -> tuple:
        """The weights tried when the weight is read (0 first)."""
        raise NotImplementedError

    def build(self, config, wd, fit_data, multi_class: bool) -> BuiltScorer:
        """The kind's layers from the (normalised) fit split, with
        ``wd`` (:class:`~xmc_tf.job.workdir.Workdir`) for what a resumed run
        reloads."""
        raise NotImplementedError


_KINDS: dict = {}


def register(cls):
    """Registers a :class:`FusedScorer` subclass (an instance of it) under
    its ``section``; the order of registration is the fusion order."""
    _KINDS[cls.section] = cls()
    return cls


def kinds() -> tuple:
    """The registered kinds, in fusion order."""
    return tuple(_KINDS.values())


def get(section: str) -> FusedScorer:
    """The kind of ``config.<section>``.

    Raises:
      KeyError: no kind has that section.
    """
    return _KINDS[section]
