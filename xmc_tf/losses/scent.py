"""SCENT: the full softmax cross-entropy optimised with per-instance dual variables.

Extreme multi-class training (Section 6.3 of ``scent-extreme-multiclass``,
"Extreme Multi-class Classification", Algorithm 26 "SCENT for solving XMC").
The softmax cross-entropy of instance ``i`` with logits ``s_ij = w_j^T h(x_i)``
is rewritten with a dual variable ``nu_i`` per instance::

    min_W min_nu (1/n) sum_i { (1/K) sum_j exp(s_ij - s_i,y_i - nu_i) + nu_i - 1 }

(at the inner optimum ``nu_i = log (1/K) sum_j exp(s_ij - s_i,y_i)`` the
bracket equals the cross-entropy minus ``log K``).  Each step samples a batch
``B_t``, approximates the inner mean over all ``K`` classes by the labels of
the *other* instances of the batch (the multiset ``Y_t \\ y_i``, size
``|B_t| - 1``), so only the batch's classes ``C_t`` are scored, and

1. updates ``nu_i`` for ``i`` in ``B_t`` by the closed-form stochastic
   proximal step with the Bregman divergence of ``exp(-nu)`` (Lemma 5.26 as
   quoted in Sec. 6.3)::

       nu_i,t = nu_i,t-1 + log(1 + alpha S_i) - log(1 + alpha exp(nu_i,t-1)),
       S_i    = 1/(|Y_t| - 1) sum_{j in Y_t \\ y_i} exp(R_ij),
       R_ij   = s_ij - s_i,y_i                    (shifted logits)

   computed in the log domain (``log(1 + exp(x))`` as a softplus, the sum as
   a log-sum-exp shifted by its maximum: the paper's two stabilisations);
2. differentiates the batch loss
   ``L_t = 1/|B_t| sum_i S_i exp(-nu_i,t)`` (``nu_i,t`` held fixed) w.r.t.
   the weights; the gradient lives on the rows ``W[C_t]`` only, which the
   row-sparse momentum step of :class:`xmc_tf.optimizers.LazySGD`
   (``momentum = dampening = 1 - beta``) updates as Algorithm 26 does.

``variant="sox"`` is SOX (Sec. 6.3, "Empirical Comparison", (i)): the same
step with ``alpha_i,t = gamma exp(-nu_i,t-1)`` (``alpha`` plays ``gamma``),
i.e. ``exp(nu_i,t) = (exp(nu_i,t-1) + gamma S_i) / (1 + gamma)``, a moving
average of ``S_i`` with weight ``gamma / (1 + gamma)`` -- LibAUC's
``EntLossClassification(is_scent=False, gamma=g)`` is this with
``g = gamma / (1 + gamma)``.

First visit: an instance's ``nu_i`` is set to ``log S_i``, the exact
minimiser of its batch objective (LibAUC's ``EntLossClassification``
initialises on the first visit the same way); a visit counter per instance
records which ones have been seen.  ``nu`` (float32 ``[num_examples]``) and
``visits`` (int32 ``[num_examples]``) are non-trainable variables of this
layer: a model that tracks the loss (:class:`xmc_tf.models.ScentTrainer`)
saves and restores them with its weights, so a resumed run continues with
the same duals.  Like LibAUC, they are placed on the CPU.

Choices beyond the paper, all off by default except where stated:

* ``negatives="unique"``: the inner mean over the *set* ``C_t \\ {y_i}``
  (each other class once, divided by ``|C_t| - 1``), as the LibAUC example
  code does, instead of the paper's multiset.
* ``correction="log_q"``: in-batch labels are drawn with the label
  frequencies ``q_j``, not uniformly, so ``S_i`` estimates
  ``sum_j q_j exp(R_ij)`` and the optimum of the paper's objective favours
  rare labels (``s_ij = log p(j|x) - log q_j + const``).  With the training
  label counts, ``log_q`` weights every other instance's label by
  ``1 / (K q_j)`` (importance weighting), which makes ``S_i`` an unbiased
  estimate of ``(1/K) sum_j exp(R_ij)`` for the multiset estimator.
* ``own_term=True`` (on in configs/scent.py): the row's own class enters
  the inner mean, as it does in the full objective (``j = y_i`` contributes
  ``exp(0) = 1``).  With ``"log_q"`` the exact term ``1/K`` is added to the
  estimate of ``(1/K) sum_{j != y_i} exp(R_ij)``; with ``"none"`` the own
  label joins the in-batch mean (``(1 + |Y_t \\ y_i| S_i) / |Y_t|``).  The
  paper's estimator leaves it out, which makes the batch objective
  unbounded below: minimising ``log S_i`` grows every margin without limit.
  Measured on ManNextWord (400k instances, batch 256, log_q, alpha 1000,
  LazyAdam 1e-2): without the term the duals reached -4158 .. +1904 within
  the first epoch and the first revisit overflowed (``exp(log S - nu)``):
  loss NaN from epoch 2.  With it ``nu_i >= -log K`` (``"log_q"``) or
  ``>= -log |Y_t|`` (``"none"``), and the bracket at the optimum is exactly
  the cross-entropy minus ``log K`` in expectation.
* Rows without a label (all ``-1``) are skipped: no loss, no dual update,
  and they contribute no negatives.  A row whose estimator has no term
  (a batch with one labelled row; with ``"unique"``, every row of a batch
  with one distinct label) is skipped too.

Multi-label rows: SCENT is a multi-class method (one ``y_i`` per instance).
:func:`multiclass_labels` turns the pipeline's padded ``[b, n]`` label ids
into ``[b]`` and raises ``InvalidArgumentError`` for a row with more than one
label (the trainer calls it), rather than picking one silently.

Sources: ``scent-extreme-multiclass`` Sec. 6.3 (Algorithm 26, the closed-form
``nu`` update, its log-sum-exp stabilisation, SOX's step size); LibAUC
``EntLossClassification`` (first-visit initialisation, CPU-resident ``nu``).
"""

