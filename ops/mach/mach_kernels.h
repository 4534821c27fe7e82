// Framework-free functors of the MACH op family (Medini et al., "Extreme
// Classification in Log Memory using Count-Min Sketch: A Case Study of Amazon
// Search with 50M Products", NeurIPS 2019).
//
// Layout (see the op documentation in mach_ops.cc):
//   probs      [batch, R, B]   float, row-major: meta-class probabilities of
//                              R independent B-way meta-classifiers.
//   top_ids    [batch, k]      int32, best first.
//   top_scores [batch, k]      float, best first.
//
// Label j lands in bucket h_r(j) = ((a_r * j + b_r) mod p) mod B of
// repetition r (2-universal hashing, paper Sec. 2), computed in 64-bit
// integers: with p <= 2^31 - 1 and 0 <= a_r, j < p the product stays below
// 2^62.  The decoded score is the paper's estimator (Sec. 3, Eq. 2 up to its
// monotone affine map):
//   score(i, j) = (sum_{r=0}^{R-1} probs[i, r, h_r(j)]) / R,
// summed in float in the order r = 0, 1, ..., R-1 in every code path, so the
// exact and the fast decoder return bit-identical scores.  Ties are broken by
// the lower label id.  Inputs must be finite (both decoders return
// RowStatus::kNonFinite otherwise); a score may still overflow to +-inf
// (|probs| near FLT_MAX) and then ranks as that float does.  NaN scores are
// impossible: a float sum of finite values saturates at +-inf.
//
// This header must not include TensorFlow: the functors can be tested and
// reused without it (the device functor below only names the
// OpKernelContext, forward-declared in ops/common/device.h).
#ifndef XMC_TF_OPS_MACH_MACH_KERNELS_H_
#define XMC_TF_OPS_MACH_MACH_KERNELS_H_

#include <cstdint>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/device.h"

namespace xmc_tf {
namespace mach {

// The Mersenne prime 2^31 - 1: the default modulus of the hash family.
constexpr int64_t kMersenne31 = 2147483647LL;

// True when `p` is prime (trial division; p <= 2^31 - 1 takes < 1 ms).
bool IsPrime(int64_t p);

// Checks a hash family; returns "" when valid, else an error message.
// Requirements: 2 <= prime <= 2^31 - 1 and prime is prime; 1 <= num_labels <=
// prime; 1 <= num_buckets <= prime; hash_a.size() == hash_b.size() >= 1;
// 1 <= a_r < prime; 0 <= b_r < prime.
std::string ValidateHashParams(const std::vector<int64_t>& hash_a,
                               const std::vector<int64_t>& hash_b,
                               int64_t prime, int64_t num_labels,
                               int64_t num_buckets);

// The R hash functions h_r(j) = ((a_r j + b_r) mod p) mod B.
class MachHasher {
 public:
  MachHasher(std::vector<int64_t> hash_a, std::vector<int64_t> hash_b,
             int64_t prime, int64_t num_buckets);
  // No repetition (a placeholder until a valid family is assigned).
  MachHasher() : MachHasher({}, {}, kMersenne31, 1) {}

  int num_repetitions() const { return static_cast<int>(a_.size()); }
  int64_t num_buckets() const { return num_buckets_; }

  // Bucket of `label` (0 <= label < prime) in repetition `r`.
  inline int32_t Bucket(int r, int64_t label) const {
    uint64_t x = static_cast<uint64_t>(a_[r]) * static_cast<uint64_t>(label) +
                 static_cast<uint64_t>(b_[r]);
    if (mersenne_) {
      // x < 2^62 + 2^31; two folds bring it below 2^32, one subtraction < p.
      x = (x & kMersenne31) + (x >> 31);
      x = (x & kMersenne31) + (x >> 31);
      if (x >= static_cast<uint64_t>(kMersenne31)) x -= kMersenne31;
    } else {
      x %= static_cast<uint64_t>(prime_);
    }
    return static_cast<int32_t>(pow2_ ? (x & bucket_mask_)
                                      : (x % static_cast<uint64_t>(
                                                 num_buckets_)));
  }

 private:
  std::vector<int64_t> a_, b_;
  int64_t prime_;
  int64_t num_buckets_;
  bool mersenne_;
  bool pow2_;
  uint64_t bucket_mask_;
};

// Per-repetition inverted lists bucket -> labels in CSR layout: the labels of
// bucket c of repetition r are labels[r * m + offsets[r * (B + 1) + c] ...
// r * m + offsets[r * (B + 1) + c + 1]), in increasing label order.
struct MachInvertedLists {
  int num_repetitions = 0;
  int64_t num_buckets = 0;
  int64_t num_labels = 0;
  std::vector<int32_t> offsets;  // [R, B + 1]
  std::vector<int32_t> labels;   // [R, m]

