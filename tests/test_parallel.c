/* test_parallel.c — model parallelism (training.tensor_parallel, pipeline_parallel) through the
 * real binary:
 *   - equivalence: a GPT-2 and a Llama with grouped-query attention (4 layers), as classifiers
 *     and as language models (the vocabulary of 257 split unevenly: the embedding, the tied or
 *     own output head and the cross-entropy in shares), each trained 20 steps on 1 worker x
 *     batch 8 and on T2 (2 workers), T4 (4 workers) and D2xT2 (4 workers, batch 4 each; with and
 *     without ZeRO-1 over the replicas), and in pipeline stages (1F1B over grad_accum_steps
 *     micro-batches of 2 or 1: the same 8 rows a step) on P4, P2xT2, D2xP2 (with and without
 *     ZeRO-1) and P2 on 2 workers: the same per-step losses (1e-5 relative), the same final
 *     weights and AdamW moments (relative L2 distance <= 1e-5; the files whole, as one worker
 *     writes them; GPT-2's tied embedding, held by the first and last stages, one tensor) and
 *     the same evaluation (confusion matrix, or loss and accuracy: each replica's predictions
 *     counted once);
 *   - checkpoints stay whole: D2xT2's checkpoint of step 10 (also with ZeRO-1) and D2xP2's
 *     (ZeRO-1) resume on 1 worker, P2xT2's of the language model too, and the 1-worker
 *     checkpoint of step 10 resumes on T4 and on P4; each ends on the 1-worker run's weights and
 *     AdamW moments; so do a D2xT2 run whose share 3 is killed at step 15 and a D2xP2 run whose
 *     last stage is, both restarted; at width 840 (shares of more than one gather window) T2, P2
 *     and D2xT2 with ZeRO-1 end on the 1-worker run's too;
 *   - measured, each worker's memory falls as 1/T: resident memory while training a model whose
 *     weights and AdamW state dwarf everything else, less the same process's with a tiny model;
 *   - samples during training (logging.sample_every_steps) from D2xT2 are the 1-worker run's;
 *   - --dry-run says each worker's share, and each stage's layers, parameters, memory and the
 *     schedule's bubble; dtrain doctor --tensor-parallel checks every group's collective;
 *   - a worker killed mid-run stops the others at once (exit 1 naming it), nothing left in
 *     /dev/shm; one stopped (SIGSTOP), a share or a pipeline stage, makes the others time out and
 *     the launcher names it by its rank in the job. */
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "dtrain/safetensors.h"
#include "proc.h"
#include "testutil.h"
#include "weights.h"

#define GPT2 "model.n_head=4", "--set", "model.n_embd=64", "--set", "model.n_layer=2"

/* the models: GPT-2 and a Llama with grouped-query attention, as classifiers (ci-smoke's data) and
 * as language models (pretrain's; the Llama with its own output head); each splits a vocabulary
 * of 257 rows unevenly */
enum { GPT2_CLS, LLAMA_CLS, GPT2_LM, LLAMA_LM, N_MODELS };
static const char *const model_names[N_MODELS] = {"gpt2", "llama", "gpt2-lm", "llama-lm"};
static const char *const model_sets[N_MODELS][12] = {
    {"model.n_head=4", "model.n_embd=64", "model.n_layer=4"},
    {"model.type=llama", "model.n_head=8", "model.num_key_value_heads=4", "model.n_embd=64",
     "model.intermediate_size=96", "model.n_layer=4"},
    {"model.n_head=4", "model.n_embd=64", "model.n_layer=4", "data.seq_len=32", "eval.every_steps=10",
     "training.device=cpu"},
    {"model.type=llama", "model.n_head=8", "model.num_key_value_heads=4", "model.n_embd=64",
     "model.intermediate_size=96", "model.n_layer=4", "model.tie_word_embeddings=false", "data.seq_len=32"},
};

/* a 20-step run of `model` in test_dir()/tag: `workers` x `batch`, tensor_parallel tp, a
 * checkpoint every 10 steps, every validation example; its exit status */
