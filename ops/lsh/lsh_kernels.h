// Framework-free functors of the LSH negative-sampling op family.
//
// Source: "A Truly Constant-Time Distribution-Aware Negative Sampling"
// (LNS), Sec. 1.2-2.3 and Algorithm 1: L hash tables, each keyed by a
// meta-hash of K concatenated LSH functions over the label vectors; a query
// (the instance embedding, "LSH-embedding", or its positive labels' vectors,
// "LSH-label") probes one bucket per table and the union of the probed
// buckets are the negatives, so label j is retrieved with probability
// 1 - (1 - alpha_j^K)^L (Sec. 1.3), alpha_j being the per-function collision
// probability (SimHash: 1 - theta/pi, Appendix A.2).  Hash functions:
// SimHash / signed random projections (Charikar 2002; Appendix A.2) and
// densified winner-take-all, DWTA (Chen & Shrivastava, UAI 2018;
// Appendix A.3).
//
// Layouts (row-major, int32 ids):
//   codes        [n, L]      bucket of every vector in every table.
//   offsets      [L, B + 1]  CSR: the labels of bucket c of table l are
//   labels       [L, m]      labels[l, offsets[l, c] .. offsets[l, c + 1]),
//                            in increasing label order (canonical, so an
//                            incremental update equals a full rebuild).
//
// Meta-hash of table l: the K hash values h[l K + k] (k = 0 .. K-1) of
// `bits_per_hash` bits each are concatenated, the first function in the
// lowest bits.  When those K * bits_per_hash bits exceed `bucket_bits`, the
// raw code is folded to `bucket_bits` bits by a 64-bit mixing hash salted
// with the table index (a spurious collision then adds probability
// 2^-bucket_bits per table).  B = 2^min(K * bits_per_hash, bucket_bits).
//
// This header must not include TensorFlow (the device functors at its end
// only name the OpKernelContext, forward-declared in ops/common/device.h).
#ifndef XMC_TF_OPS_LSH_LSH_KERNELS_H_
#define XMC_TF_OPS_LSH_LSH_KERNELS_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/common/cpu_isa.h"
#include "ops/common/device.h"

namespace xmc_tf {
namespace lsh {

// The splitmix64 finaliser (Steele, Lea & Flood 2014): a bijective 64-bit
// mixing function, the basis of every seeded choice in this family.
inline uint64_t Mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

// Counter-based generator: a stream of Mix64 values keyed by a 64-bit state.
struct SplitMix {
  uint64_t state;
  uint64_t Next() {
    state += 0x9E3779B97F4A7C15ULL;
    return Mix64(state);
  }
  // Uniform integer in [0, n) (multiply-shift; bias below n / 2^64).
  uint64_t Uniform(uint64_t n) {
    return static_cast<uint64_t>(
        (static_cast<unsigned __int128>(Next()) * n) >> 64);
  }
};

// How the K hash values of a table become a bucket id.
struct CodeLayout {
  int num_bits = 1;       // K: hash functions per table.
  int bits_per_hash = 1;  // 1 for SimHash, log2(bin_size) for DWTA.
  int bucket_bits = 16;   // cap on the bits of a bucket id.
  int64_t num_tables = 1; // L.

  int64_t num_hashes() const { return num_bits * num_tables; }  // H = K L
  int code_bits() const { return num_bits * bits_per_hash; }
  int out_bits() const {
    return code_bits() < bucket_bits ? code_bits() : bucket_bits;
  }
  int64_t num_buckets() const { return int64_t{1} << out_bits(); }
  bool folded() const { return code_bits() > bucket_bits; }

