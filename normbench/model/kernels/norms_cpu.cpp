// normbench's fused CPU kernels for the norms PyTorch has no fused CPU kernel for (RMSNorm,
// ScaleNorm, DyT) or a slow one for (GroupNorm per token: ATen's group_norm on (tokens, d) is
// several times LayerNorm's time; cost: see docs/benchmarks.md#groupnorm), forward and backward,
// registered as torch.ops.normbench.*.
//
// Each op makes the fewest full-size passes its math allows, row by row so that the
// second pass over a row reads it from cache: a forward reads x once from memory and
// writes y once; a backward reads x and dy once and writes dx once. Statistics and
// parameter gradients accumulate in float32 (double for double inputs); half inputs
// come back in their own dtype. Inner loops are written for the compiler's
// auto-vectoriser (`omp simd` reductions; no libm call in the float tanh).
//
// The user-facing ops torch.ops.normbench.{rms_norm, group_norm, scale_norm, dyt} carry their own
// autograd node, written here in C++ as F.layer_norm's is: a Python autograd.Function
// costs tens of microseconds a call, which at width 256 is a third of the norm's time.
// Only the headers used (not ATen/ATen.h): the build is about three times shorter.
#define TORCH_ASSERT_ONLY_METHOD_OPERATORS
#include <ATen/core/Tensor.h>
#include <ATen/Dispatch.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace {

using at::Tensor;

// Rows of a contiguous (rows, dim) view split among threads.
template <typename F>
void for_rows(int64_t rows, F&& body) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { body(begin, end); });
}

// Parameter gradients, summed over the rows: one chunk of rows per thread, each adding into its own
// `width` accumulators, then the chunks' sums added up. Plain loops, not ATen's zeros and sum:
// at small sizes those ops' set-up cost more than the sums (see
// docs/benchmarks.md#every-norm-against-layernorm-fused-cpu-kernels).
// body(begin, end, acc) adds rows [begin, end) into acc[0 .. width).
template <typename acc_t, typename Body>
std::vector<acc_t> summed_over_rows(int64_t rows, int64_t width, const Body& body) {
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  const int64_t per = (rows + chunks - 1) / chunks;
  std::vector<acc_t> acc(chunks * width, acc_t(0));
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) body(c * per, std::min(rows, (c + 1) * per), acc.data() + c * width);
  });
  for (int64_t c = 1; c < chunks; ++c)
    for (int64_t j = 0; j < width; ++j) acc[j] += acc[c * width + j];
  return acc;
}

// A parameter's gradient from its accumulated values: the parameter's shape and dtype.
template <typename acc_t>
Tensor as_grad_of(const Tensor& param, const acc_t* values) {
  Tensor grad = at::empty(param.sizes(), param.options().dtype(c10::CppTypeToScalarType<acc_t>::value));
  std::copy(values, values + grad.numel(), grad.data_ptr<acc_t>());
  return grad.to(param.scalar_type());
}

// Loads and stores through the accumulation type. bf16 <-> float by bit shifts (round to
// nearest even, NaN kept), which the vectoriser handles; c10's conversions it does not.
template <typename acc_t, typename T>
inline acc_t ld(T v) { return static_cast<acc_t>(v); }
template <>
inline float ld<float, c10::BFloat16>(c10::BFloat16 v) {
  uint32_t u = static_cast<uint32_t>(v.x) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
template <typename T, typename acc_t>
inline T st(acc_t v) { return static_cast<T>(v); }
template <>
inline c10::BFloat16 st<c10::BFloat16, float>(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  u = f != f ? 0x7FC00000u : u + 0x7FFFu + ((u >> 16) & 1u);
  return c10::BFloat16(static_cast<uint16_t>(u >> 16), c10::BFloat16::from_bits());
}

template <typename acc_t, typename T>
inline acc_t sum_squares(const T* x, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) {
    acc_t v = ld<acc_t>(x[j]);
    s += v * v;
  }
  return s;
}

template <typename acc_t, typename T>
inline acc_t sum(const T* x, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) s += ld<acc_t>(x[j]);
  return s;
}

template <typename acc_t, typename T>
inline acc_t sum_squared_deviations(const T* x, acc_t m, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) {
    const acc_t v = ld<acc_t>(x[j]) - m;
    s += v * v;
  }
  return s;
}

template <typename acc_t, typename T>
inline acc_t dot(const T* a, const T* b, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) s += ld<acc_t>(a[j]) * ld<acc_t>(b[j]);
  return s;
}

