"""Output heads of xmc_tf and their registry (see
:mod:`xmc_tf.job.heads.base`).

Registered heads (``config.model.head``): ``"dense"``, ``"uniform_sparse"``,
``"mach"``, ``"sampled"`` (uniform-sparse or dense layer trained on sampled
negatives), ``"scent"`` (multi-class full softmax by SCENT on in-batch
classes); the last two share :mod:`xmc_tf.job.heads.candidates`.
"""

from xmc_tf.job.heads.base import OUTPUT_LAYER, Head, get_head, names, register
from xmc_tf.job.heads.candidates import CandidateHead
from xmc_tf.job.heads.dense import DenseHead
from xmc_tf.job.heads.mach import MachOutputHead
from xmc_tf.job.heads.sampled import SampledHead
from xmc_tf.job.heads.scent import ScentHead
from xmc_tf.job.heads.uniform_sparse import UniformSparseHead

__all__ = ["OUTPUT_LAYER", "DenseHead", "Head", "MachOutputHead",
           "SampledHead", "UniformSparseHead", "get_head", "names",
           "register"]
__all__ += ["ScentHead"]
__all__ += ["CandidateHead"]
