// The sparse batch of the kernels that take a query batch as the parts of a
// tf.SparseTensor (indices [nnz, 2], values [nnz], dense_shape [2]) and work
// one row at a time: the shapes and every entry checked (InvalidArgument
// naming the first bad one), the entries bucketed by row (counting sort,
// BucketEntries of the embedding-bag family).  TensorFlow-side only.
#ifndef XMC_TF_OPS_COMMON_SPARSE_BATCH_H_
#define XMC_TF_OPS_COMMON_SPARSE_BATCH_H_

#include <cstdint>
#include <vector>

#include "ops/common/validation.h"
#include "ops/embedding_bag/embedding_bag_kernels.h"

namespace xmc_tf {

// A checked sparse batch, its entries bucketed by row: row i's entries are
// order[offsets[i] .. offsets[i + 1]) (entry order kept).
struct SparseBatch {
  int64_t rows = 0;
  int64_t nnz = 0;
  std::vector<int64_t> row_ids, feats;  // per entry
  const float* values = nullptr;
  std::vector<int64_t> offsets, order;
};

// Reads inputs first, first + 1, first + 2 of `ctx` as the batch; its
// width must be `num_features` (`what` names it in the message, e.g.
// "the tree's num_features").
inline Status ReadSparseBatch(OpKernelContext* ctx, int first,
                              int64_t num_features, const char* what,
                              SparseBatch* b) {
  const Tensor& indices = ctx->input(first);
  const Tensor& values = ctx->input(first + 1);
  const Tensor& shape = ctx->input(first + 2);
  if (indices.dims() != 2 || indices.dim_size(1) != 2) {
    return errors::InvalidArgument("indices must be a matrix [nnz, 2], got "
                                   "shape ", indices.shape().DebugString());
  }
  TF_RETURN_IF_ERROR(CheckVector(values, "values"));
  if (values.dim_size(0) != indices.dim_size(0)) {
    return errors::InvalidArgument("values has ", values.dim_size(0),
                                   " entries, indices ", indices.dim_size(0));
  }
  if (shape.dims() != 1 || shape.dim_size(0) != 2) {
    return errors::InvalidArgument("dense_shape must be a vector [2], got "
                                   "shape ", shape.shape().DebugString());
  }
  const auto dims = shape.flat<int64_t>();
  if (dims(0) < 0 || dims(1) != num_features) {
    return errors::InvalidArgument("dense_shape = [", dims(0), ", ", dims(1),
                                   "] must be [batch >= 0, ", num_features,
                                   "] (", what, ")");
  }
  b->rows = dims(0);
  b->nnz = indices.dim_size(0);
  b->values = values.flat<float>().data();
  const int64_t* idx = indices.flat<int64_t>().data();
  b->row_ids.resize(b->nnz);
  b->feats.resize(b->nnz);
  for (int64_t e = 0; e < b->nnz; ++e) {
    const int64_t r = idx[2 * e], f = idx[2 * e + 1];
    if (r < 0 || r >= b->rows) {
      return OutOfRange("indices", indices.shape(), 2 * e, r, 0, b->rows,
                        "rows of the batch");
    }
    if (f < 0 || f >= num_features) {
      return OutOfRange("indices", indices.shape(), 2 * e + 1, f, 0,
                        num_features, "num_features");
    }
    b->row_ids[e] = r;
    b->feats[e] = f;
  }
  BucketEntries(b->row_ids.data(), b->nnz, b->rows, &b->offsets, &b->order);
  return ::tensorflow::OkStatus();
}

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_SPARSE_BATCH_H_