// tanh(x) as x P(x^2) / Q(x^2) for |x| <= c, and tanh(+-c) beyond (within a few ulp of +-1):
// minimax rational functions fitted for these kernels by benchmarks/tanh_fit.py (relative error;
// coefficients rounded to float one at a time, the rest refitted after each). They vectorise, unlike a
// libm call per element, and Q >= 1 has no zero. Two fits, by what reads the result:
//   TanhFloat  [7/8], c = 8: within 3.8e-7 of tanh in float arithmetic (tests/test_norms.py), in 8
//              multiply-adds; Eigen's 13/6 fit, used before, takes 10 for 3.2e-7.
//   TanhBf16   [5/6], c = 6: within 2.1e-5, for DyT's bf16 forward, whose result is rounded to 8
//              bits at once (a relative step of 2^-8 to 2^-7) and read by nothing else: it rounds
//              as the float fit's would except within 2.1e-5 of a tie. 6 multiply-adds.
struct TanhFloat {
  static constexpr float c = 8.0f;
  static constexpr float p[] = {1.0f, 1.293036789e-01f, 2.955821808e-03f, 1.147526564e-05f};
  static constexpr float q[] = {1.0f, 4.626362324e-01f, 2.383583970e-02f, 2.393170871e-04f, 2.473260565e-07f};
};
struct TanhBf16 {
  static constexpr float c = 6.0f;
  static constexpr float p[] = {1.0f, 1.149839982e-01f, 1.522865612e-03f};
  static constexpr float q[] = {1.0f, 4.482830465e-01f, 1.766462997e-02f, 5.674845306e-05f};
};

// c[0] + c[1] z + ... + c[N-1] z^(N-1); V is float or the 8-lane vector of DyT's vector path below.
template <typename V, size_t N>
inline V horner(V z, const float (&c)[N]) {
  V r = z * c[N - 1] + c[N - 2];
  for (size_t k = N - 2; k-- > 0;) r = r * z + c[k];
  return r;
}

template <typename Fit>
inline float tanh_fit(float x) {
  x = std::min(std::max(x, -Fit::c), Fit::c);  // a NaN passes both (each returns its first argument)
  const float z = x * x;
  return x * horner(z, Fit::p) / horner(z, Fit::q);
}
inline float fast_tanh(float x) { return tanh_fit<TanhFloat>(x); }
inline double fast_tanh(double x) { return std::tanh(x); }


// Row kernels. They live outside AT_DISPATCH's macro arguments, where no #pragma may stand.
template <typename T, typename acc_t>
void rms_fwd_row(const T* x, T* y, const acc_t* w, acc_t r, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) y[j] = st<T, acc_t>(ld<acc_t>(x[j]) * r * w[j]);
}

template <typename T, typename acc_t>
void rms_bwd_row(const T* x, const T* g, T* dx, const acc_t* w, acc_t r, acc_t* dw, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) {
    const acc_t gv = ld<acc_t>(g[j]);
    const acc_t xv = ld<acc_t>(x[j]);
    s += gv * w[j] * xv;
    dw[j] += gv * xv * r;
  }
  const acc_t k = s * r * r / d;
#pragma omp simd
  for (int64_t j = 0; j < d; ++j)
    dx[j] = st<T, acc_t>(r * (ld<acc_t>(g[j]) * w[j] - ld<acc_t>(x[j]) * k));
}

// GroupNorm's rows take their input through X: the input's own type, or the accumulation type
// when a half row was widened first (below).
template <typename X, typename T, typename acc_t>
void gn_fwd_row(const X* x, T* y, acc_t m, acc_t r, const acc_t* w, const acc_t* b, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) y[j] = st<T, acc_t>((ld<acc_t>(x[j]) - m) * r * w[j] + b[j]);
}

template <typename X, typename T, typename acc_t>
void gn_bwd_row(const X* x, const X* g, T* dx, acc_t m, acc_t r, const acc_t* w, acc_t* dw, acc_t* db, int64_t d) {
  acc_t sg = 0, sgx = 0;
#pragma omp simd reduction(+ : sg, sgx)
  for (int64_t j = 0; j < d; ++j) {
    const acc_t xh = (ld<acc_t>(x[j]) - m) * r;
    const acc_t gv = ld<acc_t>(g[j]);
    sg += gv * w[j];
    sgx += gv * w[j] * xh;
    dw[j] += gv * xh;
    db[j] += gv;
  }
  const acc_t mg = sg / d, mgx = sgx / d;
#pragma omp simd
  for (int64_t j = 0; j < d; ++j)
    dx[j] = st<T, acc_t>(r * (ld<acc_t>(g[j]) * w[j] - mg - (ld<acc_t>(x[j]) - m) * r * mgx));
}

// A row in the accumulation type: a half row is widened once into `buf`, in one long vectorised
// loop, so that GroupNorm's scalar per-group loops (8 to 64 elements at its usual sizes) run on
// floats: on 16-bit loads the vectoriser's set-up and tails cost up to twice the float loops' time.
template <typename acc_t, typename T>
const acc_t* widened(const T* x, std::vector<acc_t>& buf, int64_t d) {
  if constexpr (std::is_same_v<T, acc_t>) {
    return x;
  } else {
    buf.resize(d);
    acc_t* out = buf.data();
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) out[j] = ld<acc_t>(x[j]);
    return out;
  }
}

