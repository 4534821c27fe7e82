// Op registration of Xmc>TopK: the k best scores of every row and their
// column ids, by partial selection (one pass over the row; no sort of it).
// The selection and its order are documented in topk_kernels.h.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

REGISTER_OP("Xmc>TopK")
    .Input("scores: T")
    .Output("values: T")
    .Output("indices: int32")
    .Attr("k: int >= 0")
    .Attr("T: {float, half, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle scores;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &scores));
      int64_t k = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      DimensionHandle m = c->Dim(scores, 1);
      if (c->ValueKnown(m) && c->Value(m) < k) {
        return ::tensorflow::errors::InvalidArgument(
            "k = ", k, " exceeds the number of columns ", c->Value(m));
      }
      ShapeHandle out = c->Matrix(c->Dim(scores, 0), k);
      c->set_output(0, out);
      c->set_output(1, out);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The k largest scores of every row and their column ids, best first.

The result equals tf.math.top_k(scores, k, sorted=True) on rows
without NaN (larger value first, equal values (-0.0 == +0.0) by the lower column id,
also across the k-th position).  NaN ranks below every number, NaNs among
themselves by the lower id.  One pass over each row with a vectorised
threshold test (the worst of the k best so far) and std::nth_element on the
few entries that pass: O(m) per row, memory-bound, where tf.math.top_k's
CPU kernel costs about 1 ns per score.  Rows are cut into chunks of at least
65,536 columns, so even a single row uses every thread.

scores: [batch, m] T (float32; float16 / bfloat16 are ranked by their
  float32 values, with the same order), m < 2^31.
k: number of columns per row, 0 <= k <= m.
values: [batch, k] T.
indices: [batch, k] int32 column ids.
)doc");

}  // namespace xmc_tf
