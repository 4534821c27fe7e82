// CPU kernels (and, when built with nvcc, GPU registrations) of the
// uniform-sparse op family.  See uniform_sparse_ops.cc for the op contracts.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3, Algorithms 1-3.
//
// CPU design (all three kernels run on TensorFlow's intra-op thread pool):
//  * Forward: features are first transposed to featT [num_features, batch]
//    (float32).  Labels are processed in tiles of kTile; every connection
//    (j, k) then adds weights[j, k] * featT[indices[j, k], :] to a per-label
//    accumulator of `batch` floats, a contiguous, vectorisable axpy.  The
//    tile's accumulators are written to scores[:, j0:j0+kTile] row by row.
//  * Gradient w.r.t. features: work units are (instance i, chunk of labels);
//    each unit owns its output row (or a private buffer when there are more
//    chunks than one), so no two threads write the same memory and no
//    atomics are needed.  A zero backward[i, j] skips label j without reading
//    its indices or weights (Sec. 3.3).
//  * Gradient w.r.t. weights: labels are processed in tiles; a tile's
//    backward columns are gathered once, a label whose column is all zero
//    writes zeros without reading its indices, a sparse column visits only
//    its non-zero instances, a dense one does a vectorised dot product over
//    featT.  In every path (and on the GPU) a zero backward[i, j] contributes
//    exactly 0 to grad_weights[j, :], even where features[i, indices[j, k]]
//    is inf or NaN (no 0 * inf = NaN): which outputs are non-finite does not
//    depend on the density of backward.  The same holds for the gradient
//    w.r.t. features (zero entries are skipped there too).
//  * Every kernel validates ranks, shapes and the index range first and fails
//    with InvalidArgument naming the offending entry.
//
// Hot loops are compiled for AVX2/FMA and for baseline x86-64 and picked at
// run time (GCC function multiversioning), so the library runs on any x86-64
// CPU that TensorFlow runs on.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

#if XMC_TF_WITH_CUDA
#include "xla/stream_executor/stream.h"
#endif

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define XMC_MULTIVERSION __attribute__((target_clones("arch=haswell", "default")))
#else
#define XMC_MULTIVERSION
#endif

namespace xmc_tf {

using ::tensorflow::DEVICE_CPU;
using ::tensorflow::DEVICE_GPU;
using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Status;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

constexpr int64_t kTile = 16;  // labels per tile (forward, weight gradient)

// ---------------------------------------------------------------------------
// Validation shared by the CPU and GPU kernels.

struct Dims {
  int64_t batch = 0, num_features = 0, num_labels = 0, fan_in = 0;
};

Status CheckMatrix(const Tensor& t, const char* name) {
  if (t.dims() != 2) {
    return errors::InvalidArgument(name, " must be a matrix (rank 2), got shape ",
                                   t.shape().DebugString());
  }
  return ::tensorflow::OkStatus();
}

// Checks ranks and shapes of the operands that are present (nullptr = absent).
Status ValidateShapes(const Tensor* features, const Tensor& indices,
                      const Tensor* weights, const Tensor* backward, Dims* d) {
  TF_RETURN_IF_ERROR(CheckMatrix(indices, "indices"));
  d->num_labels = indices.dim_size(0);
  d->fan_in = indices.dim_size(1);
  if (features != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*features, "features"));
    d->batch = features->dim_size(0);
    d->num_features = features->dim_size(1);
    if (d->num_features > std::numeric_limits<int32_t>::max()) {
      return errors::InvalidArgument("num_features = ", d->num_features,
                                     " does not fit int32 indices");
    }
  }
  if (weights != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*weights, "weights"));
    if (weights->shape() != indices.shape()) {
      return errors::InvalidArgument(
          "weights shape ", weights->shape().DebugString(),
          " must equal indices shape ", indices.shape().DebugString(),
          " ([num_labels, fan_in])");
    }
  }
  if (backward != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*backward, "backward"));
    if (backward->dim_size(0) != d->batch ||
        backward->dim_size(1) != d->num_labels) {
      return errors::InvalidArgument(
          "backward shape ", backward->shape().DebugString(), " must be [",
          d->batch, ", ", d->num_labels, "] ([batch, num_labels])");
    }
  }
  return ::tensorflow::OkStatus();
}

