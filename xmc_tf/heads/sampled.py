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
layer scores every label (it is decoded by the head of that layer, see
:func:`xmc_tf.heads.head_for_model`), and held-out P@k is computed once per
epoch over all labels by :class:`xmc_tf.callbacks.TopKEvaluation`.

Labels reach the head inside ``fit`` through :class:`SampledTrainer`, a
``keras.Model`` wrapping the functional model with its own ``train_step``
(Keras passes a loss only ``(y_true, y_pred)``, which cannot express
per-instance candidates).

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

import importlib.util

import numpy as np
from absl import logging

import keras
import tensorflow as tf

from xmc_tf import config as xconfig
from xmc_tf.heads.base import OUTPUT_LAYER, Head, output_layer, register
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.losses.sampled import (SampledBinaryCrossEntropy,
                                   SampledSoftmax, SampledSquaredHinge)

__all__ = ["SampledHead", "SampledTrainer", "SAMPLED_LOSSES", "make_sampler",
           "sampler_sizes", "lsh_auto_K", "regime_choices"]

#: ``config.loss`` -> sampled loss class.
SAMPLED_LOSSES = {"squared_hinge": SampledSquaredHinge,
                  "bce": SampledBinaryCrossEntropy,
                  "softmax": SampledSoftmax}

SAMPLED_LAYERS = ("uniform_sparse", "dense")
SAMPLER_KINDS = ("uniform", "in_batch", "ann", "mixture", "lsh")
#: Kinds with a shared-candidates mode (``config.sampler.shared``).
SHARED_KINDS = ("uniform", "mixture", "lsh")
#: ``config.sampler.kind`` values whose sampler keeps a faiss index.
ANN_KINDS = ("ann", "mixture")


#: ``config.loss`` / ``config.sampler.shared`` value read from the data.
AUTO = "auto"


def _shared_setting(value):
    """``config.sampler.shared`` as True, False or None (``"auto"``); the
    command line gives a string field strings (``--config.sampler.shared=
    True`` on a config whose default is ``"auto"``).

    Raises:
      ValueError: any other value.
    """
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text == AUTO:
        return None
    if text in ("true", "1"):
        return True
    if text in ("false", "0", "none", ""):
        return False
    raise ValueError(f"config.sampler.shared={value!r}; expected True, False "
                     f"or {AUTO!r}")


