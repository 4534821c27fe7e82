// CPU kernels of the LSH hashing ops (Xmc>LshSimHash, Xmc>LshSimHashSparse,
// Xmc>LshDwtaHash, Xmc>LshDwtaHashSparse): the bucket ids of every vector in
// every table.  Their framework-free functors (declared in lsh_kernels.h)
// are in lsh_hash_functions.cc.
// See lsh_ops.cc for the op contracts and lsh_kernels.h for the layouts.
//
// Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
// Sec. 1.2-2.3, Algorithm 1; SimHash (Charikar 2002, LNS Appendix A.2); DWTA
// (Chen & Shrivastava, UAI 2018, LNS Appendix A.3).
//
// Every kernel validates ranks, shapes, dtypes (by registration), the
// attributes that size its outputs or scratch memory, the range of every
// index it dereferences and of every id or code it copies into its outputs,
// and fails with InvalidArgument naming the offending entry (the smallest
// bad row: ops/common/bad_index.h FirstBad); the shared checks are in
// lsh_kernel_util.h and ops/common/validation.h.
// Structure (ops/common/device.h): one OpKernel class per op, templated on
// the device, checks attributes, ranks and shapes and allocates the outputs;
// functor::X<Device> (lsh_kernels.h) checks the data it reads and does the
// work.  Only the CpuDevice functors exist (DEVICE_CPU registrations).
// Rows are spread over TensorFlow's intra-op thread pool.  The dense
// projections' axpy (lsh_hash_functions.cc) is compiled per instruction set
// (ops/common/cpu_isa.h).

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/cpu_isa.h"
#include "ops/common/validation.h"
#include "ops/lsh/lsh_kernel_util.h"
#include "ops/lsh/lsh_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {

// ---------------------------------------------------------------------------
// Checks of the data the CPU functors read.
// ---------------------------------------------------------------------------

