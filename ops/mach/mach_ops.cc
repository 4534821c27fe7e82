// Op registration of the MACH op family (Medini et al., "Extreme
// Classification in Log Memory using Count-Min Sketch", NeurIPS 2019).
#include <cstdint>
#include <string>
#include <vector>

#include "ops/common/shape_fns.h"
#include "ops/mach/mach_kernels.h"
#include "tensorflow/core/framework/common_shape_fns.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace xmc_tf {

namespace errors = ::tensorflow::errors;

REGISTER_OP("Xmc>MachTopK")
    .Input("probs: float")
    .Output("top_ids: int32")
    .Output("top_scores: float")
    .Attr("k: int >= 1")
    .Attr("num_labels: int >= 1")
    .Attr("num_buckets: int >= 1")
    .Attr("hash_a: list(int) >= 1")
    .Attr("hash_b: list(int) >= 1")
    .Attr("prime: int = 2147483647")
    .Attr("method: {'threshold', 'brute_force'} = 'threshold'")
    .Attr("brute_force_fallback: bool = true")
    .SetShapeFn([](InferenceContext* c) -> absl::Status {
      ShapeHandle probs;
      TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, &probs));
      int64_t k, num_labels, num_buckets, prime;
      std::vector<int64_t> hash_a, hash_b;
      TF_RETURN_IF_ERROR(c->GetAttr("k", &k));
      TF_RETURN_IF_ERROR(c->GetAttr("num_labels", &num_labels));
      TF_RETURN_IF_ERROR(c->GetAttr("num_buckets", &num_buckets));
      TF_RETURN_IF_ERROR(c->GetAttr("hash_a", &hash_a));
      TF_RETURN_IF_ERROR(c->GetAttr("hash_b", &hash_b));
      TF_RETURN_IF_ERROR(c->GetAttr("prime", &prime));
      const std::string err = mach::ValidateHashParams(
          hash_a, hash_b, prime, num_labels, num_buckets);
      if (!err.empty()) return errors::InvalidArgument(err);
      if (k > num_labels) {
        return errors::InvalidArgument("k must be in [1, num_labels=",
                                       num_labels, "], got ", k);
      }
      DimensionHandle unused;
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(probs, 1),
                                      static_cast<int64_t>(hash_a.size()),
                                      &unused));
      TF_RETURN_IF_ERROR(c->WithValue(c->Dim(probs, 2), num_buckets, &unused));
      ShapeHandle out = c->Matrix(c->Dim(probs, 0), k);
      c->set_output(0, out);
      c->set_output(1, out);
      return absl::OkStatus();
    })
    .Doc(R"doc(
Exact top-k labels of MACH meta-class probabilities (no [batch, m] scores).

MACH (Medini et al., "Extreme Classification in Log Memory using
Count-Min Sketch", NeurIPS 2019, Sec. 3) hashes m labels into B buckets
with R independent 2-universal hash functions
h_r(j) = ((hash_a[r] * j + hash_b[r]) mod prime) mod B (computed in 64-bit
integers) and trains R B-way meta-classifiers.  A label's score is the
paper's estimator (Eq. 2, without its monotone affine map B/(B-1)(x - 1/B)):

    score[i, j] = (sum_{r=0}^{R-1} probs[i, r, h_r(j)]) / R

summed in float in repetition order.  The op returns, per row, the k labels
with the largest scores, best first; ties are broken by the lower label id.

Order of special values: probs must be finite (NaN and +-inf are rejected,
see below).  Finite probabilities can still give infinite scores when a float
partial sum overflows (|probs| near 3.4e38): such a score is +inf or -inf and
ranks as that float does (+inf above every finite score, -inf below; ties
among infinite scores again by the lower label id), in both methods alike.
A NaN score cannot arise: a float sum of finite values saturates at +-inf
and never computes inf - inf.

method="threshold" (default) runs the threshold algorithm (Fagin, Lotem &
Naor, PODS 2001) over per-repetition inverted lists bucket -> labels (CSR,
int32, 4 R (m + B) bytes, built on the first call and cached in the kernel):
buckets of each repetition are visited in decreasing probability order,
every newly seen label is scored exactly with R random accesses, and the scan
stops when (sum_r largest unvisited probability of repetition r) / R is
strictly below the k-th best score.  method="brute_force" scores all m labels
in chunks with a running top-k (O(m R) per row; the reference).  With
brute_force_fallback (default), method="threshold" uses brute force where it
is cheaper: for small label sets (m <= 16 B), and to finish a scan that has
visited more than 2 m label entries (near-uniform rows, where the threshold
never drops), which bounds the worst case at about 3x brute force.  Both are
exact and return bit-identical ids and scores, also when scores overflow
(the threshold scan then stops only by the exact float stopping rule and
skips its double-precision pruning).  Rows are processed in parallel on the
CPU worker thread pool.

probs: [batch, R, B] float32 meta-class probabilities (softmax or sigmoid
  outputs of the R meta-classifiers; any finite values are accepted, e.g.
  logits, and are averaged the same way).
top_ids: [batch, k] int32 label ids in [0, num_labels), best first.
top_scores: [batch, k] float32 scores of top_ids.
k: number of labels returned per row, 1 <= k <= num_labels.
num_labels: number of labels m; 1 <= m <= prime.
num_buckets: number of buckets B per repetition; must equal probs.shape[2].
hash_a: R multipliers of the hash functions, each in [1, prime - 1]; R must
  equal probs.shape[1].
hash_b: R offsets of the hash functions, each in [0, prime - 1].
prime: the hash modulus; a prime in [2, 2^31 - 1] (default the Mersenne prime
  2^31 - 1, which has a division-free fast path).
method: "threshold" or "brute_force".
brute_force_fallback: whether a long threshold scan may switch to brute force
  (the output is the same either way; false is for testing).

Raises InvalidArgument when probs is not rank 3, when probs.shape[1] != R or
probs.shape[2] != num_buckets, when k > num_labels, when the hash parameters
are out of range or prime is not prime, or when probs holds a NaN or an
infinity.
)doc");

}  // namespace xmc_tf
