/* test_lora.c — model.lora through the real binary, on the shipped fine-tune (the pretrained
 * GPT-2 of data/pretrained as the frozen base, its score head trainable beside the adapters):
 *   - 1 x 8, 2 x 4, 4 x 2 and 2 x 2 with grad_accum_steps 2 workers, and 2 x 4 with the AdamW
 *     state sharded (training.zero_stage 1), give the same per-step losses (1e-5 relative) and
 *     the same adapters (relative L2 distance <= 1e-5); the weights file holds only the
 *     adapters and the score head, and trainer.json the LoRA shape and the base's digest;
 *   - --dry-run and the start-up report give the trainable and frozen parameter counts;
 *   - a worker killed at step 7 (checkpoints every 5): one restart, and the same bytes as the
 *     run that was not killed (the base loaded again, the adapters from the checkpoint);
 *   - resuming with another base (model.init_from), or without LoRA, or with another rank,
 *     is refused (exit 2) naming what differs;
 *   - a target the architecture does not have is refused (exit 2), listing the valid ones;
 *     eval, generate-free predict and export --format hf take a LoRA run's weights (the base
 *     from its config's model.init_from);
 *   - model.lora.base_dtype bf16 (test_base16);
 *   - pipeline stages and tensor parallelism, on the corpus's GPT-2 language model, and the
 *     stages' --dry-run (test_model_parallel). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "proc.h"
#include "testutil.h"
#include "weights.h"

#define LORA "model.lora.rank=4"
#define TARGETS "model.lora.targets=[c_attn, attn.c_proj, c_fc, mlp.c_proj]"

/* Trains the fine-tune with LoRA for `steps` steps into test_dir()/tag; extra: more --set
 * values (NULL-terminated). Returns the exit status. */
static int train(const char *tag, int workers, int batch, int accum, int steps, const char *const *extra) {
    char rd[1400], nw[64], bs[64], ga[64], ms[64];
    snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
    snprintf(nw, sizeof nw, "training.num_workers=%d", workers);
    snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", batch);
    snprintf(ga, sizeof ga, "training.grad_accum_steps=%d", accum);
    snprintf(ms, sizeof ms, "training.max_steps=%d", steps);
    const char *args[64] = {"--config", "configs/finetune.yaml", "--set", rd, "--set", nw, "--set", bs, "--set", ga,
                            "--set", ms, "--set", LORA, "--set", TARGETS, "--set", "training.check_replicas_every=5",
                            "--set", "eval.max_batches=0", "--set", "optimizer.lr=2e-3", "--set", "optimizer.warmup_steps=0",
                            "--quiet"};
    int n = 0;
    while (args[n]) n++;
    for (int i = 0; extra && extra[i]; i++) {
        args[n++] = "--set";
        args[n++] = extra[i];
    }
    args[n] = NULL;
    return run_sync(tag, args);
}

