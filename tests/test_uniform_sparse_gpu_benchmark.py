"""benchmarks/uniform_sparse_gpu.py without a GPU: the problem set and the
cuSPARSE baseline's matrix (built here with NumPy/SciPy), checked against a
dense NumPy equivalent of the uniform-sparse layer.  The timings themselves
need a GPU (tests/gpu/run_gpu_checks.sh)."""

import numpy as np
import pytest
import scipy.sparse

from repo_module import load_repo_module

bench = load_repo_module("benchmarks/uniform_sparse_gpu.py",
                         "uniform_sparse_gpu")


def dense_weights(indices, weights, num_features):
    """[m, e] dense equivalent: W[j, indices[j, k]] += weights[j, k]."""
    m, s = indices.shape
    w = np.zeros((m, num_features), np.float64)
    np.add.at(w, (np.repeat(np.arange(m), s), indices.ravel()),
              weights.ravel().astype(np.float64))
    return w


def test_default_problem_set_is_issue_33s():
    args = bench.parse_args([])
    assert not args.quick and not args.no_cusparse
    assert bench.problem_shapes(bench.FULL) == [(670_000, 32),
                                               (2_800_000, 96)]
    assert bench.FULL["batches"] == [32, 256]


def test_problem_shapes_cross_product_when_overridden():
    assert bench.problem_shapes(bench.FULL, num_labels=[10, 20]) == [
        (10, 32), (10, 96), (20, 32), (20, 96)]
    assert bench.problem_shapes(bench.FULL, num_labels=[10],
                                fan_ins=[4]) == [(10, 4)]
    assert bench.problem_shapes(bench.FULL, fan_ins=[8]) == [
        (670_000, 8), (2_800_000, 8)]


@pytest.mark.parametrize("m,e,s,b", [(7, 5, 3, 2), (50, 16, 8, 4),
                                     (33, 4, 6, 3)])
def test_csr_parts_is_the_layers_matrix(m, e, s, b):
    rng = np.random.default_rng(m * 100 + s)
    # e < s in the last case forces duplicate connections within a row.
    indices = rng.integers(0, e, size=(m, s)).astype(np.int32)
    weights = rng.standard_normal((m, s)).astype(np.float32)
    data, cols, offsets = bench.csr_parts(np, indices, weights)
    assert data.dtype == np.float32 and cols.dtype == np.int32
    assert offsets.dtype == np.int32 and offsets.shape == (m + 1,)
    assert offsets[-1] == m * s
    rows = cols.reshape(m, s)
    assert (np.diff(rows, axis=1) >= 0).all()  # sorted within each row
    # The same (column, weight) pairs per row, only reordered.
    for j in range(m):
        assert sorted(zip(rows[j], data.reshape(m, s)[j])) == sorted(
            zip(indices[j], weights[j]))
    csr = scipy.sparse.csr_matrix((data, cols, offsets), shape=(m, e))
    reference = dense_weights(indices, weights, e)
    features = rng.standard_normal((b, e))
    backward = rng.standard_normal((b, m))
    # What the baseline computes: forward W @ x.T, features gradient
    # W.T @ backward.T (duplicates summed, as the kernels do).
    np.testing.assert_allclose(csr @ features.T, reference @ features.T,
                               rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(csr.T @ backward.T, reference.T @ backward.T,
                               rtol=1e-6, atol=1e-6)


def test_csr_parts_rejects_int32_overflow():
    indices = np.zeros((1, 1), np.int32)

    class Huge:  # only the shape is read before the check
        shape = (2**26, 32)

    with pytest.raises(ValueError, match="int32"):
        bench.csr_parts(np, Huge(), indices)
