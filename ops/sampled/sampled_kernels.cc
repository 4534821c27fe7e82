// CPU kernels (and, when built with nvcc, GPU registrations) of the
// sampled-scoring op family.  See sampled_ops.cc for the op contracts.
//
// Sources: Schultheis & Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces", Sec. 3.2-3.3 (uniform-sparse layer,
// zero-skipping backward); Mehta et al., ASTRA, Algorithm 1 (score only the
// positives and the sampled negatives of each instance).
//
// Notation: b = batch, e = num_features, m = num_labels, s = fan_in,
// c = num_candidates; a "position" p = i * c + j is one (instance,
// candidate) pair.
//
// Structure: one OpKernel class per op, templated on the device (ops/common/
// device.h) and the dtype: it reads the operands (WeightsOperand for the
// Resource* variants), checks ranks and shapes and allocates the output,
// then calls functor::SampledMatmul / SampledMatmulGradFeatures /
// SampledMatmulGradWeights<Device, T> (sampled_kernels.h).  The CPU
// functors are below; the GPU ones (float32, behind XMC_TF_WITH_CUDA) call
// the launchers of sampled_kernels.cu.cc, which range-check on the device.
//
// CPU design (all functors run on TensorFlow's intra-op thread pool):
//  * Every functor first range-checks every candidate (b * c int32 reads,
//    cheap; ops/common/bad_index.h) and fails with InvalidArgument naming
//    the first bad entry.
//  * Forward and the weight gradient shard the b * c positions; the feature
//    gradient shards instances (each unit owns its output row, or a private
//    buffer row when c is split into chunks for small batches), so no two
//    threads write the same memory and no atomics are needed.
//  * The rows indices[r, :] / weights[r, :] of the candidate labels are
//    scattered over the [m, s] matrices (128 MiB each at m = 1M, s = 32), so
//    the kernels are bound by the latency of those cache misses: the rows of
//    the position kAhead ahead are prefetched.  The feature row of an
//    instance (e floats) stays in L1/L2 across its c candidates.
//  * A label row is range-checked where it is read (one vectorisable pass of
//    s compares before its use); checking all m * s indices would cost more
//    than the sampled product.  A bad entry is recorded (smallest flat
//    position r * s + k wins), never used as an address, and reported after
//    the pass.
//  * The backward kernels skip a zero backward[i, j] without reading the
//    candidate's indices, weights or the features (squared hinge: most
//    entries are zero).
//  * The Resource* variants read the weights from a resource variable in
//    place (WeightsOperand), so a training step never copies the whole
//    [m, s] weights (see WeightsOperand for TensorFlow's copy-on-read mode).
//
// Hot loops (CpuLoops): picked once per kernel call by CPU features
// (ops/common/cpu_isa.h; XMC_TF_CPU_ISA=avx512|avx2|base lowers the choice):
// the gathers use AVX2 hardware gathers (vgatherdps) on AVX2 / AVX-512 CPUs,
// else portable code; the index check is compiled for each instruction set,
// so the library runs on any x86-64 CPU that TensorFlow runs on.  (GCC's
// target_clones, used before, picked by CPU *model* and ran the SSE2 clone
// on AMD CPUs.)

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <string>
#include <optional>
#include <type_traits>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/cpu_isa.h"
#include "ops/common/gpu.h"
#include "ops/common/sum_chunks.h"
#include "ops/common/validation.h"
#include "ops/sampled/sampled_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/register_types.h"
#include "tensorflow/core/framework/resource_mgr.h"
#include "tensorflow/core/framework/resource_var.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/platform/mutex.h"
#include "tensorflow/core/util/work_sharder.h"

#if XMC_CPU_MULTI_ISA
#include <immintrin.h>
#endif

