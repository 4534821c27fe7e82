// CPU kernels (and, when built with nvcc, GPU registrations) of the
// uniform-sparse op family.  See uniform_sparse_ops.cc for the op contracts.
//
// Source: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3, Algorithms 1-3.
//
// CPU design (all three kernels run on TensorFlow's intra-op thread pool; the
// hot loops are in uniform_sparse_cpu_loops.h, compiled for AVX-512, AVX2 +
// FMA and baseline x86-64 and picked at run time by CPU features):
//  * Forward: features are first transposed to featT [num_features, bp]
//    (float32, the batch padded with zeros to bp, a multiple of 16).  Labels
//    are processed in tiles of kTile; every connection (j, k) adds
//    weights[j, k] * featT[indices[j, k], :] to the label's accumulators,
//    held in vector registers (four independent partial sums over k).  The
//    tile's results are written to scores[:, j0:j0+kTile] row by row.
//  * Gradient w.r.t. features: when the backward signal has on average at
//    least one non-zero per label column (kDenseColumnEntries), the
//    transpose of the forward: each thread takes a range of label tiles,
//    gathers their backward columns, and adds weights[j, k] * column to row
//    indices[j, k] of a private gT [num_features, bp] buffer (a vector
//    read-modify-write per connection); the buffers are then summed into
//    grad [batch, num_features].  A label with an all-zero column is
//    skipped without reading its indices or weights (Sec. 3.3); a label
//    with a non-finite weight adds its non-zero entries one by one.  For a
//    sparser signal (or when the buffers would be too large), work units
//    are (instance i, chunk of labels) as before: each unit owns its output
//    row (or a private buffer when there are more chunks than one), and a
//    zero backward[i, j] skips label j without reading it.
//  * Gradient w.r.t. weights: labels are processed in tiles; a tile's
//    backward columns are gathered once, a label whose column is all zero
//    writes zeros without reading its indices, a sparse column visits only
//    its non-zero instances, a dense one computes the dot products of its
//    column with the featT rows of its connections, sixteen connections at
//    a time (register accumulators, one shuffle-tree reduction).  In every
//    path (and on the GPU) a zero backward[i, j] contributes
//    exactly 0 to grad_weights[j, :], even where features[i, indices[j, k]]
//    is inf or NaN (no 0 * inf = NaN): which outputs are non-finite does not
//    depend on the density of backward.  The same holds for the gradient
//    w.r.t. features (zero entries are skipped there too).
//  * Every kernel validates ranks, shapes and the index range first and fails
//    with InvalidArgument naming the offending entry.

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "ops/uniform_sparse/uniform_sparse_cpu_loops.h"
#include "ops/uniform_sparse/uniform_sparse_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

#if XMC_TF_WITH_CUDA
#include "xla/stream_executor/stream.h"
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

constexpr int64_t kTile = 16;  // labels per tile (forward, gradients)
// The features gradient takes the tiled (transposed-forward) path when the
// backward signal has at least this many non-zeros per label column on
// average (estimated), and its per-thread buffers fit in kMaxScatterBytes.
constexpr double kDenseColumnEntries = 1.0;
constexpr int64_t kMaxScatterBytes = int64_t{1} << 30;

using cpu_loops::CpuIsa;
using cpu_loops::Isa;
using cpu_loops::PaddedBatch;

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
// Scalar helpers (the vectorised loops are in uniform_sparse_cpu_loops.h).

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

// sum_i a[i] * b[i] over the terms with a[i] != 0: a zero entry of the
// backward signal `a` contributes exactly 0, also against an inf or NaN
// feature in `b` (where the product would be NaN).  This is what skipping
// zero entries means (Sec. 3.3).  The vectorised dense dot products run
// first; a finite result implies that every product was finite, and it then
// equals this masked sum (adding a +-0 product to a sum that starts at +0
// changes nothing).  Only a non-finite result is recomputed here (rare:
// inf/NaN features or overflow).
float MaskedDot(const float* a, const float* b, int64_t n) {
  float t = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    if (a[i] != 0.0f) t += a[i] * b[i];
  }
  return t;
}

bool AllFinite(const float* w, int64_t n) {
  float acc = 0.0f;  // inf/NaN anywhere makes w * 0 NaN
  for (int64_t k = 0; k < n; ++k) acc += w[k] * 0.0f;
  return acc == 0.0f;
}

// Gathers backward[:, j0:j0+nt] into column[t * bp + i] (zero for i >= batch)
// and counts the non-zeros of each column into nnz[t].
template <typename T>
void GatherColumns(const T* back, int64_t batch, int64_t num_labels,
                   int64_t j0, int64_t nt, int64_t bp, float* column,
                   int64_t* nnz) {
  std::fill(nnz, nnz + nt, 0);
  for (int64_t i = 0; i < batch; ++i) {
    const T* row = back + i * num_labels + j0;
    for (int64_t t = 0; t < nt; ++t) {
      const float g = static_cast<float>(row[t]);
      column[t * bp + i] = g;
      nnz[t] += g != 0.0f;
    }
  }
  for (int64_t t = 0; t < nt; ++t) {
    std::fill(column + t * bp + batch, column + (t + 1) * bp, 0.0f);
  }
}

