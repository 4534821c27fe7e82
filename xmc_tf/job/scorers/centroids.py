"""The label centroids as a fused scorer (``config.centroids``): each
label's normalised PIFA row of the fit split, scored as a nearest-centroid
classifier (:func:`xmc_tf.layers.label_centroids`), for labels with a few
instances.

Sources: PIFA (Prabhu et al., Parabel, WWW 2018; Yu et al., PECOS, JMLR
2022); nearest-centroid few-shot classifiers (Snell et al., Prototypical
Networks, NeurIPS 2017).
"""

from __future__ import annotations

import time

from xmc_tf.job.scorers.base import (BuiltScorer, FusedScorer, few_shot_limits,
                                     register)
from xmc_tf.job.scorers.idf import idf_variants, variants
from xmc_tf.layers import label_centroids
from xmc_tf.config import auto_bool, check_int, check_nonnegative

__all__ = ["CentroidScorer", "WEIGHTS"]

#: The weights tried (0: the model alone).  The centroid scores are
#: cosines in [-1, 1]; a network's scores are logits (softmax, SCENT) or
#: margins near [-1, 1] (squared hinge), hence the wide range.
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0,
           256.0)


@register
class CentroidScorer(FusedScorer):
    """``config.centroids``: on for sparse input, a head that scores every
    label, a validation split to read their weight on and few-shot
    training labels (the median label has at most
    ``max_median_instances`` training instances: there a label's centroid
    is its instances, which the network's head learns slowly;
    docs/notes/tail.md), for at most ``max_labels`` labels and while the
    PIFA aggregate (about ``label_nnz x`` stored features per instance
    entries) stays under ``max_entries``."""

    section = "centroids"
    part = "centroids"
    what = "label centroids"
    few_shot = True

    def check(self, config, head) -> None:
        cc = self.config(config)
        if cc is None:
            return
        auto_bool(cc.get("idf", "auto"), "config.centroids.idf")
        check_int("centroids.connections", cc.connections, 1)
        check_nonnegative("centroids.max_median_instances",
                          cc.max_median_instances)
        check_int("centroids.max_entries", cc.max_entries, 0)
        check_int("centroids.max_labels", cc.max_labels, 1)
        super().check(config, head)

    def plan_data(self, section, summary, shortlists):
        del shortlists  # not measured above max_labels; the cap stays
        on, why = few_shot_limits(section, summary, self.section)
        if not on:
            return on, why
        entries = summary.label_nnz * (summary.feature_nnz
                                       / max(summary.num_instances, 1))
        if entries > section.max_entries:
            return False, (f"the label aggregate would hold ~{entries:.3g} "
                           "entries > config.centroids.max_entries="
                           f"{section.max_entries}")
        return True, why

    def grid(self, multi_class: bool) -> tuple:
        return WEIGHTS

    def build(self, config, wd, fit_data, multi_class: bool) -> BuiltScorer:
        cc = self.config(config)
        start = time.time()
        fan_in = min(int(cc.connections), fit_data.num_features)
        weight = self.weight(config)

        def build(rows, name):
            return label_centroids(rows, fit_data.labels, fan_in,
                                   seed=config.seed, name=name)
        built = variants(fit_data, build, ("label_centroids", "idf_centroids"),
                         idf_variants(cc, "centroids", weight))
        info = {"connections": fan_in, "bytes": 8 * fit_data.num_labels * fan_in,
                "build_seconds": round(time.time() - start, 2)}
        return BuiltScorer(self, built, weight, WEIGHTS, info=info)
