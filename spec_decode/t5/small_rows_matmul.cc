// out[m, n] = x[m, K] @ w[K, n], float32, for few rows m (a decode step's 1..16 tokens),
// as an XLA FFI handler for XLA:CPU (`SmallRowsMatmul`); and out[m, n] = x[m, K] @ w[n, K]^T
// (`SmallRowsMatmulTransposed`: a tied embedding [V, E] as the output projection).
//
// Contract: x [m, K], w [K, n] row-major (a Dense kernel's [in, out] layout), out [m, n].
// Every output element is out[r, j] = fma(x[r, K-1], w[K-1, j], ... fma(x[r, 0], w[0, j], 0)),
// one fused multiply-add per k in increasing k, whatever m, the row's position among the m
// rows, the column's position in its tile or the thread count: a row of a k-row call is
// bit-identical to the same row computed alone.
//
// Why it is fast at small m: a batch-1 decode step is bound by reading w. Each w element is
// read from memory once and used for all m rows: columns are processed in panels (contiguous
// runs of up to 4 KiB of a w row) and w rows in blocks of kDepth, so a block of w stays in
// L1/L2 while every group of rows multiplies it; the [m, panel] accumulators live in `out`
// itself between blocks and in registers within one. Panels are shared among XLA's intra-op
// threads (the FFI `ThreadPool`), at least one panel per thread.

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

namespace ffi = xla::ffi;

namespace {

// Measured on a 2-core EPYC (scripts/small_rows_matmul_bench.py): panels up to 1024 columns
// (4 KiB of a w row: one page), blocks of 16 w rows, w prefetched one block ahead.
constexpr int64_t kMaxPanel = 1024;
constexpr int64_t kMinPanel = 64;
constexpr int64_t kDepth = 16;

struct Problem {
  const float* x;
  const float* w;
  float* out;
  int64_t m, k, n;
};

// Rows [r0, r0 + R) x columns [c0, c0 + 8 V) of out += x[:, k0:k1] @ w[k0:k1, :].
template <int R, int V>
inline void Tile(const Problem& p, int64_t r0, int64_t c0, int64_t k0, int64_t k1) {
  // Locals, fully unrolled: the accumulators stay in registers (16 ymm: R * V + V + 1 <= 16).
  const int64_t n = p.n;
  const float* __restrict__ w = p.w + c0;
  const float* __restrict__ x[R];
  float* __restrict__ out[R];
  __m256 acc[R][V];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    x[r] = p.x + (r0 + r) * p.k;
    out[r] = p.out + (r0 + r) * n + c0;
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) acc[r][v] = _mm256_loadu_ps(out[r] + 8 * v);
  }
  for (int64_t k = k0; k < k1; ++k) {
    if (r0 == 0) {  // the first row group reads this block of w first: fetch the next one
#pragma GCC unroll 16
      for (int v = 0; v < V; v += 2)
        _mm_prefetch(reinterpret_cast<const char*>(w + (k + kDepth) * n + 8 * v), _MM_HINT_T0);
    }
    __m256 wv[V];
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) wv[v] = _mm256_loadu_ps(w + k * n + 8 * v);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 xr = _mm256_broadcast_ss(x[r] + k);
#pragma GCC unroll 16
      for (int v = 0; v < V; ++v) acc[r][v] = _mm256_fmadd_ps(xr, wv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int v = 0; v < V; ++v) _mm256_storeu_ps(out[r] + 8 * v, acc[r][v]);
}

// Rows [r0, r0 + R), columns [c0, c1) of a panel, w rows [k0, k1): widest tiles first, then
// 8-column tiles, then single columns (scalar fmaf: the same fused operation per element).
template <int R, int V>
inline void RowGroup(const Problem& p, int64_t r0, int64_t c0, int64_t c1, int64_t k0,
                     int64_t k1) {
  int64_t c = c0;
  for (; c + 8 * V <= c1; c += 8 * V) Tile<R, V>(p, r0, c, k0, k1);
  for (; c + 8 <= c1; c += 8) Tile<R, 1>(p, r0, c, k0, k1);
  for (; c < c1; ++c) {
    for (int r = 0; r < R; ++r) {
      float acc = p.out[(r0 + r) * p.n + c];
      for (int64_t k = k0; k < k1; ++k)
        acc = __builtin_fmaf(p.x[(r0 + r) * p.k + k], p.w[k * p.n + c], acc);
      p.out[(r0 + r) * p.n + c] = acc;
    }
  }
}

