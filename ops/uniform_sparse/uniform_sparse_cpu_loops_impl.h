// The CPU hot loops of the uniform-sparse kernels, for ONE instruction set.
//
// No include guard on purpose: uniform_sparse_cpu_loops.h includes this file
// three times, inside namespaces avx512 / avx2 / base and `#pragma GCC
// target` regions, with XMC_CPU_LANES (floats per vector register: 16, 8,
// 4) and kMaxVC (vectors per accumulator set: as many as the registers hold
// without spilling) defined.  Every function defined here is compiled for
// the region's instruction set; include nothing here (the AVX2 and AVX-512
// variants, XMC_CPU_LANES 8 and 16, may use the <immintrin.h> intrinsics
// that uniform_sparse_cpu_loops.h includes).
//
// The batch axis is padded to `bp`, a multiple of 16 (so of every
// XMC_CPU_LANES), padding entries zero.

typedef float VF __attribute__((vector_size(4 * XMC_CPU_LANES)));
typedef int32_t VI __attribute__((vector_size(4 * XMC_CPU_LANES)));
constexpr int kLanes = XMC_CPU_LANES;

inline VF Load(const float* p) {
  VF r;
  __builtin_memcpy(&r, p, sizeof(r));
  return r;
}
inline void Store(float* p, VF v) { __builtin_memcpy(p, &v, sizeof(v)); }

// ---------------------------------------------------------------------------
// Forward.

// out[0:kLanes VC] = sum_k wj[k] * featT[ij[k] * bp + off : ... + kLanes VC]:
// four independent partial sums over k (no FMA latency chain).
template <int VC>
inline void ForwardChunk(const float* featT, int64_t bp, const int32_t* ij,
                         const float* wj, int64_t fan_in, int64_t off,
                         float* out) {
  VF a[4][VC];
  for (int u = 0; u < 4; ++u)
    for (int v = 0; v < VC; ++v) a[u][v] = VF{};
  int64_t k = 0;
  for (; k + 4 <= fan_in; k += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const float* r = featT + static_cast<int64_t>(ij[k + u]) * bp + off;
      const float wv = wj[k + u];
#pragma GCC unroll 4
      for (int v = 0; v < VC; ++v) a[u][v] += wv * Load(r + kLanes * v);
    }
  }
  for (; k < fan_in; ++k) {
    const float* r = featT + static_cast<int64_t>(ij[k]) * bp + off;
    const float wv = wj[k];
    for (int v = 0; v < VC; ++v) a[0][v] += wv * Load(r + kLanes * v);
  }
  for (int v = 0; v < VC; ++v) {
    Store(out + kLanes * v, (a[0][v] + a[1][v]) + (a[2][v] + a[3][v]));
  }
}

// acc[t, 0:bp] = sum_k w[t, k] * featT[idx[t, k], 0:bp] for t < n.
inline void ForwardLabels(const float* featT, int64_t bp, const int32_t* idx,
                          const float* w, int64_t n, int64_t fan_in,
                          float* acc) {
  for (int64_t t = 0; t < n; ++t) {
    const int32_t* ij = idx + t * fan_in;
    const float* wj = w + t * fan_in;
    float* out = acc + t * bp;
    int64_t off = 0;
    for (; off + kLanes * kMaxVC <= bp; off += kLanes * kMaxVC) {
      ForwardChunk<kMaxVC>(featT, bp, ij, wj, fan_in, off, out + off);
    }
    for (; off < bp; off += kLanes) {
      ForwardChunk<1>(featT, bp, ij, wj, fan_in, off, out + off);
    }
  }
}

// ---------------------------------------------------------------------------
// Gradient w.r.t. weights, dense columns.

// One level of the reduction tree: the vectors of each pair exchange halves
// of their blocks and add (n vectors in, n / 2 out).
#if !defined(__clang__)
inline void ReduceLevel(VF* cur, int n, VI lo, VI hi) {
  for (int i = 0; i < n / 2; ++i) {
    cur[i] = __builtin_shuffle(cur[2 * i], cur[2 * i + 1], lo) +
             __builtin_shuffle(cur[2 * i], cur[2 * i + 1], hi);
  }
}
#endif

