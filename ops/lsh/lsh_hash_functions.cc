// The framework-free functors of the LSH hashing ops, declared and documented
// (with their sources) in lsh_kernels.h: the layout check, the canonical form
// of a sparse row, SimHash (dense and sparse) and the DWTA hasher.  The CPU
// kernels of lsh_hash_kernels.cc call them after checking the data they read.
// No TensorFlow here.  The dense projections' axpy is compiled per
// instruction set (ops/common/cpu_isa.h).

#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/cpu_isa.h"
#include "ops/lsh/lsh_kernels.h"

namespace xmc_tf {
namespace lsh {

// ---------------------------------------------------------------------------
// Framework-free functors.
// ---------------------------------------------------------------------------

std::string ValidateLayout(int64_t num_bits, int64_t bits_per_hash,
                           int64_t bucket_bits, int64_t num_hashes) {
  std::ostringstream err;
  if (num_bits < 1) {
    err << "num_bits (K) must be >= 1, got " << num_bits;
  } else if (bits_per_hash < 1 || bits_per_hash > 8) {
    err << "bits per hash value must be in [1, 8], got " << bits_per_hash;
  } else if (num_bits * bits_per_hash > 64) {
    err << "num_bits (K) * bits per hash value must be <= 64, got "
        << num_bits << " * " << bits_per_hash;
  } else if (bucket_bits < 1 || bucket_bits > 24) {
    err << "bucket_bits must be in [1, 24], got " << bucket_bits;
  } else if (num_hashes < num_bits || num_hashes % num_bits != 0) {
    err << "the number of hash functions (" << num_hashes
        << ") must be a positive multiple of num_bits (K = " << num_bits
        << "): K * L";
  }
  return err.str();
}

template <typename T>
int64_t CanonicalSparse(const int32_t* indices, const float* weights,
                        int64_t s, int64_t num_features,
                        std::vector<std::pair<int32_t, T>>* out) {
  out->clear();
  for (int64_t t = 0; t < s; ++t) {
    if (indices[t] < 0 || indices[t] >= num_features) return t;
    out->emplace_back(indices[t], static_cast<T>(weights[t]));
  }
  // Stable: duplicates are summed in their input order.
  std::stable_sort(out->begin(), out->end(),
                   [](const std::pair<int32_t, T>& a,
                      const std::pair<int32_t, T>& b) {
                     return a.first < b.first;
                   });
  size_t w = 0;
  for (size_t r = 0; r < out->size();) {
    const int32_t index = (*out)[r].first;
    T sum = (*out)[r].second;
    size_t e = r + 1;
    for (; e < out->size() && (*out)[e].first == index; ++e) {
      sum += (*out)[e].second;
    }
    if (sum != T(0)) (*out)[w++] = {index, sum};
    r = e;
  }
  out->resize(w);
  return -1;
}

template int64_t CanonicalSparse<float>(
    const int32_t*, const float*, int64_t, int64_t,
    std::vector<std::pair<int32_t, float>>*);
template int64_t CanonicalSparse<double>(
    const int32_t*, const float*, int64_t, int64_t,
    std::vector<std::pair<int32_t, double>>*);

namespace {

// acc[0:H] += a * row[0:H]: the one floating-point operation of SimHash, shared
// by the dense and the sparse path (same instruction set, same rounding),
// compiled for each instruction set of ops/common/cpu_isa.h (by CPU
// features; GCC's target_clones picked the SSE2 clone on AMD CPUs).
#define XMC_LSH_AXPY_BODY                                               \
  void Axpy(float a, const float* __restrict row, float* __restrict acc, \
            int64_t H) {                                                 \
    for (int64_t j = 0; j < H; ++j) acc[j] += a * row[j];               \
  }
namespace base {
XMC_LSH_AXPY_BODY
}  // namespace base
#if XMC_CPU_MULTI_ISA
XMC_CPU_BEGIN_AVX512
namespace avx512 {
XMC_LSH_AXPY_BODY
}  // namespace avx512
XMC_CPU_END
XMC_CPU_BEGIN_AVX2
namespace avx2 {
XMC_LSH_AXPY_BODY
}  // namespace avx2
XMC_CPU_END
#endif
#undef XMC_LSH_AXPY_BODY

using AxpyFn = void (*)(float, const float*, float*, int64_t);

AxpyFn AxpyFor(cpu::Isa isa) {
#if XMC_CPU_MULTI_ISA
  if (isa == cpu::Isa::kAvx512) return avx512::Axpy;
  if (isa == cpu::Isa::kAvx2) return avx2::Axpy;
#endif
  (void)isa;
  return base::Axpy;
}

void SimHashCodes(const float* acc, const CodeLayout& layout, int32_t* codes) {
  const int K = layout.num_bits;
  for (int64_t l = 0; l < layout.num_tables; ++l) {
    uint64_t raw = 0;
    const float* a = acc + l * K;
    for (int k = 0; k < K; ++k) {
      raw |= static_cast<uint64_t>(a[k] > 0.0f) << k;
    }
    codes[l] = layout.Bucket(raw, l);
  }
}

}  // namespace

void SimHashDense(const float* x, int64_t d, const float* proj, int64_t H,
                  const CodeLayout& layout, float* acc, int32_t* codes,
                  cpu::Isa isa) {
  const AxpyFn Axpy = AxpyFor(isa);
  std::fill(acc, acc + H, 0.0f);
  for (int64_t i = 0; i < d; ++i) {
    if (x[i] != 0.0f) Axpy(x[i], proj + i * H, acc, H);
  }
  SimHashCodes(acc, layout, codes);
}

void SimHashSparse(const std::vector<std::pair<int32_t, float>>& entries,
                   const float* proj, int64_t H, const CodeLayout& layout,
                   float* acc, int32_t* codes, cpu::Isa isa) {
  const AxpyFn Axpy = AxpyFor(isa);
  std::fill(acc, acc + H, 0.0f);
  for (const auto& e : entries) {
    Axpy(e.second, proj + static_cast<int64_t>(e.first) * H, acc, H);
  }
  SimHashCodes(acc, layout, codes);
}

DwtaHasher::DwtaHasher(const int32_t* bins, int64_t num_hashes, int bin_size,
                       int64_t input_dim, uint64_t seed, bool sparse)
    : bins_(bins),
      H_(num_hashes),
      w_(bin_size),
      d_(input_dim),
      seed_mix_(Mix64(seed ^ 0x4457544148415348ULL)) {
  if (!sparse) return;
  const int64_t n = H_ * w_;
  int64_t max_bin = -1;
  for (int64_t t = 0; t < n; ++t) {
    max_bin = std::max<int64_t>(max_bin, bins_[t]);
  }
  // Dense map (one slot per coordinate 0 .. max_bin) while that is at most a
  // few times the bins themselves or small; otherwise (a huge, sparsely
  // covered coordinate range) a compact map over the distinct coordinates.
  const int64_t kDenseMin = int64_t{1} << 22;
  if (max_bin < std::max<int64_t>(kDenseMin, 8 * n)) {
    dense_size_ = max_bin + 1;
  } else {
    coords_.assign(bins_, bins_ + n);
    std::sort(coords_.begin(), coords_.end());
    coords_.erase(std::unique(coords_.begin(), coords_.end()), coords_.end());
  }
  const int64_t slots =
      coords_.empty() ? dense_size_ : static_cast<int64_t>(coords_.size());
  auto slot_of = [&](int32_t coord) -> int64_t {
    if (coords_.empty()) return coord;
    return std::lower_bound(coords_.begin(), coords_.end(), coord) -
           coords_.begin();
  };
  inv_offsets_.assign(slots + 1, 0);
  for (int64_t t = 0; t < n; ++t) ++inv_offsets_[slot_of(bins_[t]) + 1];
  for (int64_t i = 0; i < slots; ++i) inv_offsets_[i + 1] += inv_offsets_[i];
  inv_bin_.resize(n);
  inv_pos_.resize(n);
  std::vector<int64_t> fill(inv_offsets_.begin(), inv_offsets_.end() - 1);
  for (int64_t j = 0; j < H_; ++j) {
    for (int p = 0; p < w_; ++p) {
      const int64_t slot = fill[slot_of(bins_[j * w_ + p])]++;
      inv_bin_[slot] = static_cast<int32_t>(j);
      inv_pos_[slot] = static_cast<int16_t>(p);
    }
  }
}

void DwtaHasher::HashDense(const float* x, const CodeLayout& layout,
                           Scratch* scratch, int32_t* codes) const {
  scratch->pos.resize(H_);
  int16_t* pos = scratch->pos.data();
  for (int64_t j = 0; j < H_; ++j) {
    const int32_t* bin = bins_ + j * w_;
    int16_t best_p = -1;
    float best = 0.0f;
    for (int p = 0; p < w_; ++p) {
      const float v = x[bin[p]];
      if (v != 0.0f && (best_p < 0 || v > best)) {
        best = v;
        best_p = static_cast<int16_t>(p);
      }
    }
    pos[j] = best_p;
  }
  Finish(layout, scratch, codes);
}

void DwtaHasher::HashSparse(
    const std::vector<std::pair<int32_t, float>>& entries,
    const CodeLayout& layout, Scratch* scratch, int32_t* codes) const {
  scratch->pos.assign(H_, -1);
  scratch->best.resize(H_);
  int16_t* pos = scratch->pos.data();
  float* best = scratch->best.data();
  // Entries are sorted by coordinate: the compact map's binary searches
  // start where the previous one ended.
  auto lo = coords_.begin();
  for (const auto& e : entries) {
    const float v = e.second;
    int64_t slot;
    if (coords_.empty()) {
      if (e.first >= dense_size_) break;  // sorted: no later entry is binned
      slot = e.first;
    } else {
      lo = std::lower_bound(lo, coords_.end(), e.first);
      if (lo == coords_.end()) break;
      if (*lo != e.first) continue;
      slot = lo - coords_.begin();
    }
    for (int64_t t = inv_offsets_[slot]; t < inv_offsets_[slot + 1]; ++t) {
      const int32_t j = inv_bin_[t];
      const int16_t p = inv_pos_[t];
      // Same winner as the dense scan: the largest value, ties to the lowest
      // position.
      if (pos[j] < 0 || v > best[j] || (v == best[j] && p < pos[j])) {
        best[j] = v;
        pos[j] = p;
      }
    }
  }
  Finish(layout, scratch, codes);
}

void DwtaHasher::Finish(const CodeLayout& layout, Scratch* scratch,
                        int32_t* codes) const {
  const int16_t* pos = scratch->pos.data();
  scratch->value.resize(H_);
  int16_t* value = scratch->value.data();
  bool any = false;
  for (int64_t j = 0; j < H_; ++j) any = any || pos[j] >= 0;
  for (int64_t j = 0; j < H_; ++j) {
    if (pos[j] >= 0) {
      value[j] = pos[j];
      continue;
    }
    value[j] = 0;
    if (!any) continue;
    bool done = false;
    for (uint64_t t = 1; t <= 32 && !done; ++t) {
      const uint64_t c =
          Mix64(seed_mix_ + (static_cast<uint64_t>(j) << 32) + t) %
          static_cast<uint64_t>(H_);
      if (pos[c] >= 0) {
        value[j] = pos[c];
        done = true;
      }
    }
    for (int64_t t = 1; t < H_ && !done; ++t) {
      const int64_t c = (j + t) % H_;
      if (pos[c] >= 0) {
        value[j] = pos[c];
        done = true;
      }
    }
  }
  const int K = layout.num_bits;
  const int bph = layout.bits_per_hash;
  for (int64_t l = 0; l < layout.num_tables; ++l) {
    uint64_t raw = 0;
    for (int k = 0; k < K; ++k) {
      raw |= static_cast<uint64_t>(value[l * K + k]) << (k * bph);
    }
    codes[l] = layout.Bucket(raw, l);
  }
}

}  // namespace lsh
}  // namespace xmc_tf