// Columns [c0, c1) of out, all rows. Row groups of 4 rows x 3 vectors (12 accumulators); 2 or
// 3 rows x 4 vectors. A lone row gets narrow 2-vector tiles: measured faster than 4 or 8
// vectors (at one FMA per w element it waits on memory, and narrow tiles prefetch better).
void Panel(const Problem& p, int64_t c0, int64_t c1) {
  for (int64_t r = 0; r < p.m; ++r) std::fill(p.out + r * p.n + c0, p.out + r * p.n + c1, 0.f);
  for (int64_t k0 = 0; k0 < p.k; k0 += kDepth) {
    const int64_t k1 = std::min(p.k, k0 + kDepth);
    int64_t r = 0;
    for (; r + 4 <= p.m; r += 4) RowGroup<4, 3>(p, r, c0, c1, k0, k1);
    switch (p.m - r) {
      case 3: RowGroup<3, 4>(p, r, c0, c1, k0, k1); break;
      case 2: RowGroup<2, 4>(p, r, c0, c1, k0, k1); break;
      case 1: RowGroup<1, 2>(p, r, c0, c1, k0, k1); break;
      default: break;
    }
  }
}

// The transposed product, out[r, j] = dot(x[r], w[j]) with w [n, K] row-major: each w row is
// contiguous, so it is read once (as 8-float vectors) for every x row of a group. Every output
// element is computed the same way whatever m or the group: 8 lanes accumulate k = l, l + 8,
// ... by fused multiply-adds in increasing k, `HorizontalSum` adds the lanes in a fixed order,
// then the K % 8 tail is added by scalar fmaf in increasing k. So rows are bit-identical
// whatever the row count, as in `SmallRowsMatmul` (the summation order differs from it).
inline float HorizontalSum(__m256 v) {
  const __m128 quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
  return _mm_cvtss_f32(_mm_add_ss(pair, _mm_shuffle_ps(pair, pair, 1)));
}

// Rows [r0, r0 + R) x w rows [j0, j0 + J) of out (R * J + J + 1 <= 16 ymm registers).
template <int R, int J>
inline void TransposedTile(const Problem& p, int64_t r0, int64_t j0) {
  const int64_t k = p.k, vector_end = k / 8 * 8;
  __m256 acc[R][J];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) acc[r][j] = _mm256_setzero_ps();
  for (int64_t c = 0; c < vector_end; c += 8) {
    __m256 wv[J];
#pragma GCC unroll 16
    for (int j = 0; j < J; ++j) wv[j] = _mm256_loadu_ps(p.w + (j0 + j) * k + c);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m256 xv = _mm256_loadu_ps(p.x + (r0 + r) * k + c);
#pragma GCC unroll 16
      for (int j = 0; j < J; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < J; ++j) {
      float sum = HorizontalSum(acc[r][j]);
      for (int64_t c = vector_end; c < k; ++c)
        sum = __builtin_fmaf(p.x[(r0 + r) * k + c], p.w[(j0 + j) * k + c], sum);
      p.out[(r0 + r) * p.n + j0 + j] = sum;
    }
}

// Rows [r0, r0 + R) of out (groups of 4, then 3, 2 or 1) against w rows [j0, j0 + J).
template <int J>
inline void TransposedColumns(const Problem& p, int64_t j0) {
  int64_t r = 0;
  for (; r + 4 <= p.m; r += 4) TransposedTile<4, J>(p, r, j0);
  switch (p.m - r) {
    case 3: TransposedTile<3, J>(p, r, j0); break;
    case 2: TransposedTile<2, J>(p, r, j0); break;
    case 1: TransposedTile<1, J>(p, r, j0); break;
    default: break;
  }
}

