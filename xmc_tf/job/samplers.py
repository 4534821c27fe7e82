"""``config.sampler`` -> a negative sampler: the job's sampler adapters.

The library's samplers (:mod:`xmc_tf.samplers`) take plain arguments; this
module is where the job's config meets them.  Every sampler kind registers
an adapter (a factory) that makes its
:class:`~xmc_tf.samplers.NegativeSampler` from ``(config.sampler,
num_labels, seed, shared)`` with :func:`register_sampler`, together with
what the head needs to know about it: whether it has a shared-candidates
mode, which optional modules it needs (checked before any work), and the
callbacks that keep it up to date with the head's weights.  The sampled head
(:mod:`xmc_tf.job.heads.sampled`) asks only this registry, so a new sampler
is its class plus one adapter registered here or in a module imported before
the config is checked.

Built-in kinds: ``"uniform"``
(:class:`~xmc_tf.samplers.UniformNegativeSampler`), ``"in_batch"``
(:class:`~xmc_tf.samplers.InBatchSampler`), ``"ann"``
(:class:`~xmc_tf.samplers.AnnNegativeSampler`), ``"mixture"``
(:class:`~xmc_tf.samplers.MixtureSampler` of the ANN and uniform samplers,
ASTRA), ``"lsh"`` (:class:`~xmc_tf.samplers.LshNegativeSampler`, shared: a
mixture whose pool the LSH tables retrieve).

Example:
    >>> import ml_collections
    >>> sc = ml_collections.ConfigDict(dict(kind="uniform", num_negatives=8))
    >>> make_sampler(sc, 100, seed=0)
    UniformNegativeSampler(num_labels=100, num_candidates=8, seed=0)
    >>> {"uniform", "in_batch", "ann", "mixture", "lsh"} <= set(kinds())
    True
"""

from __future__ import annotations

import dataclasses
import importlib.util
from typing import Callable

from xmc_tf.config import auto_bool
from xmc_tf.samplers import (AnnNegativeSampler, InBatchSampler,
                             LshNegativeSampler, MixtureSampler,
                             UniformNegativeSampler, lsh_auto_K)
from xmc_tf.samplers.ann import FAISS

__all__ = ["SamplerKind", "index_refresh_callbacks", "kinds", "make_sampler",
           "register_sampler", "sampler_config_K", "sampler_kind",
           "sampler_sizes", "shared_kinds", "shared_pool_options",
           "shared_setting"]

def shared_setting(value):
    """``config.sampler.shared`` as True, False or None (``"auto"``)
    (:func:`auto_bool`).

    Raises:
      ValueError: any other value.

    >>> shared_setting("auto"), shared_setting("True"), shared_setting(False)
    (None, True, False)
    """
    return auto_bool(value, "config.sampler.shared")


