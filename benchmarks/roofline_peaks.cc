// Peak loops of benchmarks/roofline.py (compiled at run time with
// g++ -O3 -march=native, loaded with ctypes).  Each function runs its loop on
// `threads` std::threads, each on its own slice of the work, and returns the
// wall seconds from before the first thread starts to after the last one
// joins.  No TensorFlow, no libraries: what the cores and the memory of this
// machine do at best on the four access patterns the training step is made
// of.
//
//  * xr_fma: `iters` iterations of 16 independent 16-wide float FMA chains
//    per thread (512 flops per iteration per thread; vector extension, so
//    AVX-512 zmm FMAs with -march=native on an AVX-512 CPU).
//  * xr_copy: memcpy of n floats, split over the threads (8 bytes moved per
//    float: read + write).
//  * xr_read: sum of n floats (4 bytes read per float).
//  * xr_add: a[i] += b[i] over n floats (12 bytes per float: two reads, one
//    write; the access mix of an optimizer update).
//  * xr_row_gather: acc[0:width] += w[p] * table[idx[p], 0:width] for p <
//    n, the threads splitting p (a random row of a cache-resident table per
//    step: the inner loop of a uniform-sparse kernel), accumulators in
//    registers.
//  * xr_element_gather: sum of table[idx[p]] for p < n, the threads
//    splitting p (random floats of a table larger than the caches).

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>
#include <vector>

typedef float v16 __attribute__((vector_size(64)));

namespace {

template <typename Work>
double Run(int threads, Work work) {
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (auto& th : pool) th.join();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
      .count();
}

}  // namespace

extern "C" {

double xr_fma(int threads, int64_t iters, float* sink) {
  return Run(threads, [=](int t) {
    v16 a[16];
    v16 x, y;
    for (int l = 0; l < 16; ++l) {
      x[l] = 0.999999f;
      y[l] = 1e-7f * static_cast<float>(t + 1);
    }
    for (int k = 0; k < 16; ++k) a[k] = x * static_cast<float>(k);
    for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
      for (int k = 0; k < 16; ++k) a[k] = a[k] * x + y;
    }
    v16 s = a[0];
    for (int k = 1; k < 16; ++k) s += a[k];
    float total = 0.0f;
    for (int l = 0; l < 16; ++l) total += s[l];
    sink[t] = total;
  });
}

double xr_copy(int threads, const float* src, float* dst, int64_t n) {
  return Run(threads, [=](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    std::memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
  });
}

}  // extern "C"

// Register accumulators: V vectors of 16 floats per row (width = 16 V), four
// independent sums (rows p, p+1, p+2, p+3 go to different ones) so that
// neither an FMA latency chain nor a store-to-load round trip limits the
// loop: what is left is the loads (the gathered rows) and the FMAs.
template <int V>
void RowGather(const float* table, const int32_t* idx, const float* w,
               int64_t lo, int64_t hi, float* sink) {
  v16 acc[4][V];
  for (int u = 0; u < 4; ++u)
    for (int v = 0; v < V; ++v) acc[u][v] = v16{} * 0.0f;
  int64_t p = lo;
  for (; p + 4 <= hi; p += 4) {
#pragma GCC unroll 4
    for (int u = 0; u < 4; ++u) {
      const v16* row = reinterpret_cast<const v16*>(
          table + static_cast<int64_t>(idx[p + u]) * (16 * V));
      const float wv = w[p + u];
#pragma GCC unroll 8
      for (int v = 0; v < V; ++v) {
        v16 r;
        std::memcpy(&r, row + v, sizeof(r));
        acc[u][v] += wv * r;
      }
    }
  }
  for (; p < hi; ++p) {
    const float* row = table + static_cast<int64_t>(idx[p]) * (16 * V);
    for (int v = 0; v < V; ++v) {
      v16 r;
      std::memcpy(&r, row + 16 * v, sizeof(r));
      acc[0][v] += w[p] * r;
    }
  }
  float total = 0.0f;
  for (int u = 0; u < 4; ++u)
    for (int v = 0; v < V; ++v)
      for (int l = 0; l < 16; ++l) total += acc[u][v][l];
  *sink = total;
}

extern "C" {

double xr_read(int threads, const float* a, int64_t n, float* sink) {
  return Run(threads, [=](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    v16 acc[4] = {v16{}, v16{}, v16{}, v16{}};
    int64_t i = lo;
    for (; i + 64 <= hi; i += 64) {
      for (int u = 0; u < 4; ++u) {
        v16 r;
        std::memcpy(&r, a + i + 16 * u, sizeof(r));
        acc[u] += r;
      }
    }
    float total = 0.0f;
    for (; i < hi; ++i) total += a[i];
    for (int u = 0; u < 4; ++u)
      for (int l = 0; l < 16; ++l) total += acc[u][l];
    sink[t] = total;
  });
}

double xr_add(int threads, float* a, const float* b, int64_t n) {
  return Run(threads, [=](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    for (int64_t i = lo; i < hi; ++i) a[i] += b[i];
  });
}

// width: floats per row, a multiple of 16 in [16, 128].  Returns -1 for
// another width.
double xr_row_gather(int threads, const float* table, int64_t width,
                     const int32_t* idx, const float* w, int64_t n,
                     float* sink) {
  if (width % 16 != 0 || width < 16 || width > 128) return -1.0;
  return Run(threads, [=](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    switch (width / 16) {
      case 1: RowGather<1>(table, idx, w, lo, hi, sink + t); break;
      case 2: RowGather<2>(table, idx, w, lo, hi, sink + t); break;
      case 3: RowGather<3>(table, idx, w, lo, hi, sink + t); break;
      case 4: RowGather<4>(table, idx, w, lo, hi, sink + t); break;
      case 5: RowGather<5>(table, idx, w, lo, hi, sink + t); break;
      case 6: RowGather<6>(table, idx, w, lo, hi, sink + t); break;
      case 7: RowGather<7>(table, idx, w, lo, hi, sink + t); break;
      default: RowGather<8>(table, idx, w, lo, hi, sink + t); break;
    }
  });
}

double xr_element_gather(int threads, const float* table, const int32_t* idx,
                         int64_t n, float* sink) {
  return Run(threads, [=](int t) {
    const int64_t lo = n * t / threads, hi = n * (t + 1) / threads;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t p = lo;
    for (; p + 8 <= hi; p += 8) {
      for (int l = 0; l < 8; ++l) acc[l] += table[idx[p + l]];
    }
    for (; p < hi; ++p) acc[0] += table[idx[p]];
    float total = 0.0f;
    for (int l = 0; l < 8; ++l) total += acc[l];
    sink[t] = total;
  });
}

}  // extern "C"
