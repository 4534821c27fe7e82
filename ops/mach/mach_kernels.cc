// CPU kernel of Xmc>MachTopK: exact top-k decoding of MACH meta-class
// probabilities (Medini et al., NeurIPS 2019, Sec. 3, Eq. 2) without
// materialising the [batch, num_labels] score matrix.
//
// Two exact algorithms with bit-identical output (see mach_kernels.h):
//   brute_force: score every label in chunks with a running top-k.
//   threshold:   Fagin's threshold algorithm over per-repetition inverted
//                lists (built once per kernel instance and cached).
//
// Structure (ops/common/device.h): one OpKernel class templated on the
// device, MachTopKOp<Device>, checks the attributes (at construction) and
// the shape of probs, allocates the outputs and calls
// functor::MachTopK<Device> (mach_kernels.h), passing the kernel's
// functor::MachTopKCache<Device>.  The CPU functor builds the inverted lists
// into that cache on its first threshold call, decodes the rows on
// TensorFlow's intra-op pool and reports the smallest non-finite row
// (ops/common/bad_index.h FirstBad).  Registered for DEVICE_CPU only.
#include "ops/mach/mach_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <sstream>
#include <utility>
#include <vector>

#include "ops/common/bad_index.h"
#include "ops/common/validation.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/framework/tensor_shape.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace mach {

// ---------------------------------------------------------------------------
// Framework-free functors.
// ---------------------------------------------------------------------------

bool IsPrime(int64_t p) {
  if (p < 2) return false;
  if (p < 4) return true;
  if (p % 2 == 0 || p % 3 == 0) return false;
  for (int64_t d = 5; d * d <= p; d += 6) {
    if (p % d == 0 || p % (d + 2) == 0) return false;
  }
  return true;
}

std::string ValidateHashParams(const std::vector<int64_t>& hash_a,
                               const std::vector<int64_t>& hash_b,
                               int64_t prime, int64_t num_labels,
                               int64_t num_buckets) {
  std::ostringstream err;
  if (prime < 2 || prime > kMersenne31) {
    err << "prime must be in [2, 2^31 - 1], got " << prime;
  } else if (!IsPrime(prime)) {
    err << "prime must be a prime number, got " << prime;
  } else if (num_labels < 1 || num_labels > prime) {
    err << "num_labels must be in [1, prime=" << prime << "], got "
        << num_labels;
  } else if (num_buckets < 1 || num_buckets > prime) {
    err << "num_buckets must be in [1, prime=" << prime << "], got "
        << num_buckets;
  } else if (hash_a.empty() || hash_a.size() != hash_b.size()) {
    err << "hash_a and hash_b must have the same non-zero length (the number "
        << "of repetitions R), got " << hash_a.size() << " and "
        << hash_b.size();
  } else {
    for (size_t r = 0; r < hash_a.size(); ++r) {
      if (hash_a[r] < 1 || hash_a[r] >= prime) {
        err << "hash_a[" << r << "] must be in [1, prime - 1], got "
            << hash_a[r];
        break;
      }
      if (hash_b[r] < 0 || hash_b[r] >= prime) {
        err << "hash_b[" << r << "] must be in [0, prime - 1], got "
            << hash_b[r];
        break;
      }
    }
  }
  return err.str();
}

MachHasher::MachHasher(std::vector<int64_t> hash_a, std::vector<int64_t> hash_b,
                       int64_t prime, int64_t num_buckets)
    : a_(std::move(hash_a)),
      b_(std::move(hash_b)),
      prime_(prime),
      num_buckets_(num_buckets),
      mersenne_(prime == kMersenne31),
      pow2_(num_buckets > 0 && (num_buckets & (num_buckets - 1)) == 0),
      bucket_mask_(static_cast<uint64_t>(num_buckets - 1)) {}

void MachInvertedLists::Allocate(const MachHasher& hasher, int64_t m) {
  num_repetitions = hasher.num_repetitions();
  num_buckets = hasher.num_buckets();
  num_labels = m;
  offsets.assign(static_cast<size_t>(num_repetitions) * (num_buckets + 1), 0);
  labels.resize(static_cast<size_t>(num_repetitions) * m);
}