Status BadIndexError(const Tensor& indices, int64_t position, int64_t value,
                     int64_t num_features) {
  const int64_t fan_in = indices.dim_size(1);
  return errors::InvalidArgument(
      "indices[", position / fan_in, ", ", position % fan_in, "] = ", value,
      " is out of range [0, ", num_features, ") (num_features)");
}

// Parallel range check of every entry of `indices` against [0, num_features).
Status ValidateIndexRange(OpKernelContext* ctx, const Tensor& indices,
                          int64_t num_features) {
  const int32_t* idx = indices.flat<int32_t>().data();
  const int64_t n = indices.NumElements();
  std::atomic<int64_t> first_bad{std::numeric_limits<int64_t>::max()};
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, n, 1,
      [&](int64_t start, int64_t limit) {
        const uint32_t bound = static_cast<uint32_t>(num_features);
        for (int64_t p = start; p < limit; ++p) {
          // One unsigned compare covers both negative and too-large values.
          if (static_cast<uint32_t>(idx[p]) >= bound) {
            int64_t cur = first_bad.load();
            while (p < cur && !first_bad.compare_exchange_weak(cur, p)) {
            }
            return;
          }
        }
      });
  const int64_t bad = first_bad.load();
  if (bad != std::numeric_limits<int64_t>::max()) {
    return BadIndexError(indices, bad, idx[bad], num_features);
  }
  return ::tensorflow::OkStatus();
}

// ---------------------------------------------------------------------------
// Hot loops (float only, multiversioned).

// acc[t, :] = sum_k w[t, k] * featT[idx[t, k], :] for t < ntile.
XMC_MULTIVERSION
void ForwardTile(const float* featT, int64_t batch, const int32_t* idx,
                 const float* w, int64_t ntile, int64_t fan_in, float* acc) {
  for (int64_t t = 0; t < ntile; ++t) {
    float* a = acc + t * batch;
    std::fill(a, a + batch, 0.0f);
    for (int64_t k = 0; k < fan_in; ++k) {
      const float* row = featT + static_cast<int64_t>(idx[t * fan_in + k]) * batch;
      const float wv = w[t * fan_in + k];
      for (int64_t i = 0; i < batch; ++i) a[i] += wv * row[i];
    }
  }
}

// out[f] += g * w[j, k] at f = idx[j, k] for the labels j in [j0, j1) whose
// backward value g = back[j] is non-zero.
template <typename T>
void GradFeaturesRow(const T* back, const int32_t* idx, const T* w, int64_t j0,
                     int64_t j1, int64_t fan_in, float* out) {
  for (int64_t j = j0; j < j1; ++j) {
    const float g = static_cast<float>(back[j]);
    if (g == 0.0f) continue;  // implicit negative mining: nothing is read
    const int32_t* ij = idx + j * fan_in;
    const T* wj = w + j * fan_in;
    for (int64_t k = 0; k < fan_in; ++k) {
      out[ij[k]] += g * static_cast<float>(wj[k]);
    }
  }
}

// Eight independent partial sums: a plain float reduction is not vectorised
// without -ffast-math (it would reassociate the additions).
XMC_MULTIVERSION
float DenseDot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
            ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// sum_i a[i] * b[i] over the terms with a[i] != 0: a zero entry of the
// backward signal `a` contributes exactly 0, also against an inf or NaN
// feature in `b` (where the product would be NaN).  This is what skipping
// zero entries means (Sec. 3.3), so the dense path of the weight gradient
// agrees with its sparse path on which outputs are NaN/inf whatever the
// density (they may still differ in rounding: other summation order).
// The plain vectorised DenseDot runs first; a finite result implies that
// every product was finite, and it then equals the masked sum (adding a +-0
// product to a sum that starts at +0 changes nothing).  Only a non-finite
// result is recomputed with the zero terms left out (rare: inf/NaN features
// or overflow), so the common case keeps the vectorised loop.
float DenseDotSkipZeros(const float* a, const float* b, int64_t n) {
  const float s = DenseDot(a, b, n);
  if (std::isfinite(s)) return s;
  float acc[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int l = 0; l < 8; ++l) {
      if (a[i + l] != 0.0f) acc[l] += a[i + l] * b[i + l];
    }
  }
  float t = ((acc[0] + acc[1]) + (acc[2] + acc[3])) +
            ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) {
    if (a[i] != 0.0f) t += a[i] * b[i];
  }
  return t;
}

