/* blas_threads.c — benchmark: cblas_sgemm on the CPU model's product shapes (GPT-2 small's
 * layer products at B*T = 2048, the weight gradient's transposed A, a 50257-column head, and
 * 2048^3), best of 3 runs with 1 and with 2 threads, and whether the 1- and 2-thread results
 * have the same bits. Built twice by bench/blas_threads.sh: against OpenBLAS, and against BLIS
 * (-DUSE_BLIS, Debian's libblis-openmp-dev), whose threading splits only M and N. */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#ifdef USE_BLIS
void bli_thread_set_num_threads(long n);
static void set_threads(int n) { bli_thread_set_num_threads(n); }
static const char *NAME = "blis";
#else
void openblas_set_num_threads(int n);
static void set_threads(int n) { openblas_set_num_threads(n); }
static const char *NAME = "openblas";
#endif
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
    /* M K N transA: C(M,N) = op(A) B; transA 1: A stored (K,M) (the weight gradient's dout^T inp) */
    const int sh[][4] = {{2048, 256, 768, 0}, {2048, 1024, 256, 0}, {256, 2048, 1024, 1}, {1024, 384, 50257, 0},
                         {50257, 1024, 384, 1}, {2048, 2048, 2048, 0}};
    for (size_t s = 0; s < sizeof sh / sizeof *sh; s++) {
        const int M = sh[s][0], K = sh[s][1], N = sh[s][2], ta = sh[s][3];
        float *a = malloc((size_t)M * K * 4), *b = malloc((size_t)K * N * 4), *c[2];
        for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)((i * 2654435761u) % 2001) * 1e-3f - 1.0f;
        for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)((i * 40503u) % 2001) * 1e-3f - 1.0f;
        double rate[2] = {0, 0};
        for (int t = 0; t < 2; t++) {
            set_threads(t + 1);
            c[t] = malloc((size_t)M * N * 4);
            for (int r = 0; r < 4; r++) {
                double t0 = now();
                cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, ta ? M : K, b,
                            N, 0.0f, c[t], N);
                double g = 2.0 * M * (double)K * N / (now() - t0) / 1e9;
                if (r && g > rate[t]) rate[t] = g;
            }
        }
        printf("%-8s M %5d K %5d N %5d %s | 1 thread %6.1f GFLOP/s | 2 threads %6.1f GFLOP/s | 1 vs 2 threads: %s\n",
               NAME, M, K, N, ta ? "A^T" : "A  ", rate[0], rate[1],
               memcmp(c[0], c[1], (size_t)M * N * 4) ? "DIFFER" : "same bits");
        free(a), free(b), free(c[0]), free(c[1]);
    }
    return 0;
}
