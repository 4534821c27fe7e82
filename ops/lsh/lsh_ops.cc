// Op registrations of the LSH negative-sampling family.
//
// Source: "A Truly Constant-Time Distribution-Aware Negative Sampling" (LNS),
// Sec. 1.2-2.3 and Algorithm 1 (L tables of K-bit meta-hashes over the label
// vectors, queried with the instance embedding or the positive labels'
// vectors); SimHash (Charikar 2002; LNS Appendix A.2); DWTA (Chen &
// Shrivastava, "Densified Winner Take All (WTA) Hashing for Sparse
// Datasets", UAI 2018; LNS Appendix A.3).  Layouts: see lsh_kernels.h.
#include <cstdint>

#include "ops/common/shape_fns.h"
#include "ops/lsh/lsh_kernels.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace errors = ::tensorflow::errors;

namespace {

// L = num_hashes / K, or unknown.
absl::Status TablesDim(InferenceContext* c, DimensionHandle num_hashes,
                       DimensionHandle* out) {
  int64_t K;
  TF_RETURN_IF_ERROR(c->GetAttr("num_bits", &K));
  if (K < 1) return errors::InvalidArgument("num_bits must be >= 1, got ", K);
  if (!c->ValueKnown(num_hashes)) {
    *out = c->UnknownDim();
    return absl::OkStatus();
  }
  const int64_t H = c->Value(num_hashes);
  if (H < K || H % K != 0) {
    return errors::InvalidArgument("the number of hash functions (", H,
                                   ") must be a positive multiple of "
                                   "num_bits (K = ", K, "): K * L");
  }
  *out = c->MakeDim(H / K);
  return absl::OkStatus();
}

absl::Status SparseRows(InferenceContext* c, ShapeHandle* rows) {
  ShapeHandle indices, weights;
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &indices));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &weights));
  return c->Merge(indices, weights, rows);
}

}  // namespace

REGISTER_OP("Xmc>LshSimHash")
    .Input("vectors: float")
    .Input("projection: float")
    .Output("codes: int32")
    .Attr("num_bits: int >= 1")
    .Attr("bucket_bits: int = 16")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle vectors, projection;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &vectors));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &projection));
      DimensionHandle unused, L;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(vectors, 1), c->Dim(projection, 0), &unused));
      TF_RETURN_IF_ERROR(TablesDim(c, c->Dim(projection, 1), &L));
      c->set_output(0, c->Matrix(c->Dim(vectors, 0), L));
      return absl::OkStatus();
    })
    .Doc(R"doc(
SimHash (signed random projection) bucket ids of dense vectors in L tables.

LNS Appendix A.2 (Charikar 2002): h_j(x) = [x . proj[:, j] > 0] for the
H = K * L Gaussian columns of `projection`; two vectors at angle theta agree
on one bit with probability 1 - theta / pi.  Table l's bucket is the K bits
h_{lK}, ..., h_{lK+K-1} read as an integer (first bit lowest), folded to
`bucket_bits` bits by a mixing hash when K > bucket_bits.  The projection is
accumulated in float32 over the non-zero entries of a row in increasing
coordinate order (zero entries are skipped), the order Xmc>LshSimHashSparse
uses, so a sparse vector and its densified copy get identical codes.

vectors: [n, input_dim] float32, finite.
projection: [input_dim, K * L] float32, finite (i.i.d. N(0, 1) entries for
  the collision probability above).
codes: [n, L] int32 bucket ids in [0, 2^min(K, bucket_bits)).
num_bits: K, bits (hash functions) per table, 1 <= K <= 64.
bucket_bits: cap on the bits of a bucket id, in [1, 24].

Raises InvalidArgument for wrong ranks, projection.shape[0] != input_dim,
K * L not a multiple of K, an attribute out of range, or a NaN/inf value.
)doc");

REGISTER_OP("Xmc>LshSimHashSparse")
    .Input("indices: int32")
    .Input("weights: float")
    .Input("projection: float")
    .Output("codes: int32")
    .Attr("num_bits: int >= 1")
    .Attr("bucket_bits: int = 16")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle rows, projection;
      TF_RETURN_IF_ERROR(SparseRows(c, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &projection));
      DimensionHandle L;
      TF_RETURN_IF_ERROR(TablesDim(c, c->Dim(projection, 1), &L));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), L));
      return absl::OkStatus();
    })
    .Doc(R"doc(
SimHash bucket ids of uniform-sparse vectors, without densifying them.

Row i is the vector x_i of num_features = projection.shape[0] coordinates
with x_i[indices[i, t]] += weights[i, t] (duplicate indices are summed).  Its
projections are sum_t weights[i, t] * projection[indices[i, t], :] over the
row's distinct non-zero coordinates in increasing order: O(s K L) per row
instead of O(num_features K L), and bit-identical to Xmc>LshSimHash on the
densified rows.  See Xmc>LshSimHash for the codes.

indices: [n, s] int32, every entry in [0, num_features).
weights: [n, s] float32, finite, and the float32 sums of duplicate indices
  finite too (the densified row must be finite, as Xmc>LshSimHash requires).
projection: [num_features, K * L] float32.
codes: [n, L] int32.

Raises InvalidArgument for wrong ranks or shapes, an index out of range, a
NaN/inf value, duplicate weights whose float32 sum overflows, or an
attribute out of range.
)doc");