namespace xmc_tf {

namespace {

constexpr int64_t kAhead = 8;  // prefetch distance, in positions

// ---------------------------------------------------------------------------
// Validation shared by the CPU and GPU kernels.

// Checks ranks and shapes; `weights` and `backward` may be absent (nullptr).
Status ValidateSampledShapes(const Tensor& features, const Tensor& indices,
                             const Tensor* weights, const Tensor& candidates,
                             const Tensor* backward, SampledDims* d) {
  TF_RETURN_IF_ERROR(CheckMatrix(features, "features"));
  TF_RETURN_IF_ERROR(CheckMatrix(indices, "indices"));
  TF_RETURN_IF_ERROR(CheckMatrix(candidates, "candidates"));
  d->batch = features.dim_size(0);
  d->num_features = features.dim_size(1);
  d->num_labels = indices.dim_size(0);
  d->fan_in = indices.dim_size(1);
  d->num_candidates = candidates.dim_size(1);
  TF_RETURN_IF_ERROR(CheckInt32Indexable(d->num_features, "num_features"));
  if (weights != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*weights, "weights"));
    TF_RETURN_IF_ERROR(CheckSameShape(*weights, "weights", indices, "indices",
                                      "[num_labels, fan_in]"));
  }
  if (candidates.dim_size(0) != d->batch) {
    return errors::InvalidArgument(
        "candidates shape ", candidates.shape().DebugString(),
        " must be [batch, num_candidates] with batch = ", d->batch,
        " (rows of features)");
  }
  if (backward != nullptr) {
    TF_RETURN_IF_ERROR(CheckMatrix(*backward, "backward"));
    TF_RETURN_IF_ERROR(CheckSameShape(*backward, "backward", candidates,
                                      "candidates", "[batch, num_candidates]"));
  }
  return ::tensorflow::OkStatus();
}

// The weights operand of a kernel: input `index` itself, or (the Resource*
// ops) the buffer of the resource variable that input `index` points to,
// read in place under the variable's shared lock for the kernel's lifetime.
// TensorFlow puts a variable that has seen a sparse op (the optimizer's
// scatter of our IndexedSlices gradient) in copy-on-read mode, where every
// dense read (ReadVariableOp) copies the whole [num_labels, fan_in] buffer;
// reading in place avoids that copy, as ResourceGather does.
class WeightsOperand {
 public:
  Status Init(OpKernelContext* ctx, int index, bool resource,
              ::tensorflow::DataType dtype) {
    if (!resource) {
      tensor_ = &ctx->input(index);
      return ::tensorflow::OkStatus();
    }
    TF_RETURN_IF_ERROR(::tensorflow::LookupResource(
        ctx, ::tensorflow::HandleFromInput(ctx, index), &var_));
    lock_.emplace(*var_->mu());
    tensor_ = var_->tensor();
    if (!tensor_->IsInitialized()) {
      return errors::FailedPrecondition(
          "the weights variable is not initialized");
    }
    if (tensor_->dtype() != dtype) {
      return errors::InvalidArgument(
          "the weights variable has dtype ",
          ::tensorflow::DataTypeString(tensor_->dtype()),
          ", the features have ", ::tensorflow::DataTypeString(dtype));
    }
    return ::tensorflow::OkStatus();
  }
  const Tensor& tensor() const { return *tensor_; }

 private:
  ::tensorflow::core::RefCountPtr<::tensorflow::Var> var_;
  std::optional<::tensorflow::tf_shared_lock> lock_;  // released before var_
  const Tensor* tensor_ = nullptr;
};

// Range check of every candidate against [0, num_labels).
Status ValidateCandidates(OpKernelContext* ctx, const int32_t* cand,
                          const SampledDims& d) {
  const int64_t p =
      FirstOutOfRange(ctx, cand, d.batch * d.num_candidates, 0, d.num_labels);
  if (p < 0) return ::tensorflow::OkStatus();
  return OutOfRange("candidates", TensorShape({d.batch, d.num_candidates}), p,
                    cand[p], 0, d.num_labels, "num_labels");
}

