"""Keras layer with uniformly sparse connectivity (one op call per forward).

Source: Schultheis & Babbar, "Towards Memory-Efficient Training for Extremely
Large Output Spaces", Sec. 3.2 (uniform sparsity), Sec. 3.4 (put a dense
intermediate layer before it), Sec. 4.1 (random initial connections).
"""

from __future__ import annotations

import contextlib
import threading

import keras
import numpy as np
import scipy.sparse as sp
import tensorflow as tf

from xmc_tf import initializers  # noqa: F401  (registers "hinge_prior")
from xmc_tf.initializers import large_matrix_initializer
from xmc_tf.layers.scorer import LabelLayout, scatter_label_rows
from xmc_tf.ops.sparse_candidates import sparse_input_sampled_matmul
from xmc_tf.ops.sampled import (check_candidates, check_shared_candidates,
                                gather_label_rows,
                                uniform_sparse_sampled_matmul)
from xmc_tf.optimizers.fused import FusedUpdate
from xmc_tf.ops.uniform_sparse import (uniform_sparse_grad_apply,
                                       uniform_sparse_inverted_index,
                                       uniform_sparse_matmul,
                                       uniform_sparse_matmul_sparse_input)


_PER_CALL = threading.local()


@contextlib.contextmanager
def per_call_inverted_index():
    """Within this context (this thread), :class:`UniformSparseDense` on
    sparse input builds its connections' inverted index in every call
    instead of keeping it in variables between calls (what it does
    otherwise).  :func:`xmc_tf.saving.export_saved_model` traces the
    serving signatures this way, so a SavedModel holds no such state (and
    its functions no variables captured inside a ``tf.cond``)."""
    previous = getattr(_PER_CALL, "on", False)
    _PER_CALL.on = True
    try:
        yield
    finally:
        _PER_CALL.on = previous