static int train_with(const char *tag, int model, int workers, int batch, int tp, const char *const *extra) {
    char rd[1400], nw[64], bs[64], tps[64];
    snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
    snprintf(nw, sizeof nw, "training.num_workers=%d", workers);
    snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", batch);
    snprintf(tps, sizeof tps, "training.tensor_parallel=%d", tp);
    const char *args[64] = {"--config", model >= GPT2_LM ? "configs/pretrain.yaml" : "configs/ci-smoke.yaml",
                            "--set", rd, "--set", nw, "--set", bs, "--set", tps, "--set", "training.max_steps=20",
                            "--set", "checkpoint.every_steps=10", "--set", model >= GPT2_LM ? "eval.max_batches=4"
                                                                                           : "eval.max_batches=0",
                            "--set", "training.check_replicas_every=5", "--set", "logging.every_steps=1", "--quiet"};
    int n = 0;
    while (args[n]) n++;
    for (int i = 0; model_sets[model][i]; i++) {
        args[n++] = "--set";
        args[n++] = model_sets[model][i];
    }
    for (int i = 0; extra && extra[i]; i++) {
        args[n++] = "--set";
        args[n++] = extra[i];
    }
    args[n] = NULL;
    return run_sync(tag, args);
}

static int train(const char *tag, int model, int workers, int batch, int tp) {
    return train_with(tag, model, workers, batch, tp, NULL);
}

/* the relative L2 distance between two safetensors files' tensors (same names, same shapes) */
static double file_distance(const char *a, const char *b) {
    dt_st_file *fa, *fb;
    CHECK(dt_st_open(&fa, a) == DT_OK);
    CHECK(dt_st_open(&fb, b) == DT_OK);
    CHECK_INT_EQ(dt_st_count(fa), dt_st_count(fb));
    double d2 = 0, b2 = 0;
    for (int i = 0; i < dt_st_count(fa); i++) {
        const dt_st_tensor *ta = dt_st_tensor_at(fa, i), *tb = dt_st_find(fb, ta->name);
        CHECK(tb != NULL);
        CHECK_INT_EQ(ta->ndim, tb->ndim);
        for (int k = 0; k < ta->ndim; k++) CHECK_INT_EQ(ta->shape[k], tb->shape[k]);
        float *va = malloc(ta->numel * sizeof(float)), *vb = malloc(tb->numel * sizeof(float));
        CHECK(dt_st_read_f32(fa, ta, va) == DT_OK);
        CHECK(dt_st_read_f32(fb, tb, vb) == DT_OK);
        for (size_t j = 0; j < ta->numel; j++) {
            d2 += ((double)va[j] - vb[j]) * ((double)va[j] - vb[j]);
            b2 += (double)vb[j] * vb[j];
        }
        free(va);
        free(vb);
    }
    dt_st_close(fa);
    dt_st_close(fb);
    return sqrt(d2 / b2);
}

/* run `tag`'s final weights and step-20 moments against run `base`'s */
static void check_same_model(const char *tag, const char *base) {
    char a[1500], b[1500];
    snprintf(a, sizeof a, "%s/%s/model.safetensors", test_dir(), tag);
    snprintf(b, sizeof b, "%s/%s/model.safetensors", test_dir(), base);
    const double w = file_distance(a, b);
    snprintf(a, sizeof a, "%s/%s/checkpoints/step_00000020/optimizer.safetensors", test_dir(), tag);
    snprintf(b, sizeof b, "%s/%s/checkpoints/step_00000020/optimizer.safetensors", test_dir(), base);
    const double m = file_distance(a, b);
    printf("%s vs %s: weights rel L2 distance %.2e, AdamW moments %.2e\n", tag, base, w, m);
    CHECK(w <= 1e-5);
    CHECK(m <= 1e-5);
}

/* the last evaluation's loss and accuracy of a run, as text */
static void read_eval(const char *tag, char *out, size_t n) {
    char path[1400], line[1 << 14];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), tag);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (o && strcmp(json_string_value(json_object_get(o, "type")), "eval") == 0)
            snprintf(out, n, "loss %.5g accuracy %.6f examples %lld", json_number_value(json_object_get(o, "val_loss")),
                     json_number_value(json_object_get(o, "val_accuracy")),
                     (long long)json_integer_value(json_object_get(o, "val_examples")));
        json_decref(o);
    }
    fclose(f);
    CHECK(out[0] != '\0');
}