// Error for the bad entry at flat position `position` of indices.  Names the
// first position p (i * c + j) whose candidate is that label and for which
// used(p) holds (the pair that read the row).
Status BadIndexError(const int32_t* idx, const int32_t* cand,
                     const SampledDims& d, int64_t position,
                     const std::function<bool(int64_t)>& used) {
  const int64_t label = position / d.fan_in;
  const int64_t c = d.num_candidates;
  int64_t where = -1;
  for (int64_t p = 0; p < d.batch * c; ++p) {
    if (cand[p] == label && used(p)) {
      where = p;
      break;
    }
  }
  std::string message = OutOfRangeMessage(
      "indices", TensorShape({d.num_labels, d.fan_in}), position,
      idx[position], 0, d.num_features, "num_features");
  if (where >= 0) {
    absl::StrAppend(&message, "; label ", label, " is candidates[", where / c,
                    ", ", where % c, "]");
  }
  return errors::InvalidArgument(message);
}

// ---------------------------------------------------------------------------
// Hot loops.

// True when every idx[k] < bound (unsigned: negative values fail too);
// compiled for each instruction set (one vectorised pass of compares).
#define XMC_SAMPLED_ROW_IN_RANGE_BODY                                   \
  bool RowInRange(const int32_t* idx, int64_t n, uint32_t bound) {      \
    uint32_t bad = 0;                                                   \
    for (int64_t k = 0; k < n; ++k) {                                   \
      bad |= static_cast<uint32_t>(static_cast<uint32_t>(idx[k]) >= bound); \
    }                                                                   \
    return bad == 0;                                                    \
  }
namespace base {
XMC_SAMPLED_ROW_IN_RANGE_BODY
}  // namespace base
#if XMC_CPU_MULTI_ISA
XMC_CPU_BEGIN_AVX512
namespace avx512 {
XMC_SAMPLED_ROW_IN_RANGE_BODY
}  // namespace avx512
XMC_CPU_END
XMC_CPU_BEGIN_AVX2
namespace avx2 {
XMC_SAMPLED_ROW_IN_RANGE_BODY
}  // namespace avx2
XMC_CPU_END
#endif
#undef XMC_SAMPLED_ROW_IN_RANGE_BODY

// Records the first out-of-range entry of label row `label` (known bad).
void RecordBadRow(const int32_t* row, int64_t label, int64_t fan_in,
                  uint32_t bound, FirstBad* bad) {
  for (int64_t k = 0; k < fan_in; ++k) {
    if (static_cast<uint32_t>(row[k]) >= bound) {
      bad->Record(label * fan_in + k);
      return;
    }
  }
}

// sum_k x[idx[k]] * w[k] and out[k] = g * x[idx[k]]: portable versions
// (independent partial sums: a plain float reduction is not vectorised
// without -ffast-math) and AVX2 versions with hardware gathers, picked once
// at run time.  The indices must have been range-checked (RowInRange): a
// gather never sees an out-of-range index.
float GatherDotPortable(const float* x, const int32_t* idx, const float* w,
                        int64_t n) {
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int l = 0; l < 4; ++l) acc[l] += x[idx[k + l]] * w[k + l];
  }
  float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
  for (; k < n; ++k) s += x[idx[k]] * w[k];
  return s;
}

void ScaledGatherPortable(float g, const float* x, const int32_t* idx,
                          int64_t n, float* out) {
  for (int64_t k = 0; k < n; ++k) out[k] = g * x[idx[k]];
}

#if XMC_CPU_MULTI_ISA
__attribute__((target("avx2,fma"))) float GatherDotAvx2(const float* x,
                                                         const int32_t* idx,
                                                         const float* w,
                                                         int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m256i i0 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + k));
    const __m256i i1 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + k + 8));
    acc0 = _mm256_fmadd_ps(_mm256_i32gather_ps(x, i0, 4),
                           _mm256_loadu_ps(w + k), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_i32gather_ps(x, i1, 4),
                           _mm256_loadu_ps(w + k + 8), acc1);
  }
  if (k + 8 <= n) {
    const __m256i i0 =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + k));
    acc0 = _mm256_fmadd_ps(_mm256_i32gather_ps(x, i0, 4),
                           _mm256_loadu_ps(w + k), acc0);
    k += 8;
  }
  const __m256 acc = _mm256_add_ps(acc0, acc1);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc),
                        _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  float s = _mm_cvtss_f32(h);
  for (; k < n; ++k) s += x[idx[k]] * w[k];
  return s;
}