def sampler_sizes(sampler_config, num_labels: int) -> dict:
    """Candidates per row of a sampler config, capped relative to m.

    With ``sampler_config.max_fraction = f`` in (0, 1] the candidates a row
    scores besides its positives are at most ``cap = max(1, floor(f m))``:
    ``num_negatives`` becomes ``min(num_negatives, cap)``, and when ``k_h +
    k_r > cap`` the mixture's two parts shrink in proportion (``k_h =
    max(1, round(k_h cap / (k_h + k_r)))`` if it was > 0, ``k_r = max(1,
    cap - k_h)``).  Without it (absent, 0 or None) the sizes are taken as
    given.  So one config keeps its absolute sizes on large label spaces
    (m = 50k: 256 of 50k labels) and does not score more than f of the
    labels on small ones (Bibtex, m = 159: 256 negatives drawn with
    replacement would score every label more than once).

    Args:
      sampler_config: ``config.sampler``.
      num_labels: m (>= 1).

    Returns:
      ``{"num_negatives": k, "num_hard": k_h, "num_uniform": k_r}`` (ints;
      ``num_hard``/``num_uniform`` 0 when the config has none).

    Raises:
      ValueError: ``max_fraction`` outside (0, 1], or a size < 0.

    >>> import ml_collections
    >>> sc = ml_collections.ConfigDict(dict(num_negatives=256, num_hard=32,
    ...                                     num_uniform=256, max_fraction=0.25))
    >>> sampler_sizes(sc, 159)
    {'num_negatives': 39, 'num_hard': 4, 'num_uniform': 35}
    >>> sampler_sizes(sc, 50_000)
    {'num_negatives': 256, 'num_hard': 32, 'num_uniform': 256}
    """
    sc = sampler_config
    k = int(sc.get("num_negatives", 0) or 0)
    k_h = int(sc.get("num_hard", 0) or 0)
    k_r = int(sc.get("num_uniform", 0) or 0)
    if min(k, k_h, k_r) < 0:
        raise ValueError("config.sampler sizes must be >= 0, got "
                         f"num_negatives={k}, num_hard={k_h}, num_uniform={k_r}")
    frac = sc.get("max_fraction", None)
    if frac:
        frac = float(frac)
        if not 0.0 < frac <= 1.0:
            raise ValueError(f"config.sampler.max_fraction={frac!r} must be "
                             "in (0, 1]")
        cap = max(1, int(frac * int(num_labels)))
        k = min(k, cap)
        if k_h + k_r > cap:
            total = k_h + k_r
            k_h = max(1, round(k_h * cap / total)) if k_h else 0
            k_r = max(1, cap - k_h)
    return {"num_negatives": k, "num_hard": k_h, "num_uniform": k_r}


def index_refresh_callbacks(sampler, sampler_config, set_callback=None):
    """The default refresh callbacks of a sampler kind.

    A sampler that ``needs_refresh`` (an ANN index over the head's label
    vectors) is rebuilt by :class:`xmc_tf.callbacks.RefreshIndex` on
    ASTRA's schedule: from epoch ``sampler_config.refresh_start_epoch``
    (tau_s) every ``refresh_every_epochs`` epochs (tau_r) and/or every
    ``refresh_every_steps`` steps, and after every SET rewiring of
    ``set_callback``; any other sampler needs none.

    Args:
      sampler: the bound :class:`~xmc_tf.samplers.NegativeSampler`.
      sampler_config: ``config.sampler``.
      set_callback: the head's :class:`xmc_tf.callbacks.SetRewiring` or
        None.

    Returns:
      list of ``keras.callbacks.Callback``.
    """
    if not sampler.needs_refresh:
        return []
    from xmc_tf.callbacks import RefreshIndex
    sc = sampler_config
    return [RefreshIndex(sampler, start_epoch=sc.refresh_start_epoch,
                         every_n_epochs=sc.refresh_every_epochs or None,
                         every_n_steps=sc.refresh_every_steps or None,
                         after_rewire=set_callback)]


@dataclasses.dataclass(frozen=True)
class SamplerKind:
    """A registered ``config.sampler.kind``.

    Attributes:
      name: the ``config.sampler.kind`` value.
      factory: ``(sampler_config, num_labels, seed, shared) ->`` unbound
        :class:`~xmc_tf.samplers.NegativeSampler` (``shared``: bool, the
        batch shares one candidate set).
      shared: whether the kind has a shared-candidates mode
        (``config.sampler.shared``).
      requires: ``{module: install hint}`` of optional modules the kind
        needs; the head rejects the config before any work without them.
      refresh_callbacks: ``(sampler, sampler_config, set_callback) ->``
        list of callbacks that keep the sampler up to date (default
        :func:`index_refresh_callbacks`).
    """

    name: str
    factory: Callable
    shared: bool = False
    requires: dict = dataclasses.field(default_factory=dict)
    refresh_callbacks: Callable = index_refresh_callbacks

    def missing(self) -> list[str]:
        """The required modules that are not installed."""
        return [m for m in self.requires if importlib.util.find_spec(m) is None]


_KINDS: dict[str, SamplerKind] = {}


