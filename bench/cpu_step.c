/* cpu_step.c — benchmark: one full training step (forward, backward, AdamW) of a GPT-2 or a
 * Llama-family model on the CPU backend, against the sgemm peak measured on this machine in the
 * same run.
 *
 *   bench_cpu_step [--threads N] [--steps K] [--B 8 --T 256 --L 4 --C 256 --H 4 --V 256]
 *                  [--arch llama --KV 2 --F 512 --hs 0 --tied 1]   (--smollm2: SmolLM2-135M's shape)
 *                  [--products 1|2] [--lora R [--base16 1]] [--bf16 1]
 *
 * --lora R: model.lora of rank R (alpha 2R) on every projection of the architecture (Llama: q, k,
 * v, o, gate, up, down): the base frozen, AdamW over the adapters; the FLOPs and "% of peak"
 * lines still count a full step's 6N (a LoRA step skips the frozen weights' gradients).
 * --base16 1: with it, model.lora.base_dtype bf16 (the frozen matrices kept in bf16, widened for
 * each product).
 * --bf16 1: training.precision bf16, the weight products with bf16 inputs (oneDNN; the CPU needs
 * AVX512-BF16 or AMX); "% of sgemm peak" is still of the fp32 peak.
 *
 * --products 1: instead of steps, every weight product of one layer and the head, forward, input
 * gradient and weight gradient, through the backend (its thread-invariant tiles, ops_cpu.c
 * sgemm_rows) against one cblas_sgemm of the whole product on the same threads (OpenBLAS's own
 * threading, whose results change with the thread count): the best of --steps runs of each, in
 * ms and GFLOP/s, and their ratio; then the attention's forward and backward through the backend
 * (GFLOP/s of the causal half of its T x T products), and the optimizer's: the gradient's sum of
 * squares and AdamW over the model's weight matrices' floats (GB/s of the memory they touch).
 * --products 2: those last rows only (the attention's and the optimizer's).
 *
 * Prints ms/step (mean, best and median), tokens/s, model FLOPs/s (6N + 12LAT per token, see
 * dt_model_flops_per_token) and that as a fraction of the sgemm peak: the best cblas_sgemm rate
 * over 1024^3, 2048^3 and the model's own matmul shapes, measured in the same run with the same
 * threads; and the same rate of dtrain's own products (the backend's matmul_fwd, on oneDNN where
 * dtrain is built with it, else OpenBLAS's tiles; DTRAIN_CPU_GEMM=openblas chooses the latter)
 * over the same shapes. The last line is JSON ({"ms_per_step": median, ..., "peak_gflops",
 * "peak_share": the median step's share of the sgemm peak, "products_peak_gflops",
 * "products_peak_share": of dtrain's products' peak}) for bench/llama_vs_torch.sh and
 * bench/cpu_vs_torch.sh. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dtrain/model.h"
#include "dtrain/backend.h"
#include "dtrain/optim.h"

void openblas_set_num_threads(int n);

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Best FLOP/s of one product shape (M,K,N) over `reps` runs after a warm-up: one whole
 * cblas_sgemm (OpenBLAS's own threads) when be is NULL, else the backend's matmul_fwd (its tiles,
 * on oneDNN or OpenBLAS). */
static double gemm_rate(const dt_backend *be, int M, int K, int N, int reps) {
    float *a = malloc((size_t)M * K * sizeof(float)), *b = malloc((size_t)K * N * sizeof(float)),
          *c = malloc((size_t)M * N * sizeof(float));
    if (!a || !b || !c) { fprintf(stderr, "out of memory for a %d x %d x %d product\n", M, K, N); exit(1); }
    for (size_t i = 0; i < (size_t)M * K; i++) a[i] = (float)(i % 7) * 0.1f;
    for (size_t i = 0; i < (size_t)K * N; i++) b[i] = (float)(i % 5) * 0.1f;
    double best = 0;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        if (be) be->ops->matmul_fwd(be->ctx, (dt_act *)c, (const dt_act *)a, b, NULL, M, K, N, N, 0);
        else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, N, K, 1.0f, a, K, b, N, 0.0f, c, N);
        double rate = 2.0 * M * (double)K * N / (now_s() - t0);
        if (r > 0 && rate > best) best = rate;
    }
    free(a); free(b); free(c);
    return best;
}

