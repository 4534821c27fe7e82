// CPU kernels of the LSH negative-sampling op family (see lsh_ops.cc for the
// op contracts and lsh_kernels.h for the layouts).
//
// Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
// Sec. 1.2-2.3, Algorithm 1; SimHash (Charikar 2002, LNS Appendix A.2); DWTA
// (Chen & Shrivastava, UAI 2018, LNS Appendix A.3).
//
// Every kernel validates ranks, shapes, dtypes (by registration), the
// attributes that size its outputs or scratch memory, the range of every
// index it dereferences and of every id or code it copies into its outputs
// (the update's tables must be permutations), and fails with InvalidArgument
// naming the offending entry.  Checks are O(input) passes outside the hot
// loops (the query checks what it reads, so its cost stays independent of
// m).  Work is spread over TensorFlow's intra-op
// thread pool: rows for hashing, querying and cosines; tables for building
// and updating.
//
// Constant-time query: a row's cost is O(q L) to locate its q L buckets (the
// CSR offsets give every bucket's size without reading it), O(k log k) to draw
// and sort k distinct positions among the T entries of those buckets (Floyd's
// algorithm) and O(k) random reads of labels (prefetched), plus O(k q L)
// code comparisons when collision counts are requested.  None of it depends
// on the number of labels m (memory latency aside).

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/cpu_isa.h"
#include "ops/lsh/lsh_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"


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

void BuildTable(const int32_t* codes, int64_t m, int64_t L, int64_t table,
                int64_t B, int32_t* offsets, int32_t* labels) {
  std::fill(offsets, offsets + B + 1, 0);
  for (int64_t j = 0; j < m; ++j) ++offsets[codes[j * L + table] + 1];
  for (int64_t c = 0; c < B; ++c) offsets[c + 1] += offsets[c];
  std::vector<int32_t> fill(offsets, offsets + B);
  for (int64_t j = 0; j < m; ++j) {
    labels[fill[codes[j * L + table]]++] = static_cast<int32_t>(j);
  }
}

bool UpdateTable(const int32_t* old_offsets, const int32_t* old_labels,
                 int64_t m, int64_t B, std::vector<Move>* moves,
                 int32_t* new_offsets, int32_t* new_labels) {
  // Net change of every bucket, then the new offsets.
  std::vector<int64_t> delta(B + 1, 0);
  for (const Move& mv : *moves) {
    --delta[mv.from];
    ++delta[mv.to];
  }
  int64_t shift = 0;
  new_offsets[0] = 0;
  for (int64_t c = 0; c < B; ++c) {
    shift += delta[c];
    new_offsets[c + 1] = static_cast<int32_t>(old_offsets[c + 1] + shift);
  }
  // Removals sorted by (bucket, label), insertions likewise.
  std::vector<std::pair<int32_t, int32_t>> removed, added;
  removed.reserve(moves->size());
  added.reserve(moves->size());
  for (const Move& mv : *moves) {
    removed.emplace_back(mv.from, mv.label);
    added.emplace_back(mv.to, mv.label);
  }
  std::sort(removed.begin(), removed.end());
  std::sort(added.begin(), added.end());
  // Touched buckets in increasing order; untouched runs are block copies.
  std::vector<int32_t> touched;
  touched.reserve(2 * moves->size());
  for (const auto& r : removed) touched.push_back(r.first);
  for (const auto& a : added) touched.push_back(a.first);
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());

  int64_t copied_to = 0;  // old buckets [0, copied_to) are done
  size_t ri = 0, ai = 0;
  for (int32_t c : touched) {
    // Untouched buckets [copied_to, c): one contiguous block, shifted.
    const int64_t src = old_offsets[copied_to];
    const int64_t len = old_offsets[c] - src;
    if (len > 0) {
      std::memmove(new_labels + new_offsets[copied_to], old_labels + src,
                   len * sizeof(int32_t));
    }
    // Merge bucket c: old entries minus removals, plus insertions (all sorted).
    int32_t* out = new_labels + new_offsets[c];
    int32_t* const out_end = new_labels + new_offsets[c + 1];
    const int32_t* in = old_labels + old_offsets[c];
    const int32_t* in_end = old_labels + old_offsets[c + 1];
    while (true) {
      // Removals of this bucket below the current entry are absent from it
      // (inconsistent codes): skip them; the size check below catches it.
      while (in < in_end && ri < removed.size() && removed[ri].first == c &&
             removed[ri].second < *in) {
        ++ri;
      }
      if (in < in_end && ri < removed.size() && removed[ri].first == c &&
          removed[ri].second == *in) {
        ++in;
        ++ri;
        continue;
      }
      const bool has_in = in < in_end;
      const bool has_add = ai < added.size() && added[ai].first == c;
      if (!has_in && !has_add) break;
      if (out == out_end) return false;
      if (has_add && (!has_in || added[ai].second < *in)) {
        *out++ = added[ai++].second;
      } else {
        *out++ = *in++;
      }
    }
    if (out != out_end) return false;
    while (ri < removed.size() && removed[ri].first == c) ++ri;
    copied_to = c + 1;
  }
  const int64_t src = old_offsets[copied_to];
  const int64_t len = old_offsets[B] - src;
  if (len > 0) {
    std::memmove(new_labels + new_offsets[copied_to], old_labels + src,
                 len * sizeof(int32_t));
  }
  return true;
}

int64_t FirstNonPermutation(const int32_t* labels, int64_t m,
                            std::vector<uint64_t>* seen) {
  seen->assign(static_cast<size_t>(m / 64 + 1), 0);
  uint64_t* bits = seen->data();
  // Fast path, branch-free: every entry in [0, m) (the sign bit of
  // j | (hi - j) in uint32 is set exactly when j < 0 or j > hi = m - 1), then
  // every label marked; m entries covering m labels are a permutation.
  if (m > 0) {
    const uint32_t hi = static_cast<uint32_t>(m - 1);
    uint32_t acc = 0;
    for (int64_t t = 0; t < m; ++t) {
      const uint32_t j = static_cast<uint32_t>(labels[t]);
      acc |= j | (hi - j);
    }
    if (!(acc >> 31)) {
      for (int64_t t = 0; t < m; ++t) {
        const uint32_t j = static_cast<uint32_t>(labels[t]);
        bits[j >> 6] |= uint64_t{1} << (j & 63);
      }
      uint64_t all = ~uint64_t{0};
      for (int64_t w = 0; w < m / 64; ++w) all &= bits[w];
      if (m % 64 != 0) all &= bits[m / 64] | (~uint64_t{0} << (m % 64));
      if (all == ~uint64_t{0}) return -1;
      seen->assign(seen->size(), 0);
    }
  }
  // Slow path (an error): the first entry out of range or repeated.
  for (int64_t t = 0; t < m; ++t) {
    const uint32_t j = static_cast<uint32_t>(labels[t]);
    if (j >= static_cast<uint64_t>(m)) return t;  // negative or >= m
    const uint64_t bit = uint64_t{1} << (j & 63);
    if (bits[j >> 6] & bit) return t;
    bits[j >> 6] |= bit;
  }
  return -1;
}