// r[q] = sum of the lanes of p[q], q < kLanes.
inline VF ReduceLanes(const VF* p) {
#if defined(__clang__)  // no __builtin_shuffle: lane by lane
  VF r = VF{};
  for (int q = 0; q < kLanes; ++q) {
    float t = 0.0f;
    for (int l = 0; l < kLanes; ++l) t += p[q][l];
    r[q] = t;
  }
  return r;
#else
  VF cur[kLanes];
  for (int q = 0; q < kLanes; ++q) cur[q] = p[q];
#if XMC_CPU_LANES == 16
  const VI lo8 = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const VI hi8 = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const VI lo4 = {0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27};
  const VI hi4 = {4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31};
  const VI lo2 = {0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29};
  const VI hi2 = {2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30, 31};
  const VI lo1 = {0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30};
  const VI hi1 = {1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31};
  ReduceLevel(cur, 16, lo8, hi8);
  ReduceLevel(cur, 8, lo4, hi4);
  ReduceLevel(cur, 4, lo2, hi2);
  ReduceLevel(cur, 2, lo1, hi1);
#elif XMC_CPU_LANES == 8
  const VI lo4 = {0, 1, 2, 3, 8, 9, 10, 11};
  const VI hi4 = {4, 5, 6, 7, 12, 13, 14, 15};
  const VI lo2 = {0, 1, 4, 5, 8, 9, 12, 13};
  const VI hi2 = {2, 3, 6, 7, 10, 11, 14, 15};
  const VI lo1 = {0, 2, 4, 6, 8, 10, 12, 14};
  const VI hi1 = {1, 3, 5, 7, 9, 11, 13, 15};
  ReduceLevel(cur, 8, lo4, hi4);
  ReduceLevel(cur, 4, lo2, hi2);
  ReduceLevel(cur, 2, lo1, hi1);
#elif XMC_CPU_LANES == 4
  const VI lo2 = {0, 1, 4, 5};
  const VI hi2 = {2, 3, 6, 7};
  const VI lo1 = {0, 2, 4, 6};
  const VI hi1 = {1, 3, 5, 7};
  ReduceLevel(cur, 4, lo2, hi2);
  ReduceLevel(cur, 2, lo1, hi1);
#else
#error "XMC_CPU_LANES must be 4, 8 or 16"
#endif
  return cur[0];
#endif  // __clang__
}

// p[q] += sum_v col[off + kLanes v : ...] * featT[ij[q] * bp + off + kLanes v
// : ...] for q < nk (<= kLanes).
template <int VC>
inline void DotConnections(VF* p, const float* featT, int64_t bp, int64_t off,
                           const float* col, const int32_t* ij, int64_t nk) {
  VF c[VC];
  for (int v = 0; v < VC; ++v) c[v] = Load(col + off + kLanes * v);
#pragma GCC unroll 16
  for (int q = 0; q < kLanes; ++q) {
    if (q < nk) {
      const float* r = featT + static_cast<int64_t>(ij[q]) * bp + off;
#pragma GCC unroll 4
      for (int v = 0; v < VC; ++v) p[q] += c[v] * Load(r + kLanes * v);
    }
  }
}

// gj[k] = sum_{i < bp} col[i] * featT[ij[k], i] for k < fan_in, kLanes
// connections at a time (plain products: a zero col[i] against an inf/NaN
// feature gives NaN; the caller recomputes non-finite results).
inline void GradWeightsDense(const float* featT, int64_t bp, const float* col,
                             const int32_t* ij, int64_t fan_in, float* gj) {
  for (int64_t k0 = 0; k0 < fan_in; k0 += kLanes) {
    const int64_t nk = fan_in - k0 < kLanes ? fan_in - k0 : kLanes;
    VF p[kLanes];
    for (int q = 0; q < kLanes; ++q) p[q] = VF{};
    int64_t off = 0;
    for (; off + kLanes * kMaxVC <= bp; off += kLanes * kMaxVC) {
      DotConnections<kMaxVC>(p, featT, bp, off, col, ij + k0, nk);
    }
    for (; off < bp; off += kLanes) {
      DotConnections<1>(p, featT, bp, off, col, ij + k0, nk);
    }
    const VF sums = ReduceLanes(p);
    for (int64_t q = 0; q < nk; ++q) gj[k0 + q] = sums[q];
  }
}

