// normbench's fused CPU kernels for the norms PyTorch has no fused CPU kernel for:
// RMSNorm, ScaleNorm and DyT, forward and backward, registered as torch.ops.normbench.*.
//
// Each op makes the fewest full-size passes its math allows, row by row so that the
// second pass over a row reads it from cache: a forward reads x once from memory and
// writes y once; a backward reads x and dy once and writes dx once. Statistics and
// parameter gradients accumulate in float32 (double for double inputs); half inputs
// come back in their own dtype. Inner loops are written for the compiler's
// auto-vectoriser (`omp simd` reductions; no libm call in the float tanh).
//
// The user-facing ops torch.ops.normbench.{rms_norm, scale_norm, dyt} carry their own
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

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace {

using at::Tensor;

// Rows of a contiguous (rows, dim) view split among threads; each thread keeps its own
// float32 partial sums for the parameter gradients, summed at the end.
template <typename F>
void for_rows(int64_t rows, F&& body) {
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) { body(begin, end); });
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
inline acc_t dot(const T* a, const T* b, int64_t d) {
  acc_t s = 0;
#pragma omp simd reduction(+ : s)
  for (int64_t j = 0; j < d; ++j) s += ld<acc_t>(a[j]) * ld<acc_t>(b[j]);
  return s;
}

// Float tanh as a 13/6 rational function p / q (Eigen's generic_fast_tanh_float): within a
// few ulp of std::tanh (tests/test_norms.py checks it against float64), and vectorisable, unlike
// a libm call per element. V is float, or the 8-lane vector of DyT's vector path below.
template <typename V>
inline void tanh_rational(V x, V& p, V& q) {
  const float clamp = 7.90531110763549805f;
  x = x < -clamp ? -clamp : x;  // a NaN passes both tests and comes out NaN
  x = x > clamp ? clamp : x;
  const V x2 = x * x;
  p = x2 * -2.76076847742355e-16f + 2.00018790482477e-13f;
  p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f;
  p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f;
  p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  q = x2 * 1.19825839466702e-06f + 1.18534705686654e-04f;
  q = q * x2 + 2.26843463243900e-03f;
  q = q * x2 + 4.89352518554385e-03f;  // q >= 4.9e-3: no zero, no infinity to invert
}
inline float fast_tanh(float x) {
  float p, q;
  tanh_rational(x, p, q);
  return p / q;  // near 0 this is x * (1 - 1.3e-7): Eigen's |x| < 4e-4 shortcut is not needed
}
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

// DyT in 8-lane vectors where the CPU has AVX2 and FMA (GCC/Clang vector extensions). What sets
// DyT's time is its tanh, and what sets the tanh's is the division: here it is the reciprocal
// estimate (rcpps, 12 bits) plus one Newton step, within 3.4e-7 of tanh (a few ulp, like the
// division), ~18% less time per element (benchmarks/dyt_tanh_cost.cpp). Float and bf16 only;
// other dtypes, and the tails of rows, take the scalar loops above.
#if defined(__AVX2__) && defined(__FMA__) && (defined(__GNUC__) || defined(__clang__))
#define NORMBENCH_DYT_VEC 1
#include <immintrin.h>
typedef float v8f __attribute__((vector_size(32)));
typedef uint32_t v8u __attribute__((vector_size(32)));

inline v8f load8(const float* p) { v8f v; std::memcpy(&v, p, sizeof v); return v; }
inline v8f load8(const c10::BFloat16* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return (v8f)_mm256_slli_epi32(wide, 16);
}
inline void store8(float* p, v8f v) { std::memcpy(p, &v, sizeof v); }
inline void store8(c10::BFloat16* p, v8f v) {  // round to nearest even, NaN kept, as st<BFloat16>
  v8u u = (v8u)v;
  u = u + 0x7FFFu + ((u >> 16) & 1u);
  u = (v != v) ? (v8u{} + 0x7FC00000u) : u;
  // AVX2 has no 32-to-16-bit narrowing: pack (within 128-bit lanes), then gather the halves.
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32((__m256i)(u >> 16), _mm256_setzero_si256()), 0xD8);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
}

