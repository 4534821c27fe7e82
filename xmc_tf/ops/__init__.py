"""Thin Python wrappers over the compiled xmc_tf ops, with their gradients."""

from xmc_tf.ops._loader import load
from xmc_tf.ops.mach import MachHashing, mach_top_k, meta_probabilities
from xmc_tf.ops.sampled import (check_candidates, check_shared_candidates,
                                dense_sampled_matmul,
                                uniform_sparse_sampled_matmul)
from xmc_tf.ops.uniform_sparse import (uniform_sparse_grad_apply,
                                       uniform_sparse_inverted_index,
                                       uniform_sparse_matmul,
                                       uniform_sparse_matmul_sparse_input)

__all__ = ["MachHashing", "load", "mach_top_k",
           "meta_probabilities", "uniform_sparse_grad_apply",
           "uniform_sparse_inverted_index",
           "uniform_sparse_matmul", "uniform_sparse_matmul_sparse_input"]
__all__ += ["check_candidates", "check_shared_candidates",
            "dense_sampled_matmul",
            "uniform_sparse_sampled_matmul"]
from xmc_tf.ops.lsh import (LshHashFamily, lsh_build_tables,  # noqa: E402
                            lsh_query, lsh_update_tables)

__all__ += ["LshHashFamily", "lsh_build_tables", "lsh_query",
            "lsh_update_tables"]
from xmc_tf.ops.optimizers import (resource_apply_adam,  # noqa: E402
                                   resource_sparse_apply_adam)

__all__ += ["resource_apply_adam", "resource_sparse_apply_adam"]
from xmc_tf.ops.hinge import (squared_hinge_loss,  # noqa: E402
                              squared_hinge_loss_supported)

__all__ += ["squared_hinge_loss", "squared_hinge_loss_supported"]
