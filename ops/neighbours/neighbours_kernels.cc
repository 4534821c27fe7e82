// CPU kernel of Xmc>NearestNeighbours (neighbours_ops.cc documents the op;
// neighbours_kernels.h holds the per-query work).
//
// Structure as the label-tree kernels: the queries' entries are checked
// and bucketed by row (counting sort), the rows sharded over TensorFlow's
// intra-op pool, each shard owning a Similarities scratch of n floats; the
// index is range-checked where it is read and a fault is reported for the
// lowest row that met one.  Each row is one thread's, summed in entry
// order, so the result does not depend on the thread count.

#include <cstdint>
#include <limits>
#include <mutex>
#include <vector>

#include "ops/common/sparse_batch.h"
#include "ops/common/validation.h"
#include "ops/neighbours/neighbours_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace {

using neighbours::Scored;

class NearestNeighboursOp : public OpKernel {
 public:
  explicit NearestNeighboursOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("k", &k_));
    OP_REQUIRES(c, k_ >= 1,
                errors::InvalidArgument("k must be >= 1, got ", k_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indptr = ctx->input(3);
    const Tensor& instances = ctx->input(4);
    const Tensor& index_values = ctx->input(5);
    int64_t n = 0;
    OP_REQUIRES_OK(ctx, NonNegativeScalar(ctx->input(6), "num_instances", &n));
    OP_REQUIRES_OK(ctx, CheckInt32Indexable(n, "num_instances"));
    OP_REQUIRES_OK(ctx, CheckVector(indptr, "index_indptr"));
    OP_REQUIRES_OK(ctx, CheckVector(instances, "index_instances"));
    OP_REQUIRES_OK(ctx, CheckVector(index_values, "index_values"));
    OP_REQUIRES(ctx, indptr.dim_size(0) >= 1,
                errors::InvalidArgument("index_indptr must hold D + 1 >= 1 "
                                        "entries, got 0"));
    OP_REQUIRES(ctx, instances.dim_size(0) == index_values.dim_size(0),
                errors::InvalidArgument(
                    "index_instances has ", instances.dim_size(0),
                    " entries, index_values ", index_values.dim_size(0)));
    InvertedIndex index;
    index.num_rows = indptr.dim_size(0) - 1;
    index.num_targets = n;
    index.num_entries = instances.dim_size(0);
    index.indptr = indptr.flat<int64_t>().data();
    index.targets = instances.flat<int32_t>().data();
    index.weights = index_values.flat<float>().data();
    SparseBatch b;
    OP_REQUIRES_OK(ctx, ReadSparseBatch(ctx, 0, index.num_rows,
                                        "the index's num_features", &b));
    const int64_t rows = b.rows, nnz = b.nnz;
    Tensor* ids_t = nullptr;
    Tensor* sims_t = nullptr;
    const int64_t k = k_;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({rows, k}),
                                             &ids_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({rows, k}),
                                             &sims_t));
    if (rows == 0) return;
    int32_t* ids = ids_t->flat<int32_t>().data();
    float* sims = sims_t->flat<float>().data();
    const float* vals = b.values;
    std::mutex mu;
    int64_t bad_row = std::numeric_limits<int64_t>::max();
    IndexFault bad;
    const double mean_postings =
        index.num_rows > 0
            ? static_cast<double>(index.num_entries) / index.num_rows
            : 0.0;
    const int64_t cost =
        static_cast<int64_t>(4.0 * mean_postings * nnz / rows) + 100;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, rows, cost,
        [&](int64_t start, int64_t limit) {
          neighbours::Similarities scratch(n);
          std::vector<Scored> best;
          for (int64_t i = start; i < limit; ++i) {
            IndexFault fault;
            if (!scratch.Accumulate(index, b.feats.data(), vals,
                                    b.order.data(), b.offsets[i],
                                    b.offsets[i + 1], &fault)) {
              std::lock_guard<std::mutex> lock(mu);
              if (i < bad_row) {
                bad_row = i;
                bad = fault;
              }
              return;
            }
            scratch.TakeBest(k, &best);
            for (int64_t j = 0; j < k; ++j) {
              const bool have = j < static_cast<int64_t>(best.size());
              ids[i * k + j] = have ? best[j].second : -1;
              sims[i * k + j] = have ? best[j].first : 0.0f;
            }
          }
        });
    if (bad.kind == IndexFault::kIndptr) {
      ctx->CtxFailure(errors::InvalidArgument(
          "index_indptr[", bad.position, ":", bad.position + 2,
          "] is not a valid CSR row of the ", index.num_entries,
          " entries (query ", bad_row, ")"));
    } else if (bad.kind == IndexFault::kTarget) {
      ctx->CtxFailure(errors::InvalidArgument(
          OutOfRangeMessage("index_instances", instances.shape(),
                            bad.position, bad.value, 0, n, "num_instances"),
          " (query ", bad_row, ")"));
    }
  }

 private:
  int64_t k_ = 1;
};

REGISTER_KERNEL_BUILDER(Name("Xmc>NearestNeighbours").Device(DEVICE_CPU),
                        NearestNeighboursOp);

}  // namespace
}  // namespace xmc_tf
