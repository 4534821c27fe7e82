"""The idf variant shared by the centroids and the votes: the scorer built
on the fit split's rows weighted by the idf once more, behind a
:class:`~xmc_tf.layers.FeatureNormalization` (``"tfidf"``) that weights the
inputs the same way, so the rare features a few-shot label is recognised
by weigh more."""

from __future__ import annotations

from xmc_tf import data as xdata
from xmc_tf.job.scorers.base import Variant
from xmc_tf.layers import FeatureNormalization, NormalizedScorer
from xmc_tf.config import auto_bool

__all__ = ["variants", "idf_variants"]


def idf_variants(section, field: str, weight) -> tuple:
    """The idf variants to build: ``(False, True)`` for ``idf="auto"`` with
    the weight read on validation, else the one the config names (the
    plain one for "auto" at a fixed weight)."""
    idf = auto_bool(section.get("idf", "auto"), f"config.{field}.idf")
    if idf is None:
        return (False, True) if weight is None else (False,)
    return (bool(idf),)


def variants(fit_data, build, names: tuple, kinds: tuple) -> tuple:
    """One :class:`~xmc_tf.job.scorers.base.Variant` per idf flag of
    ``kinds``: ``build(rows, name)`` makes the scorer of the fit split's
    rows (the plain variant, named ``names[0]``) or of the rows weighted by
    the idf once more (wrapped in a
    :class:`~xmc_tf.layers.NormalizedScorer` named ``names[1]``, its
    normalisation ``"<names[1]>_normalization"``)."""
    out = []
    for idf in kinds:
        if not idf:
            out.append(Variant(names[0], build(fit_data.features, names[0]),
                               False))
            continue
        weighted, idf_values = xdata.normalize_features(fit_data.features,
                                                        "tfidf")
        inner = build(weighted, f"{names[1]}_scorer")
        norm = FeatureNormalization(fit_data.num_features, "tfidf",
                                    idf=idf_values,
                                    name=f"{names[1]}_normalization")
        out.append(Variant(names[1], NormalizedScorer(inner, norm,
                                                      name=names[1]), True))
    return tuple(out)