// ---------------------------------------------------------------------------
// Gradient w.r.t. features: scatter of one label's connections.

template <int VC>
inline void ScatterChunk(float* gT, int64_t bp, int64_t off, const float* col,
                         const int32_t* ij, const float* wj, int64_t fan_in) {
  VF c[VC];
  for (int v = 0; v < VC; ++v) c[v] = Load(col + off + kLanes * v);
  for (int64_t k = 0; k < fan_in; ++k) {
    // In order: two connections of one label may share a source.
    float* r = gT + static_cast<int64_t>(ij[k]) * bp + off;
    const float wv = wj[k];
#pragma GCC unroll 4
    for (int v = 0; v < VC; ++v) {
      Store(r + kLanes * v, Load(r + kLanes * v) + wv * c[v]);
    }
  }
}

// gT[ij[k], 0:bp] += wj[k] * col[0:bp] for k < fan_in (plain products: the
// caller takes another path for a label with a non-finite weight, where a
// zero col[i] must contribute exactly 0).
inline void GradFeaturesScatter(float* gT, int64_t bp, const float* col,
                                const int32_t* ij, const float* wj,
                                int64_t fan_in) {
  int64_t off = 0;
  for (; off + kLanes * kMaxVC <= bp; off += kLanes * kMaxVC) {
    ScatterChunk<kMaxVC>(gT, bp, off, col, ij, wj, fan_in);
  }
  for (; off < bp; off += kLanes) ScatterChunk<1>(gT, bp, off, col, ij, wj, fan_in);
}

// ---------------------------------------------------------------------------
// Both gradients from one instance's sparse signal (instance-major).

// out[k] += g * x[ij[k]] for k < n (8-wide hardware gathers on AVX2 and
// AVX-512 CPUs).
inline void GatherAxpy(float g, const float* x, const int32_t* ij, int64_t n,
                       float* out) {
  int64_t k = 0;
#if XMC_CPU_LANES == 16 || XMC_CPU_LANES == 8
  const __m256 gv = _mm256_set1_ps(g);
  for (; k + 8 <= n; k += 8) {
    const __m256i iv =
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ij + k));
    _mm256_storeu_ps(out + k,
                     _mm256_fmadd_ps(gv, _mm256_i32gather_ps(x, iv, 4),
                                     _mm256_loadu_ps(out + k)));
  }
#endif
  for (; k < n; ++k) out[k] += g * x[ij[k]];
}

// out[ij[k]] += g * w[k] for k < n, in order of k (two connections of one
// label may share a source).
inline void ScatterAxpy(float g, const float* w, const int32_t* ij, int64_t n,
                        float* out) {
  for (int64_t k = 0; k < n; ++k) out[ij[k]] += g * w[k];
}

#if XMC_CPU_LANES == 8
// kCompress8[mask]: the lanes set in the 8-bit mask, in increasing order,
// then zeros (a permutation for _mm256_permutevar8x32_epi32).
struct Compress8Table {
  int32_t lanes[256][8];
  constexpr Compress8Table() : lanes() {
    for (int m = 0; m < 256; ++m) {
      int c = 0;
      for (int l = 0; l < 8; ++l) {
        if (m & (1 << l)) lanes[m][c++] = l;
      }
    }
  }
};
inline constexpr Compress8Table kCompress8{};
#endif