template <typename T, typename acc_t>
void scale_row(const T* x, T* y, acc_t s, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) y[j] = st<T, acc_t>(ld<acc_t>(x[j]) * s);
}

template <typename T, typename acc_t>
void scale_bwd_row(const T* x, const T* g, T* dx, acc_t s, acc_t k, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j)
    dx[j] = st<T, acc_t>(s * (ld<acc_t>(g[j]) - ld<acc_t>(x[j]) * k));
}

template <typename T, typename acc_t>
void dyt_fwd_row(const T* x, T* y, acc_t a, const acc_t* w, const acc_t* b, int64_t d) {
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) y[j] = st<T, acc_t>(w[j] * fast_tanh(a * ld<acc_t>(x[j])) + b[j]);
}

template <typename T, typename acc_t>
acc_t dyt_bwd_row(const T* x, const T* g, T* dx, acc_t a, const acc_t* w, acc_t* dw, acc_t* db, int64_t d) {
  acc_t da = 0;
#pragma omp simd reduction(+ : da)
  for (int64_t j = 0; j < d; ++j) {
    const acc_t xv = ld<acc_t>(x[j]);
    const acc_t gv = ld<acc_t>(g[j]);
    const acc_t t = fast_tanh(a * xv);
    const acc_t u = gv * w[j] * (acc_t(1) - t * t);
    dx[j] = st<T, acc_t>(a * u);
    da += xv * u;
    dw[j] += gv * t;
    db[j] += gv;
  }
  return da;
}

// DyT and GroupNorm in 8-lane vectors where the CPU has AVX2 and FMA (GCC/Clang vector extensions),
// float and bf16 only; other dtypes, and the tails of rows, take the scalar loops above.
// What sets DyT's time is its tanh: here the division is the reciprocal estimate (rcpps, 12 bits)
// plus one Newton step, the clamp two min/max (the vectoriser's compare-and-blend takes four), and
// bf16 comes in with one shuffle and goes out two vectors at a time (cost: see
// docs/benchmarks.md#every-norm-against-layernorm-fused-cpu-kernels).
// GroupNorm's groups are short (8 to 64 channels at its usual sizes): written out, a group's loops
// have none of the vectoriser's set-up and tail code, which there costs as much as the loop.
#if defined(__AVX2__) && defined(__FMA__) && (defined(__GNUC__) || defined(__clang__))
#define NORMBENCH_VEC8 1
#include <immintrin.h>
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

inline v8f load8(const float* p) { v8f v; std::memcpy(&v, p, sizeof v); return v; }
inline v8f load8(const c10::BFloat16* p) {
  // The 8 values in both 128-bit lanes (a broadcast load: no shuffle), then one byte shuffle moves
  // lane 0's first four and lane 1's last four into the upper halves of 8 floats.
  const __m256i both = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  const __m256i to_upper = _mm256_setr_epi8(-1, -1, 0, 1, -1, -1, 2, 3, -1, -1, 4, 5, -1, -1, 6, 7,
                                            -1, -1, 8, 9, -1, -1, 10, 11, -1, -1, 12, 13, -1, -1, 14, 15);
  return (v8f)_mm256_shuffle_epi8(both, to_upper);
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline __m256i bf16_bits(v8f v) {  // round to nearest even, NaN kept (as st<BFloat16>), in the low halves
  v8u u = (v8u)v;
  u = u + 0x7FFFu + ((u >> 16) & 1u);
  u = (v != v) ? (v8u{} + 0x7FC00000u) : u;
  return (__m256i)(u >> 16);
}
inline void store8(c10::BFloat16* p, v8f v) {
  // AVX2 has no 32-to-16-bit narrowing: pack (within 128-bit lanes), then gather the halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(v), _mm256_setzero_si256()), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}
inline void store16(float* p, v8f lo, v8f hi) { store8(p, lo); store8(p + 8, hi); }
inline void store16(c10::BFloat16* p, v8f lo, v8f hi) {  // two vectors, one pack and one permute
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(bf16_bits(lo), bf16_bits(hi)), 0xD8);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), packed);
}

inline float sum_of_lanes(v8f v) {
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128((__m256)v), _mm256_extractf128_ps((__m256)v, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_movehdup_ps(quarter)));
}

template <typename Fit>
inline v8f tanh8(v8f x) {
  // max and min return their second operand when one is NaN: x's NaN passes both
  x = (v8f)_mm256_min_ps(_mm256_set1_ps(Fit::c), _mm256_max_ps(_mm256_set1_ps(-Fit::c), (__m256)x));
  const v8f z = x * x;
  const v8f q = horner(z, Fit::q);
  v8f r = __builtin_ia32_rcpps256(q);
  r = r * (2.0f - q * r);  // one Newton step: 12 bits to about 23
  return x * horner(z, Fit::p) * r;
}