namespace {

// Open-addressing set of non-negative int64 (-1 = empty slot).
struct Int64Set {
  std::vector<int64_t>* slots;
  uint64_t mask;
  Int64Set(std::vector<int64_t>* storage, int64_t capacity) : slots(storage) {
    uint64_t size = 16;
    while (size < static_cast<uint64_t>(2 * capacity)) size <<= 1;
    slots->assign(size, -1);
    mask = size - 1;
  }
  // Inserts x; returns false when it was already present.
  bool Insert(int64_t x) {
    uint64_t h = Mix64(static_cast<uint64_t>(x)) & mask;
    while (true) {
      const int64_t v = (*slots)[h];
      if (v == x) return false;
      if (v < 0) {
        (*slots)[h] = x;
        return true;
      }
      h = (h + 1) & mask;
    }
  }
};

}  // namespace

QueryStatus QueryRow(const Tables& t, const int32_t* query_codes, int64_t q,
                     int k, uint64_t row_key, bool count_collisions,
                     QueryScratch* scratch, int32_t* ids, bool* valid,
                     int32_t* collisions, float* rate, int64_t* probed) {
  const int64_t L = t.L, B = t.B, m = t.m;
  auto& starts = scratch->probe_start;
  auto& ends = scratch->probe_end;
  starts.clear();
  ends.clear();
  int64_t total = 0;
  for (int64_t p = 0; p < q * L; ++p) {
    const int32_t c = query_codes[p];
    if (c == -1) continue;
    if (c < 0 || c >= B) return QueryStatus::kBadQueryCode;
    const int64_t l = p % L;
    const int32_t* off = t.offsets + l * (B + 1);
    const int64_t a = off[c], b = off[c + 1];
    if (a < 0 || b < a || b > m) return QueryStatus::kCorruptTables;
    if (b > a) {
      starts.push_back(l * m + a);
      total += b - a;
      ends.push_back(total);
    }
  }
  *probed = total;

  // Positions in [0, total) of the entries to read.
  auto& positions = scratch->positions;
  positions.clear();
  if (total <= k) {
    for (int64_t i = 0; i < total; ++i) positions.push_back(i);
    *rate = 1.0f;
  } else {
    // Floyd's algorithm: k distinct positions, uniformly at random.
    SplitMix rng{row_key};
    Int64Set set(&scratch->set, k);
    for (int64_t j = total - k; j < total; ++j) {
      const int64_t x = static_cast<int64_t>(rng.Uniform(j + 1));
      positions.push_back(set.Insert(x) ? x : (set.Insert(j), j));
    }
    std::sort(positions.begin(), positions.end());
    *rate = static_cast<float>(static_cast<double>(k) /
                               static_cast<double>(total));
  }
  // Positions -> addresses in labels (positions are sorted: one pass).
  size_t probe = 0;
  for (int64_t& pos : positions) {
    while (ends[probe] <= pos) ++probe;
    const int64_t before = probe == 0 ? 0 : ends[probe - 1];
    pos = starts[probe] + (pos - before);
    __builtin_prefetch(t.labels + pos);
  }
  // Distinct labels in position order.
  auto& found = scratch->found;
  found.clear();
  {
    Int64Set seen(&scratch->set, static_cast<int64_t>(positions.size()));
    for (int64_t address : positions) {
      const int32_t label = t.labels[address];
      if (label < 0 || label >= m) return QueryStatus::kCorruptTables;
      if (seen.Insert(label)) found.push_back(label);
    }
  }
  const int n = static_cast<int>(found.size());
  for (int i = 0; i < k; ++i) {
    ids[i] = i < n ? found[i] : 0;
    valid[i] = i < n;
    collisions[i] = 0;
  }
  if (count_collisions) {
    // Prefetch every cache line of every candidate's codes row first, so
    // that the misses overlap instead of serialising (rows are L * 4 bytes).
    for (int i = 0; i < n; ++i) {
      const char* row = reinterpret_cast<const char*>(
          t.codes + static_cast<int64_t>(found[i]) * L);
      for (int64_t byte = 0; byte < L * 4; byte += 64) {
        __builtin_prefetch(row + byte);
      }
    }
    // The codes rows read must hold bucket ids: one branch-free pass per
    // row, O(k L) next to the O(k q L) counts (the sign bit of c | (hi - c)
    // in uint32 is set exactly when c < 0 or c > hi = B - 1).
    const uint32_t hi =
        static_cast<uint32_t>(std::min<int64_t>(B, int64_t{1} << 31) - 1);
    uint32_t acc = 0;
    for (int i = 0; i < n; ++i) {
      const int32_t* row = t.codes + static_cast<int64_t>(found[i]) * L;
      for (int64_t l = 0; l < L; ++l) {
        const uint32_t c = static_cast<uint32_t>(row[l]);
        acc |= c | (hi - c);
      }
    }
    if (acc >> 31) return QueryStatus::kBadCode;
    for (int i = 0; i < n; ++i) {
      const int32_t* row = t.codes + static_cast<int64_t>(found[i]) * L;
      int32_t count = 0;
      for (int64_t qi = 0; qi < q; ++qi) {
        const int32_t* qc = query_codes + qi * L;
        for (int64_t l = 0; l < L; ++l) count += row[l] == qc[l];
      }
      collisions[i] = count;
    }
  }
  return QueryStatus::kOk;
}

}  // namespace lsh

