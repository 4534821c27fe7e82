// Op registrations of the optimizer family: fused in-place Adam updates of the
// rows that a tf.IndexedSlices gradient touches (the "lazy" updates of
// xmc_tf.optimizers, which serve the sparse-input encoder's [num_features, d]
// table and the sampled heads' [num_labels, fan_in] rows) and of whole
// variables (the dense layers of the same models).
//
// Source: Kingma & Ba, "Adam: A Method for Stochastic Optimization", ICLR
// 2015, Algorithm 1 (and Sec. 2 for the folded bias correction), applied per
// row as TensorFlow Addons' LazyAdam did.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace {

// Inputs 3..6 of both Adam ops (alpha, one_minus_beta1, one_minus_beta2,
// epsilon) are scalars; InvalidArgument otherwise.
Status ScalarHyperparameters(InferenceContext* c) {
  return ScalarInputs(c, 3, 4);
}

}  // namespace

REGISTER_OP("Xmc>ResourceSparseApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("alpha: T")
    .Input("one_minus_beta1: T")
    .Input("one_minus_beta2: T")
    .Input("epsilon: T")
    .Input("grad: T")
    .Input("indices: Tindices")
    .Attr("T: {float, double}")
    .Attr("Tindices: {int32, int64}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(ScalarHyperparameters(c));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRankAtLeast(c->input(7), 1, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(8), 1, &unused));
      TF_RETURN_IF_ERROR(
          c->Merge(c->Vector(c->Dim(c->input(7), 0)), c->input(8), &unused));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Adam step on the rows `indices` of a variable and its two moment slots.

For every r in [0, k), with i = indices[r] and g = grad[r]:

  m[i]   += (g - m[i]) * one_minus_beta1
  v[i]   += (g * g - v[i]) * one_minus_beta2
  var[i] -= (m[i] * alpha) / (sqrt(v[i]) + epsilon)

and nothing else changes (rows not in `indices` keep weights and moments: the
"lazy" Adam of xmc_tf.optimizers.LazyAdam; Kingma & Ba, Adam, Algorithm 1 per
row).  One pass over the k rows, in place, instead of the eleven gathers,
element-wise ops and scatters of the composite update.

var, m, v: resource handles of three distinct initialised variables of dtype T
  and one shape [N, ...] (rank >= 1); updated in place under their exclusive
  locks (a buffer shared with another tensor is copied first, as TensorFlow's
  own sparse training ops do; the variables are then in copy-on-read mode).
alpha: scalar T, the bias-corrected step size lr * sqrt(1 - beta2^t) /
  (1 - beta1^t) of step t (computed by the caller).
one_minus_beta1, one_minus_beta2: scalars T, 1 - beta1 and 1 - beta2 (passed
  as such so that the caller rounds them: Keras forms 1 - beta in double, and
  float32(1 - 0.999) differs from 1 - float32(0.999) by 5e-5 relative).
epsilon: scalar T.
grad: [k, ...] T, row r is the gradient of row indices[r]; grad.shape[1:] must
  equal var.shape[1:].
indices: [k] int32/int64 row ids in [0, N), no id twice (sum the rows of a
  repeated id first); otherwise InvalidArgument, before any write.

CPU kernel only (no GPU kernel until one can be run and tested on a GPU):
xmc_tf.optimizers.LazyAdam uses this op for variables on the CPU and keeps its
gather / element-wise / scatter composite for variables on a GPU.
)doc");

REGISTER_OP("Xmc>ResourceApplyAdam")
    .Input("var: resource")
    .Input("m: resource")
    .Input("v: resource")
    .Input("alpha: T")
    .Input("one_minus_beta1: T")
    .Input("one_minus_beta2: T")
    .Input("epsilon: T")
    .Input("grad: T")
    .Attr("T: {float, double}")
    .SetShapeFn([](InferenceContext* c) {
      return ScalarHyperparameters(c);
    })
    .Doc(R"doc(
Adam step on every element of a variable and its two moment slots, in place.

  m   += (grad - m) * one_minus_beta1
  v   += (grad * grad - v) * one_minus_beta2
  var -= (m * alpha) / (sqrt(v) + epsilon)

Xmc>ResourceSparseApplyAdam with every row; the same operations in the same
order as keras.optimizers.Adam, so the same results (TensorFlow's own
ResourceApplyAdam forms 1 - beta in T and differs in the last bits).  One
multi-threaded pass instead of Keras' nine element-wise ops and three
assignments.

var, m, v: resource handles of three distinct initialised variables of dtype T
  and one shape (any rank); a buffer shared with another tensor is copied
  before the write.  Unlike the row update, this op does not put the
  variables in copy-on-read mode (their dense reads keep sharing the buffer).
alpha, one_minus_beta1, one_minus_beta2, epsilon: scalars T, as in
  Xmc>ResourceSparseApplyAdam.
grad: T, the shape of var.
)doc");

}  // namespace xmc_tf
