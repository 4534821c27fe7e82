// Op registrations of the fused squared-hinge family: the one-vs-all squared
// hinge over all labels from padded label ids (Xmc>SquaredHingeLoss) and its
// gradient w.r.t. the scores (Xmc>SquaredHingeLossGrad), each one pass over
// the [batch, num_labels] scores without dense targets or other temporaries.
//
// Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 2 (one-vs-all reduction, eq. 2) and
// Sec. 3.3 (the squared hinge's gradient is exactly zero for satisfied
// margins, which the uniform-sparse backward kernels skip).

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace {

// The shape function of both ops: scores [b, m], labels [b, n] and, for
// the gradient (3 inputs), upstream [b], with one batch size b; the output
// is the loss [b] or, for the gradient, the scores' shape [b, m].
Status HingeShapeFn(InferenceContext* c) {
  ShapeHandle scores, labels;
  DimensionHandle batch;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &scores));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &labels));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(scores, 0), c->Dim(labels, 0), &batch));
  if (c->num_inputs() == 2) {  // Xmc>SquaredHingeLoss
    c->set_output(0, c->Vector(batch));
    return ::tensorflow::OkStatus();
  }
  ShapeHandle upstream;  // Xmc>SquaredHingeLossGrad
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &upstream));
  TF_RETURN_IF_ERROR(c->Merge(batch, c->Dim(upstream, 0), &batch));
  TF_RETURN_IF_ERROR(c->ReplaceDim(scores, 0, batch, &scores));
  c->set_output(0, scores);
  return ::tensorflow::OkStatus();
}

}  // namespace

REGISTER_OP("Xmc>SquaredHingeLoss")
    .Input("scores: T")
    .Input("labels: Tlabels")
    .Output("loss: float")
    .Attr("margin: float = 1.0")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .SetShapeFn(HingeShapeFn)
    .Doc(R"doc(
One-vs-all squared hinge of every row over all labels, from label ids.

loss[i] = sum_j relu(margin - s_ij * scores[i, j])^2, with s_ij = +1 when j is
among labels[i, :] and -1 otherwise (a repeated id counts once; -1 is
padding).  Equals the squared hinge of xmc_tf.losses.SquaredHinge on the
multi-hot targets of labels, without building them: one pass over the scores
plus one over the ids.

scores: [batch, num_labels] T (float32; float16 and bfloat16 on the CPU, where
  they are computed in float32 as their float32 values would be).
labels: [batch, n] int32/int64 positive ids padded with -1; every entry in
  [-1, num_labels).
margin: the margin (1.0 in the paper); finite.
loss: [batch] float32 for every T (accumulated in float64 across column
  blocks; a float16 row sum would overflow at 65,504).
)doc");

REGISTER_OP("Xmc>SquaredHingeLossGrad")
    .Input("scores: T")
    .Input("labels: Tlabels")
    .Input("upstream: float")
    .Output("grad: T")
    .Attr("margin: float = 1.0")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .Attr("Tlabels: {int32, int64} = DT_INT64")
    .SetShapeFn(HingeShapeFn)
    .Doc(R"doc(
Gradient of Xmc>SquaredHingeLoss w.r.t. scores, in one pass.

grad[i, j] = -2 s_ij relu(margin - s_ij * scores[i, j]) * upstream[i];
exactly 0 where the margin holds (s_ij * scores[i, j] >= margin), whatever
upstream[i] is, so zero-skipping backward kernels skip it.

scores: [batch, num_labels] T; labels: [batch, n] as for
Xmc>SquaredHingeLoss; upstream: [batch] float32, the gradient of the loss.
grad: [batch, num_labels] T (for float16 / bfloat16: computed in float32,
  rounded once).
)doc");

}  // namespace xmc_tf