void MachInvertedLists::BuildRepetition(const MachHasher& hasher, int r) {
  const int64_t B = num_buckets;
  const int64_t m = num_labels;
  int32_t* off = offsets.data() + static_cast<size_t>(r) * (B + 1);
  int32_t* lab = labels.data() + static_cast<size_t>(r) * m;
  // Counting sort without extra memory: counts in off[c + 1], prefix sums
  // (off[c] = start of bucket c), placement advancing off[c] to the end of
  // bucket c, then a shift back.  The hash is recomputed in the second pass.
  std::fill(off, off + B + 1, 0);
  for (int64_t j = 0; j < m; ++j) ++off[hasher.Bucket(r, j) + 1];
  for (int64_t c = 0; c < B; ++c) off[c + 1] += off[c];
  for (int64_t j = 0; j < m; ++j) {
    lab[off[hasher.Bucket(r, j)]++] = static_cast<int32_t>(j);
  }
  for (int64_t c = B; c > 0; --c) off[c] = off[c - 1];
  off[0] = 0;
}

void MachInvertedLists::Build(const MachHasher& hasher, int64_t m) {
  Allocate(hasher, m);
  for (int r = 0; r < num_repetitions; ++r) BuildRepetition(hasher, r);
}

namespace {

// (score desc, label asc): true when `a` ranks before `b`.
inline bool Better(const ScoredLabel& a, const ScoredLabel& b) {
  return a.score > b.score || (a.score == b.score && a.label < b.label);
}

// The one definition of a label's score from its R bucket values (Eq. 2):
// float sum in repetition order, then division by R.
inline float MeanOfValues(const float* values, int R) {
  float s = 0.0f;
  for (int r = 0; r < R; ++r) s += values[r];
  return s / static_cast<float>(R);
}

// Checks that every entry is finite; returns max |value| through `maxabs`.
// Works on the bit patterns: with the sign bit cleared, IEEE floats order as
// unsigned integers, and NaN/inf are exactly the patterns >= 0x7f800000; the
// integer max reduction vectorises.
inline bool AllFinite(const float* x, int64_t n, float* maxabs) {
  uint32_t mx = 0;
  for (int64_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, x + i, sizeof(bits));
    bits &= 0x7fffffffu;
    mx = bits > mx ? bits : mx;
  }
  std::memcpy(maxabs, &mx, sizeof(mx));
  return mx < 0x7f800000u;
}

inline void WriteOut(const std::vector<ScoredLabel>& best, int32_t* top_ids,
                     float* top_scores) {
  for (size_t t = 0; t < best.size(); ++t) {
    top_ids[t] = best[t].label;
    top_scores[t] = best[t].score;
  }
}

}  // namespace

void TopK::Push(float score, int32_t label) {
  const ScoredLabel c{score, label};
  if (static_cast<int>(heap_.size()) < k_) {
    heap_.push_back(c);
    std::push_heap(heap_.begin(), heap_.end(), Better);
  } else if (Better(c, heap_.front())) {
    std::pop_heap(heap_.begin(), heap_.end(), Better);
    heap_.back() = c;
    std::push_heap(heap_.begin(), heap_.end(), Better);
  }
}

const std::vector<ScoredLabel>& TopK::Sorted() {
  std::sort_heap(heap_.begin(), heap_.end(), Better);
  return heap_;
}

RowStatus MachTopKBruteForce(const float* probs, const MachHasher& hasher,
                             int64_t num_labels, int k, MachScratch* scratch,
                             int32_t* top_ids, float* top_scores) {
  const int R = hasher.num_repetitions();
  const int64_t B = hasher.num_buckets();
  float maxabs;
  if (!AllFinite(probs, R * B, &maxabs)) return RowStatus::kNonFinite;
  constexpr int64_t kChunk = 1024;
  std::vector<float>& acc = scratch->chunk;
  acc.resize(kChunk);
  TopK topk(k);
  for (int64_t start = 0; start < num_labels; start += kChunk) {
    const int64_t n = std::min(kChunk, num_labels - start);
    std::fill(acc.begin(), acc.begin() + n, 0.0f);
    // Same float operations, in the same order, as MeanOfValues.
    for (int r = 0; r < R; ++r) {
      const float* pr = probs + r * B;
      for (int64_t t = 0; t < n; ++t) acc[t] += pr[hasher.Bucket(r, start + t)];
    }
    for (int64_t t = 0; t < n; ++t) {
      topk.Push(acc[t] / static_cast<float>(R),
                static_cast<int32_t>(start + t));
    }
  }
  WriteOut(topk.Sorted(), top_ids, top_scores);
  return RowStatus::kOk;
}

