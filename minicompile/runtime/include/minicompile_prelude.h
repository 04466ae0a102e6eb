// minicompile_prelude.h: the helpers every generated C++ translation unit includes.
//
// Generated kernels (codegen/cpp.py) start with #include "minicompile_prelude.h"; the build
// (runtime/cpp_build.py) puts this directory on the include path and hashes this file into
// the cache key, so a changed helper rebuilds every kernel that uses it.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <type_traits>

// NaN-propagating max/min, as torch.maximum/minimum (and amax/amin) behave.
template <typename T> static inline T mc_max(T a, T b) { return (a != a || a > b) ? a : b; }
template <typename T> static inline T mc_min(T a, T b) { return (a != a || a < b) ? a : b; }

// where(c, a, b) for floating values as a bit blend, not a branch. g++ turns `c ? load : b`
// into a masked load, which it cannot vectorise when the load's index is clamped (a padded
// pooling window, a concatenation, a padded convolution input): the loop stays scalar (a 3x3
// stride-2 max pool over 2x64x64x64: 1.48 ms scalar, 0.10 ms as a blend). Bit-exact: NaN
// payloads and signed zeros pass through.
template <typename T> static inline T mc_blend(bool c, T a, T b) {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
        using U = std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>;
        U m = (U)0 - (U)c, ia, ib;
        std::memcpy(&ia, &a, sizeof(T));
        std::memcpy(&ib, &b, sizeof(T));
        U r = (ia & m) | (ib & ~m);
        T out;
        std::memcpy(&out, &r, sizeof(T));
        return out;
    } else {
        return c ? a : b;
    }
}
template <typename A, typename B> static inline auto mc_where(bool c, A a, B b) {
    using T = std::common_type_t<A, B>;
    return mc_blend<T>(c, static_cast<T>(a), static_cast<T>(b));
}

