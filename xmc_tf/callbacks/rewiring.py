"""SET rewiring of uniformly sparse layers (:func:`rewire`,
:class:`SetRewiring`).

Source: Mocanu et al., "Scalable training of artificial neural networks with
adaptive sparse connectivity inspired by network science" (SET, Nature
Communications 2018), as applied to the last layer by Schultheis & Babbar,
"Towards Memory-Efficient Training for Extremely Large Output Spaces",
Sec. 2 (prune the fraction alpha of smallest-magnitude weights, regrow at
random) and Sec. 4.1 (every 1000 steps, 10 %).

Gradient-based regrowth (``regrowth="gradient"``): Evci et al., "Rigging the
Lottery: Making All Tickets Winners" (RigL, ICML 2020), Sec. 3: grow the
connections with the largest magnitude of the dense gradient
``dL/dW = X^T G`` (``X``: the layer's inputs, ``G``: the loss gradient
with respect to its pre-activation outputs), here over a sample of
training instances; ``G`` is sparse under the squared hinge (Schultheis &
Babbar, Sec. 3.3), so the product costs ``nnz(G) x e``.
"""

from __future__ import annotations

import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf.callbacks._steps import optimizer_step, print_line
from xmc_tf.layers.uniform_sparse import UniformSparseDense
from xmc_tf.ops.uniform_sparse import (resource_set_rewire,
                                       resource_set_rewire_supported,
                                       set_rewire, set_rewire_supported)
from xmc_tf.optimizers.rows import tf_variable
from xmc_tf.optimizers.slots import slot_names, slot_variables

__all__ = ["REGROWTH", "gradient_candidates", "layer_gradient_sample",
           "rewire", "SetRewiring"]

#: ``SetRewiring(regrowth=...)``: uniform draws (SET) or the largest dense
#: gradient (RigL).
REGROWTH = ("random", "gradient")
#: Largest ``[labels, e]`` float32 block :func:`gradient_candidates` holds
#: (bytes).
_BLOCK_BYTES = 256 << 20


def _inner_optimizer(optimizer):
    """The optimizer that holds the per-weight state: the one inside a
    ``keras.optimizers.LossScaleOptimizer`` (which ``compile`` wraps around
    the optimizer under the ``"mixed_float16"`` policy), else itself."""
    while isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        optimizer = optimizer.inner_optimizer
    return optimizer


def _slot_names(optimizer):
    """Names of the optimizer's per-variable state lists (of the inner
    optimizer of a ``LossScaleOptimizer``).

    Raises:
      ValueError: an optimizer whose state layout SetRewiring does not know
        (see :func:`xmc_tf.optimizers.slot_names`).
    """
    optimizer = _inner_optimizer(optimizer)
    try:
        return slot_names(optimizer)
    except ValueError as e:
        raise ValueError(f"SetRewiring: {e}: its per-weight state could not "
                         "be reset for rewired connections.") from None


def _optimizer_slots(optimizer, variable):
    """The optimizer state variables of `variable` (same shape as it).

    Raises:
      ValueError: as :func:`_slot_names`.
    """
    _slot_names(optimizer)
    return slot_variables(_inner_optimizer(optimizer), variable)


def _dtype_name(x) -> str:
    """The dtype name of an array, tensor or Keras variable."""
    return getattr(x.dtype, "name", str(x.dtype))


def _rewire_by_op(indices, weights, fraction, num_features, rng, use_op):
    """:func:`rewire` through ``Xmc>SetRewire``: ``(new indices as an int32
    tensor, positions as a NumPy array)``, or None where ``use_op`` (None:
    decide as :func:`rewire` does) does not pick the op or nothing moves."""
    num_labels, fan_in = (int(d) for d in indices.shape)
    n = int(round(fraction * fan_in))
    if use_op is None:
        use_op = (_dtype_name(weights) in ("float32", "bfloat16")
                  and fan_in <= num_features
                  and set_rewire_supported())
    if not use_op or n == 0 or num_labels == 0:
        return None
    seed = rng.integers(0, np.iinfo(np.int64).max, size=2, dtype=np.int64)
    new, positions = set_rewire(indices, weights, n, num_features, seed)
    return new, positions.numpy()


