// Op registrations of the embedding-bag family: the forward product of the
// sparse-input encoder (xmc_tf.layers.SparseEmbeddingBag) over the batch's
// distinct feature rows, and its gradient w.r.t. those rows.
//
// What it computes: a TF-IDF weighted bag of feature rows, i.e. a Dense layer
// applied to sparse input as a sparse x dense product (the "sum" combiner of
// tf.nn.embedding_lookup_sparse); the project's sparse-input encoder (issue
// 10), here as multi-threaded CPU kernels (TensorFlow's SparseTensorDenseMatMul
// CPU kernel was a fifth of a training step of the default model).

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace {

// rows, positions, weights: vectors of one length.
Status EntryShapes(InferenceContext* c, int first) {
  ShapeHandle entries;
  return MergeVectors(c, first, 3, &entries);
}

}  // namespace

REGISTER_OP("Xmc>EmbeddingBag")
    .Input("rows: int64")
    .Input("positions: int64")
    .Input("weights: T")
    .Input("table: T")
    .Input("batch_size: int64")
    .Output("output: T")
    .Attr("T: {float, double, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(EntryShapes(c, 0));
      ShapeHandle table, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 2, &table));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &batch));
      c->set_output(0, c->Matrix(batch, c->Dim(table, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Weighted bags of table rows: the sparse-input encoder's product.

output[i, :] = sum over the entries e with rows[e] = i of
               weights[e] * table[positions[e], :]

(0 for a row without entries; repeated (row, position) pairs add up).  The
same result as tf.sparse.sparse_dense_matmul of the [batch_size, u] sparse
matrix with these entries and `table`, multi-threaded over output rows.

rows: [nnz] int64, each in [0, batch_size).
positions: [nnz] int64, each in [0, u).
weights: [nnz] T (float32/float64/float16/bfloat16; float16 and bfloat16
  are summed in float32, one rounding per output value).
table: [u, d] T, the batch's distinct feature rows.
batch_size: scalar int64 >= 0.
output: [batch_size, d] T.
An entry out of range is InvalidArgument naming it.
)doc");

REGISTER_OP("Xmc>EmbeddingBagGradTable")
    .Input("backward: T")
    .Input("rows: int64")
    .Input("positions: int64")
    .Input("weights: T")
    .Input("num_table_rows: int64")
    .Output("grad_table: T")
    .Attr("T: {float, double, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(EntryShapes(c, 1));
      ShapeHandle backward, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &unused));
      DimensionHandle u;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(4, &u));
      c->set_output(0, c->Matrix(u, c->Dim(backward, 1)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>EmbeddingBag w.r.t. `table`.

grad_table[p, :] = sum over the entries e with positions[e] = p of
                   weights[e] * backward[rows[e], :]

backward: [batch_size, d] T, the gradient w.r.t. the output.
rows: [nnz] int64 in [0, batch_size); positions: [nnz] int64 in
  [0, num_table_rows); weights: [nnz] T (float16 / bfloat16: summed in
  float32).
num_table_rows: scalar int64 u >= 0.
grad_table: [u, d] T (rows without entries are 0).
An entry out of range is InvalidArgument naming it.
)doc");

}  // namespace xmc_tf