static void test_equivalence(int model) {
    const char *arch = model_names[model];
    enum { N = 10 };
    /* workers, batch, tensor_parallel, zero_stage, pipeline_parallel, grad_accum_steps: 1 x 8, T2,
     * T4, D2 x T2 and that with ZeRO-1; P4, P2 x T2, D2 x P2 and that with ZeRO-1, P2 on 2 workers
     * (the pipelines over 4 or 2 micro-batches: the same global batch of 8) */
    const int setups[N][6] = {{1, 8, 1, 0, 1, 1}, {2, 8, 2, 0, 1, 1}, {4, 8, 4, 0, 1, 1}, {4, 4, 2, 0, 1, 1},
                              {4, 4, 2, 1, 1, 1}, {4, 2, 1, 0, 4, 4}, {4, 2, 2, 0, 2, 4}, {4, 2, 1, 0, 2, 2},
                              {4, 2, 1, 1, 2, 2}, {2, 1, 1, 0, 2, 8}};
    char base[64], conf_base[1024], conf[1024];
    double loss_base[32], loss[32];
    for (int s = 0; s < N; s++) {
        char tag[64], stages[16] = "", pp[64], accum[64];
        if (setups[s][4] > 1) snprintf(stages, sizeof stages, "-p%d", setups[s][4]);
        snprintf(tag, sizeof tag, "%s-%dx%d-t%d%s%s", arch, setups[s][0], setups[s][1], setups[s][2], stages,
                 setups[s][3] ? "-zero" : "");
        snprintf(pp, sizeof pp, "training.pipeline_parallel=%d", setups[s][4]);
        snprintf(accum, sizeof accum, "training.grad_accum_steps=%d", setups[s][5]);
        const char *extra[] = {pp, accum, setups[s][3] ? "training.zero_stage=1" : NULL, NULL};
        CHECK_INT_EQ(train_with(tag, model, setups[s][0], setups[s][1], setups[s][2], extra), 0);
        char run[1400];
        snprintf(run, sizeof run, "%s/%s", test_dir(), tag);
        CHECK_INT_EQ(read_losses(run, s ? loss : loss_base, 32), 20);
        if (model < GPT2_LM) read_confusion(run, s ? conf : conf_base, sizeof conf);
        else if (setups[s][1] == 8) read_eval(tag, s ? conf : conf_base, sizeof conf); /* the same examples */
        if (s == 0) {
            snprintf(base, sizeof base, "%s", tag);
            continue;
        }
        double worst = 0;
        for (int i = 0; i < 20; i++) worst = fmax(worst, fabs(loss[i] - loss_base[i]) / fabs(loss_base[i]));
        printf("%s vs %s: worst loss rel diff %.2e\n", tag, base, worst);
        CHECK(worst <= 1e-5);
        if (model < GPT2_LM || setups[s][1] == 8) CHECK_STR_EQ(conf, conf_base);
        check_same_model(tag, base);
    }
}

/* run `tag`'s train.log contains `what` */
static void check_log(const char *tag, const char *what) {
    static char text[1 << 18];
    char path[1500];
    snprintf(path, sizeof path, "%s/%s/train.log", test_dir(), tag);
    test_slurp(path, text, sizeof text);
    CHECK_STR_CONTAINS(text, what);
}

/* a copy of run `from` in run `to` without its step-20 checkpoint and final files: resuming it
 * trains steps 11..20 again */
static void copy_at_step_10(const char *from, const char *to) {
    char cmd[4000];
    snprintf(cmd, sizeof cmd, "rm -rf '%s/%s' && cp -r '%s/%s' '%s/%s' && rm -rf '%s/%s/checkpoints/step_00000020' "
             "'%s/%s/model.safetensors'", test_dir(), to, test_dir(), from, test_dir(), to, test_dir(), to, test_dir(),
             to);
    CHECK_INT_EQ(system(cmd), 0);
}

static void test_resume_across_layouts(void) {
    copy_at_step_10("llama-4x4-t2-zero", "resume-zero");
    CHECK_INT_EQ(train("resume-zero", LLAMA_CLS, 1, 8, 1), 0);
    check_log("resume-zero", "resumed from");
    check_same_model("resume-zero", "llama-1x8-t1");
    copy_at_step_10("llama-4x4-t2", "resume-1");
    CHECK_INT_EQ(train("resume-1", LLAMA_CLS, 1, 8, 1), 0);
    check_log("resume-1", "resumed from");
    check_same_model("resume-1", "llama-1x8-t1");
    copy_at_step_10("llama-1x8-t1", "resume-t4");
    CHECK_INT_EQ(train("resume-t4", LLAMA_CLS, 4, 8, 4), 0);
    check_log("resume-t4", "resumed from");
    check_same_model("resume-t4", "llama-1x8-t1");
    /* pipeline stages: D2 x P2's (ZeRO-1) on 1 worker; 1 worker's on P4; the tied embedding's two
     * copies (GPT-2's language model) from P2 x T2 on 1 worker */
    copy_at_step_10("llama-4x2-t1-p2-zero", "resume-p2");
    CHECK_INT_EQ(train("resume-p2", LLAMA_CLS, 1, 8, 1), 0);
    check_log("resume-p2", "resumed from");
    check_same_model("resume-p2", "llama-1x8-t1");
    copy_at_step_10("llama-1x8-t1", "resume-p4");
    const char *const p4[] = {"training.pipeline_parallel=4", "training.grad_accum_steps=4", NULL};
    CHECK_INT_EQ(train_with("resume-p4", LLAMA_CLS, 4, 2, 1, p4), 0);
    check_log("resume-p4", "resumed from");
    check_same_model("resume-p4", "llama-1x8-t1");
    copy_at_step_10("gpt2-lm-4x2-t2-p2", "resume-lm");
    CHECK_INT_EQ(train("resume-lm", GPT2_LM, 1, 8, 1), 0);
    check_log("resume-lm", "resumed from");
    check_same_model("resume-lm", "gpt2-lm-1x8-t1");
}

