// Per-element cost of DyT's tanh against LayerNorm's arithmetic, in cache, on this CPU: is DyT at
// LayerNorm's time a matter of implementation, or of the math? (The kernels' costs:
// docs/benchmarks.md#every-norm-against-layernorm-fused-cpu-kernels.)
//
//   g++ -O3 -march=native -fopenmp-simd -fno-math-errno -fno-trapping-math \
//       benchmarks/dyt_tanh_cost.cpp -o /tmp/dyt_tanh_cost && taskset -c 1 /tmp/dyt_tanh_cost
//
// Same compiler flags and row loops as normbench/kernels/norms_cpu.cpp, on a 1 MB tensor
// (1024 x 256) that stays in cache, so memory bandwidth is out of the picture:
//   ln-like     two passes per row (sum and sum of squares, then (x - m) * r * w + b)
//   dyt div     normbench's DyT forward: Eigen's 13/6 rational tanh, one division per element
//   dyt rcp     the same with the division replaced by rcpps and one Newton step (AVX2 only)
//   dyt pade    a cheaper [7/6] Pade tanh, accurate to 1e-4 only (too coarse for the backward)
// It also prints the worst relative error of the two alternatives over [-10, 10].
#if !defined(__AVX2__) || !defined(__FMA__)
#error "this benchmark needs an x86 CPU with AVX2 and FMA (-march=native)"
#endif
#include <immintrin.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <vector>
#include <algorithm>

