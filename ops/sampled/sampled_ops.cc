// Op registrations of the sampled-scoring family: candidate scores of the
// uniform-sparse output layer (Xmc>UniformSparseSampledMatmul) and its two
// gradients.
//
// Sources: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3, Algorithms 1-3 (the layer and
// the zero-skipping backward); S. Mehta et al., "ASTRA" (Algorithm 1, steps
// 17-18; Sec. 5.2 (c)): sampled training scores only the positives and the
// selected negatives of each instance.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace {

// features [b, e], indices [m, s], optional weights [m, s], candidates
// [b, c], optional backward [b, c].  Input positions < 0 are absent.
// Sets *batch (merged b), *candidates (merged [b, c]) and *connections
// ([m, s]).
Status SampledShapes(InferenceContext* c, int backward_input,
                     int features_input, int indices_input, int weights_input,
                     int candidates_input, ShapeHandle* features,
                     ShapeHandle* connections, ShapeHandle* candidates) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(features_input), 2, features));
  if (weights_input >= 0) {
    TF_RETURN_IF_ERROR(
        MergeMatrices(c, indices_input, weights_input, connections));
  } else {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(indices_input), 2, connections));
  }
  if (backward_input >= 0) {
    TF_RETURN_IF_ERROR(
        MergeMatrices(c, candidates_input, backward_input, candidates));
  } else {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(candidates_input), 2, candidates));
  }
  DimensionHandle batch;
  TF_RETURN_IF_ERROR(
      c->Merge(c->Dim(*features, 0), c->Dim(*candidates, 0), &batch));
  TF_RETURN_IF_ERROR(c->ReplaceDim(*features, 0, batch, features));
  TF_RETURN_IF_ERROR(c->ReplaceDim(*candidates, 0, batch, candidates));
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("Xmc>UniformSparseSampledMatmul")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Input("candidates: int32")
    .Output("scores: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections, candidates;
      TF_RETURN_IF_ERROR(SampledShapes(c, -1, 0, 1, 2, 3, &features,
                                       &connections, &candidates));
      c->set_output(0, candidates);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Scores of a uniformly sparse output layer for per-instance candidate labels.

scores[i, j] = sum_k features[i, indices[r, k]] * weights[r, k],
r = candidates[i, j]

Equals Xmc>UniformSparseMatmul(features, indices, weights)[i, candidates[i, j]]
but costs O(batch * num_candidates * fan_in) instead of
O(batch * num_labels * fan_in): sampled training scores only each instance's
positives and negatives (ASTRA, Mehta et al., Algorithm 1).  Candidates may
repeat within and across rows.

features: [batch, num_features] float32/float16/bfloat16.
indices: [num_labels, fan_in] int32; the rows of the candidate labels are read
  and every entry of them must be in [0, num_features).  Other rows are not
  read (checking all num_labels * fan_in entries would cost more than the
  sampled product itself).
weights: [num_labels, fan_in], same dtype as features.
candidates: [batch, num_candidates] int32, every entry in [0, num_labels).
scores: [batch, num_candidates], dtype of features (accumulated in float32).
)doc");

REGISTER_OP("Xmc>UniformSparseSampledMatmulGradFeatures")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Input("candidates: int32")
    .Output("grad_features: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections, candidates;
      TF_RETURN_IF_ERROR(SampledShapes(c, 0, 1, 2, 3, 4, &features,
                                       &connections, &candidates));
      c->set_output(0, features);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseSampledMatmul w.r.t. features.

grad_features[i, indices[r, k]] += backward[i, j] * weights[r, k],
r = candidates[i, j]

A zero backward[i, j] skips the pair without reading indices[r, :] or
weights[r, :] (Schultheis & Babbar, Sec. 3.3); only the rows that are read are
range-checked.  Every candidate is range-checked.  Only the shape of features
is used.

backward: [batch, num_candidates]; features: [batch, num_features];
indices, weights: [num_labels, fan_in]; candidates: [batch, num_candidates].
grad_features: [batch, num_features].
)doc");

REGISTER_OP("Xmc>ResourceUniformSparseSampledMatmul")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: resource")
    .Input("candidates: int32")
    .Output("scores: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections, candidates;
      TF_RETURN_IF_ERROR(SampledShapes(c, -1, 0, 1, -1, 3, &features,
                                       &connections, &candidates));
      c->set_output(0, candidates);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Xmc>UniformSparseSampledMatmul with `weights` read from a resource variable.

The variable's buffer ([num_labels, fan_in], dtype T) is read in place under
its shared lock, never copied: TensorFlow puts a variable that has received a
sparse update (the optimizer's scatter of the IndexedSlices gradient) in
copy-on-read mode, where a dense read copies the whole buffer every step.
Same contract and errors as Xmc>UniformSparseSampledMatmul, plus
FailedPrecondition for an uninitialized variable and InvalidArgument for a
variable whose dtype is not T.
)doc");

REGISTER_OP("Xmc>ResourceUniformSparseSampledMatmulGradFeatures")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: resource")
    .Input("candidates: int32")
    .Output("grad_features: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections, candidates;
      TF_RETURN_IF_ERROR(SampledShapes(c, 0, 1, 2, -1, 4, &features,
                                       &connections, &candidates));
      c->set_output(0, features);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Xmc>UniformSparseSampledMatmulGradFeatures with `weights` read in place from a
resource variable (see Xmc>ResourceUniformSparseSampledMatmul).
)doc");

REGISTER_OP("Xmc>UniformSparseSampledMatmulGradWeights")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("candidates: int32")
    .Output("grad_values: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections, candidates;
      TF_RETURN_IF_ERROR(SampledShapes(c, 0, 1, 2, -1, 3, &features,
                                       &connections, &candidates));
      DimensionHandle rows;
      TF_RETURN_IF_ERROR(c->Multiply(c->Dim(candidates, 0),
                                     c->Dim(candidates, 1), &rows));
      c->set_output(0, c->Matrix(rows, c->Dim(connections, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseSampledMatmul w.r.t. weights, as IndexedSlices
values.

grad_values[i * num_candidates + j, k] =
    backward[i, j] * features[i, indices[candidates[i, j], k]]

Row i * num_candidates + j belongs to label candidates[i, j]: with the
flattened candidates as indices these are the values of an IndexedSlices whose
dense form (duplicates summed) is the gradient w.r.t. weights [num_labels,
fan_in], so an optimizer updates only the scored label rows.  A zero
backward[i, j] writes a zero row without reading indices or features.

backward: [batch, num_candidates]; features: [batch, num_features];
indices: [num_labels, fan_in]; candidates: [batch, num_candidates].
grad_values: [batch * num_candidates, fan_in].
)doc");

}  // namespace xmc_tf
