"""Reusable baselines for the benchmark tables: what a TensorFlow user writes.

:class:`TFSampledSoftmaxTrainer` / :func:`train_sampled_softmax`: sampled
softmax with ``tf.nn.sampled_softmax_loss`` and its default log-uniform
(Zipfian) candidate sampler, in a small custom Keras ``train_step`` over a
label-major output layer (:class:`xmc_tf.layers.LabelDense`, whose
``[num_labels, d]`` kernel and ``[num_labels]`` bias are the ``weights`` /
``biases`` the TensorFlow function expects).  The sampled classes are shared
by the batch (TensorFlow draws ``num_sampled`` classes per call, without
replacement by default), the loss subtracts ``log Q`` of each class and
removes accidental hits with the row's own label.  The gradient w.r.t. the
kernel and bias is an ``IndexedSlices`` over the true and sampled rows
(``tf.nn.embedding_lookup``), so a row-sparse optimizer
(:class:`xmc_tf.optimizers.LazyAdam`) updates only those rows.

The log-uniform sampler assumes class ids sorted by decreasing frequency
(``P(c) = log((c + 2) / (c + 1)) / log(num_classes + 1)``); word-rank ids
(ManNextWord) roughly are.  Multi-label rows are expanded into one softmax
term per (instance, positive) pair, each weighted ``1 / |P_i|`` (the
normalisation of :class:`xmc_tf.losses.SoftmaxCrossentropy`); the row's
other positives may then be drawn as negatives of a pair (TensorFlow removes
only the pair's own class).

Source: Jean et al. 2015 (sampled softmax with log-Q correction), as
implemented by ``tf.nn.sampled_softmax_loss`` /
``tf.random.log_uniform_candidate_sampler``.
"""

from __future__ import annotations

import keras
import tensorflow as tf

__all__ = ["TFSampledSoftmaxTrainer", "train_sampled_softmax",
           "full_softmax_cross_entropy"]


class TFSampledSoftmaxTrainer(keras.Model):
    """Trains a model's label-major head with ``tf.nn.sampled_softmax_loss``.

    ``call`` is the wrapped model (full scores for prediction); the train
    step runs the model up to the head layer's input and applies the sampled
    softmax over ``num_sampled`` log-uniform classes shared by the batch.

    Args:
      model: functional ``keras.Model`` whose head layer (named ``"output"``,
        else the last layer) is a :class:`xmc_tf.layers.LabelDense`.
      num_sampled: classes drawn per step (shared by the batch).
      remove_accidental_hits: as ``tf.nn.sampled_softmax_loss``.
      seed: op seed of the sampler (``None``: nondeterministic).
      **kwargs: ``keras.Model`` arguments.

    Targets: int ``[b, n]`` label ids padded with ``-1``
    (:func:`xmc_tf.data.make_tf_dataset`); rows without labels add nothing.

    Raises:
      ValueError: the head is not a ``LabelDense`` or ``num_sampled < 1``.

    Example:
      >>> trainer = TFSampledSoftmaxTrainer(model, num_sampled=256)  # doctest: +SKIP
      >>> trainer.compile(xmc_tf.optimizers.LazyAdam(1e-3),
      ...                 jit_compile=False)                          # doctest: +SKIP
      >>> trainer.fit(make_tf_dataset(train, 256, shuffle=True))      # doctest: +SKIP
    """

    def __init__(self, model, num_sampled, remove_accidental_hits=True,
                 seed=None, **kwargs):
        super().__init__(**kwargs)
        from xmc_tf.decoding import scoring_layer
        from xmc_tf.layers import LabelDense
        self.inference_model = model
        self.head_layer = scoring_layer(model)
        if not isinstance(self.head_layer, LabelDense):
            raise ValueError("TFSampledSoftmaxTrainer needs a LabelDense head, "
                             f"got {type(self.head_layer).__name__}")
        if int(num_sampled) < 1:
            raise ValueError(f"num_sampled must be >= 1, got {num_sampled}")
        self.num_sampled = int(num_sampled)
        self.remove_accidental_hits = bool(remove_accidental_hits)
        self.seed = seed
        self.body = keras.Model(model.inputs, self.head_layer.input,
                                name=f"{model.name}_body")
        self.loss_tracker = keras.metrics.Mean(name="loss")
        self.built = True

    @property
    def metrics(self):
        return [self.loss_tracker]

    def call(self, inputs, training=False):
        return self.inference_model(inputs, training=training)

    def _loss(self, x, y, training):
        from xmc_tf.optimizers.rows import tf_variable
        y = tf.cast(y, tf.int64)
        if y.shape.rank == 1:
            y = y[:, None]
        queries = self.body(x, training=training)
        pairs = tf.where(y >= 0)                      # (row, slot)
        rows = pairs[:, 0]
        labels = tf.gather_nd(y, pairs)[:, None]
        per_row = tf.reduce_sum(tf.cast(y >= 0, tf.float32), axis=1)
        layer = self.head_layer
        m = layer.units
        bias = (tf_variable(layer.bias) if layer.bias is not None else
                tf.zeros([m], queries.dtype))
        sampled = tf.random.log_uniform_candidate_sampler(
            true_classes=labels, num_true=1, num_sampled=self.num_sampled,
            unique=True, range_max=m, seed=self.seed)
        losses = tf.nn.sampled_softmax_loss(
            weights=tf_variable(layer.kernel), biases=bias, labels=labels,
            inputs=tf.gather(queries, rows), num_sampled=self.num_sampled,
            num_classes=m, num_true=1, sampled_values=sampled,
            remove_accidental_hits=self.remove_accidental_hits)
        weights = 1.0 / tf.gather(per_row, rows)
        batch = tf.cast(tf.shape(y)[0], tf.float32)
        return tf.reduce_sum(losses * weights) / batch

    def train_step(self, data):
        x, y = data[0], data[1]
        with tf.GradientTape() as tape:
            loss = self._loss(x, y, training=True)
        variables = self.trainable_variables
        self.optimizer.apply(tape.gradient(loss, variables), variables)
        self.loss_tracker.update_state(loss)
        return {m.name: m.result() for m in self.metrics}

    def test_step(self, data):
        self.loss_tracker.update_state(self._loss(data[0], data[1], False))
        return {m.name: m.result() for m in self.metrics}


