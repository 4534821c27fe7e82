// The CPU functors of the sampled-scoring op family,
// functor::SampledMatmul / SampledMatmulGradFeatures /
// SampledMatmulGradWeights<CpuDevice, T> (declared in sampled_cpu.h), as
// the op kernels of sampled_kernels.cc call them after reading the operands
// and checking their ranks and shapes.  See sampled_ops.cc for the op
// contracts and sampled_kernels.cc for the sources.
//
// Notation: b = batch, e = num_features, m = num_labels, s = fan_in,
// c = num_candidates; a "position" p = i * c + j is one (instance,
// candidate) pair.
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
#include <functional>
#include <string>
#include <type_traits>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/cpu_isa.h"
#include "ops/common/sum_chunks.h"
#include "ops/common/validation.h"
#include "ops/sampled/sampled_cpu.h"
#include "ops/sampled/sampled_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

#if XMC_CPU_MULTI_ISA
#include <immintrin.h>
#endif

namespace xmc_tf {

namespace {

constexpr int64_t kAhead = 8;  // prefetch distance, in positions

// ---------------------------------------------------------------------------
// Index checks of the CPU functors (the GPU launchers check on the device).

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
void SampledMatmul<CpuDevice, T>::operator()(
    OpKernelContext* ctx, const T* feat, const int32_t* idx, const T* w,
    const int32_t* cand, const SampledDims& d, T* out) const {
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

template <typename T>
void SampledMatmulGradFeatures<CpuDevice, T>::operator()(
    OpKernelContext* ctx, const T* back, const int32_t* idx, const T* w,
    const int32_t* cand, const SampledDims& d, T* out) const {
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

template <typename T>
void SampledMatmulGradWeights<CpuDevice, T>::operator()(
    OpKernelContext* ctx, const T* back, const T* feat, const int32_t* idx,
    const int32_t* cand, const SampledDims& d, T* out) const {
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

#define XMC_SAMPLED_INSTANTIATE(T)                         \
  template struct SampledMatmul<CpuDevice, T>;             \
  template struct SampledMatmulGradFeatures<CpuDevice, T>; \
  template struct SampledMatmulGradWeights<CpuDevice, T>;
XMC_SAMPLED_CPU_TYPES(XMC_SAMPLED_INSTANTIATE)
#undef XMC_SAMPLED_INSTANTIATE

}  // namespace functor
}  // namespace xmc_tf
