"""The nearest-neighbour votes as a fused scorer (``config.neighbours``):
the ``k`` most similar training instances of the fit split vote for their
labels (:class:`xmc_tf.layers.NearestNeighbourScores`), for labels with a
few instances; their most voted labels join the shortlist.

Sources: the kNN classifier of extreme classification (SiameseXML, Dahiya
et al. ICML 2021, Sec. 3: kNN shortlists), similarity-weighted voting
(Dudani, IEEE SMC 1976).
"""

from __future__ import annotations

import time

import scipy.sparse as sp

from xmc_tf.job.scorers.base import (BuiltScorer, FusedScorer, few_shot_limits,
                                     register)
from xmc_tf.job.scorers.idf import idf_variants, variants
from xmc_tf.layers import NearestNeighbourScores
from xmc_tf.config import auto_bool, check_int, check_nonnegative

__all__ = ["NeighbourScorer", "WEIGHTS"]

#: The weights tried (0: the model alone); a vote sums up to
#: ``config.neighbours.k`` squared cosines.
WEIGHTS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0,
           256.0)


@register
class NeighbourScorer(FusedScorer):
    """``config.neighbours``: on under the centroids' conditions (sparse
    input, a head that scores every label, a validation split to read the
    weight on, few-shot labels: median instances per label at most
    ``max_median_instances``, at most ``max_labels`` labels unless the
    fused model ranks shortlists: the votes then shortlist, and neither
    their weight's reading nor serving scores every label) while an
    instance's features meet at most ``max_postings`` stored training
    entries on average (the cost per query: ``postings_per_instance`` of
    :class:`~xmc_tf.job.plan.DataSummary`)."""

    section = "neighbours"
    part = "neighbours"
    what = "neighbour votes"
    few_shot = True

    def check(self, config, head) -> None:
        nc = self.config(config)
        if nc is None:
            return
        auto_bool(nc.idf, "config.neighbours.idf")
        check_int("neighbours.k", nc.k, 1)
        check_nonnegative("neighbours.power", nc.power)
        check_nonnegative("neighbours.max_median_instances",
                          nc.max_median_instances)
        check_nonnegative("neighbours.max_postings", nc.max_postings)
        check_int("neighbours.max_labels", nc.max_labels, 1)
        check_int("neighbours.shortlist", nc.get("shortlist", 0), 0)
        super().check(config, head)

    def plan_data(self, section, summary, shortlists):
        on, why = few_shot_limits(section, summary, self.section,
                                  label_cap=not shortlists)
        if not on:
            return on, why
        if shortlists and summary.num_labels > section.max_labels:
            why += (f", {summary.num_labels} labels > config.neighbours."
                    "max_labels but shortlisted: no part scores every label")
        postings = summary.postings_per_instance
        if postings > section.max_postings:
            return False, (f"an instance meets ~{postings:.3g} training "
                           "entries > config.neighbours.max_postings="
                           f"{section.max_postings}")
        return True, f"{why}, ~{postings:.3g} entries met per instance"

    def grid(self, multi_class: bool) -> tuple:
        return WEIGHTS

    def build(self, config, wd, fit_data, multi_class: bool) -> BuiltScorer:
        nc = self.config(config)
        start = time.time()
        weight = self.weight(config)

        def build(rows, name):
            return NearestNeighbourScores.from_data(
                rows, fit_data.labels, neighbours=int(nc.k),
                power=float(nc.power), name=name)
        built = variants(fit_data, build,
                         ("label_neighbours", "idf_neighbours"),
                         idf_variants(nc, "neighbours", weight))
        x = sp.csr_matrix(fit_data.features)
        info = {"k": int(nc.k), "power": float(nc.power),
                "bytes": int(8 * (fit_data.num_features + x.shape[0])
                             + 8 * x.nnz + 4 * fit_data.labels.nnz),
                "build_seconds": round(time.time() - start, 2)}
        return BuiltScorer(self, built, weight, WEIGHTS,
                           shortlist=int(nc.get("shortlist", 0)), info=info)