REGISTER_OP("Xmc>LshDwtaHash")
    .Input("vectors: float")
    .Input("bins: int32")
    .Output("codes: int32")
    .Attr("num_bits: int >= 1")
    .Attr("bucket_bits: int = 16")
    .Attr("seed: int = 0")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle vectors, bins;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &vectors));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &bins));
      DimensionHandle L;
      TF_RETURN_IF_ERROR(TablesDim(c, c->Dim(bins, 0), &L));
      c->set_output(0, c->Matrix(c->Dim(vectors, 0), L));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Densified winner-take-all (DWTA) bucket ids of dense vectors in L tables.

LNS Appendix A.3 (Chen & Shrivastava, UAI 2018).  Hash function j looks at
the w = bin_size coordinates bins[j, :] of x and returns the position
p in [0, w) of the largest non-zero x[bins[j, p]] (ties: lowest p); its
value has log2(w) bits.  Zero coordinates are ignored, as DWTA does for
sparse data, so a vector and its sparse form hash alike.  A bin without a
non-zero coordinate is densified: it copies the value of the first non-empty
bin among Mix64-probed bins c_t = Mix64(Mix64(seed') + j 2^32 + t) mod H,
t = 1..32, then j+1, j+2, ... (mod H), seed' a fixed mix of `seed`.  An
all-zero vector hashes to 0 in every table.  Table l's bucket concatenates
the values of functions lK .. lK+K-1 (first lowest), K log2(w) bits, folded
to `bucket_bits` bits by a mixing hash when longer.

vectors: [n, input_dim] float32, finite.
bins: [K * L, w] int32 coordinates in [0, input_dim); w a power of two in
  [2, 256] (e.g. the blocks of concatenated random permutations).
codes: [n, L] int32 bucket ids in [0, 2^min(K log2(w), bucket_bits)).
num_bits: K, hash functions per table (K log2(w) <= 64).
bucket_bits: cap on the bits of a bucket id, in [1, 24].
seed: seed of the densification probes.

Raises InvalidArgument for wrong ranks, a bin coordinate out of range, a bad
bin size, NaN/inf values or attributes out of range.
)doc");

REGISTER_OP("Xmc>LshDwtaHashSparse")
    .Input("indices: int32")
    .Input("weights: float")
    .Input("bins: int32")
    .Output("codes: int32")
    .Attr("num_features: int >= 1")
    .Attr("num_bits: int >= 1")
    .Attr("bucket_bits: int = 16")
    .Attr("seed: int = 0")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle rows, bins;
      TF_RETURN_IF_ERROR(SparseRows(c, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &bins));
      DimensionHandle L;
      TF_RETURN_IF_ERROR(TablesDim(c, c->Dim(bins, 0), &L));
      c->set_output(0, c->Matrix(c->Dim(rows, 0), L));
      return absl::OkStatus();
    })
    .Doc(R"doc(
DWTA bucket ids of uniform-sparse vectors (num_features coordinates).

Visits only the row's non-zero entries (duplicates summed) and, through an
inverse map coordinate -> (bin, position) built per call, only the bins
containing them: O(s K L w / num_features) per row.  The map covers only
the coordinates the bins hold: an array over [0, max(bins)] (O(K L w +
max(bins)) per call) when that range is at most max(2^22, 8 K L w), else the
sorted distinct bin coordinates with a binary search per entry; its memory
never grows with num_features.  Identical to Xmc>LshDwtaHash on the
densified rows.

indices: [n, s] int32 in [0, num_features).
weights: [n, s] float32, finite (duplicate sums too, as Xmc>LshSimHashSparse).
bins: [K * L, w] int32 in [0, num_features).
codes: [n, L] int32.
num_features: the input dimension e, in [1, 2^31 - 1] (int32 coordinates).

Raises InvalidArgument as Xmc>LshDwtaHash, and for an index out of range,
num_features out of range, or duplicate weights whose float32 sum overflows.
)doc");