// ---------------------------------------------------------------------------
// TensorFlow kernels.
// ---------------------------------------------------------------------------

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
namespace errors = ::tensorflow::errors;

namespace {

absl::Status CheckRank(const Tensor& t, int rank, const char* name,
                       const char* layout) {
  if (t.dims() != rank) {
    return errors::InvalidArgument(name, " must have rank ", rank, " ",
                                   layout, ", got shape ",
                                   t.shape().DebugString());
  }
  return absl::OkStatus();
}

absl::Status CheckInt32Size(int64_t n, const char* what) {
  if (n > std::numeric_limits<int32_t>::max()) {
    return errors::InvalidArgument(what, " = ", n,
                                   " does not fit the int32 ids of the tables");
  }
  return absl::OkStatus();
}

// num_features sizes nothing, but coordinates are int32 ids.
absl::Status CheckNumFeatures(int64_t num_features) {
  if (num_features < 1 || num_features > lsh::kMaxNumFeatures) {
    return errors::InvalidArgument(
        "num_features must be in [1, 2^31 - 1] (int32 coordinates), got ",
        num_features);
  }
  return absl::OkStatus();
}

// Index of the first entry of codes [n] not in [0, B), or -1.  A
// vectorised pass unless it finds one: with hi = min(B, 2^31) - 1, the sign
// bit of c | (hi - c) (in uint32) is set exactly when c < 0 or c > hi.
int64_t FirstCodeOutOfRange(const int32_t* codes, int64_t n, int64_t B) {
  const uint32_t hi =
      static_cast<uint32_t>(std::min<int64_t>(B, int64_t{1} << 31) - 1);
  uint32_t acc = 0;
  for (int64_t t = 0; t < n; ++t) {
    const uint32_t c = static_cast<uint32_t>(codes[t]);
    acc |= c | (hi - c);
  }
  if (!(acc >> 31)) return -1;
  for (int64_t t = 0; t < n; ++t) {
    if (codes[t] < 0 || codes[t] > static_cast<int64_t>(hi)) return t;
  }
  return -1;
}

// Index of the first non-finite entry of a float array, or -1.
int64_t FirstNonFinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

// Records the smallest failing row (deterministic error messages).
struct FirstError {
  std::atomic<int64_t> row{std::numeric_limits<int64_t>::max()};
  void Set(int64_t r) {
    int64_t cur = row.load();
    while (r < cur && !row.compare_exchange_weak(cur, r)) {
    }
  }
  bool any() const { return row.load() != std::numeric_limits<int64_t>::max(); }
};

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

// ----- SimHash ---------------------------------------------------------------

// Validates projection [e, H] and returns the layout.
absl::Status SimHashLayout(const HashAttrs& attrs, const Tensor& projection,
                           lsh::CodeLayout* layout) {
  TF_RETURN_IF_ERROR(CheckRank(projection, 2, "projection", "[input_dim, K * L]"));
  const int64_t H = projection.dim_size(1);
  const std::string err =
      lsh::ValidateLayout(attrs.num_bits, 1, attrs.bucket_bits, H);
  if (!err.empty()) return errors::InvalidArgument(err);
  const int64_t bad =
      FirstNonFinite(projection.flat<float>().data(), projection.NumElements());
  if (bad >= 0) {
    return errors::InvalidArgument("projection[", bad / H, ", ", bad % H,
                                   "] is not finite");
  }
  layout->num_bits = static_cast<int>(attrs.num_bits);
  layout->bits_per_hash = 1;
  layout->bucket_bits = static_cast<int>(attrs.bucket_bits);
  layout->num_tables = H / attrs.num_bits;
  return absl::OkStatus();
}

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
    const int64_t H = projection.dim_size(1), L = layout.num_tables;
    Tensor* codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, L}), &codes));
    if (n == 0) return;
    const float* x = vectors.flat<float>().data();
    const float* proj = projection.flat<float>().data();
    int32_t* out = codes->flat<int32_t>().data();
    FirstError bad;
    const cpu::Isa isa = cpu::CpuIsa();
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<float> acc(H);
      for (int64_t i = start; i < limit; ++i) {
        if (FirstNonFinite(x + i * d, d) >= 0) {
          bad.Set(i);
          continue;
        }
        lsh::SimHashDense(x + i * d, d, proj, H, layout, acc.data(),
                          out + i * L, isa);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        2 * d * H + 8 * H, work);
    OP_REQUIRES(ctx, !bad.any(),
                errors::InvalidArgument("vectors[", bad.row.load(),
                                        "] contains a NaN or infinite value"));
  }

 private:
  HashAttrs attrs_;
};

// Validates indices [n, s] / weights [n, s].
absl::Status CheckSparseRows(const Tensor& indices, const Tensor& weights) {
  TF_RETURN_IF_ERROR(CheckRank(indices, 2, "indices", "[n, s]"));
  TF_RETURN_IF_ERROR(CheckRank(weights, 2, "weights", "[n, s]"));
  if (indices.shape() != weights.shape()) {
    return errors::InvalidArgument("weights shape ",
                                   weights.shape().DebugString(),
                                   " must equal indices shape ",
                                   indices.shape().DebugString(), " ([n, s])");
  }
  return absl::OkStatus();
}

// Row-level failure of a sparse hashing kernel: bad index, non-finite
// weight, or duplicates whose float32 sum overflows (the densified vector
// would hold an infinity, which the dense ops reject).
struct SparseErrors {
  FirstError index_row, finite_row, overflow_row;
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
    errs->index_row.Set(row);
    return false;
  }
  if (FirstNonFinite(w, s) >= 0) {
    errs->finite_row.Set(row);
    return false;
  }
  if (FirstInfiniteSum(*entries) >= 0) {
    errs->overflow_row.Set(row);
    return false;
  }
  return true;
}