__attribute__((target("avx2,fma"))) void ScaledGatherAvx2(
    float g, const float* x, const int32_t* idx, int64_t n, float* out) {
  const __m256 gv = _mm256_set1_ps(g);
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256i iv =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(idx + k));
    _mm256_storeu_ps(out + k,
                     _mm256_mul_ps(gv, _mm256_i32gather_ps(x, iv, 4)));
  }
  for (; k < n; ++k) out[k] = g * x[idx[k]];
}

#endif  // XMC_CPU_MULTI_ISA

// The hot loops of one instruction set, picked once per kernel call
// (CpuLoops::For(cpu::CpuIsa())): AVX-512 CPUs use the AVX2 gathers (the
// 8-wide hardware gather; the index check is compiled for AVX-512).
struct CpuLoops {
  bool (*row_in_range)(const int32_t* idx, int64_t n, uint32_t bound);
  float (*gather_dot)(const float* x, const int32_t* idx, const float* w,
                      int64_t n);
  void (*scaled_gather)(float g, const float* x, const int32_t* idx,
                        int64_t n, float* out);

  static CpuLoops For(cpu::Isa isa) {
#if XMC_CPU_MULTI_ISA
    if (isa == cpu::Isa::kAvx512) {
      return {avx512::RowInRange, GatherDotAvx2, ScaledGatherAvx2};
    }
    if (isa == cpu::Isa::kAvx2) {
      return {avx2::RowInRange, GatherDotAvx2, ScaledGatherAvx2};
    }
#endif
    (void)isa;
    return {base::RowInRange, GatherDotPortable, ScaledGatherPortable};
  }
};

template <typename T>
void ScaledGatherT(const CpuLoops&, float g, const T* x, const int32_t* idx,
                   int64_t n, T* out) {
  for (int64_t k = 0; k < n; ++k) {
    out[k] = static_cast<T>(g * static_cast<float>(x[idx[k]]));
  }
}
template <>
void ScaledGatherT<float>(const CpuLoops& loops, float g, const float* x,
                          const int32_t* idx, int64_t n, float* out) {
  loops.scaled_gather(g, x, idx, n, out);
}

// out[idx[k]] += g * w[k] (a scatter: duplicates within a row are allowed).
template <typename T>
void ScatterAxpy(float g, const int32_t* idx, const T* w, int64_t n,
                 float* out) {
  for (int64_t k = 0; k < n; ++k) out[idx[k]] += g * static_cast<float>(w[k]);
}

// `n` values at `src` as float32: `src` itself for float, else a converted
// copy in `buffer`.
template <typename T>
const float* RowAsFloat(const T* src, int64_t n, std::vector<float>* buffer) {
  buffer->resize(n);
  for (int64_t k = 0; k < n; ++k) (*buffer)[k] = static_cast<float>(src[k]);
  return buffer->data();
}
template <>
const float* RowAsFloat<float>(const float* src, int64_t, std::vector<float>*) {
  return src;
}

// Prefetches the first `bytes` (at most 512) of a label row.
inline void PrefetchRow(const void* row, int64_t bytes) {
  const char* p = static_cast<const char*>(row);
  const int64_t end = std::min<int64_t>(bytes, 512);
  for (int64_t off = 0; off < end; off += 64) __builtin_prefetch(p + off);
}

}  // namespace

// ---------------------------------------------------------------------------
// CPU functors.