static void test_equivalence(void) {
    enum { N = 5 };
    const int setups[N][4] = {{1, 8, 1, 0}, {2, 4, 1, 0}, {4, 2, 1, 0}, {2, 2, 2, 0}, {2, 4, 1, 1}};
    double base[32];
    float *wbase = NULL;
    size_t nbase = 0;
    for (int s = 0; s < N; s++) {
        char tag[64], run[1300], zs[64];
        snprintf(tag, sizeof tag, "eq-%dx%dx%d%s", setups[s][0], setups[s][1], setups[s][2], setups[s][3] ? "-zero" : "");
        snprintf(run, sizeof run, "%s/%s", test_dir(), tag);
        snprintf(zs, sizeof zs, "training.zero_stage=%d", setups[s][3]);
        const char *extra[] = {zs, NULL};
        CHECK_INT_EQ(train(tag, setups[s][0], setups[s][1], setups[s][2], 20, extra), 0);
        double loss[32];
        CHECK_INT_EQ(read_losses(run, loss, 32), 20);
        size_t n;
        float *w = read_weights(run, &n);
        if (s == 0) {
            memcpy(base, loss, sizeof loss);
            wbase = w;
            nbase = n;
            /* the weights file: 2 layers x 4 targets x (A, B), and the score head */
            char path[1400];
            snprintf(path, sizeof path, "%s/model.safetensors", run);
            dt_st_file *f;
            CHECK(dt_st_open(&f, path) == DT_OK);
            CHECK_INT_EQ(dt_st_count(f), 2 * 4 * 2 + 1);
            for (int i = 0; i < dt_st_count(f); i++) {
                const char *nm = dt_st_tensor_at(f, i)->name;
                CHECK(strstr(nm, ".lora_A.weight") || strstr(nm, ".lora_B.weight") || strcmp(nm, "score.weight") == 0);
            }
            dt_st_close(f);
            /* adapters (rank 4): c_attn 4*(64+192), attn.c_proj 4*(64+64), c_fc 4*(64+256), mlp.c_proj 4*(256+64);
               score 2*64 */
            CHECK_INT_EQ(n, (size_t)2 * 4 * (256 + 128 + 320 + 320) + 128);
            char tj[1400];
            snprintf(tj, sizeof tj, "%s/checkpoints/step_00000020/trainer.json", run);
            json_t *o = json_load_file(tj, 0, NULL);
            CHECK(o != NULL);
            json_t *lo = json_object_get(o, "lora");
            CHECK(lo != NULL);
            CHECK_INT_EQ(json_integer_value(json_object_get(lo, "rank")), 4);
            CHECK_STR_EQ(json_string_value(json_object_get(lo, "targets")), "c_attn, attn.c_proj, c_fc, mlp.c_proj");
            CHECK_STR_EQ(json_string_value(json_object_get(lo, "base")), "data/pretrained");
            CHECK(strlen(json_string_value(json_object_get(lo, "base_digest"))) == 8);
            json_decref(o);
            continue;
        }
        double worst = 0;
        for (int i = 0; i < 20; i++) {
            CHECK_NEAR_REL(loss[i], base[i], 1e-5, 0);
            worst = fmax(worst, fabs(loss[i] - base[i]) / fabs(base[i]));
        }
        CHECK_INT_EQ(n, nbase);
        const double dist = rel_l2(w, wbase, n);
        printf("%s vs 1x8x1: worst loss rel diff %.2e, adapters rel L2 distance %.2e\n", tag, worst, dist);
        CHECK(dist <= 1e-5);
        free(w);
    }
    double first = 0, last = 0; /* it learns */
    for (int i = 0; i < 5; i++) first += base[i], last += base[15 + i];
    printf("mean loss of steps 1-5 %.4f, of steps 16-20 %.4f\n", first / 5, last / 5);
    CHECK(last < first);
    free(wbase);
}