absl::Status ReportSparseErrors(const SparseErrors& errs,
                                const Tensor& indices, const Tensor& weights,
                                int64_t num_features) {
  if (errs.index_row.any()) {
    const int64_t r = errs.index_row.row.load();
    // Recompute the column deterministically for the message.
    const int32_t* idx = indices.flat<int32_t>().data();
    const int64_t s = indices.dim_size(1);
    int64_t col = 0;
    for (; col < s; ++col) {
      if (idx[r * s + col] < 0 || idx[r * s + col] >= num_features) break;
    }
    return errors::InvalidArgument("indices[", r, ", ", col, "] = ",
                                   idx[r * s + col], " is not in [0, ",
                                   num_features, ") (num_features)");
  }
  if (errs.finite_row.any()) {
    return errors::InvalidArgument("weights[", errs.finite_row.row.load(),
                                   "] contains a NaN or infinite value");
  }
  if (errs.overflow_row.any()) {
    const int64_t r = errs.overflow_row.row.load();
    const int64_t s = indices.dim_size(1);
    std::vector<std::pair<int32_t, float>> entries;
    lsh::CanonicalSparse(indices.flat<int32_t>().data() + r * s,
                         weights.flat<float>().data() + r * s, s,
                         num_features, &entries);
    const int64_t t = FirstInfiniteSum(entries);
    return errors::InvalidArgument(
        "weights[", r, "]: the weights of index ",
        t < 0 ? -1 : entries[t].first,
        " sum to an infinite value in float32 (the densified vector would "
        "not be finite)");
  }
  return absl::OkStatus();
}

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
    const int64_t e = projection.dim_size(0), H = projection.dim_size(1);
    const int64_t L = layout.num_tables;
    Tensor* codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, L}), &codes));
    if (n == 0) return;
    const int32_t* idx = indices.flat<int32_t>().data();
    const float* w = weights.flat<float>().data();
    const float* proj = projection.flat<float>().data();
    int32_t* out = codes->flat<int32_t>().data();
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
    OP_REQUIRES_OK(ctx, ReportSparseErrors(errs, indices, weights, e));
  }

 private:
  HashAttrs attrs_;
};

// ----- DWTA ------------------------------------------------------------------

// Validates bins [H, w] (coordinates in [0, input_dim)) and the layout.
absl::Status DwtaLayout(const HashAttrs& attrs, const Tensor& bins,
                        int64_t input_dim, lsh::CodeLayout* layout) {
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
  const int32_t* b = bins.flat<int32_t>().data();
  for (int64_t t = 0; t < H * w; ++t) {
    if (b[t] < 0 || b[t] >= input_dim) {
      return errors::InvalidArgument("bins[", t / w, ", ", t % w, "] = ", b[t],
                                     " is not in [0, ", input_dim,
                                     ") (input_dim)");
    }
  }
  layout->num_bits = static_cast<int>(attrs.num_bits);
  layout->bits_per_hash = bph;
  layout->bucket_bits = static_cast<int>(attrs.bucket_bits);
  layout->num_tables = H / attrs.num_bits;
  return absl::OkStatus();
}

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
    OP_REQUIRES_OK(ctx, DwtaLayout(attrs_, bins, d, &layout));
    const int64_t L = layout.num_tables, H = bins.dim_size(0);
    Tensor* codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, L}), &codes));
    if (n == 0) return;
    const lsh::DwtaHasher hasher(bins.flat<int32_t>().data(), H,
                                 static_cast<int>(bins.dim_size(1)), d,
                                 static_cast<uint64_t>(seed_),
                                 /*sparse=*/false);
    const float* x = vectors.flat<float>().data();
    int32_t* out = codes->flat<int32_t>().data();
    FirstError bad;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::DwtaHasher::Scratch scratch;
      for (int64_t i = start; i < limit; ++i) {
        if (FirstNonFinite(x + i * d, d) >= 0) {
          bad.Set(i);
          continue;
        }
        hasher.HashDense(x + i * d, layout, &scratch, out + i * L);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        3 * H * bins.dim_size(1) + d, work);
    OP_REQUIRES(ctx, !bad.any(),
                errors::InvalidArgument("vectors[", bad.row.load(),
                                        "] contains a NaN or infinite value"));
  }

 private:
  HashAttrs attrs_;
  int64_t seed_ = 0;
};

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
    OP_REQUIRES_OK(ctx, DwtaLayout(attrs_, bins, num_features_, &layout));
    const int64_t n = indices.dim_size(0), s = indices.dim_size(1);
    const int64_t L = layout.num_tables, H = bins.dim_size(0);
    Tensor* codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({n, L}), &codes));
    if (n == 0) return;
    const lsh::DwtaHasher hasher(bins.flat<int32_t>().data(), H,
                                 static_cast<int>(bins.dim_size(1)),
                                 num_features_, static_cast<uint64_t>(seed_),
                                 /*sparse=*/true);
    const int32_t* idx = indices.flat<int32_t>().data();
    const float* w = weights.flat<float>().data();
    int32_t* out = codes->flat<int32_t>().data();
    SparseErrors errs;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::DwtaHasher::Scratch scratch;
      std::vector<std::pair<int32_t, float>> entries;
      for (int64_t i = start; i < limit; ++i) {
        if (!SparseRow(idx + i * s, w + i * s, s, num_features_, i, &errs,
                       &entries)) {
          continue;
        }
        hasher.HashSparse(entries, layout, &scratch, out + i * L);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t per_coord =
        1 + H * bins.dim_size(1) / std::max<int64_t>(num_features_, 1);
    ::tensorflow::Shard(workers->num_threads, workers->workers, n,
                        4 * s * per_coord + 4 * H + 20 * s, work);
    OP_REQUIRES_OK(ctx,
                   ReportSparseErrors(errs, indices, weights, num_features_));
  }

 private:
  HashAttrs attrs_;
  int64_t seed_ = 0;
  int64_t num_features_ = 1;
};

// ----- Tables ----------------------------------------------------------------