// bfloat16 is stored as its 16 high bits; computed in float32, rounded to nearest even.
static inline float mc_bf16_to_f32(uint16_t v) {
    uint32_t u = (uint32_t)v << 16; float f; std::memcpy(&f, &u, 4); return f;
}
static inline uint16_t mc_f32_to_bf16(float f) {
    uint32_t u; std::memcpy(&u, &f, 4);
    if (f != f) return (uint16_t)0x7fc0;
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
static inline float mc_round_bf16(float f) { return mc_bf16_to_f32(mc_f32_to_bf16(f)); }
static inline float mc_round_f16(float f) { return (float)(_Float16)f; }

// An index read from memory, checked as eager checks it: a negative one wrapped where the op wraps
// (check 2: x[idx]); out of [0, size) it is recorded in fault (check, value, dim, size: the wrapper
// raises eager's error, runtime/index_faults.py; the first recorded is kept) and read as 0, so the
// kernel stays in bounds.
static inline int64_t mc_index(int64_t i, int64_t size, int64_t check, int64_t dim, int64_t* fault) {
    int64_t j = check == 2 && i < 0 ? i + size : i;
    int64_t none = 0;
    if (__builtin_expect(j >= 0 && j < size, 1)) return j;
    if (!__atomic_compare_exchange_n(&fault[0], &none, -1, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) return 0;
    __atomic_store_n(&fault[1], i, __ATOMIC_RELAXED);
    __atomic_store_n(&fault[2], dim, __ATOMIC_RELAXED);
    __atomic_store_n(&fault[3], size, __ATOMIC_RELAXED);
    __atomic_store_n(&fault[0], check, __ATOMIC_RELAXED);
    return 0;
}

// Python's floor division and remainder (the sign follows the divisor).
template <typename T> static inline T mc_floordiv_i(T a, T b) {
    T q = a / b; return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> static inline T mc_remainder_i(T a, T b) {
    T r = a % b; return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
template <typename T> static inline T mc_floordiv_f(T a, T b) {
    if (b == 0) return a / b;
    T m = std::fmod(a, b), d = (a - m) / b;
    if (m != 0 && ((b < 0) != (m < 0))) d -= 1;
    if (d == 0) return std::copysign(T(0), a / b);
    T f = std::floor(d); if (d - f > T(0.5)) f += 1; return f;
}
template <typename T> static inline T mc_remainder_f(T a, T b) {
    T m = std::fmod(a, b);
    if (m != 0 && ((b < 0) != (m < 0))) m += b;
    return m;
}
template <typename T> static inline T mc_sign(T a) { return a != a ? a : (T)((a > 0) - (a < 0)); }
// exp for float32, inline so the vectoriser keeps it in registers. glibc's vector expf
// handles -inf, NaN and results beyond the normal range lane by lane in scalar code, which
// made a causally masked softmax (half its inputs -inf) 20x slower. Here exp(x) = 2^k exp(r)
// with |r| <= ln2/2 and a degree-6 polynomial (within about 1 ulp of the exact value);
// 2^k is applied in two halves so overflow gives inf and tiny results stay denormal, and
// inputs whose exp is 0 skip the arithmetic (denormal operands are slow on x86).
#ifdef __FMA__
#define MC_FMA(a, b, c) __builtin_fmaf(a, b, c)
#else
#define MC_FMA(a, b, c) ((a) * (b) + (c))
#endif
static inline float mc_bits_to_f32(int32_t i) { float f; std::memcpy(&f, &i, 4); return f; }
static inline float mc_exp(float x) {
    bool zero = x < -104.0f;
    float xc = zero ? 0.0f : (x > 89.0f ? 89.0f : x);
    // k = round(x / ln2): adding 1.5 * 2^23 leaves k in the low mantissa bits
    float kb = MC_FMA(xc, 1.44269504088896341f, 12582912.0f);
    int32_t ki; std::memcpy(&ki, &kb, 4); ki -= 0x4B400000;
    float k = kb - 12582912.0f;
    float r = MC_FMA(k, -0.693359375f, xc);
    r = MC_FMA(k, 2.12194440e-4f, r);
    float p = 1.9875691500e-4f;
    p = MC_FMA(p, r, 1.3981999507e-3f);
    p = MC_FMA(p, r, 8.3334519073e-3f);
    p = MC_FMA(p, r, 4.1665795894e-2f);
    p = MC_FMA(p, r, 1.6666665459e-1f);
    p = MC_FMA(p, r, 5.0000001201e-1f);
    float y = MC_FMA(p * r, r, r) + 1.0f;
    int32_t k1 = ki >> 1, k2 = ki - k1;
    float e = y * mc_bits_to_f32((k1 + 127) << 23) * mc_bits_to_f32((k2 + 127) << 23);
    return zero ? 0.0f : e;
}
static inline double mc_exp(double x) { return std::exp(x); }
// sin and cos for float32, inline and branch-free: in a fused loop about 1.5x faster than
// glibc's vector sinf/cosf calls. x = k pi/2 + r with |r| <= pi/4: k by the same rounding
// trick as mc_exp, r with pi/2 split in three floats (each product exact under FMA), then
// a polynomial for sin(r) or cos(r) picked and signed by k mod 4. Checked against double
// precision on every float with |x| <= MC_TRIG_MAX: at most 1.6 ulp. Beyond that the short
// reduction loses digits, so a loop using these flags such inputs and redoes its row with
// std::sin/std::cos (codegen/cpp.py). inf and NaN give NaN, as they should.
#define MC_TRIG_MAX 131072.0f
#ifdef __FMA__
static inline float mc_trig_reduce(float x, int32_t& quadrant) {
    float kb = MC_FMA(x, 0.636619772367581343f, 12582912.0f);
    std::memcpy(&quadrant, &kb, 4);  // k sits in the low bits (1.5 * 2^23 adds a multiple of 4)
    float k = kb - 12582912.0f;
    float r = MC_FMA(k, -1.57079637050628662109375f, x);
    r = MC_FMA(k, 4.37113900018624283e-8f, r);
    r = MC_FMA(k, 1.7151245100059549e-15f, r);
    return k == 0.0f ? x : r;
}
static inline float mc_sin_poly(float r) {
    float z = r * r, p = -1.9515295891e-4f;
    p = MC_FMA(p, z, 8.3321608736e-3f);
    p = MC_FMA(p, z, -1.6666654611e-1f);
    return MC_FMA(p * z, r, r);
}
static inline float mc_cos_poly(float r) {
    float z = r * r, p = 2.443315711809948e-5f;
    p = MC_FMA(p, z, -1.388731625493765e-3f);
    p = MC_FMA(p, z, 4.166664568298827e-2f);
    return MC_FMA(p * z, z, MC_FMA(-0.5f, z, 1.0f));
}
static inline float mc_sin_fast(float x) {
    int32_t q; float r = mc_trig_reduce(x, q);
    float v = (q & 1) ? mc_cos_poly(r) : mc_sin_poly(r);
    v = (q & 2) ? -v : v;
    return x == 0.0f ? x : v;  // sin(-0) is -0
}
static inline float mc_cos_fast(float x) {
    int32_t q; float r = mc_trig_reduce(x, q);
    float v = (q & 1) ? mc_sin_poly(r) : mc_cos_poly(r);
    return ((q + 1) & 2) ? -v : v;
}
#else  // without FMA the three-part reduction is not exact: use the library
static inline float mc_sin_fast(float x) { return std::sin(x); }
static inline float mc_cos_fast(float x) { return std::cos(x + 0.0f); }
#endif

// erf for float32, inline and branch-free: in a fused loop about 1.5x faster than glibc's
// vector erff (GELU's erf was the slowest part of its kernel). Both halves are computed and
// one is picked: |x| <= 1.5: erf(x) = x + x P(x^2 - 1.125) (x + ... keeps -0 and denormals
// exact to an ulp); beyond: 1 - erfc(|x|) with erfc a polynomial in |x| - 2.725 (absolute
// error 8e-9 up to 3.95), and exactly 1 from 3.92 on (erf rounds to 1 from 3.9192), so that
// gelu(-30) is -0 as in eager. Both polynomials are centred so float32 Horner loses little;
// their coefficients are weighted minimax fits (Lawson's iteration) to mpmath's erf, relative
// error for the first, absolute for erfc. Checked against double precision on every float: at
// most 1.46 ulp, near |x| = 1.5 (tests/test_prelude_math.py). inf gives +-1, NaN stays NaN.
#ifdef __FMA__
static inline float mc_erf(float x) {
    float t = std::fabs(x), s = MC_FMA(x, x, -1.125f);
    float p = -5.665215667e-06f;
    p = MC_FMA(p, s, 4.743597674e-05f);
    p = MC_FMA(p, s, -3.338504175e-04f);
    p = MC_FMA(p, s, 2.112058224e-03f);
    p = MC_FMA(p, s, -1.143919025e-02f);
    p = MC_FMA(p, s, 5.207639188e-02f);
    p = MC_FMA(p, s, -2.002245039e-01f);
    p = MC_FMA(p, s, -1.831638366e-01f);
    float small = MC_FMA(x, p, x);
    float u = t - 2.725f;
    float q = 4.990880825e-06f;
    q = MC_FMA(q, u, 2.311581284e-06f);
    q = MC_FMA(q, u, -6.449802459e-05f);
    q = MC_FMA(q, u, 1.087558558e-04f);
    q = MC_FMA(q, u, 7.641714910e-05f);
    q = MC_FMA(q, u, -6.823874428e-04f);
    q = MC_FMA(q, u, 1.769199036e-03f);
    q = MC_FMA(q, u, -3.004303901e-03f);
    q = MC_FMA(q, u, 3.619175870e-03f);
    q = MC_FMA(q, u, -3.105543554e-03f);
    q = MC_FMA(q, u, 1.831879257e-03f);
    q = MC_FMA(q, u, -6.721913815e-04f);
    q = MC_FMA(q, u, 1.163321649e-04f);
    float big = std::copysign(t > 3.92f ? 1.0f : 1.0f - q, x);
    return t > 1.5f ? big : small;
}
#else  // the polynomials were checked with fused multiply-adds only: use the library
static inline float mc_erf(float x) { return std::erf(x); }
#endif
static inline double mc_erf(double x) { return std::erf(x); }

// float -> integer as x86 truncates (and so eager): NaN and out-of-range values give the
// type's minimum; a plain static_cast is undefined there and the compiler may fold it to 0
template <typename I, typename F> static inline I mc_f2i(F x) {
    const F lo = static_cast<F>(std::numeric_limits<I>::min());
    return (x >= lo && x < -lo) ? static_cast<I>(x) : std::numeric_limits<I>::min();
}