from __future__ import annotations

import math

import keras
import numpy as np
import tensorflow as tf

from xmc_tf.optimizers.rows import tf_variable

__all__ = ["ScentLoss", "multiclass_labels", "VARIANTS", "NEGATIVES",
           "CORRECTIONS"]

VARIANTS = ("scent", "sox")
NEGATIVES = ("multiset", "unique")
CORRECTIONS = ("none", "log_q")

# Log-weight of a column that is not a negative of a row: exp underflows to
# exactly 0 in float32 and, unlike -inf, gives no NaN gradient when a whole
# row is masked.
_MASKED = -1e9


def _log_add_exp(a, b):
    """``log(exp(a) + exp(b))`` without overflow (float32 tensors/scalars)."""
    a = tf.convert_to_tensor(a, tf.float32)
    b = tf.cast(b, tf.float32)
    top = tf.maximum(a, b)
    return top + tf.math.softplus(-tf.abs(a - b))


def multiclass_labels(label_ids) -> tf.Tensor:
    """The single label of each row, from padded label ids.

    Args:
      label_ids: int ``[b, n]`` label ids padded with ``-1`` (what
        :func:`xmc_tf.data.make_tf_dataset` yields), or ``[b]``.

    Returns:
      int64 ``[b]``: the row's label, ``-1`` for a row without one.

    Raises:
      tf.errors.InvalidArgumentError: a row has more than one label (SCENT
        is a multi-class method).
      ValueError: static rank other than 1 or 2.

    >>> multiclass_labels(tf.constant([[3, -1], [-1, -1]])).numpy().tolist()
    [3, -1]
    """
    y = tf.convert_to_tensor(label_ids)
    if not y.dtype.is_integer:
        raise TypeError(f"label ids must be integer, got {y.dtype}")
    y = tf.cast(y, tf.int64)
    if y.shape.rank == 1:
        return y
    if y.shape.rank != 2:
        raise ValueError(f"label ids must have rank 1 or 2, got shape {y.shape}")
    count = tf.reduce_sum(tf.cast(y >= 0, tf.int32), axis=1)
    check = tf.debugging.assert_less_equal(
        count, 1, message="SCENT is multi-class: a row has more than one "
        "label (its label ids have several entries >= 0)")
    with tf.control_dependencies([check]):
        return tf.reduce_max(y, axis=1)  # the label, or -1