/* The peak: the best rate over large square products and the model's own shapes, of one whole
 * sgemm (be NULL: "the sgemm peak") or of the backend's products; which: the best shape. */
static double gemm_peak(const dt_backend *be, int BT, int C, int F, char *which, size_t n) { /* F: the MLP's width */
    const int shapes[][3] = {{1024, 1024, 1024}, {2048, 2048, 2048}, {BT, C, F}, {BT, F, C}, {BT, C, 3 * C}};
    double best = 0;
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double r = gemm_rate(be, shapes[i][0], shapes[i][1], shapes[i][2], 5);
        if (r > best) {
            best = r;
            snprintf(which, n, "M=%d K=%d N=%d", shapes[i][0], shapes[i][1], shapes[i][2]);
        }
    }
    return best;
}

/* Best seconds of `reps` runs of f(arg) after a warm-up. */
static double best_of(int reps, void (*f)(void *), void *arg) {
    double best = 1e30;
    for (int r = 0; r <= reps; r++) {
        double t0 = now_s();
        f(arg);
        double dt = now_s() - t0;
        if (r > 0 && dt < best) best = dt;
    }
    return best;
}

/* One product's operands: inp(M,K), W (K,N) or (N,K) with trans, out(M,N), and their gradients. */
typedef struct prod {
    const dt_backend *be;
    int M, K, N, trans, which; /* which: 0 forward, 1 input gradient, 2 weight gradient */
    float *inp, *w, *out, *dinp, *dw;
} prod;

static void prod_dtrain(void *arg) {
    prod *p = arg;
    const dt_ops *o = p->be->ops;
    if (p->which == 0)
        o->matmul_fwd(p->be->ctx, (dt_act *)p->out, (dt_act *)p->inp, p->w, NULL, p->M, p->K, p->N, p->N, p->trans);
    else
        o->matmul_bwd(p->be->ctx, p->which == 1 ? (dt_act *)p->dinp : NULL, p->which == 2 ? p->dw : NULL, NULL,
                      (dt_act *)p->out, (dt_act *)p->inp, p->w, p->M, p->K, p->N, p->N, p->trans);
}

/* the same product as one cblas_sgemm (OpenBLAS threads) */
static void prod_whole(void *arg) {
    prod *p = arg;
    const CBLAS_TRANSPOSE wt = p->trans ? CblasTrans : CblasNoTrans, wn = p->trans ? CblasNoTrans : CblasTrans;
    const int ldw = p->trans ? p->K : p->N;
    if (p->which == 0)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, wt, p->M, p->N, p->K, 1.0f, p->inp, p->K, p->w, ldw, 0.0f, p->out, p->N);
    else if (p->which == 1)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, wn, p->M, p->K, p->N, 1.0f, p->out, p->N, p->w, ldw, 0.0f, p->dinp, p->K);
    else if (p->trans)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, p->N, p->K, p->M, 1.0f, p->out, p->N, p->inp, p->K, 1.0f, p->dw,
                    p->K);
    else
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, p->K, p->N, p->M, 1.0f, p->inp, p->K, p->out, p->N, 1.0f, p->dw,
                    p->N);
}

static float *filled(size_t n) {
    float *x = malloc(n * sizeof *x);
    if (!x) { fprintf(stderr, "out of memory for %zu floats\n", n); exit(1); }
    for (size_t i = 0; i < n; i++) x[i] = (float)((i * 2654435761u) % 1000) * 1e-3f - 0.5f;
    return x;
}