// Tiled parallel transpose of features [batch, num_features] into float32
// featT [num_features, batch].
template <typename T>
void TransposeFeatures(OpKernelContext* ctx, const T* features, int64_t batch,
                       int64_t num_features, float* featT) {
  constexpr int64_t kBlock = 32;
  const int64_t row_blocks = (num_features + kBlock - 1) / kBlock;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, row_blocks, batch * kBlock * 2,
      [&](int64_t start, int64_t limit) {
        for (int64_t rb = start; rb < limit; ++rb) {
          const int64_t f0 = rb * kBlock;
          const int64_t f1 = std::min(num_features, f0 + kBlock);
          for (int64_t i0 = 0; i0 < batch; i0 += kBlock) {
            const int64_t i1 = std::min(batch, i0 + kBlock);
            for (int64_t i = i0; i < i1; ++i) {
              const T* src = features + i * num_features;
              for (int64_t f = f0; f < f1; ++f) {
                featT[f * batch + i] = static_cast<float>(src[f]);
              }
            }
          }
        }
      });
}

// Pointer to the float32 values of `t`: the tensor itself for float, else a
// converted copy held in `storage`.
template <typename T>
const float* AsFloat(const Tensor& t, std::vector<float>* storage) {
  const T* p = t.flat<T>().data();
  storage->resize(t.NumElements());
  for (int64_t i = 0; i < t.NumElements(); ++i) {
    (*storage)[i] = static_cast<float>(p[i]);
  }
  return storage->data();
}
template <>
const float* AsFloat<float>(const Tensor& t, std::vector<float>*) {
  return t.flat<float>().data();
}

// Estimated fraction of non-zeros in backward from a fixed pseudo-random
// sample (a performance heuristic only; results never depend on it).
template <typename T>
double EstimateDensity(const T* back, int64_t n) {
  if (n == 0) return 0.0;
  constexpr int64_t kSamples = 4096;
  if (n <= kSamples) {
    int64_t nz = 0;
    for (int64_t p = 0; p < n; ++p) nz += static_cast<float>(back[p]) != 0.0f;
    return static_cast<double>(nz) / n;
  }
  uint64_t state = 0x9E3779B97F4A7C15ull;
  int64_t nz = 0;
  for (int64_t s = 0; s < kSamples; ++s) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    nz += static_cast<float>(back[(state >> 17) % static_cast<uint64_t>(n)]) !=
          0.0f;
  }
  return static_cast<double>(nz) / kSamples;
}

// ---------------------------------------------------------------------------
// CPU kernels.

template <typename T>
class UniformSparseMatmulOp : public OpKernel {
 public:
  explicit UniformSparseMatmulOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& features = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    Dims d;
    OP_REQUIRES_OK(ctx, ValidateShapes(&features, indices, &weights, nullptr, &d));
    OP_REQUIRES_OK(ctx, ValidateIndexRange(ctx, indices, d.num_features));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({d.batch, d.num_labels}), &scores));
    if (d.batch == 0 || d.num_labels == 0) return;
    T* out = scores->flat<T>().data();

    Tensor featT_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({d.num_features, d.batch}), &featT_t));
    float* featT = featT_t.flat<float>().data();
    TransposeFeatures(ctx, features.flat<T>().data(), d.batch, d.num_features,
                      featT);
    std::vector<float> w_storage;
    const float* w = AsFloat<T>(weights, &w_storage);
    const int32_t* idx = indices.flat<int32_t>().data();

    const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, num_tiles,
        2 * kTile * d.fan_in * d.batch, [&](int64_t start, int64_t limit) {
          std::vector<float> acc(kTile * d.batch);
          for (int64_t tile = start; tile < limit; ++tile) {
            const int64_t j0 = tile * kTile;
            const int64_t nt = std::min(kTile, d.num_labels - j0);
            ForwardTile(featT, d.batch, idx + j0 * d.fan_in,
                        w + j0 * d.fan_in, nt, d.fan_in, acc.data());
            for (int64_t i = 0; i < d.batch; ++i) {
              T* row = out + i * d.num_labels + j0;
              for (int64_t t = 0; t < nt; ++t) {
                row[t] = static_cast<T>(acc[t * d.batch + i]);
              }
            }
          }
        });
  }
};