namespace {

using lsh::CheckNumFeatures;
using lsh::FirstNonFinite;
using lsh::NotInRange;

// Every entry of projection [d, H] is finite.
absl::Status CheckProjection(const float* proj, int64_t d, int64_t H) {
  const int64_t bad = FirstNonFinite(proj, d * H);
  if (bad >= 0) {
    return errors::InvalidArgument("projection[", bad / H, ", ", bad % H,
                                   "] is not finite");
  }
  return absl::OkStatus();
}

// Every coordinate of bins [H, w] is in [0, input_dim).
absl::Status CheckBins(OpKernelContext* ctx, const int32_t* bins, int64_t H,
                       int64_t w, int64_t input_dim) {
  const int64_t t = FirstOutOfRange(ctx, bins, H * w, 0, input_dim);
  if (t < 0) return absl::OkStatus();
  return NotInRange("bins", TensorShape({H, w}), t, bins[t], 0, input_dim,
                    "input_dim");
}

// Row-level failure of a sparse hashing kernel: bad index, non-finite
// weight, or duplicates whose float32 sum overflows (the densified vector
// would hold an infinity, which the dense ops reject).
struct SparseErrors {
  FirstBad index_row, finite_row, overflow_row;
};

// Index of the first entry whose (summed) value is infinite, or -1.
template <typename T>
int64_t FirstInfiniteSum(const std::vector<std::pair<int32_t, T>>& entries) {
  for (size_t t = 0; t < entries.size(); ++t) {
    if (!std::isfinite(entries[t].second)) return static_cast<int64_t>(t);
  }
  return -1;
}

// Validates a sparse row (indices, weights: s entries) and canonicalises it
// into `entries`; records a failure in `errs` and returns false.
bool SparseRow(const int32_t* idx, const float* w, int64_t s,
               int64_t num_features, int64_t row, SparseErrors* errs,
               std::vector<std::pair<int32_t, float>>* entries) {
  if (lsh::CanonicalSparse(idx, w, s, num_features, entries) >= 0) {
    errs->index_row.Record(row);
    return false;
  }
  if (FirstNonFinite(w, s) >= 0) {
    errs->finite_row.Record(row);
    return false;
  }
  if (FirstInfiniteSum(*entries) >= 0) {
    errs->overflow_row.Record(row);
    return false;
  }
  return true;
}

// The error of the first failing row of indices / weights [n, s].
absl::Status ReportSparseErrors(const SparseErrors& errs, const int32_t* idx,
                                const float* weights, int64_t n, int64_t s,
                                int64_t num_features) {
  if (errs.index_row.found()) {
    const int64_t r = errs.index_row.get();
    // Recompute the column deterministically for the message.
    int64_t col = 0;
    for (; col < s; ++col) {
      if (idx[r * s + col] < 0 || idx[r * s + col] >= num_features) break;
    }
    return NotInRange("indices", TensorShape({n, s}), r * s + col,
                      idx[r * s + col], 0, num_features, "num_features");
  }
  if (errs.finite_row.found()) {
    return errors::InvalidArgument("weights[", errs.finite_row.get(),
                                   "] contains a NaN or infinite value");
  }
  if (errs.overflow_row.found()) {
    const int64_t r = errs.overflow_row.get();
    std::vector<std::pair<int32_t, float>> entries;
    lsh::CanonicalSparse(idx + r * s, weights + r * s, s, num_features,
                         &entries);
    const int64_t t = FirstInfiniteSum(entries);
    return errors::InvalidArgument(
        "weights[", r, "]: the weights of index ",
        t < 0 ? -1 : entries[t].first,
        " sum to an infinite value in float32 (the densified vector would "
        "not be finite)");
  }
  return absl::OkStatus();
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors (lsh_kernels.h): rows spread over TensorFlow's intra-op pool,
// each row checked and hashed in one pass; the smallest failing row named.
// ---------------------------------------------------------------------------

namespace functor {

template <>
struct LshSimHash<CpuDevice> {
  void operator()(OpKernelContext* ctx, const float* x, int64_t n, int64_t d,
                  const float* proj, const lsh::CodeLayout& layout,
                  int32_t* out) const {
    const int64_t H = layout.num_hashes(), L = layout.num_tables;
    OP_REQUIRES_OK(ctx, CheckProjection(proj, d, H));
    if (n == 0) return;
    FirstBad bad;
    const cpu::Isa isa = cpu::CpuIsa();
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<float> acc(H);
      for (int64_t i = start; i < limit; ++i) {
        if (FirstNonFinite(x + i * d, d) >= 0) {
          bad.Record(i);
          continue;
        }
        lsh::SimHashDense(x + i * d, d, proj, H, layout, acc.data(),
                          out + i * L, isa);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        2 * d * H + 8 * H, work);
    OP_REQUIRES(ctx, !bad.found(),
                errors::InvalidArgument("vectors[", bad.get(),
                                        "] contains a NaN or infinite value"));
  }
};

template <>
struct LshSimHashSparse<CpuDevice> {
  void operator()(OpKernelContext* ctx, const int32_t* idx, const float* w,
                  int64_t n, int64_t s, const float* proj, int64_t e,
                  const lsh::CodeLayout& layout, int32_t* out) const {
    const int64_t H = layout.num_hashes(), L = layout.num_tables;
    OP_REQUIRES_OK(ctx, CheckProjection(proj, e, H));
    if (n == 0) return;
    SparseErrors errs;
    const cpu::Isa isa = cpu::CpuIsa();
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<float> acc(H);
      std::vector<std::pair<int32_t, float>> entries;
      for (int64_t i = start; i < limit; ++i) {
        if (!SparseRow(idx + i * s, w + i * s, s, e, i, &errs, &entries)) {
          continue;
        }
        lsh::SimHashSparse(entries, proj, H, layout, acc.data(), out + i * L,
                           isa);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        2 * s * H + 8 * H + 20 * s, work);
    OP_REQUIRES_OK(ctx, ReportSparseErrors(errs, idx, w, n, s, e));
  }
};

template <>
struct LshDwtaHash<CpuDevice> {
  void operator()(OpKernelContext* ctx, const float* x, int64_t n, int64_t d,
                  const int32_t* bins, int bin_size, uint64_t seed,
                  const lsh::CodeLayout& layout, int32_t* out) const {
    const int64_t H = layout.num_hashes(), L = layout.num_tables;
    OP_REQUIRES_OK(ctx, CheckBins(ctx, bins, H, bin_size, d));
    if (n == 0) return;
    const lsh::DwtaHasher hasher(bins, H, bin_size, d, seed,
                                 /*sparse=*/false);
    FirstBad bad;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::DwtaHasher::Scratch scratch;
      for (int64_t i = start; i < limit; ++i) {
        if (FirstNonFinite(x + i * d, d) >= 0) {
          bad.Record(i);
          continue;
        }
        hasher.HashDense(x + i * d, layout, &scratch, out + i * L);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        3 * H * bin_size + d, work);
    OP_REQUIRES(ctx, !bad.found(),
                errors::InvalidArgument("vectors[", bad.get(),
                                        "] contains a NaN or infinite value"));
  }
};

template <>
struct LshDwtaHashSparse<CpuDevice> {
  void operator()(OpKernelContext* ctx, const int32_t* idx, const float* w,
                  int64_t n, int64_t s, const int32_t* bins, int bin_size,
                  int64_t num_features, uint64_t seed,
                  const lsh::CodeLayout& layout, int32_t* out) const {
    const int64_t H = layout.num_hashes(), L = layout.num_tables;
    OP_REQUIRES_OK(ctx, CheckBins(ctx, bins, H, bin_size, num_features));
    if (n == 0) return;
    const lsh::DwtaHasher hasher(bins, H, bin_size, num_features, seed,
                                 /*sparse=*/true);
    SparseErrors errs;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::DwtaHasher::Scratch scratch;
      std::vector<std::pair<int32_t, float>> entries;
      for (int64_t i = start; i < limit; ++i) {
        if (!SparseRow(idx + i * s, w + i * s, s, num_features, i, &errs,
                       &entries)) {
          continue;
        }
        hasher.HashSparse(entries, layout, &scratch, out + i * L);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t per_coord =
        1 + H * bin_size / std::max<int64_t>(num_features, 1);
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        4 * s * per_coord + 4 * H + 20 * s, work);
    OP_REQUIRES_OK(ctx, ReportSparseErrors(errs, idx, w, n, s, num_features));
  }
};

}  // namespace functor

// ---------------------------------------------------------------------------
// TensorFlow kernels (one class per op, templated on the device): attribute,
// rank and shape checks, output allocation, then the functor.
// ---------------------------------------------------------------------------

namespace {

int Log2Exact(int64_t w) {
  int b = 0;
  while ((int64_t{1} << b) < w) ++b;
  return (int64_t{1} << b) == w ? b : -1;
}

// Attributes shared by the hashing ops.
struct HashAttrs {
  int64_t num_bits = 1;
  int64_t bucket_bits = 16;
  explicit HashAttrs(OpKernelConstruction* ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_bits", &num_bits));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("bucket_bits", &bucket_bits));
  }
};

// Output 0 of the hashing ops: codes [n, L].
absl::Status AllocateCodes(OpKernelContext* ctx, int64_t n,
                           const lsh::CodeLayout& layout, int32_t** codes) {
  Tensor* t = nullptr;
  TF_RETURN_IF_ERROR(
      ctx->allocate_output(0, TensorShape({n, layout.num_tables}), &t));
  *codes = t->flat<int32_t>().data();
  return absl::OkStatus();
}

// ----- SimHash ---------------------------------------------------------------

// Validates the shape of projection [e, H] and returns the layout.
absl::Status SimHashLayout(const HashAttrs& attrs, const Tensor& projection,
                           lsh::CodeLayout* layout) {
  TF_RETURN_IF_ERROR(CheckRank(projection, 2, "projection", "[input_dim, K * L]"));
  const int64_t H = projection.dim_size(1);
  const std::string err =
      lsh::ValidateLayout(attrs.num_bits, 1, attrs.bucket_bits, H);
  if (!err.empty()) return errors::InvalidArgument(err);
  layout->num_bits = static_cast<int>(attrs.num_bits);
  layout->bits_per_hash = 1;
  layout->bucket_bits = static_cast<int>(attrs.bucket_bits);
  layout->num_tables = H / attrs.num_bits;
  return absl::OkStatus();
}

template <typename Device>
class LshSimHashOp : public OpKernel {
 public:
  explicit LshSimHashOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& vectors = ctx->input(0);
    const Tensor& projection = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRank(vectors, 2, "vectors", "[n, input_dim]"));
    lsh::CodeLayout layout;
    OP_REQUIRES_OK(ctx, SimHashLayout(attrs_, projection, &layout));
    const int64_t n = vectors.dim_size(0), d = vectors.dim_size(1);
    OP_REQUIRES(ctx, projection.dim_size(0) == d,
                errors::InvalidArgument(
                    "projection.shape[0] must equal vectors.shape[1] = ", d,
                    " (input_dim), got projection shape ",
                    projection.shape().DebugString()));
    int32_t* codes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateCodes(ctx, n, layout, &codes));
    functor::LshSimHash<Device>()(ctx, vectors.flat<float>().data(), n, d,
                                  projection.flat<float>().data(), layout,
                                  codes);
  }