static void test_report(void) {
    const char *args[] = {"--config", "configs/finetune.yaml", "--set", LORA, "--set", TARGETS, "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("dry", args), 0);
    char out[1300], text[1 << 16];
    snprintf(out, sizeof out, "%s/dry.out", test_dir());
    test_slurp(out, text, sizeof text);
    CHECK_STR_CONTAINS(text, "  lora:\n    rank: 4\n    alpha: 8\n");
    CHECK_STR_CONTAINS(text, "\n    targets: [c_attn, attn.c_proj, c_fc, mlp.c_proj]\n");
    CHECK_STR_CONTAINS(text, "# model.lora: rank 4, alpha 8 on c_attn, attn.c_proj, c_fc, mlp.c_proj: 8.3k trainable "
                             "parameters (8320, ");
    char log[1400];
    snprintf(log, sizeof log, "%s/eq-1x8x1/train.log", test_dir());
    test_slurp(log, text, sizeof text);
    CHECK_STR_CONTAINS(text, "model.lora: rank 4, alpha 8 on c_attn, attn.c_proj, c_fc, mlp.c_proj: 8.3k trainable");
}

static void test_restart(void) {
    const char *const ck[] = {"checkpoint.every_steps=5", "fault_tolerance.backoff_s=0.1", NULL};
    CHECK_INT_EQ(train("straight", 2, 4, 1, 12, ck), 0);
    setenv("DTRAIN_FAULT", "rank=1,step=7,kind=kill", 1);
    CHECK_INT_EQ(train("killed", 2, 4, 1, 12, ck), 0);
    unsetenv("DTRAIN_FAULT");
    CHECK_STR_CONTAINS(err_text, "restart");
    test_same_weights("killed", "straight");
}

static void test_refusals(void) {
    /* another base: a full fine-tune's weights (same shape, other values) */
    const char *const full[] = {"model.lora.rank=0", "model.lora.targets=[]", NULL};
    CHECK_INT_EQ(train("full", 1, 8, 1, 3, full), 0);
    char other[1400];
    snprintf(other, sizeof other, "model.init_from=%s/full", test_dir());
    const char *const ck[] = {"checkpoint.every_steps=5", NULL};
    CHECK_INT_EQ(train("base", 1, 8, 1, 5, ck), 0);
    const char *const again_other[] = {other, "training.max_steps=10", NULL};
    CHECK_INT_EQ(train("base", 1, 8, 1, 10, again_other), 2);
    CHECK_STR_CONTAINS(err_text, "its adapters were trained on the base data/pretrained");
    const char *const no_lora[] = {"model.lora.rank=0", "model.lora.targets=[]", NULL};
    CHECK_INT_EQ(train("base", 1, 8, 1, 10, no_lora), 2);
    CHECK_STR_CONTAINS(err_text, "checkpoint trained with model.lora rank 4, alpha 8 on c_attn, attn.c_proj, c_fc, "
                                 "mlp.c_proj, the config says no model.lora");
    const char *const rank8[] = {"model.lora.rank=8", NULL};
    CHECK_INT_EQ(train("base", 1, 8, 1, 10, rank8), 2);
    CHECK_STR_CONTAINS(err_text, "the config says model.lora rank 8");
    /* the same base resumes */
    CHECK_INT_EQ(train("base", 1, 8, 1, 10, NULL), 0);
    /* Llama's targets on GPT-2 */
    const char *bad[] = {"--config", "configs/finetune.yaml", "--set", LORA, "--set", "model.lora.targets=[q, c_attn]",
                         "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("bad-target", bad), 2);
    CHECK_STR_CONTAINS(err_text, "model.lora.targets");
    CHECK_STR_CONTAINS(err_text, "names q, which model.type transformer_like does not have (its projections: c_attn, "
                                 "attn.c_proj, c_fc, mlp.c_proj)");
    const char *unknown[] = {"--config", "configs/finetune.yaml", "--set", LORA, "--set", "model.lora.targets=[qq]",
                             "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("unknown-target", unknown), 2);
    CHECK_STR_CONTAINS(err_text, "llama: q, k, v, o, gate, up, down");
    const char *no_rank[] = {"--config", "configs/finetune.yaml", "--set", "model.lora.targets=[c_fc]", "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("no-rank", no_rank), 2);
    CHECK_STR_CONTAINS(err_text, "model.lora.rank is 0");
}

/* model.lora.base_dtype bf16: 1 x 8 and 2 x 4 workers (the AdamW state sharded), and 2
 * tensor-parallel shares, give the same adapters; trainer.json and the weights file say the base was kept in bf16; the losses stay
 * within the bf16 rounding of the fp32 base's; resuming, or evaluating, with the base in fp32
 * (a base that is not bf16 already: another digest) is refused naming model.lora.base_dtype. */
static void test_base16(void) {
    const char *const one[] = {"model.lora.base_dtype=bf16", NULL};
    const char *const two[] = {"model.lora.base_dtype=bf16", "training.zero_stage=1", NULL};
    CHECK_INT_EQ(train("b16-1", 1, 8, 1, 20, one), 0);
    CHECK_INT_EQ(train("b16-2", 2, 4, 1, 20, two), 0);
    char r1[1300], r2[1300], r32[1300];
    snprintf(r1, sizeof r1, "%s/b16-1", test_dir());
    snprintf(r2, sizeof r2, "%s/b16-2", test_dir());
    snprintf(r32, sizeof r32, "%s/eq-1x8x1", test_dir());
    double l1[32], l2[32], l32[32];
    CHECK_INT_EQ(read_losses(r1, l1, 32), 20);
    CHECK_INT_EQ(read_losses(r2, l2, 32), 20);
    CHECK_INT_EQ(read_losses(r32, l32, 32), 20);
    double worst = 0;
    for (int i = 0; i < 20; i++) {
        CHECK_NEAR_REL(l2[i], l1[i], 1e-5, 0);
        worst = fmax(worst, fabs(l1[i] - l32[i]) / fabs(l32[i]));
    }
    CHECK(worst > 0 && worst < 2e-2); /* the base rounded: near the fp32 base's losses, not equal */
    size_t n1, n2;
    float *w1 = read_weights(r1, &n1), *w2 = read_weights(r2, &n2);
    CHECK_INT_EQ(n1, n2);
    const double dist = rel_l2(w2, w1, n1);
    printf("base_dtype bf16: 2x4 (zero_stage 1) vs 1x8 adapters rel L2 distance %.2e; losses within %.2e of the fp32 "
           "base's\n", dist, worst);
    CHECK(dist <= 1e-5);
    free(w2);
    /* 2 tensor-parallel shares: each embeds its rows of the bf16 table and multiplies its part of
       every bf16 matrix */
    const char *const t2[] = {"model.lora.base_dtype=bf16", "training.tensor_parallel=2", NULL};
    CHECK_INT_EQ(train("b16-t2", 2, 8, 1, 20, t2), 0);
    char rt[1300];
    snprintf(rt, sizeof rt, "%s/b16-t2", test_dir());
    w2 = read_weights(rt, &n2);
    CHECK_INT_EQ(n1, n2);
    const double dist_t2 = rel_l2(w2, w1, n1);
    printf("base_dtype bf16: 2 tensor-parallel shares vs 1 worker adapters rel L2 distance %.2e\n", dist_t2);
    CHECK(dist_t2 <= 1e-5);
    free(w1);
    free(w2);
    char tj[1400], text[1 << 16];
    snprintf(tj, sizeof tj, "%s/checkpoints/step_00000020/trainer.json", r1);
    test_slurp(tj, text, sizeof text);
    CHECK_STR_CONTAINS(text, "\"base_dtype\": \"bf16\"");
    /* resumed with the base in fp32: another digest, refused by name */
    const char *const fp32[] = {"model.lora.base_dtype=fp32", "training.max_steps=25", NULL};
    CHECK_INT_EQ(train("b16-1", 1, 8, 1, 25, fp32), 2);
    CHECK_STR_CONTAINS(err_text, "were trained on the base data/pretrained in bf16");
    CHECK_STR_CONTAINS(err_text, "and model.lora.base_dtype: bf16");
    /* evaluated with the base in fp32: the adapters file says how its base was kept */
    char ck[1400], cf[1400];
    snprintf(ck, sizeof ck, "%s/model.safetensors", r1);
    snprintf(cf, sizeof cf, "%s/config.yaml", r1);
    const char *ev[] = {"eval", "--config", cf, "--checkpoint", ck, "--set", "model.lora.base_dtype=fp32", NULL};
    CHECK_INT_EQ(run_sync("b16-eval32", ev), 2);
    CHECK_STR_CONTAINS(err_text, "kept in bf16, but the model's frozen weights have digest");
    CHECK_STR_CONTAINS(err_text, "and model.lora.base_dtype be bf16");
    /* fp32 products on cuda cannot read the bf16 base: refused before anything starts */
    const char *cuda32[] = {"--config", "configs/finetune.yaml", "--set", LORA, "--set", "model.lora.base_dtype=bf16",
                            "--set", "training.device=cuda", "--set", "training.precision=fp32", "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("b16-cuda-fp32", cuda32), 2);
    CHECK_STR_CONTAINS(err_text, "model.lora.base_dtype: is bf16, which needs bf16 products on cuda, but "
                                 "training.precision is fp32");
    const char *ev16[] = {"eval", "--config", cf, "--checkpoint", ck, NULL}; /* run.dir's config: the refused resume's
                                                                                    left it as it was */
    CHECK_INT_EQ(run_sync("b16-eval16", ev16), 0);
}

/* Trains the shipped corpus's GPT-2 language model (configs/pretrain.yaml, 4 layers, its head
 * the frozen token embedding) with adapters on every product for `steps` steps, `workers`
 * workers in `stages` pipeline stages of `shares` tensor-parallel shares, into test_dir()/tag,
 * a checkpoint every 6 steps, a sample at step 12; extra: one more --set value (or NULL). */
static int train_lm(const char *tag, int workers, int stages, int shares, int batch, int steps, const char *extra) {
    char rd[1400], nw[64], pp[64], tp[64], bs[64], ms[64];
    snprintf(rd, sizeof rd, "run.dir=%s/%s", test_dir(), tag);
    snprintf(nw, sizeof nw, "training.num_workers=%d", workers);
    snprintf(pp, sizeof pp, "training.pipeline_parallel=%d", stages);
    snprintf(tp, sizeof tp, "training.tensor_parallel=%d", shares);
    snprintf(bs, sizeof bs, "data.batch_size_per_worker=%d", batch);
    snprintf(ms, sizeof ms, "training.max_steps=%d", steps);
    const char *args[] = {"--config", "configs/pretrain.yaml", "--set", rd, "--set", nw, "--set", pp, "--set", tp,
                          "--set", bs, "--set", ms, "--set", LORA, "--set", TARGETS, "--set", "model.n_layer=4", "--set",
                          "data.seq_len=32", "--set", "training.grad_accum_steps=4", "--set", "training.device=cpu",
                          "--set", "checkpoint.every_steps=6", "--set", "eval.every_steps=0", "--set",
                          "optimizer.warmup_steps=0", "--set", "optimizer.lr=3e-3", "--set", "optimizer.schedule=constant",
                          "--set", "training.check_replicas_every=3", "--set", "logging.sample_every_steps=12", "--set",
                          "logging.sample_prompt=The ", "--set", "logging.sample_tokens=24", "--quiet",
                          extra ? "--set" : NULL, extra, NULL};
    return run_sync(tag, args);
}

/* a run's sample at step 12 (train.log's line from "sample at", into out) */
static void sample_12(const char *tag, char *out, size_t n) {
    char log[1400], text[1 << 16];
    snprintf(log, sizeof log, "%s/%s/train.log", test_dir(), tag);
    test_slurp(log, text, sizeof text);
    const char *s = strstr(text, "sample at step 12 (after \"The \"): ");
    CHECK(s != NULL);
    const char *e = strchr(s, '\n');
    snprintf(out, n, "%.*s", (int)(e ? e - s : (long)strlen(s)), s);
}

/* the base digest a run's trainer.json at `step` gives (into out, 16 chars) */
static void base_digest(const char *tag, int step, char *out) {
    char tj[1400];
    snprintf(tj, sizeof tj, "%s/%s/checkpoints/step_%08d/trainer.json", test_dir(), tag, step);
    json_t *o = json_load_file(tj, 0, NULL);
    CHECK(o != NULL);
    snprintf(out, 16, "%s", json_string_value(json_object_get(json_object_get(o, "lora"), "base_digest")));
    json_decref(o);
}

/* Model parallelism (training.pipeline_parallel, tensor_parallel). 2 stages give the one
 * worker's adapters byte for byte (the weights file's base digest included) and its sample at
 * step 12 (the stages generating together), also when resumed from the checkpoint of step 6: every stage checks the base it holds against the checkpoint's
 * digest of the whole (the head, tied to the frozen embedding, is summed between the first and
 * last stage no more). 2 replicas of 2 stages, 2 tensor-parallel shares (the adapters split
 * with their products), 2 replicas of 2 shares with ZeRO-1, and 2 stages of 2 shares give the
 * same losses and adapters within fp32 rounding and the same base digest; with the base in
 * bf16, 2 stages give one worker's weights byte for byte; a run saved on 2 shares resumes on 2
 * stages. */
static void test_model_parallel(void) {
    CHECK_INT_EQ(train_lm("lm-1", 1, 1, 1, 4, 12, NULL), 0);
    CHECK_INT_EQ(train_lm("lm-pp", 2, 2, 1, 4, 6, NULL), 0);
    CHECK_INT_EQ(train_lm("lm-pp", 2, 2, 1, 4, 12, NULL), 0); /* resumed at step 6 */
    test_same_weights("lm-pp", "lm-1");
    /* the stages' sample at step 12: one worker's, token for token */
    char s1[512], s2[512];
    sample_12("lm-1", s1, sizeof s1);
    sample_12("lm-pp", s2, sizeof s2);
    CHECK_STR_EQ(s2, s1);
    char d1[16], d2[16];
    base_digest("lm-1", 12, d1);
    base_digest("lm-pp", 12, d2);
    CHECK_STR_EQ(d2, d1);
    /* tag, workers, stages, shares, batch per worker */
    static const struct { const char *tag; int w, p, t, b; const char *extra; } lay[] = {
        {"lm-d2p2", 4, 2, 1, 2, NULL},
        {"lm-t2", 2, 1, 2, 4, NULL},
        {"lm-d2t2", 4, 1, 2, 2, "training.zero_stage=1"},
        {"lm-p2t2", 4, 2, 2, 4, NULL},
    };
    char r1[1300];
    snprintf(r1, sizeof r1, "%s/lm-1", test_dir());
    double l1[16];
    CHECK_INT_EQ(read_losses(r1, l1, 16), 12);
    size_t n1;
    float *w1 = read_weights(r1, &n1);
    for (size_t k = 0; k < sizeof lay / sizeof lay[0]; k++) {
        CHECK_INT_EQ(train_lm(lay[k].tag, lay[k].w, lay[k].p, lay[k].t, lay[k].b, 12, lay[k].extra), 0);
        char r2[1300];
        snprintf(r2, sizeof r2, "%s/%s", test_dir(), lay[k].tag);
        double l2[16];
        CHECK_INT_EQ(read_losses(r2, l2, 16), 12);
        double worst = 0;
        for (int i = 0; i < 12; i++) {
            CHECK_NEAR_REL(l2[i], l1[i], 1e-5, 0);
            worst = fmax(worst, fabs(l2[i] - l1[i]) / fabs(l1[i]));
        }
        size_t n2;
        float *w2 = read_weights(r2, &n2);
        CHECK_INT_EQ(n1, n2);
        const double dist = rel_l2(w2, w1, n1);
        printf("%s vs 1 worker: worst loss rel diff %.2e, adapters rel L2 distance %.2e\n", lay[k].tag, worst, dist);
        CHECK(dist <= 1e-5);
        free(w2);
        base_digest(lay[k].tag, 12, d2);
        CHECK_STR_EQ(d2, d1);
        sample_12(lay[k].tag, s2, sizeof s2); /* a sample, from every layout */
    }
    free(w1);
    /* the base in bf16 on 2 stages: the last stage's layers find their weights past the bf16
       positions table it does not hold */
    CHECK_INT_EQ(train_lm("lm-b16-1", 1, 1, 1, 4, 6, "model.lora.base_dtype=bf16"), 0);
    CHECK_INT_EQ(train_lm("lm-b16-pp", 2, 2, 1, 4, 6, "model.lora.base_dtype=bf16"), 0);
    test_same_weights("lm-b16-pp", "lm-b16-1");
    /* a LoRA run's weights (adapters) as model.init_from on shares: refused by name, not an internal error */
    char bad[1400];
    snprintf(bad, sizeof bad, "model.init_from=%s/lm-1", test_dir());
    CHECK_INT_EQ(train_lm("lm-bad-base", 2, 1, 2, 4, 2, bad), 2);
    CHECK_STR_CONTAINS(err_text, "lm-1/model.safetensors holds LoRA adapters (trained on a base of digest ");
    CHECK_STR_CONTAINS(err_text, "(hint: model.init_from must name the base they were trained on, and "
                                 "model.lora.init_from the adapters)");
    /* saved on 2 shares, resumed on 2 stages */
    CHECK_INT_EQ(train_lm("lm-t2", 2, 2, 1, 4, 15, NULL), 0);
    char out[1300], text[1 << 16];
    snprintf(out, sizeof out, "%s/lm-t2/train.log", test_dir());
    test_slurp(out, text, sizeof text);
    CHECK_STR_CONTAINS(text, "lm-t2/checkpoints/step_00000012: step 12");
    /* the start-up report counts the whole model's parameters, not a share's or a stage's */
    CHECK_STR_CONTAINS(text, "on c_attn, attn.c_proj, c_fc, mlp.c_proj: 32.8k trainable parameters (3.80%), 830.3k "
                             "frozen");
    /* --dry-run: each stage's trainable share, its AdamW state counted on those alone */
    const char *dry[] = {"--config", "configs/pretrain.yaml", "--set", "training.num_workers=2", "--set",
                         "training.pipeline_parallel=2", "--set", LORA, "--set", TARGETS, "--dry-run", NULL};
    CHECK_INT_EQ(run_sync("lm-dry", dry), 0);
    snprintf(out, sizeof out, "%s/lm-dry.out", test_dir());
    test_slurp(out, text, sizeof text);
    CHECK_STR_CONTAINS(text, "#   stage 0: layers 0-1, the embeddings; each worker holds 462.2k parameters (52.8%, 16.4k "
                             "of them trainable)");
}

int main(void) {
    test_dir_init("lora");
    test_model_parallel();
    test_equivalence();
    test_report();
    test_base16();
    test_restart();
    test_refusals();
    test_dir_remove();
    TEST_PASS("test_lora");
}
