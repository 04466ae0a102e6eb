// packed_gemm.cpp: C = A @ B (+ bias) in float32 with B packed once into 16-column panels (AVX2 + FMA).
//
// runtime/packed_gemm.py builds it once (cached like every generated library) and calls it with
// pointers and sizes. mc_pack lays B (K x N, element (k, n) at B[k*sk + n*sn]) out as panels
// Bp[ceil(N/16)][K][16], zero-padded; for an inference weight it runs once per version of the
// weight (cpu/prepare.py). mc_gemm runs 6x16 register tiles over K blocks of 256 and row blocks
// of 96, the threads sharing out the panels; A is read in place, row- or column-major.
#include <immintrin.h>
#include <omp.h>
#include <algorithm>
#include <cstdint>

typedef int64_t i64;
constexpr int MR = 6, NR = 16;
constexpr i64 KC = 256, MC = 96, PARALLEL_FLOPS = 1 << 21;

extern "C" void mc_pack(const float* B, i64 sk, i64 sn, i64 K, i64 N, float* Bp) {
  for (i64 j0 = 0; j0 < N; j0 += NR) {
    float* dst = Bp + j0 * K;
    i64 nb = std::min<i64>(NR, N - j0), k = 0;
    if (sk == 1 && nb == NR) {   // B = W^T, W[n][k] row-major (nn.Linear's weight): 8x8 transposes
      for (; k + 8 <= K; k += 8) {
        for (int h = 0; h < 2; ++h) {
          const float* s = B + (j0 + 8 * h) * sn + k;
          __m256 r[8], t[8], u[8];
          for (int q = 0; q < 8; ++q) r[q] = _mm256_loadu_ps(s + q * sn);
          for (int q = 0; q < 8; q += 2) t[q] = _mm256_unpacklo_ps(r[q], r[q + 1]), t[q + 1] = _mm256_unpackhi_ps(r[q], r[q + 1]);
          for (int q = 0; q < 8; q += 4) {
            u[q] = _mm256_shuffle_ps(t[q], t[q + 2], 0x44), u[q + 1] = _mm256_shuffle_ps(t[q], t[q + 2], 0xEE);
            u[q + 2] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0x44), u[q + 3] = _mm256_shuffle_ps(t[q + 1], t[q + 3], 0xEE);
          }
          float* d = dst + k * NR + 8 * h;
          for (int q = 0; q < 4; ++q) {
            _mm256_storeu_ps(d + q * NR, _mm256_permute2f128_ps(u[q], u[q + 4], 0x20));
            _mm256_storeu_ps(d + (q + 4) * NR, _mm256_permute2f128_ps(u[q], u[q + 4], 0x31));
          }
        }
      }
    }
    for (; k < K; ++k)
      for (i64 j = 0; j < NR; ++j) dst[k * NR + j] = j < nb ? B[k * sk + (j0 + j) * sn] : 0.f;
  }
}

// C[0:M, 0:nb] (+)= A[0:M, 0:kc] @ b (kc x 16 of a panel); A's (i, k) at a[i*lda + k] (ACOL: a[k*lda + i]).
// The first K block adds the bias (if any) instead of C.
template <int M, int ACOL>
static inline __attribute__((always_inline)) void tile(const float* __restrict a, i64 lda, const float* __restrict b,
                                                       i64 kc, float* __restrict c, i64 ldc, int nb, bool acc,
                                                       const float* bias) {
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
         c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
#define ROW(i) if (M > i) { __m256 x = _mm256_broadcast_ss(ACOL ? a + k * lda + (i) : a + (i) * lda + k); \
    c##i##0 = _mm256_fmadd_ps(x, b0, c##i##0); c##i##1 = _mm256_fmadd_ps(x, b1, c##i##1); }
#pragma GCC unroll 4
  for (i64 k = 0; k < kc; ++k) {
    __m256 b0 = _mm256_loadu_ps(b + k * NR), b1 = _mm256_loadu_ps(b + k * NR + 8);
    ROW(0) ROW(1) ROW(2) ROW(3) ROW(4) ROW(5)
  }
#undef ROW
  __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i m0 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb), lane), m1 = _mm256_cmpgt_epi32(_mm256_set1_epi32(nb - 8), lane);
  bool full = nb == NR;
  auto load = [&](const float* p, __m256i m) { return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m); };
  __m256 add0 = _mm256_setzero_ps(), add1 = add0;
  if (!acc && bias) add0 = load(bias, m0), add1 = load(bias + 8, m1);
#define ST(i) if (M > i) { float* p = c + (i) * ldc; \
    if (acc) add0 = load(p, m0), add1 = load(p + 8, m1); \
    __m256 v0 = _mm256_add_ps(c##i##0, add0), v1 = _mm256_add_ps(c##i##1, add1); \
    if (full) _mm256_storeu_ps(p, v0), _mm256_storeu_ps(p + 8, v1); \
    else _mm256_maskstore_ps(p, m0, v0), _mm256_maskstore_ps(p + 8, m1, v1); }
  ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
#undef ST
}

template <int ACOL>
static void block(const float* A, i64 lda, const float* Bp, i64 K, const float* bias, float* C, i64 ldc,
                  i64 m0, i64 m1, i64 j_lo, i64 j_hi, i64 pc, i64 kc) {
  bool acc = pc > 0;
  auto at = [&](i64 i) { return ACOL ? A + i + pc * lda : A + i * lda + pc; };
  for (i64 j0 = j_lo; j0 < j_hi; j0 += NR) {
    const float* b = Bp + j0 * K + pc * NR;
    const float* bj = bias ? bias + j0 : nullptr;
    int nb = (int)std::min<i64>(NR, j_hi - j0);
    i64 i = m0;
    for (; i + MR <= m1; i += MR) tile<6, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj);
    switch (m1 - i) {
      case 1: tile<1, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj); break;
      case 2: tile<2, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj); break;
      case 3: tile<3, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj); break;
      case 4: tile<4, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj); break;
      case 5: tile<5, ACOL>(at(i), lda, b, kc, C + i * ldc + j0, ldc, nb, acc, bj); break;
    }
  }
}

// C (M x N, row stride ldc) = A @ B + bias; Bp from mc_pack, bias N floats or null, K >= 1.
extern "C" void mc_gemm(const float* A, i64 lda, i64 acol, const float* Bp, const float* bias, float* C, i64 ldc,
                        i64 M, i64 N, i64 K) {
  i64 panels = (N + NR - 1) / NR;
  int threads = 2 * M * N * K >= PARALLEL_FLOPS ? (int)std::min<i64>(omp_get_max_threads(), panels) : 1;
#pragma omp parallel num_threads(threads)
  {
    int t = omp_get_thread_num(), nt = omp_get_num_threads();
    i64 j_lo = panels * t / nt * NR, j_hi = std::min(N, panels * (t + 1) / nt * NR);
    for (i64 pc = 0; pc < K && j_lo < j_hi; pc += KC) {
      i64 kc = std::min(KC, K - pc);
      for (i64 m0 = 0; m0 < M; m0 += MC) {
        i64 m1 = std::min(M, m0 + MC);
        if (acol) block<1>(A, lda, Bp, K, bias, C, ldc, m0, m1, j_lo, j_hi, pc, kc);
        else block<0>(A, lda, Bp, K, bias, C, ldc, m0, m1, j_lo, j_hi, pc, kc);
      }
    }
  }
}
