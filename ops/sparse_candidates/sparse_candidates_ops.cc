// Op registration of Xmc>SparseInputSampledMatmul: a uniform-sparse layer's
// scores of per-instance candidate labels on a sparse batch (the label
// centroids, the wide path), without a [batch, num_features] batch or a
// [batch, num_labels] score matrix.  Inference only (no gradient).

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

REGISTER_OP("Xmc>SparseInputSampledMatmul")
    .Input("indices: int64")
    .Input("values: float")
    .Input("dense_shape: int64")
    .Input("connections: int32")
    .Input("weights: float")
    .Input("candidates: int32")
    .Output("scores: float")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices, values, shape, merged, candidates;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &shape));
      TF_RETURN_IF_ERROR(MergeMatrices(c, 3, 4, &merged));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 2, &candidates));
      c->set_output(0, candidates);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Uniform-sparse scores of per-instance candidate labels on a sparse batch.

scores[i, j] = sum_k x_i[connections[r, k]] * weights[r, k] with
r = candidates[i, j] (Schultheis & Babbar, Sec. 3.1: every label has s
connections); x_i is row i of the sparse batch, its repeated entries added
up.  Per instance the row is scattered into a dense scratch of D floats
(reset afterwards), so the cost is nnz + C * s; no [batch, D] batch and no
[batch, num_labels] scores.  No gradient: an inference op (the fused
models' re-ranking; training scores dense hidden layers).

indices, values, dense_shape: the batch, sparse [batch, D] (int64 [nnz, 2],
  float [nnz], int64 [2]); entries in any order.
connections: int32 [m, s] feature ids in [0, D); weights: float [m, s].
candidates: int32 [batch, C] label ids in [0, m).
scores: float [batch, C].
Every id read is range-checked: InvalidArgument names the bad entry.
)doc");

}  // namespace xmc_tf