RowStatus MachTopKThreshold(const float* probs, const MachHasher& hasher,
                            const MachInvertedLists& lists, int k,
                            bool brute_force_fallback, MachScratch* scratch,
                            int32_t* top_ids, float* top_scores) {
  const int R = hasher.num_repetitions();
  const int64_t B = hasher.num_buckets();
  const int64_t m = lists.num_labels;
  // Small label sets (buckets of <= 16 labels): building the sorted access
  // costs about as much as scoring every label; brute force is faster.
  if (brute_force_fallback && m <= 16 * B) {
    return MachTopKBruteForce(probs, hasher, m, k, scratch, top_ids,
                              top_scores);
  }
  auto& visited = scratch->visited;
  visited.assign(static_cast<size_t>(R) * B, 0);
  // Sorted access per repetition, lazily: first the top T buckets, found by
  // one pass with a size-T min-heap and sorted (O(B + T log T)); only when a
  // repetition needs more than T buckets, a max-heap of its remaining buckets
  // (O(B) to build, O(log B) per pop).
  const int64_t T = std::min<int64_t>(B, std::max<int64_t>(16, 2 * k));
  auto& cand = scratch->candidates;
  cand.resize(static_cast<size_t>(R) * T);
  auto& heaps = scratch->buckets;
  std::vector<int64_t> pos(R, 0);         // next index into the top-T list
  std::vector<int64_t> heap_size(R, -1);  // -1: max-heap not built
  auto& next = scratch->next;  // largest unvisited probability per repetition
  next.resize(R);
  float maxabs;
  if (!AllFinite(probs, R * B, &maxabs)) return RowStatus::kNonFinite;
  const auto greater = std::greater<std::pair<float, int32_t>>();
  for (int r = 0; r < R; ++r) {
    auto* cd = cand.data() + static_cast<size_t>(r) * T;
    const float* pr = probs + r * B;
    for (int64_t c = 0; c < T; ++c) cd[c] = {pr[c], static_cast<int32_t>(c)};
    std::make_heap(cd, cd + T, greater);  // min-heap of the best T so far
    auto offer = [&](int64_t c) {
      if (pr[c] > cd[0].first) {
        std::pop_heap(cd, cd + T, greater);
        cd[T - 1] = {pr[c], static_cast<int32_t>(c)};
        std::push_heap(cd, cd + T, greater);
      }
    };
    // Blocks of 8 are first compared with the current T-th value at once
    // (vectorised); most blocks hold no candidate.
    int64_t c = T;
    for (; c + 8 <= B; c += 8) {
      const float thr = cd[0].first;
      int any = 0;
      for (int u = 0; u < 8; ++u) any |= pr[c + u] > thr;
      if (any) {
        for (int u = 0; u < 8; ++u) offer(c + u);
      }
    }
    for (; c < B; ++c) offer(c);
    std::sort(cd, cd + T, greater);
    next[r] = cd[0].first;
  }
  // Pops the next bucket of repetition r in non-increasing probability order
  // and updates next[r]; returns false when no bucket is left.
  auto pop = [&](int r, float* value, int32_t* bucket) {
    const auto* cd = cand.data() + static_cast<size_t>(r) * T;
    if (pos[r] < T) {
      *value = cd[pos[r]].first;
      *bucket = cd[pos[r]].second;
      ++pos[r];
    } else {
      auto* h = heaps.data() + static_cast<size_t>(r) * B;
      std::pop_heap(h, h + heap_size[r]);
      --heap_size[r];
      *value = h[heap_size[r]].first;
      *bucket = h[heap_size[r]].second;
    }
    visited[static_cast<size_t>(r) * B + *bucket] = 1;
    if (pos[r] < T) {
      next[r] = cd[pos[r]].first;
    } else {
      if (heaps.size() < static_cast<size_t>(R) * B) {
        heaps.resize(static_cast<size_t>(R) * B);
      }
      auto* h = heaps.data() + static_cast<size_t>(r) * B;
      if (heap_size[r] < 0) {  // build the max-heap of the unvisited rest
        const float* pr = probs + r * B;
        int64_t n = 0;
        for (int64_t c = 0; c < B; ++c) {
          if (!visited[static_cast<size_t>(r) * B + c]) {
            h[n++] = {pr[c], static_cast<int32_t>(c)};
          }
        }
        std::make_heap(h, h + n);
        heap_size[r] = n;
      }
      next[r] = heap_size[r] > 0 ? h[0].first
                                 : -std::numeric_limits<float>::infinity();
    }
    return !(pos[r] >= T && heap_size[r] == 0);
  };
  auto& values = scratch->values;
  values.resize(R);
  auto& label_buckets = scratch->label_buckets;
  label_buckets.resize(R);
  std::vector<int> order(R);

  // Pruning a label early from a partial upper bound (computed in double) is
  // only done when the bound is below the k-th score by more than the float
  // rounding error of a score.  Without overflow, the float sum of R values
  // is within R (R - 1) / 2 u maxabs of the exact sum (u = 2^-24), and the
  // division by R rounds by at most max(u |score|, 2^-150) (the absolute
  // term covers subnormal scores); a label whose exact upper bound is below
  // R * kth - margin therefore has a float score strictly below the k-th.
  // When a float partial sum can overflow (R maxabs near FLT_MAX), a float
  // score may be +-inf although the exact sum is finite (e.g. 3e38 + 3e38 -
  // 3e38 is inf in float), so the double bound says nothing about it: the
  // margin is then +inf, which turns the double-bound pruning off (every
  // comparison `bound + margin < kth_sum` is false).  The float stopping rule
  // below stays exact in that case (float addition is monotone, also when
  // it overflows).
  const double u = std::ldexp(1.0, -24);
  const bool may_overflow =
      static_cast<double>(R) * static_cast<double>(maxabs) *
          (1.0 + 2.0 * R * u) >=
      static_cast<double>(std::numeric_limits<float>::max());
  const double margin =
      may_overflow ? std::numeric_limits<double>::infinity()
                   : 2.0 * R * (R + 1) * u * static_cast<double>(maxabs) +
                         2.0 * R * std::ldexp(1.0, -149);
  TopK topk(k);
  double kth_sum = -std::numeric_limits<double>::infinity();
  // Label entries visited so far (the work, in units of about one
  // brute-force label scoring each).
  int64_t label_visits = 0;

  // Visits the next bucket of repetition r: scores its labels that were not
  // seen before; returns true when repetition r is exhausted (then every
  // label has been seen).
  auto visit = [&](int r) -> bool {
    float v;
    int32_t c;
    const bool more = pop(r, &v, &c);
    // No other repetition is exhausted here (we stop at the first one).
    double others = 0.0;
    for (int r2 = 0; r2 < R; ++r2) {
      if (r2 != r) others += next[r2];
    }
    const int32_t* off =
        lists.offsets.data() + static_cast<size_t>(r) * (B + 1);
    const int32_t* lab = lists.labels.data() + static_cast<size_t>(r) * m;
    // No new label of this bucket can reach the k-th score.
    if (topk.full() && static_cast<double>(v) + others + margin < kth_sum) {
      return !more;
    }
    values[r] = v;
    label_buckets[r] = c;
    label_visits += off[c + 1] - off[c];
    // Random accesses go to the other repetitions in decreasing next[r2]
    // order: each read lowers the bound by next[r2] - value, so the largest
    // terms are replaced first and pruning happens after fewer reads.
    int num_order = 0;
    for (int r2 = 0; r2 < R; ++r2) {
      if (r2 != r) order[num_order++] = r2;
    }
    std::sort(order.begin(), order.begin() + num_order,
              [&](int x, int y) { return next[x] > next[y]; });
    for (int32_t t = off[c]; t < off[c + 1]; ++t) {
      const int32_t j = lab[t];
      // Random access to the other repetitions.  For a label not seen
      // before, no other bucket of it was visited, so its value in a
      // repetition not read yet is at most next[r2]: `bound` is an upper
      // bound of R * score (for a label seen before it may not be, but such
      // a label was already considered, so pruning it is harmless).
      double bound = static_cast<double>(v) + others;
      bool pruned = false;
      if (topk.full()) {
        for (int o = 0; o < num_order; ++o) {
          const int r2 = order[o];
          const int32_t b2 = hasher.Bucket(r2, j);
          const float val = probs[r2 * B + b2];
          values[r2] = val;
          label_buckets[r2] = b2;
          bound += static_cast<double>(val) - static_cast<double>(next[r2]);
          if (bound + margin < kth_sum) {
            pruned = true;  // cannot reach the current k-th score
            break;
          }
        }
        if (pruned) continue;
      } else {
        for (int r2 = 0; r2 < R; ++r2) {
          if (r2 == r) continue;
          const int32_t b2 = hasher.Bucket(r2, j);
          values[r2] = probs[r2 * B + b2];
          label_buckets[r2] = b2;
        }
      }
      const float score = MeanOfValues(values.data(), R);
      if (topk.full() && !Better({score, j}, topk.worst())) continue;
      // A label is new iff none of its other buckets was visited before;
      // a label seen before was already offered to the top-k.
      bool seen = false;
      for (int r2 = 0; r2 < R; ++r2) {
        if (r2 != r &&
            visited[static_cast<size_t>(r2) * B + label_buckets[r2]]) {
          seen = true;
          break;
        }
      }
      if (seen) continue;
      topk.Push(score, j);
      if (topk.full()) kth_sum = static_cast<double>(topk.worst().score) * R;
    }
    return !more;
  };
  // Stopping rule, with the same float operations as MeanOfValues: a valid
  // upper bound of the float score of every unseen label (float + is
  // monotone), so stopping when it is strictly below the k-th score is exact.
  auto below_threshold = [&]() {
    return topk.full() && MeanOfValues(next.data(), R) < topk.worst().score;
  };

  // Seeding (any order of sorted accesses keeps the algorithm exact): the
  // top-k buckets of the most confident repetition usually hold the top-k
  // labels, which makes the k-th score, hence pruning, effective early.
  int seed = 0;
  for (int r = 1; r < R; ++r) {
    if (next[r] > next[seed]) seed = r;
  }
  // Near-uniform rows make the threshold algorithm visit every label about
  // R times; past 2 m label entries, brute force is cheaper (same output).
  const int64_t budget = brute_force_fallback
                             ? 2 * m
                             : std::numeric_limits<int64_t>::max();
  bool done = false;
  for (int t = 0; t < k && !done; ++t) {
    done = visit(seed) || below_threshold();
  }
  // Round robin over the repetitions (Fagin's threshold algorithm).
  while (!done) {
    for (int r = 0; r < R && !done; ++r) {
      done = visit(r) || below_threshold();
    }
    if (!done && label_visits > budget) {
      return MachTopKBruteForce(probs, hasher, m, k, scratch, top_ids,
                                top_scores);
    }
  }
  WriteOut(topk.Sorted(), top_ids, top_scores);
  return RowStatus::kOk;
}

}  // namespace mach