  // Bucket id in [0, num_buckets()) of the raw code of table `table`.
  int32_t Bucket(uint64_t raw, int64_t table) const {
    if (!folded()) return static_cast<int32_t>(raw);
    const uint64_t salt = Mix64(static_cast<uint64_t>(table) + 1);
    return static_cast<int32_t>(Mix64(raw ^ salt) >> (64 - bucket_bits));
  }
};

// "" when valid, else an error message.  1 <= K, K * bits_per_hash <= 64,
// 1 <= bucket_bits <= 24, 1 <= bits_per_hash <= 8, num_hashes = K * L
// (num_hashes % K == 0, L >= 1).
std::string ValidateLayout(int64_t num_bits, int64_t bits_per_hash,
                           int64_t bucket_bits, int64_t num_hashes);

// Limits of the attributes that size outputs or scratch memory (checked by
// the kernels, and by the shape functions where a shape depends on them).
// Sparse coordinates are int32 ids, so num_features <= 2^31 - 1; bucket ids
// of the hashing ops have at most 24 bits, so num_buckets <= 2^24 (offsets
// [L, B + 1] stay addressable and B + 1 cannot overflow).
constexpr int64_t kMaxNumFeatures = 2147483647;  // 2^31 - 1
constexpr int64_t kMaxNumBuckets = int64_t{1} << 24;

// A sparse vector's non-zero entries, sorted by index, duplicates summed (in
// their input order, in T: float for the hashing ops, whose densified vector
// is float32, double for the cosines) and exact zeros dropped: the entries
// of its densified vector.  Returns the index of the first out-of-range
// entry, or -1.
template <typename T>
int64_t CanonicalSparse(const int32_t* indices, const float* weights,
                        int64_t s, int64_t num_features,
                        std::vector<std::pair<int32_t, T>>* out);

// ----- SimHash (signed random projections) ---------------------------------

// acc[j] = sum_i x[i] * proj[i, j] over the non-zero x[i] in increasing i
// (one fixed summation order, so the sparse and dense paths agree bit for
// bit under one instruction set `isa`: cpu::CpuIsa() of
// ops/common/cpu_isa.h, read once per kernel call); then bit j =
// (acc[j] > 0) and table l's raw code is sum_k bit[l K + k] << k.  proj is
// [d, H] with H = K L; acc has H floats.
void SimHashDense(const float* x, int64_t d, const float* proj, int64_t H,
                  const CodeLayout& layout, float* acc, int32_t* codes,
                  cpu::Isa isa);
// The same for a canonical sparse vector (see CanonicalSparse).
void SimHashSparse(const std::vector<std::pair<int32_t, float>>& entries,
                   const float* proj, int64_t H, const CodeLayout& layout,
                   float* acc, int32_t* codes, cpu::Isa isa);

// ----- DWTA (densified winner-take-all) -------------------------------------

// H bins of w coordinates each (bins[j, p] in [0, d)).  The hash value of
// bin j is the position p in [0, w) of the largest *non-zero* coordinate
// x[bins[j, p]] (ties: the lowest p).  A bin without a non-zero coordinate
// is empty and borrows the value of another bin (densification, Chen &
// Shrivastava 2018): bin c_t = Mix64(Mix64(seed) + j * 2^32 + t) mod H for
// t = 1, 2, ... 32, then j + 1, j + 2, ... (mod H); the first non-empty one
// is taken.  An all-zero vector hashes to 0 everywhere.
//
// HashSparse needs the inverse map coordinate -> (bin, position); it is built
// only when `sparse` is true, over the coordinates the bins hold (its memory
// is O(H w + max bins[j, p]) when the bins cover their coordinate range
// densely, else O(H w) with a binary search per sparse entry), never over
// all of input_dim.
class DwtaHasher {
 public:
  DwtaHasher(const int32_t* bins, int64_t num_hashes, int bin_size,
             int64_t input_dim, uint64_t seed, bool sparse);
  int64_t num_hashes() const { return H_; }
  // Scratch (per thread): best value and position per bin.
  struct Scratch {
    std::vector<float> best;
    std::vector<int16_t> pos;
    std::vector<int16_t> value;
  };
  void HashDense(const float* x, const CodeLayout& layout, Scratch* scratch,
                 int32_t* codes) const;
  void HashSparse(const std::vector<std::pair<int32_t, float>>& entries,
                  const CodeLayout& layout, Scratch* scratch,
                  int32_t* codes) const;