namespace functor {

template <typename T>
struct SampledMatmul<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* feat, const int32_t* idx,
                  const T* w, const int32_t* cand, const SampledDims& d,
                  T* out) const {
    OP_REQUIRES_OK(ctx, ValidateCandidates(ctx, cand, d));
    const int64_t total = d.batch * d.num_candidates;
    if (total == 0) return;
    const int64_t c = d.num_candidates, s = d.fan_in, e = d.num_features;
    const uint32_t bound = static_cast<uint32_t>(e);
    FirstBad bad;
    const CpuLoops loops = CpuLoops::For(cpu::CpuIsa());
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, total, 40 + 12 * s,
        [&](int64_t start, int64_t limit) {
          std::vector<float> x_buffer, w_buffer;
          int64_t current = -1;
          const float* x = nullptr;
          for (int64_t p = start; p < limit; ++p) {
            if (p + kAhead < limit) {
              const int64_t ahead = cand[p + kAhead];
              PrefetchRow(idx + ahead * s, s * 4);
              PrefetchRow(w + ahead * s, s * static_cast<int64_t>(sizeof(T)));
            }
            const int64_t i = p / c;
            if (i != current) {
              x = RowAsFloat<T>(feat + i * e, e, &x_buffer);
              current = i;
            }
            const int64_t r = cand[p];
            const int32_t* row = idx + r * s;
            if (!loops.row_in_range(row, s, bound)) {
              RecordBadRow(row, r, s, bound, &bad);
              out[p] = static_cast<T>(0.0f);
              continue;
            }
            const float* wr = RowAsFloat<T>(w + r * s, s, &w_buffer);
            out[p] = static_cast<T>(loops.gather_dot(x, row, wr, s));
          }
        });
    if (bad.found()) {
      ctx->CtxFailure(BadIndexError(idx, cand, d, bad.get(),
                                    [](int64_t) { return true; }));
    }
  }
};

template <typename T>
struct SampledMatmulGradFeatures<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* back, const int32_t* idx,
                  const T* w, const int32_t* cand, const SampledDims& d,
                  T* out) const {
    OP_REQUIRES_OK(ctx, ValidateCandidates(ctx, cand, d));
    if (d.batch == 0) return;
    const int64_t c = d.num_candidates, s = d.fan_in, e = d.num_features;
    const int64_t out_size = d.batch * e;

    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    // Split the candidates into chunks when the batch alone cannot keep every
    // thread busy; each (chunk, instance) unit then owns a private row.
    const int64_t threads = std::max(1, workers->num_threads);
    int64_t chunks = 1;
    if (d.batch < 2 * threads && c >= 2048) {
      chunks = std::min<int64_t>((2 * threads + d.batch - 1) / d.batch,
                                 c / 1024);
    }
    const bool direct = chunks == 1 && std::is_same<T, float>::value;
    Tensor buffer_t;
    float* buffer = nullptr;
    if (direct) {
      buffer = reinterpret_cast<float*>(out);
    } else {
      OP_REQUIRES_OK(ctx, ctx->allocate_temp(
                              ::tensorflow::DT_FLOAT,
                              TensorShape({chunks, d.batch, e}), &buffer_t));
      buffer = buffer_t.flat<float>().data();
    }
    const uint32_t bound = static_cast<uint32_t>(e);
    const int64_t per_chunk = chunks == 1 ? c : (c + chunks - 1) / chunks;
    FirstBad bad;
    const CpuLoops loops = CpuLoops::For(cpu::CpuIsa());
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, d.batch * chunks,
        1 + per_chunk * (4 + 6 * s) + e, [&](int64_t start, int64_t limit) {
          for (int64_t u = start; u < limit; ++u) {
            const int64_t chunk = u / d.batch, i = u % d.batch;
            float* row_out = buffer + (chunk * d.batch + i) * e;
            std::fill(row_out, row_out + e, 0.0f);
            const int64_t j0 = chunk * per_chunk;
            const int64_t j1 = std::min(c, j0 + per_chunk);
            const T* back_i = back + i * c;
            const int32_t* cand_i = cand + i * c;
            for (int64_t j = j0; j < j1; ++j) {
              if (j + kAhead < j1 &&
                  static_cast<float>(back_i[j + kAhead]) != 0.0f) {
                const int64_t ahead = cand_i[j + kAhead];
                PrefetchRow(idx + ahead * s, s * 4);
                PrefetchRow(w + ahead * s, s * static_cast<int64_t>(sizeof(T)));
              }
              const float g = static_cast<float>(back_i[j]);
              if (g == 0.0f) continue;  // nothing of the label is read
              const int64_t r = cand_i[j];
              const int32_t* row = idx + r * s;
              if (!loops.row_in_range(row, s, bound)) {
                RecordBadRow(row, r, s, bound, &bad);
                continue;
              }
              ScatterAxpy<T>(g, row, w + r * s, s, row_out);
            }
          }
        });
    if (bad.found()) {
      ctx->CtxFailure(BadIndexError(idx, cand, d, bad.get(), [back](int64_t p) {
        return static_cast<float>(back[p]) != 0.0f;
      }));
      return;
    }
    if (!direct) SumChunks(ctx, buffer, chunks, out_size, out);
  }
};

