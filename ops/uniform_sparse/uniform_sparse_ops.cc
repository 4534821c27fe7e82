// Op registrations of the uniform-sparse family (Xmc>UniformSparseMatmul and
// its two gradients; Xmc>UniformSparseInvertedIndex and
// Xmc>UniformSparseMatmulSparseInput with its weight gradient, the same layer
// on a sparse input batch; Xmc>SetRewire, one SET prune/regrow step of the
// connections).
//
// Source: E. Schultheis, R. Babbar, "Towards Memory-Efficient Training for
// Extremely Large Output Spaces -- Learning with 500k Labels on a Single
// Commodity GPU", Sec. 3.1-3.3, Algorithms 1-3.

#include "ops/common/shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {
namespace {

// The operands of the gradients: backward [batch, num_labels] (input 0),
// features [batch, num_features] (input 1, *features), indices
// [num_labels, fan_in] (input 2) and, with `with_weights`, weights of the
// same shape (input 3); *connections is the [num_labels, fan_in] shape.
Status GradientShapes(InferenceContext* c, bool with_weights,
                      ShapeHandle* features, ShapeHandle* connections) {
  ShapeHandle backward;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, features));
  if (with_weights) {
    TF_RETURN_IF_ERROR(MergeMatrices(c, 2, 3, connections));
  } else {
    TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, connections));
  }
  DimensionHandle unused;
  TF_RETURN_IF_ERROR(
      c->Merge(c->Dim(backward, 0), c->Dim(*features, 0), &unused));
  return c->Merge(c->Dim(backward, 1), c->Dim(*connections, 0), &unused);
}

}  // namespace