/* A checkpoint's gather goes a window of at most 2^20 floats (4 MiB) of a share at a time, and a
 * stage's range to rank 0 a part at a time. GPT-2 at width 840: at T2 the shares of c_attn (840 x
 * 1260, three blocks of columns), c_fc (840 x 1680, by columns) and c_proj (1680 x 840, by rows)
 * span two windows, each first one ending inside a run; a stage's range is many parts. T2, P2 and
 * D2 x T2 with ZeRO-1 end on the 1-worker run's weights and moments. (Shares of unequal length,
 * the shorter sending zeros past its end: the vocabulary's 129 and 128 rows, in one window.) */
static void test_wide_gathers(void) {
    const char *const w[] = {"model.n_embd=840", "model.n_layer=2", NULL};
    const char *const p2[] = {"model.n_embd=840", "model.n_layer=2", "training.pipeline_parallel=2",
                              "training.grad_accum_steps=2", NULL};
    const char *const z[] = {"model.n_embd=840", "model.n_layer=2", "training.zero_stage=1", NULL};
    CHECK_INT_EQ(train_with("wide-1x8", GPT2_LM, 1, 8, 1, w), 0);
    CHECK_INT_EQ(train_with("wide-2x8-t2", GPT2_LM, 2, 8, 2, w), 0);
    check_same_model("wide-2x8-t2", "wide-1x8");
    CHECK_INT_EQ(train_with("wide-2x4-p2", GPT2_LM, 2, 4, 1, p2), 0);
    check_same_model("wide-2x4-p2", "wide-1x8");
    CHECK_INT_EQ(train_with("wide-4x4-t2-zero", GPT2_LM, 4, 4, 2, z), 0);
    check_same_model("wide-4x4-t2-zero", "wide-1x8");
}

/* The median resident memory of each rank of a run over the launcher's samples (metrics.jsonl
 * "workers" records) into rss[], training's: with drop_last the last sample, which may hold the
 * final save's staging, left out. Returns the ranks. */
static int median_rss(const char *tag, double *rss, int drop_last) {
    char path[1400], line[1 << 14];
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), tag);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    enum { MAXS = 256 };
    static double v[4][MAXS];
    int n = 0, ranks = 0;
    while (fgets(line, sizeof line, f) && n < MAXS) {
        json_t *o = json_loads(line, 0, NULL);
        if (o && strcmp(json_string_value(json_object_get(o, "type")), "workers") == 0) {
            json_t *w = json_object_get(o, "workers");
            ranks = (int)json_array_size(w);
            for (int r = 0; r < ranks && r < 4; r++)
                v[r][n] = json_number_value(json_object_get(json_array_get(w, (size_t)r), "rss_mb"));
            n++;
        }
        json_decref(o);
    }
    fclose(f);
    CHECK(n >= 1 + 3 * drop_last);
    n -= drop_last; /* the last sample may see the final save */
    for (int r = 0; r < ranks; r++) {
        for (int i = 1; i < n; i++) /* insertion sort */
            for (int j = i; j > 0 && v[r][j] < v[r][j - 1]; j--) {
                double x = v[r][j];
                v[r][j] = v[r][j - 1];
                v[r][j - 1] = x;
            }
        rss[r] = v[r][n / 2];
    }
    return ranks;
}

/* Measured: each worker's resident memory while it trains a model whose weights, gradients and
 * AdamW state (7.2M parameters, 115 MB) dwarf its activations, on 1 worker, T2, T4, P2, P4 and
 * P2 x T2; less a base (the same process with a tiny model), a worker of P x T = K holds at most
 * 1/K of the 1-worker run's (+15% and 8 MB: what stays whole, the norms and positions, a stage's
 * embeddings, and the sums' buffers; and oneDNN's code for these shapes, which the tiny model does
 * not run: its kernels and the library pages they touch, ~6 MB a worker on an AMD EPYC). */