template <typename T>
struct SampledMatmulGradWeights<CpuDevice, T> {
  void operator()(OpKernelContext* ctx, const T* back, const T* feat,
                  const int32_t* idx, const int32_t* cand,
                  const SampledDims& d, T* out) const {
    OP_REQUIRES_OK(ctx, ValidateCandidates(ctx, cand, d));
    const int64_t total = d.batch * d.num_candidates;
    if (total == 0 || d.fan_in == 0) return;
    const int64_t c = d.num_candidates, s = d.fan_in, e = d.num_features;
    const uint32_t bound = static_cast<uint32_t>(e);
    FirstBad bad;
    const CpuLoops loops = CpuLoops::For(cpu::CpuIsa());
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, total, 20 + 8 * s,
        [&](int64_t start, int64_t limit) {
          for (int64_t p = start; p < limit; ++p) {
            if (p + kAhead < limit &&
                static_cast<float>(back[p + kAhead]) != 0.0f) {
              PrefetchRow(idx + static_cast<int64_t>(cand[p + kAhead]) * s,
                          s * 4);
            }
            T* o = out + p * s;
            const float g = static_cast<float>(back[p]);
            if (g == 0.0f) {  // no signal: indices and features are not read
              std::fill(o, o + s, static_cast<T>(0.0f));
              continue;
            }
            const int64_t r = cand[p];
            const int32_t* row = idx + r * s;
            if (!loops.row_in_range(row, s, bound)) {
              RecordBadRow(row, r, s, bound, &bad);
              std::fill(o, o + s, static_cast<T>(0.0f));
              continue;
            }
            ScaledGatherT<T>(loops, g, feat + (p / c) * e, row, s, o);
          }
        });
    if (bad.found()) {
      ctx->CtxFailure(BadIndexError(idx, cand, d, bad.get(), [back](int64_t p) {
        return static_cast<float>(back[p]) != 0.0f;
      }));
    }
  }
};

// ---------------------------------------------------------------------------
// GPU functors: framework-free CUDA launchers (sampled_kernels.cu.cc) called
// on TensorFlow's stream.  float32 only.

#if XMC_TF_WITH_CUDA

