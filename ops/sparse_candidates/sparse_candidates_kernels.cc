// CPU kernel of Xmc>SparseInputSampledMatmul (sparse_candidates_ops.cc
// documents the op).
//
// Structure: the batch is checked and bucketed by row (ops/common/
// sparse_batch.h), the candidates are range-checked, then the rows are
// sharded over TensorFlow's intra-op pool.  Each shard owns a scratch of
// D floats: a row's entries are added into it, each candidate's s
// connections read from it, and the row's entries zeroed again.  A
// connection out of [0, D) is reported for the lowest (row, candidate) that
// met one; each row is one thread's, so the result does not depend on the
// thread count.

#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/sparse_batch.h"
#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace {

class SparseInputSampledMatmulOp : public OpKernel {
 public:
  explicit SparseInputSampledMatmulOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& connections = ctx->input(3);
    const Tensor& weights = ctx->input(4);
    const Tensor& candidates = ctx->input(5);
    OP_REQUIRES_OK(ctx, CheckMatrix(connections, "connections"));
    OP_REQUIRES_OK(ctx, CheckSameShape(weights, "weights", connections,
                                       "connections", "[num_labels, fan_in]"));
    OP_REQUIRES_OK(ctx, CheckMatrix(candidates, "candidates"));
    const Tensor& shape = ctx->input(2);
    OP_REQUIRES(ctx, shape.dims() == 1 && shape.dim_size(0) == 2,
                errors::InvalidArgument("dense_shape must be a vector [2], "
                                        "got shape ",
                                        shape.shape().DebugString()));
    const int64_t d = shape.flat<int64_t>()(1);
    OP_REQUIRES(ctx, d >= 0, errors::InvalidArgument(
                                 "dense_shape[1] must be >= 0, got ", d));
    SparseBatch b;
    OP_REQUIRES_OK(ctx, ReadSparseBatch(ctx, 0, d, "the batch's width", &b));
    OP_REQUIRES(ctx, candidates.dim_size(0) == b.rows,
                errors::InvalidArgument(
                    "candidates has ", candidates.dim_size(0),
                    " rows, the batch (dense_shape[0]) ", b.rows));
    const int64_t m = connections.dim_size(0), s = connections.dim_size(1);
    const int64_t c = candidates.dim_size(1);
    const int32_t* cand = candidates.flat<int32_t>().data();
    const int64_t bad = FirstOutOfRange(ctx, cand, b.rows * c, 0, m);
    OP_REQUIRES(ctx, bad < 0,
                OutOfRange("candidates", candidates.shape(), bad,
                           bad >= 0 ? cand[bad] : 0, 0, m, "num_labels"));
    Tensor* out_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, candidates.shape(), &out_t));
    if (b.rows == 0 || c == 0) return;
    float* out = out_t->flat<float>().data();
    const int32_t* conn = connections.flat<int32_t>().data();
    const float* w = weights.flat<float>().data();
    FirstBad bad_read;  // flat position in connections
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = 4 * c * s + 4 * (b.nnz / b.rows) + 20;
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, b.rows, cost,
        [&](int64_t start, int64_t limit) {
          std::vector<float> row(static_cast<size_t>(d), 0.0f);
          for (int64_t i = start; i < limit; ++i) {
            for (int64_t j = b.offsets[i]; j < b.offsets[i + 1]; ++j) {
              const int64_t e = b.order[j];
              row[b.feats[e]] += b.values[e];
            }
            for (int64_t q = 0; q < c; ++q) {
              const int64_t label = cand[i * c + q];
              const int32_t* idx = conn + label * s;
              const float* wr = w + label * s;
              float sum = 0.0f;
              for (int64_t k = 0; k < s; ++k) {
                const int32_t f = idx[k];
                if (f < 0 || f >= d) {
                  bad_read.Record(label * s + k);
                  continue;
                }
                sum += row[f] * wr[k];
              }
              out[i * c + q] = sum;
            }
            for (int64_t j = b.offsets[i]; j < b.offsets[i + 1]; ++j) {
              row[b.feats[b.order[j]]] = 0.0f;
            }
          }
        });
    if (bad_read.found()) {
      const int64_t p = bad_read.get();
      ctx->CtxFailure(OutOfRange("connections", connections.shape(), p,
                                 conn[p], 0, d, "num_features"));
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Xmc>SparseInputSampledMatmul").Device(DEVICE_CPU),
                        SparseInputSampledMatmulOp);

}  // namespace
}  // namespace xmc_tf