// ---------------------------------------------------------------------------
// CPU functor.
// ---------------------------------------------------------------------------

namespace functor {

namespace {

// Builds the inverted lists on the first call (once per kernel instance,
// i.e. per graph node or per eager attribute set), in parallel over the
// repetitions.  Later calls only read them.
absl::Status EnsureInvertedLists(
    const mach::MachTopKConfig& config, MachTopKCache<CpuDevice>* cache,
    const ::tensorflow::DeviceBase::CpuWorkerThreads* workers) {
  std::lock_guard<std::mutex> lock(cache->mu);
  if (cache->ready) return absl::OkStatus();
  const mach::MachHasher& hasher = config.hasher;
  const int64_t m = config.num_labels;
  const int64_t R = hasher.num_repetitions();
  try {
    cache->lists.Allocate(hasher, m);
  } catch (const std::bad_alloc&) {
    cache->lists = mach::MachInvertedLists();
    return errors::ResourceExhausted(
        "MachTopK: cannot allocate the inverted lists (4 * R * (m + B) = ",
        4 * R * (m + hasher.num_buckets()),
        " bytes); use method='brute_force' or fewer labels");
  }
  mach::MachInvertedLists* lists = &cache->lists;
  ::tensorflow::Shard(workers->num_threads, workers->workers, R, 30 * m,
                      [&](int64_t start, int64_t limit) {
                        for (int64_t r = start; r < limit; ++r) {
                          lists->BuildRepetition(hasher, static_cast<int>(r));
                        }
                      });
  cache->ready = true;
  return absl::OkStatus();
}

}  // namespace

template <>
void MachTopK<CpuDevice>::operator()(OpKernelContext* ctx,
                                     const mach::MachTopKConfig& config,
                                     MachTopKCache<CpuDevice>* cache,
                                     const float* p, int64_t batch,
                                     int32_t* ids, float* scores) const {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  if (config.threshold) {
    OP_REQUIRES_OK(ctx, EnsureInvertedLists(config, cache, workers));
  }
  const mach::MachHasher& hasher = config.hasher;
  const mach::MachInvertedLists& lists = cache->lists;
  const int k = config.k;
  const int64_t m = config.num_labels;
  const int64_t row =
      static_cast<int64_t>(hasher.num_repetitions()) * hasher.num_buckets();
  FirstBad bad_row;  // the smallest row with a NaN or an infinity
  auto work = [&](int64_t start, int64_t limit) {
    mach::MachScratch scratch;
    for (int64_t i = start; i < limit; ++i) {
      const mach::RowStatus status =
          config.threshold
              ? mach::MachTopKThreshold(p + i * row, hasher, lists, k,
                                        config.brute_force_fallback, &scratch,
                                        ids + i * k, scores + i * k)
              : mach::MachTopKBruteForce(p + i * row, hasher, m, k, &scratch,
                                         ids + i * k, scores + i * k);
      if (status != mach::RowStatus::kOk) bad_row.Record(i);
    }
  };
  // Rough cycles per query: heap building plus a few thousand label
  // scorings for the threshold algorithm; m R hashes for brute force.
  const int64_t cost = config.threshold
                           ? 20 * row + 100000
                           : 8 * m * hasher.num_repetitions();
  ::tensorflow::Shard(workers->num_threads, workers->workers, batch, cost,
                      work);
  OP_REQUIRES(ctx, !bad_row.found(),
              errors::InvalidArgument("probs[", bad_row.get(),
                                      "] contains a NaN or infinite value"));
}

}  // namespace functor

