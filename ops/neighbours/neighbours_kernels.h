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

#include "ops/common/sparse_accumulator.h"

namespace xmc_tf {
namespace neighbours {

// The inverted index of the stored instances (features -> instances) is an
// InvertedIndex (ops/common/sparse_accumulator.h); its faults IndexFault.

// (similarity, instance), best first: larger, then the lower id.
using Scored = std::pair<float, int32_t>;
inline bool Better(const Scored& a, const Scored& b) {
  return a.first > b.first || (a.first == b.first && a.second < b.second);
}

// One thread's similarities of one query at a time (a SparseAccumulator
// over the inverted index).
class Similarities : public SparseAccumulator {
 public:
  using SparseAccumulator::SparseAccumulator;

  // The k best positive similarities into *best (best first); resets the
  // scratch.  A NaN similarity is not positive: it is dropped.
  void TakeBest(int64_t k, std::vector<Scored>* best) {
    best->clear();
    for (const int32_t t : touched()) {
      const float s = value(t);
      if (s > 0.0f) best->emplace_back(s, t);
      Zero(t);  // a repeated touch then finds 0 and is skipped
    }
    Reset();
    if (static_cast<int64_t>(best->size()) > k) {
      std::nth_element(best->begin(), best->begin() + k, best->end(), Better);
      best->resize(k);
    }
    std::sort(best->begin(), best->end(), Better);
  }
};

}  // namespace neighbours
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_NEIGHBOURS_NEIGHBOURS_KERNELS_H_