def train_sampled_softmax(model, dataset, *, num_sampled, optimizer, epochs=1,
                          seed=None, callbacks=(), verbose=0):
    """Fits ``model`` (LabelDense head) with ``tf.nn.sampled_softmax_loss``.

    Args:
      model: see :class:`TFSampledSoftmaxTrainer`.
      dataset: ``tf.data`` of ``(features, label_ids)`` batches (a third
        element is ignored).
      num_sampled: classes drawn per step.
      optimizer: a Keras optimizer (a row-sparse one keeps the step
        ``O((b + num_sampled) d)`` on the head).
      epochs, callbacks, verbose: as ``keras.Model.fit``.
      seed: sampler op seed.

    Returns:
      ``(trainer, history)``.
    """
    trainer = TFSampledSoftmaxTrainer(model, num_sampled, seed=seed)
    trainer.compile(optimizer=optimizer, jit_compile=False)
    dataset = dataset.map(lambda *t: (t[0], t[1]))
    history = trainer.fit(dataset, epochs=epochs, callbacks=list(callbacks),
                          verbose=verbose, shuffle=False)
    return trainer, history


def full_softmax_cross_entropy(logits, label_ids):
    """Per-row softmax cross-entropy over all labels (nats), multi-class.

    Args:
      logits: float ``[b, m]``.
      label_ids: int ``[b, n]`` padded with ``-1`` (first id used) or ``[b]``.

    Returns:
      float64 NumPy ``[b_labelled]``: ``logsumexp(logits) - logit[y]`` of
      the rows that have a label.
    """
    import numpy as np
    logits = tf.convert_to_tensor(logits)
    y = tf.cast(label_ids, tf.int64)
    if y.shape.rank == 2:
        y = y[:, 0]
    keep = y >= 0
    logits = tf.boolean_mask(logits, keep)
    y = tf.boolean_mask(y, keep)
    ce = tf.reduce_logsumexp(logits, axis=1) - tf.gather(logits, y,
                                                         batch_dims=1)
    return np.asarray(ce, np.float64)