// w rows [j0, j1) (out columns), two at a time: both stay in L1 while every row group reads
// them, so w is read from memory once whatever m.
void TransposedPanel(const Problem& p, int64_t j0, int64_t j1) {
  int64_t j = j0;
  for (; j + 2 <= j1; j += 2) TransposedColumns<2>(p, j);
  if (j < j1) TransposedColumns<1>(p, j);
}

// Panels are claimed from a shared counter by the calling thread and by helper tasks on
// XLA's pool. The caller waits only for panels already claimed, which are being computed, so
// a pool that runs tasks late, inline or on one thread cannot deadlock it.
struct Shared {
  Problem p;
  void (*panel_fn)(const Problem&, int64_t, int64_t);  // computes out columns [c0, c1)
  int64_t panel;  // columns per panel
  int64_t num_panels;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};

  void Work() {
    for (int64_t i; (i = next.fetch_add(1)) < num_panels;) {
      panel_fn(p, i * panel, std::min(p.n, (i + 1) * panel));
      done.fetch_add(1, std::memory_order_release);
    }
  }
};

// Out columns [0, n) in panels of at least `min_panel` columns, shared among the pool's threads.
void RunPanels(ffi::ThreadPool& pool, const Problem& problem,
               void (*panel_fn)(const Problem&, int64_t, int64_t), int64_t min_panel,
               int64_t max_panel) {
  auto shared = std::make_shared<Shared>();
  shared->p = problem;
  shared->panel_fn = panel_fn;
  const int64_t n = problem.n, threads = std::max<int64_t>(pool.num_threads(), 1);
  const int64_t per_thread = (n + threads - 1) / threads;
  shared->panel = std::clamp((per_thread + min_panel - 1) / min_panel * min_panel, min_panel,
                             max_panel);
  shared->num_panels = (n + shared->panel - 1) / shared->panel;
  const int64_t helpers = std::min(threads, shared->num_panels) - 1;
  for (int64_t t = 0; t < helpers; ++t) pool.Schedule([shared] { shared->Work(); });
  shared->Work();
  while (shared->done.load(std::memory_order_acquire) < shared->num_panels)
    std::this_thread::yield();
}

ffi::Error SmallRowsMatmulImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                               ffi::Buffer<ffi::F32> w, ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[0])
    return ffi::Error::InvalidArgument("SmallRowsMatmul: expects x [m, K] and w [K, n]");
  RunPanels(pool, Problem{x.typed_data(), w.typed_data(), out->typed_data(), xd[0], xd[1], wd[1]},
            Panel, kMinPanel, kMaxPanel);
  return ffi::Error::Success();
}

// Panels of the transposed product are runs of w rows: 64 rows at least (a panel's work is
// then comparable to the other kernel's), as many as a thread's share otherwise.
ffi::Error SmallRowsMatmulTransposedImpl(ffi::ThreadPool pool, ffi::Buffer<ffi::F32> x,
                                         ffi::Buffer<ffi::F32> w,
                                         ffi::ResultBuffer<ffi::F32> out) {
  const auto xd = x.dimensions(), wd = w.dimensions();
  if (xd.size() != 2 || wd.size() != 2 || xd[1] != wd[1])
    return ffi::Error::InvalidArgument(
        "SmallRowsMatmulTransposed: expects x [m, K] and w [n, K]");
  RunPanels(pool, Problem{x.typed_data(), w.typed_data(), out->typed_data(), xd[0], xd[1], wd[0]},
            TransposedPanel, 64, wd[0]);
  return ffi::Error::Success();
}

}  // namespace

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallRowsMatmul, SmallRowsMatmulImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());

XLA_FFI_DEFINE_HANDLER_SYMBOL(SmallRowsMatmulTransposed, SmallRowsMatmulTransposedImpl,
                              ffi::Ffi::Bind()
                                  .Ctx<ffi::ThreadPool>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Arg<ffi::Buffer<ffi::F32>>()
                                  .Ret<ffi::Buffer<ffi::F32>>());
