// CPU kernel of Xmc>TopK (see topk_ops.cc for the contract and
// topk_kernels.h for the selection).
//
// Structure: one OpKernel class templated on the device and dtype
// (ops/common/device.h) checks the shapes and k (InvalidArgument) and
// allocates the outputs, then calls functor::TopK<Device, T> (declared in
// topk_kernels.h; CpuDevice: float, and half / bfloat16 selected on their
// float values, widened chunk by chunk (exact, so the order is the same)).
//
// CPU design (TensorFlow's intra-op thread pool, ::tensorflow::Shard):
//  * Phase 1: the work units are (row, chunk) pairs (topk::ChunksPerRow:
//    one chunk per row when the batch alone keeps the threads busy); each
//    writes the best min(k, chunk) entries of its chunk into its own slot of
//    a [units, k] candidate buffer.
//  * Phase 2, per row: the row's candidates (chunks x k entries) are reduced
//    to the k best and sorted.  The result does not depend on the thread
//    count (the selection is exact; ties are ordered by id).

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/common/validation.h"
#include "ops/common/widen.h"
#include "ops/topk/topk_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace functor {

template <typename T>
struct TopK<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* x, int64_t b, int64_t m,
                  int64_t k, T* values, int32_t* indices) const {
    if (b == 0 || k == 0) return;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t chunks =
        topk::ChunksPerRow(b, m, k, workers->num_threads);
    const int64_t chunk = (m + chunks - 1) / chunks;
    const int64_t units = b * chunks;
    std::vector<topk::Entry> cand(static_cast<size_t>(units * k));
    std::vector<int64_t> count(static_cast<size_t>(units), 0);
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, units, 2 * chunk,
        [&](int64_t start, int64_t limit) {
          std::vector<topk::Entry> buf, out;
          std::vector<float> wide;  // T != float: the chunk as floats
          for (int64_t u = start; u < limit; ++u) {
            const int64_t i = u / chunks;
            const int64_t j0 = (u % chunks) * chunk;
            const int64_t j1 = std::min(m, j0 + chunk);
            out.clear();
            topk::SelectChunk(WidenToFloat(x + i * m + j0, j1 - j0, &wide),
                              j1 - j0, j0, k, &buf, &out);
            std::copy(out.begin(), out.end(), cand.begin() + u * k);
            count[u] = static_cast<int64_t>(out.size());
          }
        });
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, b, chunks * k * 20 + 1,
        [&](int64_t start, int64_t limit) {
          std::vector<topk::Entry> row;
          std::vector<float> wide(std::is_same<T, float>::value ? 0 : k);
          for (int64_t i = start; i < limit; ++i) {
            row.clear();
            for (int64_t c = 0; c < chunks; ++c) {
              const int64_t u = i * chunks + c;
              row.insert(row.end(), cand.begin() + u * k,
                         cand.begin() + u * k + count[u]);
            }
            if constexpr (std::is_same<T, float>::value) {
              topk::FinishRow(&row, k, values + i * k, indices + i * k);
            } else {  // the k values are T values: narrowing back is exact
              topk::FinishRow(&row, k, wide.data(), indices + i * k);
              for (int64_t q = 0; q < k; ++q) {
                values[i * k + q] = static_cast<T>(wide[q]);
              }
            }
          }
        });
  }
};

}  // namespace functor

namespace {

template <typename Device, typename T>
class TopKOp : public OpKernel {
 public:
  explicit TopKOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("k", &k_));
    OP_REQUIRES(c, k_ >= 0, errors::InvalidArgument("k must be >= 0, got ",
                                                    k_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& scores = ctx->input(0);
    OP_REQUIRES(ctx, scores.dims() == 2,
                errors::InvalidArgument(
                    "scores must be a matrix [batch, m], got shape ",
                    scores.shape().DebugString()));
    const int64_t b = scores.dim_size(0), m = scores.dim_size(1);
    const int64_t k = k_;
    OP_REQUIRES(ctx, k <= m,
                errors::InvalidArgument("k = ", k,
                                        " exceeds the number of columns m = ",
                                        m, " of scores"));
    OP_REQUIRES(ctx, m <= std::numeric_limits<int32_t>::max(),
                errors::InvalidArgument(
                    "scores has m = ", m,
                    " columns; int32 column ids need m < 2^31"));
    Tensor* values_t = nullptr;
    Tensor* indices_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, k}),
                                             &values_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b, k}),
                                             &indices_t));
    functor::TopK<Device, T>()(ctx, scores.flat<T>().data(), b, m, k,
                               values_t->flat<T>().data(),
                               indices_t->flat<int32_t>().data());
  }

 private:
  int64_t k_ = 0;
};

}  // namespace

#define REGISTER_CPU(T)                                                  \
  REGISTER_KERNEL_BUILDER(                                               \
      Name("Xmc>TopK").Device(DEVICE_CPU).TypeConstraint<T>("T"), \
      TopKOp<CpuDevice, T>);

REGISTER_CPU(float);
REGISTER_CPU(Eigen::half);      // selected on the widened float values
REGISTER_CPU(Eigen::bfloat16);  // selected on the widened float values
#undef REGISTER_CPU

}  // namespace xmc_tf