inline v8f tanh8(v8f x) {
  v8f p, q;
  tanh_rational(x, p, q);
  v8f r = __builtin_ia32_rcpps256(q);
  r = r * (2.0f - q * r);
  return p * r;
}

template <typename T>
void dyt_fwd_row_vec(const T* x, T* y, float a, const float* w, const float* b, int64_t d) {
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) store8(y + j, load8(w + j) * tanh8(a * load8(x + j)) + load8(b + j));
  dyt_fwd_row(x + j, y + j, a, w + j, b + j, d - j);
}

template <typename T>
float dyt_bwd_row_vec(const T* x, const T* g, T* dx, float a, const float* w, float* dw, float* db, int64_t d) {
  v8f da = {};
  int64_t j = 0;
  for (; j + 8 <= d; j += 8) {
    const v8f xv = load8(x + j), gv = load8(g + j);
    const v8f t = tanh8(a * xv);
    const v8f u = gv * load8(w + j) * (1.0f - t * t);
    store8(dx + j, a * u);
    da += xv * u;
    store8(dw + j, load8(dw + j) + gv * t);
    store8(db + j, load8(db + j) + gv);
  }
  float total = dyt_bwd_row(x + j, g + j, dx + j, a, w + j, dw + j, db + j, d - j);
  for (int k = 0; k < 8; ++k) total += da[k];
  return total;
}
#endif

template <typename T>
constexpr bool dyt_vectorised() {
#ifdef NORMBENCH_DYT_VEC
  return std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
#else
  return false;
#endif
}

template <typename T, typename acc_t>
void dyt_fwd_row_best(const T* x, T* y, acc_t a, const acc_t* w, const acc_t* b, int64_t d) {
#ifdef NORMBENCH_DYT_VEC
  if constexpr (dyt_vectorised<T>()) return dyt_fwd_row_vec(x, y, a, w, b, d);
#endif
  dyt_fwd_row(x, y, a, w, b, d);
}

template <typename T, typename acc_t>
acc_t dyt_bwd_row_best(const T* x, const T* g, T* dx, acc_t a, const acc_t* w, acc_t* dw, acc_t* db, int64_t d) {
#ifdef NORMBENCH_DYT_VEC
  if constexpr (dyt_vectorised<T>()) return dyt_bwd_row_vec(x, g, dx, a, w, dw, db, d);
#endif
  return dyt_bwd_row(x, g, dx, a, w, dw, db, d);
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
  auto acc_type = rstd.scalar_type();
  Tensor wa = w.to(acc_type).contiguous();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  Tensor partial = at::zeros({chunks, d}, x.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "rms_norm_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    const acc_t* rp = rstd.const_data_ptr<acc_t>();
    acc_t* pp = partial.data_ptr<acc_t>();
    const int64_t per = (rows + chunks - 1) / chunks;
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        acc_t* dw = pp + c * d;
        for (int64_t i = c * per; i < std::min(rows, (c + 1) * per); ++i) {
          const scalar_t* xi = xp + i * d;
          const scalar_t* gi = gp + i * d;
          scalar_t* dxi = dxp + i * d;
          rms_bwd_row(xi, gi, dxi, wp, rp[i], dw, d);
        }
      }
    });
  });
  return {dx, partial.sum(0)};
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
  Tensor dg_rows = at::empty({rows}, norm.options());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "scale_norm_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t gain = g.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* np = norm.const_data_ptr<acc_t>();
    acc_t* dgp = dg_rows.data_ptr<acc_t>();
    for_rows(rows, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        const scalar_t* xi = xp + i * d;
        const scalar_t* gi = gp + i * d;
        scalar_t* dxi = dxp + i * d;
        const acc_t n = np[i];
        const acc_t c = std::max(n, static_cast<acc_t>(eps));
        const acc_t s = gain / c;
        const acc_t dt = dot<acc_t>(gi, xi, d);
        dgp[i] = dt / c;
        scale_bwd_row(xi, gi, dxi, s, n < eps ? acc_t(0) : dt / (c * c), d);
      }
    });
  });
  return {dx, dg_rows.sum().to(g.scalar_type())};
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
  auto acc_type = x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  Tensor wa = w.to(acc_type).contiguous();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), rows));
  // per chunk: dw (d), db (d), dalpha (1)
  Tensor partial = at::zeros({chunks, 2 * d + 1}, x.options().dtype(acc_type));
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "dyt_bwd", [&] {
    using acc_t = at::opmath_type<scalar_t>;
    const acc_t a = alpha.item<double>();
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.data_ptr<scalar_t>();
    const acc_t* wp = wa.const_data_ptr<acc_t>();
    acc_t* pp = partial.data_ptr<acc_t>();
    const int64_t per = (rows + chunks - 1) / chunks;
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        acc_t* dw = pp + c * (2 * d + 1);
        acc_t* db = dw + d;
        acc_t da = 0;
        for (int64_t i = c * per; i < std::min(rows, (c + 1) * per); ++i) {
          const scalar_t* xi = xp + i * d;
          const scalar_t* gi = gp + i * d;
          scalar_t* dxi = dxp + i * d;
          da += dyt_bwd_row_best(xi, gi, dxi, a, wp, dw, db, d);
        }
        dw[2 * d] = da;
      }
    });
  });
  Tensor total = partial.sum(0);
  std::optional<Tensor> db;
  if (b.has_value()) db = total.slice(0, d, 2 * d).to(b->scalar_type());
  return {dx, total[2 * d].to(alpha.scalar_type()), total.slice(0, 0, d).to(w.scalar_type()), db};
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
Tensor scale_norm(const Tensor& x, const Tensor& g, double eps) { return ScaleNormFn::apply(x, g, eps); }
Tensor dyt(const Tensor& x, const Tensor& alpha, const Tensor& w, const std::optional<Tensor>& b) {
  return DyTFn::apply(x, alpha, w, b);
}