def _rewire_in_place(layer, state, fraction, rng):
    """One rewire of ``layer`` by ``Xmc>ResourceSetRewire``: its indices
    rewritten in place, the moved positions of its kernel and ``state``
    zeroed, no ``[m, s]`` buffer; the same draws from ``rng`` as
    :func:`_rewire_by_op`, so the same new connections.  ``(moved, sum of
    the pruned |w|)``, or None where the op does not apply (float16 or
    other kernels, ``fan_in > num_features``, ``tf.distribute`` variables,
    an op library without it: the caller rewires by tensors instead)."""
    variables = [layer.indices, layer.kernel] + list(state)
    num_labels, fan_in = (int(d) for d in layer.indices.shape)
    n = int(round(fraction * fan_in))
    if (_dtype_name(layer.kernel) not in ("float32", "bfloat16")
            or fan_in > layer.num_features or n == 0 or num_labels == 0
            or not resource_set_rewire_supported()):
        return None
    try:
        tf_vars = [tf_variable(v) for v in variables]
    except TypeError:
        return None
    if any(isinstance(v, tf.distribute.DistributedValues) for v in tf_vars):
        return None
    seed = rng.integers(0, np.iinfo(np.int64).max, size=2, dtype=np.int64)
    moved, pruned = resource_set_rewire(tf_vars[0], tf_vars[1], tf_vars[2:],
                                        n, layer.num_features, seed)
    return int(moved), float(pruned)


def rewire(indices: np.ndarray, weights: np.ndarray, fraction: float,
           num_features: int, rng: np.random.Generator, use_op=None,
           grow: np.ndarray | None = None):
    """One SET step on the connections of every label.

    Per label, the ``round(fraction * s)`` connections with the smallest
    ``|weight|`` are removed and as many are regrown at sources drawn
    uniformly from those the label was not connected to before this step (or,
    when too few such sources exist, from those it is not connected to after
    the removal).  With ``grow`` (RigL), a label regrows first at its
    sources in ``grow`` and draws only the rest.

    Args:
      indices: int32 ``[num_labels, s]`` current sources: a NumPy array, or
        a tensor or variable (the op reads it in place; NumPy copies it).
      weights: float ``[num_labels, s]`` current weights (the same kinds).
      fraction: alpha in [0, 1].
      num_features: number of possible sources e.
      rng: NumPy generator.
      use_op: run the op ``Xmc>SetRewire``
        (:func:`xmc_tf.ops.uniform_sparse.set_rewire`, seeded with two
        draws of ``rng``; one multi-threaded pass, 10-100x faster than
        NumPy at 10^5-10^6 labels) rather than NumPy; None: when the op
        library has it and ``weights`` are float32 or bfloat16 (with ``fan_in <=
        num_features``).  The two give different draws for one ``rng``
        state, each deterministic in it.  With ``grow`` NumPy runs.
      grow: optional int ``[num_labels, round(fraction * s)]``: per label,
        distinct sources it is not connected to now, each row's ``-1``
        entries (drawn at random) after its sources
        (:func:`gradient_candidates`).

    Returns:
      ``(new_indices, positions)``: int32 ``[num_labels, s]`` and the int64
      ``[num_labels, n]`` column positions that were replaced (their weights
      and optimizer state must be reset by the caller).  Every row of
      ``new_indices`` holds s distinct values in ``[0, num_features)``.
    """
    by_op = (None if grow is not None else  # the op draws every source
             _rewire_by_op(indices, weights, fraction, num_features, rng,
                           use_op))
    if by_op is not None:
        return by_op[0].numpy(), by_op[1]
    num_labels, fan_in = (int(d) for d in indices.shape)
    n = int(round(fraction * fan_in))
    if not isinstance(indices, np.ndarray):
        indices = keras.ops.convert_to_numpy(indices)
    if n == 0 or num_labels == 0:
        return indices.copy(), np.zeros((num_labels, 0), np.int64)
    if not isinstance(weights, np.ndarray):
        weights = keras.ops.convert_to_numpy(weights)
    # A compact copy, so that the [num_labels, s] int64 argpartition result
    # is freed at once (2 GB at m = 2.8M, s = 96).
    positions = np.argpartition(np.abs(weights), n - 1, axis=1)[:, :n].copy()
    positions.sort(axis=1)
    new = indices.copy()
    rows = np.arange(num_labels)[:, None]
    # Sources to avoid: all current ones when enough others exist, else only
    # the ones that stay.
    keep = np.ones(indices.shape, bool)
    keep[rows, positions] = False
    row_keys = np.arange(num_labels, dtype=np.int64)[:, None] * num_features
    if num_features - fan_in >= n:
        # Keys row * e + source, sorted in place per row: rows occupy
        # disjoint key ranges, so the flat array is sorted (one int64
        # [num_labels, s] array, no further copies).
        forbidden_keys = indices.astype(np.int64)
        forbidden_keys += row_keys
        forbidden_keys.sort(axis=1)
        forbidden_keys = forbidden_keys.reshape(-1)
    else:
        forbidden = np.where(keep, indices, -1)
        forbidden_keys = np.sort((row_keys + forbidden)[forbidden >= 0])
    if grow is None:
        draw = rng.integers(0, num_features, size=(num_labels, n))
        todo = np.ones(draw.shape, bool)
    else:
        if grow.shape != (num_labels, n):
            raise ValueError(f"grow has shape {grow.shape}, expected "
                             f"{(num_labels, n)}")
        # Given sources first in their row: the duplicate test below keeps
        # a row's first copy, so a draw equal to one is drawn again.
        draw = grow.astype(np.int64, copy=True)
        todo = draw < 0
    while todo.any():
        draw[todo] = rng.integers(0, num_features, size=int(todo.sum()))
        keys = row_keys + draw
        # Membership by binary search in the sorted keys (np.isin would
        # concatenate and argsort all of them: ~5x their memory).
        where = np.minimum(np.searchsorted(forbidden_keys, keys),
                           max(forbidden_keys.size - 1, 0))
        clash = (forbidden_keys[where] == keys if forbidden_keys.size else
                 np.zeros(keys.shape, bool))
        # Duplicates among the new draws of one row: keep the first.
        order = np.argsort(draw, axis=1, kind="stable")
        sorted_draw = np.take_along_axis(draw, order, axis=1)
        dup_sorted = np.zeros(draw.shape, bool)
        dup_sorted[:, 1:] = sorted_draw[:, 1:] == sorted_draw[:, :-1]
        dup = np.zeros(draw.shape, bool)
        np.put_along_axis(dup, order, dup_sorted, axis=1)
        todo = clash | dup
    new[rows, positions] = draw.astype(np.int32)
    return new, positions