// Runs the launcher `launcher(pointers..., batch, num_features, num_labels,
// fan_in, num_candidates, error_scratch, bad_positions, stream)` (the
// argument order of every sampled launcher) and turns its result into the
// op status.  The bad values live on the device: the message names the
// position only.
template <typename Launcher, typename... Pointers>
void RunSampledGpu(OpKernelContext* ctx, const SampledDims& d,
                   Launcher launcher, Pointers... pointers) {
  int64_t bad[2];
  OP_REQUIRES_OK(
      ctx, RunCheckedLauncher(
               ctx, "a sampled uniform-sparse kernel", 2, bad,
               [&](int64_t* scratch, int64_t* bad_positions, void* stream) {
                 return launcher(pointers..., d.batch, d.num_features,
                                 d.num_labels, d.fan_in, d.num_candidates,
                                 scratch, bad_positions, stream);
               }));
  if (bad[0] >= 0) {
    ctx->CtxFailure(OutOfRange("candidates",
                               TensorShape({d.batch, d.num_candidates}),
                               bad[0], std::nullopt, 0, d.num_labels,
                               "num_labels"));
  } else if (bad[1] >= 0) {
    ctx->CtxFailure(errors::InvalidArgument(
        OutOfRangeMessage("indices", TensorShape({d.num_labels, d.fan_in}),
                          bad[1], std::nullopt, 0, d.num_features,
                          "num_features"),
        "; it is a connection of a candidate label"));
  }
}

template <>
struct SampledMatmul<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* features,
                  const int32_t* indices, const float* weights,
                  const int32_t* candidates, const SampledDims& d,
                  float* scores) const {
    RunSampledGpu(ctx, d, XmcSampledForwardGpuF32, features, indices, weights,
                  candidates, scores);
  }
};

template <>
struct SampledMatmulGradFeatures<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* backward,
                  const int32_t* indices, const float* weights,
                  const int32_t* candidates, const SampledDims& d,
                  float* grad) const {
    RunSampledGpu(ctx, d, XmcSampledGradFeaturesGpuF32, backward, indices,
                  weights, candidates, grad);
  }
};

template <>
struct SampledMatmulGradWeights<GpuDevice, float> {
  void operator()(OpKernelContext* ctx, const float* backward,
                  const float* features, const int32_t* indices,
                  const int32_t* candidates, const SampledDims& d,
                  float* grad) const {
    RunSampledGpu(ctx, d, XmcSampledGradWeightsGpuF32, backward, features,
                  indices, candidates, grad);
  }
};

#endif  // XMC_TF_WITH_CUDA

}  // namespace functor

// ---------------------------------------------------------------------------
// The op kernels: one class per op, templated on the device and dtype.

namespace {

// The operands of a sampled kernel, in op input order: [backward,] features,
// indices, [weights,] candidates; read (the weights through WeightsOperand:
// a resource variable's buffer in place when `resource`) and shape-checked.
// Holds the weights variable's lock: construct it in Compute, do not copy.
class SampledInputs {
 public:
  Status Init(OpKernelContext* ctx, bool has_backward, bool has_weights,
              bool resource) {
    int i = 0;
    if (has_backward) backward_ = &ctx->input(i++);
    features_ = &ctx->input(i++);
    indices_ = &ctx->input(i++);
    if (has_weights) {
      TF_RETURN_IF_ERROR(
          weights_.Init(ctx, i++, resource, features_->dtype()));
    }
    candidates_ = &ctx->input(i++);
    return ValidateSampledShapes(*features_, *indices_,
                                 has_weights ? &weights_.tensor() : nullptr,
                                 *candidates_, backward_, &d_);
  }

  template <typename T>
  const T* backward() const { return backward_->flat<T>().data(); }
  template <typename T>
  const T* features() const { return features_->flat<T>().data(); }
  const int32_t* indices() const { return indices_->flat<int32_t>().data(); }
  template <typename T>
  const T* weights() const { return weights_.tensor().flat<T>().data(); }
  const int32_t* candidates() const {
    return candidates_->flat<int32_t>().data();
  }
  const Tensor& features_tensor() const { return *features_; }
  const Tensor& candidates_tensor() const { return *candidates_; }
  const SampledDims& dims() const { return d_; }

