// Op registrations of the label-tree family: the shortlist of a label tree
// by beam search (Xmc>LabelTreeBeamSearch) and the tree's path log-scores of
// given labels (Xmc>LabelTreePathScores), both on a sparse batch, without
// a [batch, num_labels] tensor.  The per-instance work is in
// label_tree_kernels.h; xmc_tf.layers.LabelTreeScores holds the arrays.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace {

// indices [nnz, 2], values [nnz], dense_shape [2]; the batch dimension.
Status SparseBatch(InferenceContext* c, DimensionHandle* batch) {
  ShapeHandle indices, values, shape;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &shape));
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(c->WithValue(c->Dim(indices, 1), 2, &unused));
  TF_RETURN_IF_ERROR(c->Merge(c->Dim(indices, 0), c->Dim(values, 0), &unused));
  *batch = c->UnknownDim();
  return ::tensorflow::OkStatus();
}

// weight_indptr [D + 1], weight_columns [W], weight_values [W], bias [C].
Status TreeWeights(InferenceContext* c) {
  ShapeHandle indptr, columns, values, bias, merged;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &indptr));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 1, &columns));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(5), 1, &values));
  TF_RETURN_IF_ERROR(c->Merge(columns, values, &merged));
  return c->WithRank(c->input(6), 1, &bias);
}

}  // namespace

REGISTER_OP("Xmc>LabelTreeBeamSearch")
    .Input("indices: int64")
    .Input("values: float")
    .Input("dense_shape: int64")
    .Input("weight_indptr: int64")
    .Input("weight_columns: int32")
    .Input("weight_values: float")
    .Input("bias: float")
    .Input("child_indptr: int64")
    .Input("children: int32")
    .Input("column_node: int32")
    .Input("column_label: int32")
    .Output("label_ids: int32")
    .Output("scores: float")
    .Attr("beam: int >= 1")
    .Attr("k: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(SparseBatch(c, &batch));
      TF_RETURN_IF_ERROR(TreeWeights(c));
      ShapeHandle unused;
      for (int i = 7; i < 11; ++i) {
        TF_RETURN_IF_ERROR(c->WithRank(c->input(i), 1, &unused));
      }
      int64_t k = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      ShapeHandle out = c->Matrix(batch, k);
      c->set_output(0, out);
      c->set_output(1, out);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The k best labels of every instance by beam search down a label tree.

Parabel's beam search (Prabhu et al., WWW 2018, Sec. 3.3): from the root,
level by level, every child of the frontier's nodes is scored, its path
log-score being its parent's plus its own column's
-max(0, 1 - (x . w_c + b_c))^2; label children become candidates, internal
children compete for the `beam` places of the next frontier (ties: the lower
node id).  The output is the k best candidates (ties: the lower label id),
-1 / -inf where fewer were reached.  Cost per instance: the summed weight
rows of its features (the column sums) plus beam x children per level; no
[batch, num_labels] tensor.

indices, values, dense_shape: the sparse batch [batch, D] (int64 [nnz, 2],
  float [nnz], int64 [2]); entries in any order, repeats add up.
weight_indptr, weight_columns, weight_values: the classifiers feature-major,
  CSR [D, C] (int64 [D + 1], int32 [W], float [W]); bias: float [C].
child_indptr, children: node n's children are the columns
  children[child_indptr[n] : child_indptr[n + 1]] (int64 [N + 1], int32 [E]);
  node 0 is the root.
column_node: int32 [C], the node (>= 1) an internal column is, -1 for a
  label column; column_label: int32 [C], the label of a label column, -1
  for an internal one.
label_ids: int32 [batch, k]; scores: float [batch, k], path log-scores.
Every id read is range-checked: InvalidArgument names the bad entry.
)doc");

REGISTER_OP("Xmc>LabelTreePathScores")
    .Input("indices: int64")
    .Input("values: float")
    .Input("dense_shape: int64")
    .Input("weight_indptr: int64")
    .Input("weight_columns: int32")
    .Input("weight_values: float")
    .Input("bias: float")
    .Input("paths: int32")
    .Input("label_ids: int32")
    .Output("scores: float")
    .SetShapeFn([](InferenceContext* c) {
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(SparseBatch(c, &batch));
      TF_RETURN_IF_ERROR(TreeWeights(c));
      ShapeHandle paths, labels;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(7), 2, &paths));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(8), 2, &labels));
      c->set_output(0, labels);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
A label tree's path log-scores of given labels.

scores[i, j] = sum over the columns c of label_ids[i, j]'s path of
-max(0, 1 - (x_i . w_c + b_c))^2 (Parabel, Prabhu et al., WWW 2018, Sec. 3:
the log of the product of the squared-hinge probabilities along the path);
0 where label_ids[i, j] = -1 (padding).  Equal to a gather of the full
[batch, num_labels] log-scores, at the cost of the summed weight rows of the
instance's features plus depth per label.

indices, values, dense_shape, weight_*, bias: as Xmc>LabelTreeBeamSearch.
paths: int32 [m, depth], the columns on each label's path, padded with C.
label_ids: int32 [batch, k], each in [-1, m).
scores: float [batch, k].
Every id read is range-checked: InvalidArgument names the bad entry.
)doc");

}  // namespace xmc_tf