def random_connections(num_labels: int, fan_in: int, num_features: int,
                       seed=None) -> np.ndarray:
    """Draws `fan_in` distinct sources per label, uniformly at random.

    Args:
      num_labels: m, number of labels (rows).
      fan_in: s, connections per label; ``1 <= fan_in <= num_features``.
      num_features: e, size of the input the label connects to.
      seed: int or None, for ``numpy.random.default_rng``.

    Returns:
      int32 array ``[num_labels, fan_in]``; every row holds distinct values in
      ``[0, num_features)``, sorted.  Memory is O(num_labels * fan_in) (plus
      O(rows * num_features) for a chunk of rows when fan_in > num_features/4).

    Raises:
      ValueError: ``fan_in`` is not in ``[1, num_features]``.

    >>> random_connections(2, 3, 10, seed=0).shape
    (2, 3)
    """
    if not 1 <= fan_in <= num_features:
        raise ValueError(f"connections_per_label={fan_in} must be in "
                         f"[1, num_features={num_features}]")
    rng = np.random.default_rng(seed)
    out = np.empty((num_labels, fan_in), np.int32)
    if 4 * fan_in > num_features:  # dense-ish rows: permutation prefixes
        chunk = max(1, (1 << 22) // num_features)
        for start in range(0, num_labels, chunk):
            stop = min(num_labels, start + chunk)
            keys = rng.random((stop - start, num_features))
            out[start:stop] = np.argpartition(keys, fan_in - 1, axis=1)[:, :fan_in]
        out.sort(axis=1)
        return out
    # Sparse rows: draw with replacement and redraw the duplicates.
    out[:] = rng.integers(0, num_features, size=out.shape)
    while True:
        out.sort(axis=1)
        dup = np.zeros(out.shape, bool)
        dup[:, 1:] = out[:, 1:] == out[:, :-1]
        n = int(dup.sum())
        if n == 0:
            return out
        out[dup] = rng.integers(0, num_features, size=n)


def label_feature_connections(features, labels, fan_in: int, seed=None,
                              return_weights: bool = False,
                              max_fan_out: int | None = None):
    """Each label's ``fan_in`` strongest features in its positive instances.

    The label representation of PIFA (positive instance feature
    aggregation: the sum of the feature vectors of a label's training
    instances, as in Parabel's and PECOS' label clustering) keeps, per
    label, the ``fan_in`` features of largest summed value; a label whose
    instances have fewer distinct features is filled up with distinct
    random ones.  These are the starting connections of a uniform-sparse
    layer on the input features (a sparse linear classifier per label,
    ``config.model.wide_connections``): random connections into 10^4-10^6
    features almost never hit a label's informative ones.

    Args:
      features: ``scipy.sparse`` ``[n, e]`` float, the (normalised) training
        features.
      labels: ``scipy.sparse`` ``[n, m]``, non-zero = positive.
      fan_in: s, ``1 <= s <= e``.
      seed: int or None, for the random fill.
      return_weights: also return the aggregate's values at the
        connections, each row scaled to unit l2 norm (0 at filled ones):
        ``x . w_j`` is then the cosine of ``x`` and label ``j``'s
        (truncated) centroid, a nearest-centroid classifier.
      max_fan_out: None, or the most labels one feature connects to.  A
        feature in more labels' choices (a feature of most instances, in
        the choices of every label with fewer than ``fan_in`` features)
        keeps the ``max_fan_out`` labels where its share of the label's
        l2-normalised aggregate is largest; each other label gets a random
        feature instead (weight 0) that is in no more than ``max_fan_out``
        labels' rows already where one can be found quickly.  On sparse
        input a batch costs one multiply-add per (stored entry, label of
        its feature): the few features of very many labels dominate it.

    Returns:
      int32 ``[m, s]``, each row ``s`` distinct sorted values in ``[0, e)``
      (and, with ``return_weights``, float32 ``[m, s]``).
      Memory: the ``[m, e]`` sparse aggregate (at most ``nnz(labels) x``
      features per instance entries) plus ``O(m s)``.

    Raises:
      ValueError: ``fan_in`` outside ``[1, e]``, ``features`` and
        ``labels`` with different numbers of rows, or ``max_fan_out < 1``.

    >>> import scipy.sparse as sp
    >>> x = sp.csr_matrix(np.array([[0., 2., 1., 0.], [3., 0., 0., 0.]]))
    >>> y = sp.csr_matrix(np.array([[1], [0]]))
    >>> label_feature_connections(x, y, 2, seed=0).tolist()
    [[1, 2]]
    """
    num_features = features.shape[1]
    if not 1 <= fan_in <= num_features:
        raise ValueError(f"connections_per_label={fan_in} must be in "
                         f"[1, num_features={num_features}]")
    if features.shape[0] != labels.shape[0]:
        raise ValueError(f"features have {features.shape[0]} rows, labels "
                         f"{labels.shape[0]}")
    positives = sp.csr_matrix(labels, dtype=np.float32)
    positives.data[:] = 1.0
    agg = sp.csr_matrix(positives.T @ sp.csr_matrix(features, dtype=np.float32))
    agg.eliminate_zeros()
    agg.data = np.abs(agg.data)
    out = random_connections(agg.shape[0], fan_in, num_features, seed)
    weights = np.zeros(out.shape, np.float32)
    for j in range(agg.shape[0]):
        lo, hi = agg.indptr[j], agg.indptr[j + 1]
        if lo == hi:
            continue
        cols, vals = agg.indices[lo:hi], agg.data[lo:hi]
        if hi - lo > fan_in:
            top = np.argpartition(-vals, fan_in - 1)[:fan_in]
            cols, vals = cols[top], vals[top]
        else:  # all of them, then random ones not among them
            rest = out[j][~np.isin(out[j], cols)][:fan_in - cols.size]
            cols = np.concatenate([cols, rest])
            vals = np.concatenate([vals, np.zeros(rest.size, vals.dtype)])
        order = np.argsort(cols)
        out[j], weights[j] = cols[order], vals[order]
    norms = np.sqrt(np.square(weights).sum(axis=1, keepdims=True))
    weights = weights / np.maximum(norms, 1e-12)
    if max_fan_out is not None:
        _cap_fan_out(out, weights, int(max_fan_out), num_features, seed)
    if not return_weights:
        return out
    return out, weights


def _cap_fan_out(out, weights, max_fan_out: int, num_features: int,
                 seed) -> None:
    """In place: no feature in more than ``max_fan_out`` rows of ``out``
    (``label_feature_connections``' ``max_fan_out``); rows stay sorted and
    distinct."""
    if max_fan_out < 1:
        raise ValueError(f"max_fan_out={max_fan_out} must be >= 1")
    m, s = out.shape
    fan_out = np.bincount(out.ravel(), minlength=num_features)
    over = np.flatnonzero(fan_out > max_fan_out)
    if over.size == 0 or num_features <= s:
        return
    rng = np.random.default_rng(None if seed is None else seed + 1)
    flat_out, flat_w = out.reshape(-1), weights.reshape(-1)
    changed = np.zeros(m, bool)
    for f in over:
        where = np.flatnonzero(flat_out == f)
        # keep the labels where f weighs most; replace it in the others
        drop = where[np.argsort(-flat_w[where], kind="stable")[max_fan_out:]]
        fan_out[f] -= drop.size
        for p in drop:
            j = p // s
            row = out[j]
            for _ in range(16):  # a feature of few labels, not in the row
                g = int(rng.integers(num_features))
                if fan_out[g] < max_fan_out and not np.any(row == g):
                    break
            else:
                g = int(rng.choice(np.setdiff1d(np.arange(num_features), row)))
            flat_out[p], flat_w[p] = g, 0.0
            fan_out[g] += 1
            changed[j] = True
    for j in np.flatnonzero(changed):
        order = np.argsort(out[j])
        out[j], weights[j] = out[j][order], weights[j][order]


def label_centroids(features, labels, fan_in: int, seed=None,
                    name: str = "label_centroids") -> "UniformSparseDense":
    """A frozen nearest-centroid scorer: label ``j``'s score is the cosine
    of the instance and ``j``'s (truncated) centroid.

    Row ``j`` keeps the ``fan_in`` strongest features of the sum of label
    ``j``'s training instances (PIFA, :func:`label_feature_connections`),
    scaled to unit l2 norm; the layer is a non-trainable
    :class:`UniformSparseDense` without bias, so on l2-normalised inputs its
    scores lie in ``[-1, 1]``.  For labels with a handful of training
    instances this is a strong scorer of its own (the centroid is the
    instances), which a network's softmax or one-vs-all head learns
    slowly; :class:`xmc_tf.layers.FusedScores` adds it to a model's
    scores with a weight (:mod:`xmc_tf.job` reads the weight on the
    validation split).  Sources: PIFA (Prabhu et al., Parabel, WWW 2018;
    Yu et al., PECOS, JMLR 2022); nearest-centroid few-shot classifiers
    (Snell et al., "Prototypical Networks for Few-shot Learning", NeurIPS
    2017).

    Args:
      features: ``scipy.sparse`` ``[n, e]`` float, the training features as
        the scorer will see them (normalised).
      labels: ``scipy.sparse`` ``[n, m]``, non-zero = positive.
      fan_in: s, features kept per label, ``1 <= s <= e``.
      seed: int or None, for the random fill of labels with fewer features
        (at weight 0).
      name: the layer's name.

    Returns:
      a built :class:`UniformSparseDense` ``[batch, e] -> [batch, m]``
      float32, ``trainable=False``.  Memory: ``8 m s`` bytes.

    Raises:
      ValueError: as :func:`label_feature_connections`.

    >>> import scipy.sparse as sp
    >>> x = sp.csr_matrix(np.array([[1., 0., 0.], [0., .6, .8], [0., 1., 0.]]))
    >>> y = sp.csr_matrix(np.array([[1, 0], [0, 1], [0, 1]]))
    >>> layer = label_centroids(x, y, 2, seed=0)
    >>> layer(tf.constant([[0., .6, .8]])).numpy().astype(float).round(3).tolist()
    [[0.0, 0.894]]
    """
    indices, weights = label_feature_connections(features, labels, fan_in,
                                                 seed, return_weights=True)
    layer = UniformSparseDense(indices.shape[0], fan_in, use_bias=False,
                               kernel_initializer="zeros", seed=seed,
                               trainable=False, name=name)
    layer.build((None, features.shape[1]))
    layer.indices.assign(indices)
    layer.kernel.assign(weights)
    return layer


def _check_connections(indices, num_features: int, name: str = "indices"):
    """Checks a uniform-sparse layer's connections before they are written.

    The forward op checks every index it gathers and the gradient ops the
    indices they read (the labels with a non-zero signal); the layer's
    writers (:meth:`UniformSparseDense.set_weights`, loading) check what
    they write with this, so a bad index fails where it enters.

    Args:
      indices: ``[num_labels, fan_in]`` integer array-like.
      num_features: the input dimension D.
      name: the layer's name, for the message.

    Raises:
      ValueError: an entry outside ``[0, num_features)``, naming the first
        (row-major) as ``indices[j, k] = v``.
    """
    idx = np.asarray(indices)
    if idx.ndim != 2 or not np.issubdtype(idx.dtype, np.integer):
        raise ValueError(f"{name}: indices must be a [num_labels, fan_in] "
                         f"integer array, got {idx.dtype} {idx.shape}")
    bad = (idx < 0) | (idx >= num_features)
    if bad.any():
        j, k = np.unravel_index(int(np.argmax(bad)), idx.shape)
        raise ValueError(f"{name}: indices[{j}, {k}] = {int(idx[j, k])} is "
                         f"out of range [0, {num_features}) (num_features)")


@keras.saving.register_keras_serializable(package="xmc_tf")
class UniformSparseDense(keras.layers.Layer):
    """Output layer in which every label has exactly ``s`` incoming connections.

    ``outputs[i, j] = activation(sum_k x[i, indices[j, k]] * kernel[j, k] +
    bias[j])``.  The connections are a non-trainable int32 variable
    ``indices`` of shape ``[units, connections_per_label]`` drawn uniformly at
    random without duplicate sources per label (seeded); the trainable
    ``kernel`` has the same shape, so the layer stores 8 bytes per structural
    non-zero.  Rewire it during training with
    :class:`xmc_tf.callbacks.SetRewiring`.  Put a wide dense intermediate
    layer before it (Sec. 3.4: sparsity alone underfits).

    Models with this layer must be compiled with ``jit_compile=False``: XLA
    cannot compile custom ops.  Traced inside
    :func:`xmc_tf.ops.stock.stock_ops` (portable SavedModels) the forward
    uses TensorFlow's ops only
    (:func:`xmc_tf.ops.uniform_sparse.uniform_sparse_matmul_stock`).

    Args:
      units: number of labels m.
      connections_per_label: fan-in s, ``1 <= s <= input dim``.
      activation: Keras activation, default linear (scores/logits).
      use_bias: add a bias per label.
      bias_initializer: default ``"hinge_prior"``
        (:class:`xmc_tf.initializers.PriorBias`): every label starts at
        -1, the squared hinge's best constant score for a rare label, so
        ``model.fit`` with :class:`xmc_tf.losses.SquaredHinge` learns from
        the first step (with a zero bias every label violates its margin
        and the README's toy model stays at train P@1 0.002 after 20
        epochs; with -1 it reaches 1.0).  Harmless for a softmax (a shift
        of all logits); for the binary cross-entropy pass
        ``BinaryCrossentropy().bias_initializer(labels_per_instance)``.
        Models saved with an explicit initializer (e.g. ``"zeros"``, the
        default before) reload with it.
      kernel_initializer: as in ``keras.layers.Dense``.  The kernel
        initializer is called with the shape ``[units, s]``, which Keras reads
        as fan_in = units, fan_out = s (``glorot_uniform``: limit
        ``sqrt(6 / (units + s))``); a kernel of at least
        :data:`xmc_tf.initializers.CHUNKED_INIT_BYTES` is drawn a block of
        labels at a time (:func:`xmc_tf.initializers.chunked_initial_value`:
        the same distribution, without the one-call draw's temporaries).
      kernel_regularizer, bias_regularizer, activity_regularizer: as in
        ``keras.layers.Dense``.
      kernel_constraint, bias_constraint: as in ``keras.layers.Dense``.
      seed: int seed of the connection draw (None: random).
      kernel_scale: float > 0; the connection weights are ``kernel_scale *
        kernel``.  Under Adam-type optimizers (steps of about the learning
        rate, whatever the gradient's scale) this multiplies the layer's
        effective learning rate by ``kernel_scale`` (a per-layer learning
        rate, as the wide part of a wide-and-deep model needs: a label's
        weights move only on the few batches where it matters).  Default 1.
      fused_update: None (the model's optimizer trains the kernel, from the
        dense ``[m, s]`` gradient of ``Xmc>UniformSparseMatmulGrad``), or
        a :class:`xmc_tf.optimizers.FusedUpdate`: the kernel is trained
        inside the backward pass (op ``Xmc>UniformSparseGradApply``,
        :func:`xmc_tf.ops.uniform_sparse_grad_apply`) by that rule, so no
        ``[m, s]`` gradient and no optimizer slots exist for it.  The
        kernel is then a non-trainable variable (the model's optimizer
        skips it) beside the rule's state in the kernel's dtype
        (``fused_compensation`` with Kahan steps, ``fused_m`` /
        ``fused_v`` for Adam) and a step count ``fused_step``: all saved
        with the model and rewired by :class:`xmc_tf.callbacks.SetRewiring`.
        A bfloat16 kernel (``dtype="bfloat16"``: 2 bytes per weight) takes
        Kahan-compensated steps by default (ELMO, Zhang et al., ICML 2025).
        The step runs on every gradient through a training call
        (``training=True``, as ``model.fit`` calls it); inference calls,
        a frozen layer (``trainable=False``) and the candidate scorers
        (``score_candidates``, ``score_shared``: sampled training) do not
        step.  CPU only; not
        under a distribution strategy with several replicas (each replica
        would step its own copy: ValueError), nor with loss scaling
        (``mixed_float16``), a kernel regularizer or constraint (ValueError
        at construction).

    Input shape: ``[batch, num_features]`` float tensor, or a
    ``tf.SparseTensor`` (the layer directly on sparse input features: a
    per-label sparse linear model, e.g. the wide path of
    ``config.model.wide_connections``): float32 batches go through
    :func:`xmc_tf.ops.uniform_sparse_matmul_sparse_input` (cost about
    ``nnz * m * s / e`` multiply-adds, no dense batch; the connections'
    inverted index, a sort of the ``m s`` connections, is kept between
    calls and rebuilt only when ``indices`` changed, which a compare of the
    ``m s`` indices finds on every call), other dtypes are densified per
    batch (``b e`` values).
    Output shape: ``[batch, units]``.

    Mixed precision (``keras.mixed_precision.set_global_policy(
    "mixed_float16")`` or ``"mixed_bfloat16"``): the variables stay float32
    and the op runs in the compute dtype (its CPU and GPU kernels
    accumulate in float32), so outputs, and the
    ``score_candidates`` / ``score_shared`` logits, are float16 / bfloat16
    (tests/test_mixed_precision.py: within 4e-3 / 3e-2 of a float32 copy,
    relative to the largest score).  Those two cast the whole kernel to
    the compute dtype per step.

    Raises:
      ValueError: at build, when the input is not rank 2 with a known last
        dimension or ``connections_per_label`` exceeds it.

    >>> import keras, xmc_tf
    >>> layer = xmc_tf.layers.UniformSparseDense(1000, 8, seed=0)
    >>> layer(keras.ops.ones((2, 64))).shape
    TensorShape([2, 1000])
    """

    def __init__(self, units, connections_per_label, activation=None,
                 use_bias=True, kernel_initializer="glorot_uniform",
                 bias_initializer="hinge_prior", kernel_regularizer=None,
                 bias_regularizer=None, activity_regularizer=None,
                 kernel_constraint=None, bias_constraint=None, seed=None,
                 kernel_scale=1.0, fused_update=None, **kwargs):
        super().__init__(activity_regularizer=activity_regularizer, **kwargs)
        if int(units) < 1 or int(connections_per_label) < 1:
            raise ValueError("units and connections_per_label must be >= 1, got "
                             f"{units} and {connections_per_label}")
        self.units = int(units)
        self.connections_per_label = int(connections_per_label)
        self.activation = keras.activations.get(activation)
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.bias_initializer = keras.initializers.get(bias_initializer)
        self.kernel_regularizer = keras.regularizers.get(kernel_regularizer)
        self.bias_regularizer = keras.regularizers.get(bias_regularizer)
        self.kernel_constraint = keras.constraints.get(kernel_constraint)
        self.bias_constraint = keras.constraints.get(bias_constraint)
        self.seed = seed
        if not float(kernel_scale) > 0:
            raise ValueError(f"kernel_scale must be > 0, got {kernel_scale}")
        self.kernel_scale = float(kernel_scale)
        if isinstance(fused_update, dict):
            fused_update = FusedUpdate.from_config(fused_update)
        if fused_update is not None:
            if not isinstance(fused_update, FusedUpdate):
                raise ValueError("fused_update must be None or an "
                                 "xmc_tf.optimizers.FusedUpdate, got "
                                 f"{type(fused_update).__name__}")
            if self.kernel_regularizer is not None or \
                    self.kernel_constraint is not None:
                raise ValueError("fused_update trains the kernel inside the "
                                 "backward: a kernel_regularizer or "
                                 "kernel_constraint would not reach it")
            if self.dtype_policy.name == "mixed_float16":
                raise ValueError("fused_update does not undo loss scaling "
                                 "(mixed_float16): use float32 or bfloat16")
            if keras.backend.standardize_dtype(self.variable_dtype) not in (
                    "float32", "bfloat16"):
                raise ValueError("fused_update needs a float32 or bfloat16 "
                                 f"kernel, got {self.variable_dtype}")
        self.fused_update = fused_update
        self.input_spec = keras.layers.InputSpec(min_ndim=2, max_ndim=2)
        # XLA cannot compile the custom op: jit_compile="auto" then stays off.
        self.supports_jit = False

    def build(self, input_shape):
        num_features = input_shape[-1]
        if len(input_shape) != 2 or num_features is None:
            raise ValueError("UniformSparseDense needs [batch, num_features] "
                             f"inputs with a known num_features, got {input_shape}")
        self.num_features = int(num_features)
        connections = random_connections(self.units, self.connections_per_label,
                                         self.num_features, self.seed)
        self.indices = self.add_weight(
            name="indices", shape=connections.shape, dtype="int32",
            initializer=lambda shape, dtype=None: connections, trainable=False)
        self.kernel = self.add_weight(
            name="kernel", shape=connections.shape,
            initializer=large_matrix_initializer(
                self.kernel_initializer, connections.shape,
                self.variable_dtype),
            regularizer=self.kernel_regularizer,
            constraint=self.kernel_constraint,
            trainable=self.fused_update is None)
        self._fused_state, self._fused_step = [], None
        if self.fused_update is not None:
            for state in self.fused_update.state_names(self.variable_dtype):
                self._fused_state.append(self.add_weight(
                    name=f"fused_{state}", shape=connections.shape,
                    initializer="zeros", trainable=False))
            self._fused_step = self.add_weight(
                name="fused_step", shape=(), dtype="int64",
                initializer="zeros", trainable=False)
        self.bias = None
        if self.use_bias:
            # A fused update keeps the bias (stepped by the model's
            # optimizer) in float32 beside a 16-bit kernel.
            self.bias = self.add_weight(
                name="bias", shape=(self.units,),
                dtype="float32" if self.fused_update is not None else None,
                initializer=self.bias_initializer,
                regularizer=self.bias_regularizer,
                constraint=self.bias_constraint)
        self.input_spec = keras.layers.InputSpec(ndim=2,
                                                 axes={-1: self.num_features})

    def set_weights(self, weights):
        """As ``keras.layers.Layer.set_weights``, after a range check of the
        new ``indices``.

        Raises:
          ValueError: a weight list of the wrong length or shapes (Keras),
            or an entry of ``indices`` outside ``[0, num_features)``
            (nothing is assigned then).
        """
        for variable, value in zip(self.weights, weights):
            if variable is self.indices:
                _check_connections(value, self.num_features, self.name)
        super().set_weights(weights)

    def load_own_variables(self, store):
        """As ``keras.layers.Layer.load_own_variables`` (``load_model``,
        ``load_weights``), after a range check of the stored ``indices``.

        Raises:
          ValueError: an entry of the stored ``indices`` outside
            ``[0, num_features)`` (nothing is assigned then), or a store of
            the wrong size (Keras).
        """
        variables = self._trainable_variables + self._non_trainable_variables
        for i, variable in enumerate(variables):
            if variable is self.indices and str(i) in store:
                _check_connections(store[str(i)], self.num_features, self.name)
        super().load_own_variables(store)

    def call(self, inputs, training=None):
        fused = (self.fused_update is not None and self.trainable
                 and bool(training))
        if isinstance(inputs, tf.SparseTensor) and fused:
            raise ValueError(f"{self.name}: fused_update trains on dense "
                             "inputs only, got a SparseTensor")
        if isinstance(inputs, tf.SparseTensor) and (
                inputs.dtype == tf.float32 and self.kernel.dtype == "float32"):
            # Directly on sparse input features (a linear model): the
            # connections are traversed feature by feature, one product per
            # (stored entry, connection of its feature), no [b, e] batch.
            outputs = uniform_sparse_matmul_sparse_input(
                self._scaled(inputs), self.indices, self.kernel,
                inverted_index=self._kept_inverted_index())
        else:
            if isinstance(inputs, tf.SparseTensor):  # other dtypes: densify
                inputs = tf.sparse.to_dense(tf.sparse.reorder(inputs))
            if fused:  # training: the kernel steps in the backward
                return self.activation(self._fused_call(inputs))
            outputs = uniform_sparse_matmul(
                self._scaled(inputs), self.indices,
                keras.ops.cast(self.kernel, inputs.dtype))
        if self.bias is not None:
            outputs = outputs + keras.ops.cast(self.bias, outputs.dtype)
        return self.activation(outputs)

    def fused_state_variables(self) -> list:
        """The state of the ``fused_update`` rule per weight (``[m, s]`` each:
        the Kahan compensation, Adam's moments), in the op's order; empty
        without a fused update or before ``build``."""
        return list(getattr(self, "_fused_state", []))

    def _fused_call(self, inputs):
        """The logits (bias added), whose gradient steps the kernel in place
        (``fused_update``): ``tf.custom_gradient`` around the forward op,
        whose backward is ``Xmc>UniformSparseGradApply`` (the features
        gradient, and the kernel's step) and the bias' gradient."""
        replica = tf.distribute.get_replica_context()
        if replica is not None and replica.num_replicas_in_sync > 1:
            raise ValueError(
                f"{self.name}: fused_update steps each replica's own copy of "
                "the kernel; train it without fused_update under a "
                "strategy with several replicas")
        rule, kernel, step = self.fused_update, self.kernel, self._fused_step
        state = self._fused_state
        dtype = kernel.dtype
        kahan = rule.uses_kahan(dtype)
        x = keras.ops.cast(self._scaled(inputs), dtype)
        out_dtype = inputs.dtype
        # The bias is read here, outside the custom gradient: the tape
        # records the read, and the gradient reaches the variable.
        bias = () if self.bias is None else (tf.convert_to_tensor(self.bias),)

        @tf.custom_gradient
        def scores_of(x, *bias):
            scores = uniform_sparse_matmul(x, self.indices, kernel)
            if bias:
                scores = scores + tf.cast(bias[0], scores.dtype)

            def grad(dy):
                count = step.assign_add(1)
                alpha = rule.step_size(tf.convert_to_tensor(count))
                gx = uniform_sparse_grad_apply(
                    tf.cast(dy, dtype), x, self.indices, kernel, state, alpha,
                    rule=rule.rule, kahan=kahan, beta_1=rule.beta_1,
                    beta_2=rule.beta_2, epsilon=rule.epsilon, lazy=rule.lazy)
                if not bias:
                    return gx
                gb = tf.cast(tf.reduce_sum(tf.cast(dy, tf.float32), 0),
                             bias[0].dtype)
                return gx, gb
            return scores, grad

        return keras.ops.cast(scores_of(x, *bias), out_dtype)

    def _kept_inverted_index(self):
        """The inverted index of ``indices`` (``uniform_sparse_inverted_index``),
        kept between calls; None where it is not kept (a portable export's
        stock formulation, :func:`per_call_inverted_index`, or a first call
        in a replica context).

        Kept in three variables outside the layer's Keras weights (not in
        ``get_weights``, ``model.keras`` or an exported SavedModel): the
        ``indices`` the index was built from, its ``offsets`` and
        ``entries``.  Every call compares ``indices`` with the first
        (``m s`` int32 compares: a cost of ``8 m s`` bytes read, against a
        sort of the ``m s`` connections) and rebuilds the index when they
        differ (a SET rewire, ``set_weights``, a load, an assign by the
        user), so the index always matches ``indices``; a rebuild range-checks
        the indices as the op does.  The variables are created on the first
        sparse float32 call (at most ``(D + 1) * 8 + 8 m s`` bytes)."""
        from xmc_tf.ops import stock
        if stock.stock_formulations() or getattr(_PER_CALL, "on", False):
            return None
        cache = getattr(self, "_inverted_cache", None)
        if cache is None:
            if (tf.distribute.has_strategy()
                    and not tf.distribute.in_cross_replica_context()):
                return None
            cache = self._make_inverted_cache()
        built_from, offsets, entries = cache
        indices = tf.convert_to_tensor(self.indices)

        def kept():
            return (tf.convert_to_tensor(offsets),
                    tf.convert_to_tensor(entries))

        def rebuild():
            new_offsets, new_entries = uniform_sparse_inverted_index(
                indices, self.num_features)
            with tf.control_dependencies([
                    built_from.assign(indices), offsets.assign(new_offsets),
                    entries.assign(new_entries)]):
                return tf.identity(new_offsets), tf.identity(new_entries)

        return tf.cond(tf.reduce_all(tf.equal(indices, built_from)), kept,
                       rebuild)

    def _make_inverted_cache(self):
        """Creates the three variables of :meth:`_kept_inverted_index` (the
        first marked stale: all -1, so the first call builds the index)."""
        m, s = self.units, self.connections_per_label
        narrow = m * s <= np.iinfo(np.int32).max
        only_first = tf.VariableAggregation.ONLY_FIRST_REPLICA
        with tf.init_scope():
            cache = (
                tf.Variable(tf.fill([m, s], -1), trainable=False,
                            name="inverted_built_from",
                            aggregation=only_first),
                tf.Variable(tf.zeros([self.num_features + 1], tf.int64),
                            trainable=False, name="inverted_offsets",
                            aggregation=only_first),
                tf.Variable(tf.zeros([m * s],
                                     tf.int32 if narrow else tf.int64),
                            trainable=False, name="inverted_entries",
                            aggregation=only_first))
        # Outside Keras' tracking (not a layer weight): a plain attribute.
        object.__setattr__(self, "_inverted_cache", cache)
        return cache

    def _scaled(self, inputs):
        """``kernel_scale * inputs`` (the same products as scaling the
        kernel, without a copy of it)."""
        if self.kernel_scale == 1.0:
            return inputs
        if isinstance(inputs, tf.SparseTensor):
            return inputs.with_values(
                inputs.values * tf.cast(self.kernel_scale, inputs.dtype))
        return inputs * keras.ops.cast(self.kernel_scale, inputs.dtype)

    def score_candidates(self, inputs, candidates):
        """Logits of per-instance candidate labels (no activation).

        ``scores[i, j] = sum_k inputs[i, indices[r, k]] * kernel[r, k] +
        bias[r]`` with ``r = candidates[i, j]``: equal to
        ``tf.gather(logits, candidates, batch_dims=1)`` of the full layer at
        ``O(batch * num_candidates * s)`` cost, without the
        ``[batch, units]`` logits (op ``Xmc>UniformSparseSampledMatmul``,
        :func:`xmc_tf.ops.uniform_sparse_sampled_matmul`, plus the gathered
        bias).  The kernel variable is read in place and the bias row by row,
        never copied whole (unless the inputs' dtype differs from the
        kernel's: mixed precision casts the kernel).  The gradients w.r.t.
        ``kernel`` and ``bias`` are
        ``tf.IndexedSlices`` over the flattened candidates, so an optimizer
        updates only the scored label rows.  Used by sampled training (ASTRA,
        Mehta et al., Algorithm 1: positives plus sampled negatives).

        Args:
          inputs: ``[batch, num_features]`` float, or a float32
            ``tf.SparseTensor`` of that shape (a linear model on sparse
            features: the wide path, the label centroids; inference only,
            no gradient).
          candidates: int32 ``[batch, num_candidates]`` label ids in
            ``[0, units)``, repeats allowed.

        Returns:
          ``[batch, num_candidates]`` logits, dtype of ``inputs``.

        Raises:
          ValueError: the layer is not built (call it once first).
          tf.errors.InvalidArgumentError: a candidate is out of range, or the
            shapes disagree (the message names the entry).

        >>> import keras, numpy as np, xmc_tf
        >>> layer = xmc_tf.layers.UniformSparseDense(1000, 8, seed=0)
        >>> x = keras.ops.ones((2, 64))
        >>> _ = layer(x)
        >>> layer.score_candidates(x, np.array([[5, 9], [0, 5]], np.int32)).shape
        TensorShape([2, 2])
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built: call the layer on an "
                             "input (or build it) before score_candidates")
        if isinstance(inputs, tf.SparseTensor):
            return self._sparse_candidates(inputs, candidates)
        inputs = self._scaled(tf.convert_to_tensor(inputs))
        candidates = tf.convert_to_tensor(candidates, tf.int32)
        kernel = self.kernel
        if kernel.dtype != inputs.dtype:  # mixed precision: a full cast copy
            kernel = keras.ops.cast(kernel, inputs.dtype)
        # A variable kernel is read in place (no copy of the whole [m, s]
        # kernel, which the sparse updates put in copy-on-read mode).
        scores = uniform_sparse_sampled_matmul(inputs, self.indices, kernel,
                                               candidates)
        if self.bias is not None:
            # A bad candidate fails the op, so this gather needs no check.
            scores = scores + gather_label_rows(self.bias, candidates,
                                                scores.dtype)
        return scores

    def _sparse_candidates(self, inputs, candidates):
        """:meth:`score_candidates` of a sparse batch (op
        ``Xmc>SparseInputSampledMatmul``,
        :func:`xmc_tf.ops.sparse_candidates.sparse_input_sampled_matmul`:
        each row scattered into a scratch of ``num_features`` floats, its
        candidates' connections read there; repeated entries add up; no
        ``[batch, num_features]`` batch; inference only, no gradient)."""
        candidates = check_candidates(
            tf.convert_to_tensor(candidates, tf.int32), self.units)
        kernel = keras.ops.convert_to_tensor(self.kernel)
        scores = sparse_input_sampled_matmul(self._scaled(inputs),
                                             self.indices, kernel, candidates)
        if self.bias is not None:
            scores += gather_label_rows(self.bias, candidates, scores.dtype)
        return scores

    def score_shared(self, inputs, candidates):
        """Logits of one candidate set scored by every row (no activation).

        ``scores[i, j] = sum_k inputs[i, indices[c_j, k]] * kernel[c_j, k] +
        bias[c_j]`` with ``c_j = candidates[j]``: the ``C`` candidate rows
        of ``indices`` and ``kernel`` are gathered (``ResourceGather``) into
        a ``C``-label uniform-sparse layer scored by
        ``Xmc>UniformSparseMatmul`` (:func:`xmc_tf.ops.uniform_sparse_matmul`,
        cost ``O(batch * C * s)``).  The kernel and bias gradients are
        ``tf.IndexedSlices`` over the candidates.  Used by sampled training
        with shared candidates
        (:meth:`xmc_tf.samplers.NegativeSampler.sample_shared`).

        Args:
          inputs: ``[batch, num_features]`` float.
          candidates: integer ``[C]`` label ids in ``[0, units)``.

        Returns:
          ``[batch, C]`` logits, dtype of ``inputs``.

        Raises:
          ValueError: the layer is not built.
          tf.errors.InvalidArgumentError: a candidate is out of range.

        >>> import keras, numpy as np, xmc_tf
        >>> layer = xmc_tf.layers.UniformSparseDense(1000, 8, seed=0)
        >>> x = keras.ops.ones((2, 64))
        >>> _ = layer(x)
        >>> layer.score_shared(x, np.array([5, 9, 0], np.int32)).shape
        TensorShape([2, 3])
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built: call the layer on an "
                             "input (or build it) before score_shared")
        inputs = self._scaled(tf.convert_to_tensor(inputs))
        ids = check_shared_candidates(candidates, self.units)
        indices = gather_label_rows(self.indices, ids)  # [C, s]
        weights = gather_label_rows(self.kernel, ids, inputs.dtype)
        scores = uniform_sparse_matmul(inputs, indices, weights)
        if self.bias is not None:
            scores += gather_label_rows(self.bias, ids, scores.dtype)[None, :]
        return scores

    @property
    def num_labels(self) -> int:
        """m, the number of labels (``units``):
        :class:`~xmc_tf.layers.scorer.LabelScorer`."""
        return self.units

    def label_layout(self) -> LabelLayout:
        """Sparse connections: ``indices``/``kernel [units, s]`` into
        ``num_features`` inputs, ``bias``.

        Raises:
          ValueError: the layer is not built.
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built")
        return LabelLayout(kernel=self.kernel, bias=self.bias,
                           input_dim=int(self.num_features),
                           indices=self.indices)

    def label_vectors(self, include_bias=False):
        """The labels' connections scattered into dense vectors.

        Args:
          include_bias: append the bias as a last column (pair it with
            queries ``[x, 1]`` so that the inner product is the logit).

        Returns:
          NumPy float32 ``[units, num_features]`` (``+ 1`` column with
          ``include_bias`` and a bias): row ``l`` holds ``kernel[l, k]`` at
          ``indices[l, k]`` (``kernel_scale`` not applied).

        Raises:
          ValueError: the layer is not built.

        >>> import keras, xmc_tf
        >>> layer = xmc_tf.layers.UniformSparseDense(3, 2, seed=0)
        >>> _ = layer(keras.ops.ones((1, 5)))
        >>> v = layer.label_vectors(include_bias=True)
        >>> v.shape, int((v[:, :5] != 0).sum(axis=1).max()) <= 2
        ((3, 6), True)
        """
        if not self.built:
            raise ValueError(f"{self.name} is not built")
        has_bias = include_bias and self.bias is not None
        out = np.zeros((self.units, self.num_features + int(has_bias)),
                       np.float32)
        scatter_label_rows(keras.ops.convert_to_numpy(self.indices),
                           keras.ops.convert_to_numpy(self.kernel),
                           self.num_features, out=out)
        if has_bias:
            out[:, -1] = keras.ops.convert_to_numpy(self.bias)
        return out

    def compute_output_shape(self, input_shape):
        return (input_shape[0], self.units)

    def get_config(self):
        config = super().get_config()
        config.update({
            "units": self.units,
            "connections_per_label": self.connections_per_label,
            "activation": keras.activations.serialize(self.activation),
            "use_bias": self.use_bias,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "bias_initializer": keras.initializers.serialize(self.bias_initializer),
            "kernel_regularizer": keras.regularizers.serialize(self.kernel_regularizer),
            "bias_regularizer": keras.regularizers.serialize(self.bias_regularizer),
            "kernel_constraint": keras.constraints.serialize(self.kernel_constraint),
            "bias_constraint": keras.constraints.serialize(self.bias_constraint),
            "seed": self.seed,
            "kernel_scale": self.kernel_scale,
        })
        if self.fused_update is not None:
            config["fused_update"] = self.fused_update.get_config()
        return config