template <typename T>
void dyt_fwd_row_vec(const T* x, T* y, float a, const float* w, const float* b, int64_t d) {
  using Fit = std::conditional_t<std::is_same_v<T, float>, TanhFloat, TanhBf16>;
  auto at = [&](int64_t j) { return load8(w + j) * tanh8<Fit>(a * load8(x + j)) + load8(b + j); };
  int64_t j = 0;
  for (; j + 16 <= d; j += 16) store16(y + j, at(j), at(j + 8));
  for (; j + 8 <= d; j += 8) store8(y + j, at(j));
  dyt_fwd_row(x + j, y + j, a, w + j, b + j, d - j);
}

template <typename T>
float dyt_bwd_row_vec(const T* x, const T* g, T* dx, float a, const float* w, float* dw, float* db, int64_t d) {
  v8f da = {};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) {
    const v8f xv = load8(x + j), gv = load8(g + j);
    const v8f t = tanh8<TanhFloat>(a * xv);
    const v8f u = gv * load8(w + j) * (1.0f - t * t);
    store8(dx + j, a * u);
    da += xv * u;
    store8(dw + j, load8(dw + j) + gv * t);
    store8(db + j, load8(db + j) + gv);
  }
  return dyt_bwd_row(x + j, g + j, dx + j, a, w + j, dw + j, db + j, d - j) + sum_of_lanes(da);
}

// One group of s channels, s a multiple of 8; X and T are float or bf16.
// Two accumulators each: a group's sums are chains of dependent adds, whose latency (not the adds'
// throughput) is what a short group waits on.
template <typename X>
void gn_group_stats_vec(const X* x, int64_t s, float eps, float& m, float& r) {
  v8f sum0 = {}, sum1 = {};
  int64_t j = 0;
  for (; j + 16 <= s; j += 16) {
    sum0 += load8(x + j);
    sum1 += load8(x + j + 8);
  }
  if (j < s) sum0 += load8(x + j);
  m = sum_of_lanes(sum0 + sum1) / s;
  v8f dev0 = {}, dev1 = {};
  for (j = 0; j + 16 <= s; j += 16) {
    const v8f v0 = load8(x + j) - m, v1 = load8(x + j + 8) - m;
    dev0 += v0 * v0;
    dev1 += v1 * v1;
  }
  if (j < s) {
    const v8f v = load8(x + j) - m;
    dev0 += v * v;
  }
  r = 1.0f / std::sqrt(sum_of_lanes(dev0 + dev1) / s + eps);
}

template <typename X, typename T>
void gn_fwd_row_vec(const X* x, T* y, float m, float r, const float* w, const float* b, int64_t s) {
  for (int64_t j = 0; j < s; j += 8) store8(y + j, (load8(x + j) - m) * r * load8(w + j) + load8(b + j));
}

template <typename X, typename T>
void gn_bwd_row_vec(const X* x, const X* g, T* dx, float m, float r, const float* w, float* dw, float* db, int64_t s) {
  v8f sg = {}, sgx = {};
  for (int64_t j = 0; j < s; j += 8) {
    const v8f xh = (load8(x + j) - m) * r, gv = load8(g + j), gw = gv * load8(w + j);
    sg += gw;
    sgx += gw * xh;
    store8(dw + j, load8(dw + j) + gv * xh);
    store8(db + j, load8(db + j) + gv);
  }
  const float mg = sum_of_lanes(sg) / s, mgx = sum_of_lanes(sgx) / s;
  for (int64_t j = 0; j < s; j += 8)
    store8(dx + j, r * (load8(g + j) * load8(w + j) - mg - (load8(x + j) - m) * r * mgx));
}
#endif

template <typename T>
constexpr bool vectorised() {
#ifdef NORMBENCH_VEC8
  return std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
#else
  return false;
#endif
}

template <typename T, typename acc_t>
void dyt_fwd_row_best(const T* x, T* y, acc_t a, const acc_t* w, const acc_t* b, int64_t d) {
#ifdef NORMBENCH_VEC8
  if constexpr (vectorised<T>()) return dyt_fwd_row_vec(x, y, a, w, b, d);
#endif
  dyt_fwd_row(x, y, a, w, b, d);
}

template <typename T, typename acc_t>
acc_t dyt_bwd_row_best(const T* x, const T* g, T* dx, acc_t a, const acc_t* w, acc_t* dw, acc_t* db, int64_t d) {
#ifdef NORMBENCH_VEC8
  if constexpr (vectorised<T>()) return dyt_bwd_row_vec(x, g, dx, a, w, dw, db, d);
#endif
  return dyt_bwd_row(x, g, dx, a, w, dw, db, d);
}

