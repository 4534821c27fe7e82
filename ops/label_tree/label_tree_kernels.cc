// CPU kernels of the label-tree family (label_tree_ops.cc documents the
// ops; label_tree_kernels.h holds the per-instance work).
//
// Structure: one OpKernel per op checks the shapes and the sparse batch's
// entries (InvalidArgument naming the first bad one), buckets the entries
// by row (counting sort), then shards the rows over TensorFlow's intra-op
// thread pool.  Each shard owns a ColumnScores scratch of C floats; an
// instance accumulates its column sums there, is searched (or its labels'
// paths summed) and resets the columns it touched.  The tree's arrays are
// range-checked where they are read, so the cost follows the work, not the
// tree's size; a fault is reported for the lowest row that met one (each
// shard stops at its first), so the message does not depend on the thread
// count.  Results do not depend on the thread count either: each row is
// one thread's, summed in entry order.

#include <cstdint>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "ops/common/sparse_batch.h"
#include "ops/common/validation.h"
#include "ops/label_tree/label_tree_kernels.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/tensor.h"
#include "tensorflow/core/util/work_sharder.h"

namespace xmc_tf {
namespace {

using label_tree::ColumnScores;
using label_tree::Fault;
using label_tree::Scored;

using Batch = SparseBatch;

Status ReadBatch(OpKernelContext* ctx, int64_t num_features, Batch* b) {
  return ReadSparseBatch(ctx, 0, num_features, "the tree's num_features", b);
}

Status ReadWeights(OpKernelContext* ctx, label_tree::Weights* w) {
  const Tensor& indptr = ctx->input(3);
  const Tensor& columns = ctx->input(4);
  const Tensor& values = ctx->input(5);
  const Tensor& bias = ctx->input(6);
  TF_RETURN_IF_ERROR(CheckVector(indptr, "weight_indptr"));
  TF_RETURN_IF_ERROR(CheckVector(columns, "weight_columns"));
  TF_RETURN_IF_ERROR(CheckVector(values, "weight_values"));
  TF_RETURN_IF_ERROR(CheckVector(bias, "bias"));
  if (indptr.dim_size(0) < 1) {
    return errors::InvalidArgument("weight_indptr must hold D + 1 >= 1 "
                                   "entries, got 0");
  }
  if (columns.dim_size(0) != values.dim_size(0)) {
    return errors::InvalidArgument(
        "weight_columns has ", columns.dim_size(0), " entries, weight_values ",
        values.dim_size(0));
  }
  TF_RETURN_IF_ERROR(CheckInt32Indexable(bias.dim_size(0), "num_columns"));
  w->index.num_rows = indptr.dim_size(0) - 1;
  w->index.num_targets = bias.dim_size(0);
  w->index.num_entries = columns.dim_size(0);
  w->index.indptr = indptr.flat<int64_t>().data();
  w->index.targets = columns.flat<int32_t>().data();
  w->index.weights = values.flat<float>().data();
  w->bias = bias.flat<float>().data();
  return ::tensorflow::OkStatus();
}

// The message of a fault met in row `row`.
Status FaultStatus(const Fault& f, int64_t row, const label_tree::Weights& w,
                   int64_t num_nodes, const TensorShape& paths_shape,
                   const TensorShape& labels_shape) {
  const std::string where = absl::StrCat(" (instance ", row, ")");
  switch (f.kind) {
    case Fault::kWeightIndptr:
      return errors::InvalidArgument(
          "weight_indptr[", f.position, ":", f.position + 2,
          "] is not a valid CSR row of the ", w.index.num_entries, " weights",
          where);
    case Fault::kWeightColumn:
      return errors::InvalidArgument(
          OutOfRangeMessage("weight_columns", TensorShape({w.index.num_entries}),
                            f.position, f.value, 0, w.index.num_targets,
                            "num_columns"),
          where);
    case Fault::kChildIndptr:
      return errors::InvalidArgument("child_indptr[", f.position, ":",
                                     f.position + 2,
                                     "] is not a valid CSR row of children",
                                     where);
    case Fault::kChild:
      return errors::InvalidArgument(
          "children[", f.position, "] = ", f.value,
          " is out of range [0, ", w.index.num_targets, ") (num_columns)", where);
    case Fault::kColumnKind:
      return errors::InvalidArgument(
          "column_label[", f.position, "] = ", f.value,
          " must be -1 (an internal column) or a label id in [0, ",
          w.index.num_targets, ")", where);
    case Fault::kColumnNode:
      return errors::InvalidArgument(
          "column_node[", f.position, "] = ", f.value,
          " is out of range [1, ", num_nodes,
          ") (internal columns are nodes 1 .. N - 1)", where);
    case Fault::kDepth:
      return errors::InvalidArgument(
          "the beam search did not reach the leaves within the tree's ",
          num_nodes, " nodes: children / column_node form a cycle", where);
    case Fault::kPathColumn:
      return errors::InvalidArgument(
          OutOfRangeMessage("paths", paths_shape, f.position, f.value, 0,
                            w.index.num_targets + 1, "num_columns; C is padding"),
          where);
    case Fault::kLabel:
      return errors::InvalidArgument(OutOfRangeMessage(
          "label_ids", labels_shape, f.position, f.value, -1,
          paths_shape.dim_size(0), "num_labels; -1 is padding"));
    case Fault::kNone:
      break;
  }
  return ::tensorflow::OkStatus();
}

// The lowest row that met a fault, and its fault.
class RowFaults {
 public:
  void Record(int64_t row, const Fault& fault) {
    std::lock_guard<std::mutex> lock(mu_);
    if (row < row_) {
      row_ = row;
      fault_ = fault;
    }
  }
  bool found() const { return row_ != kNone; }
  int64_t row() const { return row_; }
  const Fault& fault() const { return fault_; }