static void test_memory(void) {
    const char *sets[] = {"--config", "configs/pretrain.yaml", "--set", "model.n_head=4", "--set", "model.n_layer=4",
                          "--set", "data.seq_len=16", "--set", "data.batch_size_per_worker=1", "--set", "eval.every_steps=0", "--set", "logging.monitor_every_s=0.05",
                          "--set", "training.device=cpu", "--set", "checkpoint.every_steps=0", "--quiet"};
    const int n_sets = (int)(sizeof sets / sizeof sets[0]);
    enum { L = 6 };
    double rss[L][4], base[4];
    const int T[L] = {1, 2, 4, 1, 1, 2}, P[L] = {1, 1, 1, 2, 4, 2};
    for (int k = -1; k < L; k++) {
        char tag[32], rd[1400], nw[64], tp[64], pp[64];
        if (k < 0) snprintf(tag, sizeof tag, "mem-base");
        else snprintf(tag, sizeof tag, "mem-t%d-p%d", T[k], P[k]);
        snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
        snprintf(nw, sizeof nw, "training.num_workers=%d", k < 0 ? 1 : T[k] * P[k]);
        snprintf(tp, sizeof tp, "training.tensor_parallel=%d", k < 0 ? 1 : T[k]);
        snprintf(pp, sizeof pp, "training.pipeline_parallel=%d", k < 0 ? 1 : P[k]);
        const char *args[40];
        int n = 0;
        for (; n < n_sets; n++) args[n] = sets[n];
        const char *more[] = {"--set", rd, "--set", nw, "--set", tp, "--set", pp, "--set",
                              k < 0 ? "model.n_embd=16" : "model.n_embd=384", "--set",
                              k < 0 ? "training.max_steps=3000" : "training.max_steps=60"}; /* ~1 s each */
        for (int i = 0; i < 12; i++) args[n++] = more[i];
        args[n] = NULL;
        CHECK_INT_EQ(run_sync(tag, args), 0);
        CHECK_INT_EQ(median_rss(tag, k < 0 ? base : rss[k], k >= 0), k < 0 ? 1 : T[k] * P[k]);
    }
    const double whole = rss[0][0] - base[0];
    printf("memory: base %.1f MB; 1 worker %.1f MB above it", base[0], whole);
    CHECK(whole > 100.0); /* the weights and their state: what the shares split */
    for (int k = 1; k < L; k++)
        for (int r = 0; r < T[k] * P[k]; r++) {
            printf("; T%d P%d rank %d %.1f MB (%.2f of it)", T[k], P[k], r, rss[k][r] - base[0],
                   (rss[k][r] - base[0]) / whole);
            CHECK(rss[k][r] - base[0] <= 1.15 * whole / (T[k] * P[k]) + 8.0);
        }
    printf("\n");
}

/* run `tag`'s samples (train.log's "sample at step" lines without their times) into out */
static void read_samples(const char *tag, char *out, size_t n) {
    char path[1500], line[4096];
    snprintf(path, sizeof path, "%s/%s/train.log", test_dir(), tag);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    size_t k = 0;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        const char *at = strstr(line, "sample at step");
        if (at && k < n) k += (size_t)snprintf(out + k, n - k, "%s", at);
    }
    fclose(f);
}

/* logging.sample_every_steps with the model split: the shares of the first replica generate
 * together from the whole row of logits; the samples are the 1-worker run's, byte for byte. */
static void test_samples(void) {
    const char *const extra[] = {"logging.sample_every_steps=10", "logging.sample_prompt=The", NULL};
    CHECK_INT_EQ(train_with("sample-1", GPT2_LM, 1, 8, 1, extra), 0);
    CHECK_INT_EQ(train_with("sample-t2", GPT2_LM, 4, 4, 2, extra), 0);
    static char a[1 << 14], b[1 << 14];
    read_samples("sample-1", a, sizeof a);
    read_samples("sample-t2", b, sizeof b);
    CHECK_STR_CONTAINS(a, "sample at step 20 (after \"The\"): ");
    CHECK_STR_EQ(b, a);
}

/* Run `tag` (LLAMA_CLS: 4 workers x batch, T tp, the settings `extra` adds) with rank 3 killed at
 * step 15 (DTRAIN_FAULT) and one restart allowed: the launcher restarts every worker from the
 * checkpoint of step 10 and the run ends on the uninterrupted 1-worker run's weights. */