REGISTER_OP("Xmc>UniformSparseMatmul")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Output("scores: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &features));
      TF_RETURN_IF_ERROR(MergeMatrices(c, 1, 2, &connections));
      c->set_output(0, c->Matrix(c->Dim(features, 0), c->Dim(connections, 0)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Scores of a uniformly sparse output layer (Algorithm 1 of Schultheis & Babbar).

scores[i, j] = sum_k features[i, indices[j, k]] * weights[j, k]

Every label j has exactly `fan_in` incoming connections.  The layout is
label-major, [num_labels, fan_in] (the paper stores the transpose): the
connections of one label are contiguous, so a CPU thread reads them in one
cache line, a GPU warp in one coalesced load, SET rewiring works on rows, and
the matrices shard by label.

features: [batch, num_features] float32/float16/bfloat16.
indices: [num_labels, fan_in] int32, every entry in [0, num_features);
  every entry is checked (the op reads them all): one outside is
  InvalidArgument naming it ("indices[j, k] = v is out of range [0, D)").
weights: [num_labels, fan_in], same dtype as features.
scores: [batch, num_labels], same dtype as features (accumulated in float32).
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulGradFeatures")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Output("grad_features: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections;
      TF_RETURN_IF_ERROR(GradientShapes(c, /*with_weights=*/true, &features,
                                        &connections));
      c->set_output(0, features);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseMatmul w.r.t. features (Algorithm 2).

grad_features[i, indices[j, k]] += backward[i, j] * weights[j, k]

Entries with backward[i, j] == 0 are skipped without reading indices[j, :] or
weights[j, :] (implicit negative mining, Sec. 3.3).  Only the shape of
`features` is used.

The gradients check the indices they read: on the CPU, the rows
indices[j, :] of the labels with a non-zero backward[:, j] (a bad one is
InvalidArgument naming the smallest bad position read; an index of a label
without signal is not read, so not checked: the forward op checks them all);
the GPU launchers check every index.

backward: [batch, num_labels]; features: [batch, num_features];
indices, weights: [num_labels, fan_in].
grad_features: [batch, num_features].
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulGradWeights")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Output("grad_weights: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, indices;
      TF_RETURN_IF_ERROR(GradientShapes(c, /*with_weights=*/false, &features,
                                        &indices));
      c->set_output(0, indices);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseMatmul w.r.t. weights (Algorithm 3).

grad_weights[j, k] = sum_i backward[i, j] * features[i, indices[j, k]]

A zero backward[i, j] skips the load of features[i, indices[j, k]]; a label
whose whole backward column is zero does not read indices[j, :] at all.

The gradients check the indices they read: on the CPU, the rows
indices[j, :] of the labels with a non-zero backward[:, j] (a bad one is
InvalidArgument naming the smallest bad position read; an index of a label
without signal is not read, so not checked: the forward op checks them all);
the GPU launchers check every index.

backward: [batch, num_labels]; features: [batch, num_features];
indices: [num_labels, fan_in].  grad_weights: [num_labels, fan_in].
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulGrad")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: T")
    .Output("grad_features: T")
    .Output("grad_weights: T")
    .Attr("T: {float, half, bfloat16}")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle features, connections;
      TF_RETURN_IF_ERROR(GradientShapes(c, /*with_weights=*/true, &features,
                                        &connections));
      c->set_output(0, features);
      c->set_output(1, connections);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Both gradients of Xmc>UniformSparseMatmul (Algorithms 2 and 3) in one pass.

grad_features = Xmc>UniformSparseMatmulGradFeatures(backward, features,
indices, weights) and grad_weights = Xmc>UniformSparseMatmulGradWeights(
backward, features, indices), computed together: the CPU kernel reads
`backward` and `indices` once for both, skipping every zero entry of
`backward` (Sec. 3.3; on a sparse signal the work is proportional to its
non-zeros).  The gradient registered for Xmc>UniformSparseMatmul.

The gradients check the indices they read: on the CPU, the rows
indices[j, :] of the labels with a non-zero backward[:, j] (a bad one is
InvalidArgument naming the smallest bad position read; an index of a label
without signal is not read, so not checked: the forward op checks them all);
the GPU launchers check every index.

backward: [batch, num_labels]; features: [batch, num_features];
indices, weights: [num_labels, fan_in].
grad_features: [batch, num_features]; grad_weights: [num_labels, fan_in].
)doc");

// ---------------------------------------------------------------------------
// The uniform-sparse layer on a sparse input batch (a per-label sparse linear
// classifier on tf-idf features): the transposed ("inverted") traversal.

namespace {

// offsets [D + 1] (D + 1 >= 1), entries [m * s] against weights [m, s].
Status InvertedIndexShapes(InferenceContext* c, int offsets_input,
                           int entries_input, int weights_input,
                           ShapeHandle* weights) {
  ShapeHandle offsets, entries;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(offsets_input), 1, &offsets));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(entries_input), 1, &entries));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(weights_input), 2, weights));
  if (c->ValueKnown(c->Dim(offsets, 0)) && c->Value(c->Dim(offsets, 0)) < 1) {
    return ::tensorflow::errors::InvalidArgument(
        "offsets must have num_features + 1 >= 1 elements, got 0");
  }
  DimensionHandle unused, num_connections;
  TF_RETURN_IF_ERROR(c->Multiply(c->Dim(*weights, 0), c->Dim(*weights, 1),
                                 &num_connections));
  return c->Merge(c->Dim(entries, 0), num_connections, &unused);
}

}  // namespace

REGISTER_OP("Xmc>UniformSparseGradApply")
    .Input("backward: T")
    .Input("features: T")
    .Input("indices: int32")
    .Input("weights: resource")
    .Input("state: num_state * resource")
    .Input("alpha: float")
    .Input("one_minus_beta1: float")
    .Input("one_minus_beta2: float")
    .Input("epsilon: float")
    .Output("grad_features: T")
    .Attr("T: {float, bfloat16}")
    .Attr("rule: {'sgd', 'adam'}")
    .Attr("kahan: bool = false")
    .Attr("lazy: bool = true")
    .Attr("num_state: int >= 0")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle backward, features, indices;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &features));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &indices));
      int num_state;
      TF_RETURN_IF_ERROR(c->GetAttr("num_state", &num_state));
      TF_RETURN_IF_ERROR(ScalarInputs(c, 4 + num_state, 4));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 0), c->Dim(features, 0), &unused));
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 1), c->Dim(indices, 0), &unused));
      c->set_output(0, features);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient w.r.t. features of Xmc>UniformSparseMatmul, and the weights'
optimizer step applied in place, in one op: the [num_labels, fan_in] weights
gradient never exists whole.