// Below autograd (inference mode, or called from a backward): the forward kernel alone.
Tensor rms_norm_nograd(const Tensor& x, const Tensor& w, double eps) {
  return std::get<0>(rms_norm_fwd(x.contiguous(), w.contiguous(), eps));
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
  m.def("scale_norm(Tensor x, Tensor g, float eps) -> Tensor");
  m.def("dyt(Tensor x, Tensor alpha, Tensor w, Tensor? b) -> Tensor");
  m.def("rms_norm_fwd(Tensor x, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rms_norm_bwd(Tensor dy, Tensor x, Tensor w, Tensor rstd, float eps) -> (Tensor, Tensor)");
  m.def("scale_norm_fwd(Tensor x, Tensor g, float eps) -> (Tensor, Tensor)");
  m.def("scale_norm_bwd(Tensor dy, Tensor x, Tensor g, Tensor norm, float eps) -> (Tensor, Tensor)");
  m.def("dyt_fwd(Tensor x, Tensor alpha, Tensor w, Tensor? b) -> Tensor");
  m.def("dyt_bwd(Tensor dy, Tensor x, Tensor alpha, Tensor w, Tensor? b) -> (Tensor, Tensor, Tensor, Tensor?)");
}

// AutogradCPU, not Autograd: the kernels read CPU memory, so a tensor on another device
// finds no kernel and gets the dispatcher's error rather than a crash.
TORCH_LIBRARY_IMPL(normbench, AutogradCPU, m) {
  m.impl("rms_norm", rms_norm);
  m.impl("scale_norm", scale_norm);
  m.impl("dyt", dyt);
}

TORCH_LIBRARY_IMPL(normbench, CPU, m) {
  m.impl("rms_norm", rms_norm_nograd);
  m.impl("scale_norm", scale_norm_nograd);
  m.impl("dyt", dyt_nograd);
  m.impl("rms_norm_fwd", rms_norm_fwd);
  m.impl("rms_norm_bwd", rms_norm_bwd);
  m.impl("scale_norm_fwd", scale_norm_fwd);
  m.impl("scale_norm_bwd", scale_norm_bwd);
  m.impl("dyt_fwd", dyt_fwd);
  m.impl("dyt_bwd", dyt_bwd);
}
