/* The packed-panel linear kernel of the hf engine (server/engines/hf/linears/panel.py):
 * y [M, N] = x [M, K] @ W^T, with W packed once at load as [N / 32, K, 32] (32-column panels).
 * Built at first use by linears/build.py (cc -O3 -march=native -fopenmp -shared -fPIC, linked
 * to torch's libgomp) and self-checked against F.linear at load; the design and the measurements
 * are in panel.py's docstring. CI checks that it parses: cc -fsyntax-only (tests). */
#define PANEL 32
#define AHEAD 16 /* weight rows fetched ahead (2 KB): the prefetcher alone lagged at 8-16 rows */
#define KB 128 /* K summed in blocks: each block's sum added to y (fp32 error ~5x less than one long sum) */
#if defined(__AVX512F__)
#define VB 64 /* bytes a vector register holds */
#define ISA 512
#ifndef RMAX
#define RMAX 8 /* rows a kernel call: 8 x 2 accumulators of the 32 registers */
#endif
#else
#define VB 32
#if defined(__AVX2__) && defined(__FMA__)
#define ISA 256
#else
#define ISA 0
#endif
#ifndef RMAX
#define RMAX 3 /* 3 x 4 accumulators of the 16 registers */
#endif
#endif
#define LANES (VB / 4)
#define NV (PANEL / LANES) /* vectors in a panel's row */
typedef float vec __attribute__((vector_size(VB)));
static inline vec ld(const float* p) { vec v; __builtin_memcpy(&v, p, VB); return v; }
static inline void st(float* p, vec v) { __builtin_memcpy(p, &v, VB); }
/* rows m0..m0+MM of y[:, panel] = x[rows] @ W[panel]^T; P is the panel [K, 32] */
#define KERNEL(MM) \
static void k##MM(const float* x, long K, const float* P, float* y, long N) { \
  for (long k0 = 0; k0 < K; k0 += KB) { \
    long kend = k0 + KB < K ? k0 + KB : K; \
    vec a[MM][NV]; \
    for (int m = 0; m < MM; m++) for (int j = 0; j < NV; j++) a[m][j] = (vec){0}; \
    for (long k = k0; k < kend; k++) { \
      vec w[NV]; \
      for (int j = 0; j < NV; j++) w[j] = ld(P + k * PANEL + j * LANES); \
      __builtin_prefetch(P + (k + AHEAD) * PANEL); __builtin_prefetch(P + (k + AHEAD) * PANEL + 16); \
      for (int m = 0; m < MM; m++) { \
        float xv = x[m * K + k]; \
        for (int j = 0; j < NV; j++) a[m][j] += w[j] * xv; \
      } \
    } \
    for (int m = 0; m < MM; m++) for (int j = 0; j < NV; j++) { \
      float* yj = y + m * N + j * LANES; \
      if (k0) a[m][j] += ld(yj); \
      st(yj, a[m][j]); \
    } \
  } \
}
KERNEL(1) KERNEL(2) KERNEL(3) KERNEL(4) KERNEL(5) KERNEL(6) KERNEL(7) KERNEL(8)
typedef void (*kfn)(const float*, long, const float*, float*, long);
static const kfn KS[9] = {0, k1, k2, k3, k4, k5, k6, k7, k8};
/* the vector width this build runs on: 512 (AVX-512), 256 (AVX2 + FMA) or 0 (neither: not used) */
int panel_gemm_isa(void) { return ISA; }
/* y [M, N] = x [M, K] @ W^T, W packed as [N / 32, K, 32]; panels split across threads */
void panel_gemm(const float* x, long M, long K, const float* W, long N, float* y, int threads) {
  long NB = N / PANEL;
  #pragma omp parallel for schedule(static) num_threads(threads)
  for (long nb = 0; nb < NB; nb++) {
    const float* P = W + nb * K * PANEL;
    for (long m0 = 0; m0 < M; m0 += RMAX) {
      long mm = M - m0 < RMAX ? M - m0 : RMAX;
      KS[mm](x + m0 * K, K, P, y + m0 * N + nb * PANEL, N);
    }
  }
}