class LshBuildTablesOp : public OpKernel {
 public:
  explicit LshBuildTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets_));
    // Before any B + 1: offsets are [L, B + 1].
    OP_REQUIRES(ctx, num_buckets_ >= 1 && num_buckets_ <= lsh::kMaxNumBuckets,
                errors::InvalidArgument(
                    "num_buckets must be in [1, 2^24] (bucket ids of at most "
                    "24 bits), got ", num_buckets_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& codes = ctx->input(0);
    OP_REQUIRES_OK(ctx, CheckRank(codes, 2, "codes", "[num_labels, L]"));
    const int64_t m = codes.dim_size(0), L = codes.dim_size(1);
    const int64_t B = num_buckets_;
    OP_REQUIRES_OK(ctx, CheckInt32Size(m, "num_labels"));
    const int32_t* c = codes.flat<int32_t>().data();
    for (int64_t t = 0; t < m * L; ++t) {
      OP_REQUIRES(ctx, c[t] >= 0 && c[t] < B,
                  errors::InvalidArgument("codes[", t / L, ", ", t % L,
                                          "] = ", c[t], " is not in [0, ", B,
                                          ") (num_buckets)"));
    }
    Tensor* offsets = nullptr;
    Tensor* labels = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({L, B + 1}), &offsets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({L, m}), &labels));
    int32_t* off = offsets->flat<int32_t>().data();
    int32_t* lab = labels->flat<int32_t>().data();
    auto work = [&](int64_t start, int64_t limit) {
      for (int64_t l = start; l < limit; ++l) {
        lsh::BuildTable(c, m, L, l, B, off + l * (B + 1), lab + l * m);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, L,
                        10 * m + 2 * B, work);
  }

 private:
  int64_t num_buckets_ = 1;
};

// Checks the CSR offsets [L, B + 1] of every table: 0 = first <= ... <= last
// = m.  O(L B).
absl::Status CheckOffsets(const Tensor& offsets, int64_t m) {
  const int64_t L = offsets.dim_size(0), B1 = offsets.dim_size(1);
  const int32_t* off = offsets.flat<int32_t>().data();
  for (int64_t l = 0; l < L; ++l) {
    const int32_t* o = off + l * B1;
    if (o[0] != 0 || o[B1 - 1] != m) {
      return errors::InvalidArgument(
          "offsets[", l, "] must start at 0 and end at num_labels = ", m,
          ", got ", o[0], " and ", o[B1 - 1]);
    }
    for (int64_t c = 0; c + 1 < B1; ++c) {
      if (o[c + 1] < o[c]) {
        return errors::InvalidArgument("offsets[", l, "] decreases at bucket ",
                                       c);
      }
    }
  }
  return absl::OkStatus();
}

// Shapes shared by the update and the query: offsets [L, B + 1], labels
// [L, m], codes [m, L].
absl::Status CheckTables(const Tensor& offsets, const Tensor& labels,
                         const Tensor& codes, int64_t* L, int64_t* B,
                         int64_t* m) {
  TF_RETURN_IF_ERROR(CheckRank(offsets, 2, "offsets", "[L, num_buckets + 1]"));
  TF_RETURN_IF_ERROR(CheckRank(labels, 2, "labels", "[L, num_labels]"));
  TF_RETURN_IF_ERROR(CheckRank(codes, 2, "codes", "[num_labels, L]"));
  *L = offsets.dim_size(0);
  *B = offsets.dim_size(1) - 1;
  *m = labels.dim_size(1);
  if (*B < 1) {
    return errors::InvalidArgument(
        "offsets must have num_buckets + 1 >= 2 columns, got shape ",
        offsets.shape().DebugString());
  }
  if (labels.dim_size(0) != *L) {
    return errors::InvalidArgument("labels.shape[0] must equal L = ", *L,
                                   " (offsets.shape[0]), got labels shape ",
                                   labels.shape().DebugString());
  }
  if (codes.dim_size(0) != *m || codes.dim_size(1) != *L) {
    return errors::InvalidArgument("codes shape ", codes.shape().DebugString(),
                                   " must be [num_labels, L] = [", *m, ", ", *L,
                                   "]");
  }
  return CheckInt32Size(*m, "num_labels");
}