// The non-zero entries of sig[0:n] (+0 and -0 count as zero), in order:
// their positions t into pos and values into val; returns their number.
// pos and val must have room for n rounded up to a multiple of 16 (whole
// vectors are stored).  Runs of 16 are tested with one vector compare and
// written without a branch per entry (AVX-512: vpcompressd; AVX2: a
// permutation from a table).
inline int64_t NonZeros(const float* sig, int64_t n, int32_t* pos,
                        float* val) {
  int64_t count = 0;
  int64_t t0 = 0;
#if XMC_CPU_LANES == 16
  const __m512i step = _mm512_set1_epi32(16);
  __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
                                    13, 14, 15);
  for (; t0 + 16 <= n; t0 += 16) {
    const __m512 v = _mm512_loadu_ps(sig + t0);
    const __mmask16 mask = _mm512_test_epi32_mask(
        _mm512_castps_si512(v), _mm512_set1_epi32(0x7fffffff));
    _mm512_storeu_si512(pos + count, _mm512_maskz_compress_epi32(mask, lanes));
    _mm512_storeu_ps(val + count, _mm512_maskz_compress_ps(mask, v));
    count += __builtin_popcount(mask);
    lanes = _mm512_add_epi32(lanes, step);
  }
#elif XMC_CPU_LANES == 8
  const __m256i step = _mm256_set1_epi32(8);
  const __m256i abs = _mm256_set1_epi32(0x7fffffff);
  __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; t0 + 8 <= n; t0 += 8) {
    const __m256 v = _mm256_loadu_ps(sig + t0);
    const __m256i zero = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_castps_si256(v), abs), _mm256_setzero_si256());
    const uint32_t mask =
        ~static_cast<uint32_t>(_mm256_movemask_ps(_mm256_castsi256_ps(zero))) &
        0xffu;
    const __m256i perm = _mm256_loadu_si256(
        reinterpret_cast<const __m256i*>(kCompress8.lanes[mask]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(pos + count),
                        _mm256_permutevar8x32_epi32(lanes, perm));
    _mm256_storeu_ps(val + count, _mm256_permutevar8x32_ps(v, perm));
    count += __builtin_popcount(mask);
    lanes = _mm256_add_epi32(lanes, step);
  }
#else
  for (; t0 + 16 <= n; t0 += 16) {
    uint32_t any = 0;  // one test for a run of 16 zeros (bits without sign)
    for (int l = 0; l < 16; ++l) {
      uint32_t u;
      __builtin_memcpy(&u, sig + t0 + l, sizeof(u));
      any |= u << 1;
    }
    if (any == 0) continue;
    for (int64_t t = t0; t < t0 + 16; ++t) {
      if (sig[t] != 0.0f) {
        pos[count] = static_cast<int32_t>(t);
        val[count++] = sig[t];
      }
    }
  }
#endif
  for (; t0 < n; ++t0) {
    if (sig[t0] != 0.0f) {
      pos[count] = static_cast<int32_t>(t0);
      val[count++] = sig[t0];
    }
  }
  return count;
}

// For one instance's non-zero signal entries (label pos[q], value val[q],
// q < count, in order; labels relative to idx / w / gw), with label t's
// connections ij = idx + t * fan_in:
//   gw[t * fan_in + k] += val[q] * frow[ij[k]]   (when gw is not null)
//   grow[ij[k]] += val[q] * w[t * fan_in + k]    (when grow is not null)
// for k < fan_in; frow and grow are the instance's features and
// features-gradient rows.  The indices must have been range-checked.
inline void SparseRow(const int32_t* pos, const float* val, int64_t count,
                      const int32_t* idx, const float* w, int64_t fan_in,
                      const float* frow, float* gw, float* grow) {
  for (int64_t q = 0; q < count; ++q) {
    const float g = val[q];
    const int64_t t = pos[q];
    const int32_t* ij = idx + t * fan_in;
    if (gw != nullptr) GatherAxpy(g, frow, ij, fan_in, gw + t * fan_in);
    if (grow != nullptr) ScatterAxpy(g, w + t * fan_in, ij, fan_in, grow);
  }
}
