// Op registration of the neighbours family: the k nearest stored instances
// of every query by dot product over an inverted index
// (Xmc>NearestNeighbours).  xmc_tf.layers.NearestNeighbourScores holds the
// index and turns the neighbours into label votes.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

REGISTER_OP("Xmc>NearestNeighbours")
    .Input("indices: int64")
    .Input("values: float")
    .Input("dense_shape: int64")
    .Input("index_indptr: int64")
    .Input("index_instances: int32")
    .Input("index_values: float")
    .Input("num_instances: int64")
    .Output("neighbours: int32")
    .Output("similarities: float")
    .Attr("k: int >= 1")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices, values, shape, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 1, &values));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 1, &shape));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
      TF_RETURN_IF_ERROR(MergeVectors(c, 4, 2, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(6), 0, &unused));
      int64_t k = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      ShapeHandle out = c->Matrix(c->UnknownDim(), k);
      c->set_output(0, out);
      c->set_output(1, out);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
The k stored instances of largest positive dot product with each query.

similarities[i, j] = x_i . t over the stored instances t that share a
feature with x_i and have x_i . t > 0, the k largest, best first (ties: the
lower instance id); -1 / 0 where fewer qualify.  The instances are stored
feature-major (an inverted index), so a query costs the summed postings of
its features plus a selection over the instances met (Dudani, IEEE SMC 1976;
the kNN rankers of extreme classification, e.g. SiameseXML, Dahiya et al.
ICML 2021, Sec. 3).

indices, values, dense_shape: the queries, sparse [batch, D] (int64 [nnz, 2],
  float [nnz], int64 [2]); entries in any order, repeats add up.
index_indptr, index_instances, index_values: the stored instances, CSR
  [D, n] (int64 [D + 1], int32 [E], float [E]).
num_instances: int64 scalar n.
neighbours: int32 [batch, k]; similarities: float [batch, k].
Every id read is range-checked: InvalidArgument names the bad entry.
)doc");

}  // namespace xmc_tf