@keras.saving.register_keras_serializable(package="xmc_tf")
class ScentLoss(keras.layers.Layer):
    """SCENT / SOX loss over in-batch classes with per-instance duals ``nu``.

    See :mod:`xmc_tf.losses.scent` for the algorithm.  A ``keras.layers.Layer``
    (not a ``keras.losses.Loss``) because it owns state -- ``nu`` and the
    visit counts -- that must be saved with the model and updated inside the
    train step.

    Call::

        loss(scores, labels, column_labels, example_ids, training=True)

    * ``scores``: float ``[b, U]``, logits of every row for the ``U`` classes
      ``column_labels`` (the batch's classes ``C_t``; each row's own label
      must be among them).
    * ``labels``: int ``[b]``, each row's class, ``-1`` for no label (see
      :func:`multiclass_labels`).
    * ``column_labels``: int ``[U]``, distinct class ids in
      ``[0, num_labels)``.
    * ``example_ids``: int ``[b]`` row numbers in ``[0, num_examples)``
      (``make_tf_dataset(..., with_example_ids=True)``); repeats allowed
      (equal rows compute equal duals).  Not needed when ``training`` is
      False.

    With ``training=True`` it updates ``nu``/``visits`` of the batch's rows
    and returns the batch objective ``mean_i [S_i exp(-nu_i,t) + nu_i,t - 1]``
    over the rows it used (whose gradient w.r.t. the scores is that of the
    paper's ``L_t``: ``nu_i,t`` is a constant there).  With ``training=False``
    nothing changes and it returns ``mean_i log S_i``, the same objective at
    the batch-optimal ``nu`` (a validation loss).  0 when no row is usable.

    Args:
      num_examples: n, number of training instances (size of ``nu``).
      alpha: the dual step ``alpha_t`` (> 0, constant); for ``"sox"`` the
        ``gamma`` of ``alpha_i,t = gamma exp(-nu_i,t-1)``.  The step sets
        ``exp(nu_t) = (1 - r) exp(nu_t-1) + r S_i`` with
        ``r = a / (1 + a)``, ``a = alpha exp(nu_t-1)``: as ``exp(nu)``
        shrinks while the model fits, the same alpha moves ``nu`` less.
        Large ``a`` makes ``nu_i`` the minimiser of the current batch (the
        cross-entropy over in-batch classes); small ``a`` averages ``S_i``
        over visits (one per epoch).  LibAUC's default is e^10.
      variant: ``"scent"`` or ``"sox"``.
      negatives: ``"multiset"`` (paper) or ``"unique"`` (see module doc).
      correction: ``"none"`` (paper) or ``"log_q"`` (needs
        ``label_counts`` and ``negatives="multiset"``).
      num_labels: K; required with ``correction="log_q"`` (else only used
        to range-check ``column_labels`` when given).
      label_counts: ``[num_labels]`` training counts of each class, for
        ``"log_q"`` (kept as the non-trainable variable ``log_weight``).
      own_term: add the row's own class to the inner mean (see the module
        docstring; False = the paper's in-batch estimator).
      **kwargs: ``keras.layers.Layer`` arguments (``name``...).

    Attributes:
      nu: float32 ``[num_examples]`` variable (0 before the first visit).
      visits: int32 ``[num_examples]`` variable, dual updates per instance.

    Raises:
      ValueError: ``num_examples < 1``, ``alpha`` not a finite positive
        number, unknown ``variant``/``negatives``/``correction``,
        ``"log_q"`` without ``num_labels``/``label_counts`` or with
        ``"unique"``, ``label_counts`` of the wrong length or negative.
      tf.errors.InvalidArgumentError: (at call) an example id outside
        ``[0, num_examples)``, a label with no column, in training a class
        with a zero count under ``"log_q"`` (in validation it is weighted
        as a class counted once), duplicate or out-of-range column labels, or
        inconsistent shapes.
      TypeError: (at call) non-integer labels or ids.

    Example:
      >>> loss = ScentLoss(num_examples=4, alpha=1.0)
      >>> scores = tf.constant([[0., 1.], [0., 1.], [0., 1.]])
      >>> obj = loss(scores, tf.constant([0, 1, 1]), tf.constant([0, 1]),
      ...            tf.constant([0, 1, 2]), training=True)
      >>> loss.visits.numpy().tolist()          # rows 0-2 visited once
      [1, 1, 1, 0]
      >>> # first visit: nu = log S; row 0 sees labels {1, 1}: S = e
      >>> round(float(loss.nu.numpy()[0]), 4)
      1.0
    """

    def __init__(self, num_examples, alpha=1.0, variant="scent",
                 negatives="multiset", correction="none", num_labels=None,
                 label_counts=None, own_term=False, **kwargs):
        kwargs.setdefault("name", "scent_loss")
        super().__init__(**kwargs)
        num_examples = int(num_examples)
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")
        alpha = float(alpha)
        if not (math.isfinite(alpha) and alpha > 0):
            raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
        if variant not in VARIANTS:
            raise ValueError(f"variant={variant!r}; expected one of {VARIANTS}")
        if negatives not in NEGATIVES:
            raise ValueError(f"negatives={negatives!r}; expected one of "
                             f"{NEGATIVES}")
        if correction not in CORRECTIONS:
            raise ValueError(f"correction={correction!r}; expected one of "
                             f"{CORRECTIONS}")
        if num_labels is not None:
            num_labels = int(num_labels)
            if num_labels < 1:
                raise ValueError(f"num_labels must be >= 1, got {num_labels}")
        if correction == "log_q":
            if negatives != "multiset":
                raise ValueError("correction='log_q' weights the multiset "
                                 "estimator; use negatives='multiset'")
            if num_labels is None:
                raise ValueError("correction='log_q' needs num_labels")
        self.num_examples = num_examples
        self.alpha = alpha
        self.variant = variant
        self.negatives = negatives
        self.correction = correction
        self.num_labels = num_labels
        self.own_term = bool(own_term)

        log_weight = None
        if correction == "log_q":
            log_weight = np.zeros(num_labels, np.float32)
            if label_counts is not None:
                counts = np.asarray(label_counts, np.float64).reshape(-1)
                if counts.shape[0] != num_labels:
                    raise ValueError(f"label_counts has {counts.shape[0]} "
                                     f"entries, num_labels is {num_labels}")
                if (counts < 0).any() or counts.sum() <= 0:
                    raise ValueError("label_counts must be >= 0 with a "
                                     "positive sum")
                with np.errstate(divide="ignore"):
                    # log weight -log(K q_j), q_j = count_j / total.
                    lw = (np.log(counts.sum()) - math.log(num_labels) -
                          np.log(counts))
                # count 0: +inf, rejected at call if such a class is drawn.
                log_weight = lw.astype(np.float32)
            # without label_counts: zeros until saved weights are loaded
        elif label_counts is not None:
            raise ValueError("label_counts is only used with "
                             "correction='log_q'")

        with tf.device("/CPU:0"):  # as LibAUC: the duals live in host memory
            self.nu = self.add_weight(
                name="nu", shape=(num_examples,), dtype="float32",
                initializer="zeros", trainable=False)
            self.visits = self.add_weight(
                name="visits", shape=(num_examples,), dtype="int32",
                initializer="zeros", trainable=False)
        self.log_weight = None
        if log_weight is not None:
            self.log_weight = self.add_weight(
                name="log_weight", shape=(num_labels,), dtype="float32",
                initializer=keras.initializers.Constant(log_weight),
                trainable=False)
        self.built = True

    #: The settings :meth:`from_labels` uses: those of the CLI's ``scent``
    #: config, measured on ManNextWord (docs/notes/scent.md, docs/notes/defaults.md;
    #: xmc_tf.config.HEAD_DEFAULTS["scent"] holds the same values, checked
    #: by a test).
    MEASURED_DEFAULTS = {"alpha": 1000.0, "variant": "scent",
                         "negatives": "multiset", "correction": "log_q",
                         "own_term": True}

    @classmethod
    def from_labels(cls, labels, num_labels=None, **overrides):
        """The SCENT loss for a training set, with the measured settings.

        ``num_examples`` is the number of rows of ``labels``, and the
        ``log_q`` correction reads each class's training count; the other
        settings are :attr:`MEASURED_DEFAULTS` (dual step 1000, the own
        class in the inner mean: without it the paper's estimator diverged
        on ManNextWord's 400k instances), each replaceable by a keyword.

        Args:
          labels: the training labels, one class per row: int ``[n]`` class
            ids, ``[n, w]`` ids padded with -1, a scipy CSR ``[n, K]``
            matrix or lists of ids (rows without a label are allowed).
          num_labels: K (default: the matrix width, else the largest id + 1).
          **overrides: any :class:`ScentLoss` argument.

        Returns:
          A :class:`ScentLoss`.

        Raises:
          ValueError: a row with more than one label (its index is named),
            an id ``>= num_labels``, or an invalid override.

        >>> loss = ScentLoss.from_labels(np.array([0, 2, 2, 1]))
        >>> loss.num_examples, loss.num_labels, loss.alpha, loss.own_term
        (4, 3, 1000.0, True)
        """
        from xmc_tf.data.labels import label_matrix
        y = label_matrix(labels, num_labels)
        per_row = np.diff(y.indptr)
        multi = np.flatnonzero(per_row > 1)
        if multi.size:
            raise ValueError(
                f"SCENT is multi-class but {multi.size} of {y.shape[0]} "
                f"training rows have more than one label (first: row "
                f"{int(multi[0])}); use a multi-label trainer "
                "(xmc_tf.models.SampledTrainer)")
        settings = dict(cls.MEASURED_DEFAULTS)
        settings.update(overrides)
        if settings["correction"] == "log_q":
            settings.setdefault("label_counts",
                                np.bincount(y.indices, minlength=y.shape[1]))
        return cls(y.shape[0], num_labels=y.shape[1], **settings)

    # -- the batch estimator ---------------------------------------------------

    def log_inner(self, scores, labels, column_labels, training=True):
        """``log S_i`` of every row and which rows are usable.

        Args:
          scores, labels, column_labels: as in the class docstring.
          training: with ``correction="log_q"``, a class of count 0 in
            ``label_counts`` is an error (the counts do not describe the
            training batches).  With ``training=False`` (validation batches
            from held-out data, whose classes may be absent from training)
            such a class gets the weight of a class counted once, the
            largest finite weight.

        Returns:
          ``(log_s, active)``: float32 ``[b]`` (arbitrary where not active)
          and bool ``[b]`` (labelled rows whose estimator has a term).

        Raises:
          tf.errors.InvalidArgumentError: see the class docstring.
        """
        scores = tf.convert_to_tensor(scores)
        if not scores.dtype.is_floating:
            raise TypeError(f"scores must be float, got {scores.dtype}")
        scores = tf.cast(scores, tf.float32)
        labels = self._ints(labels, "labels")
        columns = self._ints(column_labels, "column_labels")
        if scores.shape.rank not in (None, 2):
            raise ValueError(f"scores must have rank 2, got {scores.shape}")
        checks = [
            tf.debugging.assert_equal(
                tf.shape(scores), tf.stack([tf.size(labels), tf.size(columns)]),
                message="scores must be [len(labels), len(column_labels)]"),
            tf.debugging.assert_non_negative(
                columns, message="column_labels must be >= 0"),
            tf.debugging.assert_equal(
                tf.size(tf.unique(columns)[0]), tf.size(columns),
                message="column_labels must be distinct"),
        ]
        if self.num_labels is not None:
            checks.append(tf.debugging.assert_less(
                columns, tf.constant(self.num_labels, tf.int64),
                message=f"column_labels must be < num_labels = "
                        f"{self.num_labels}"))
        valid = labels >= 0
        match = tf.equal(labels[:, None], columns[None, :])        # [b, U]
        checks.append(tf.debugging.assert_equal(
            tf.reduce_sum(tf.cast(match, tf.int32), axis=1),
            tf.cast(valid, tf.int32),
            message="every labelled row's label must be one of column_labels"))
        with tf.control_dependencies(checks):
            own = tf.cast(match, tf.float32)
        counts = tf.reduce_sum(own, axis=0)                          # c_j
        if self.negatives == "multiset":
            weight = counts[None, :] - own
            denom = tf.reduce_sum(tf.cast(valid, tf.float32)) - 1.0
        else:
            present = tf.cast(counts > 0, tf.float32)
            weight = present[None, :] - own
            denom = tf.reduce_sum(present) - 1.0
        is_neg = weight > 0
        log_w = tf.where(is_neg, tf.math.log(tf.maximum(weight, 1.0)), _MASKED)
        if self.log_weight is not None:
            table = tf.convert_to_tensor(self.log_weight)
            lq = tf.gather(table, columns)
            if training:
                used = tf.reduce_any(is_neg, axis=0)
                check = tf.debugging.assert_equal(
                    tf.logical_or(tf.math.is_finite(lq), tf.logical_not(used)),
                    True, message="correction='log_q': a class of the batch "
                    "has count 0 in label_counts")
                with tf.control_dependencies([check]):
                    lq = tf.identity(lq)
            else:
                finite = tf.math.is_finite(table)
                cap = tf.reduce_max(tf.where(finite, table, -np.inf))
                lq = tf.where(tf.math.is_finite(lq), lq, cap)
            log_w = tf.where(is_neg, log_w + lq, _MASKED)
        pos = tf.reduce_sum(tf.where(match, scores, 0.0), axis=1)    # s_i,y_i
        shifted = scores - pos[:, None]                              # R_ij
        # log((1/denom) sum_j w_ij exp(R_ij)), shifted by the row maximum.
        log_sum = tf.reduce_logsumexp(shifted + log_w, axis=1)
        count = tf.maximum(denom, 1.0)
        log_s = log_sum - tf.math.log(count)
        if self.own_term:
            if self.log_weight is not None:  # + exp(0) / K, exactly
                log_s = _log_add_exp(log_s, -math.log(self.num_labels))
            else:  # the own label (exp(0)) joins the multiset / set mean
                log_s = _log_add_exp(log_sum, 0.0) - tf.math.log(count + 1.0)
        active = tf.logical_and(
            valid, tf.logical_and(tf.reduce_any(is_neg, axis=1), denom > 0))
        return log_s, active

    def dual_update(self, log_s, nu_old, first_visit):
        """One closed-form dual step (no state change).

        Args:
          log_s: float32 ``[b]``, ``log S_i``.
          nu_old: float32 ``[b]``, ``nu_i,t-1``.
          first_visit: bool ``[b]``: those rows get ``log S_i``.

        Returns:
          float32 ``[b]``, ``nu_i,t``.
        """
        if self.variant == "scent":
            log_a = tf.constant(math.log(self.alpha), tf.float32)
            nu = (nu_old + tf.math.softplus(log_a + log_s) -
                  tf.math.softplus(log_a + nu_old))
        else:  # sox: alpha_i = gamma exp(-nu_old)
            log_g = tf.constant(math.log(self.alpha), tf.float32)
            nu = (nu_old + tf.math.softplus(log_g - nu_old + log_s) -
                  tf.math.softplus(log_g))
        return tf.where(first_visit, log_s, nu)

    def __call__(self, scores, labels, column_labels=None, example_ids=None,
                 training=False):
        """The loss; arguments as in the class docstring.

        Raises:
          ValueError: called without ``column_labels``, as
            ``model.compile(loss=ScentLoss(...))`` calls a loss
            (``loss(y_true, y_pred)``): SCENT trains through
            :class:`xmc_tf.models.ScentTrainer`.
        """
        if column_labels is None:
            raise ValueError(
                "ScentLoss updates per-instance duals from the batch's classes "
                "and cannot be the loss of model.compile (which passes only "
                "y_true and y_pred): train with xmc_tf.models.ScentTrainer("
                "model, loss=ScentLoss(...)) (or ScentTrainer(model) to size "
                "it from the data) and compile the trainer")
        # Keras layers take only tensors positionally: convert Python lists.
        scores, labels, column_labels = (
            tf.convert_to_tensor(t) for t in (scores, labels, column_labels))
        if example_ids is not None:
            example_ids = tf.convert_to_tensor(example_ids)
        return super().__call__(scores, labels, column_labels,
                                example_ids=example_ids, training=training)

    def call(self, scores, labels, column_labels, example_ids=None,
             training=False):
        log_s, active = self.log_inner(scores, labels, column_labels,
                                       training=training)
        num_active = tf.reduce_sum(tf.cast(active, tf.float32))
        if not training:
            return tf.math.divide_no_nan(
                tf.reduce_sum(tf.where(active, log_s, 0.0)), num_active)
        if example_ids is None:
            raise ValueError("ScentLoss needs example_ids in training (use "
                             "make_tf_dataset(..., with_example_ids=True))")
        ids = self._ints(example_ids, "example_ids")
        checks = [
            tf.debugging.assert_equal(
                tf.size(ids), tf.shape(log_s)[0],
                message="example_ids must have one entry per row"),
            tf.debugging.assert_non_negative(
                ids, message="example_ids must be >= 0"),
            tf.debugging.assert_less(
                ids, tf.constant(self.num_examples, tf.int64),
                message=f"example_ids must be < num_examples = "
                        f"{self.num_examples}"),
        ]
        with tf.control_dependencies(checks):
            ids = tf.identity(ids)
        nu_var, visits_var = tf_variable(self.nu), tf_variable(self.visits)
        nu_old = tf.gather(nu_var, ids)
        first = tf.equal(tf.gather(visits_var, ids), 0)
        nu_new = tf.stop_gradient(
            self.dual_update(tf.stop_gradient(log_s), nu_old, first))
        upd_ids = tf.boolean_mask(ids, active)
        upd_nu = tf.boolean_mask(nu_new, active)
        ctx = tf.distribute.get_replica_context()
        if ctx is not None and ctx.num_replicas_in_sync > 1:
            # Under tf.distribute each replica holds a copy of the duals
            # and sees its share of the batch: every copy takes every
            # replica's updates (distinct instances), so the copies agree.
            upd_ids = ctx.all_gather(upd_ids, axis=0)
            upd_nu = ctx.all_gather(upd_nu, axis=0)
        nu_var.scatter_update(tf.IndexedSlices(upd_nu, upd_ids))
        visits_var.scatter_add(tf.IndexedSlices(
            tf.ones_like(upd_ids, tf.int32), upd_ids))
        terms = tf.exp(log_s - nu_new) + nu_new - 1.0
        return tf.math.divide_no_nan(
            tf.reduce_sum(tf.where(active, terms, 0.0)), num_active)

    @staticmethod
    def _ints(x, what):
        x = tf.convert_to_tensor(x)
        if not x.dtype.is_integer:
            raise TypeError(f"{what} must be integer, got {x.dtype}")
        if x.shape.rank not in (None, 1):
            raise ValueError(f"{what} must have rank 1, got shape {x.shape}")
        return tf.cast(x, tf.int64)

    def compute_output_shape(self, *args, **kwargs):
        return ()

    def get_config(self):
        config = super().get_config()
        config.update({"num_examples": self.num_examples, "alpha": self.alpha,
                       "variant": self.variant, "negatives": self.negatives,
                       "correction": self.correction,
                       "num_labels": self.num_labels,
                       "own_term": self.own_term})
        return config