// GroupNorm, one group of s channels; X is T, or the accumulation type for a widened row.
template <typename X, typename T, typename acc_t>
void gn_group_stats(const X* x, int64_t s, acc_t eps, acc_t& m, acc_t& r) {
#ifdef NORMBENCH_VEC8
  if constexpr (vectorised<X>() && vectorised<T>()) {
    if (s % 8 == 0) return gn_group_stats_vec(x, s, eps, m, r);
  }
#endif
  m = sum<acc_t>(x, s) / s;
  r = acc_t(1) / std::sqrt(sum_squared_deviations<acc_t>(x, m, s) / s + eps);
}

template <typename X, typename T, typename acc_t>
void gn_fwd_row_best(const X* x, T* y, acc_t m, acc_t r, const acc_t* w, const acc_t* b, int64_t s) {
#ifdef NORMBENCH_VEC8
  if constexpr (vectorised<X>() && vectorised<T>()) {
    if (s % 8 == 0) return gn_fwd_row_vec(x, y, m, r, w, b, s);
  }
#endif
  gn_fwd_row(x, y, m, r, w, b, s);
}

template <typename X, typename T, typename acc_t>
void gn_bwd_row_best(const X* x, const X* g, T* dx, acc_t m, acc_t r, const acc_t* w, acc_t* dw, acc_t* db, int64_t s) {
#ifdef NORMBENCH_VEC8
  if constexpr (vectorised<X>() && vectorised<T>()) {
    if (s % 8 == 0) return gn_bwd_row_vec(x, g, dx, m, r, w, dw, db, s);
  }
#endif
  gn_bwd_row(x, g, dx, m, r, w, dw, db, s);
}

// ---------------------------------------------------------------- RMSNorm
// y = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps); returns (y, rstd).
std::tuple<Tensor, Tensor> rms_norm_fwd(const Tensor& x, const Tensor& w, double eps) {
  TORCH_CHECK(x.is_contiguous() && w.is_contiguous(), "normbench::rms_norm_fwd: contiguous inputs");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor y = at::empty_like(x);
  auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor rstd = at::empty({rows}, x.options().dtype(acc_type));
  Tensor wa = w.to(acc_type);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    acc_t* rp = rstd.data_ptr<acc_t>();
    for_rows(rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xi = xp + i * d;
        scalar_t* yi = yp + i * d;
        const acc_t r = acc_t(1) / std::sqrt(sum_squares<acc_t>(xi, d) / d + static_cast<acc_t>(eps));
        rp[i] = r;
        rms_fwd_row(xi, yi, wp, r, d);
      }
    });
  });
  return {y, rstd};
}

// dx = rstd * (dy*w - xhat * mean(dy*w*xhat)), dw = sum over rows of dy * xhat.
std::tuple<Tensor, Tensor> rms_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& rstd,
                                        double /*eps: in rstd already*/) {
  TORCH_CHECK(dy.is_contiguous() && x.is_contiguous(), "normbench::rms_norm_bwd: contiguous inputs");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor dx = at::empty_like(x);
  Tensor wa = w.to(rstd.scalar_type()).contiguous();
  Tensor dw;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    const acc_t* rp = rstd.const_data_ptr<acc_t>();
    auto sums = summed_over_rows<acc_t>(rows, d, [&](int64_t begin, int64_t end, acc_t* dw_acc) {
      for (int64_t i = begin; i < end; ++i) rms_bwd_row(xp + i * d, gp + i * d, dxp + i * d, wp, rp[i], dw_acc, d);
    });
    dw = as_grad_of(w, sums.data());
  });
  return {dx, dw};
}

// ---------------------------------------------------------------- GroupNorm, per token
// Each row's d channels in `groups` groups of s = d / groups, each normalized on its own:
// y = (x - mean) * rstd * w + b, with the mean and the biased variance of the group taken in two
// passes over it (in cache), so no precision is lost when |mean| >> std. Returns (y, mean, rstd),
// (rows, groups) each. ATen's group_norm does the same math, several times slower on (rows, d).
std::tuple<Tensor, Tensor, Tensor> group_norm_fwd(const Tensor& x, const Tensor& w, const Tensor& b, int64_t groups,
                                                  double eps) {
  TORCH_CHECK(x.is_contiguous(), "normbench::group_norm_fwd: contiguous input");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  TORCH_CHECK(groups > 0 && d % groups == 0, "normbench::group_norm_fwd: groups must divide the width");
  const int64_t s = d / groups;
  Tensor y = at::empty_like(x);
  auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor mean = at::empty({rows, groups}, x.options().dtype(acc_type));
  Tensor rstd = at::empty({rows, groups}, x.options().dtype(acc_type));
  Tensor wa = w.to(acc_type).contiguous(), ba = b.to(acc_type).contiguous();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "group_norm_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    const acc_t* bp = ba.const_data_ptr<acc_t>();
    acc_t* mp = mean.data_ptr<acc_t>();
    acc_t* rp = rstd.data_ptr<acc_t>();
    const bool read_as_is = vectorised<scalar_t>() && s % 8 == 0;  // else the scalar loops, on a widened row
    for_rows(rows, [&](int64_t begin, int64_t end) {
      auto groups_of = [&](int64_t i, const auto* xi) {  // xi: row i, as it is or widened
        acc_t* m = mp + i * groups;
        acc_t* r = rp + i * groups;
        // Every group's statistics first: their dependency chains (sums, square root) then overlap,
        // where group by group each output loop would wait on its own group's chain.
        for (int64_t k = 0; k < groups; ++k)
          gn_group_stats<std::remove_cv_t<std::remove_pointer_t<decltype(xi)>>, scalar_t>(
              xi + k * s, s, static_cast<acc_t>(eps), m[k], r[k]);
        for (int64_t k = 0; k < groups; ++k)
          gn_fwd_row_best(xi + k * s, yp + i * d + k * s, m[k], r[k], wp + k * s, bp + k * s, s);
      };
      std::vector<acc_t> buf;
      for (int64_t i = begin; i < end; ++i) {
        if (read_as_is) groups_of(i, xp + i * d);
        else groups_of(i, widened(xp + i * d, buf, d));
      }
    });
  });
  return {y, mean, rstd};
}