template <typename T>
class UniformSparseMatmulGradFeaturesOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradFeaturesOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& features = ctx->input(1);
    const Tensor& indices = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    Dims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, &weights, &backward, &d));
    OP_REQUIRES_OK(ctx, ValidateIndexRange(ctx, indices, d.num_features));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, features.shape(), &grad));
    const int64_t out_size = d.batch * d.num_features;
    if (out_size == 0) return;

    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    // Split labels into chunks when the batch alone cannot keep every thread
    // busy; each (instance, chunk) unit then owns a private row.
    const int64_t threads = std::max(1, workers->num_threads);
    int64_t chunks = 1;
    if (d.batch < 2 * threads && d.num_labels >= 4096) {
      chunks = std::min<int64_t>((2 * threads + d.batch - 1) / d.batch,
                                 d.num_labels / 2048);
    }
    const bool direct = chunks == 1 && std::is_same<T, float>::value;
    Tensor buffer_t;
    float* buffer = nullptr;
    if (direct) {
      buffer = reinterpret_cast<float*>(grad->flat<T>().data());
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({chunks, d.batch, d.num_features}),
                              &buffer_t));
      buffer = buffer_t.flat<float>().data();
    }
    const T* back = backward.flat<T>().data();
    const T* w = weights.flat<T>().data();
    const int32_t* idx = indices.flat<int32_t>().data();
    const int64_t per_chunk = (d.num_labels + chunks - 1) / chunks;
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, d.batch * chunks,
        per_chunk * 4 + d.num_features, [&](int64_t start, int64_t limit) {
          for (int64_t u = start; u < limit; ++u) {
            const int64_t c = u / d.batch, i = u % d.batch;
            float* row = buffer + (c * d.batch + i) * d.num_features;
            std::fill(row, row + d.num_features, 0.0f);
            GradFeaturesRow<T>(back + i * d.num_labels, idx, w, c * per_chunk,
                               std::min(d.num_labels, (c + 1) * per_chunk),
                               d.fan_in, row);
          }
        });
    if (direct) return;
    T* out = grad->flat<T>().data();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, out_size, chunks,
        [&](int64_t start, int64_t limit) {
          for (int64_t p = start; p < limit; ++p) {
            float s = 0.0f;
            for (int64_t c = 0; c < chunks; ++c) s += buffer[c * out_size + p];
            out[p] = static_cast<T>(s);
          }
        });
  }
};