static void check_restart(const char *tag, int batch, int tp, const char *const *extra) {
    const char *sets[8] = {"fault_tolerance.max_restarts=1", "fault_tolerance.backoff_s=0.1"};
    for (int i = 0; extra && extra[i]; i++) sets[2 + i] = extra[i];
    CHECK(setenv("DTRAIN_FAULT", "rank=3,step=15,kind=kill", 1) == 0);
    const int rc = train_with(tag, LLAMA_CLS, 4, batch, tp, sets);
    unsetenv("DTRAIN_FAULT");
    CHECK_INT_EQ(rc, 0);
    check_log(tag, "restart 1 of 1");
    check_log(tag, "resumed from");
    check_same_model(tag, "llama-1x8-t1");
}

/* D2 x T2 (rank 3: a share of the second replica) and D2 x P2 (rank 3: its last stage) */
static void test_restart(void) {
    check_restart("restart", 4, 2, NULL);
    const char *const pp[] = {"training.pipeline_parallel=2", "training.grad_accum_steps=2", NULL};
    check_restart("restart-pp", 2, 1, pp);
}

static void test_dry_run(void) {
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", "training.num_workers=4", "--set",
                          "training.tensor_parallel=2", "--set", GPT2, "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("dry-run", args), 0);
    static char out[1 << 16];
    slurp_stdout("dry-run", out, sizeof out);
    CHECK_STR_CONTAINS(out, "# training.tensor_parallel 2: 2 replicas x 2 shares; each worker holds");
    CHECK_STR_CONTAINS(out, "; the whole model's: each worker's share below\n");
    CHECK_STR_CONTAINS(out, "# model parallelism: to write a checkpoint, rank 0 gathers the whole model's weights, "
                            "then each AdamW moment, on the host, one at a time (~");
    const char *pp[] = {"--config", "configs/pretrain.yaml", "--set", "training.num_workers=8", "--set",
                        "training.pipeline_parallel=4", "--set", "training.tensor_parallel=2", "--set",
                        "model.n_layer=6", "--set", "training.device=cpu", "--set", "training.grad_accum_steps=4",
                        "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("pipeline", pp), 0);
    slurp_stdout("pipeline", out, sizeof out);
    CHECK_STR_CONTAINS(out, "# training.pipeline_parallel 4: 1 replica x 4 stages x 2 shares; 1F1B over 4 "
                            "micro-batches a step idles ~43% of it");
    CHECK_STR_CONTAINS(out, "#   stage 0: layer 0, the embeddings; each worker holds 132.3k parameters (10.7%), ~");
    CHECK_STR_CONTAINS(out, "B with the activations of 4 micro-batches in flight");
    CHECK_STR_CONTAINS(out, "#   stage 3: layers 4-5, the head (and its copy of the tied embedding); each worker "
                            "holds 215.7k parameters (17.4%)");
    /* on GPUs the memory estimate is a worker's share (the stage that needs the most), not the whole
     * model's: a GPT-2-sized model as P4 x T2 needs well under half of one worker's */
    double gib[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        const char *gpu[] = {"--config", "configs/pretrain.yaml", "--set", "training.device=cuda", "--set",
                             "model.n_layer=8", "--set", "model.n_embd=768", "--set", "model.n_head=12", "--set",
                             "model.vocab_size=50257", "--set", k ? "training.num_workers=8" : "training.num_workers=1",
                             "--set", k ? "training.pipeline_parallel=4" : "training.pipeline_parallel=1", "--set",
                             k ? "training.tensor_parallel=2" : "training.tensor_parallel=1", "--set",
                             "training.grad_accum_steps=4", "--dry-run", NULL};
        CHECK_INT_EQ(run_sync(k ? "gpu-p4t2" : "gpu-one", gpu), 0);
        slurp_stdout(k ? "gpu-p4t2" : "gpu-one", out, sizeof out);
        const char *at = strstr(out, "# on cuda (bf16 products): ~");
        CHECK(!at || sscanf(at, "# on cuda (bf16 products): ~%lf GiB", &gib[k]) == 1);
    }
    if (gib[0] == 0) {
        printf("  no CUDA backend in this build: no GPU memory estimate to check\n");
    } else {
        CHECK_STR_CONTAINS(out, "B; its share of the model, the most a share needs)"); /* after the parts */
        printf("  GPU memory estimate: one worker %.2f GiB, P4 x T2 %.2f GiB a worker\n", gib[0], gib[1]);
        CHECK(gib[1] > 0 && gib[1] < 0.5 * gib[0]);
    }
    const char *deep[] = {"--config", "configs/ci-smoke.yaml", "--set", "training.num_workers=2", "--set",
                          "training.pipeline_parallel=2", "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("pipeline-layers", deep), 2);
    CHECK_STR_CONTAINS(err_text, "training.pipeline_parallel: expected at most model.n_layer (1), got 2 (each stage "
                                 "runs at least one layer)");
    const char *heads[] = {"--config", "configs/ci-smoke.yaml", "--set", "training.num_workers=3", "--set",
                           "training.tensor_parallel=3", "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("heads", heads), 2);
    CHECK_STR_CONTAINS(err_text, "training.tensor_parallel: expected a divisor of model.n_head (2), got 3 (each worker "
                                 "takes whole attention heads)");
}

/* dtrain doctor --tensor-parallel 2 on 4 workers: every group's collective checked, rank 0's
 * groups' tables printed; a T that does not divide the workers is refused. */
static void test_doctor(void) {
    const char *args[] = {"doctor", "--num-workers", "4", "--tensor-parallel", "2", NULL};
    CHECK_INT_EQ(run_sync("doctor", args), 0);
    static char out[1 << 16];
    slurp_stdout("doctor", out, sizeof out);
    CHECK_STR_CONTAINS(out, "model-parallel groups: 2 tensor-parallel group(s) of 2, 2 data-parallel group(s) of 2");
    CHECK_STR_CONTAINS(out, "group self-test: every tensor-parallel group (2 ranks each): all-reduce, reduce-scatter, "
                            "all-gather, broadcast, barrier: ok");
    CHECK_STR_CONTAINS(out, "group self-test: every data-parallel group (2 ranks each)");
    CHECK_STR_CONTAINS(out, "rank 0's tensor-parallel group:\nall-reduce (sum, float32), 2 workers, shm:");
    CHECK_STR_CONTAINS(out, "doctor: all checks passed");
    const char *pp[] = {"doctor", "--num-workers", "4", "--pipeline-parallel", "2", NULL};
    CHECK_INT_EQ(run_sync("doctor-pp", pp), 0);
    slurp_stdout("doctor-pp", out, sizeof out);
    CHECK_STR_CONTAINS(out, "model-parallel groups: 2 data-parallel group(s) of 2, 2 pipeline(s) of 2 stages");
    CHECK_STR_CONTAINS(out, "group self-test: every data-parallel group (2 ranks each)");
    CHECK_STR_CONTAINS(out, "group self-test: every pair of neighbouring pipeline stages (a send each way, an exchange) "
                            "and every pipeline's first and last stages (all-reduce): ok");
    CHECK_STR_CONTAINS(out, "rank 0's pair of stages (rank 0 sends to rank 1):\nsend (float32), 2 workers, shm:");
    CHECK_STR_CONTAINS(out, "doctor: all checks passed");
    const char *bad_pp[] = {"doctor", "--num-workers", "6", "--tensor-parallel", "2", "--pipeline-parallel", "2", NULL};
    CHECK_INT_EQ(run_sync("doctor-bad-pp", bad_pp), 2);
    CHECK_STR_CONTAINS(err_text, "doctor --pipeline-parallel 2: expected a divisor of "
                                 "--num-workers (6) / --tensor-parallel (2)");
    const char *bad[] = {"doctor", "--num-workers", "3", "--tensor-parallel", "2", NULL};
    CHECK_INT_EQ(run_sync("doctor-bad", bad), 2);
    CHECK_STR_CONTAINS(err_text, "doctor --tensor-parallel 2: expected a divisor of "
                                 "--num-workers (3)");
}

/* dtrain bench --layouts d2,p2,t2 at the first's global batch (2 x 8): p2 runs its replica's 16
 * rows as 2 micro-batches of 8, and the table and bench.csv give 1F1B's bubble, (2-1)/(2+2-1). */
static void test_bench_layouts(void) {
    char rd[1400];
    snprintf(rd, sizeof rd, "run.dir=%s/bench", test_dir());
    const char *args[] = {"bench", "--config", "configs/ci-smoke.yaml", "--set", rd, "--set", GPT2, "--layouts",
                          "d2,p2,t2", "--steps", "3", NULL};
    CHECK_INT_EQ(run_sync("bench", args), 0);
    static char out[1 << 16];
    slurp_stdout("bench", out, sizeof out);
    CHECK_STR_CONTAINS(out, "bench: p2: 2 workers x batch 8");
    CHECK_STR_CONTAINS(out, "ms/step    bubble    tokens/s");
    CHECK_STR_CONTAINS(out, "  33% (M2)  ");
    char path[1500];
    snprintf(path, sizeof path, "%s/bench/bench/bench.csv", test_dir());
    test_slurp(path, out, sizeof out);
    CHECK_STR_CONTAINS(out, ",layout,tensor_parallel,rss_mb,pipeline_parallel,micro_batches,bubble\n");
    CHECK_STR_CONTAINS(out, ",d2,1,");
    CHECK_STR_CONTAINS(out, ",2,2,0.3333\n");
    CHECK_STR_CONTAINS(out, ",t2,2,");
}

/* A long run on 4 workers (D2 x T2; with `stages`, D2 x P2 over 2 micro-batches) in
 * test_dir()/tag with collective deadline `timeout` and no restarts, once it trains: its
 * launcher's pid, and *victim the pid of worker `rank`. */
static pid_t start_long_as(const char *tag, const char *timeout, int rank, int stages, pid_t *victim) {
    static char rd[1400], to[64];
    snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
    snprintf(to, sizeof to, "training.collective_timeout_s=%s", timeout);
    const char *args[] = {"--config", "configs/ci-smoke.yaml", "--set", rd, "--set", "training.num_workers=4", "--set",
                          stages ? "training.pipeline_parallel=2" : "training.tensor_parallel=2", "--set",
                          stages ? "training.grad_accum_steps=2" : "training.grad_accum_steps=1", "--set",
                          "data.batch_size_per_worker=4", "--set", "training.max_steps=1000000", "--set", to, "--set",
                          "fault_tolerance.max_restarts=0", "--quiet", "--set", GPT2, NULL};
    char name[16], path[1500];
    snprintf(name, sizeof name, "dtrain-r%d", rank);
    pid_t pid = spawn(tag, args);
    *victim = 0;
    for (int i = 0; i < 500 && !*victim; i++) {
        sleep_ms(20);
        *victim = find_child(pid, name);
    }
    CHECK(*victim != 0);
    snprintf(path, sizeof path, "%s/%s/metrics.jsonl", test_dir(), tag);
    for (int i = 0; i < 500 && access(path, F_OK) != 0; i++) sleep_ms(20); /* training has begun */
    sleep_ms(300);
    return pid;
}

static pid_t start_long(const char *tag, const char *timeout, int rank, pid_t *victim) {
    return start_long_as(tag, timeout, rank, 0, victim);
}

static void test_kill_share(void) {
    int shm_before = count_dir("/dev/shm");
    pid_t r1, pid = start_long("kill", "30", 1, &r1);
    double dt;
    CHECK_INT_EQ(signal_and_wait(r1, SIGKILL, pid, "kill", &dt), 1);
    CHECK_STR_CONTAINS(err_text, "worker rank 1 was killed by signal 9 (SIGKILL)");
    CHECK(dt < 5.0);
    CHECK_INT_EQ(count_dir("/dev/shm"), shm_before);
}

/* A share that stops (SIGSTOP) makes the others fail at the collective deadline, and the launcher
 * names it by its rank in the job, whichever group's collective timed out first (D2 x T2: rank 2
 * waits for it in the shares' sums, rank 1 in the replicas' gradients, rank 0 for rank 2 when
 * rank 2 is slow to see it: that one happened in CI). */
static void test_stop_share(void) {
    pid_t r3, pid = start_long("stop", "2", 3, &r3);
    CHECK(kill(r3, SIGSTOP) == 0);
    CHECK_INT_EQ(wait_exit(pid, "stop"), 1);
    CHECK_STR_CONTAINS(err_text, "collective timeout");
    char want[96];
    snprintf(want, sizeof want, "; worker rank 3 (pid %ld) is stopped", (long)r3);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_STR_CONTAINS(err_text, "is stopped (process state T: SIGSTOP, Ctrl-Z or a debugger)");
    CHECK(!alive(r3));
    /* a stage that stops (D2 x P2: rank 1, the first replica's last stage) */
    pid_t r1;
    pid = start_long_as("stop-stage", "2", 1, 1, &r1);
    CHECK(kill(r1, SIGSTOP) == 0);
    CHECK_INT_EQ(wait_exit(pid, "stop-stage"), 1);
    CHECK_STR_CONTAINS(err_text, "collective timeout");
    snprintf(want, sizeof want, "; worker rank 1 (pid %ld) is stopped", (long)r1);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK(!alive(r1));
}

int main(void) {
    test_dir_init("parallel");
    for (int m = 0; m < N_MODELS; m++) test_equivalence(m);
    test_resume_across_layouts();
    test_wide_gathers();
    test_bench_layouts();
    test_restart();
    test_samples();
    test_memory();
    test_dry_run();
    test_doctor();
    test_kill_share();
    test_stop_share();
    test_dir_remove();
    TEST_PASS("test_parallel");
}