/* --products: the table (see the top of the file) */
static void products(const dt_backend *be, int threads, int reps, int BT, int C, int QKV, int A, int PRE, int ACT, int V,
                     int lt) { /* lt: the layers' weights stored (out, in), as the Llama family's nn.Linear */
    const struct { const char *name; int K, N, trans; } ps[] = {
        {"qkv", C, QKV, lt}, {"attn_out", A, C, lt}, {"mlp_in", C, PRE, lt}, {"mlp_out", ACT, C, lt}, {"head", C, V, 1}};
    static const char *const dir[] = {"forward", "input grad", "weight grad"};
    printf("| product | M K N | dtrain ms | GFLOP/s | one sgemm ms | GFLOP/s | dtrain / sgemm time |\n");
    printf("| --- | --- | --- | --- | --- | --- | --- |\n");
    double tot_d = 0, tot_w = 0;
    for (size_t i = 0; i < sizeof ps / sizeof ps[0]; i++)
        for (int which = 0; which < 3; which++) {
            prod p = {be, BT, ps[i].K, ps[i].N, ps[i].trans, which, filled((size_t)BT * ps[i].K),
                      filled((size_t)ps[i].K * ps[i].N), filled((size_t)BT * ps[i].N), filled((size_t)BT * ps[i].K),
                      filled((size_t)ps[i].K * ps[i].N)};
            const double flop = 2.0 * BT * (double)ps[i].K * ps[i].N;
            const double td = best_of(reps, prod_dtrain, &p);
            openblas_set_num_threads(threads);
            const double tw = best_of(reps, prod_whole, &p);
            be->ops->set_threads(be->ctx, threads); /* the backend's OpenMP threads again (OpenBLAS's OpenMP build
                                                       sets them with its own) */
            tot_d += td, tot_w += tw;
            printf("| %s %s | %d %d %d | %.2f | %.1f | %.2f | %.1f | %.2f |\n", ps[i].name, dir[which], BT, ps[i].K,
                   ps[i].N, td * 1e3, flop / td / 1e9, tw * 1e3, flop / tw / 1e9, td / tw);
            free(p.inp); free(p.w); free(p.out); free(p.dinp); free(p.dw);
        }
    printf("| all | | %.2f | | %.2f | | %.2f |\n", tot_d * 1e3, tot_w * 1e3, tot_d / tot_w);
}

/* --products: the optimizer's rows under the table, over the weights' n floats: the gradient's
 * sum of squares (the clipping norm: reads n) and AdamW (reads p, g, m, v, writes p, m, v), in
 * ms and GB/s of that traffic */
typedef struct opt_run {
    const dt_backend *be;
    size_t n;
    float *p, *g, *m, *v;
    int adamw;
} opt_run;

static void opt_call(void *arg) {
    opt_run *o = arg;
    if (o->adamw) {
        const dt_adamw_piece all = {0, 0, o->n, 1};
        o->be->ops->adamw(o->be->ctx, o->p, o->g, o->m, o->v, &all, 1, 1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, 3);
    } else {
        double s;
        const dt_range all = {0, o->n};
        o->be->ops->sumsq(o->be->ctx, &s, o->g, &all, 1);
    }
}

static void optimizer_rows(const dt_backend *be, int reps, size_t n) {
    opt_run o = {be, n, filled(n), filled(n), filled(n), filled(n), 0};
    for (size_t i = 0; i < n; i++) o.v[i] = o.v[i] * o.v[i]; /* a second moment is >= 0 */
    for (o.adamw = 0; o.adamw < 2; o.adamw++) {
        const double t = best_of(reps, opt_call, &o), bytes = (o.adamw ? 7.0 : 1.0) * 4.0 * (double)n;
        printf("| %s | %zu floats | %.2f | %.1f GB/s | | | |\n", o.adamw ? "AdamW" : "sum of squares", n, t * 1e3,
               bytes / t / 1e9);
    }
    free(o.p); free(o.g); free(o.m); free(o.v);
}