def register_sampler(name: str, *, shared: bool = False, requires=None,
                     refresh_callbacks: Callable | None = None):
    """Decorator registering a sampler factory under ``config.sampler.kind
    = name`` (see :class:`SamplerKind` for the arguments).

    Returns:
      The decorator; it returns the factory unchanged.

    Raises:
      ValueError: ``name`` is empty or already registered to another
        factory.
    """
    def decorator(factory):
        if not name:
            raise ValueError("a sampler kind needs a name")
        old = _KINDS.get(name)
        if old is not None and old.factory is not factory:
            raise ValueError(f"sampler kind {name!r} is already registered "
                             f"({old.factory.__qualname__})")
        _KINDS[name] = SamplerKind(
            name, factory, shared=bool(shared), requires=dict(requires or {}),
            refresh_callbacks=refresh_callbacks or index_refresh_callbacks)
        return factory
    return decorator


def kinds() -> tuple[str, ...]:
    """The registered ``config.sampler.kind`` values."""
    return tuple(_KINDS)


def shared_kinds() -> tuple[str, ...]:
    """The kinds with a shared-candidates mode."""
    return tuple(k for k, v in _KINDS.items() if v.shared)


def sampler_kind(name: str) -> SamplerKind:
    """The registered :class:`SamplerKind` ``name``.

    Raises:
      ValueError: no kind of that name.
    """
    if name not in _KINDS:
        raise ValueError(f"config.sampler.kind={name!r}; expected one of "
                         f"{kinds()}")
    return _KINDS[name]


def make_sampler(sampler_config, num_labels: int, seed: int,
                 shared: bool | None = None):
    """The :class:`~xmc_tf.samplers.NegativeSampler` a config describes.

    Args:
      sampler_config: ``config.sampler`` (``kind`` and the kind's fields,
        see :mod:`xmc_tf.job.heads.sampled`).
      num_labels: m.
      seed: seed of the draws (and of an index's k-means / projection).
      shared: whether the batch shares one candidate set (None:
        ``sampler_config.shared``, ``"auto"`` read as False).

    Returns:
      The (unbound) sampler.

    Raises:
      ValueError: unknown ``kind`` or bad sizes.
      ImportError: ``"ann"``/``"mixture"`` without faiss installed (at the
        first refresh).
    """
    kind = sampler_kind(sampler_config.kind)
    if shared is None:
        shared = bool(shared_setting(sampler_config.get("shared", False)))
    return kind.factory(sampler_config, int(num_labels), int(seed),
                        bool(shared))


@register_sampler("uniform", shared=True)
def _make_uniform(sampler_config, num_labels, seed, shared):
    """``config.sampler.kind = "uniform"``: ``num_negatives`` uniform draws
    per row (or per batch, shared)."""
    del shared  # the same sampler draws both ways
    k = sampler_sizes(sampler_config, num_labels)["num_negatives"]
    return UniformNegativeSampler(num_labels, k, seed=seed)


@register_sampler("in_batch")
def _make_in_batch(sampler_config, num_labels, seed, shared):
    """``config.sampler.kind = "in_batch"``: ``num_negatives`` of the
    batch's other positives per row."""
    del shared
    k = sampler_sizes(sampler_config, num_labels)["num_negatives"]
    return InBatchSampler(num_labels, k, seed=seed)


@register_sampler("ann", requires=FAISS)
def _make_ann(sampler_config, num_labels, seed, shared):
    """``config.sampler.kind = "ann"``: the ``num_negatives`` hardest
    labels of a stale faiss index per row (``index``, ``nprobe``)."""
    del shared
    sc = sampler_config
    k = sampler_sizes(sc, num_labels)["num_negatives"]
    return AnnNegativeSampler(num_labels, k, index=sc.index, nprobe=sc.nprobe,
                              seed=seed)


def shared_pool_options(sampler_config) -> dict:
    """The shared-pool arguments of :class:`MixtureSampler` read from
    ``config.sampler`` (``pool_positives``, ``hard_queries``), for every
    sampler kind built on the mixture ("mixture", "lsh").

    Returns:
      ``{"pool_positives": bool, "hard_queries": int or None}``.
    """
    sc = sampler_config
    return {"pool_positives": bool(sc.get("pool_positives", True)),
            "hard_queries": sc.get("hard_queries", None)}