grad_features[i, indices[j, k]] += backward[i, j] * weights[j, k]  (the
weights before the step; Algorithm 2 of Schultheis & Babbar), then, for every
label j with a non-zero backward[:, j] and every k,

  g = sum_i backward[i, j] * features[i, indices[j, k]]   (Algorithm 3)
  rule "sgd":  u = -alpha * g
  rule "adam": m += (g - m) * one_minus_beta1;
               v += (g * g - v) * one_minus_beta2;
               u = -alpha * m / (sqrt(v) + epsilon)
  kahan false: w += u
  kahan true:  y = u - c; t = w + y (rounded to T); c = (t - w) - y; w = t
               (Kahan-compensated: the rounding lost by a bfloat16 store is
               carried in c and added back at the label's next step)

computed in float32 and stored in T.  With `lazy` a label without signal
keeps its weights and state (a "lazy" row update, as
xmc_tf.optimizers.LazyAdam on an IndexedSlices gradient; with the squared
hinge its gradient is exactly 0); without it (rule "adam" only) such a label
takes the step of a zero gradient: its moments decay and its weights move
along m, as keras' Adam on a dense gradient.

backward: [batch, num_labels]; features: [batch, num_features]; indices:
  [num_labels, fan_in] int32, the rows of labels with signal checked where
  they are read (InvalidArgument naming the smallest bad position; nothing
  is written then).
weights: a resource variable [num_labels, fan_in] of dtype T.
state: num_state resource variables of weights' shape and dtype, in the
  order [c (kahan)] [m, v (adam)]: num_state = kahan + 2 * (rule == adam).
alpha: the step size (adam: lr * sqrt(1 - beta2^t) / (1 - beta1^t), the
  folded bias correction of Kingma & Ba, Sec. 2); one_minus_beta1,
  one_minus_beta2, epsilon: Adam's (ignored by sgd).
grad_features: [batch, num_features], dtype T (accumulated in float32).
The variables are locked exclusively in address order; a buffer another
tensor still shares is copied before the write.  CPU only.
)doc");

REGISTER_OP("Xmc>UniformSparseInvertedIndex")
    .Input("indices: int32")
    .Input("num_features: int64")
    .Output("offsets: int64")
    .Output("entries: Tidx")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle indices, unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 0, &unused));
      DimensionHandle num_features, offsets, entries;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(1, &num_features));
      TF_RETURN_IF_ERROR(c->Add(num_features, 1, &offsets));
      TF_RETURN_IF_ERROR(
          c->Multiply(c->Dim(indices, 0), c->Dim(indices, 1), &entries));
      c->set_output(0, c->Vector(offsets));
      c->set_output(1, c->Vector(entries));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Inverted index (CSR of the transpose) of uniform-sparse connections.

A counting sort of the flat connection positions p = j * fan_in + k by their
feature indices[j, k]: the positions connected to feature f are
entries[offsets[f] : offsets[f + 1]], in increasing p (so p / fan_in is the
label and p % fan_in the slot of the connection).  O(num_labels * fan_in +
num_features) time and memory; multi-threaded when num_labels * fan_in is
at least 2^15 and 4 * num_features (one histogram per thread).  CPU only (on
a GPU, TensorFlow places it on the CPU).

indices: [num_labels, fan_in] int32, every entry in [0, num_features).
num_features: scalar int64 D >= 0.
offsets: [D + 1] int64, offsets[0] = 0, non-decreasing,
  offsets[D] = num_labels * fan_in.
entries: [num_labels * fan_in] Tidx (int32 by default: then
  num_labels * fan_in must be < 2^31; int64 otherwise), a permutation of
  [0, num_labels * fan_in).
An index out of [0, D) is InvalidArgument naming it ("indices[j, k] = v is
out of range [0, D)").
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulSparseInput")
    .Input("rows: int64")
    .Input("cols: int64")
    .Input("values: T")
    .Input("batch_size: int64")
    .Input("offsets: int64")
    .Input("entries: Tidx")
    .Input("weights: T")
    .Output("scores: T")
    .Attr("T: {float} = DT_FLOAT")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle entries, unused, weights;
      TF_RETURN_IF_ERROR(MergeVectors(c, 0, 3, &entries));  // rows, cols, values
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 0, &unused));
      TF_RETURN_IF_ERROR(InvertedIndexShapes(c, 4, 5, 6, &weights));
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->MakeDimForScalarInput(3, &batch));
      c->set_output(0, c->Matrix(batch, c->Dim(weights, 0)));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Uniform-sparse layer scores on a sparse input batch, via the inverted index.