/* --products: the attention's rows under the table, forward and backward through the backend;
 * GFLOP/s counts the causal half of its four (B, NH, T, T, hs) products' 2 T T hs each */
typedef struct att_run {
    const dt_backend *be;
    dt_att_shape s;
    float *qkv, *out, *att, *dout, *dqkv, *datt;
    int bwd;
} att_run;

static void att_call(void *arg) {
    att_run *a = arg;
    const dt_ops *o = a->be->ops;
    if (!a->bwd) o->attention_fwd(a->be->ctx, (dt_act *)a->out, a->att, (dt_act *)a->qkv, &a->s);
    else o->attention_bwd(a->be->ctx, (dt_act *)a->dqkv, a->datt, (dt_act *)a->dout, (dt_act *)a->qkv, (dt_act *)a->out,
                          a->att, &a->s);
}

static void attention_rows(const dt_backend *be, int reps, int B, int T, int NH, int NKV, int hs) {
    att_run a = {.be = be, .s = {B, T, NH, NKV, hs, NULL}};
    size_t att, datt;
    be->ops->attention_bytes(be->ctx, &a.s, 0, &att, &datt);
    const size_t nqkv = (size_t)B * T * (NH + 2 * NKV) * hs, nout = (size_t)B * T * NH * hs;
    a.qkv = filled(nqkv), a.dqkv = filled(nqkv), a.out = filled(nout), a.dout = filled(nout);
    a.att = malloc(att), a.datt = malloc(datt);
    const double flop = 2.0 * 2.0 * B * NH * (double)T * T * hs / 2; /* forward: q k^T and p v, causal */
    for (a.bwd = 0; a.bwd < 2; a.bwd++) {
        const double t = best_of(reps, att_call, &a), f = flop * (a.bwd ? 2 : 1);
        printf("| attention %s | B %d T %d NH %d NKV %d hs %d | %.2f | %.1f | | | |\n", a.bwd ? "backward" : "forward", B, T,
               NH, NKV, hs, t * 1e3, f / t / 1e9);
    }
    free(a.qkv); free(a.dqkv); free(a.out); free(a.dout); free(a.att); free(a.datt);
}

