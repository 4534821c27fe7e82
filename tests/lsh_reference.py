"""NumPy references of the LSH ops (ops/lsh/lsh_kernels.h layouts), shared
by tests/test_lsh_op.py and the fuzz targets of tests/fuzz/op_fuzz.py."""

import numpy as np

M64 = (1 << 64) - 1


def mix64(x):
    """splitmix64 finaliser (ops/lsh/lsh_kernels.h Mix64), Python ints."""
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fold(raw, table, code_bits, bucket_bits):
    if code_bits <= bucket_bits:
        return raw
    return mix64(raw ^ mix64(table + 1)) >> (64 - bucket_bits)


def ref_codes_from_values(values, K, bits, bucket_bits):
    """Concatenate K values of `bits` bits per table, fold as the op."""
    n, H = values.shape
    L = H // K
    out = np.zeros((n, L), np.int64)
    for i in range(n):
        for l in range(L):
            raw = 0
            for k in range(K):
                raw |= int(values[i, l * K + k]) << (k * bits)
            out[i, l] = fold(raw, l, K * bits, bucket_bits)
    return out


def ref_dwta_values(x, bins, seed):
    """Per-function DWTA values [n, H] with the documented densification."""
    n = x.shape[0]
    H, w = bins.shape
    seed_mix = mix64((seed & M64) ^ 0x4457544148415348)
    out = np.zeros((n, H), np.int64)
    for i in range(n):
        pos = np.full(H, -1)
        for j in range(H):
            best = None
            for p in range(w):
                v = x[i, bins[j, p]]
                if v != 0 and (best is None or v > best):
                    best, pos[j] = v, p
        if (pos < 0).all():
            continue
        for j in range(H):
            if pos[j] >= 0:
                out[i, j] = pos[j]
                continue
            donor = None
            for t in range(1, 33):
                c = mix64((seed_mix + (j << 32) + t) & M64) % H
                if pos[c] >= 0:
                    donor = c
                    break
            if donor is None:
                donor = next((j + t) % H for t in range(1, H)
                             if pos[(j + t) % H] >= 0)
            out[i, j] = pos[donor]
    return out


def ref_tables(codes, B):
    codes = np.asarray(codes)
    m, L = codes.shape
    offsets = np.zeros((L, B + 1), np.int32)
    labels = np.zeros((L, m), np.int32)
    for l in range(L):
        order = np.argsort(codes[:, l], kind="stable")
        labels[l] = order
        offsets[l, 1:] = np.cumsum(np.bincount(codes[:, l], minlength=B))
    return offsets, labels