REGISTER_OP("Xmc>LshBuildTables")
    .Input("codes: int32")
    .Output("offsets: int32")
    .Output("labels: int32")
    .Attr("num_buckets: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle codes;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &codes));
      int64_t B;
      TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &B));
      // Before B + 1 (which would overflow for B near 2^63).
      if (B < 1 || B > lsh::kMaxNumBuckets) {
        return errors::InvalidArgument(
            "num_buckets must be in [1, 2^24] (bucket ids of at most 24 "
            "bits), got ", B);
      }
      c->set_output(0, c->Matrix(c->Dim(codes, 1), B + 1));
      c->set_output(1, c->Matrix(c->Dim(codes, 1), c->Dim(codes, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Builds L hash tables (CSR buckets) from the bucket ids of m labels.

LNS Sec. 1.2 "pre-processing phase": every label is inserted into its bucket
of every table.  Counting sort per table, O(m + B) time, tables in parallel.
The labels of bucket c of table l are labels[l, offsets[l, c]:offsets[l,
c + 1]] in increasing order.

codes: [m, L] int32 bucket ids in [0, num_buckets) (Xmc>LshSimHash etc.).
offsets: [L, num_buckets + 1] int32, offsets[l, 0] = 0, offsets[l, B] = m.
labels: [L, m] int32 label ids, a permutation of [0, m) per table.
num_buckets: B, in [1, 2^24] (bucket ids have at most 24 bits).

Raises InvalidArgument when codes is not a matrix, a code is out of range,
m does not fit int32, or num_buckets is out of range (the shape function
rejects it too, so a graph fails when it is built).
)doc");

REGISTER_OP("Xmc>LshUpdateTables")
    .Input("offsets: int32")
    .Input("labels: int32")
    .Input("codes: int32")
    .Input("rows: int32")
    .Input("row_codes: int32")
    .Output("new_offsets: int32")
    .Output("new_labels: int32")
    .Output("new_codes: int32")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle offsets, labels, codes, rows, row_codes;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &offsets));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &labels));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &codes));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 1, &rows));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 2, &row_codes));
      c->set_output(0, offsets);
      c->set_output(1, labels);
      c->set_output(2, codes);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Re-hashes some labels: moves them to the buckets of their new codes.

LNS Sec. 1.2 "update phase" / Sec. 2: after a training step only the changed
label rows are re-inserted.  The result is identical to Xmc>LshBuildTables on
the updated codes (labels stay sorted within buckets).  Per table: O(B)
for the offsets, O(r log r) for the r moved labels, and a block copy of the
unchanged runs of labels; the op is functional, so it writes a new [L, m]
label array (O(L m) memory traffic, but no hashing).  Tables without a
moved label are copied.  A row listed twice takes its last row_codes.

offsets, labels, codes: the current tables and codes (Xmc>LshBuildTables):
  offsets [L, B + 1] non-decreasing from 0 to m per table; labels [L, m], a
  permutation of [0, m) per table (every label once in every table); codes
  [m, L], every entry in [0, B).
rows: [r] int32 label ids in [0, m).
row_codes: [r, L] int32 new bucket ids in [0, B).
new_offsets, new_labels, new_codes: the updated tables and codes.

Every input is validated in O(input) passes (the L m labels and m L codes
once each, besides the copy), so invalid tables are never propagated.

Raises InvalidArgument for inconsistent shapes, a row, row code or code out
of range, malformed offsets, a label id out of [0, m) or repeated within a
table (labels[l] not a permutation), or tables that do not match `codes` (a
re-hashed label missing from the bucket its old code names).
)doc");

REGISTER_OP("Xmc>LshQuery")
    .Input("offsets: int32")
    .Input("labels: int32")
    .Input("codes: int32")
    .Input("query_codes: int32")
    .Input("step: int64")
    .Output("ids: int32")
    .Output("valid: bool")
    .Output("collisions: int32")
    .Output("rate: float")
    .Output("probed: int64")
    .Attr("num_candidates: int >= 1")
    .Attr("seed: int = 0")
    .Attr("count_collisions: bool = true")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle offsets, labels, codes, query, step;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 2, &offsets));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, &labels));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 2, &codes));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 3, &query));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(4), 0, &step));
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(
          c->Merge(c->Dim(query, 2), c->Dim(offsets, 0), &unused));
      int64_t k;
      TF_RETURN_IF_ERROR(c->GetAttr("num_candidates", &k));
      if (k < 1 || k > (int64_t{1} << 24)) {
        return errors::InvalidArgument(
            "num_candidates must be in [1, 2^24], got ", k);
      }
      ShapeHandle out = c->Matrix(c->Dim(query, 0), k);
      c->set_output(0, out);
      c->set_output(1, out);
      c->set_output(2, out);
      c->set_output(3, c->Vector(c->Dim(query, 0)));
      c->set_output(4, c->Vector(c->Dim(query, 0)));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Fixed-size LSH candidate lists: the union of the probed buckets, subsampled.