// Per group, with xhat = (x - mean) rstd and g = dy * w: dx = rstd (g - mean(g) - xhat mean(g xhat));
// dw = sum over rows of dy xhat, db = sum over rows of dy.
std::tuple<Tensor, Tensor, Tensor> group_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& w, const Tensor& b,
                                                  const Tensor& mean, const Tensor& rstd) {
  TORCH_CHECK(dy.is_contiguous() && x.is_contiguous(), "normbench::group_norm_bwd: contiguous inputs");
  const int64_t d = x.size(-1), rows = x.numel() / d, groups = mean.size(-1), s = d / groups;
  Tensor dx = at::empty_like(x);
  Tensor wa = w.to(mean.scalar_type()).contiguous();
  Tensor dw, db;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "group_norm_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    const acc_t* mp = mean.const_data_ptr<acc_t>();
    const acc_t* rp = rstd.const_data_ptr<acc_t>();
    const bool read_as_is = vectorised<scalar_t>() && s % 8 == 0;  // else the scalar loops, on widened rows
    // accumulators: dw (d), db (d)
    auto sums = summed_over_rows<acc_t>(rows, 2 * d, [&](int64_t begin, int64_t end, acc_t* acc) {
      auto groups_of = [&](int64_t i, const auto* xi, const auto* gi) {  // row i, as it is or widened
        for (int64_t k = 0; k < groups; ++k) {
          const int64_t c = k * s;
          gn_bwd_row_best(xi + c, gi + c, dxp + i * d + c, mp[i * groups + k], rp[i * groups + k], wp + c, acc + c,
                          acc + d + c, s);
        }
      };
      std::vector<acc_t> xbuf, gbuf;
      for (int64_t i = begin; i < end; ++i) {
        if (read_as_is) groups_of(i, xp + i * d, gp + i * d);
        else groups_of(i, widened(xp + i * d, xbuf, d), widened(gp + i * d, gbuf, d));
      }
    });
    dw = as_grad_of(w, sums.data());
    db = as_grad_of(b, sums.data() + d);
  });
  return {dx, dw, db};
}

// ---------------------------------------------------------------- ScaleNorm
// y = x * g / max(||x||, eps); returns (y, ||x||).
std::tuple<Tensor, Tensor> scale_norm_fwd(const Tensor& x, const Tensor& g, double eps) {
  TORCH_CHECK(x.is_contiguous(), "normbench::scale_norm_fwd: contiguous input");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor y = at::empty_like(x);
  auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor norm = at::empty({rows}, x.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "scale_norm_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t gain = g.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    acc_t* np = norm.data_ptr<acc_t>();
    for_rows(rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xi = xp + i * d;
        scalar_t* yi = yp + i * d;
        const acc_t n = std::sqrt(sum_squares<acc_t>(xi, d));
        np[i] = n;
        scale_row(xi, yi, gain / std::max(n, static_cast<acc_t>(eps)), d);
      }
    });
  });
  return {y, norm};
}

// With c = max(n, eps), s = g / c: dx = s * (dy - x * (dy.x) / c^2) (dx = s * dy where n < eps),
// dg = sum over rows of (dy.x) / c.
std::tuple<Tensor, Tensor> scale_norm_bwd(const Tensor& dy, const Tensor& x, const Tensor& g, const Tensor& norm,
                                          double eps) {
  TORCH_CHECK(dy.is_contiguous() && x.is_contiguous(), "normbench::scale_norm_bwd: contiguous inputs");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor dx = at::empty_like(x);
  Tensor dg;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "scale_norm_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t gain = g.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* np = norm.const_data_ptr<acc_t>();
    auto sums = summed_over_rows<acc_t>(rows, 1, [&](int64_t begin, int64_t end, acc_t* dg_acc) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xi = xp + i * d;
        const scalar_t* gi = gp + i * d;
        const acc_t n = np[i];
        const acc_t c = std::max(n, static_cast<acc_t>(eps));
        const acc_t dt = dot<acc_t>(gi, xi, d);
        *dg_acc += dt / c;
        scale_bwd_row(xi, gi, dxp + i * d, gain / c, n < eps ? acc_t(0) : dt / (c * c), d);
      }
    });
    dg = as_grad_of(g, sums.data());
  });
  return {dx, dg};
}