class LshUpdateTablesOp : public OpKernel {
 public:
  explicit LshUpdateTablesOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    const Tensor& offsets = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& codes = ctx->input(2);
    const Tensor& rows = ctx->input(3);
    const Tensor& row_codes = ctx->input(4);
    int64_t L, B, m;
    OP_REQUIRES_OK(ctx, CheckTables(offsets, labels, codes, &L, &B, &m));
    OP_REQUIRES_OK(ctx, CheckRank(rows, 1, "rows", "[r]"));
    OP_REQUIRES_OK(ctx, CheckRank(row_codes, 2, "row_codes", "[r, L]"));
    const int64_t r = rows.dim_size(0);
    OP_REQUIRES(ctx, row_codes.dim_size(0) == r && row_codes.dim_size(1) == L,
                errors::InvalidArgument(
                    "row_codes shape ", row_codes.shape().DebugString(),
                    " must be [r, L] = [", r, ", ", L, "]"));
    OP_REQUIRES_OK(ctx, CheckOffsets(offsets, m));
    const int32_t* rw = rows.flat<int32_t>().data();
    const int32_t* rc = row_codes.flat<int32_t>().data();
    for (int64_t i = 0; i < r; ++i) {
      OP_REQUIRES(ctx, rw[i] >= 0 && rw[i] < m,
                  errors::InvalidArgument("rows[", i, "] = ", rw[i],
                                          " is not in [0, ", m,
                                          ") (num_labels)"));
    }
    for (int64_t t = 0; t < r * L; ++t) {
      OP_REQUIRES(ctx, rc[t] >= 0 && rc[t] < B,
                  errors::InvalidArgument("row_codes[", t / L, ", ", t % L,
                                          "] = ", rc[t], " is not in [0, ", B,
                                          ") (num_buckets)"));
    }
    // Unique rows; the last occurrence of a repeated row wins.
    std::vector<std::pair<int32_t, int64_t>> order(r);
    for (int64_t i = 0; i < r; ++i) order[i] = {rw[i], i};
    std::sort(order.begin(), order.end());
    std::vector<std::pair<int32_t, int64_t>> unique;  // (label, source row)
    for (int64_t i = 0; i < r; ++i) {
      if (i + 1 < r && order[i + 1].first == order[i].first) continue;
      unique.push_back(order[i]);
    }
    const int32_t* old_codes = codes.flat<int32_t>().data();
    const int32_t* old_off = offsets.flat<int32_t>().data();
    const int32_t* old_lab = labels.flat<int32_t>().data();
    // The old codes of the moved labels name the buckets they leave.  (The
    // others are checked while they are copied to new_codes, below.)
    for (const auto& u : unique) {
      const int32_t* row = old_codes + static_cast<int64_t>(u.first) * L;
      const int64_t l = FirstCodeOutOfRange(row, L, B);
      OP_REQUIRES(ctx, l < 0,
                  errors::InvalidArgument(
                      "codes[", u.first, ", ", l, "] = ", row[l < 0 ? 0 : l],
                      " is not in [0, ", B, ") (num_buckets)"));
    }
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    Tensor* new_offsets = nullptr;
    Tensor* new_labels = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, offsets.shape(), &new_offsets));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, labels.shape(), &new_labels));
    int32_t* new_off = new_offsets->flat<int32_t>().data();
    int32_t* new_lab = new_labels->flat<int32_t>().data();
    std::atomic<int64_t> bad_table{-1};
    FirstError bad_labels;  // a table whose labels are not a permutation
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<lsh::Move> moves;
      std::vector<uint64_t> seen;
      for (int64_t l = start; l < limit; ++l) {
        // Each table holds every label once (Xmc>LshBuildTables): checked
        // here, O(m), since untouched runs are block-copied unread.
        if (lsh::FirstNonPermutation(old_lab + l * m, m, &seen) >= 0) {
          bad_labels.Set(l);
          continue;
        }
        moves.clear();
        for (const auto& u : unique) {
          const int32_t from = old_codes[static_cast<int64_t>(u.first) * L + l];
          const int32_t to = rc[u.second * L + l];
          if (from != to) moves.push_back({u.first, from, to});
        }
        const int32_t* o_off = old_off + l * (B + 1);
        const int32_t* o_lab = old_lab + l * m;
        if (moves.empty()) {
          std::memcpy(new_off + l * (B + 1), o_off, (B + 1) * sizeof(int32_t));
          std::memcpy(new_lab + l * m, o_lab, m * sizeof(int32_t));
          continue;
        }
        if (!lsh::UpdateTable(o_off, o_lab, m, B, &moves,
                              new_off + l * (B + 1), new_lab + l * m)) {
          bad_table.store(l);
        }
      }
    };
    ::tensorflow::Shard(
        workers->num_threads, workers->workers, L,
        3 * m + 4 * B + 40 * static_cast<int64_t>(unique.size()), work);
    if (bad_labels.any()) {
      const int64_t l = bad_labels.row.load();
      std::vector<uint64_t> seen;
      const int64_t t = lsh::FirstNonPermutation(old_lab + l * m, m, &seen);
      const int32_t v = old_lab[l * m + t];
      if (v < 0 || v >= m) {
        ctx->CtxFailure(errors::InvalidArgument(
            "labels[", l, ", ", t, "] = ", v, " is not in [0, ", m,
            ") (num_labels)"));
      } else {
        ctx->CtxFailure(errors::InvalidArgument(
            "labels[", l, ", ", t, "] = ", v, " repeats an earlier label id: "
            "labels[", l, "] must be a permutation of [0, ", m,
            ") (every label once per table, as Xmc>LshBuildTables builds "
            "them)"));
      }
      return;
    }
    OP_REQUIRES(ctx, bad_table.load() < 0,
                errors::InvalidArgument(
                    "table ", bad_table.load(),
                    " does not match codes: a re-hashed label was not in the "
                    "bucket its old code names (rebuild the tables)"));
    // Codes: updated copy (in place when the input buffer can be forwarded).
    // Every old code must be a bucket id: checked on the copy, block by
    // block while it is in cache (one vectorised pass).
    Tensor* new_codes = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output(
                            {2}, 2, codes.shape(), &new_codes));
    int32_t* nc = new_codes->flat<int32_t>().data();
    FirstError bad_code_row;
    auto copy_codes = [&](int64_t start, int64_t limit) {
      constexpr int64_t kChunk = 8192;  // 32 KB: checked while in L1
      for (int64_t a = start * L; a < limit * L; a += kChunk) {
        const int64_t len = std::min(kChunk, limit * L - a);
        if (nc != old_codes) std::memcpy(nc + a, old_codes + a, len * 4);
        const int64_t t = FirstCodeOutOfRange(nc + a, len, B);
        if (t >= 0) {
          bad_code_row.Set((a + t) / L);
          return;
        }
      }
    };
    ::tensorflow::Shard(workers->num_threads, workers->workers, m, 3 * L + 1,
                        copy_codes);
    if (bad_code_row.any()) {
      const int64_t j = bad_code_row.row.load();
      const int64_t l = FirstCodeOutOfRange(nc + j * L, L, B);
      ctx->CtxFailure(errors::InvalidArgument("codes[", j, ", ", l, "] = ",
                                              nc[j * L + l], " is not in [0, ",
                                              B, ") (num_buckets)"));
      return;
    }
    for (const auto& u : unique) {
      std::memcpy(nc + static_cast<int64_t>(u.first) * L, rc + u.second * L,
                  L * sizeof(int32_t));
    }
  }
};

// ----- Query -----------------------------------------------------------------