// Tiled parallel transpose of features [batch, num_features] into float32
// featT [num_features, bp] (bp >= batch; columns batch..bp-1 zero).
template <typename T>
void TransposeFeatures(OpKernelContext* ctx, const T* features, int64_t batch,
                       int64_t num_features, int64_t bp, float* featT) {
  constexpr int64_t kBlock = 32;
  const int64_t row_blocks = (num_features + kBlock - 1) / kBlock;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(
      workers->num_threads, workers->workers, row_blocks, bp * kBlock * 2,
      [&](int64_t start, int64_t limit) {
        for (int64_t rb = start; rb < limit; ++rb) {
          const int64_t f0 = rb * kBlock;
          const int64_t f1 = std::min(num_features, f0 + kBlock);
          for (int64_t i0 = 0; i0 < batch; i0 += kBlock) {
            const int64_t i1 = std::min(batch, i0 + kBlock);
            for (int64_t i = i0; i < i1; ++i) {
              const T* src = features + i * num_features;
              for (int64_t f = f0; f < f1; ++f) {
                featT[f * bp + i] = static_cast<float>(src[f]);
              }
            }
          }
          if (bp > batch) {
            for (int64_t f = f0; f < f1; ++f) {
              std::fill(featT + f * bp + batch, featT + (f + 1) * bp, 0.0f);
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

    const int64_t bp = PaddedBatch(d.batch);
    Tensor featT_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({d.num_features, bp}), &featT_t));
    float* featT = featT_t.flat<float>().data();
    TransposeFeatures(ctx, features.flat<T>().data(), d.batch, d.num_features,
                      bp, featT);
    std::vector<float> w_storage;
    const float* w = AsFloat<T>(weights, &w_storage);
    const int32_t* idx = indices.flat<int32_t>().data();
    const Isa isa = CpuIsa();

    const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, num_tiles,
        2 * kTile * d.fan_in * bp, [&](int64_t start, int64_t limit) {
          std::vector<float> acc(kTile * bp);
          for (int64_t tile = start; tile < limit; ++tile) {
            const int64_t j0 = tile * kTile;
            const int64_t nt = std::min(kTile, d.num_labels - j0);
            cpu_loops::ForwardLabels(isa, featT, bp, idx + j0 * d.fan_in,
                                     w + j0 * d.fan_in, nt, d.fan_in,
                                     acc.data());
            for (int64_t i = 0; i < d.batch; ++i) {
              T* row = out + i * d.num_labels + j0;
              for (int64_t t = 0; t < nt; ++t) {
                row[t] = static_cast<T>(acc[t * bp + i]);
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
    const int64_t threads = std::max(1, workers->num_threads);
    const T* back = backward.flat<T>().data();
    const int64_t bp = PaddedBatch(d.batch);
    const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
    const int64_t parts = std::max<int64_t>(1, std::min(threads, num_tiles));
    const double density = EstimateDensity(back, d.batch * d.num_labels);
    if (density * d.batch >= kDenseColumnEntries && d.num_labels > 0 &&
        static_cast<double>(parts) * d.num_features * bp * 4 <=
            static_cast<double>(kMaxScatterBytes)) {
      ScatterTiles(ctx, d, back, indices, weights, bp, num_tiles, parts,
                   grad->flat<T>().data());
      return;
    }
    // Per instance: split labels into chunks when the batch alone cannot
    // keep every thread busy; each (instance, chunk) unit then owns a
    // private row.
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

 private:
  // The tiled path (see the file comment): `parts` label ranges, each
  // scattered into its own gT [num_features, bp] buffer, then summed and
  // transposed into out [batch, num_features].
  static void ScatterTiles(OpKernelContext* ctx, const Dims& d, const T* back,
                           const Tensor& indices, const Tensor& weights,
                           int64_t bp, int64_t num_tiles, int64_t parts,
                           T* out) {
    Tensor gT_t;
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                            ::tensorflow::DT_FLOAT,
                            TensorShape({parts, d.num_features, bp}), &gT_t));
    float* gT_all = gT_t.flat<float>().data();
    std::vector<float> w_storage;
    const float* w = AsFloat<T>(weights, &w_storage);
    const int32_t* idx = indices.flat<int32_t>().data();
    const Isa isa = CpuIsa();
    const int64_t slice = d.num_features * bp;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, parts,
        std::max<int64_t>(1, num_tiles / parts) * kTile * d.fan_in * bp,
        [&](int64_t start, int64_t limit) {
          std::vector<float> column(kTile * bp);
          std::vector<int64_t> nnz(kTile);
          for (int64_t part = start; part < limit; ++part) {
            float* gT = gT_all + part * slice;
            std::fill(gT, gT + slice, 0.0f);
            const int64_t t0 = num_tiles * part / parts;
            const int64_t t1 = num_tiles * (part + 1) / parts;
            for (int64_t tile = t0; tile < t1; ++tile) {
              const int64_t j0 = tile * kTile;
              const int64_t nt = std::min(kTile, d.num_labels - j0);
              GatherColumns(back, d.batch, d.num_labels, j0, nt, bp,
                            column.data(), nnz.data());
              for (int64_t t = 0; t < nt; ++t) {
                if (nnz[t] == 0) continue;  // no signal: nothing is read
                const int64_t j = j0 + t;
                const int32_t* ij = idx + j * d.fan_in;
                const float* wj = w + j * d.fan_in;
                const float* col = column.data() + t * bp;
                if (AllFinite(wj, d.fan_in)) {
                  cpu_loops::GradFeaturesScatter(isa, gT, bp, col, ij, wj,
                                                 d.fan_in);
                  continue;
                }
                // A non-finite weight: only the non-zero entries multiply it.
                for (int64_t i = 0; i < d.batch; ++i) {
                  if (col[i] == 0.0f) continue;
                  for (int64_t k = 0; k < d.fan_in; ++k) {
                    gT[static_cast<int64_t>(ij[k]) * bp + i] += col[i] * wj[k];
                  }
                }
              }
            }
          }
        });
    // out[i, f] = sum over parts of gT[part, f, i], in blocks of features.
    constexpr int64_t kBlock = 64;
    const int64_t blocks = (d.num_features + kBlock - 1) / kBlock;
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, blocks,
        kBlock * bp * (parts + 1), [&](int64_t start, int64_t limit) {
          for (int64_t blk = start; blk < limit; ++blk) {
            const int64_t f0 = blk * kBlock;
            const int64_t f1 = std::min(d.num_features, f0 + kBlock);
            for (int64_t part = 1; part < parts; ++part) {
              const float* src = gT_all + part * slice;
              for (int64_t q = f0 * bp; q < f1 * bp; ++q) gT_all[q] += src[q];
            }
            for (int64_t i = 0; i < d.batch; ++i) {
              T* row = out + i * d.num_features;
              for (int64_t f = f0; f < f1; ++f) {
                row[f] = static_cast<T>(gT_all[f * bp + i]);
              }
            }
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
    const int64_t bp = PaddedBatch(d.batch);
    float* featT = nullptr;
    Tensor featT_t;
    if (d.batch > 0 && gathers * 4.0 > static_cast<double>(d.batch) * d.num_features) {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({d.num_features, bp}), &featT_t));
      featT = featT_t.flat<float>().data();
      TransposeFeatures(ctx, feat, d.batch, d.num_features, bp, featT);
    }
    const Isa isa = CpuIsa();

    const int64_t num_tiles = (d.num_labels + kTile - 1) / kTile;
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, num_tiles,
        kTile * d.batch * (1 + static_cast<int64_t>(density * d.fan_in * 4)),
        [&](int64_t start, int64_t limit) {
          std::vector<float> column(kTile * bp);  // backward[:, j] per t
          std::vector<int64_t> nnz(kTile);
          std::vector<float> sums(d.fan_in);
          std::vector<int32_t> nz_i;
          std::vector<float> nz_g;
          for (int64_t tile = start; tile < limit; ++tile) {
            const int64_t j0 = tile * kTile;
            const int64_t nt = std::min(kTile, d.num_labels - j0);
            GatherColumns(back, d.batch, d.num_labels, j0, nt, bp,
                          column.data(), nnz.data());
            for (int64_t t = 0; t < nt; ++t) {
              const int64_t j = j0 + t;
              T* gj = out + j * d.fan_in;
              if (nnz[t] == 0) {  // no signal: indices[j, :] is not read
                std::fill(gj, gj + d.fan_in, static_cast<T>(0.0f));
                continue;
              }
              const float* col = column.data() + t * bp;
              const int32_t* ij = idx + j * d.fan_in;
              if (featT != nullptr && nnz[t] * 4 >= d.batch) {
                cpu_loops::GradWeightsDense(isa, featT, bp, col, ij, d.fan_in,
                                            sums.data());
                for (int64_t k = 0; k < d.fan_in; ++k) {
                  float v = sums[k];
                  if (!std::isfinite(v)) {  // see MaskedDot
                    v = MaskedDot(col,
                                  featT + static_cast<int64_t>(ij[k]) * bp,
                                  d.batch);
                  }
                  gj[k] = static_cast<T>(v);
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
                  const float* frow = featT + src * bp;
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
