// CPU kernels of the embedding-bag family.  See embedding_bag_ops.cc for the
// op contracts and embedding_bag_kernels.h for the per-row accumulation.
//
// Structure: one OpKernel class per op, templated on the device
// (ops/common/device.h), checks and allocates, then calls
// functor::BagProduct<Device, T> (embedding_bag_kernels.h; CpuDevice only).
//
// CPU design: both kernels first range-check every entry (InvalidArgument
// naming the first bad one), then bucket the entries by the output row they
// add to (counting sort, O(nnz + rows), single thread: a few microseconds per
// thousand entries), then shard the output rows over TensorFlow's intra-op
// thread pool; each row is zeroed and receives one axpy of d values per
// entry, so every output row has one writer and the sums run in entry order
// (deterministic).  half and bfloat16 sum in float (Accumulator), rounded
// once per output value.

#include <cstdint>
#include <type_traits>
#include <vector>

#include "ops/common/validation.h"
#include "ops/embedding_bag/embedding_bag_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

namespace {

// Checks rows / positions / weights (vectors of one length) and the entry
// ranges; `rows_bound` / `positions_bound` name the bounds in messages.
Status ValidateEntries(const Tensor& rows, const Tensor& positions,
                       const Tensor& weights, int64_t num_rows,
                       int64_t num_positions, const char* rows_bound,
                       const char* positions_bound) {
  for (const Tensor* t : {&rows, &positions, &weights}) {
    if (!TensorShapeUtils::IsVector(t->shape())) {
      return errors::InvalidArgument(
          "rows, positions and weights must be vectors, got shape ",
          t->shape().DebugString());
    }
  }
  const int64_t n = rows.dim_size(0);
  if (positions.dim_size(0) != n || weights.dim_size(0) != n) {
    return errors::InvalidArgument(
        "rows, positions and weights must have one length, got ", n, ", ",
        positions.dim_size(0), " and ", weights.dim_size(0));
  }
  const int64_t* r = rows.flat<int64_t>().data();
  const int64_t* p = positions.flat<int64_t>().data();
  for (int64_t e = 0; e < n; ++e) {
    if (r[e] < 0 || r[e] >= num_rows) {
      return OutOfRange("rows", rows.shape(), e, r[e], 0, num_rows,
                        rows_bound);
    }
    if (p[e] < 0 || p[e] >= num_positions) {
      return OutOfRange("positions", positions.shape(), e, p[e], 0,
                        num_positions, positions_bound);
    }
  }
  return ::tensorflow::OkStatus();
}

// The type the sums of T run in: T itself, float for half and bfloat16.
template <typename T>
struct Accumulator {
  using type = T;
};
template <>
struct Accumulator<Eigen::half> {
  using type = float;
};
template <>
struct Accumulator<Eigen::bfloat16> {
  using type = float;
};

}  // namespace

namespace functor {

template <typename T>
struct BagProduct<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const int64_t* keys,
                  const int64_t* other_ids, const T* w, int64_t nnz,
                  const T* source, int64_t num_keys, int64_t d,
                  T* out) const {
    using Acc = typename Accumulator<T>::type;
    std::vector<int64_t> offsets, order;
    BucketEntries(keys, nnz, num_keys, &offsets, &order);
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t per_row =
        d * (2 + 2 * (nnz / std::max<int64_t>(1, num_keys)));
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, num_keys, per_row,
        [&](int64_t start, int64_t limit) {
          if constexpr (std::is_same<Acc, T>::value) {
            for (int64_t k = start; k < limit; ++k) {
              AccumulateRow<T>(order.data(), offsets[k], offsets[k + 1],
                               other_ids, w, source, d, out + k * d);
            }
          } else {
            std::vector<Acc> acc(d);  // the row's sums (per shard)
            for (int64_t k = start; k < limit; ++k) {
              AccumulateRowWide<T, Acc>(order.data(), offsets[k],
                                        offsets[k + 1], other_ids, w, source,
                                        d, acc.data(), out + k * d);
            }
          }
        });
  }
};

}  // namespace functor

namespace {

template <typename Device, typename T>
class EmbeddingBagOp : public OpKernel {
 public:
  explicit EmbeddingBagOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& rows = ctx->input(0);
    const Tensor& positions = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    const Tensor& table = ctx->input(3);
    int64_t batch = 0;
    OP_REQUIRES_OK(ctx, NonNegativeScalar(ctx->input(4), "batch_size", &batch));
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(table.shape()),
                errors::InvalidArgument("table must be a matrix [u, d], got ",
                                        table.shape().DebugString()));
    OP_REQUIRES_OK(ctx, ValidateEntries(rows, positions, weights, batch,
                                        table.dim_size(0), "batch_size",
                                        "rows of table"));
    const int64_t d = table.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({batch, d}), &out));
    if (batch == 0 || d == 0) return;
    functor::BagProduct<Device, T>()(
        ctx, rows.flat<int64_t>().data(), positions.flat<int64_t>().data(),
        weights.flat<T>().data(), rows.dim_size(0), table.flat<T>().data(),
        batch, d, out->flat<T>().data());
  }
};

template <typename Device, typename T>
class EmbeddingBagGradTableOp : public OpKernel {
 public:
  explicit EmbeddingBagGradTableOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& rows = ctx->input(1);
    const Tensor& positions = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    int64_t u = 0;
    OP_REQUIRES_OK(ctx,
                   NonNegativeScalar(ctx->input(4), "num_table_rows", &u));
    OP_REQUIRES(ctx, TensorShapeUtils::IsMatrix(backward.shape()),
                errors::InvalidArgument(
                    "backward must be a matrix [batch_size, d], got ",
                    backward.shape().DebugString()));
    OP_REQUIRES_OK(ctx, ValidateEntries(rows, positions, weights,
                                        backward.dim_size(0), u,
                                        "rows of backward", "num_table_rows"));
    const int64_t d = backward.dim_size(1);
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({u, d}), &out));
    if (u == 0 || d == 0) return;
    functor::BagProduct<Device, T>()(
        ctx, positions.flat<int64_t>().data(), rows.flat<int64_t>().data(),
        weights.flat<T>().data(), rows.dim_size(0), backward.flat<T>().data(),
        u, d, out->flat<T>().data());
  }
};

#define REGISTER_CPU(T)                                                     \
  REGISTER_KERNEL_BUILDER(                                                  \
      Name("Xmc>EmbeddingBag").Device(DEVICE_CPU).TypeConstraint<T>("T"),   \
      EmbeddingBagOp<CpuDevice, T>);                                        \
  REGISTER_KERNEL_BUILDER(Name("Xmc>EmbeddingBagGradTable")                 \
                              .Device(DEVICE_CPU)                           \
                              .TypeConstraint<T>("T"),                      \
                          EmbeddingBagGradTableOp<CpuDevice, T>);

REGISTER_CPU(float);
REGISTER_CPU(double);
REGISTER_CPU(Eigen::half);      // summed in float
REGISTER_CPU(Eigen::bfloat16);  // summed in float
#undef REGISTER_CPU

}  // namespace
}  // namespace xmc_tf
