// Op registrations of the uniform-sparse family (Xmc>UniformSparseMatmul and
// its two gradients).
//
// Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces -- Learning with 500k Labels on a Single
// Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

namespace {

// indices [m, s] and weights [m, s] must agree; returns the merged shape.
Status MergeConnections(InferenceContext* c, int indices_input,
                        int weights_input, ShapeHandle* merged) {
  ShapeHandle indices, weights;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(indices_input), 2, &indices));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(weights_input), 2, &weights));
  return c->Merge(indices, weights, merged);
}

}  // namespace

REGISTER_OP("Xmc>UniformSparseMatmul")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Output("scores: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &features));
      TF_RETURN_IF_ERROR(MergeConnections(c, 1, 2, &connections));
      c->set_output(0, c->Matrix(c->Dim(features, 0), c->Dim(connections, 0)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Scores of a uniformly sparse output layer (Algorithm 1 of Schultheis & Babbar).

scores[i, j] = sum_k features[i, indices[j, k]] * weights[j, k]

Every label j has exactly `fan_in` incoming connections.  The layout is
label-major, [num_labels, fan_in] (the paper stores the transpose): the
connections of one label are contiguous, so a CPU thread reads them in one
cache line, a GPU warp in one coalesced load, SET rewiring works on rows, and
the matrices shard by label.

features: [batch, num_features] float32/float16/bfloat16.
indices: [num_labels, fan_in] int32, every entry in [0, num_features).
weights: [num_labels, fan_in], same dtype as features.
scores: [batch, num_labels], same dtype as features (accumulated in float32).
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulGradFeatures")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Output("grad_features: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle backward, features, connections;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &features));
      TF_RETURN_IF_ERROR(MergeConnections(c, 2, 3, &connections));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 0), c->Dim(features, 0), &unused));
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 1), c->Dim(connections, 0), &unused));
      c->set_output(0, features);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseMatmul w.r.t. features (Algorithm 2).

grad_features[i, indices[j, k]] += backward[i, j] * weights[j, k]

Entries with backward[i, j] == 0 are skipped without reading indices[j, :] or
weights[j, :] (implicit negative mining, Sec. 3.3).  Only the shape of
`features` is used.

backward: [batch, num_labels]; features: [batch, num_features];
indices, weights: [num_labels, fan_in].
grad_features: [batch, num_features].
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulGradWeights")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Output("grad_weights: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle backward, features, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &features));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &indices));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 0), c->Dim(features, 0), &unused));
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 1), c->Dim(indices, 0), &unused));
      c->set_output(0, indices);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseMatmul w.r.t. weights (Algorithm 3).

grad_weights[j, k] = sum_i backward[i, j] * features[i, indices[j, k]]

A zero backward[i, j] skips the load of features[i, indices[j, k]]; a label
whose whole backward column is zero does not read indices[j, :] at all.

backward: [batch, num_labels]; features: [batch, num_features];
indices: [num_labels, fan_in].  grad_weights: [num_labels, fan_in].
)doc");

}  // namespace xmc_tf