def gradient_candidates(inputs, output_grads, indices: np.ndarray, n: int,
                        block_bytes: int = _BLOCK_BYTES) -> np.ndarray:
    """Per label, the ``n`` new sources of largest dense-gradient magnitude.

    The dense gradient of a layer ``z = X W^T`` is ``D = G^T X``
    (``[num_labels, e]``); RigL grows the connections with the largest
    ``|D|`` (Evci et al. 2020, Sec. 3).  ``D`` is built in blocks of labels
    of at most ``block_bytes``, so memory is ``O(block_bytes)`` plus the
    sample; the product skips the zeros of ``G`` (``nnz(G) x e`` work).

    Args:
      inputs: the layer's inputs ``X`` over the sample, ``[N, e]``: a float
        ``np.ndarray`` or a ``scipy.sparse`` matrix.
      output_grads: ``G``, ``[N, num_labels]`` ``scipy.sparse`` matrix (or
        array): the loss gradient w.r.t. the layer's pre-activation outputs.
      indices: int ``[num_labels, s]`` current sources (excluded).
      n: sources per label to return, ``0 <= n <= e - s`` for full rows.
      block_bytes: bytes of the largest float32 block of ``D``.

    Returns:
      int32 ``[num_labels, n]``: per label, distinct sources not in its
      row of ``indices``, by decreasing ``|D|``; ``-1`` after them where
      fewer than ``n`` sources have a non-zero gradient.

    Raises:
      ValueError: shapes that do not agree.

    >>> x = np.array([[1., 0., 2.], [0., 3., 0.]], np.float32)
    >>> g = np.array([[1.], [0.]], np.float32)   # only instance 0 matters
    >>> gradient_candidates(x, g, np.array([[2]]), 2).tolist()
    [[0, -1]]
    """
    num_labels, fan_in = indices.shape
    g = sp.csc_matrix(output_grads)
    num, e = inputs.shape
    if g.shape != (num, num_labels):
        raise ValueError(f"output_grads has shape {g.shape}, expected "
                         f"{(num, num_labels)} (inputs {inputs.shape}, "
                         f"indices {indices.shape})")
    out = np.full((num_labels, n), -1, np.int32)
    if n == 0 or num_labels == 0:
        return out
    x = sp.csr_matrix(inputs) if sp.issparse(inputs) else np.asarray(inputs)
    active = np.flatnonzero(np.diff(g.indptr))  # labels with any gradient
    block = max(1, int(block_bytes) // (4 * e))
    for start in range(0, active.size, block):
        labels = active[start:start + block]
        d = g[:, labels].T @ x  # [block, e]
        d = np.abs(d.toarray() if sp.issparse(d) else np.asarray(d),
                   dtype=np.float32)
        rows = np.arange(labels.size)[:, None]
        d[rows, indices[labels]] = 0.0  # connected now: not new
        k = min(n, e)
        top = (np.argpartition(-d, k - 1, axis=1)[:, :k] if k < e else
               np.broadcast_to(np.arange(e), d.shape).copy())
        mags = np.take_along_axis(d, top, axis=1)
        order = np.argsort(-mags, axis=1, kind="stable")
        top = np.take_along_axis(top, order, axis=1)
        mags = np.take_along_axis(mags, order, axis=1)
        out[labels, :k] = np.where(mags > 0, top, -1)
    return out


def layer_gradient_sample(model: keras.Model, layers, batches):
    """The inputs and output gradients of `layers` over some batches.

    Runs ``model`` (inference mode: no dropout) on each ``(x, y)`` batch
    and differentiates its compiled loss (``model.compute_loss``) with
    respect to each layer's pre-activation output, watched where the
    layer applies its activation (the layers' ``call`` and ``activation``
    are wrapped for the duration, in eager mode).

    Args:
      model: a compiled Keras model whose outputs are the scores the loss
        reads (the label-wise heads' models).
      layers: :class:`UniformSparseDense` layers of ``model``.
      batches: an iterable of ``(x, y)`` batches as ``fit`` takes them.

    Returns:
      A list with, per layer, ``(X, G)``: ``X`` the stacked inputs
      (``[N, e]`` float32 ``np.ndarray``, or ``scipy.sparse.csr_matrix``
      for sparse inputs) and ``G`` the stacked gradients (``[N, m]``
      ``scipy.sparse.csr_matrix``, zeros dropped).

    Raises:
      ValueError: a layer that the model did not call.
    """
    layers = list(layers)
    seen = [dict(x=[], g=[]) for _ in layers]
    saved = [(l.__dict__.get("call"), l.__dict__.get("activation"))
             for l in layers]
    try:
        for batch in batches:
            x, y = batch[0], batch[1]
            with tf.GradientTape(persistent=True) as tape:
                pre = [None] * len(layers)
                for i, layer in enumerate(layers):
                    _wrap(layer, i, pre, seen[i]["x"], tape)
                y_pred = model(x, training=False)
                loss = model.compute_loss(x=x, y=y, y_pred=y_pred,
                                          training=False)
            for i in range(len(layers)):
                if pre[i] is None:
                    raise ValueError(f"layer {layers[i].name!r} was not "
                                     "called by the model")
                grad = tape.gradient(loss, pre[i])
                seen[i]["g"].append(sp.csr_matrix(
                    np.zeros(pre[i].shape, np.float32) if grad is None
                    else keras.ops.convert_to_numpy(grad)))
            del tape
    finally:
        for layer, (call, activation) in zip(layers, saved):
            for name, value in (("call", call), ("activation", activation)):
                if value is None:
                    layer.__dict__.pop(name, None)
                else:
                    setattr(layer, name, value)
    out = []
    for part in seen:
        xs = part["x"]
        x = (sp.vstack(xs, format="csr") if xs and sp.issparse(xs[0]) else
             np.concatenate(xs) if xs else np.zeros((0, 0), np.float32))
        g = (sp.vstack(part["g"], format="csr") if part["g"] else
             sp.csr_matrix((0, 0), dtype=np.float32))
        out.append((x, g))
    return out


def _wrap(layer, i, pre, xs, tape):
    """Wraps ``layer.call`` to record its inputs into ``xs`` and
    ``layer.activation`` to watch its input (the pre-activation output)
    on ``tape``, stored as ``pre[i]`` (see :func:`layer_gradient_sample`)."""
    call = type(layer).call.__get__(layer)
    activation = layer.activation

    def watched(z):
        tape.watch(z)
        pre[i] = z
        return activation(z)

    def recorded(inputs, *args, **kwargs):
        if isinstance(inputs, tf.SparseTensor):
            v = inputs.indices.numpy()
            xs.append(sp.csr_matrix(
                (inputs.values.numpy().astype(np.float32), (v[:, 0], v[:, 1])),
                shape=tuple(int(d) for d in inputs.dense_shape)))
        else:
            xs.append(np.asarray(keras.ops.convert_to_numpy(inputs),
                                 np.float32))
        layer.activation = watched
        try:
            return call(inputs, *args, **kwargs)
        finally:
            layer.activation = activation

    layer.call = recorded


class SetRewiring(keras.callbacks.Callback):
    """SET prune/regrow of every :class:`UniformSparseDense` layer.

    Every ``every_n_steps`` training batches, per label, the ``fraction`` of
    connections with the smallest ``|weight|`` are moved to sources the label
    is not connected to, uniformly at random; the moved weights restart at
    zero and so does their optimizer state (Adam/AdamW moments, SGD
    momentum).  After every rewire each label still has exactly ``s``
    distinct, in-range sources.

    The period counts optimizer steps (``optimizer.iterations``), so it is
    exact with ``steps_per_execution > 1`` too.  Statistics of the last
    rewire are added to every epoch's logs, zeros before the first one (so
    History, CSVLogger and a TensorBoard callback placed after this one see
    them), unless the run is too short to reach a rewire (``fit``'s steps x
    epochs below the next period): then to none:
    ``set_moved`` (connections moved per rewire), ``set_mean_abs_pruned``
    (mean ``|w|`` of the pruned connections) and ``set_rewires`` (count so far).
    ``get_state``/``set_state`` carry the counters and the RNG across a
    resume (:mod:`xmc_tf.job.checkpoint`).

    With ``regrowth="gradient"`` (RigL, Evci et al. 2020) a label regrows
    at the sources of largest dense-gradient magnitude over a sample of
    training instances (:func:`layer_gradient_sample`,
    :func:`gradient_candidates`), and draws at random only where fewer
    sources than it moves have a non-zero gradient (a label without
    positive or margin-violating instances in the sample); the epoch logs
    then also hold ``set_gradient_grown`` (connections grown at a gradient
    source in the last rewire).

    Args:
      every_n_steps: rewire period in training batches (paper: 1000).
      fraction: alpha, fraction of each label's connections moved (0.1).
      layers: the layers to rewire; default all UniformSparseDense layers of
        the model.
      seed: seed of the regrowth draws.
      verbose: print a line per rewire (on a line of its own below a
        ``verbose=1`` progress bar, no blank line otherwise).
      regrowth: ``"random"`` (SET) or ``"gradient"`` (RigL).
      gradient_data: with ``"gradient"``: the sample, as ``(x, y)`` batches
        like ``fit``'s, either an iterable read in full at every rewire or
        a callable ``rewire_number -> iterable`` (rewire numbers count from
        0 and survive a resume, so a callable that seeds its draw with it
        keeps a resumed run exact).  The model's compiled loss is
        differentiated on it (see :func:`layer_gradient_sample`).

    Mixed precision: the kernel variables stay float32 under
    ``keras.mixed_precision`` policies, and the optimizer state is found
    inside the ``keras.optimizers.LossScaleOptimizer`` that ``compile``
    wraps around the optimizer under ``"mixed_float16"``.

    The defaults (every 1000 steps, 10 %) are the paper's (Sec. 4.1) and
    the CLI's (``config.set``, :data:`xmc_tf.config.BASE`).

    Raises:
      ValueError: bad arguments; at train begin, an optimizer other than
        Adam, AdamW or SGD or a subclass of them (e.g.
        :class:`xmc_tf.optimizers.LazyAdam`, ``LazySGD``; also inside a
        ``LossScaleOptimizer``), or a model without UniformSparseDense
        layer.

    >>> cb = SetRewiring(every_n_steps=1000, fraction=0.1)
    """

    def __init__(self, every_n_steps=1000, fraction=0.1, layers=None, seed=None,
                 verbose=0, regrowth="random", gradient_data=None):
        super().__init__()
        if int(every_n_steps) < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"fraction must be in [0, 1], got {fraction}")
        if regrowth not in REGROWTH:
            raise ValueError(f"regrowth must be one of {REGROWTH}, got "
                             f"{regrowth!r}")
        if regrowth == "gradient" and gradient_data is None:
            raise ValueError('regrowth="gradient" needs gradient_data (the '
                             "training batches its dense gradient is taken on)")
        self.regrowth = regrowth
        self.gradient_data = gradient_data
        self.every_n_steps = int(every_n_steps)
        self.fraction = float(fraction)
        self.layers = layers
        self.verbose = verbose
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._periods_done = 0
        self.rewires = 0
        self.last_stats = {"set_moved": 0, "set_mean_abs_pruned": 0.0,
                           "set_rewires": 0}
        if regrowth == "gradient":
            self.last_stats["set_gradient_grown"] = 0

    def get_config(self) -> dict:
        """Constructor arguments (``layers`` as layer names; without
        ``gradient_data``, which is data)."""
        return {"every_n_steps": self.every_n_steps, "fraction": self.fraction,
                "layers": (None if self.layers is None else
                           [layer.name for layer in self.layers]),
                "seed": self.seed, "verbose": self.verbose,
                "regrowth": self.regrowth}

    def _targets(self):
        if self.layers is not None:
            return list(self.layers)
        return [l for l in self.model._flatten_layers()  # pylint: disable=protected-access
                if isinstance(l, UniformSparseDense)]

    def on_train_begin(self, logs=None):
        if not self._targets():
            raise ValueError("SetRewiring: the model has no UniformSparseDense layer")
        _slot_names(self.model.optimizer)  # unsupported optimizer: ValueError
        start = optimizer_step(self.model)
        self._periods_done = start // self.every_n_steps
        # A run too short to reach a rewire logs no set_* keys at all (the
        # keys must be in every epoch's logs or in none: History and
        # CSVLogger align them by epoch).
        params = self.params or {}
        steps, epochs = params.get("steps"), params.get("epochs")
        self._reports = not (
            steps and epochs and self.rewires == 0
            and (start + int(steps) * int(epochs)) // self.every_n_steps
            == self._periods_done)

    def on_train_batch_end(self, batch, logs=None):
        # Count optimizer steps, not callback calls: with
        # compile(steps_per_execution=k) Keras calls this once per k batches.
        periods = optimizer_step(self.model) // self.every_n_steps
        while self._periods_done < periods:
            self._periods_done += 1
            self.rewire_now()

    def _state_of(self, layer) -> list:
        """The per-weight state of ``layer``'s kernel that a rewire resets:
        the optimizer's slots, or a fused update's state (the layer keeps
        it, the optimizer has none: ``UniformSparseDense(fused_update=...)``).
        """
        if getattr(layer, "fused_update", None) is not None:
            return layer.fused_state_variables()
        return list(_optimizer_slots(self.model.optimizer, layer.kernel))

    def rewire_now(self):
        """Rewires the target layers once and returns the statistics dict.

        Per layer, with random regrowth: ``Xmc>ResourceSetRewire``
        (:func:`xmc_tf.ops.uniform_sparse.resource_set_rewire`) rewrites
        the indices in place and zeroes the moved positions of the kernel
        and of its optimizer slots (a fused update's state, where the layer
        has one), with no ``[m, s]`` buffer.  Otherwise (gradient regrowth,
        where NumPy grows at :func:`gradient_candidates`; ``tf.distribute``
        variables; a float16 kernel): :func:`rewire` on the variables, its
        new indices tensor assigned as it is, then the kernel and its state,
        one after another, are zeroed at the moved positions (``tf.where``
        with a ``[m, s]`` bool mask: one ``[m, s]`` copy at a time, 1.1 GB
        at m = 2.8M, s = 96).
        """
        moved, pruned_abs, by_gradient = 0, 0.0, 0
        targets = self._targets()
        samples = [None] * len(targets)
        if self.regrowth == "gradient" and round(self.fraction * max(
                int(l.indices.shape[1]) for l in targets)) > 0:
            data = self.gradient_data
            samples = layer_gradient_sample(
                self.model, targets, data(self.rewires) if callable(data)
                else data)
        for layer, sample in zip(targets, samples):
            if sample is not None:
                indices = keras.ops.convert_to_numpy(layer.indices)
                grow = gradient_candidates(
                    *sample, indices,
                    int(round(self.fraction * indices.shape[1])))
                by_gradient += int((grow >= 0).sum())
                new, positions = rewire(indices, layer.kernel, self.fraction,
                                        layer.num_features, self._rng,
                                        grow=grow)
                del indices, grow
            else:
                in_place = _rewire_in_place(
                    layer, self._state_of(layer), self.fraction, self._rng)
                if in_place is not None:
                    moved += in_place[0]
                    pruned_abs += in_place[1]
                    continue
                by_op = _rewire_by_op(layer.indices, layer.kernel,
                                      self.fraction, layer.num_features,
                                      self._rng, None)
                new, positions = by_op or rewire(
                    layer.indices, layer.kernel, self.fraction,
                    layer.num_features, self._rng, use_op=False)
                del by_op
            if positions.shape[1] == 0:
                continue
            layer.indices.assign(new)  # a tensor: the variable takes it over
            del new
            # The moved positions as a [m, s] mask (NumPy fancy assignment:
            # TensorFlow's scatter ops run on one thread, ~20 ns per entry);
            # then one multi-threaded select per variable, one at a time.
            num_labels = positions.shape[0]
            fan_in = int(layer.indices.shape[1])
            mask = np.zeros((num_labels, fan_in), bool)
            np.put_along_axis(mask, positions, True, axis=1)
            moved += positions.size
            del positions
            mask = tf.constant(mask)
            kernel = tf.convert_to_tensor(layer.kernel)
            pruned_abs += float(tf.reduce_sum(tf.where(
                mask, tf.abs(kernel), tf.zeros((), kernel.dtype))))
            del kernel
            for variable in [layer.kernel] + self._state_of(layer):
                value = tf.convert_to_tensor(variable)
                variable.assign(tf.where(mask, tf.zeros((), value.dtype),
                                         value))
                del value
            del mask
        self.rewires += 1
        self.last_stats = {"set_moved": moved,
                           "set_mean_abs_pruned": pruned_abs / max(moved, 1),
                           "set_rewires": self.rewires}
        if self.regrowth == "gradient":
            self.last_stats["set_gradient_grown"] = by_gradient
        if self.verbose:
            print_line(self, (
                f"SetRewiring: moved {moved} connections, mean |w| pruned "
                f"{self.last_stats['set_mean_abs_pruned']:.4g}") + (
                    f", {by_gradient} grown at gradient sources"
                    if self.regrowth == "gradient" else ""))
        return self.last_stats

    def on_epoch_end(self, epoch, logs=None):
        # Present from the first epoch (zeros before the first rewire) so
        # that loggers which fix their columns after the first epoch
        # (CSVLogger) see them; absent where no rewire can happen.
        if logs is not None and getattr(self, "_reports", True):
            logs.update(self.last_stats)

    def get_state(self) -> dict:
        """The state an exact resume needs (JSON-serialisable): rewires done,
        periods counted, the last statistics and the regrowth RNG state
        (used by :mod:`xmc_tf.job.checkpoint`)."""
        return {"periods_done": int(self._periods_done),
                "rewires": int(self.rewires),
                "last_stats": dict(self.last_stats),
                "rng": self._rng.bit_generator.state}

    def set_state(self, state: dict) -> None:
        """Restores :meth:`get_state`; call before ``fit`` (the optimizer's
        step count must be restored too: ``on_train_begin`` recounts the
        periods from it).

        Raises:
          ValueError: the RNG state is of another bit generator.
        """
        self._periods_done = int(state["periods_done"])
        self.rewires = int(state["rewires"])
        self.last_stats = dict(state["last_stats"])
        self._rng.bit_generator.state = state["rng"]