 private:
  static constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  std::mutex mu_;
  int64_t row_ = kNone;
  Fault fault_;
};

// Shards the batch's rows; `work(scores, row, fault)` returns false on a
// fault.  Cost per row: the mean column sums of an instance.
template <typename Work>
void ForEachRow(OpKernelContext* ctx, const Batch& b,
                const label_tree::Weights& w, int64_t extra_cost,
                RowFaults* faults, const Work& work) {
  if (b.rows == 0) return;
  const double mean_row =
      w.index.num_rows > 0 ? static_cast<double>(w.index.num_entries) /
                               static_cast<double>(w.index.num_rows)
                         : 0.0;
  const int64_t cost =
      static_cast<int64_t>(3.0 * mean_row * b.nnz / b.rows) + extra_cost +
      w.index.num_targets / 64 + 100;
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, b.rows, cost,
                      [&](int64_t start, int64_t limit) {
                        ColumnScores scores(w.index.num_targets);
                        for (int64_t i = start; i < limit; ++i) {
                          Fault fault;
                          IndexFault bad;
                          bool ok = scores.Accumulate(
                              w.index, b.feats.data(), b.values,
                              b.order.data(), b.offsets[i], b.offsets[i + 1],
                              &bad);
                          if (!ok) {
                            fault = bad.kind == IndexFault::kIndptr
                                        ? Fault{Fault::kWeightIndptr,
                                                bad.position, 0}
                                        : Fault{Fault::kWeightColumn,
                                                bad.position, bad.value};
                          }
                          ok = ok && work(scores, i, &fault);
                          scores.Reset();
                          if (!ok) {
                            faults->Record(i, fault);
                            return;
                          }
                        }
                      });
}

class LabelTreeBeamSearchOp : public OpKernel {
 public:
  explicit LabelTreeBeamSearchOp(OpKernelConstruction* c) : OpKernel(c) {
    OP_REQUIRES_OK(c, c->GetAttr("beam", &beam_));
    OP_REQUIRES_OK(c, c->GetAttr("k", &k_));
    OP_REQUIRES(c, beam_ >= 1 && k_ >= 1,
                errors::InvalidArgument("beam and k must be >= 1, got ", beam_,
                                        " and ", k_));
  }

