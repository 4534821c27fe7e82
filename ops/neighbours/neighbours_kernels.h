// Shared header of the neighbours op family: the per-instance work of
// Xmc>NearestNeighbours (neighbours_ops.cc documents the op).
//
// The training instances are stored as an inverted index, feature-major
// CSR [D, n] (indptr [D + 1], instances [E], values [E]), so a query
// reads only the postings of its own features: Similarities accumulates
// the dot products into a dense [n] scratch (only the instances touched
// are reset afterwards) and keeps the k largest positive ones (ties: the
// lower instance id).
//
// Framework-free (no TensorFlow includes); faults come back as
// {kind, position, value} for the kernel's InvalidArgument message.
#ifndef XMC_TF_OPS_NEIGHBOURS_NEIGHBOURS_KERNELS_H_
#define XMC_TF_OPS_NEIGHBOURS_NEIGHBOURS_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

namespace xmc_tf {
namespace neighbours {

// The inverted index of the stored instances.
struct Index {
  int64_t num_features = 0;   // D
  int64_t num_instances = 0;  // n
  int64_t num_entries = 0;    // E
  const int64_t* indptr = nullptr;     // [D + 1]
  const int32_t* instances = nullptr;  // [E]
  const float* values = nullptr;       // [E]
};

struct Fault {
  enum Kind { kNone = 0, kIndptr, kInstance };
  Kind kind = kNone;
  int64_t position = 0;
  int64_t value = 0;
};

// (similarity, instance), best first: larger, then the lower id.
using Scored = std::pair<float, int32_t>;
inline bool Better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// One thread's similarities of one query at a time.
class Similarities {
 public:
  explicit Similarities(int64_t num_instances)
      : acc_(static_cast<size_t>(num_instances), 0.0f) {}

  bool Accumulate(const Index& index, const int64_t* feats, const float* vals,
                  const int64_t* order, int64_t begin, int64_t end,
                  Fault* fault) {
    for (int64_t j = begin; j < end; ++j) {
      const int64_t e = order[j];
      const int64_t f = feats[e];
      const int64_t lo = index.indptr[f], hi = index.indptr[f + 1];
      if (lo < 0 || hi < lo || hi > index.num_entries) {
        *fault = {Fault::kIndptr, f, 0};
        return false;
      }
      const float v = vals[e];
      for (int64_t p = lo; p < hi; ++p) {
        const int32_t t = index.instances[p];
        if (t < 0 || t >= index.num_instances) {
          *fault = {Fault::kInstance, p, t};
          return false;
        }
        if (acc_[t] == 0.0f) touched_.push_back(t);
        acc_[t] += v * index.values[p];
      }
    }
    return true;
  }

  // The k best positive similarities into *best (best first); resets the
  // scratch.  A NaN similarity is not positive: it is dropped.
  void TakeBest(int64_t k, std::vector<Scored>* best) {
    best->clear();
    for (const int32_t t : touched_) {
      const float s = acc_[t];
      if (s > 0.0f) best->emplace_back(s, t);
      acc_[t] = 0.0f;  // a repeated touch then finds 0 and is skipped
    }
    touched_.clear();
    if (static_cast<int64_t>(best->size()) > k) {
      std::nth_element(best->begin(), best->begin() + k, best->end(), Better);
      best->resize(k);
    }
    std::sort(best->begin(), best->end(), Better);
  }

 private:
  std::vector<float> acc_;
  std::vector<int32_t> touched_;
};

}  // namespace neighbours
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_NEIGHBOURS_NEIGHBOURS_KERNELS_H_