 private:
  HashAttrs attrs_;
};

// Validates indices [n, s] / weights [n, s].
absl::Status CheckSparseRows(const Tensor& indices, const Tensor& weights) {
  TF_RETURN_IF_ERROR(CheckRank(indices, 2, "indices", "[n, s]"));
  TF_RETURN_IF_ERROR(CheckRank(weights, 2, "weights", "[n, s]"));
  return CheckSameShape(weights, "weights", indices, "indices", "[n, s]");
}

template <typename Device>
class LshSimHashSparseOp : public OpKernel {
 public:
  explicit LshSimHashSparseOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& weights = ctx->input(1);
    const Tensor& projection = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckSparseRows(indices, weights));
    lsh::CodeLayout layout;
    OP_REQUIRES_OK(ctx, SimHashLayout(attrs_, projection, &layout));
    const int64_t n = indices.dim_size(0), s = indices.dim_size(1);
    int32_t* codes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateCodes(ctx, n, layout, &codes));
    functor::LshSimHashSparse<Device>()(
        ctx, indices.flat<int32_t>().data(), weights.flat<float>().data(), n,
        s, projection.flat<float>().data(), projection.dim_size(0), layout,
        codes);
  }

 private:
  HashAttrs attrs_;
};

// ----- DWTA ------------------------------------------------------------------