// ---------------------------------------------------------------------------
// TensorFlow kernel (one class, templated on the device).
// ---------------------------------------------------------------------------

namespace {

template <typename Device>
class MachTopKOp : public OpKernel {
 public:
  explicit MachTopKOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    int64_t k, num_buckets, prime;
    std::vector<int64_t> hash_a, hash_b;
    std::string method;
    OP_REQUIRES_OK(ctx, ctx->GetAttr("k", &k));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_labels", &config_.num_labels));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("num_buckets", &num_buckets));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hash_a", &hash_a));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("hash_b", &hash_b));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("prime", &prime));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("method", &method));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("brute_force_fallback",
                                     &config_.brute_force_fallback));
    const int64_t m = config_.num_labels;
    const std::string err =
        mach::ValidateHashParams(hash_a, hash_b, prime, m, num_buckets);
    OP_REQUIRES(ctx, err.empty(), errors::InvalidArgument(err));
    OP_REQUIRES(ctx, k >= 1 && k <= m,
                errors::InvalidArgument("k must be in [1, num_labels=", m,
                                        "], got ", k));
    OP_REQUIRES(ctx, method == "threshold" || method == "brute_force",
                errors::InvalidArgument(
                    "method must be 'threshold' or 'brute_force', got '",
                    method, "'"));
    config_.k = static_cast<int>(k);
    config_.threshold = method == "threshold";
    config_.hasher = mach::MachHasher(std::move(hash_a), std::move(hash_b),
                                      prime, num_buckets);
  }

  void Compute(OpKernelContext* ctx) override {
    const Tensor& probs = ctx->input(0);
    const int64_t R = config_.hasher.num_repetitions();
    const int64_t B = config_.hasher.num_buckets();
    OP_REQUIRES_OK(ctx, CheckRank(probs, 3, "probs", "[batch, R, B]"));
    OP_REQUIRES(ctx, probs.dim_size(1) == R,
                errors::InvalidArgument(
                    "probs.shape[1] must equal the number of repetitions R=",
                    R, " (len(hash_a)), got shape ",
                    probs.shape().DebugString()));
    OP_REQUIRES(ctx, probs.dim_size(2) == B,
                errors::InvalidArgument(
                    "probs.shape[2] must equal num_buckets=", B,
                    ", got shape ", probs.shape().DebugString()));
    const int64_t batch = probs.dim_size(0);
    const int64_t k = config_.k;
    Tensor* top_ids = nullptr;
    Tensor* top_scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({batch, k}),
                                             &top_ids));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, k}),
                                             &top_scores));
    if (batch == 0) return;
    functor::MachTopK<Device>()(ctx, config_, &cache_,
                                probs.flat<float>().data(), batch,
                                top_ids->flat<int32_t>().data(),
                                top_scores->flat<float>().data());
  }

 private:
  mach::MachTopKConfig config_;
  functor::MachTopKCache<Device> cache_;
};

}  // namespace

// CPU only: a GPU decoder is a functor::MachTopK<GpuDevice> (and its cache)
// plus a DEVICE_GPU registration of MachTopKOp<GpuDevice>.
REGISTER_KERNEL_BUILDER(Name("Xmc>MachTopK").Device(DEVICE_CPU),
                        MachTopKOp<CpuDevice>);

}  // namespace xmc_tf
