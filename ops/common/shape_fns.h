// Shape-inference helpers of the REGISTER_OP shape functions (*_ops.cc),
// TensorFlow-side only.  Each returns InvalidArgument (a graph then fails
// when it is built) for a wrong rank or for dimensions that do not merge.
#ifndef XMC_TF_OPS_COMMON_SHAPE_FNS_H_
#define XMC_TF_OPS_COMMON_SHAPE_FNS_H_

#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

using ::tensorflow::Status;
using ::tensorflow::shape_inference::DimensionHandle;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

// Inputs first .. first + count - 1 are vectors of one length; *merged is
// that vector shape (the rows / positions / weights of a COO batch).
inline Status MergeVectors(InferenceContext* c, int first,
                                         int count, ShapeHandle* merged) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(first), 1, merged));
  for (int i = first + 1; i < first + count; ++i) {
    ShapeHandle other;
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &other));
    TF_RETURN_IF_ERROR(c->Merge(*merged, other, merged));
  }
  return ::tensorflow::OkStatus();
}

// Inputs a and b are matrices of one shape (e.g. indices and weights
// [num_labels, fan_in]); *merged is that shape.
inline Status MergeMatrices(InferenceContext* c, int a, int b,
                                          ShapeHandle* merged) {
  ShapeHandle other;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(a), 2, merged));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(b), 2, &other));
  return c->Merge(*merged, other, merged);
}

// Inputs first .. first + count - 1 are scalars (hyperparameters).
inline Status ScalarInputs(InferenceContext* c, int first,
                                         int count) {
  ShapeHandle unused;
  for (int i = first; i < first + count; ++i) {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 0, &unused));
  }
  return ::tensorflow::OkStatus();
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_SHAPE_FNS_H_