template <typename T>
class UniformSparseMatmulGradWeightsOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& features = ctx->input(1);
    const Tensor& indices = ctx->input(2);
    Dims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, nullptr, &backward, &d));
    OP_REQUIRES_OK(ctx, ValidateIndexRange(ctx, indices, d.num_features));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, indices.shape(), &grad));
    if (d.num_labels == 0 || d.fan_in == 0) return;
    T* out = grad->flat<T>().data();
    const T* back = backward.flat<T>().data();
    const T* feat = features.flat<T>().data();
    const int32_t* idx = indices.flat<int32_t>().data();

    // Transposing the features costs batch * num_features; it pays off when
    // the non-zero signal makes many gathers (each then reads a contiguous
    // row of featT instead of one float per instance).
    const double density = EstimateDensity(back, d.batch * d.num_labels);
    const double gathers = density * d.batch * d.num_labels * d.fan_in;
    float* featT = nullptr;
    Tensor featT_t;
    if (d.batch > 0 && gathers * 4.0 > static_cast<double>(d.batch) * d.num_features) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({d.num_features, d.batch}), &featT_t));
      featT = featT_t.flat<float>().data();
      TransposeFeatures(ctx, feat, d.batch, d.num_features, featT);
    }

    const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, num_tiles,
        kTile * d.batch * (1 + static_cast<int64_t>(density * d.fan_in * 4)),
        [&](int64_t start, int64_t limit) {
          std::vector<float> column(kTile * d.batch);  // backward[:, j] per t
          std::vector<int64_t> nnz(kTile);
          std::vector<int32_t> nz_i;
          std::vector<float> nz_g;
          for (int64_t tile = start; tile < limit; ++tile) {
            const int64_t j0 = tile * kTile;
            const int64_t nt = std::min(kTile, d.num_labels - j0);
            std::fill(nnz.begin(), nnz.end(), 0);
            for (int64_t i = 0; i < d.batch; ++i) {
              const T* row = back + i * d.num_labels + j0;
              for (int64_t t = 0; t < nt; ++t) {
                const float g = static_cast<float>(row[t]);
                column[t * d.batch + i] = g;
                nnz[t] += g != 0.0f;
              }
            }
            for (int64_t t = 0; t < nt; ++t) {
              const int64_t j = j0 + t;
              T* gj = out + j * d.fan_in;
              if (nnz[t] == 0) {  // no signal: indices[j, :] is not read
                std::fill(gj, gj + d.fan_in, static_cast<T>(0.0f));
                continue;
              }
              const float* col = column.data() + t * d.batch;
              const int32_t* ij = idx + j * d.fan_in;
              if (featT != nullptr && nnz[t] * 4 >= d.batch) {
                for (int64_t k = 0; k < d.fan_in; ++k) {
                  gj[k] = static_cast<T>(DenseDotSkipZeros(
                      col, featT + static_cast<int64_t>(ij[k]) * d.batch,
                      d.batch));
                }
                continue;
              }
              nz_i.clear();
              nz_g.clear();
              for (int64_t i = 0; i < d.batch; ++i) {
                if (col[i] != 0.0f) {
                  nz_i.push_back(static_cast<int32_t>(i));
                  nz_g.push_back(col[i]);
                }
              }
              const int64_t n = static_cast<int64_t>(nz_i.size());
              for (int64_t k = 0; k < d.fan_in; ++k) {
                const int64_t src = ij[k];
                float s = 0.0f;
                if (featT != nullptr) {
                  const float* frow = featT + src * d.batch;
                  for (int64_t q = 0; q < n; ++q) s += nz_g[q] * frow[nz_i[q]];
                } else {
                  for (int64_t q = 0; q < n; ++q) {
                    s += nz_g[q] * static_cast<float>(
                                       feat[nz_i[q] * d.num_features + src]);
                  }
                }
                gj[k] = static_cast<T>(s);
              }
            }
          }
        });
  }
};

#define REGISTER_CPU(T)                                                      \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmul")                    \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulOp<T>);                         \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradFeatures")        \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradFeaturesOp<T>);             \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradWeights")         \
                              .Device(DEVICE_CPU)                            \
                              .TypeConstraint<T>("T"),                       \
                          UniformSparseMatmulGradWeightsOp<T>);

REGISTER_CPU(float);
REGISTER_CPU(Eigen::half);
REGISTER_CPU(Eigen::bfloat16);
#undef REGISTER_CPU

// ---------------------------------------------------------------------------
// GPU kernels: framework-free CUDA launchers (uniform_sparse_kernels.cu.cc)
// called on TensorFlow's stream.  float32 only.

#if XMC_TF_WITH_CUDA

void* CudaStream(OpKernelContext* ctx) {
  auto* device_context = ctx->op_device_context();
  if (device_context == nullptr || device_context->stream() == nullptr) {
    return nullptr;
  }
  return device_context->stream()->platform_specific_handle().stream;
}