def regime_choices(config, labels) -> dict:
    """The loss and candidate mode of a sampled head, read from the data.

    Multi-class training data (every instance has at most one label) trains
    with the sampled softmax on one candidate set shared by the batch (as
    ``tf.nn.sampled_softmax_loss`` does: the weighted squared hinge of
    ASTRA's Eq. 2 gave P@1 0.03 after an epoch on a 50k-class set, loss
    7,286, the weights ``m / k_r`` being ~200); multi-label data with the
    squared hinge on per-row candidates (Bibtex equal, Delicious val P@1
    70.0 per row vs 67.6 shared: docs/sampled.md).  Only ``"auto"`` values
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
    counts = np.diff(labels.indptr)
    multi_class = bool(counts.size) and int(counts.max()) <= 1
    loss = config.loss
    if loss == AUTO:
        loss = "softmax" if multi_class else "squared_hinge"
    shared = _shared_setting(config.sampler.get("shared", False))
    if shared is None:
        shared = multi_class and config.sampler.kind in SHARED_KINDS
    return {"loss": loss, "shared": bool(shared), "multi_class": multi_class}


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


def lsh_auto_K(num_labels: int, num_candidates: int, L: int) -> int:  # noqa: N802,N803
    """Hash functions per LSH table for ``config.sampler.K = 0``.

    ``K = clip(floor(log2(L m / k)), 1, 16)``: with ``2^K`` buckets per table
    a bucket holds ``m / 2^K`` labels on average, so the ``L`` probed
    buckets hold about ``L m / 2^K >= k`` labels -- enough to fill the ``k``
    candidates, and no more buckets than needed (a larger ``K`` leaves most
    probes empty on a small label space: Bibtex, m = 159, with ``K = 9``
    gave about 13 candidates per row of the 256 asked for; a smaller one
    dilutes the near labels among random ones).  16 is the default
    ``bucket_bits`` of :class:`~xmc_tf.samplers.lsh.LshNegativeSampler`.

    Args:
      num_labels: m.
      num_candidates: k.
      L: tables.

    Returns:
      int K in [1, 16].

    >>> lsh_auto_K(159, 39, 50), lsh_auto_K(50_000, 256, 50)
    (7, 13)
    """
    import math
    ratio = int(L) * int(num_labels) / max(int(num_candidates), 1)
    return int(min(16, max(1, math.floor(math.log2(max(ratio, 2.0))))))


def make_sampler(sampler_config, num_labels: int, seed: int,
                 shared: bool | None = None):
    """The :class:`~xmc_tf.samplers.NegativeSampler` a config describes.

    Args:
      sampler_config: ``config.sampler`` (see the module docstring).
      num_labels: m.
      seed: seed of the draws (and of an index's k-means / projection).
      shared: whether the batch shares one candidate set (None:
        ``sampler_config.shared``, which must then be a bool).

    Returns:
      The (unbound) sampler.

    Raises:
      ValueError: unknown ``kind`` or bad sizes.
      ImportError: ``"ann"``/``"mixture"`` without faiss installed (at the
        first refresh).
    """
    from xmc_tf import samplers
    sc = sampler_config
    kind = sc.kind
    sizes = sampler_sizes(sc, num_labels)
    k = sizes["num_negatives"]
    if kind == "uniform":
        return samplers.UniformNegativeSampler(num_labels, k, seed=seed)
    if kind == "in_batch":
        return samplers.InBatchSampler(num_labels, k, seed=seed)
    if kind == "ann":
        return samplers.AnnNegativeSampler(num_labels, k,
                                           index=sc.index, nprobe=sc.nprobe,
                                           seed=seed)
    if kind == "mixture":
        k_h = sizes["num_hard"]
        hard = samplers.AnnNegativeSampler(num_labels, max(k_h, 1),
                                           index=sc.index, nprobe=sc.nprobe,
                                           seed=seed)
        uniform = samplers.UniformNegativeSampler(
            num_labels, sizes["num_uniform"], seed=seed + 1)
        return samplers.MixtureSampler(
            hard, uniform, k_h=k_h,
            pool_positives=bool(sc.get("pool_positives", True)))
    if kind == "lsh":
        from xmc_tf.samplers.lsh import LshNegativeSampler
        if shared is None:
            shared = bool(_shared_setting(sc.get("shared", False)))
        if shared:  # LSH retrieves the pool of a shared mixture
            k = max(sizes["num_hard"], 1)
        K = int(sc.K) or lsh_auto_K(num_labels, k, int(sc.L))  # noqa: N806
        lsh = LshNegativeSampler(
            num_labels, k, hash=sc.hash, K=K, L=sc.L, query=sc.query,
            seed=seed,
            weighting=sc.get("weighting", "inverse_probability"),
            min_probability=sc.get("min_probability", None) or None)
        if not shared:
            return lsh
        uniform = samplers.UniformNegativeSampler(
            num_labels, sizes["num_uniform"], seed=seed + 1)
        return samplers.MixtureSampler(
            lsh, uniform, k_h=sizes["num_hard"],
            pool_positives=bool(sc.get("pool_positives", True)))
    raise ValueError(f"config.sampler.kind={kind!r}; expected one of "
                     f"{SAMPLER_KINDS}")


@keras.saving.register_keras_serializable(package="xmc_tf")
class SampledTrainer(keras.Model):
    """Trains a model's head on positives + sampled negatives only.

    ``call`` is the wrapped model (full scores: prediction and evaluation
    are exact); ``train_step`` / ``test_step`` run the model up to the head
    layer's input (``queries`` ``[b, e]``), draw candidates with
    ``sampler.sample(queries, label_ids, optimizer.iterations)``, score the
    row's positives and candidates with ``head.score_candidates`` in one op
    call and apply the sampled loss.  Logged: ``loss`` and
    ``sampled_fraction`` (mean number of scored labels per row over
    ``num_labels``).

    Args:
      model: functional ``keras.Model`` whose head layer (named
        ``"output"``) has ``score_candidates(inputs, candidates)``
        (:class:`~xmc_tf.layers.UniformSparseDense`,
        :class:`~xmc_tf.layers.LabelDense`).
      sampler: a :class:`~xmc_tf.samplers.NegativeSampler` (bound to the
        head here).
      loss: a :class:`~xmc_tf.losses.sampled.SampledLoss`.
      shared: draw one candidate set per batch
        (``sampler.sample_shared``) scored by every row with the head
        layer's ``score_shared`` (one matrix product), instead of per-row
        candidates.

    Targets ``y``: int ``[b, n]`` label ids padded with -1 (what
    :func:`xmc_tf.data.make_tf_dataset` yields).

    Raises:
      ValueError: the head layer cannot score candidates, or ``shared``
        with a sampler that has no shared mode.

    Example:
      >>> import keras, xmc_tf
      >>> from xmc_tf.data import make_synthetic, make_tf_dataset
      >>> from xmc_tf.losses import SampledSquaredHinge
      >>> from xmc_tf.samplers import UniformNegativeSampler
      >>> train = make_synthetic(256, 100, 50, labels_per_instance=2, seed=0)
      >>> inputs = keras.Input((100,), sparse=True)
      >>> hidden = keras.layers.Dense(32, activation="relu")(inputs)
      >>> model = keras.Model(inputs, xmc_tf.layers.LabelDense(
      ...     50, name="output")(hidden))
      >>> trainer = SampledTrainer(model, UniformNegativeSampler(50, 8),
      ...                          SampledSquaredHinge())
      >>> trainer.compile(optimizer=xmc_tf.optimizers.LazyAdam(),
      ...                 jit_compile=False)
      >>> history = trainer.fit(make_tf_dataset(train, 64), epochs=2,
      ...                       verbose=0)
      >>> sorted(history.history)
      ['loss', 'sampled_fraction']
      >>> model(next(iter(make_tf_dataset(train, 4)))[0]).shape  # all labels
      TensorShape([4, 50])
    """

    def __init__(self, model, sampler, loss, shared=False, **kwargs):
        super().__init__(**kwargs)
        if shared and not sampler.supports_shared:
            raise ValueError(f"{type(sampler).__name__} has no shared-"
                             "candidates mode (shared=True)")
        self.shared = bool(shared)
        self.inference_model = model
        self.head_layer = output_layer(model)
        if not hasattr(self.head_layer, "score_candidates"):
            raise ValueError(
                f"{type(self.head_layer).__name__} cannot score candidates; "
                "use UniformSparseDense or LabelDense")
        self.body = keras.Model(model.inputs, self.head_layer.input,
                                name=f"{model.name}_body")
        self.sampler = sampler
        self.sampler.bind(self.head_layer)
        self.sampled_loss = loss
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.fraction_tracker = keras.metrics.Mean(name="sampled_fraction")

    @property
    def metrics(self):
        return [self.loss_tracker, self.fraction_tracker]

    def call(self, inputs, training=False):
        return self.inference_model(inputs, training=training)

    def _loss(self, x, y, training):
        y = tf.cast(y, tf.int32)
        if y.shape.rank == 1:
            y = y[:, None]
        queries = self.body(x, training=training)
        draw = self.sampler.sample_shared if self.shared else self.sampler.sample
        candidates = draw(tf.stop_gradient(queries), y,
                          self.optimizer.iterations)
        # The draw and its weights are constants of the loss: no gradient
        # may flow through a sampler's reads of the head (e.g. the LSH
        # inclusion probabilities' arccos of the cosines, infinite at 1).
        candidates = type(candidates)(*[tf.stop_gradient(t)
                                        for t in candidates])
        pos_mask = y >= 0
        if candidates.ids.shape.rank == 1:  # shared by the batch
            pos_scores = self.head_layer.score_candidates(queries,
                                                          tf.maximum(y, 0))
            neg_scores = self.head_layer.score_shared(queries, candidates.ids)
        else:
            scored = tf.concat([tf.maximum(y, 0), candidates.ids], axis=1)
            scores = self.head_layer.score_candidates(queries, scored)
            n = tf.shape(y)[1]
            pos_scores, neg_scores = scores[:, :n], scores[:, n:]
        loss = self.sampled_loss(pos_scores, pos_mask, neg_scores, candidates)
        if self.losses:
            loss = loss + tf.add_n(self.losses)
        scored_per_row = (tf.reduce_sum(tf.cast(pos_mask, tf.float32), 1) +
                          tf.reduce_sum(tf.cast(candidates.mask, tf.float32), 1))
        return loss, scored_per_row / float(self.sampler.num_labels)

    def train_step(self, data):
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            loss, fraction = self._loss(x, y, training=True)
        variables = self.trainable_variables
        grads = tape.gradient(loss, variables)
        self.optimizer.apply(grads, variables)
        self.loss_tracker.update_state(loss)
        self.fraction_tracker.update_state(fraction)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        x, y = data[0], data[1]
        loss, fraction = self._loss(x, y, training=False)
        self.loss_tracker.update_state(loss)
        self.fraction_tracker.update_state(fraction)
        return {m.name: m.result() for m in self.metrics}

    def get_state(self) -> dict:
        """The sampler's state (index, tables) for an exact resume."""
        return self.sampler.get_state()

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`'s result into the sampler."""
        self.sampler.set_state(state)


@register
class SampledHead(Head):
    """``config.model.head = "sampled"``: see the module docstring."""

    name = "sampled"
    config_defaults = xconfig.HEAD_DEFAULTS["sampled"]
    losses = tuple(SAMPLED_LOSSES)
    layer_types = ()  # decoded by the head of its (full-scoring) layer
    full_scores_in_training = False

    def __init__(self, config):
        super().__init__(config)
        self._sampler = None
        self._choices = None

    def check_config(self):
        if self.config.loss != AUTO:
            super().check_config()
        layer = self.config.model.sampled_layer
        if layer not in SAMPLED_LAYERS:
            raise ValueError(f"config.model.sampled_layer={layer!r}; expected "
                             f"one of {SAMPLED_LAYERS}")
        kind = self.config.sampler.kind
        if kind not in SAMPLER_KINDS:
            raise ValueError(f"config.sampler.kind={kind!r}"
                             f"; expected one of {SAMPLER_KINDS}")
        if (_shared_setting(self.config.sampler.get("shared", False))
                and kind not in SHARED_KINDS):
            raise ValueError(f"config.sampler.shared=True needs kind in "
                             f"{SHARED_KINDS}, got {kind!r}")
        if kind in ANN_KINDS and importlib.util.find_spec("faiss") is None:
            # Before any work: without faiss the first index refresh, an
            # epoch in, would fail.
            raise ValueError(f"config.sampler.kind={kind!r} needs faiss, an "
                             "optional dependency: pip install "
                             "'xmc_tf[ann]' (or faiss-cpu)")

    def prepare(self, train_data):
        """Resolves ``"auto"`` loss and candidate mode from the training
        labels (:func:`regime_choices`) and logs the choice."""
        self._choices = regime_choices(self.config, train_data.labels)
        c = self._choices
        if self.config.loss == AUTO or _shared_setting(
                self.config.sampler.get("shared", False)) is None:
            logging.info(
                "sampled head: %s training data -> loss %r, %s candidates "
                "(config.loss=%r, config.sampler.shared=%r)",
                "multi-class" if c["multi_class"] else "multi-label",
                c["loss"], "shared" if c["shared"] else "per-row",
                self.config.loss, self.config.sampler.get("shared", False))

    def choices(self) -> dict:
        """``{"loss", "shared", "multi_class"}`` in force: those of
        :meth:`prepare`, or the config's own values (``"auto"`` read as a
        multi-label regime) before it."""
        if self._choices is None:
            c = self.config
            shared = _shared_setting(c.sampler.get("shared", False))
            return {"loss": "squared_hinge" if c.loss == AUTO else c.loss,
                    "shared": bool(shared), "multi_class": False}
        return self._choices

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        mc = self.config.model
        if mc.sampled_layer == "uniform_sparse":
            fan_in = min(mc.connections_per_label, input_dim)
            # A zero bias as before the layer's default became "hinge_prior"
            # (these heads' bias is not set from the data).
            return UniformSparseDense(num_labels, fan_in,
                                      seed=self.config.seed,
                                      bias_initializer="zeros",
                                      name=OUTPUT_LAYER)
        return LabelDense(num_labels, bias_initializer="zeros",
                          name=OUTPUT_LAYER)

    def sampler(self, layer):
        """The head's sampler (made once, for ``layer.units`` labels)."""
        if self._sampler is None:
            self._sampler = make_sampler(self.config.sampler, layer.units,
                                         self.config.seed,
                                         shared=self.choices()["shared"])
        return self._sampler

    def make_loss(self, layer):
        return SAMPLED_LOSSES[self.choices()["loss"]]()

    def training_model(self, model, layer):
        return SampledTrainer(model, self.sampler(layer),
                              self.make_loss(layer),
                              shared=self.choices()["shared"],
                              name=f"{model.name}_trainer")

    def compile(self, model, layer, optimizer):
        # SampledTrainer computes its own loss in train_step.
        model.compile(optimizer=optimizer, jit_compile=False)

    def callbacks(self, layer, val_data):
        from xmc_tf import callbacks as xcallbacks
        sc = self.config.sampler
        sampler = self.sampler(layer)
        cbs = []
        set_cb = None
        if (self.config.model.sampled_layer == "uniform_sparse" and
                self.config.set.enabled):
            set_cb = xcallbacks.SetRewiring(
                every_n_steps=self.config.set.every_n_steps,
                fraction=self.config.set.fraction, seed=self.config.seed)
            cbs.append(set_cb)
        if sc.kind == "lsh":
            cbs.append(xcallbacks.Rehash(
                getattr(sampler, "hard", sampler), every_n_steps=sc.get("rehash_every_steps", 50),
                frequency_decay=sc.get("rehash_decay", 0.95)))
        elif sampler.needs_refresh:
            cbs.append(xcallbacks.RefreshIndex(
                sampler, start_epoch=sc.refresh_start_epoch,
                every_epochs=sc.refresh_every_epochs or None,
                every_steps=sc.refresh_every_steps or None,
                after_rewire=set_cb))
        return cbs + super().callbacks(layer, val_data)

    def results(self, layer):
        c = self.choices()
        return {"sampler": repr(self.sampler(layer)),
                "sampled_layer": self.config.model.sampled_layer,
                "loss": c["loss"], "shared_candidates": c["shared"]}