// ---------------------------------------------------------------- DyT
// y = w * tanh(alpha * x) + b (b optional).
Tensor dyt_fwd(const Tensor& x, const Tensor& alpha, const Tensor& w, const std::optional<Tensor>& b) {
  TORCH_CHECK(x.is_contiguous(), "normbench::dyt_fwd: contiguous input");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor y = at::empty_like(x);
  auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor wa = w.to(acc_type).contiguous();
  Tensor ba = b.has_value() ? b->to(acc_type).contiguous() : at::zeros({d}, wa.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dyt_fwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t a = alpha.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    scalar_t* yp = y.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    const acc_t* bp = ba.const_data_ptr<acc_t>();
    for_rows(rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xi = xp + i * d;
        scalar_t* yi = yp + i * d;
        dyt_fwd_row_best(xi, yi, a, wp, bp, d);
      }
    });
  });
  return y;
}

// t = tanh(alpha x), u = dy * w * (1 - t^2): dx = alpha u, dalpha = sum x u, dw = sum dy t, db = sum dy.
std::tuple<Tensor, Tensor, Tensor, std::optional<Tensor>> dyt_bwd(const Tensor& dy, const Tensor& x,
                                                                  const Tensor& alpha, const Tensor& w,
                                                                  const std::optional<Tensor>& b) {
  TORCH_CHECK(dy.is_contiguous() && x.is_contiguous(), "normbench::dyt_bwd: contiguous inputs");
  const int64_t d = x.size(-1), rows = x.numel() / d;
  Tensor dx = at::empty_like(x);
  Tensor wa = w.to(x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat).contiguous();
  Tensor dalpha, dw;
  std::optional<Tensor> db;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dyt_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t a = alpha.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    // accumulators: dw (d), db (d), dalpha (1)
    auto sums = summed_over_rows<acc_t>(rows, 2 * d + 1, [&](int64_t begin, int64_t end, acc_t* acc) {
      for (int64_t i = begin; i < end; ++i)
        acc[2 * d] += dyt_bwd_row_best(xp + i * d, gp + i * d, dxp + i * d, a, wp, acc, acc + d, d);
    });
    dw = as_grad_of(w, sums.data());
    if (b.has_value()) db = as_grad_of(*b, sums.data() + d);
    dalpha = as_grad_of(alpha, sums.data() + 2 * d);
  });
  return {dx, dalpha, dw, db};
}

// ---------------------------------------------------------------- autograd
// One node per norm call: the forward saves x, the parameters and the per-token statistic,
// the backward calls the backward kernel once. Parameter gradients are always computed
// (they come out of the same pass over the rows as dx).
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

class RMSNormFn : public torch::autograd::Function<RMSNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, double eps) {
    Tensor xc = x.contiguous();
    auto [y, rstd] = rms_norm_fwd(xc, w.contiguous(), eps);
    ctx->save_for_backward({xc, w, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dys) {
    auto s = ctx->get_saved_variables();
    auto [dx, dw] = rms_norm_bwd(dys[0].contiguous(), s[0], s[1], s[2], 0.0);
    return {dx, dw.to(s[1].scalar_type()), Tensor()};
  }
};

class GroupNormFn : public torch::autograd::Function<GroupNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& w, const Tensor& b, int64_t groups,
                        double eps) {
    Tensor xc = x.contiguous();
    auto [y, mean, rstd] = group_norm_fwd(xc, w, b, groups, eps);
    ctx->save_for_backward({xc, w, b, mean, rstd});
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dys) {
    auto s = ctx->get_saved_variables();
    auto [dx, dw, db] = group_norm_bwd(dys[0].contiguous(), s[0], s[1], s[2], s[3], s[4]);
    return {dx, dw, db, Tensor(), Tensor()};
  }
};

class ScaleNormFn : public torch::autograd::Function<ScaleNormFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& g, double eps) {
    Tensor xc = x.contiguous();
    auto [y, norm] = scale_norm_fwd(xc, g, eps);
    ctx->save_for_backward({xc, g, norm});
    ctx->saved_data["eps"] = eps;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dys) {
    auto s = ctx->get_saved_variables();
    auto [dx, dg] = scale_norm_bwd(dys[0].contiguous(), s[0], s[1], s[2], ctx->saved_data["eps"].toDouble());
    return {dx, dg, Tensor()};
  }
};