With X the [batch_size, D] sparse matrix whose stored entries are
(rows[e], cols[e], values[e]) and (offsets, entries) the inverted index of
`indices` (Xmc>UniformSparseInvertedIndex):

scores[i, j] = sum over stored entries (i, f, v) of
               sum over p in entries[offsets[f] : offsets[f + 1]] with
                   p / fan_in = j of v * weights_flat[p]

i.e. Xmc>UniformSparseMatmul(to_dense(X), indices, weights), up to rounding
(Schultheis & Babbar's uniform-sparse layer applied to sparse inputs,
traversed feature by feature instead of label by label).  Repeated (i, f)
entries add up (tf.sparse.to_dense would reject them).  Only stored entries
form products: an inf/NaN weight reaches only the rows that store a value
(even an explicit 0) for its feature.

The cost is O(batch_size * num_labels) to zero the output plus one
multiply-add per (stored entry, connected position) pair, about
nnz * num_labels * fan_in / D.
Multi-threaded over batch rows (every output row has one writer); within a
row the sums run in entry order, then in increasing p (deterministic).
float32 only; CPU only (on a GPU, TensorFlow places it on the CPU).

rows: [nnz] int64 in [0, batch_size).  cols: [nnz] int64 in [0, D).
values: [nnz] float32.  batch_size: scalar int64 >= 0.
offsets: [D + 1] int64, offsets[0] = 0, non-decreasing, offsets[D] =
  num_labels * fan_in.
entries: [num_labels * fan_in] int32/int64, each in [0, num_labels * fan_in).
weights: [num_labels, fan_in] float32.
scores: [batch_size, num_labels] float32.
Any violation is InvalidArgument naming the first offending entry.  The
index is checked where it is read: its sizes, offsets[0] and offsets[D] on
every call, and the offsets pair and list of every feature the batch
stores (a kept index is not re-read whole on every call); a bad part the
batch reads is reported with the whole index's first bad offset or entry,
a bad part it does not read is not read.
)doc");

REGISTER_OP("Xmc>UniformSparseMatmulSparseInputGradWeights")
    .Input("backward: T")
    .Input("rows: int64")
    .Input("cols: int64")
    .Input("values: T")
    .Input("offsets: int64")
    .Input("entries: Tidx")
    .Input("weights: T")
    .Output("grad_weights: T")
    .Attr("T: {float} = DT_FLOAT")
    .Attr("Tidx: {int32, int64} = DT_INT32")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle backward, entries, weights;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &backward));
      TF_RETURN_IF_ERROR(MergeVectors(c, 1, 3, &entries));  // rows, cols, values
      TF_RETURN_IF_ERROR(InvertedIndexShapes(c, 4, 5, 6, &weights));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(backward, 1), c->Dim(weights, 0), &unused));
      c->set_output(0, weights);
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Gradient of Xmc>UniformSparseMatmulSparseInput w.r.t. weights.

grad_weights_flat[p] = sum over stored entries (i, f, v) with p in
    entries[offsets[f] : offsets[f + 1]] of v * backward[i, p / fan_in]

(with an index from Xmc>UniformSparseInvertedIndex: the entries whose
feature is indices_flat[p]).  A zero backward[i, j] contributes exactly 0
(its product is skipped, also against an inf/NaN value).  Positions of
features that the batch does not store are 0.  Only the shape of `weights`
is read.  There is no gradient w.r.t. rows, cols or values (input data).

The batch's entries are grouped by feature (sorted by col, O(nnz log nnz)),
and the distinct features are processed in parallel: a feature's worker owns
the positions of its list, so every output element has one writer.  This
needs the lists of the batch's features to be disjoint (always true of an
index built by Xmc>UniformSparseInvertedIndex); a position listed twice in
them is InvalidArgument.  The cost is O(num_labels * fan_in) to zero the
output plus one multiply-add per (stored entry, connected position) pair.
float32 only; CPU only (on a GPU, TensorFlow places it on the CPU).