  void Compute(OpKernelContext* ctx) override {
    label_tree::Weights w;
    OP_REQUIRES_OK(ctx, ReadWeights(ctx, &w));
    const Tensor& child_indptr = ctx->input(7);
    const Tensor& children = ctx->input(8);
    const Tensor& column_node = ctx->input(9);
    const Tensor& column_label = ctx->input(10);
    OP_REQUIRES_OK(ctx, CheckVector(child_indptr, "child_indptr"));
    OP_REQUIRES_OK(ctx, CheckVector(children, "children"));
    OP_REQUIRES(ctx, child_indptr.dim_size(0) >= 2,
                errors::InvalidArgument(
                    "child_indptr must hold N + 1 >= 2 entries (node 0 is the "
                    "root), got ", child_indptr.dim_size(0)));
    for (const auto& [t, name] :
         {std::pair<const Tensor*, const char*>{&column_node, "column_node"},
          {&column_label, "column_label"}}) {
      OP_REQUIRES(ctx, t->dims() == 1 && t->dim_size(0) == w.index.num_targets,
                  errors::InvalidArgument(name, " must be a vector [",
                                          w.index.num_targets, "] (num_columns), "
                                          "got shape ",
                                          t->shape().DebugString()));
    }
    label_tree::Topology t;
    t.num_nodes = child_indptr.dim_size(0) - 1;
    t.num_children = children.dim_size(0);
    t.child_indptr = child_indptr.flat<int64_t>().data();
    t.children = children.flat<int32_t>().data();
    t.column_node = column_node.flat<int32_t>().data();
    t.column_label = column_label.flat<int32_t>().data();
    Batch b;
    OP_REQUIRES_OK(ctx, ReadBatch(ctx, w.index.num_rows, &b));
    Tensor* ids_t = nullptr;
    Tensor* scores_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({b.rows, k_}),
                                             &ids_t));
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({b.rows, k_}),
                                             &scores_t));
    int32_t* ids = ids_t->flat<int32_t>().data();
    float* out = scores_t->flat<float>().data();
    const int64_t beam = beam_, k = k_;
    RowFaults faults;
    ForEachRow(ctx, b, w, 40 * beam * (k + 8), &faults,
               [&](const ColumnScores& scores, int64_t i, Fault* fault) {
                 thread_local std::vector<Scored> frontier, next, cands;
                 if (!label_tree::BeamSearch(w, t, scores, beam, k,
                                             &frontier, &next, &cands,
                                             fault)) {
                   return false;
                 }
                 for (int64_t j = 0; j < k; ++j) {
                   const bool have = j < static_cast<int64_t>(cands.size());
                   ids[i * k + j] = have ? cands[j].second : -1;
                   out[i * k + j] =
                       have ? cands[j].first
                            : -std::numeric_limits<float>::infinity();
                 }
                 return true;
               });
    if (faults.found()) {
      ctx->CtxFailure(FaultStatus(faults.fault(), faults.row(), w,
                                  t.num_nodes, TensorShape({0, 0}),
                                  TensorShape({0, 0})));
    }
  }

 private:
  int64_t beam_ = 1, k_ = 1;
};

class LabelTreePathScoresOp : public OpKernel {
 public:
  explicit LabelTreePathScoresOp(OpKernelConstruction* c) : OpKernel(c) {}

  void Compute(OpKernelContext* ctx) override {
    label_tree::Weights w;
    OP_REQUIRES_OK(ctx, ReadWeights(ctx, &w));
    const Tensor& paths = ctx->input(7);
    const Tensor& labels = ctx->input(8);
    OP_REQUIRES_OK(ctx, CheckMatrix(paths, "paths"));
    OP_REQUIRES_OK(ctx, CheckMatrix(labels, "label_ids"));
    Batch b;
    OP_REQUIRES_OK(ctx, ReadBatch(ctx, w.index.num_rows, &b));
    OP_REQUIRES(ctx, labels.dim_size(0) == b.rows,
                errors::InvalidArgument(
                    "label_ids has ", labels.dim_size(0),
                    " rows, the batch (dense_shape[0]) ", b.rows));
    const int64_t m = paths.dim_size(0), depth = paths.dim_size(1);
    const int64_t k = labels.dim_size(1);
    Tensor* scores_t = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, labels.shape(), &scores_t));
    float* out = scores_t->flat<float>().data();
    const int32_t* path = paths.flat<int32_t>().data();
    const int32_t* ids = labels.flat<int32_t>().data();
    const int64_t pad = w.index.num_targets;
    RowFaults faults;
    ForEachRow(ctx, b, w, 4 * k * depth, &faults,
               [&](const ColumnScores& scores, int64_t i, Fault* fault) {
                 for (int64_t j = 0; j < k; ++j) {
                   const int64_t q = i * k + j;
                   const int32_t label = ids[q];
                   float sum = 0.0f;
                   if (label < -1 || label >= m) {
                     *fault = {Fault::kLabel, q, label};
                     return false;
                   }
                   for (int64_t d = 0; label >= 0 && d < depth; ++d) {
                     const int64_t p = label * depth + d;
                     const int32_t c = path[p];
                     if (c == pad) continue;
                     if (c < 0 || c > pad) {
                       *fault = {Fault::kPathColumn, p, c};
                       return false;
                     }
                     sum += scores.LogScore(w, c);
                   }
                   out[q] = sum;
                 }
                 return true;
               });
    if (faults.found()) {
      ctx->CtxFailure(FaultStatus(faults.fault(), faults.row(), w, 0,
                                  paths.shape(), labels.shape()));
    }
  }
};

REGISTER_KERNEL_BUILDER(Name("Xmc>LabelTreeBeamSearch").Device(DEVICE_CPU),
                        LabelTreeBeamSearchOp);
REGISTER_KERNEL_BUILDER(Name("Xmc>LabelTreePathScores").Device(DEVICE_CPU),
                        LabelTreePathScoresOp);

}  // namespace
}  // namespace xmc_tf