// Runs `launch(error_scratch, &bad_position, stream)` and turns its result
// into the op status.
template <typename Launch>
void RunGpu(OpKernelContext* ctx, const Tensor& indices, int64_t num_features,
            Launch launch) {
  void* stream = CudaStream(ctx);
  OP_REQUIRES(ctx, stream != nullptr,
              errors::Internal("xmc_tf: no CUDA stream for this GPU kernel"));
  Tensor scratch;
  OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_INT64,
                                         TensorShape({1}), &scratch));
  int64_t bad_position = -1;
  const int err = launch(scratch.flat<int64_t>().data(), &bad_position, stream);
  OP_REQUIRES(ctx, err == 0,
              errors::Internal("xmc_tf: CUDA error ", err,
                               " in a uniform-sparse kernel"));
  if (bad_position >= 0) {
    // The index values live on the device; name the position.
    const int64_t fan_in = indices.dim_size(1);
    ctx->CtxFailure(errors::InvalidArgument(
        "indices[", bad_position / fan_in, ", ", bad_position % fan_in,
        "] is out of range [0, ", num_features, ") (num_features)"));
  }
}

class UniformSparseMatmulGpuOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGpuOp(OpKernelConstruction* c) : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& features = ctx->input(0);
    const Tensor& indices = ctx->input(1);
    const Tensor& weights = ctx->input(2);
    Dims d;
    OP_REQUIRES_OK(ctx, ValidateShapes(&features, indices, &weights, nullptr, &d));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0, TensorShape({d.batch, d.num_labels}), &scores));
    RunGpu(ctx, indices, d.num_features,
           [&](int64_t* scratch, int64_t* bad, void* stream) {
             return XmcUniformSparseForwardGpuF32(
                 features.flat<float>().data(), indices.flat<int32_t>().data(),
                 weights.flat<float>().data(), scores->flat<float>().data(),
                 d.batch, d.num_features, d.num_labels, d.fan_in, scratch, bad,
                 stream);
           });
  }
};

class UniformSparseMatmulGradFeaturesGpuOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradFeaturesGpuOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& features = ctx->input(1);
    const Tensor& indices = ctx->input(2);
    const Tensor& weights = ctx->input(3);
    Dims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, &weights, &backward, &d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, features.shape(), &grad));
    RunGpu(ctx, indices, d.num_features,
           [&](int64_t* scratch, int64_t* bad, void* stream) {
             return XmcUniformSparseGradFeaturesGpuF32(
                 backward.flat<float>().data(), indices.flat<int32_t>().data(),
                 weights.flat<float>().data(), grad->flat<float>().data(),
                 d.batch, d.num_features, d.num_labels, d.fan_in, scratch, bad,
                 stream);
           });
  }
};

class UniformSparseMatmulGradWeightsGpuOp : public OpKernel {
 public:
  explicit UniformSparseMatmulGradWeightsGpuOp(OpKernelConstruction* c)
      : OpKernel(c) {}
  void Compute(OpKernelContext* ctx) override {
    const Tensor& backward = ctx->input(0);
    const Tensor& features = ctx->input(1);
    const Tensor& indices = ctx->input(2);
    Dims d;
    OP_REQUIRES_OK(ctx,
                   ValidateShapes(&features, indices, nullptr, &backward, &d));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, indices.shape(), &grad));
    RunGpu(ctx, indices, d.num_features,
           [&](int64_t* scratch, int64_t* bad, void* stream) {
             return XmcUniformSparseGradWeightsGpuF32(
                 backward.flat<float>().data(), features.flat<float>().data(),
                 indices.flat<int32_t>().data(), grad->flat<float>().data(),
                 d.batch, d.num_features, d.num_labels, d.fan_in, scratch, bad,
                 stream);
           });
  }
};

REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmul")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T"),
                        UniformSparseMatmulGpuOp);
REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradFeatures")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T"),
                        UniformSparseMatmulGradFeaturesGpuOp);
REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseMatmulGradWeights")
                            .Device(DEVICE_GPU)
                            .TypeConstraint<float>("T"),
                        UniformSparseMatmulGradWeightsGpuOp);

#endif  // XMC_TF_WITH_CUDA

}  // namespace
}  // namespace xmc_tf