// Validates the shape of bins [H, w] and the layout (the coordinates are
// checked by the functor).
absl::Status DwtaLayout(const HashAttrs& attrs, const Tensor& bins,
                        lsh::CodeLayout* layout) {
  TF_RETURN_IF_ERROR(CheckRank(bins, 2, "bins", "[K * L, bin_size]"));
  const int64_t H = bins.dim_size(0), w = bins.dim_size(1);
  const int bph = Log2Exact(w);
  if (w < 2 || w > 256 || bph < 0) {
    return errors::InvalidArgument(
        "bin_size (bins.shape[1]) must be a power of two in [2, 256], got ",
        w);
  }
  const std::string err =
      lsh::ValidateLayout(attrs.num_bits, bph, attrs.bucket_bits, H);
  if (!err.empty()) return errors::InvalidArgument(err);
  layout->num_bits = static_cast<int>(attrs.num_bits);
  layout->bits_per_hash = bph;
  layout->bucket_bits = static_cast<int>(attrs.bucket_bits);
  layout->num_tables = H / attrs.num_bits;
  return absl::OkStatus();
}

template <typename Device>
class LshDwtaHashOp : public OpKernel {
 public:
  explicit LshDwtaHashOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& vectors = ctx->input(0);
    const Tensor& bins = ctx->input(1);
    OP_REQUIRES_OK(ctx, CheckRank(vectors, 2, "vectors", "[n, input_dim]"));
    const int64_t n = vectors.dim_size(0), d = vectors.dim_size(1);
    lsh::CodeLayout layout;
    OP_REQUIRES_OK(ctx, DwtaLayout(attrs_, bins, &layout));
    int32_t* codes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateCodes(ctx, n, layout, &codes));
    functor::LshDwtaHash<Device>()(
        ctx, vectors.flat<float>().data(), n, d, bins.flat<int32_t>().data(),
        static_cast<int>(bins.dim_size(1)), static_cast<uint64_t>(seed_),
        layout, codes);
  }

 private:
  HashAttrs attrs_;
  int64_t seed_ = 0;
};

template <typename Device>
class LshDwtaHashSparseOp : public OpKernel {
 public:
  explicit LshDwtaHashSparseOp(OpKernelConstruction* ctx)
      : OpKernel(ctx), attrs_(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &num_features_));
    OP_REQUIRES_OK(ctx, CheckNumFeatures(num_features_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& indices = ctx->input(0);
    const Tensor& weights = ctx->input(1);
    const Tensor& bins = ctx->input(2);
    OP_REQUIRES_OK(ctx, CheckSparseRows(indices, weights));
    lsh::CodeLayout layout;
    OP_REQUIRES_OK(ctx, DwtaLayout(attrs_, bins, &layout));
    const int64_t n = indices.dim_size(0), s = indices.dim_size(1);
    int32_t* codes = nullptr;
    OP_REQUIRES_OK(ctx, AllocateCodes(ctx, n, layout, &codes));
    functor::LshDwtaHashSparse<Device>()(
        ctx, indices.flat<int32_t>().data(), weights.flat<float>().data(), n,
        s, bins.flat<int32_t>().data(), static_cast<int>(bins.dim_size(1)),
        num_features_, static_cast<uint64_t>(seed_), layout, codes);
  }

 private:
  HashAttrs attrs_;
  int64_t seed_ = 0;
  int64_t num_features_ = 1;
};

}  // namespace

// CPU only (see lsh_kernels.h).
REGISTER_KERNEL_BUILDER(Name("Xmc>LshSimHash").Device(DEVICE_CPU),
                        LshSimHashOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Xmc>LshSimHashSparse").Device(DEVICE_CPU),
                        LshSimHashSparseOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Xmc>LshDwtaHash").Device(DEVICE_CPU),
                        LshDwtaHashOp<CpuDevice>);
REGISTER_KERNEL_BUILDER(Name("Xmc>LshDwtaHashSparse").Device(DEVICE_CPU),
                        LshDwtaHashSparseOp<CpuDevice>);

}  // namespace xmc_tf