int main(int argc, char **argv) {
    int threads = 2, steps = 10, B = 8, T = 256, L = 4, C = 256, H = 4, V = 256, llama = 0, KV = 0, F = 0, hs = 0, tied = 1;
    int by_product = 0, lora = 0, base16 = 0, bf16 = 0;
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--smollm2")) { /* SmolLM2-135M: 30 layers of 576, 9 heads on 3, SwiGLU of 1536 */
            llama = 1, V = 49152, L = 30, C = 576, H = 9, KV = 3, F = 1536, hs = 64, tied = 1, B = 4, T = 256;
            memmove(argv + i, argv + i + 1, (size_t)(argc - i - 1) * sizeof *argv);
            argc--;
            break;
        }
    for (int i = 1; i + 1 < argc; i += 2) {
        int v = atoi(argv[i + 1]);
        if (!strcmp(argv[i], "--threads")) threads = v;
        else if (!strcmp(argv[i], "--steps")) steps = v;
        else if (!strcmp(argv[i], "--B")) B = v;
        else if (!strcmp(argv[i], "--T")) T = v;
        else if (!strcmp(argv[i], "--L")) L = v;
        else if (!strcmp(argv[i], "--C")) C = v;
        else if (!strcmp(argv[i], "--H")) H = v;
        else if (!strcmp(argv[i], "--V")) V = v;
        else if (!strcmp(argv[i], "--arch")) llama = !strcmp(argv[i + 1], "llama");
        else if (!strcmp(argv[i], "--KV")) KV = v;
        else if (!strcmp(argv[i], "--F")) F = v;
        else if (!strcmp(argv[i], "--hs")) hs = v;
        else if (!strcmp(argv[i], "--tied")) tied = v;
        else if (!strcmp(argv[i], "--products")) by_product = v;
        else if (!strcmp(argv[i], "--lora")) lora = v;
        else if (!strcmp(argv[i], "--base16")) base16 = v;
        else if (!strcmp(argv[i], "--bf16")) bf16 = v;
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    if (by_product < 0 || by_product > 2) { fprintf(stderr, "--products: expected 0 (the training step), 1 (the table) or 2 (the attention's and optimizer's rows), got %d\n", by_product); return 2; }
    if (base16 && !lora) { fprintf(stderr, "--base16 1 needs --lora R (the base it keeps in bf16 is LoRA's)\n"); return 2; }
    dt_backend *be;
    if (dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = threads, .precision = bf16 ? 1 : 0}, &be) != DT_OK) { fprintf(stderr, "%s\n", dt_error_msg()); return 1; }
    char which[64];
    double peak = gemm_peak(NULL, B * T, C, llama ? F : 4 * C, which, sizeof which);
    if (by_product) {
        const int hd = hs ? hs : C / H, kv = llama ? KV : H, A = H * hd;
        printf("%s V=%d T=%d C=%d H=%d B=%d, %d threads; sgemm peak %.1f GFLOP/s (%s)\n\n", llama ? "Llama" : "GPT-2", V, T,
               C, H, B, threads, peak / 1e9, which);
        if (by_product == 1) /* --products 2: the attention's and the optimizer's rows only */
            products(be, threads, steps, B * T, C, (H + 2 * kv) * hd, A, llama ? 2 * F : 4 * C, llama ? F : 4 * C, V, llama);
        attention_rows(be, steps, B, T, H, kv, hd);
        const size_t nw = (size_t)L * ((size_t)C * (H + 2 * kv) * hd + (size_t)A * C + (size_t)C * (llama ? 3 * F : 8 * C)) +
                          (size_t)V * C * (llama && !tied ? 2 : 1);
        optimizer_rows(be, steps, nw);
        dt_backend_close(be);
        return 0;
    }

    dt_model_cfg mc = {.shape = {.vocab_size = V, .n_positions = T, .n_layer = L, .n_head = H, .n_embd = C, .num_labels = 0},
                       .seq_len = T, .max_batch = B, .seed = 1};
    if (llama)
        mc.shape = (dt_model_shape){.arch = DT_ARCH_LLAMA, .vocab_size = V, .n_positions = T, .n_layer = L, .n_head = H,
                                    .n_embd = C, .num_key_value_heads = KV, .intermediate_size = F, .head_dim = hs,
                                    .rope_theta = 1e5, .rms_norm_eps = 1e-5, .tie_word_embeddings = tied};
    if (lora) mc.lora = (dt_lora){lora, 2.0 * lora, dt_lora_arch_targets(mc.shape.arch), base16 != 0};
    dt_model *m;
    if (dt_model_init(&m, &mc, be) != DT_OK) { fprintf(stderr, "%s\n", dt_error_msg()); return 1; }
    int nt = dt_model_num_tensors(m);
    dt_param_seg *segs = malloc((size_t)nt * sizeof *segs);
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i);
        segs[i] = (dt_param_seg){t->offset, t->numel, t->decay};
    }
    dt_optim_cfg oc = {.lr = 1e-4, .weight_decay = 0.01, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .grad_clip = 1.0,
                       .schedule = DT_SCHED_CONSTANT, .total_steps = steps};
    dt_optim *o;
    if (dt_optim_init(&o, &oc, be, dt_model_num_params(m), segs, nt) != DT_OK) return 1;
    int *tok = malloc((size_t)B * T * sizeof(int)), *tgt = malloc((size_t)B * T * sizeof(int));
    unsigned s = 1;
    for (int i = 0; i < B * T; i++) { s = s * 1103515245u + 12345u; tok[i] = (int)(s >> 16) % V; }
    for (int i = 0; i < B * T; i++) tgt[i] = tok[(i + 1) % (B * T)];

    double best = 1e30, total = 0, fwd_best = 1e30, *each = malloc((size_t)steps * sizeof *each);
    for (int k = 0; k < steps + 1; k++) {
        double t0 = now_s();
        long rows;
        const float scale = 1.0f / (float)(B * T);
        dt_model_zero_grad(m);
        /* as a training step runs it (worker.c): no predictions, the loss and its gradient fused */
        if (dt_model_forward_train(m, tok, tgt, B, scale, &rows) != DT_OK) return 1;
        double t1 = now_s();
        dt_model_backward(m, scale, NULL, NULL);
        double gn, lr;
        dt_optim_step(o, dt_model_params(m), dt_model_grads(m), k, &gn, &lr);
        double dt = now_s() - t0;
        if (k == 0) continue; /* warm-up */
        each[k - 1] = dt;
        total += dt;
        if (dt < best) best = dt;
        if (t1 - t0 < fwd_best) fwd_best = t1 - t0;
    }
    for (int i = 1; i < steps; i++) /* insertion sort: the median */
        for (int j = i; j > 0 && each[j] < each[j - 1]; j--) {
            double x = each[j];
            each[j] = each[j - 1];
            each[j - 1] = x;
        }
    const double median = steps % 2 ? each[steps / 2] : 0.5 * (each[steps / 2 - 1] + each[steps / 2]);
    double mean = total / steps, tokens = (double)B * T;
    double flops = dt_model_flops_per_token(&mc) * tokens;
    printf("%s V=%d T=%d L=%d C=%d H=%d B=%d, %zu params, %d threads (omp max %d)\n", llama ? "Llama" : "GPT-2", V, T, L,
           C, H, B, dt_model_num_params(m) + dt_model_num_frozen(m), threads, omp_get_max_threads());
    if (lora) printf("model.lora rank %d on every projection: %zu trainable, %zu frozen (%s)\n", lora,
                     dt_model_num_params(m), dt_model_num_frozen(m), base16 ? "matrices in bf16" : "fp32");
    dt_backend_desc d;
    be->ops->describe(be->ctx, &d);
    char bwhich[64];
    const double bpeak = gemm_peak(be, B * T, C, llama ? F : 4 * C, bwhich, sizeof bwhich);
    printf("sgemm peak (best shape %s):  %8.1f GFLOP/s\n", which, peak / 1e9);
    printf("dtrain's products' peak (%s; best shape %s): %.1f GFLOP/s\n", d.per_worker, bwhich, bpeak / 1e9);
    printf("training step: mean %.1f ms, best %.1f ms (forward best %.1f ms) over %d steps\n", mean * 1e3, best * 1e3,
           fwd_best * 1e3, steps);
    printf("tokens/s (mean):                  %8.0f\n", tokens / mean);
    printf("model FLOPs/s (mean):             %8.1f GFLOP/s = %.1f%% of sgemm peak\n", flops / mean / 1e9,
           100.0 * flops / mean / peak);
    printf("model FLOPs/s (best step):        %8.1f GFLOP/s = %.1f%% of sgemm peak\n", flops / best / 1e9,
           100.0 * flops / best / peak);
    printf("{\"ms_per_step\": %.2f, \"ms_best\": %.2f, \"ms_mean\": %.2f, \"tokens_per_s\": %.1f, \"params\": %zu, "
           "\"peak_gflops\": %.1f, \"peak_share\": %.4f, \"products_peak_gflops\": %.1f, \"products_peak_share\": %.4f}\n",
           median * 1e3, best * 1e3, mean * 1e3, tokens / median, dt_model_num_params(m), peak / 1e9,
           flops / median / peak, bpeak / 1e9, flops / median / bpeak);
    free(tok); free(tgt); free(segs); free(each);
    dt_optim_free(o);
    dt_model_free(m);
    dt_backend_close(be);
    return 0;
}
