// The dense scratch of the kernels that sum, per query instance, products
// over an inverted index: a CSR [D, n] (indptr [D + 1], targets [E],
// weights [E]) whose row f lists the targets (tree columns, stored
// instances) a feature f reaches.  One query's entries add
// value * weight into acc[target]; the targets touched are remembered, so
// resetting costs what the query touched, not n.  The index is
// range-checked where it is read.  Framework-free (no TensorFlow
// includes): used by the label-tree and neighbours kernel headers.
#ifndef XMC_TF_OPS_COMMON_SPARSE_ACCUMULATOR_H_
#define XMC_TF_OPS_COMMON_SPARSE_ACCUMULATOR_H_

#include <cstdint>
#include <vector>

namespace xmc_tf {

// An inverted index, as the accumulator reads it.
struct InvertedIndex {
  int64_t num_rows = 0;     // D: the features
  int64_t num_targets = 0;  // n
  int64_t num_entries = 0;  // E
  const int64_t* indptr = nullptr;   // [D + 1]
  const int32_t* targets = nullptr;  // [E]
  const float* weights = nullptr;    // [E]
};

// A fault met while reading the index.
struct IndexFault {
  enum Kind { kNone = 0, kIndptr, kTarget };
  Kind kind = kNone;
  int64_t position = 0;  // kIndptr: the feature; kTarget: the entry
  int64_t value = 0;     // kTarget: the target read
};

class SparseAccumulator {
 public:
  explicit SparseAccumulator(int64_t num_targets)
      : acc_(static_cast<size_t>(num_targets), 0.0f) {}

  // Adds the entries (feats[order[j]], vals[order[j]]), j in [begin, end)
  // (feature ids already checked to be in [0, D)).  False on a fault.
  bool Accumulate(const InvertedIndex& index, const int64_t* feats,
                  const float* vals, const int64_t* order, int64_t begin,
                  int64_t end, IndexFault* fault) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t e = order[j];
      const int64_t f = feats[e];
      const int64_t lo = index.indptr[f], hi = index.indptr[f + 1];
      if (lo < 0 || hi < lo || hi > index.num_entries) {
        *fault = {IndexFault::kIndptr, f, 0};
        return false;
      }
      const float v = vals[e];
      for (int64_t p = lo; p < hi; ++p) {
        const int32_t t = index.targets[p];
        if (t < 0 || t >= index.num_targets) {
          *fault = {IndexFault::kTarget, p, t};
          return false;
        }
        if (acc_[t] == 0.0f) touched_.push_back(t);
        acc_[t] += v * index.weights[p];
      }
    }
    return true;
  }

  float value(int64_t t) const { return acc_[t]; }
  // The targets touched since the last reset (repeats possible: a sum
  // that returned to 0 is listed again).
  const std::vector<int32_t>& touched() const { return touched_; }
  void Zero(int32_t t) { acc_[t] = 0.0f; }

  // Zeroes what the last query touched.
  void Reset() {
    for (const int32_t t : touched_) acc_[t] = 0.0f;
    touched_.clear();
  }

 private:
  std::vector<float> acc_;
  std::vector<int32_t> touched_;
};

}  // namespace xmc_tf

#endif  // XMC_TF_OPS_COMMON_SPARSE_ACCUMULATOR_H_