class LshQueryOp : public OpKernel {
 public:
  explicit LshQueryOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t k;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_candidates", &k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("seed", &seed_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("count_collisions", &count_collisions_));
    OP_REQUIRES(ctx, k >= 1 && k <= (1 << 24),
                errors::InvalidArgument("num_candidates must be in [1, 2^24], "
                                        "got ", k));
    k_ = static_cast<int>(k);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& offsets = ctx->input(0);
    const Tensor& labels = ctx->input(1);
    const Tensor& codes = ctx->input(2);
    const Tensor& query_codes = ctx->input(3);
    const Tensor& step = ctx->input(4);
    int64_t L, B, m;
    OP_REQUIRES_OK(ctx, CheckTables(offsets, labels, codes, &L, &B, &m));
    OP_REQUIRES_OK(ctx,
                   CheckRank(query_codes, 3, "query_codes", "[batch, q, L]"));
    OP_REQUIRES(ctx, query_codes.dim_size(2) == L,
                errors::InvalidArgument(
                    "query_codes.shape[2] must equal L = ", L,
                    " (offsets.shape[0]), got query_codes shape ",
                    query_codes.shape().DebugString()));
    OP_REQUIRES(ctx, step.dims() == 0,
                errors::InvalidArgument("step must be a scalar, got shape ",
                                        step.shape().DebugString()));
    const int64_t b = query_codes.dim_size(0), q = query_codes.dim_size(1);
    const int64_t step_value = step.scalar<int64_t>()();
    Tensor *ids = nullptr, *valid = nullptr, *collisions = nullptr,
           *rate = nullptr, *probed = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b, k_}), &ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b, k_}), &valid));
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(2, TensorShape({b, k_}), &collisions));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(3, TensorShape({b}), &rate));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(4, TensorShape({b}), &probed));
    if (b == 0) return;
    const lsh::Tables tables{offsets.flat<int32_t>().data(),
                             labels.flat<int32_t>().data(),
                             codes.flat<int32_t>().data(), m, L, B};
    const int32_t* qc = query_codes.flat<int32_t>().data();
    int32_t* out_ids = ids->flat<int32_t>().data();
    bool* out_valid = valid->flat<bool>().data();
    int32_t* out_coll = collisions->flat<int32_t>().data();
    float* out_rate = rate->flat<float>().data();
    int64_t* out_probed = probed->flat<int64_t>().data();
    FirstError bad_code, corrupt, bad_label_code;
    auto work = [&](int64_t start, int64_t limit) {
      lsh::QueryScratch scratch;
      for (int64_t i = start; i < limit; ++i) {
        const lsh::QueryStatus status = lsh::QueryRow(
            tables, qc + i * q * L, q, k_, lsh::RowKey(seed_, step_value, i),
            count_collisions_, &scratch, out_ids + i * k_, out_valid + i * k_,
            out_coll + i * k_, out_rate + i, out_probed + i);
        if (status == lsh::QueryStatus::kBadQueryCode) bad_code.Set(i);
        if (status == lsh::QueryStatus::kCorruptTables) corrupt.Set(i);
        if (status == lsh::QueryStatus::kBadCode) bad_label_code.Set(i);
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    const int64_t cost = 10 * q * L + 60 * k_ +
                         (count_collisions_ ? 2 * k_ * q * L : 0);
    ::tensorflow::Shard(workers->num_threads, workers->workers, b, cost, work);
    if (bad_code.any()) {
      const int64_t i = bad_code.row.load();
      int64_t t = 0;
      for (; t < q * L; ++t) {
        const int32_t c = qc[i * q * L + t];
        if (c != -1 && (c < 0 || c >= B)) break;
      }
      ctx->CtxFailure(errors::InvalidArgument(
          "query_codes[", i, ", ", t / L, ", ", t % L, "] = ",
          qc[i * q * L + t], " is not -1 (no probe) or in [0, ", B,
          ") (num_buckets)"));
      return;
    }
    OP_REQUIRES(ctx, !corrupt.any(),
                errors::InvalidArgument(
                    "the tables are corrupt (an offset or a label id out of "
                    "range) at batch row ",
                    corrupt.row.load(), "; rebuild them"));
    if (bad_label_code.any()) {
      // The candidates of that row were written before their codes were
      // read: find the first bad code among them.
      const int64_t i = bad_label_code.row.load();
      const int32_t* cd = codes.flat<int32_t>().data();
      for (int64_t t = 0; t < k_ && out_valid[i * k_ + t]; ++t) {
        const int64_t j = out_ids[i * k_ + t];
        for (int64_t l = 0; l < L; ++l) {
          const int32_t c = cd[j * L + l];
          if (c < 0 || c >= B) {
            ctx->CtxFailure(errors::InvalidArgument(
                "codes[", j, ", ", l, "] = ", c, " is not in [0, ", B,
                ") (num_buckets; read for the collision counts of batch row ",
                i, ")"));
            return;
          }
        }
      }
      ctx->CtxFailure(errors::Internal("LshQuery: bad code not found"));
    }
  }

 private:
  int k_ = 1;
  int64_t seed_ = 0;
  bool count_collisions_ = true;
};

// ----- Cosines between sparse rows ----------------------------------------------

// Validates a batch of sparse rows [b, r, s] (indices, weights).
absl::Status CheckSparseBatch(const Tensor& indices, const Tensor& weights,
                              const char* name) {
  TF_RETURN_IF_ERROR(CheckRank(indices, 3, name, "[batch, rows, s]"));
  if (weights.shape() != indices.shape()) {
    return errors::InvalidArgument(
        name, " weights shape ", weights.shape().DebugString(),
        " must equal its indices shape ", indices.shape().DebugString());
  }
  return absl::OkStatus();
}

// Euclidean norm of a canonical row, in float64.  The entries are float32
// values or float64 sums of at most s of them (|v| < s * 2^128), so the
// squares cannot overflow and need no scaling.
double Norm(const std::vector<std::pair<int32_t, double>>& row) {
  double sq = 0.0;
  for (const auto& c : row) sq += c.second * c.second;
  return std::sqrt(sq);
}

// Largest num_features whose scatter array (float64, per shard) is dense.
constexpr int64_t kCosineDenseMax = int64_t{1} << 22;