class DyTFn : public torch::autograd::Function<DyTFn> {
 public:
  static Tensor forward(AutogradContext* ctx, const Tensor& x, const Tensor& alpha, const Tensor& w,
                        const std::optional<Tensor>& b) {
    Tensor xc = x.contiguous();
    Tensor y = dyt_fwd(xc, alpha, w, b);
    ctx->save_for_backward({xc, alpha, w});
    ctx->saved_data["bias"] = b;  // only its dtype and presence are needed
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list dys) {
    auto s = ctx->get_saved_variables();
    auto b = ctx->saved_data["bias"].toOptional<Tensor>();
    auto [dx, dalpha, dw, db] = dyt_bwd(dys[0].contiguous(), s[0], s[1], s[2], b);
    return {dx, dalpha, dw, db.value_or(Tensor())};
  }
};

Tensor rms_norm(const Tensor& x, const Tensor& w, double eps) { return RMSNormFn::apply(x, w, eps); }
Tensor group_norm(const Tensor& x, const Tensor& w, const Tensor& b, int64_t groups, double eps) {
  return GroupNormFn::apply(x, w, b, groups, eps);
}
Tensor scale_norm(const Tensor& x, const Tensor& g, double eps) { return ScaleNormFn::apply(x, g, eps); }
Tensor dyt(const Tensor& x, const Tensor& alpha, const Tensor& w, const std::optional<Tensor>& b) {
  return DyTFn::apply(x, alpha, w, b);
}

// Below autograd (inference mode, or called from a backward): the forward kernel alone.
Tensor rms_norm_nograd(const Tensor& x, const Tensor& w, double eps) {
  return std::get<0>(rms_norm_fwd(x.contiguous(), w.contiguous(), eps));
}
Tensor group_norm_nograd(const Tensor& x, const Tensor& w, const Tensor& b, int64_t groups, double eps) {
  return std::get<0>(group_norm_fwd(x.contiguous(), w, b, groups, eps));
}
Tensor scale_norm_nograd(const Tensor& x, const Tensor& g, double eps) {
  return std::get<0>(scale_norm_fwd(x.contiguous(), g, eps));
}
Tensor dyt_nograd(const Tensor& x, const Tensor& alpha, const Tensor& w, const std::optional<Tensor>& b) {
  return dyt_fwd(x.contiguous(), alpha, w, b);
}

}  // namespace

TORCH_LIBRARY(normbench, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("group_norm(Tensor x, Tensor w, Tensor b, int groups, float eps) -> Tensor");
  m.def("scale_norm(Tensor x, Tensor g, float eps) -> Tensor");
  m.def("dyt(Tensor x, Tensor alpha, Tensor w, Tensor? b) -> Tensor");
  m.def("rms_norm_fwd(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor w, Tensor rstd, float eps) -> (Tensor, Tensor)");
  m.def("group_norm_fwd(Tensor x, Tensor w, Tensor b, int groups, float eps) -> (Tensor, Tensor, Tensor)");
  m.def("group_norm_bwd(Tensor dy, Tensor x, Tensor w, Tensor b, Tensor mean, Tensor rstd) -> (Tensor, Tensor, Tensor)");
  m.def("scale_norm_fwd(Tensor x, Tensor g, float eps) -> (Tensor, Tensor)");
  m.def("scale_norm_bwd(Tensor dy, Tensor x, Tensor g, Tensor norm, float eps) -> (Tensor, Tensor)");
  m.def("dyt_fwd(Tensor x, Tensor alpha, Tensor w, Tensor? b) -> Tensor");
  m.def("dyt_bwd(Tensor dy, Tensor x, Tensor alpha, Tensor w, Tensor? b) -> (Tensor, Tensor, Tensor, Tensor?)");
}

// AutogradCPU, not Autograd: the kernels read CPU memory, so a tensor on another device
// finds no kernel and gets the dispatcher's error rather than a crash.
TORCH_LIBRARY_IMPL(normbench, AutogradCPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("group_norm", group_norm);
  m.impl("scale_norm", scale_norm);
  m.impl("dyt", dyt);
}

TORCH_LIBRARY_IMPL(normbench, CPU, m) {
  m.impl("rms_norm", rms_norm_nograd);
  m.impl("group_norm", group_norm_nograd);
  m.impl("scale_norm", scale_norm_nograd);
  m.impl("dyt", dyt_nograd);
  m.impl("rms_norm_fwd", rms_norm_fwd);
  m.impl("rms_norm_bwd", rms_norm_bwd);
  m.impl("group_norm_fwd", group_norm_fwd);
  m.impl("group_norm_bwd", group_norm_bwd);
  m.impl("scale_norm_fwd", scale_norm_fwd);
  m.impl("scale_norm_bwd", scale_norm_bwd);
  m.impl("dyt_fwd", dyt_fwd);
  m.impl("dyt_bwd", dyt_bwd);
}