static inline float fast_tanh(float x) {
  const float clamp = 7.90531110763549805f;
  x = x < -clamp ? -clamp : x; x = x > clamp ? clamp : x;
  const float x2 = x * x;
  float p = -2.76076847742355e-16f;
  p = p * x2 + 2.00018790482477e-13f; p = p * x2 + -8.60467152213735e-11f;
  p = p * x2 + 5.12229709037114e-08f; p = p * x2 + 1.48572235717979e-05f;
  p = p * x2 + 6.37261928875436e-04f; p = p * x2 + 4.89352455891786e-03f;
  p = p * x;
  float q = 1.19825839466702e-06f;
  q = q * x2 + 1.18534705686654e-04f; q = q * x2 + 2.26843463243900e-03f; q = q * x2 + 4.89352518554385e-03f;
  return p / q;
}
// rcp + one Newton step instead of the division
static inline __m256 tanh8_rcp(__m256 x) {
  const __m256 c = _mm256_set1_ps(7.90531110763549805f);
  x = _mm256_max_ps(_mm256_min_ps(x, c), _mm256_sub_ps(_mm256_setzero_ps(), c));
  __m256 x2 = _mm256_mul_ps(x, x);
  __m256 p = _mm256_set1_ps(-2.76076847742355e-16f);
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(2.00018790482477e-13f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(-8.60467152213735e-11f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(5.12229709037114e-08f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(1.48572235717979e-05f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(6.37261928875436e-04f));
  p = _mm256_fmadd_ps(p, x2, _mm256_set1_ps(4.89352455891786e-03f));
  p = _mm256_mul_ps(p, x);
  __m256 q = _mm256_set1_ps(1.19825839466702e-06f);
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(1.18534705686654e-04f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(2.26843463243900e-03f));
  q = _mm256_fmadd_ps(q, x2, _mm256_set1_ps(4.89352518554385e-03f));
  __m256 r = _mm256_rcp_ps(q);
  r = _mm256_mul_ps(r, _mm256_fnmadd_ps(q, r, _mm256_set1_ps(2.0f)));
  return _mm256_mul_ps(p, r);
}
// [7/6] Pade of tanh (Lambert), clamped where it reaches 1
static inline float pade_tanh(float x) {
  const float clamp = 4.97f;
  x = x < -clamp ? -clamp : x; x = x > clamp ? clamp : x;
  const float x2 = x * x;
  float p = x * (135135.f + x2 * (17325.f + x2 * (378.f + x2)));
  float q = 135135.f + x2 * (62370.f + x2 * (3150.f + x2 * 28.f));
  return p / q;
}
inline float ldbf(uint16_t v) { uint32_t u = uint32_t(v) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline uint16_t stbf(float f) { uint32_t u; std::memcpy(&u, &f, 4); u = f != f ? 0x7FC00000u : u + 0x7FFFu + ((u >> 16) & 1u); return uint16_t(u >> 16); }

template <class F> double timeit(F f, int reps) {
  f(); auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}
int main() {
  const int64_t d = 256, rows = 1024, n = d * rows;
  std::vector<float> x(n), y(n), w(d, 1.1f), b(d, 0.1f);
  std::vector<uint16_t> xb(n), yb(n);
  for (int64_t i = 0; i < n; ++i) { x[i] = std::sin(i * 0.37f) * 3; xb[i] = stbf(x[i]); }
  float a = 0.5f;
  auto fwd_f32 = [&] { for (int64_t i = 0; i < rows; ++i) { const float* xi = &x[i*d]; float* yi = &y[i*d];
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = w[j] * fast_tanh(a * xi[j]) + b[j]; } };
  auto fwd_bf = [&] { for (int64_t i = 0; i < rows; ++i) { const uint16_t* xi = &xb[i*d]; uint16_t* yi = &yb[i*d];
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = stbf(w[j] * fast_tanh(a * ldbf(xi[j])) + b[j]); } };
  auto fwd_bf_pade = [&] { for (int64_t i = 0; i < rows; ++i) { const uint16_t* xi = &xb[i*d]; uint16_t* yi = &yb[i*d];
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = stbf(w[j] * pade_tanh(a * ldbf(xi[j])) + b[j]); } };
  auto fwd_f32_rcp = [&] { for (int64_t i = 0; i < rows; ++i) { const float* xi = &x[i*d]; float* yi = &y[i*d];
    const __m256 av = _mm256_set1_ps(a);
    for (int64_t j = 0; j < d; j += 8) { __m256 t = tanh8_rcp(_mm256_mul_ps(av, _mm256_loadu_ps(xi + j)));
      _mm256_storeu_ps(yi + j, _mm256_fmadd_ps(_mm256_loadu_ps(&w[j]), t, _mm256_loadu_ps(&b[j]))); } } };
  auto copy_f32 = [&] { std::memcpy(y.data(), x.data(), n * 4); };
  auto ln_like = [&] { for (int64_t i = 0; i < rows; ++i) { const float* xi = &x[i*d]; float* yi = &y[i*d];
    float s = 0, s2 = 0;
#pragma omp simd reduction(+:s,s2)
    for (int64_t j = 0; j < d; ++j) { s += xi[j]; s2 += xi[j]*xi[j]; }
    float m = s / d, r = 1 / std::sqrt(s2 / d - m * m + 1e-5f);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = (xi[j] - m) * r * w[j] + b[j]; } };
  auto ln_bf = [&] { for (int64_t i = 0; i < rows; ++i) { const uint16_t* xi = &xb[i*d]; uint16_t* yi = &yb[i*d];
    float s = 0, s2 = 0;
#pragma omp simd reduction(+:s,s2)
    for (int64_t j = 0; j < d; ++j) { float v = ldbf(xi[j]); s += v; s2 += v*v; }
    float m = s / d, r = 1 / std::sqrt(s2 / d - m * m + 1e-5f);
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) yi[j] = stbf((ldbf(xi[j]) - m) * r * w[j] + b[j]); } };
  int reps = 200;
  printf("per element ns (in cache, 1 MB)\n");
  printf("copy f32      %.3f\n", timeit(copy_f32, reps) / n * 1e9);
  printf("ln-like f32   %.3f\n", timeit(ln_like, reps) / n * 1e9);
  printf("ln-like bf16  %.3f\n", timeit(ln_bf, reps) / n * 1e9);
  printf("dyt f32 div   %.3f\n", timeit(fwd_f32, reps) / n * 1e9);
  printf("dyt f32 rcp   %.3f\n", timeit(fwd_f32_rcp, reps) / n * 1e9);
  printf("dyt bf16 div  %.3f\n", timeit(fwd_bf, reps) / n * 1e9);
  printf("dyt bf16 pade %.3f\n", timeit(fwd_bf_pade, reps) / n * 1e9);
  // accuracy of pade vs tanh
  double worst = 0, worstx = 0; for (float z = -10; z < 10; z += 1e-3f) { double e = std::fabs(pade_tanh(z) - std::tanh((double)z)) / std::max(1e-30, std::fabs(std::tanh((double)z))); if (e > worst) { worst = e; worstx = z; } }
  printf("pade worst rel err %.3g at %.3f\n", worst, worstx);
  float xs[8]; float out[8]; double w2 = 0; for (float z = -10; z < 10; z += 8e-3f) { for (int k=0;k<8;++k) xs[k]=z+k*1e-3f; _mm256_storeu_ps(out, tanh8_rcp(_mm256_loadu_ps(xs))); for (int k=0;k<8;++k){ double e = std::fabs(out[k]-std::tanh((double)xs[k]))/std::max(1e-30,std::fabs(std::tanh((double)xs[k]))); w2 = std::max(w2,e);} }
  printf("rcp worst rel err %.3g (float eps %.3g)\n", w2, 1.19e-7);
  return 0;
}
