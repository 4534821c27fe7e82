"""The uniform-sparse output head: every label has ``s`` connections.

Schultheis & Babbar, "Towards Memory-Efficient Training for Extremely Large
Output Spaces", Sec. 3 (layer, ops) and Sec. 4.1 (SET rewiring every
``config.set.every_n_steps`` steps moving ``config.set.fraction`` of each
label's connections).  ``8 s m`` bytes plus the bias.
"""

from __future__ import annotations

from xmc_tf import config as xconfig
from xmc_tf.heads.base import OUTPUT_LAYER, register
from xmc_tf.heads.dense import LabelWiseHead
from xmc_tf.layers import UniformSparseDense

__all__ = ["UniformSparseHead"]


@register
class UniformSparseHead(LabelWiseHead):
    """``config.model.head = "uniform_sparse"``: :class:`UniformSparseDense`
    with ``config.model.connections_per_label`` (capped at the input width)
    and SET when ``config.set.enabled``."""

    name = "uniform_sparse"
    config_defaults = xconfig.HEAD_DEFAULTS["uniform_sparse"]
    layer_types = (UniformSparseDense,)

    def build_layer(self, num_labels, input_dim, sparse_input=False):
        fan_in = min(self.config.model.connections_per_label, input_dim)
        # Starts at 0; initialize() assigns each label's prior when
        # config.model.output_bias_init="prior" (LabelWiseHead).
        return UniformSparseDense(num_labels, fan_in, seed=self.config.seed,
                                  bias_initializer="zeros", name=OUTPUT_LAYER)

    def callbacks(self, layer, val_data):
        cbs = super().callbacks(layer, val_data)
        if self.config.set.enabled:
            from xmc_tf.callbacks import SetRewiring
            cbs.append(SetRewiring(every_n_steps=self.config.set.every_n_steps,
                                   fraction=self.config.set.fraction,
                                   layers=[layer], seed=self.config.seed))
        return cbs
