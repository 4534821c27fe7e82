// Shared header of the label-tree op family: the per-instance work of
// Xmc>LabelTreeBeamSearch and Xmc>LabelTreePathScores (label_tree_ops.cc
// documents both ops).
//
// A label tree (Parabel, Prabhu et al. WWW 2018, Sec. 3) is a set of C
// linear classifiers ("columns"): the children of every internal node and
// every label of every leaf.  Its weights are stored feature-major, a CSR
// matrix [D, C] (indptr [D + 1], columns [W], values [W]) plus a bias [C],
// so an instance's column scores cost the summed row lengths of its own
// features: ColumnScores accumulates them into a dense [C] scratch
// (ops/common/sparse_accumulator.h: only the columns touched are reset
// afterwards) and gives each column's log-score
// -max(0, 1 - (x . w_c + b_c))^2.
//
// The topology: node 0 is the root, node n >= 1 the internal column with
// column_node[c] = n; the children of node n are the columns
// children[child_indptr[n] .. child_indptr[n + 1]); a column with
// column_label[c] = l >= 0 is label l's own classifier (a leaf of the
// tree), any other column is an internal node (column_node[c] >= 1).
//
// Framework-free (no TensorFlow includes): every fault is returned as a
// Fault {kind, position, value} for the kernel to turn into an
// InvalidArgument message naming the entry.
#ifndef XMC_TF_OPS_LABEL_TREE_LABEL_TREE_KERNELS_H_
#define XMC_TF_OPS_LABEL_TREE_LABEL_TREE_KERNELS_H_

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "ops/common/sparse_accumulator.h"

namespace xmc_tf {
namespace label_tree {

// The tree's classifiers: the feature-major CSR weights [D, C] as an
// inverted index (features -> columns) and the bias [C].
struct Weights {
  InvertedIndex index;
  const float* bias = nullptr;  // [C]
};

// The tree's shape (see the file comment).
struct Topology {
  int64_t num_nodes = 0;     // N (root included)
  int64_t num_children = 0;  // E
  const int64_t* child_indptr = nullptr;  // [N + 1]
  const int32_t* children = nullptr;      // [E]
  const int32_t* column_node = nullptr;   // [C]
  const int32_t* column_label = nullptr;  // [C]
};

// What went wrong in a row's work, and where.
struct Fault {
  enum Kind {
    kNone = 0,
    kWeightIndptr,  // position: feature f (indptr[f], indptr[f + 1] bad)
    kWeightColumn,  // position: weight entry p, value: columns[p]
    kChildIndptr,   // position: node n
    kChild,         // position: entry e of children, value: children[e]
    kColumnKind,    // position: column c (neither a label nor a node)
    kColumnNode,    // position: column c, value: column_node[c]
    kDepth,         // the beam did not end within num_nodes levels
    kPathColumn,    // position: flat entry of paths, value
    kLabel,         // position: flat entry of labels, value
  };
  Kind kind = kNone;
  int64_t position = 0;
  int64_t value = 0;
};

// The score a NaN sorts as (below every number).
inline float Rank(float v) {
  return std::isnan(v) ? -std::numeric_limits<float>::infinity() : v;
}

// (score, id) pairs best first: larger score, then the lower id.
using Scored = std::pair<float, int32_t>;
inline bool Better(const Scored& a, const Scored& b) {
  const float ra = Rank(a.first), rb = Rank(b.first);
  return ra > rb || (ra == rb && a.second < b.second);
}

// Keeps the best `keep` of *items, sorted best first.
inline void KeepBest(std::vector<Scored>* items, int64_t keep) {
  if (static_cast<int64_t>(items->size()) > keep) {
    std::nth_element(items->begin(), items->begin() + keep, items->end(),
                     Better);
    items->resize(keep);
  }
  std::sort(items->begin(), items->end(), Better);
}

// One thread's column scores of one instance at a time (the column sums
// in a SparseAccumulator over the feature-major weights).
class ColumnScores : public SparseAccumulator {
 public:
  using SparseAccumulator::SparseAccumulator;

  // Column c's log-score (c in [0, C)).
  float LogScore(const Weights& w, int64_t c) const {
    const float margin = 1.0f - (value(c) + w.bias[c]);
    return margin > 0.0f ? -margin * margin : 0.0f;
  }
};

// Beam search down the tree for the instance whose column scores `s`
// holds: level by level, every child of the frontier is scored (the
// parent's path log-score plus its own); label children become candidates,
// internal children compete for the next frontier's `beam` places (ties:
// the lower node id).  On return *candidates holds the best `k` (label,
// path log-score) pairs, best first (ties: the lower label id).
inline bool BeamSearch(const Weights& w, const Topology& t,
                       const ColumnScores& s, int64_t beam, int64_t k,
                       std::vector<Scored>* frontier,
                       std::vector<Scored>* next,
                       std::vector<Scored>* candidates, Fault* fault) {
  frontier->assign(1, Scored(0.0f, 0));
  candidates->clear();
  for (int64_t level = 0; !frontier->empty(); ++level) {
    if (level >= t.num_nodes) {
      *fault = {Fault::kDepth, 0, 0};
      return false;
    }
    next->clear();
    for (const Scored& item : *frontier) {
      const int64_t n = item.second;
      const int64_t lo = t.child_indptr[n], hi = t.child_indptr[n + 1];
      if (lo < 0 || hi < lo || hi > t.num_children) {
        *fault = {Fault::kChildIndptr, n, 0};
        return false;
      }
      for (int64_t e = lo; e < hi; ++e) {
        const int32_t c = t.children[e];
        if (c < 0 || c >= w.index.num_targets) {
          *fault = {Fault::kChild, e, c};
          return false;
        }
        const float score = item.first + s.LogScore(w, c);
        const int32_t label = t.column_label[c];
        if (label < -1 || label >= w.index.num_targets) {
          *fault = {Fault::kColumnKind, c, label};
          return false;
        }
        if (label >= 0) {
          candidates->emplace_back(score, label);
          continue;
        }
        const int32_t node = t.column_node[c];
        if (node < 1 || node >= t.num_nodes) {
          *fault = {Fault::kColumnNode, c, node};
          return false;
        }
        next->emplace_back(score, node);
      }
    }
    KeepBest(next, beam);
    std::swap(*frontier, *next);
  }
  KeepBest(candidates, k);
  return true;
}

}  // namespace label_tree
}  // namespace xmc_tf

#endif  // XMC_TF_OPS_LABEL_TREE_LABEL_TREE_KERNELS_H_