@register_sampler("mixture", shared=True, requires=FAISS)
def _make_mixture(sampler_config, num_labels, seed, shared):
    """``config.sampler.kind = "mixture"`` (ASTRA): ``num_hard`` ANN hard
    negatives + ``num_uniform`` uniform ones (seed + 1)."""
    del shared  # the same sampler draws both ways
    sc = sampler_config
    sizes = sampler_sizes(sc, num_labels)
    k_h = sizes["num_hard"]
    hard = AnnNegativeSampler(num_labels, max(k_h, 1), index=sc.index,
                              nprobe=sc.nprobe, seed=seed)
    uniform = UniformNegativeSampler(num_labels, sizes["num_uniform"],
                                     seed=seed + 1)
    return MixtureSampler(hard, uniform, k_h=k_h, **shared_pool_options(sc))


def _rehash_callbacks(sampler, sampler_config, set_callback=None):
    """LSH tables follow the weights by :class:`xmc_tf.callbacks.Rehash`
    (LNS's period ``rehash_every_steps``, decay ``rehash_decay``) of the
    LSH sampler (the hard part of a shared mixture)."""
    del set_callback  # Rehash finds rewired rows itself (label_rows)
    from xmc_tf.callbacks import Rehash
    # A field the config lacks: Rehash's own default.
    kwargs = {arg: sampler_config[field] for field, arg in (
        ("rehash_every_steps", "every_n_steps"),
        ("rehash_decay", "frequency_decay")) if field in sampler_config}
    return [Rehash(getattr(sampler, "hard", sampler), **kwargs)]


def _lsh_k(sampler_config, num_labels, shared):
    """Labels per row the LSH tables retrieve for ``config.sampler``:
    ``num_hard`` (at least 1) in shared mode, else ``num_negatives``."""
    sizes = sampler_sizes(sampler_config, num_labels)
    return max(sizes["num_hard"], 1) if shared else sizes["num_negatives"]


def sampler_config_K(sampler_config, num_labels: int) -> int:  # noqa: N802
    """``config.sampler.K`` for ``num_labels`` labels: the value set, or
    (``"auto"`` or 0) :func:`lsh_auto_K` of the candidates per row the
    tables retrieve, ``config.sampler.L`` tables and the hash family, as
    :class:`LshNegativeSampler` computes it with ``K=None``.

    Args:
      sampler_config: ``config.sampler`` (``K``, ``L``, ``hash``,
        ``shared`` resolved to a bool, the sizes of
        :func:`sampler_sizes`).
      num_labels: m.

    Returns:
      int K >= 1.
    """
    sc = sampler_config
    if str(sc.K).strip().lower() not in ("auto", "0"):
        return int(sc.K)
    k = _lsh_k(sc, num_labels, sc.shared is True)
    return lsh_auto_K(num_labels, k, int(sc.L), hash=sc.hash)


@register_sampler("lsh", shared=True, refresh_callbacks=_rehash_callbacks)
def _make_lsh(sampler_config, num_labels, seed, shared):
    """``config.sampler.kind = "lsh"``: per row, ``num_negatives`` labels
    retrieved from the LSH tables (``hash``, ``K`` (``"auto"``:
    :func:`lsh_auto_K`),
    ``L``, ``query``, ``weighting``, ``min_probability``); shared, a
    mixture whose pool the tables retrieve (``num_hard`` per row) plus
    ``num_uniform`` uniform draws (seed + 1)."""
    sc = sampler_config
    sizes = sampler_sizes(sc, num_labels)
    k = _lsh_k(sc, num_labels, shared)
    auto = str(sc.K).strip().lower() in ("auto", "0")
    lsh = LshNegativeSampler(
        num_labels, k, hash=sc.hash, K=None if auto else int(sc.K), L=sc.L,
        query=sc.query, seed=seed,
        weighting=sc.get("weighting", "inverse_probability"),
        min_probability=sc.get("min_probability", None) or None)
    if not shared:
        return lsh
    uniform = UniformNegativeSampler(num_labels, sizes["num_uniform"],
                                     seed=seed + 1)
    return MixtureSampler(lsh, uniform, k_h=sizes["num_hard"],
                          **shared_pool_options(sc))