 private:
  const Tensor* backward_ = nullptr;
  const Tensor* features_ = nullptr;
  const Tensor* indices_ = nullptr;
  WeightsOperand weights_;
  const Tensor* candidates_ = nullptr;
  SampledDims d_;
};

// kResource: weights (input 2) is a resource variable (Xmc>Resource...).
template <typename Device, typename T, bool kResource>
class SampledMatmulOp : public OpKernel {
 public:
  explicit SampledMatmulOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/false,
                                /*has_weights=*/true, kResource));
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.candidates_tensor().shape(),
                                             &scores));
    functor::SampledMatmul<Device, T>()(
        ctx, in.features<T>(), in.indices(), in.weights<T>(), in.candidates(),
        in.dims(), scores->flat<T>().data());
  }
};

// kResource: weights (input 3) is a resource variable.
template <typename Device, typename T, bool kResource>
class SampledMatmulGradFeaturesOp : public OpKernel {
 public:
  explicit SampledMatmulGradFeaturesOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/true,
                                /*has_weights=*/true, kResource));
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, in.features_tensor().shape(),
                                             &grad));
    functor::SampledMatmulGradFeatures<Device, T>()(
        ctx, in.backward<T>(), in.indices(), in.weights<T>(), in.candidates(),
        in.dims(), grad->flat<T>().data());
  }
};

template <typename Device, typename T>
class SampledMatmulGradWeightsOp : public OpKernel {
 public:
  explicit SampledMatmulGradWeightsOp(OpKernelConstruction* c)
      : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    SampledInputs in;
    OP_REQUIRES_OK(ctx, in.Init(ctx, /*has_backward=*/true,
                                /*has_weights=*/false, /*resource=*/false));
    const SampledDims& d = in.dims();
    Tensor* grad = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(
                            0,
                            TensorShape({d.batch * d.num_candidates, d.fan_in}),
                            &grad));
    functor::SampledMatmulGradWeights<Device, T>()(
        ctx, in.backward<T>(), in.features<T>(), in.indices(), in.candidates(),
        d, grad->flat<T>().data());
  }
};

// The resource handle of the Resource* ops stays in host memory on the GPU
// (WeightsOperand reads the variable's buffer in place).
#define REGISTER(DEVICE_NAME, Dev, T, RESOURCE_HANDLE)                      \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmul")           \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulOp<Dev, T, false>);                 \
  REGISTER_KERNEL_BUILDER(Name("Xmc>ResourceUniformSparseSampledMatmul")   \
                              .Device(DEVICE_NAME)                         \
                              RESOURCE_HANDLE                              \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulOp<Dev, T, true>);                  \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmulGradFeatures") \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulGradFeaturesOp<Dev, T, false>);     \
  REGISTER_KERNEL_BUILDER(                                                 \
      Name("Xmc>ResourceUniformSparseSampledMatmulGradFeatures")           \
          .Device(DEVICE_NAME)                                             \
          RESOURCE_HANDLE                                                  \
          .TypeConstraint<T>("T"),                                         \
      SampledMatmulGradFeaturesOp<Dev, T, true>);                          \
  REGISTER_KERNEL_BUILDER(Name("Xmc>UniformSparseSampledMatmulGradWeights") \
                              .Device(DEVICE_NAME)                         \
                              .TypeConstraint<T>("T"),                     \
                          SampledMatmulGradWeightsOp<Dev, T>);

#define XMC_NO_HOST_MEMORY
#define XMC_WEIGHTS_IN_HOST_MEMORY .HostMemory("weights")
REGISTER(DEVICE_CPU, CpuDevice, float, XMC_NO_HOST_MEMORY);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::half, XMC_NO_HOST_MEMORY);
REGISTER(DEVICE_CPU, CpuDevice, Eigen::bfloat16, XMC_NO_HOST_MEMORY);
#if XMC_TF_WITH_CUDA
REGISTER(DEVICE_GPU, GpuDevice, float, XMC_WEIGHTS_IN_HOST_MEMORY);
#endif
#undef XMC_WEIGHTS_IN_HOST_MEMORY
#undef XMC_NO_HOST_MEMORY
#undef REGISTER

}  // namespace
}  // namespace xmc_tf