LNS Sec. 2 / Algorithm 1 lines 6-10: instance i probes, for each of its q
queries (its embedding, or its positive labels) and each table l, the bucket
query_codes[i, q', l] (-1 = no probe).  Let T be the number of entries in
the probed buckets (probed[i]; a label in several buckets counts several
times).  If T <= num_candidates, every entry is read (the exact LSH union,
sampling rate r = 1); otherwise num_candidates distinct entries are drawn
uniformly without replacement (Floyd's algorithm, keyed by (seed, step, i):
stateless, reproducible), r = num_candidates / T.  The labels read are
de-duplicated and written first (valid = true), in increasing entry order;
the rest is padding (id 0, valid = false).  The cost per instance is
O(q L + k log k) (+ O(k q L) with count_collisions), independent of m: no
bucket is scanned.

Inclusion probability: a label that collides with query q' in table l with
probability a_l = alpha^K is read from that bucket with probability r, so,
treating tables (and queries) as independent, it is among the candidates
with probability 1 - prod_{q'} (1 - r alpha_{q'}^K)^L; for r = 1 this is the
paper's 1 - (1 - alpha^K)^L (Sec. 1.3).  `rate` returns r for that formula.

offsets: [L, B + 1] int32, labels: [L, m] int32 (Xmc>LshBuildTables).
codes: [m, L] int32 codes of the labels (for the collision counts).
query_codes: [batch, q, L] int32, -1 or in [0, B).
step: int64 scalar keying the random draws.
ids: [batch, num_candidates] int32 label ids.
valid: [batch, num_candidates] bool, false for padding.
collisions: [batch, num_candidates] int32, the number of (query, table)
  pairs whose probed bucket holds the candidate (0 for padding, and
  everywhere without count_collisions).
rate: [batch] float32, r = min(1, num_candidates / T).
probed: [batch] int64, T.
num_candidates: k, in [1, 2^24].
seed: seed of the draws.
count_collisions: compute `collisions` (O(k q L) per instance).

Raises InvalidArgument for inconsistent shapes, a query code out of range, a
non-scalar step, num_candidates out of range, or (checked on the entries
read, so that the cost stays independent of m) malformed tables: an offset
of a probed bucket or a label id read out of range, or, with
count_collisions, a code of a candidate (codes[id, l]) not in [0, B).
)doc");

REGISTER_OP("Xmc>LshSparseCosine")
    .Input("a_indices: int32")
    .Input("a_weights: float")
    .Input("b_indices: int32")
    .Input("b_weights: float")
    .Output("cosines: float")
    .Attr("num_features: int >= 1")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle ai, aw, bi, bw, a, b;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &ai));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 3, &aw));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(2), 3, &bi));
      TF_RETURN_IF_ERROR(c->WithRank(c->input(3), 3, &bw));
      TF_RETURN_IF_ERROR(c->Merge(ai, aw, &a));
      TF_RETURN_IF_ERROR(c->Merge(bi, bw, &b));
      DimensionHandle batch;
      TF_RETURN_IF_ERROR(c->Merge(c->Dim(a, 0), c->Dim(b, 0), &batch));
      c->set_output(0, c->MakeShape({batch, c->Dim(a, 1), c->Dim(b, 1)}));
      return absl::OkStatus();
    })
    .Doc(R"doc(
Cosines between two batches of uniform-sparse vectors: a x b per instance.

cosines[i, j, p] = cos(a_ij, b_ip), where a_ij is a_weights[i, j, :] at the
coordinates a_indices[i, j, :] of a num_features-dimensional space
(duplicates summed in float64), likewise b_ip; dot products and norms in
float64 too (no float32 weight can overflow them); 0 when a vector is zero.
With the gathered rows of a uniform-sparse head (candidates as a, positive
labels as b) this gives the SimHash collision probability 1 - acos(cos) / pi
of LSH-label candidates (LNS Theorem 1) without densifying the head.
O(n (s_a k + s_b)) per instance plus the sort of the k rows of a.  The
scratch memory is num_features doubles per thread up to 2^22 features, and
above O(k s_a) (the distinct coordinates of an instance's a rows, searched
by bisection, adding a log factor).

a_indices: [batch, k, s_a] int32 in [0, num_features).
a_weights: [batch, k, s_a] float32, finite.
b_indices: [batch, n, s_b] int32 in [0, num_features).
b_weights: [batch, n, s_b] float32, finite.
cosines: [batch, k, n] float32.
num_features: the dimension e, in [1, 2^31 - 1] (int32 coordinates).

Raises InvalidArgument for wrong ranks or shapes, an index out of range, a
NaN/inf weight, or num_features out of range.
)doc");

}  // namespace xmc_tf