  // Builds the lists by counting sort (O(R (m + B)) time, 4 R (m + B) bytes).
  void Build(const MachHasher& hasher, int64_t num_labels);
  // The same in two steps, so that repetitions can be built in parallel:
  // Allocate once, then BuildRepetition(r) for every r (thread-safe for
  // distinct r).
  void Allocate(const MachHasher& hasher, int64_t num_labels);
  void BuildRepetition(const MachHasher& hasher, int r);
};

// One (score, label) candidate of a top-k list.
struct ScoredLabel {
  float score;
  int32_t label;
};

// Bounded top-k of (score desc, label asc); `Sorted()` returns best first.
class TopK {
 public:
  explicit TopK(int k) : k_(k) { heap_.reserve(k); }
  void Clear() { heap_.clear(); }
  bool full() const { return static_cast<int>(heap_.size()) == k_; }
  // The worst kept candidate; only valid when non-empty.
  const ScoredLabel& worst() const { return heap_.front(); }
  void Push(float score, int32_t label);
  // Sorts in place (best first) and returns the candidates; call once.
  const std::vector<ScoredLabel>& Sorted();

 private:
  int k_;
  std::vector<ScoredLabel> heap_;
};

// Reusable per-thread scratch space of the decoders.
struct MachScratch {
  std::vector<float> chunk;                         // brute force
  std::vector<std::pair<float, int32_t>> candidates;  // [R, T] top buckets
  std::vector<std::pair<float, int32_t>> buckets;     // [R, B] heaps
  std::vector<uint8_t> visited;                     // [R, B]
  std::vector<float> next;                          // [R]
  std::vector<float> values;                        // [R]
  std::vector<int32_t> label_buckets;               // [R]
};

// Result of checking one row of probabilities.
enum class RowStatus { kOk = 0, kNonFinite = 1 };

// Exact top-k of one query by scoring every label (the reference): labels
// are scored in chunks with a running top-k; O(m R) time, O(chunk) memory.
// `probs` is the query's [R, B] block; writes k ids and scores, best first.
RowStatus MachTopKBruteForce(const float* probs, const MachHasher& hasher,
                             int64_t num_labels, int k, MachScratch* scratch,
                             int32_t* top_ids, float* top_scores);

// Exact top-k of one query by the threshold algorithm (Fagin, Lotem & Naor,
// "Optimal aggregation algorithms for middleware", PODS 2001) over the R
// bucket-sorted inverted lists: buckets of every repetition are visited in
// decreasing probability order (the top k buckets of the most confident
// repetition first, then round robin); each newly seen label is scored
// exactly by R random accesses; the scan stops once the threshold
// (sum_r next unvisited bucket probability of r) / R falls strictly below the
// k-th best score.  Labels that cannot reach the current k-th score are
// pruned after a few random accesses with a partial upper bound.  With
// `brute_force_fallback`, small label sets (m <= 16 B) are decoded by
// MachTopKBruteForce directly, and a row whose scan exceeds 2 m label visits
// (near-uniform probabilities) is finished by it.  Same output as
// MachTopKBruteForce, bit for bit.
RowStatus MachTopKThreshold(const float* probs, const MachHasher& hasher,
                            const MachInvertedLists& lists, int k,
                            bool brute_force_fallback, MachScratch* scratch,
                            int32_t* top_ids, float* top_scores);

// The attributes of one Xmc>MachTopK kernel instance, checked when it is
// constructed (ValidateHashParams, 1 <= k <= num_labels).
struct MachTopKConfig {
  int k = 1;
  int64_t num_labels = 0;
  bool threshold = true;             // method == "threshold"
  bool brute_force_fallback = true;  // see MachTopKThreshold
  MachHasher hasher;                 // R = hasher.num_repetitions(), B
};

}  // namespace mach

// ---------------------------------------------------------------------------
// The functor of the op kernel (ops/common/device.h): one OpKernel class
// templated on the device reads the attributes (MachTopKConfig), checks the
// shape of probs [batch, R, B] and allocates top_ids / top_scores [batch, k],
// then calls functor::MachTopK<Device>.  The functor decodes every row and
// fails `ctx` with InvalidArgument "probs[i] contains a NaN or infinite
// value" naming the smallest such row i.  What a device's decoder builds on
// its first call and reuses on the later ones of the same kernel instance
// (one per graph node or eager attribute set) lives in a
// functor::MachTopKCache<Device> that the kernel owns; the functor fills it
// (thread-safely: TensorFlow may run one kernel instance concurrently).
// CpuDevice: mach_kernels.cc, TensorFlow's intra-op pool; its cache holds
// the inverted lists of the threshold decoder.

namespace functor {

// Per-kernel-instance state of a device's decoder (specialised per device).
template <typename Device>
struct MachTopKCache;

// The CPU decoder's: the inverted lists, built on the first call that
// decodes with method='threshold' (in parallel over the repetitions).
template <>
struct MachTopKCache<CpuDevice> {
  std::mutex mu;
  bool ready = false;  // guarded by mu; `lists` is final once set
  mach::MachInvertedLists lists;
};

// top_ids / top_scores [batch, k] (fully written, best first) from probs
// [batch, R, B] (R, B, k of `config`), batch >= 1.
template <typename Device>
struct MachTopK {
  void operator()(::tensorflow::OpKernelContext* ctx,
                  const mach::MachTopKConfig& config,
                  MachTopKCache<Device>* cache, const float* probs,
                  int64_t batch, int32_t* top_ids, float* top_scores) const;
};

}  // namespace functor
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_MACH_MACH_KERNELS_H_
