"""Candidate heads: train a full-scoring layer on a few scored labels per step.

The sampled head (:mod:`xmc_tf.job.heads.sampled`: positives + sampled
negatives) and the SCENT head (:mod:`xmc_tf.job.heads.scent`: the batch's own
classes) share everything but the choice of the scored labels and the loss:

* the head layer, ``config.model.sampled_layer``: ``"uniform_sparse"``
  (:class:`~xmc_tf.layers.UniformSparseDense`, fan-in
  ``config.model.connections_per_label``, SET rewiring when
  ``config.set.enabled``) or ``"dense"`` (:class:`~xmc_tf.layers.LabelDense`),
  both :class:`~xmc_tf.layers.scorer.LabelScorer` s with a zero initial
  bias;
* the training model, a :class:`CandidateTrainer` (``keras.Model``): it runs
  the model up to the head layer's input, lets the subclass choose and
  score labels through the layer's ``score_candidates`` / ``score_shared``
  and apply its loss (Keras passes a loss only ``(y_true, y_pred)``, which
  cannot express per-instance candidates), and logs ``loss`` and
  ``sampled_fraction``;
* evaluation: exact (the inference model scores every label and is decoded
  by the type of its scoring layer, :mod:`xmc_tf.decoding`), held-out
  P@k once per epoch by :class:`xmc_tf.callbacks.TopKEvaluation`.

A new candidate head is a subclass of :class:`CandidateHead` (with its
trainer, a subclass of :class:`CandidateTrainer` implementing
:meth:`CandidateTrainer.candidate_loss`) in its own module, registered with
:func:`xmc_tf.job.heads.register`.

Source: ASTRA (Mehta et al.), Algorithm 1; ``scent-extreme-multiclass``,
Algorithm 26.
"""

from __future__ import annotations

from typing import ClassVar


from xmc_tf.job.heads.base import OUTPUT_LAYER, Head
from xmc_tf.layers import LabelDense, UniformSparseDense
from xmc_tf.models.candidates import CandidateTrainer

__all__ = ["CandidateHead", "CandidateTrainer"]


class CandidateHead(Head):
    """Base of the heads trained through a :class:`CandidateTrainer`.

    Subclasses set :attr:`name`, :attr:`losses` and :attr:`sampled_layers`
    and implement :meth:`make_loss` and ``training_model``; they may add
    callbacks (:meth:`candidate_callbacks`) and ``metrics.json`` entries
    (``results``).  See the module docstring.

    Raises:
      ValueError: ``config.model.sampled_layer`` not in
        :attr:`sampled_layers`, or ``config.loss`` not in :attr:`losses`.
    """

    full_scores_in_training = False
    # The CandidateTrainer's sampler state (ANN index, LSH tables, SCENT's
    # per-instance duals) lives in each process, not in mirrored variables.
    data_parallel = False
    #: ``config.model.sampled_layer`` values.
    sampled_layers: ClassVar[tuple[str, ...]] = ("uniform_sparse", "dense")

    def check_config(self):
        super().check_config()
        self.check_sampled_layer()

    def check_sampled_layer(self) -> None:
        """Validates ``config.model.sampled_layer``.

        None (left to the data's regime, :func:`xmc_tf.config.by_regime`)
        passes: :func:`xmc_tf.job.checks.check_config` checks the values it
        resolves to.

        Raises:
          ValueError: not one of :attr:`sampled_layers` (nor None).
        """
        layer = self.config.model.sampled_layer
        if layer is not None and layer not in self.sampled_layers:
            raise ValueError(f"config.model.sampled_layer={layer!r}; expected "
                             f"one of {self.sampled_layers}")

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

    def compile(self, model, layer, optimizer):
        # The trainer computes its own loss in train_step.
        model.compile(optimizer=optimizer, jit_compile=False)

    def candidate_callbacks(self, layer, set_callback) -> list:
        """Callbacks of the head's candidate source (default: none).

        Args:
          layer: the built head layer.
          set_callback: the :class:`xmc_tf.callbacks.SetRewiring` of the
            head, or None.
        """
        del layer, set_callback
        return []

    def callbacks(self, layer, val_data):
        """SET rewiring of a uniform-sparse layer (``config.set.enabled``),
        then :meth:`candidate_callbacks`, then the held-out P@k."""
        cbs = []
        set_cb = None
        if (self.config.model.sampled_layer == "uniform_sparse" and
                self.config.set.enabled):
            from xmc_tf.callbacks import SetRewiring
            set_cb = SetRewiring(every_n_steps=self.config.set.every_n_steps,
                                 fraction=self.config.set.fraction,
                                 seed=self.config.seed)
            cbs.append(set_cb)
        cbs += self.candidate_callbacks(layer, set_cb)
        return cbs + super().callbacks(layer, val_data)

    def results(self, layer):
        return {"sampled_layer": self.config.model.sampled_layer}