backward: [batch, num_labels] float32.  rows: [nnz] int64 in [0, batch).
cols: [nnz] int64 in [0, D).  values: [nnz] float32.
offsets: [D + 1] int64; entries: [num_labels * fan_in] int32/int64, as for
Xmc>UniformSparseMatmulSparseInput.  weights: [num_labels, fan_in] float32.
grad_weights: [num_labels, fan_in] float32.
Any violation is InvalidArgument naming the first offending entry; the
index is checked where it is read, as in Xmc>UniformSparseMatmulSparseInput.
)doc");

REGISTER_OP("Xmc>SetRewire")
    .Input("indices: int32")
    .Input("weights: T")
    .Input("num_features: int64")
    .Input("seed: int64")
    .Output("new_indices: int32")
    .Output("positions: int64")
    .Attr("num_moved: int >= 0")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) {
      ShapeHandle merged, unused;
      TF_RETURN_IF_ERROR(MergeMatrices(c, 0, 1, &merged));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &unused));
      int64_t num_moved = 0;
      TF_RETURN_IF_ERROR(c->GetAttr("num_moved", &num_moved));
      c->set_output(0, merged);
      c->set_output(1, c->Matrix(c->Dim(merged, 0), num_moved));
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
One SET step (prune the smallest magnitudes, regrow at random) of
uniform-sparse connections, every label in one pass.

Per label j (row of indices / weights): the num_moved connections of
smallest |weights[j, k]| (ties: lower k first; NaN counts as larger than
every number) are removed, and as many sources are drawn uniformly at random
among those the label was not connected to before this step (when at least
num_moved such sources exist, i.e. num_features - fan_in >= num_moved), else
among those it is not connected to after the removal; the draws of one label
are distinct.  new_indices is indices with positions[j, q] replaced by the
q-th draw; positions[j, :] is sorted.  Draws come from a counter-based
generator keyed by (seed, j): the result depends on the seed only, not on
the number of threads.  O(num_labels * fan_in) time (a selection and a
bitmap or a scan of the row per label); rows are processed in parallel.
CPU only.  After Mocanu et al., "Scalable training of artificial neural
networks with adaptive sparse connectivity inspired by network science"
(SET, 2018), as applied to the output layer by Schultheis & Babbar (Sec. 2,
Sec. 4.1).

indices: [num_labels, fan_in] int32, entries in [0, num_features).
weights: [num_labels, fan_in] float32 or bfloat16.
num_features: scalar int64, fan_in <= num_features < 2^31.
seed: [2] int64.
num_moved: connections moved per label, <= fan_in.
new_indices: [num_labels, fan_in] int32.
positions: [num_labels, num_moved] int64.
Violations (shapes, an index out of range, num_moved > fan_in,
num_features < fan_in) are InvalidArgument naming the offending value.
)doc");

REGISTER_OP("Xmc>ResourceSetRewire")
    .Input("indices: resource")
    .Input("weights: resource")
    .Input("state: num_state * resource")
    .Input("num_features: int64")
    .Input("seed: int64")
    .Output("moved: int64")
    .Output("pruned_abs_sum: double")
    .Attr("num_moved: int >= 0")
    .Attr("num_state: int >= 0")
    .Attr("T: {float, bfloat16} = DT_FLOAT")
    .SetShapeFn([](InferenceContext* c) {
      int num_state;
      TF_RETURN_IF_ERROR(c->GetAttr("num_state", &num_state));
      ShapeHandle unused;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2 + num_state), 0, &unused));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3 + num_state), 1, &unused));
      c->set_output(0, c->Scalar());
      c->set_output(1, c->Scalar());
      return ::tensorflow::OkStatus();
    })
    .Doc(R"doc(
Xmc>SetRewire written into the variables: the same new connections for the
same seed, with the indices variable's rows rewritten in place and the
moved positions of the weights and of every state variable (optimizer
slots, a fused update's state) set to zero.

indices: a resource variable [num_labels, fan_in] int32, entries in
  [0, num_features) (all checked first: InvalidArgument naming the first
  bad one, nothing written).
weights: a resource variable of the same shape, dtype T.
state: num_state resource variables of the same shape, any dtype.
num_features, seed: as Xmc>SetRewire.
moved: num_labels * num_moved.
pruned_abs_sum: the sum of |weights| at the moved positions (float64).
No [num_labels, fan_in] buffer is allocated (a variable whose buffer
another tensor shares is copied first).  CPU only.
)doc");

}  // namespace xmc_tf