class LshSparseCosineOp : public OpKernel {
 public:
  explicit LshSparseCosineOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_features", &num_features_));
    OP_REQUIRES_OK(ctx, CheckNumFeatures(num_features_));
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& a_idx = ctx->input(0);
    const Tensor& a_w = ctx->input(1);
    const Tensor& b_idx = ctx->input(2);
    const Tensor& b_w = ctx->input(3);
    OP_REQUIRES_OK(ctx, CheckSparseBatch(a_idx, a_w, "a"));
    OP_REQUIRES_OK(ctx, CheckSparseBatch(b_idx, b_w, "b"));
    OP_REQUIRES(ctx, a_idx.dim_size(0) == b_idx.dim_size(0),
                errors::InvalidArgument(
                    "a and b must have the same batch size, got shapes ",
                    a_idx.shape().DebugString(), " and ",
                    b_idx.shape().DebugString()));
    const int64_t batch = a_idx.dim_size(0), k = a_idx.dim_size(1);
    const int64_t sa = a_idx.dim_size(2);
    const int64_t n = b_idx.dim_size(1), sb = b_idx.dim_size(2);
    Tensor* cos = nullptr;
    OP_REQUIRES_OK(ctx,
                   ctx->allocate_output(0, TensorShape({batch, k, n}), &cos));
    if (batch == 0 || k == 0 || n == 0) return;
    const int32_t* ai = a_idx.flat<int32_t>().data();
    const float* aw = a_w.flat<float>().data();
    const int32_t* bi = b_idx.flat<int32_t>().data();
    const float* bw = b_w.flat<float>().data();
    float* out = cos->flat<float>().data();
    const int64_t e = num_features_;
    // The b row being compared is scattered into an array indexed by
    // "slot": its coordinate when num_features is moderate (dense map), else
    // the coordinate's rank among the distinct coordinates of the instance's
    // k a rows (compact map: memory O(k s_a), never O(num_features)).
    const bool dense_map = e <= kCosineDenseMax;
    // Failing rows, as flat row numbers of a ([batch * k]) and b.
    FirstError a_index, a_finite, b_index, b_finite;
    auto work = [&](int64_t start, int64_t limit) {
      std::vector<double> scatter(dense_map ? e : 0, 0.0);  // 0 between rows
      std::vector<int32_t> coords;  // compact map: sorted distinct coordinates
      std::vector<std::vector<std::pair<int32_t, double>>> rows(k);
      std::vector<double> norm(k);
      std::vector<std::pair<int32_t, double>> query;
      std::vector<int64_t> slots;  // slots of the b row's scattered entries
      for (int64_t i = start; i < limit; ++i) {
        bool ok = true;
        for (int64_t j = 0; j < k && ok; ++j) {
          const int64_t r = i * k + j;
          if (lsh::CanonicalSparse(ai + r * sa, aw + r * sa, sa, e,
                                   &rows[j]) >= 0) {
            a_index.Set(r);
            ok = false;
          } else if (FirstNonFinite(aw + r * sa, sa) >= 0) {
            a_finite.Set(r);
            ok = false;
          }
          norm[j] = Norm(rows[j]);
        }
        if (!ok) continue;
        if (!dense_map) {
          coords.clear();
          for (const auto& row : rows) {
            for (const auto& c : row) coords.push_back(c.first);
          }
          std::sort(coords.begin(), coords.end());
          coords.erase(std::unique(coords.begin(), coords.end()),
                       coords.end());
          if (scatter.size() < coords.size()) scatter.resize(coords.size());
          for (auto& row : rows) {  // coordinates -> ranks (rows are sorted)
            auto lo = coords.begin();
            for (auto& c : row) {
              lo = std::lower_bound(lo, coords.end(), c.first);
              c.first = static_cast<int32_t>(lo - coords.begin());
            }
          }
        }
        for (int64_t p = 0; p < n; ++p) {
          const int64_t r = i * n + p;
          if (lsh::CanonicalSparse(bi + r * sb, bw + r * sb, sb, e, &query) >=
              0) {
            b_index.Set(r);
            break;
          }
          if (FirstNonFinite(bw + r * sb, sb) >= 0) {
            b_finite.Set(r);
            break;
          }
          const double qn = Norm(query);
          slots.clear();
          if (dense_map) {
            for (const auto& c : query) {
              scatter[c.first] = c.second;
              slots.push_back(c.first);
            }
          } else {
            auto lo = coords.begin();
            for (const auto& c : query) {
              lo = std::lower_bound(lo, coords.end(), c.first);
              if (lo == coords.end()) break;
              if (*lo != c.first) continue;  // in no a row: adds 0 to dots
              scatter[lo - coords.begin()] = c.second;
              slots.push_back(lo - coords.begin());
            }
          }
          float* o = out + i * k * n + p;
          for (int64_t j = 0; j < k; ++j) {
            double dot = 0.0;
            for (const auto& c : rows[j]) dot += scatter[c.first] * c.second;
            const double den = qn * norm[j];
            o[j * n] = den > 0.0 ? static_cast<float>(dot / den) : 0.0f;
          }
          for (int64_t slot : slots) scatter[slot] = 0.0;
        }
      }
    };
    auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
    ::tensorflow::Shard(workers->num_threads, workers->workers, batch,
                        20 * k * sa + 4 * n * (k * sa + sb) +
                            (dense_map ? e : 40 * k * sa),
                        work);
    const struct {
      const FirstError& err;
      const Tensor& idx;
      const char* what;
      int64_t rows;
      bool index;
    } checks[] = {{a_index, a_idx, "a", k, true},
                  {a_finite, a_idx, "a", k, false},
                  {b_index, b_idx, "b", n, true},
                  {b_finite, b_idx, "b", n, false}};
    for (const auto& c : checks) {
      if (!c.err.any()) continue;
      const int64_t r = c.err.row.load();
      const int64_t s = c.idx.dim_size(2);
      if (!c.index) {
        ctx->CtxFailure(errors::InvalidArgument(
            c.what, "_weights[", r / c.rows, ", ", r % c.rows,
            "] contains a NaN or infinite value"));
        return;
      }
      const int32_t* idx = c.idx.flat<int32_t>().data() + r * s;
      int64_t t = 0;
      while (t < s && idx[t] >= 0 && idx[t] < e) ++t;
      ctx->CtxFailure(errors::InvalidArgument(
          c.what, "_indices[", r / c.rows, ", ", r % c.rows, ", ", t, "] = ",
          idx[t], " is not in [0, ", e, ") (num_features)"));
      return;
    }
  }

 private:
  int64_t num_features_ = 1;
};

}  // namespace

#define XMC_LSH_CPU(name, cls) \
  REGISTER_KERNEL_BUILDER(Name(name).Device(::tensorflow::DEVICE_CPU), cls)

XMC_LSH_CPU("Xmc>LshSimHash", LshSimHashOp);
XMC_LSH_CPU("Xmc>LshSimHashSparse", LshSimHashSparseOp);
XMC_LSH_CPU("Xmc>LshDwtaHash", LshDwtaHashOp);
XMC_LSH_CPU("Xmc>LshDwtaHashSparse", LshDwtaHashSparseOp);
XMC_LSH_CPU("Xmc>LshBuildTables", LshBuildTablesOp);
XMC_LSH_CPU("Xmc>LshUpdateTables", LshUpdateTablesOp);
XMC_LSH_CPU("Xmc>LshQuery", LshQueryOp);
XMC_LSH_CPU("Xmc>LshSparseCosine", LshSparseCosineOp);

#undef XMC_LSH_CPU

}  // namespace xmc_tf
