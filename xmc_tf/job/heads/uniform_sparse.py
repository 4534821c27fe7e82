"""The uniform-sparse output head: every label has ``s`` connections.

Schultheis & Babbar, "Towards Memory-Efficient Training for Extremely Large
Output Spaces", Sec. 3 (layer, ops) and Sec. 4.1 (SET rewiring every
``config.set.every_n_steps`` steps moving ``config.set.fraction`` of each
label's connections).  ``8 s m`` bytes plus the bias.
"""

from __future__ import annotations

from xmc_tf import config as xconfig
from xmc_tf.job.heads.base import OUTPUT_LAYER, register
from xmc_tf.job.heads.dense import LabelWiseHead
from xmc_tf.layers import UniformSparseDense
from xmc_tf.optimizers import FusedUpdate

__all__ = ["UniformSparseHead", "HEAD_UPDATES"]

#: ``config.model.head_update``: the model's optimizer, or a fused update
#: (:class:`xmc_tf.optimizers.FusedUpdate`: ``"adam"`` on every label as
#: the optimizer would, ``"lazy_adam"`` on the labels with signal only, or
#: ``"sgd"``).
HEAD_UPDATES = ("optimizer", "fused_adam", "fused_lazy_adam", "fused_sgd")


@register
class UniformSparseHead(LabelWiseHead):
    """``config.model.head = "uniform_sparse"``: :class:`UniformSparseDense`
    with ``config.model.connections_per_label`` (capped at the input width)
    and SET when ``config.set.enabled``."""

    name = "uniform_sparse"
    config_defaults = xconfig.HEAD_DEFAULTS["uniform_sparse"]

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        mc = self.config.model
        fan_in = min(mc.connections_per_label, input_dim)
        fused = None
        if mc.head_update != "optimizer":
            # Its learning rate follows the model's optimizer once compiled
            # (xmc_tf.job.fit.build_and_compile binds it).
            rule = mc.head_update[len("fused_"):]
            fused = FusedUpdate(rule.replace("lazy_", ""),
                                learning_rate=self.config.train.learning_rate,
                                lazy=rule.startswith("lazy_"))
        # Starts at 0; initialize() assigns each label's prior when
        # config.model.output_bias_init="prior" (LabelWiseHead).
        return UniformSparseDense(num_labels, fan_in, seed=self.config.seed,
                                  bias_initializer="zeros", name=OUTPUT_LAYER,
                                  fused_update=fused, dtype=mc.head_dtype)

    _fit_data = None

    def check_config(self):
        super().check_config()
        for field, value, allowed in (
                ("model.head_update", self.config.model.head_update,
                 HEAD_UPDATES),
                ("model.head_dtype", self.config.model.head_dtype,
                 ("float32", "bfloat16"))):
            if value not in allowed:
                raise ValueError(f"config.{field}={value!r}; expected one of "
                                 f"{allowed}")
        from xmc_tf.callbacks.rewiring import REGROWTH
        regrowth = self.config.set.regrowth
        if regrowth not in REGROWTH:
            raise ValueError(f"config.set.regrowth={regrowth!r}; expected one "
                             f"of {REGROWTH}")
        if int(self.config.set.gradient_instances) < 1:
            raise ValueError("config.set.gradient_instances must be >= 1, got "
                             f"{self.config.set.gradient_instances}")

    def prepare(self, train_data):
        super().prepare(train_data)
        # The sample of RigL's dense gradient (config.set.regrowth).
        self._fit_data = (train_data if self.config.set.regrowth == "gradient"
                          else None)

    def callbacks(self, layer, val_data):
        cbs = super().callbacks(layer, val_data)
        sc = self.config.set
        if sc.enabled:
            from xmc_tf.callbacks import SetRewiring
            cbs.append(SetRewiring(
                every_n_steps=sc.every_n_steps, fraction=sc.fraction,
                # None: every UniformSparseDense layer, the wide one too
                layers=None if sc.wide else [layer], seed=self.config.seed,
                regrowth=sc.regrowth, gradient_data=self._gradient_sample()))
        return cbs

    def _gradient_sample(self):
        """``rewire_number -> batches`` of ``config.set.gradient_instances``
        fit instances, a new draw per rewire keyed by ``(seed, number)``
        (so a resumed run draws what an uninterrupted one does); None
        without ``regrowth="gradient"``."""
        data = self._fit_data
        if data is None:
            return None
        from xmc_tf import data as xdata
        num = min(int(self.config.set.gradient_instances), data.num_instances)
        batch = min(num, 512)
        seed = self.config.seed + 7919  # not the training order's seed

        def sample(number):
            return xdata.make_tf_dataset(
                data, batch, shuffle=True, seed=seed, first_epoch=number,
                **self.dataset_kwargs()).take(-(-num // batch))
        return sample