 private:
  void Finish(const CodeLayout& layout, Scratch* scratch,
              int32_t* codes) const;
  const int32_t* bins_;
  int64_t H_;
  int w_;
  int64_t d_;
  uint64_t seed_mix_;
  // Inverse map coordinate -> (bin, position), CSR over "slots": slot =
  // coordinate (dense map, coords_ empty, coordinates >= dense_size_ are in
  // no bin) or the rank of the coordinate in coords_ (compact map).
  int64_t dense_size_ = 0;
  std::vector<int32_t> coords_;       // compact map: sorted distinct coords
  std::vector<int64_t> inv_offsets_;  // [slots + 1]
  std::vector<int32_t> inv_bin_;
  std::vector<int16_t> inv_pos_;
};

// ----- Tables -----------------------------------------------------------------

// CSR buckets of table `table` from codes [m, L] (all in [0, B)), by counting
// sort: offsets [B + 1], labels [m] in increasing label order per bucket.
void BuildTable(const int32_t* codes, int64_t m, int64_t L, int64_t table,
                int64_t B, int32_t* offsets, int32_t* labels);

// A label that changes bucket in one table.
struct Move {
  int32_t label;
  int32_t from;
  int32_t to;
};

// The CSR of one table after `moves` (labels distinct, from != to), written
// to new_offsets [B + 1] / new_labels [m]: equal to BuildTable on the
// updated codes when the old table was canonical.  O(B + m) time (block
// copies between the touched buckets) plus O(r log r) for r moves.  Returns
// false (output unusable) when a moved label is not in its `from` bucket.
bool UpdateTable(const int32_t* old_offsets, const int32_t* old_labels,
                 int64_t m, int64_t B, std::vector<Move>* moves,
                 int32_t* new_offsets, int32_t* new_labels);

// Checks that labels [m] (one table) is a permutation of [0, m): returns the
// position of the first entry out of range or repeating an earlier one, or
// -1.  `seen` is scratch (resized to m / 64 + 1 words).  O(m).
int64_t FirstNonPermutation(const int32_t* labels, int64_t m,
                            std::vector<uint64_t>* seen);

// ----- Query ------------------------------------------------------------------

struct Tables {
  const int32_t* offsets;  // [L, B + 1]
  const int32_t* labels;   // [L, m]
  const int32_t* codes;    // [m, L]
  int64_t m, L, B;
};

struct QueryScratch {
  std::vector<int64_t> probe_start;  // start of each probed bucket in labels
  std::vector<int64_t> probe_end;    // cumulative sizes
  std::vector<int64_t> positions;
  std::vector<int64_t> set;
  std::vector<int32_t> label_set;
  std::vector<int32_t> found;
};

enum class QueryStatus {
  kOk = 0,
  kBadQueryCode = 1,
  kCorruptTables = 2,
  kBadCode = 3,  // a code of a candidate (codes[id, l], read for the
                 // collision counts) is not in [0, B)
};

// Candidates of one instance (see the op documentation of Xmc>LshQuery).
// query_codes [q, L]: entry -1 = no probe.  Writes k ids (valid first, then
// padding id 0), valid flags, collision counts (when count_collisions, else
// 0), the sampling rate r = min(1, k / T) and T (entries in the probed
// buckets).  Validates what it reads: the query codes, the offsets of the
// probed buckets, the labels read and (with count_collisions) the codes rows
// of the candidates.
QueryStatus QueryRow(const Tables& t, const int32_t* query_codes, int64_t q,
                     int k, uint64_t row_key, bool count_collisions,
                     QueryScratch* scratch, int32_t* ids, bool* valid,
                     int32_t* collisions, float* rate, int64_t* probed);

// The stateless per-row key of the draws: Mix64 chain of (seed, step, row).
inline uint64_t RowKey(int64_t seed, int64_t step, int64_t row) {
  uint64_t s = Mix64(static_cast<uint64_t>(seed) ^ 0x4C53484E53ULL);
  s = Mix64(s ^ static_cast<uint64_t>(step));
  return Mix64(s ^ static_cast<uint64_t>(row));
}

// The attributes of one Xmc>LshQuery kernel instance.
struct QueryConfig {
  int k = 1;                     // num_candidates, in [1, 2^24]
  int64_t seed = 0;
  bool count_collisions = true;
};

// The outputs of Xmc>LshQuery for a batch of b instances.
struct QueryOutputs {
  int32_t* ids;         // [b, k]
  bool* valid;          // [b, k]
  int32_t* collisions;  // [b, k]
  float* rate;          // [b]
  int64_t* probed;      // [b]
};

// Sizes of the two batches of sparse rows of Xmc>LshSparseCosine:
// a [batch, k, sa], b [batch, n, sb].
struct CosineDims {
  int64_t batch = 0, k = 0, sa = 0, n = 0, sb = 0;
};

}  // namespace lsh

// ---------------------------------------------------------------------------
// The functors of the op kernels (ops/common/device.h): one OpKernel class
// per op, templated on the device, checks the attributes, ranks and shapes
// (everything that does not read tensor data) and allocates the outputs,
// then calls functor::X<Device>.  The functor checks what it reads (ids,
// codes, finiteness: in the same pass as the work where the two are
// interleaved) and fails `ctx` with InvalidArgument naming the first bad
// entry (the smallest bad row where rows are checked in parallel).  CPU
// functors: lsh_hash_kernels.cc, lsh_table_kernels.cc and
// lsh_sample_kernels.cc, on TensorFlow's intra-op pool; the kernels are
// registered for DEVICE_CPU only (a GPU functor plus a DEVICE_GPU
// registration adds a device).  Shapes are row-major; `layout` gives
// H = num_bits * num_tables hash functions and L = num_tables.

namespace functor {

// codes [n, L] of dense vectors [n, d] under SimHash with projection
// [d, H]; checks that projection and every vector are finite.
template <typename Device>
struct LshSimHash {
  void operator()(::tensorflow::OpKernelContext* ctx, const float* vectors,
                  int64_t n, int64_t d, const float* projection,
                  const lsh::CodeLayout& layout, int32_t* codes) const;
};

// codes [n, L] of sparse rows indices / weights [n, s] (coordinates in
// [0, e), e = projection rows) under SimHash with projection [e, H]; checks
// projection, the coordinates, the weights' and their sums' finiteness.
template <typename Device>
struct LshSimHashSparse {
  void operator()(::tensorflow::OpKernelContext* ctx, const int32_t* indices,
                  const float* weights, int64_t n, int64_t s,
                  const float* projection, int64_t e,
                  const lsh::CodeLayout& layout, int32_t* codes) const;
};

// codes [n, L] of dense vectors [n, d] under DWTA with bins [H, w] (each in
// [0, d), checked); checks that every vector is finite.
template <typename Device>
struct LshDwtaHash {
  void operator()(::tensorflow::OpKernelContext* ctx, const float* vectors,
                  int64_t n, int64_t d, const int32_t* bins, int bin_size,
                  uint64_t seed, const lsh::CodeLayout& layout,
                  int32_t* codes) const;
};

// codes [n, L] of sparse rows indices / weights [n, s] (coordinates in
// [0, num_features)) under DWTA with bins [H, w] (each in
// [0, num_features), checked).
template <typename Device>
struct LshDwtaHashSparse {
  void operator()(::tensorflow::OpKernelContext* ctx, const int32_t* indices,
                  const float* weights, int64_t n, int64_t s,
                  const int32_t* bins, int bin_size, int64_t num_features,
                  uint64_t seed, const lsh::CodeLayout& layout,
                  int32_t* codes) const;
};

// offsets [L, B + 1] and labels [L, m] of the L tables of codes [m, L]
// (each checked to be in [0, B)).
template <typename Device>
struct LshBuildTables {
  void operator()(::tensorflow::OpKernelContext* ctx, const int32_t* codes,
                  int64_t m, int64_t L, int64_t B, int32_t* offsets,
                  int32_t* labels) const;
};

// The tables `t` after labels rows [r] move to buckets row_codes [r, L]:
// new_offsets [L, B + 1], new_labels [L, m], new_codes [m, L].  new_codes
// may be t.codes itself (an input buffer forwarded to the output): it is
// written only after every check passed and every table was updated.
template <typename Device>
struct LshUpdateTables {
  void operator()(::tensorflow::OpKernelContext* ctx, const lsh::Tables& t,
                  const int32_t* rows, const int32_t* row_codes, int64_t r,
                  int32_t* new_offsets, int32_t* new_labels,
                  int32_t* new_codes) const;
};

// Candidates of a batch of b instances with query_codes [b, q, L] (draws
// keyed by config.seed and `step`).
template <typename Device>
struct LshQuery {
  void operator()(::tensorflow::OpKernelContext* ctx, const lsh::Tables& t,
                  const int32_t* query_codes, int64_t b, int64_t q,
                  const lsh::QueryConfig& config, int64_t step,
                  const lsh::QueryOutputs& out) const;
};

// cosines [batch, k, n] between the rows of a and of b (coordinates in
// [0, num_features), weights finite), all sizes >= 1.
template <typename Device>
struct LshSparseCosine {
  void operator()(::tensorflow::OpKernelContext* ctx,
                  const int32_t* a_indices, const float* a_weights,
                  const int32_t* b_indices, const float* b_weights,
                  const lsh::CosineDims& dims, int64_t num_features,
                  float* cosines) const;
};

}  // namespace functor
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_LSH_LSH_KERNELS_H_
