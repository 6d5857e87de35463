/* test_e2e.c — the real binary on real files, as a user runs it:
 *   - --help, --version, usage and config errors (exit 2, message on stderr);
 *   - --dry-run of the shipped configs and of the DESIGN.md §3 seed example;
 *   - bad data through the binary: exit 2 naming file and line; a FIFO as config, data or
 *     weights: exit 2 at once, naming it; a link planted in the run directory is not
 *     written through;
 *   - configs/finetune.yaml: from the shipped pretrained weights, loss falls, validation accuracy
 *     reaches 0.9, plain output
 *     without control characters, metrics.jsonl parses;
 *   - export, then eval with model.init_from and with --checkpoint: the same validation
 *     loss, bit for bit;
 *   - language modelling on a shard made by `dtrain data tokenize` (ci-smoke config), then
 *     dtrain generate on it: greedy with and without the key/value cache, seeded sampling,
 *     the end of the positions, refusals;
 *   - dtrain predict: a classifier's predictions against eval, plain text, a language
 *     model's per-line loss, bad lines;
 *   - the best checkpoint and early stopping on a run whose validation loss rises;
 *   - CPU threads that follow another process's load, with the same weights as fixed threads;
 *   - a tokenizer that does not fit the model refused on every path (predict, export), one
 *     changed since training refused (its SHA-256 recorded), a model with no known tokenizer
 *     exported without tokenizer files; no command overwrites its own input. */
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"

static char out_text[1 << 20], err_text[1 << 16];

#define tmp test_dir()

/* Runs a shell command from the source dir; returns the exit status, fills out/err text. */
static int run(const char *fmt, ...) {
    char cmd[4096], full[8192], o[600], e[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    snprintf(o, sizeof o, "%s/stdout.txt", tmp);
    snprintf(e, sizeof e, "%s/stderr.txt", tmp);
    snprintf(full, sizeof full, "cd '%s' && %s >'%s' 2>'%s' </dev/null", DTRAIN_SOURCE_DIR, cmd, o, e);
    int st = system(full);
    test_slurp(o, out_text, sizeof out_text);
    test_slurp(e, err_text, sizeof err_text);
    int rc = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    printf("$ %s  -> %d\n", cmd, rc);
    return rc;
}

/* The number after the first `label` in text (a CHECK failure and NaN when it is not there). */
static double number_after(const char *text, const char *label) {
    const char *p = strstr(text, label);
    CHECK(p != NULL);
    return p ? strtod(p + strlen(label), NULL) : NAN;
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    fputs(text, f);
    fclose(f);
}

static void test_cli(void) {
    CHECK_INT_EQ(run("%s --help", DTRAIN_BIN), 0);
    CHECK_STR_CONTAINS(out_text, "dtrain [train] --config FILE");
    CHECK_STR_CONTAINS(out_text, "exit status");
    CHECK_INT_EQ(run("%s --version", DTRAIN_BIN), 0);
    CHECK_STR_CONTAINS(out_text, "OpenBLAS");
    CHECK_STR_CONTAINS(out_text, "zlib");
    /* each line once, into a file as into a pipe: the CUDA report's child once wrote out the
     * parent's buffered lines again (cuBLASLt's unload flushed stdout in the child; so this can
     * fail only in a build with the CUDA backend, as CI's is) */
    const char *first = strstr(out_text, "  zlib ");
    CHECK(first && !strstr(first + 1, "  zlib "));
    CHECK_INT_EQ(run("%s", DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "missing --config FILE");
    CHECK_INT_EQ(run("%s --bogus", DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "unknown option --bogus");
    CHECK_INT_EQ(run("%s frobnicate", DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "unknown command \"frobnicate\"");
    CHECK_INT_EQ(run("%s --config %s/nope.yaml", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "nope.yaml");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set training.num_workers=four --dry-run", DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "--set training.num_workers=four: training.num_workers: expected an integer in [1, 64], got \"four\"");
    /* the world-size limit is part of the schema: --dry-run refuses it, naming file and line */
    char big[600];
    snprintf(big, sizeof big, "%s/workers100.yaml", tmp);
    write_file(big, "training:\n  num_workers: 100\ndata:\n  train_path: data/sentiment/train.tsv\n");
    CHECK_INT_EQ(run("%s --config %s --dry-run", DTRAIN_BIN, big), 2);
    CHECK_STR_CONTAINS(err_text, "workers100.yaml:2: training.num_workers: expected an integer in [1, 64], got \"100\"");
}

static void test_dry_run(void) {
    const char *configs[] = {"configs/finetune.yaml", "configs/pretrain.yaml", "configs/ci-smoke.yaml",
                             "configs/finetune-bytes.yaml", "configs/pretrain-bpe.yaml"};
    for (int i = 0; i < 5; i++) {
        CHECK_INT_EQ(run("%s --config %s --dry-run", DTRAIN_BIN, configs[i]), 0);
        CHECK_STR_CONTAINS(out_text, "training:");
        CHECK_STR_CONTAINS(out_text, "# model: ");
        CHECK_STR_CONTAINS(out_text, "training FLOPs per token");
        CHECK_STR_CONTAINS(out_text, "of memory per worker"); /* docs/troubleshooting.md: before an OOM */
    }
    /* GPU memory is estimated without a GPU too (its data may be missing here: the estimate comes
     * first); training.zero_stage 1 on 4 workers leaves 1/4 of GPT-2 124M's 995 MB of moments */
    double gib[2];
    for (int z = 0; z < 2; z++) {
        run("%s --config configs/gpt2-124m-bench.yaml --dry-run --set training.num_workers=4 --set training.zero_stage=%d",
            DTRAIN_BIN, z);
        gib[z] = strstr(out_text, "# on cuda") ? number_after(out_text, "(bf16 products): ~") : NAN;
    }
    if (isnan(gib[0])) {
        printf("no CUDA backend in this build: no GPU memory estimate to check\n");
    } else {
        printf("gpt2-124m-bench, 4 workers: %.2f GiB, %.2f GiB with zero_stage 1\n", gib[0], gib[1]);
        CHECK_NEAR_REL(gib[0] - gib[1], 0.75 * 8 * 124439808.0 / (1u << 30), 0.02, 0); /* printed to 0.01 */
    }
    /* the dry run opens and checks the data as the run would: what the run refuses, it refuses */
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --dry-run", DTRAIN_BIN), 0);
    CHECK_STR_CONTAINS(out_text, "# data: train: 16000 examples in 1 file(s)\n# data: val: 2000 examples in 1 file(s)\n");
    char bad[600];
    snprintf(bad, sizeof bad, "%s/badlabel.tsv", tmp);
    write_file(bad, "1\tgood\n5\tbad label\n");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set data.train_path=%s --dry-run", DTRAIN_BIN, bad), 2);
    CHECK_STR_CONTAINS(err_text, "badlabel.tsv:2: label 5 out of range [0, 2)");
    CHECK_STR_CONTAINS(out_text, "# model: "); /* the estimate is still there */
    /* the seed example of DESIGN.md §3, with real paths */
    char path[600];
    snprintf(path, sizeof path, "%s/seed.yaml", tmp);
    write_file(path,
               "training:\n"
               "  num_workers: 4            # worker processes = GPUs used; 1 = single device\n"
               "  use_gpu: true             # false = CPU workers\n"
               "  resources_per_worker: {gpu: 1}\n"
               "  communication_backend: \"collective\"\n"
               "  epochs: 3\n"
               "data:\n"
               "  train_path: \"data/sentiment/train.tsv\"\n"
               "  val_path: \"data/sentiment/val.tsv\"\n"
               "  batch_size_per_worker: 16\n"
               "model:\n"
               "  type: \"transformer_like\"\n"
               "  num_labels: 2\n");
    CHECK_INT_EQ(run("%s --config %s --dry-run", DTRAIN_BIN, path), 0);
    CHECK_STR_CONTAINS(out_text, "num_workers: 4");
    /* running it here: no GPU -> exit 2 with a hint */
    if (access("/proc/driver/nvidia/gpus", F_OK) != 0) {
        CHECK_INT_EQ(run("%s --config %s --set run.dir=%s/seed", DTRAIN_BIN, path, tmp), 2);
        CHECK_STR_CONTAINS(err_text, "no GPU is visible (hint: set training.use_gpu: false");
        /* bf16 where auto finds no GPU: the CPU's bf16 products where it has them (the start-up line
         * says so), else exit 2 naming what is missing; and the GPU doctor: exit 2 with what to do */
        const int rc = run("%s --config configs/ci-smoke.yaml --set training.device=auto --set training.precision=bf16 "
                           "--set training.max_steps=2 --set run.dir=%s/bf16",
                           DTRAIN_BIN, tmp);
        if (rc == 0) CHECK_STR_CONTAINS(out_text, "bf16 products");
        else {
            CHECK_INT_EQ(rc, 2);
            CHECK(strstr(err_text, "needs AVX512-BF16 or AMX") || strstr(err_text, "built without it"));
        }
        CHECK_INT_EQ(run("%s doctor --device cuda", DTRAIN_BIN), 2);
        CHECK_STR_CONTAINS(err_text, "no GPU is visible");
    }
    /* a collective that cannot do what it says is refused before anything runs, naming file and
     * key: nccl where training.device: auto found no GPU (it used to run as auto) */
    if (access("/proc/driver/nvidia/gpus", F_OK) != 0) {
        CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set training.device=auto --set "
                         "training.communication_backend=nccl --set run.dir=%s/nccl", DTRAIN_BIN, tmp), 2);
        CHECK_STR_CONTAINS(err_text, "configs/ci-smoke.yaml: training.communication_backend: nccl needs GPUs, and "
                                     "training.device is cpu here");
        char nccl_dir[600];
        snprintf(nccl_dir, sizeof nccl_dir, "%s/nccl", tmp);
        CHECK(access(nccl_dir, F_OK) != 0); /* refused before the run directory is made */
    }
    /* on CPU it runs as is with its 4 workers */
    CHECK_INT_EQ(run("%s --config %s --set training.use_gpu=false --set run.dir=%s/seed --set training.max_steps=3 "
                     "--set eval.max_batches=2",
                     DTRAIN_BIN, path, tmp),
                 0);
    CHECK_STR_CONTAINS(out_text, "4 workers");
}

static void test_bad_data(void) {
    char path[600];
    snprintf(path, sizeof path, "%s/bad.tsv", tmp);
    write_file(path, "1\tgood movie\n0\tbad movie\nno tab here\n");
    CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set data.train_path=%s --set run.dir=%s/bad", DTRAIN_BIN,
                     path, tmp), 2);
    char want[700];
    snprintf(want, sizeof want, "dtrain: error: %s:3: no tab: expected \"label<TAB>text\"", path);
    CHECK_STR_CONTAINS(err_text, want);
}

/* Reads metrics.jsonl; returns the number of train lines, fills first/last train loss and the
 * last eval line's fields. */
/* A classification eval record's precision, recall, F1, macro-F1 and accuracy, computed here
 * from its confusion matrix (rows: label, columns: predicted), as scikit-learn does. */
static void check_class_metrics(json_t *o) {
    json_t *conf = json_object_get(o, "val_confusion"), *classes = json_object_get(o, "val_classes");
    if (!conf) return; /* language modelling */
    const size_t nl = json_array_size(conf);
    CHECK(nl >= 2 && json_array_size(classes) == nl);
    long total = 0, right = 0;
    double macro = 0;
    for (size_t k = 0; k < nl; k++) {
        long support = 0, predicted = 0, tp = json_integer_value(json_array_get(json_array_get(conf, k), k));
        for (size_t j = 0; j < nl; j++) {
            support += json_integer_value(json_array_get(json_array_get(conf, k), j));
            predicted += json_integer_value(json_array_get(json_array_get(conf, j), k));
        }
        double p = predicted ? (double)tp / predicted : 0, r = support ? (double)tp / support : 0;
        double f1 = p + r > 0 ? 2 * p * r / (p + r) : 0;
        json_t *c = json_array_get(classes, k);
        CHECK_NEAR_REL(json_number_value(json_object_get(c, "precision")), p, 1e-12, 1e-12);
        CHECK_NEAR_REL(json_number_value(json_object_get(c, "recall")), r, 1e-12, 1e-12);
        CHECK_NEAR_REL(json_number_value(json_object_get(c, "f1")), f1, 1e-12, 1e-12);
        CHECK_INT_EQ(json_integer_value(json_object_get(c, "support")), support);
        total += support;
        right += tp;
        macro += f1 / (double)nl;
    }
    CHECK_INT_EQ(total, json_integer_value(json_object_get(o, "val_examples")));
    CHECK_NEAR_REL((double)right / (double)total, json_number_value(json_object_get(o, "val_accuracy")), 1e-12, 0);
    CHECK_NEAR_REL(json_number_value(json_object_get(o, "val_f1_macro")), macro, 1e-12, 1e-12);
}

static int read_metrics(const char *run_dir, double *first_loss, double *last_loss, double *val_loss, double *val_acc) {
    char path[700], line[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n_train = 0;
    *val_loss = *val_acc = NAN;
    while (fgets(line, sizeof line, f)) {
        json_error_t err;
        json_t *o = json_loads(line, 0, &err);
        if (!o) {
            fprintf(stderr, "metrics.jsonl: not JSON: %s (%s)\n", line, err.text);
            exit(1);
        }
        const char *type = json_string_value(json_object_get(o, "type"));
        CHECK(type != NULL);
        if (strcmp(type, "train") == 0) {
            double loss = json_number_value(json_object_get(o, "loss"));
            CHECK(json_is_integer(json_object_get(o, "step")));
            CHECK(json_is_number(json_object_get(o, "lr")) && json_is_number(json_object_get(o, "grad_norm")));
            CHECK(json_is_number(json_object_get(o, "step_ms")) && json_is_number(json_object_get(o, "tokens_per_s")));
            if (n_train == 0) *first_loss = loss;
            *last_loss = loss;
            n_train++;
        } else if (strcmp(type, "eval") == 0) {
            *val_loss = json_number_value(json_object_get(o, "val_loss"));
            *val_acc = json_number_value(json_object_get(o, "val_accuracy"));
            check_class_metrics(o);
        } else { /* the other documented records (test_monitoring checks their fields) */
            CHECK(strcmp(type, "workers") == 0 || strcmp(type, "summary") == 0 || strcmp(type, "resume") == 0);
        }
        json_decref(o);
    }
    fclose(f);
    return n_train;
}

static void test_finetune(void) {
    char run_dir[600], exported[700];
    snprintf(run_dir, sizeof run_dir, "%s/finetune", tmp);
    snprintf(exported, sizeof exported, "%s/exported.safetensors", tmp);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s", DTRAIN_BIN, run_dir), 0);
    /* plain output: parseable lines, no control characters */
    for (const char *p = out_text; *p; p++) CHECK(*p == '\n' || (unsigned char)*p >= 0x20);
    CHECK_STR_CONTAINS(out_text, "final: val loss");
    /* from the shipped pretrained weights, whose directory gives no head: the head is fresh */
    CHECK_STR_CONTAINS(out_text, "init_from data/pretrained/model.safetensors (no score.weight in the file");
    double first, last, val_loss, val_acc;
    int n = read_metrics(run_dir, &first, &last, &val_loss, &val_acc);
    printf("finetune: %d steps, loss %.4f -> %.4f, val loss %.6f, val accuracy %.4f\n", n, first, last, val_loss, val_acc);
    CHECK(n > 10);
    CHECK(last < 0.5 * first);
    CHECK(val_acc >= 0.9);
    CHECK_STR_CONTAINS(out_text, "  per class: 0: precision ");
    CHECK_STR_CONTAINS(out_text, "  confusion (row: label, columns: predicted 0..1): 0: ");
    CHECK_STR_CONTAINS(out_text, " | macro-F1 0.9");
    /* data.pad_to longest (the default): each batch ran at the length its longest text needs,
     * said in the summary; the same training as rows of data.seq_len (32) up to float rounding */
    const double row_len = number_after(out_text, "rows: ");
    printf("finetune: rows of %.2f positions on average\n", row_len);
    CHECK(row_len >= 8 && row_len < 32);
    CHECK_STR_CONTAINS(out_text, "positions on average of data.seq_len's 32 (data.pad_to: longest;");
    {
        char cut_dir[700], full_dir[700];
        double fl[2], ll[2], vl[2], va[2];
        snprintf(cut_dir, sizeof cut_dir, "%s/finetune-cut", tmp);
        snprintf(full_dir, sizeof full_dir, "%s/finetune-full", tmp);
        for (int full = 0; full < 2; full++) {
            CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set training.max_steps=60 --set run.dir=%s --set "
                             "data.pad_to=%s", DTRAIN_BIN, full ? full_dir : cut_dir, full ? "seq_len" : "longest"), 0);
            CHECK((strstr(out_text, "rows: ") == NULL) == full);
            CHECK(read_metrics(full ? full_dir : cut_dir, &fl[full], &ll[full], &vl[full], &va[full]) > 1);
        }
        printf("finetune, 60 steps: rows cut / of 32: first loss %.7f / %.7f, last %.7f / %.7f, val loss %.7f / %.7f\n",
               fl[0], fl[1], ll[0], ll[1], vl[0], vl[1]);
        CHECK_NEAR_REL(fl[0], fl[1], 1e-5, 1e-3);
        CHECK_NEAR_REL(ll[0], ll[1], 1e-3, 1e-3);
        CHECK_NEAR_REL(vl[0], vl[1], 1e-3, 1e-3);
    }

    /* training.precision bf16 where the CPU has bf16 products: the same fine-tune ends within the
     * bf16 band of fp32's; elsewhere exit 2 naming what is missing. The band is as wide as fp32's
     * own spread over seeds (training.seed 1337, 2, 3 on an AMD EPYC: val loss 0.0172, 0.0205,
     * 0.0282, accuracy 0.9940, 0.9905, 0.9900; bf16: 0.0283, 0.0218, 0.0243 and 0.9920, 0.9925,
     * 0.9930): one seed's bf16 run lands anywhere in it. (2026-12-06, data.pad_to longest and the
     * weight gradients in bf16 too: fp32 0.0155, 0.0176, 0.0282 and 0.9950, 0.9935, 0.9900; bf16
     * 0.0206, 0.0185, 0.0283 and 0.9940, 0.9930, 0.9910.) */
    char bf_dir[700];
    snprintf(bf_dir, sizeof bf_dir, "%s/finetune-bf16", tmp);
    const int rc = run("%s --config configs/finetune.yaml --set training.precision=bf16 --set run.dir=%s", DTRAIN_BIN,
                       bf_dir);
    if (rc == 2) {
        printf("finetune in bf16: refused here: %s", err_text);
        CHECK(strstr(err_text, "needs AVX512-BF16 or AMX") || strstr(err_text, "built without it"));
    } else {
        CHECK_INT_EQ(rc, 0);
        CHECK_STR_CONTAINS(out_text, "bf16 products");
        double f16, l16, vl16, va16;
        CHECK(read_metrics(bf_dir, &f16, &l16, &vl16, &va16) == n);
        printf("finetune in bf16: loss %.4f -> %.4f, val loss %.6f, val accuracy %.4f\n", f16, l16, vl16, va16);
        CHECK(fabs(vl16 - val_loss) <= 0.75 * val_loss + 0.005);
        CHECK(va16 >= val_acc - 0.01);
    }
    /* a CPU without bf16 products, as oneDNN is told to see one: exit 2 at start, naming what is
     * missing; `dtrain --version` says the same */
    CHECK_INT_EQ(run("ONEDNN_MAX_CPU_ISA=AVX2 %s --config configs/finetune.yaml --set training.precision=bf16 --set "
                     "run.dir=%s-avx2", DTRAIN_BIN, bf_dir), 2);
    CHECK(strstr(err_text, "training.precision: bf16 on the CPU needs AVX512-BF16 or AMX, which this CPU does not have") ||
          strstr(err_text, "built without it"));
    CHECK_INT_EQ(run("ONEDNN_MAX_CPU_ISA=AVX2 %s --version", DTRAIN_BIN), 0);
    CHECK(strstr(out_text, "oneDNN    ") &&
          (strstr(out_text, "bf16 on this CPU: no (neither AVX512-BF16 nor AMX)") || strstr(out_text, "not built in")));
    char path[700];
    snprintf(path, sizeof path, "%s/config.yaml", run_dir);
    CHECK(access(path, F_OK) == 0);
    snprintf(path, sizeof path, "%s/train.log", run_dir);
    CHECK(access(path, F_OK) == 0);

    /* export -> eval through model.init_from and through --checkpoint: the same loss exactly */
    CHECK_INT_EQ(run("%s export --checkpoint %s --out %s", DTRAIN_BIN, run_dir, exported), 0);
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --set model.init_from=%s", DTRAIN_BIN, exported), 0);
    double eval_loss = number_after(out_text, "val loss ");
    printf("eval via init_from: %.17g, training's final eval: %.17g\n", eval_loss, val_loss);
    CHECK(eval_loss == val_loss);
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --checkpoint %s", DTRAIN_BIN, run_dir), 0);
    CHECK(number_after(out_text, "val loss ") == val_loss);
    /* without --config: the run's own config.yaml */
    CHECK_INT_EQ(run("%s eval --checkpoint %s", DTRAIN_BIN, run_dir), 0);
    CHECK(number_after(out_text, "val loss ") == val_loss);
    /* NaN weights: exit 2 naming file and tensor, for eval and for training (no restarts) */
    char nan_file[700];
    snprintf(nan_file, sizeof nan_file, "%s/nan.safetensors", tmp);
    CHECK_INT_EQ(run("python3 -c \"import json,struct,sys; b=bytearray(open(sys.argv[1],'rb').read()); "
                     "n=struct.unpack('<Q',b[:8])[0]; t=json.loads(b[8:8+n])['wpe.weight']; o=8+n+t['data_offsets'][0]+8; "
                     "b[o:o+4]=struct.pack('<f',float('nan')); open(sys.argv[2],'wb').write(b)\" %s %s",
                     exported, nan_file), 0);
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --set model.init_from=%s", DTRAIN_BIN, nan_file), 2);
    CHECK_STR_CONTAINS(err_text, "nan.safetensors: tensor wpe.weight holds NaN at element 2");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s/nanrun --set model.init_from=%s", DTRAIN_BIN,
                     tmp, nan_file), 2);
    CHECK_STR_CONTAINS(err_text, "tensor wpe.weight holds NaN");
    CHECK(strstr(out_text, "restart") == NULL && strstr(err_text, "restart") == NULL);
    /* a shape mismatch through init_from is a clear exit 2 */
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --set model.n_embd=32 --set model.init_from=%s", DTRAIN_BIN,
                     exported), 2);
    CHECK_STR_CONTAINS(err_text, "has shape");
    CHECK_STR_CONTAINS(err_text, "but the config needs");
}

/* dtrain generate on the language model of test_language_model: greedy decoding with the
 * key/value cache equals decoding without it (a fresh forward over the whole text for every
 * token), a seed repeats its sample, and bad requests exit 2 naming the option. (That greedy
 * decoding is the argmax of the model's logits is test_decode's.) */
static void test_generate(void) {
    static char greedy[1 << 12], sampled[1 << 12];
    const char *lm = "--checkpoint %s/lm --prompt 'The old ' --max-new-tokens 40";
    char args[800];
    snprintf(args, sizeof args, lm, tmp);
    CHECK_INT_EQ(run("%s generate %s --temperature 0", DTRAIN_BIN, args), 0);
    snprintf(greedy, sizeof greedy, "%s", out_text);
    CHECK_STR_CONTAINS(err_text, "generated 40 tokens in ");
    CHECK_STR_CONTAINS(err_text, "after a prompt of 8 tokens");
    CHECK_INT_EQ((int)strlen(greedy), 41); /* 40 bytes and the newline */
    CHECK(strstr(err_text, "note: the text went on") == NULL); /* 47 positions of the 128 trained */
    /* past the positions training covered (data.seq_len, here made 16): said, not refused */
    CHECK_INT_EQ(run("%s generate %s --temperature 0 --set data.seq_len=16", DTRAIN_BIN, args), 0);
    CHECK(strcmp(out_text, greedy) == 0);
    CHECK_STR_CONTAINS(err_text, "note: the text went on to position 47, past the 16 positions the model was trained on");
    CHECK_INT_EQ(run("%s generate %s --temperature 0 --no-cache", DTRAIN_BIN, args), 0);
    CHECK(strcmp(out_text, greedy) == 0);
    CHECK_INT_EQ(run("%s generate %s --seed 7 --top-k 20 --top-p 0.95", DTRAIN_BIN, args), 0);
    snprintf(sampled, sizeof sampled, "%s", out_text);
    CHECK_STR_CONTAINS(err_text, "seed 7");
    CHECK_INT_EQ(run("%s generate %s --seed 7 --top-k 20 --top-p 0.95 --no-cache", DTRAIN_BIN, args), 0);
    CHECK(strcmp(out_text, sampled) == 0);
    int differ = 0; /* other seeds give other text (one of three may repeat by chance, not all) */
    for (int seed = 8; seed < 11; seed++) {
        CHECK_INT_EQ(run("%s generate %s --seed %d --top-k 20 --top-p 0.95", DTRAIN_BIN, args, seed), 0);
        differ += strcmp(out_text, sampled) != 0;
    }
    CHECK(differ > 0);
    /* a run without final weights: its last checkpoint (the same weights here), and what is said
     * about that goes to stderr: stdout is the continuation alone */
    CHECK_INT_EQ(run("cp -r %s/lm %s/lm-unfinished && rm %s/lm-unfinished/model.safetensors", tmp, tmp, tmp), 0);
    CHECK_INT_EQ(run("%s generate --checkpoint %s/lm-unfinished --prompt 'The old ' --max-new-tokens 40 "
                     "--temperature 0", DTRAIN_BIN, tmp), 0);
    CHECK(strcmp(out_text, greedy) == 0);
    CHECK_STR_CONTAINS(err_text, "has no final weights yet: using its newest valid checkpoint");
    printf("greedy: %s", greedy);
    printf("sampled (seed 7): %s", sampled);
    /* the end of the model's positions (128): a 120-byte prompt leaves room for 9 new tokens */
    CHECK_INT_EQ(run("%s generate --checkpoint %s/lm --prompt \"$(printf 'a%%.0s' $(seq 120))\" --seed 1", DTRAIN_BIN, tmp), 0);
    CHECK_STR_CONTAINS(err_text, "generated 9 tokens");
    CHECK_STR_CONTAINS(err_text, "stopped at model.n_positions");
    /* refusals */
    CHECK_INT_EQ(run("%s generate --checkpoint %s/lm --prompt \"$(printf 'a%%.0s' $(seq 129))\"", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "--prompt: 129 tokens, more than the model's 128 positions (model.n_positions)");
    CHECK_INT_EQ(run("%s generate --checkpoint %s/lm --prompt ''", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "--prompt: empty");
    CHECK_INT_EQ(run("%s generate --checkpoint %s/lm", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "generate: needs --prompt TEXT");
    CHECK_INT_EQ(run("%s generate --checkpoint %s/finetune --prompt 'good'", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "the model is a classifier (model.num_labels: 2)");
    CHECK_INT_EQ(run("%s generate --checkpoint %s/exported.safetensors --prompt 'x'", DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "no config.yaml next to");
    CHECK_STR_CONTAINS(err_text, "pass --config FILE");
    CHECK_INT_EQ(run("%s generate %s --top-p 0", DTRAIN_BIN, args), 2);
    CHECK_STR_CONTAINS(err_text, "--top-p: expected a number above 0..1");
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --prompt x", DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "belong to `dtrain generate`");
}

/* dtrain predict on the classifier of test_finetune and the language model of
 * test_language_model: one JSON object per input line; a classifier's predictions on the
 * validation TSV give eval's accuracy and loss; plain text lines get the same probabilities as
 * the same texts with labels; bad lines exit 2 naming file and line and leave no output. */
static void test_predict(void) {
    char out[700], plain[700], bad[700];
    snprintf(out, sizeof out, "%s/pred.jsonl", tmp);
    snprintf(plain, sizeof plain, "%s/plain.txt", tmp);
    snprintf(bad, sizeof bad, "%s/bad.tsv", tmp);
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --checkpoint %s/finetune", DTRAIN_BIN, tmp), 0);
    const double eval_loss = number_after(out_text, "val loss "), eval_acc = number_after(out_text, "val accuracy ");
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input data/sentiment/val.tsv --out %s", DTRAIN_BIN, tmp, out), 0);
    CHECK_STR_CONTAINS(err_text, "predicted 2000 lines in ");
    FILE *f = fopen(out, "r");
    CHECK(f != NULL);
    char line[1024];
    long n = 0, correct = 0;
    double loss = 0, first[2] = {0, 0};
    while (fgets(line, sizeof line, f)) {
        json_error_t je;
        json_t *o = json_loads(line, 0, &je);
        CHECK(o != NULL);
        CHECK_INT_EQ(json_integer_value(json_object_get(o, "line")), n + 1);
        json_t *pr = json_object_get(o, "probs");
        CHECK_INT_EQ(json_array_size(pr), 2);
        const double p0 = json_real_value(json_array_get(pr, 0)), p1 = json_real_value(json_array_get(pr, 1));
        CHECK(fabs(p0 + p1 - 1) < 1e-6);
        const int label = (int)json_integer_value(json_object_get(o, "label"));
        const int truth = (int)json_integer_value(json_object_get(o, "true_label"));
        CHECK_INT_EQ(label, p1 > p0 ? 1 : 0);
        correct += label == truth;
        loss -= log(truth ? p1 : p0);
        if (n == 0) first[0] = p0, first[1] = p1;
        json_decref(o);
        n++;
    }
    fclose(f);
    printf("predict: %ld lines, accuracy %.6f (eval %.6f), loss %.9f (eval %.9f)\n", n, (double)correct / n, eval_acc,
           loss / n, eval_loss);
    CHECK_INT_EQ(n, 2000);
    CHECK(fabs((double)correct / n - eval_acc) < 1e-9);
    CHECK(fabs(loss / n - eval_loss) < 1e-6 * eval_loss); /* probabilities printed with 9 digits */
    /* plain text: the same probabilities */
    FILE *vin = fopen(DTRAIN_SOURCE_DIR "/data/sentiment/val.tsv", "r"), *pout = fopen(plain, "w");
    CHECK(vin && pout);
    for (int i = 0; i < 5 && fgets(line, sizeof line, vin); i++) fputs(strchr(line, '\t') + 1, pout);
    fclose(vin);
    fclose(pout);
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input %s --out %s", DTRAIN_BIN, tmp, plain, out), 0);
    test_slurp(out, line, sizeof line);
    char want[128];
    snprintf(want, sizeof want, "{\"line\":1,\"label\":%d,\"probs\":[%.9g,%.9g]}\n", first[1] > first[0], first[0], first[1]);
    CHECK(strncmp(line, want, strlen(want)) == 0);
    CHECK(strstr(line, "true_label") == NULL);
    /* a language model: loss and perplexity per line (null for an empty one) */
    CHECK_INT_EQ(run("%s predict --checkpoint %s/lm --input data/tinytext/val.txt --out %s", DTRAIN_BIN, tmp, out), 0);
    CHECK_STR_CONTAINS(err_text, " tokens: loss ");
    CHECK_INT_EQ(run("head -1 %s", out), 0);
    CHECK_STR_CONTAINS(out_text, "{\"line\":1,\"tokens\":");
    CHECK_STR_CONTAINS(out_text, ",\"perplexity\":");
    CHECK_INT_EQ(run("grep -c . %s", out), 0);
    CHECK_INT_EQ(atol(out_text), 423);
    /* bad lines: exit 2 naming file and line; no output file */
    write_file(bad, "1\tgood\n7\tfine\n");
    unlink(out);
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input %s --out %s", DTRAIN_BIN, tmp, bad, out), 2);
    CHECK_STR_CONTAINS(err_text, "bad.tsv:2: label 7 out of range [0, 2)");
    CHECK(access(out, F_OK) != 0);
    write_file(bad, "1\tgood\n\nfine\n");
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input %s --out %s", DTRAIN_BIN, tmp, bad, out), 2);
    CHECK_STR_CONTAINS(err_text, "bad.tsv:2: empty line");
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --out %s", DTRAIN_BIN, tmp, out), 2);
    CHECK_STR_CONTAINS(err_text, "predict: needs --input FILE and --out FILE.jsonl");
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input %s/nope.tsv --out %s", DTRAIN_BIN, tmp, tmp, out), 2);
    CHECK_STR_CONTAINS(err_text, "nope.tsv: cannot open");
}

/* The shipped validation set with every label flipped: the better the model, the worse it scores. */
static void write_flipped_val(const char *path) {
    FILE *in = fopen(DTRAIN_SOURCE_DIR "/data/sentiment/val.tsv", "r"), *fo = fopen(path, "w");
    CHECK(in && fo);
    char line[4096];
    while (fgets(line, sizeof line, in)) fprintf(fo, "%c%s", line[0] == '0' ? '1' : '0', line + 1);
    fclose(in);
    fclose(fo);
}

/* checkpoint.best_metric and training.early_stopping_patience on a run whose validation loss
 * rises (the validation labels flipped: the better the model learns, the worse it scores):
 * the first evaluation stays the best, run.dir/best holds its weights (eval gives its loss
 * again), training stops after `patience` evaluations without a new best (exit 0, said in the
 * summary), the same command again only evaluates; a run killed in between and restarted ends
 * the same, byte for byte. */
static void test_early_stopping(void) {
    char flipped[600], a[600], b[600], fa[700], fb[700];
    snprintf(flipped, sizeof flipped, "%s/flipped.tsv", tmp);
    write_flipped_val(flipped);
    snprintf(a, sizeof a, "%s/early", tmp);
    snprintf(b, sizeof b, "%s/early-killed", tmp);
    const char *opts = "--set data.val_path=%s --set eval.every_steps=50 --set eval.max_batches=10 "
                       "--set training.early_stopping_patience=2 --set checkpoint.best_metric=val_loss "
                       "--set checkpoint.every_steps=50";
    char o[1200];
    snprintf(o, sizeof o, opts, flipped);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s %s", DTRAIN_BIN, a, o), 0);
    const char *best = strstr(out_text, "new best val_loss ");
    CHECK(best != NULL);
    const double best_loss = strtod(best + 18, NULL);
    CHECK_STR_CONTAINS(out_text, "new best val_loss");
    CHECK_STR_CONTAINS(out_text, "early stopping at step ");
    CHECK_STR_CONTAINS(out_text, "stopped early at step ");
    CHECK_STR_CONTAINS(out_text, "did not improve for 2 evaluations in a row (training.early_stopping_patience)");
    CHECK_STR_CONTAINS(out_text, "weights in ");
    CHECK(strstr(out_text, "step 2500") == NULL);
    const char *at = strstr(out_text, "stopped early at step ");
    const long stopped = strtol(at + 22, NULL, 10);
    printf("early stopping: stopped at step %ld, best val loss %.6f\n", stopped, best_loss);
    CHECK(stopped >= 150 && stopped < 2500);
    /* run.dir/best is a checkpoint: eval gives its loss again */
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --checkpoint %s/best --set data.val_path=%s "
                     "--set eval.max_batches=10", DTRAIN_BIN, a, flipped), 0);
    CHECK(fabs(number_after(out_text, "val loss ") - best_loss) <= 1e-6 * best_loss);
    /* the same command again: finished, only evaluates */
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s %s", DTRAIN_BIN, a, o), 0);
    CHECK(strstr(out_text, "new best") == NULL);
    CHECK(strstr(out_text, "step 2500") == NULL);
    /* killed after the first checkpoint, restarted from it: the same end, byte for byte */
    CHECK_INT_EQ(run("DTRAIN_FAULT=rank=0,step=75,kind=exit %s --config configs/finetune.yaml --set run.dir=%s %s "
                     "--set fault_tolerance.backoff_s=0", DTRAIN_BIN, b, o), 0);
    CHECK_STR_CONTAINS(out_text, "restart");
    CHECK_STR_CONTAINS(out_text, "stopped early at step ");
    for (int k = 0; k < 2; k++) {
        snprintf(fa, sizeof fa, "%s/%s", a, k ? "best/model.safetensors" : "model.safetensors");
        snprintf(fb, sizeof fb, "%s/%s", b, k ? "best/model.safetensors" : "model.safetensors");
        CHECK_INT_EQ(run("cmp %s %s", fa, fb), 0);
    }
    /* a fresh start (checkpoint.resume: never) moves the old run's best/ aside with its history,
     * before the new run's own evaluations write a best/ of their own */
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s %s --set checkpoint.resume=never "
                     "--set training.max_steps=20", DTRAIN_BIN, a, o), 0);
    CHECK_STR_CONTAINS(out_text, "/best aside to ");
    CHECK_INT_EQ(run("ls %s/best.prev-*/model.safetensors", a), 0);
}

/* No file of the run and no output holds the value of a ${NAME}: configs are saved as written,
 * the config a checkpoint saved is read without expanding anything. */
static void test_secrets(void) {
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/secret", tmp);
    const char *env = "DT_TEST_WD=0.0123457 DT_TEST_SECRET=hunter2";
    const char *set = "--set 'optimizer.weight_decay=${DT_TEST_WD}' --set 'model.type=${DT_TEST_SECRET}'";
    CHECK_INT_EQ(run("%s %s --config configs/finetune.yaml --set run.dir=%s %s --dry-run", env, DTRAIN_BIN, run_dir,
                     set), 2);
    CHECK(strstr(err_text, "hunter2") == NULL);
    CHECK_STR_CONTAINS(err_text, "model.type: expected");
    set = "--set 'optimizer.weight_decay=${DT_TEST_WD}' --set 'data.val_path=${DT_TEST_VAL}'";
    env = "DT_TEST_WD=0.0123457 DT_TEST_VAL=data/sentiment/val.tsv";
    CHECK_INT_EQ(run("%s %s --config configs/finetune.yaml --set run.dir=%s %s --dry-run", env, DTRAIN_BIN, run_dir,
                     set), 0);
    CHECK(strstr(out_text, "0.0123457") == NULL && strstr(out_text, "sentiment/val.tsv") == NULL);
    CHECK_STR_CONTAINS(out_text, "weight_decay: \"${DT_TEST_WD}\"");
    CHECK_INT_EQ(run("%s %s --config configs/finetune.yaml --set run.dir=%s %s --set training.max_steps=10 "
                     "--set checkpoint.every_steps=5",
                     env, DTRAIN_BIN, run_dir, set), 0);
    /* resumed with a change: the launcher compares with the checkpoint's config */
    CHECK_INT_EQ(run("%s %s --config configs/finetune.yaml --set run.dir=%s %s --set training.max_steps=20 "
                     "--set checkpoint.every_steps=5 --set optimizer.lr=1e-4",
                     env, DTRAIN_BIN, run_dir, set), 0);
    CHECK(strstr(out_text, "0.0123457") == NULL && strstr(err_text, "0.0123457") == NULL);
    CHECK_STR_CONTAINS(out_text, "config changed since the checkpoint: training.max_steps 10 -> 20, optimizer.lr 0.0005 -> 0.0001\n");
    CHECK_INT_EQ(run("! grep -rlF -e 0.0123457 -e sentiment/val.tsv %s", run_dir), 0);
    CHECK_INT_EQ(run("grep -qF '${DT_TEST_WD}' %s/config.yaml %s/checkpoints/step_00000020/config.yaml", run_dir,
                     run_dir), 0);
}

/* eval.max_batches picks the same examples for any number of workers: the end-of-training
 * evaluation of 2 workers and `dtrain eval` (one process) agree on count and loss. */
static void test_eval_limit(void) {
    char run_dir[600];
    snprintf(run_dir, sizeof run_dir, "%s/evallimit", tmp);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s --set training.num_workers=2 "
                     "--set training.max_steps=4 --set eval.max_batches=3 --set data.batch_size_per_worker=8",
                     DTRAIN_BIN, run_dir), 0);
    double train_eval = number_after(out_text, "final: val loss ");
    CHECK_STR_CONTAINS(out_text, "| 24 examples |");
    CHECK_INT_EQ(run("%s eval --config configs/finetune.yaml --set data.batch_size_per_worker=8 "
                     "--set eval.max_batches=3 --checkpoint %s", DTRAIN_BIN, run_dir), 0);
    CHECK_STR_CONTAINS(out_text, "24 examples");
    double eval_loss = number_after(out_text, "val loss ");
    printf("eval.max_batches 3: training (2 workers) %.9g, dtrain eval %.9g\n", train_eval, eval_loss);
    CHECK(fabs(eval_loss - train_eval) <= 1e-6 * fabs(train_eval));
}

static void test_language_model(void) {
    char shard[600], val[600], run_dir[600];
    snprintf(shard, sizeof shard, "%s/lm-train.bin", tmp);
    snprintf(val, sizeof val, "%s/lm-val.bin", tmp);
    snprintf(run_dir, sizeof run_dir, "%s/lm", tmp);
    CHECK_INT_EQ(run("%s data tokenize --tokenizer bytes data/tinytext/corpus.txt %s", DTRAIN_BIN, shard), 0);
    struct stat st_txt, st_bin;
    CHECK(stat(DTRAIN_SOURCE_DIR "/data/tinytext/corpus.txt", &st_txt) == 0);
    CHECK(stat(shard, &st_bin) == 0);
    CHECK_INT_EQ(st_bin.st_size, 1024 + 2 * st_txt.st_size);
    CHECK_INT_EQ(run("%s data tokenize --tokenizer bytes data/tinytext/val.txt %s", DTRAIN_BIN, val), 0);
    CHECK_INT_EQ(run("%s --config configs/pretrain.yaml --set run.dir=%s --set data.train_path=%s "
                     "--set data.val_path=%s --set training.max_steps=40 --set eval.max_batches=4 "
                     "--set eval.every_steps=20 --set optimizer.warmup_steps=10",
                     DTRAIN_BIN, run_dir, shard, val), 0);
    double first, last, val_loss, val_acc;
    int n = read_metrics(run_dir, &first, &last, &val_loss, &val_acc);
    printf("language model: %d steps, loss %.4f -> %.4f, val loss %.4f\n", n, first, last, val_loss);
    CHECK_INT_EQ(n, 40);
    CHECK(first > 4.0 && last < 3.5); /* ln(257) = 5.55 at init; bytes of English fall fast */
    CHECK(isfinite(val_loss));
    /* logging.sample_every_steps: a sample every 20 steps, and weights byte-identical to the run
     * without samples (generation only reads them) */
    CHECK_INT_EQ(run("%s --config configs/pretrain.yaml --set run.dir=%s-samples --set data.train_path=%s "
                     "--set data.val_path=%s --set training.max_steps=40 --set eval.max_batches=4 "
                     "--set eval.every_steps=20 --set optimizer.warmup_steps=10 --set logging.sample_every_steps=20 "
                     "--set 'logging.sample_prompt=The ' --set logging.sample_tokens=24",
                     DTRAIN_BIN, run_dir, shard, val), 0);
    CHECK_STR_CONTAINS(out_text, "sample at step 20 (after \"The \"): ");
    CHECK_STR_CONTAINS(out_text, "sample at step 40 (after \"The \"): ");
    const char *smp = strstr(out_text, "sample at step 40");
    printf("%.*s\n", (int)strcspn(smp, "\n"), smp);
    CHECK_INT_EQ(run("cmp %s/model.safetensors %s-samples/model.safetensors", run_dir, run_dir), 0);
    /* a prompt the model cannot hold is refused at start, not at the first sample */
    CHECK_INT_EQ(run("%s --config configs/pretrain.yaml --set run.dir=%s-badprompt --set data.train_path=%s "
                     "--set logging.sample_every_steps=20 --set \"logging.sample_prompt=$(printf 'a%%.0s' $(seq 129))\"",
                     DTRAIN_BIN, run_dir, shard), 2);
    CHECK_STR_CONTAINS(err_text, "logging.sample_prompt: longer than model.n_positions");
    /* a sampled token 0 (here the NUL byte) is text like the others: samples have no stop token
     * (this seed's step-2 sample draws it; the sample used to end there) */
    CHECK_INT_EQ(run("%s --config configs/pretrain.yaml --set run.dir=%s-nul --set model.n_layer=2 --set data.seq_len=32 "
                     "--set training.max_steps=2 --set eval.every_steps=0 --set checkpoint.every_steps=0 "
                     "--set training.device=cpu --set logging.sample_every_steps=1 --set 'logging.sample_prompt=The ' "
                     "--set logging.sample_tokens=64 --set training.seed=6", DTRAIN_BIN, run_dir), 0);
    const char *nul = strstr(out_text, "sample at step 2 (after \"The \"): ");
    CHECK(nul != NULL);
    const size_t line = strcspn(nul, "\n");
    printf("%.*s\n", (int)line, nul);
    CHECK(memmem(nul, line, "\\x00", 4) != NULL);
}

/* A FIFO named as the config, the data or the weights: exit 2 at once, naming it (each used to
 * block in open() for good, past the first SIGTERM: `timeout -s KILL` makes that a failure) */
static void test_not_regular(void) {
    char fifo[600];
    snprintf(fifo, sizeof fifo, "%s/input.fifo", tmp);
    CHECK(mkfifo(fifo, 0644) == 0);
    char want[700];
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", fifo);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s --config %s", DTRAIN_BIN, fifo), 2);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s --config configs/ci-smoke.yaml --set data.train_path=%s --set run.dir=%s/fifo",
                     DTRAIN_BIN, fifo, tmp), 2);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s --config configs/ci-smoke.yaml --set model.init_from=%s --set run.dir=%s/fifo",
                     DTRAIN_BIN, fifo, tmp), 2);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s eval --config configs/ci-smoke.yaml --set model.init_from=%s", DTRAIN_BIN,
                     fifo), 2);
    CHECK_STR_CONTAINS(err_text, want);
}

/* A FIFO as tokenizer.json (data.tokenizer, or a Hugging Face directory's), or as the directory's
 * config.json or tokenizer_config.json: exit 2 at once, naming it (jansson's json_load_file
 * blocked in open() for good) */
static void test_not_regular_json(void) {
    const char *names[] = {"tokenizer.json", "config.json", "tokenizer_config.json"};
    char dir[600], fifo[700], want[800], cfg[700];
    snprintf(fifo, sizeof fifo, "%s/tokenizer.fifo", tmp);
    CHECK(mkfifo(fifo, 0644) == 0);
    snprintf(want, sizeof want, "%s: not a regular file (a FIFO)", fifo);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s data tokenize --tokenizer %s data/tinytext/val.txt %s/fifo.bin", DTRAIN_BIN,
                     fifo, tmp), 2);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("timeout -s KILL 30 %s --config configs/finetune.yaml --set data.tokenizer=%s --dry-run", DTRAIN_BIN,
                     fifo), 2);
    CHECK_STR_CONTAINS(err_text, want);
    /* a Hugging Face directory with one of its JSON files a FIFO, as init_from (data.tokenizer not
     * given: the directory's tokenizer.json is read) */
    snprintf(cfg, sizeof cfg, "%s/init-hf.yaml", tmp);
    for (int i = 0; i < 3; i++) {
        snprintf(dir, sizeof dir, "%s/hf-fifo-%d", tmp, i);
        CHECK_INT_EQ(run("cp -r data/pretrained %s && rm %s/%s && mkfifo %s/%s", dir, dir, names[i], dir, names[i]), 0);
        char yaml[900];
        snprintf(yaml, sizeof yaml, "data:\n  train_path: data/sentiment/train.tsv\n  seq_len: 32\nmodel:\n  "
                 "num_labels: 2\n  init_from: %s\n", dir);
        write_file(cfg, yaml);
        CHECK_INT_EQ(run("timeout -s KILL 30 %s --config %s --dry-run", DTRAIN_BIN, cfg), 2);
        snprintf(want, sizeof want, "%s/%s: not a regular file (a FIFO)", dir, names[i]);
        CHECK_STR_CONTAINS(err_text, want);
    }
}

/* data/bpe/tokenizer.json written to path with a change: "big" makes "qx" one token of id 65600
 * (a merge of rank 0; 65600 & 0xffff = 64 is "a"'s id; <|endoftext|> keeps its id 1024, now in
 * the vocabulary too), "noeot" drops <|endoftext|>, "swap" swaps the ids of "a" and "b" (it
 * still fits the model). */
static void write_bpe_variant(const char *path, const char *variant) {
    json_error_t je;
    json_t *t = json_load_file(DTRAIN_SOURCE_DIR "/data/bpe/tokenizer.json", 0, &je);
    CHECK(t != NULL);
    json_t *model = json_object_get(t, "model");
    CHECK_INT_EQ(json_integer_value(json_object_get(json_object_get(model, "vocab"), "a")), 64);
    if (strcmp(variant, "big") == 0) {
        json_object_set_new(json_object_get(model, "vocab"), "qx", json_integer(65600));
        json_object_set_new(json_object_get(model, "vocab"), "<|endoftext|>", json_integer(1024));
        json_array_insert_new(json_object_get(model, "merges"), 0, json_pack("[ss]", "q", "x"));
    } else if (strcmp(variant, "swap") == 0) {
        json_t *vocab = json_object_get(model, "vocab");
        json_int_t b = json_integer_value(json_object_get(vocab, "b"));
        json_object_set_new(vocab, "b", json_integer(64));
        json_object_set_new(vocab, "a", json_integer(b));
    } else {
        json_array_clear(json_object_get(t, "added_tokens"));
    }
    CHECK(json_dump_file(t, path, JSON_INDENT(1) | JSON_PRESERVE_ORDER) == 0);
    json_decref(t);
}

/* Every command that pairs a tokenizer with a model checks one against the other as training
 * does: predict with a tokenizer past model.vocab_size, or without an end-of-text token to pad
 * a classifier's texts, exits 2 naming them (ids used to be cut to 16 bits: "qx", id 65600, got
 * "a"'s probabilities, and no end-of-text token read as "token 65535 ... outside the
 * vocabulary"). A run records its tokenizer's SHA-256 (config.yaml, trainer.json); resume
 * refuses another tokenizer (one that still fits: "a" and "b" swapped; it used to go on), export,
 * predict and eval of the run refuse a tokenizer that changed since (export copied it
 * unchecked), and export --config checks it as --dry-run does. A language model of BPE shards
 * whose config names no tokenizer (bytes, 1500 ids) is exported without tokenizer files, saying
 * so (it got a byte tokenizer of 256 ids). */
static void test_tokenizer_fit(void) {
    char dir[600], tok[700], big[700], noeot[700], run_dir[700], in[700], out[700], hf[700], want[1400];
    snprintf(dir, sizeof dir, "%s/tokfit", tmp);
    test_mkdir_p(dir);
    snprintf(tok, sizeof tok, "%s/tok.json", dir);
    snprintf(big, sizeof big, "%s/big.json", dir);
    snprintf(noeot, sizeof noeot, "%s/noeot.json", dir);
    snprintf(run_dir, sizeof run_dir, "%s/run", dir);
    snprintf(in, sizeof in, "%s/in.txt", dir);
    snprintf(out, sizeof out, "%s/out.jsonl", dir);
    snprintf(hf, sizeof hf, "%s/hf", dir);
    CHECK_INT_EQ(run("cp data/bpe/tokenizer.json %s", tok), 0);
    write_bpe_variant(big, "big");
    write_bpe_variant(noeot, "noeot");
    write_file(in, "qx\na\n");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s --set data.tokenizer=%s --set training.max_steps=2 "
                     "--set eval.max_batches=1 --progress never", DTRAIN_BIN, run_dir, tok), 0);
    CHECK_INT_EQ(run("grep -q \"tokenizer_sha256: \\\"$(sha256sum %s | cut -c1-64)\\\"\" %s/config.yaml && grep -q "
                     "\"\\\"tokenizer_sha256\\\": \\\"$(sha256sum %s | cut -c1-64)\\\"\" %s/checkpoints/step_00000002/trainer.json",
                     tok, run_dir, tok, run_dir), 0);
    /* resume with the same file changed: refused, nothing trained; restored, it goes on */
    write_bpe_variant(tok, "swap");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s --set data.tokenizer=%s --set training.max_steps=3 "
                     "--set eval.max_batches=1 --progress never", DTRAIN_BIN, run_dir, tok), 2);
    snprintf(want, sizeof want, "%s/checkpoints/step_00000002: checkpoint trained with data.tokenizer of SHA-256 ", run_dir);
    CHECK_STR_CONTAINS(err_text, want);
    snprintf(want, sizeof want, "but data.tokenizer %s has SHA-256 ", tok);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_STR_CONTAINS(err_text, ": refusing to resume with another tokenizer (its ids mean other text");
    snprintf(want, sizeof want, "%s/checkpoints/step_00000003", run_dir);
    CHECK(access(want, F_OK) != 0);
    CHECK_INT_EQ(run("cp data/bpe/tokenizer.json %s", tok), 0);
    /* predict with a tokenizer the model cannot hold, and one without an end-of-text token */
    CHECK_INT_EQ(run("%s predict --checkpoint %s --config configs/finetune.yaml --set data.tokenizer=%s --input %s --out %s",
                     DTRAIN_BIN, run_dir, big, in, out), 2);
    snprintf(want, sizeof want, "model.vocab_size: 1025 is smaller than the 65601 ids of data.tokenizer %s", big);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK(access(out, F_OK) != 0);
    CHECK_INT_EQ(run("%s predict --checkpoint %s --config configs/finetune.yaml --set data.tokenizer=%s --input %s --out %s",
                     DTRAIN_BIN, run_dir, noeot, in, out), 2);
    snprintf(want, sizeof want, "data.tokenizer %s has no end-of-text token to pad classification texts with", noeot);
    CHECK_STR_CONTAINS(err_text, want);
    /* export: the tokenizer.json trained with, byte for byte; then the file changes (ids to 65600) */
    CHECK_INT_EQ(run("%s export --checkpoint %s --format hf --out %s", DTRAIN_BIN, run_dir, hf), 0);
    CHECK_INT_EQ(run("cmp %s %s/tokenizer.json", tok, hf), 0);
    CHECK_INT_EQ(run("cp %s %s && rm -r %s", big, tok, hf), 0);
    const char *cmds[] = {"export --format hf --out %s/hf2", "predict --input %s/in.txt --out %s/out.jsonl", "eval"};
    for (int i = 0; i < 3; i++) {
        char cmd[800];
        snprintf(cmd, sizeof cmd, cmds[i], dir, dir);
        CHECK_INT_EQ(run("%s %s --checkpoint %s", DTRAIN_BIN, cmd, run_dir), 2);
        CHECK_STR_CONTAINS(err_text, "/config.yaml:");
        CHECK_STR_CONTAINS(err_text, "data.tokenizer_sha256: the model was trained with the tokenizer of SHA-256 ");
        snprintf(want, sizeof want, "but data.tokenizer %s has ", tok);
        CHECK_STR_CONTAINS(err_text, want);
        CHECK_STR_CONTAINS(err_text, ": the file changed since (hint: restore it");
    }
    CHECK(access(out, F_OK) != 0);
    snprintf(want, sizeof want, "%s/hf2", dir);
    CHECK(access(want, F_OK) != 0 && access(hf, F_OK) != 0);
    /* a config that records no tokenizer: checked against the model, as --dry-run checks it */
    CHECK_INT_EQ(run("%s export --checkpoint %s --config configs/finetune.yaml --set data.tokenizer=%s --format hf --out %s",
                     DTRAIN_BIN, run_dir, tok, hf), 2);
    snprintf(want, sizeof want, "model.vocab_size: 1025 is smaller than the 65601 ids of data.tokenizer %s", tok);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK(access(hf, F_OK) != 0);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set data.tokenizer=%s --dry-run", DTRAIN_BIN, tok), 2);
    CHECK_STR_CONTAINS(err_text, want);

    /* a language model of BPE shards, its config naming no tokenizer: no tokenizer files, said */
    char shard[700], lm[700], lm_hf[700], p[800];
    snprintf(shard, sizeof shard, "%s/bpe.bin", dir);
    snprintf(lm, sizeof lm, "%s/lm", dir);
    snprintf(lm_hf, sizeof lm_hf, "%s/lm-hf", dir);
    CHECK_INT_EQ(run("%s data tokenize --tokenizer data/bpe/tokenizer.json data/tinytext/val.txt %s", DTRAIN_BIN, shard), 0);
    CHECK_INT_EQ(run("%s --config configs/pretrain.yaml --set run.dir=%s --set data.train_path=%s --set data.val_path= "
                     "--set model.vocab_size=1500 --set model.n_layer=1 --set model.n_embd=32 --set model.n_head=2 "
                     "--set data.seq_len=32 --set training.max_steps=2 --set eval.every_steps=0 --progress never",
                     DTRAIN_BIN, lm, shard), 0);
    CHECK_INT_EQ(run("%s export --checkpoint %s --format hf --out %s", DTRAIN_BIN, lm, lm_hf), 0);
    CHECK_STR_CONTAINS(err_text, "note: no tokenizer files written: data.tokenizer is bytes, but the model's 1500 ids are "
                                 "not bytes (model.vocab_size: 1500)");
    CHECK_STR_CONTAINS(out_text, "(config.json, model.safetensors)\n");
    snprintf(p, sizeof p, "%s/tokenizer.json", lm_hf);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/tokenizer_config.json", lm_hf);
    CHECK(access(p, F_OK) != 0);
    snprintf(p, sizeof p, "%s/config.json", lm_hf);
    CHECK(access(p, F_OK) == 0);
    /* named at export, the tokenizer is checked and written */
    CHECK_INT_EQ(run("%s export --checkpoint %s --format hf --out %s --set data.tokenizer=data/bpe/tokenizer.json",
                     DTRAIN_BIN, lm, lm_hf), 0);
    CHECK_INT_EQ(run("cmp data/bpe/tokenizer.json %s/tokenizer.json", lm_hf), 0);
}

/* No command overwrites its own input: predict --input X --out X, data tokenize IN IN, and
 * export --out DIR of the Hugging Face directory DIR it reads (or that holds the weights) exit 2
 * naming both, the input untouched (predict replaced the text with JSONL, tokenize turned it
 * into a shard, export dropped the directory's chat_template). */
static void test_own_input(void) {
    char text[600], hfdir[600], want[1400], got[256];
    snprintf(text, sizeof text, "%s/own.txt", tmp);
    snprintf(hfdir, sizeof hfdir, "%s/own-hf", tmp);
    write_file(text, "good\nbad\n");
    CHECK_INT_EQ(run("%s predict --checkpoint %s/finetune --input %s --out %s", DTRAIN_BIN, tmp, text, text), 2);
    snprintf(want, sizeof want, "--out %s and --input %s are the same file: writing the output would destroy the input", text,
             text);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("%s data tokenize --tokenizer bytes %s %s", DTRAIN_BIN, text, text), 2);
    snprintf(want, sizeof want, "OUT %s and IN %s are the same file", text, text);
    CHECK_STR_CONTAINS(err_text, want);
    test_slurp(text, got, sizeof got);
    CHECK_STR_EQ(got, "good\nbad\n");
    const char *tc = "{\"eos_token\": \"<|endoftext|>\", \"chat_template\": \"{{ messages }}\", \"mine\": 1}\n";
    CHECK_INT_EQ(run("cp -r data/pretrained %s", hfdir), 0);
    snprintf(want, sizeof want, "%s/tokenizer_config.json", hfdir);
    write_file(want, tc);
    CHECK_INT_EQ(run("%s export --checkpoint %s --format hf --out %s", DTRAIN_BIN, hfdir, hfdir), 2);
    snprintf(want, sizeof want, "--out %s and --checkpoint %s are the same directory", hfdir, hfdir);
    CHECK_STR_CONTAINS(err_text, want);
    CHECK_INT_EQ(run("%s export --checkpoint %s/model.safetensors --format hf --out %s/", DTRAIN_BIN, hfdir, hfdir), 2);
    snprintf(want, sizeof want, "holds --checkpoint %s/model.safetensors, and the output replaces the directory whole",
             hfdir);
    CHECK_STR_CONTAINS(err_text, want);
    snprintf(want, sizeof want, "%s/tokenizer_config.json", hfdir);
    test_slurp(want, got, sizeof got);
    CHECK_STR_EQ(got, tc);
    CHECK_INT_EQ(run("%s export --checkpoint %s --out %s/model.safetensors", DTRAIN_BIN, hfdir, hfdir), 2);
    CHECK_STR_CONTAINS(err_text, "are the same file");
}

/* What a restart cannot fix is not retried: a missing init_from or data file is exit 2 at once,
 * with no "restart" (it used to be retried three times with backoff, then exit 1). */
static void test_not_retried(void) {
    CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set run.dir=%s/noretry --set model.init_from=%s/missing.st "
                     "--set fault_tolerance.backoff_s=5",
                     DTRAIN_BIN, tmp, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "missing.st: cannot open: No such file or directory");
    CHECK(strstr(out_text, "restart") == NULL && strstr(err_text, "restart") == NULL);
    CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set run.dir=%s/noretry --set data.val_path=%s/none.bin "
                     "--set fault_tolerance.backoff_s=5",
                     DTRAIN_BIN, tmp, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "none.bin: no files match");
    CHECK(strstr(out_text, "restart") == NULL && strstr(err_text, "restart") == NULL);
}

/* Sweeps don't trap: re-running a finished run with a changed config exits 2 naming the key and
 * the ways out (it used to print "nothing to train" and exit 0); unchanged, or only moved to
 * another run.dir, it evaluates again; checkpoint.resume=never trains it again. A refused run
 * leaves the run's config.yaml as it was (it was overwritten with the refused config, which
 * export and predict then read). */
static void test_finished_changed(void) {
    char dir[600], moved[600];
    snprintf(dir, sizeof dir, "%s/sweep", tmp);
    snprintf(moved, sizeof moved, "%s/sweep-moved", tmp);
    const char *c = "--config configs/ci-smoke.yaml --set training.max_steps=4";
    CHECK_INT_EQ(run("%s %s --set run.dir=%s", DTRAIN_BIN, c, dir), 0);
    CHECK_INT_EQ(run("%s %s --set run.dir=%s", DTRAIN_BIN, c, dir), 0);
    CHECK_STR_CONTAINS(out_text, "nothing to train: step 4 of 4 is already done");
    CHECK_STR_CONTAINS(out_text, "final: val loss");
    CHECK_INT_EQ(run("cp %s/config.yaml %s-config.yaml", dir, dir), 0);
    CHECK_INT_EQ(run("%s %s --set run.dir=%s --set optimizer.weight_decay=0.123", DTRAIN_BIN, c, dir), 2);
    CHECK_STR_CONTAINS(err_text, ": this run is finished (step 4 of 4, checkpoint ");
    CHECK_STR_CONTAINS(err_text, "and the config changed since: optimizer.weight_decay 0.01 -> 0.123 (hint: a new run "
                                 "needs a new run.dir");
    CHECK_STR_CONTAINS(err_text, "--set checkpoint.resume=never");
    CHECK(strstr(out_text, "restart") == NULL && strstr(err_text, "restart") == NULL);
    CHECK_INT_EQ(run("cmp %s/config.yaml %s-config.yaml", dir, dir), 0); /* the run's config stays its own */
    CHECK_INT_EQ(run("mv %s %s && %s %s --set run.dir=%s", dir, moved, DTRAIN_BIN, c, moved), 0);
    CHECK_STR_CONTAINS(out_text, "nothing to train");
    CHECK_INT_EQ(run("%s %s --set run.dir=%s --set optimizer.weight_decay=0.123 --set checkpoint.resume=never",
                     DTRAIN_BIN, c, moved), 0);
    CHECK_STR_CONTAINS(out_text, "step 4/4");
}

/* `dtrain eval` and `export` on a run that has no final weights (it failed at step 15) use its
 * newest valid checkpoint (they used to fail on the missing model.safetensors); a directory
 * with neither is a clear exit 2. And each command's --help shows its own options. */
static void test_unfinished_run(void) {
    char dir[600], out[700];
    snprintf(dir, sizeof dir, "%s/unfinished", tmp);
    snprintf(out, sizeof out, "%s/unfinished.safetensors", tmp);
    CHECK_INT_EQ(run("DTRAIN_FAULT=rank=0,step=15,kind=exit %s --config configs/ci-smoke.yaml --set run.dir=%s "
                     "--set training.max_steps=30 --set checkpoint.every_steps=10 --set fault_tolerance.max_restarts=0",
                     DTRAIN_BIN, dir), 1);
    CHECK_INT_EQ(run("%s eval --config configs/ci-smoke.yaml --checkpoint %s", DTRAIN_BIN, dir), 0);
    CHECK_STR_CONTAINS(out_text, "has no final weights yet: using its newest valid checkpoint, ");
    CHECK_STR_CONTAINS(out_text, "/checkpoints/step_00000010 (step 10)");
    CHECK_STR_CONTAINS(out_text, "val loss ");
    CHECK_INT_EQ(run("%s export --checkpoint %s --out %s", DTRAIN_BIN, dir, out), 0);
    CHECK_STR_CONTAINS(out_text, "/checkpoints/step_00000010/model.safetensors to ");
    CHECK_INT_EQ(run("mkdir -p %s/none && %s eval --config configs/ci-smoke.yaml --checkpoint %s/none", tmp, DTRAIN_BIN,
                     tmp), 2);
    CHECK_STR_CONTAINS(err_text, "/none: no model.safetensors and no valid checkpoint in it");

    CHECK_INT_EQ(run("%s eval --help", DTRAIN_BIN), 0);
    CHECK_STR_CONTAINS(out_text, "  --checkpoint PATH ");
    CHECK(strstr(out_text, "--dry-run") == NULL && strstr(out_text, "dtrain bench") == NULL);
    CHECK_INT_EQ(run("%s bench --help", DTRAIN_BIN), 0);
    CHECK_STR_CONTAINS(out_text, "  --workers LIST ");
    CHECK(strstr(out_text, "--checkpoint") == NULL);
    CHECK_INT_EQ(run("%s --help", DTRAIN_BIN), 0); /* all of them */
    CHECK_STR_CONTAINS(out_text, "  --workers LIST ");
    CHECK_STR_CONTAINS(out_text, "  --dry-run ");
}

/* Texts cut to seq_len are counted and reported at start (they used to be cut silently). */
static void test_truncated(void) {
    CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set run.dir=%s/trunc --set training.max_steps=1 "
                     "--set data.seq_len=16",
                     DTRAIN_BIN, tmp), 0);
    CHECK_STR_CONTAINS(out_text, "data: 15990 of 16000 train examples (99.9%) are longer than data.seq_len - 1 = 15 "
                                 "bytes and were cut to it");
    CHECK_STR_CONTAINS(out_text, "data: 1997 of 2000 val examples");
    CHECK_INT_EQ(run("%s --config configs/ci-smoke.yaml --set run.dir=%s/trunc64 --set training.max_steps=1", DTRAIN_BIN,
                     tmp), 0);
    CHECK(strstr(out_text, "were cut") == NULL);
}

/* A run directory that was copied or downloaded may hold links: config.yaml, metrics.jsonl or
 * train.log as a link to a file outside is never written through (it used to be truncated or
 * appended to): exit 2 naming it, the file untouched */
static void test_planted_links(void) {
    const char *names[] = {"config.yaml", "metrics.jsonl", "train.log", "rank-1.log"};
    for (int i = 0; i < 8; i++) { /* each name as a symbolic link, then as a hard link */
        char run_dir[600], victim[600], planted[700], want[800], got[64];
        int hard = i >= 4;
        snprintf(run_dir, sizeof run_dir, "%s/planted-%d", tmp, i);
        snprintf(victim, sizeof victim, "%s/victim-%d.txt", tmp, i);
        snprintf(planted, sizeof planted, "%s/%s", run_dir, names[i % 4]);
        test_mkdir_p(run_dir);
        write_file(victim, "keep me");
        CHECK((hard ? link(victim, planted) : symlink(victim, planted)) == 0);
        CHECK_INT_EQ(run("timeout -s KILL 120 %s --config configs/ci-smoke.yaml --set run.dir=%s --set training.max_steps=2 "
                         "--set training.num_workers=2",
                         DTRAIN_BIN, run_dir), 2);
        snprintf(want, sizeof want, hard ? "%s: has 2 hard links: refusing to write through it"
                                         : "%s: is a symbolic link: refusing to write through it", planted);
        CHECK_STR_CONTAINS(err_text, want);
        CHECK(strstr(err_text, "restart") == NULL);
        test_slurp(victim, got, sizeof got);
        CHECK_STR_EQ(got, "keep me");
    }
}

/* Another process keeps a core busy for the first 2 s: the worker takes fewer threads at once,
 * says so, takes its threads back once the core is free again, and ends with weights
 * byte-identical to a run with fixed threads (training.adapt_cpu_threads: false). */
static void test_adapt_threads(void) {
    const char *common = "--config configs/finetune-bytes.yaml --set training.max_steps=300 --set eval.every_steps=0 "
                         "--set eval.max_batches=2 --set logging.monitor_every_s=0.2 --progress never";
    /* on two CPUs (the first two this process may use), whatever the machine has: the counts
     * below are those of 2 cores, 1 of them busy */
    cpu_set_t all, two;
    CHECK(sched_getaffinity(0, sizeof all, &all) == 0);
    if (CPU_COUNT(&all) < 2) {
        printf("one CPU: nothing to adapt\n");
        return;
    }
    CPU_ZERO(&two);
    for (int c = 0, k = 0; c < CPU_SETSIZE && k < 2; c++)
        if (CPU_ISSET(c, &all)) CPU_SET(c, &two), k++;
    CHECK(sched_setaffinity(0, sizeof two, &two) == 0);
    pid_t busy = fork();
    if (busy == 0) {
        for (volatile unsigned long i = 0;; i++) {
        }
    }
    pid_t killer = fork();
    if (killer == 0) {
        sleep(2);
        kill(busy, SIGKILL);
        _exit(0);
    }
    int rc = run("%s %s --set run.dir=%s/adapt-on", DTRAIN_BIN, common, tmp);
    kill(busy, SIGKILL);
    waitpid(busy, NULL, 0);
    waitpid(killer, NULL, 0);
    CHECK_INT_EQ(rc, 0);
    CHECK_STR_CONTAINS(out_text, "note: other processes keep ");
    CHECK_STR_CONTAINS(out_text, " of the 2 cores busy: 1 thread per worker from step ");
    CHECK_STR_CONTAINS(out_text, "(was 2; training.cpu_threads_per_worker fixes the count)");
    CHECK_STR_CONTAINS(out_text, " of the 2 cores busy: 2 threads per worker from step "); /* the core came back */
    CHECK_INT_EQ(run("%s %s --set run.dir=%s/adapt-off --set training.adapt_cpu_threads=false", DTRAIN_BIN, common, tmp), 0);
    CHECK(!strstr(out_text, "thread per worker from step") && !strstr(out_text, "threads per worker from step"));
    CHECK(sched_setaffinity(0, sizeof all, &all) == 0);
    test_same_weights("adapt-on", "adapt-off");
}

/* data.val_path naming several sets (a map; a list is named by file names): each is evaluated
 * and logged under its name (console, metrics.jsonl "set", TensorBoard val/NAME/...), the
 * first decides checkpoint.best_metric; the flipped copy scores exactly 1 - accuracy; the saved
 * config holds the map and a second run only evaluates; dtrain eval reports each set; two sets
 * of one name and ${NAME} in a list are refused naming the key. */
static void test_val_sets(void) {
    char flipped[600], run_dir[600], sets[1400];
    snprintf(flipped, sizeof flipped, "%s/sets-flipped.tsv", tmp);
    write_flipped_val(flipped);
    snprintf(run_dir, sizeof run_dir, "%s/valsets", tmp);
    snprintf(sets, sizeof sets, "--set 'data.val_path={main: data/sentiment/val.tsv, flipped: %s}' "
             "--set training.max_steps=200 --set checkpoint.best_metric=val_accuracy",
             flipped);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s %s", DTRAIN_BIN, run_dir, sets), 0);
    CHECK_STR_CONTAINS(out_text, "4000 val examples (main 2000, flipped 2000)");
    CHECK_STR_CONTAINS(out_text, "eval at step 100 [main] | val loss ");
    CHECK_STR_CONTAINS(out_text, "eval at step 200 [flipped] | val loss ");
    char path[700];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    char line[1 << 14];
    double acc[2][3] = {{0}};
    int n[2] = {0, 0};
    while (f && fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(o != NULL);
        const char *type = json_string_value(json_object_get(o, "type")), *set = json_string_value(json_object_get(o, "set"));
        if (type && strcmp(type, "eval") == 0) {
            CHECK(set != NULL);
            const int k = set && strcmp(set, "flipped") == 0;
            if (n[k] < 3) acc[k][n[k]] = json_number_value(json_object_get(o, "val_accuracy"));
            n[k]++;
        }
        json_decref(o);
    }
    if (f) fclose(f);
    CHECK_INT_EQ(n[0], 2); /* steps 100 and 200 */
    CHECK_INT_EQ(n[1], 2);
    for (int i = 0; i < 2; i++) CHECK(fabs(acc[0][i] + acc[1][i] - 1.0) < 1e-12);
    CHECK(acc[0][1] > 0.8 && acc[0][1] > acc[0][0]);
    CHECK_STR_CONTAINS(out_text, "new best val_accuracy "); /* by main: it rises */
    CHECK_INT_EQ(run("grep -qa 'val/flipped/accuracy' %s/events.out.tfevents.*", run_dir), 0);
    CHECK_INT_EQ(run("grep -q 'val_path: {\"main\": \"data/sentiment/val.tsv\", \"flipped\": ' %s/config.yaml", run_dir),
                 0);
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --set run.dir=%s %s", DTRAIN_BIN, run_dir, sets), 0);
    CHECK(strstr(out_text, "config changed") == NULL);
    CHECK_INT_EQ(run("%s eval --checkpoint %s --config %s/config.yaml", DTRAIN_BIN, run_dir, run_dir), 0);
    CHECK_STR_CONTAINS(out_text, "/model.safetensors [main] | val loss ");
    CHECK_STR_CONTAINS(out_text, "/model.safetensors [flipped] | val loss ");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --dry-run --set 'data.val_path=[data/sentiment/val.tsv, %s/val.tsv]'",
                     DTRAIN_BIN, tmp), 2);
    CHECK_STR_CONTAINS(err_text, "data.val_path: two validation sets are named \"val\"");
    CHECK_INT_EQ(run("%s --config configs/finetune.yaml --dry-run --set 'data.val_path=[data/sentiment/val.tsv, \"${X}\"]'",
                     DTRAIN_BIN), 2);
    CHECK_STR_CONTAINS(err_text, "data.val_path: ${NAME} is read for a single data.val_path only");
}

/* test_memory_estimate's runs on 2 workers (OPTS), 2 steps then resumed to 3 in run dir
 * memory-TAG: both ranks' peaks (MiB in the summary, compared in MB) under est + 128 MB, and
 * unless `upper_only` above 0.9 est; peak[r]: rank r's highest */
static void two_ranks_within(const char *what, const char *shape, const char *opts, const char *tag, double est,
                             int upper_only, double peak[2]) {
    peak[0] = peak[1] = 0;
    for (int steps = 2; steps <= 3; steps++) {
        CHECK_INT_EQ(run("%s --config configs/finetune-bytes.yaml %s %s --set run.dir=%s/memory-%s --set "
                         "training.max_steps=%d", DTRAIN_BIN, shape, opts, tmp, tag, steps), 0);
        if (steps == 3) CHECK_STR_CONTAINS(out_text, "resumed from ");
        const char *peaks = strstr(out_text, "peak memory: rank 0 ");
        CHECK(peaks != NULL);
        const double r0 = number_after(peaks ? peaks : out_text, "peak memory: rank 0 ") * 1.048576,
                     r1 = number_after(peaks ? peaks : out_text, ", rank 1 ") * 1.048576;
        printf("%s: estimate %.1f MB, peaks %.1f and %.1f MB after %d steps\n", what, est, r0, r1, steps);
        CHECK(r0 < est + 128 && r1 < est + 128);
        CHECK(upper_only || (r0 > 0.9 * est && r1 > 0.9 * est));
        peak[0] = r0 > peak[0] ? r0 : peak[0];
        peak[1] = r1 > peak[1] ? r1 : peak[1];
    }
}

/* What a worker uses is what --dry-run says: its "# model:" line counts weights, gradients, AdamW
 * state and activations, and a checkpoint's save and a resume's load stage
 * a part at a time, not the whole model (they staged the weights twice over, the moments once:
 * this model's peak was 232 MB above the estimate). The slack is the process's own (libraries,
 * OpenBLAS buffers, data: 34 MB here; with 2 workers also the shm communicator's shared slots:
 * 66 MB in all). */
static void test_memory_estimate(void) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/memory", tmp);
    const char *shape = "--set model.n_layer=8 --set model.n_embd=512 --set model.n_head=8 --set "
                        "data.batch_size_per_worker=4 --set eval.max_batches=1 --set training.device=cpu "
                        "--progress never"; /* the CPU's estimate, on a GPU host too */
    CHECK_INT_EQ(run("%s --config configs/finetune-bytes.yaml %s --dry-run", DTRAIN_BIN, shape), 0);
    CHECK_STR_CONTAINS(out_text, "MB of memory per worker (on a CPU: weights 101.54MB, gradients 101.54MB, AdamW "
                                 "state 203.08MB, activations and scratch");
    const double est = number_after(out_text, "training FLOPs per token, ~"); /* MB */
    for (int steps = 2; steps <= 3; steps++) { /* a checkpoint written; then read back (resumed) and written */
        CHECK_INT_EQ(run("%s --config configs/finetune-bytes.yaml %s --set run.dir=%s --set training.max_steps=%d "
                         "--set training.cpu_threads_per_worker=2", DTRAIN_BIN, shape, dir, steps), 0);
        CHECK_STR_CONTAINS(out_text, steps == 2 ? "checkpoint: " : "resumed from ");
        const double peak = number_after(out_text, "peak memory: ") * 1.048576; /* MiB -> MB */
        printf("estimate %.1f MB, peak %.1f MB after %d steps\n", est, peak, steps);
        CHECK(peak < est + 128);
        CHECK(peak > 0.9 * est); /* the estimate does not count what is never allocated */
    }
    /* ZeRO-1 on 2 workers: each holds half the moments, and rank 0 gathers the other half a
     * moment at a time into the gradients' buffer to write them (it staged both on the host:
     * 203 MB above rank 1), and a resume reads each rank's half a part at a time */
    const char *zero = "--set training.num_workers=2 --set training.zero_stage=1 --set training.cpu_threads_per_worker=1";
    CHECK_INT_EQ(run("%s --config configs/finetune-bytes.yaml %s %s --dry-run", DTRAIN_BIN, shape, zero), 0);
    CHECK_STR_CONTAINS(out_text, "AdamW state 101.54MB (this worker's ZeRO-1 share)");
    const double est_z = number_after(out_text, "training FLOPs per token, ~");
    double peak[2];
    two_ranks_within("ZeRO-1", shape, zero, "zero", est_z, 0, peak);
    /* tensor parallelism on 2 workers: a share's estimate, plus what rank 0 gathers to save (one
     * array of the whole model at a time: it gathered all three, 305 MB, besides its share's
     * copies), or on the other rank the windows it sends, and a resume reads a tensor at a time
     * (it staged the whole moments on every share). Each rank within 64 MB of its own figure:
     * when each share first copied its whole array to the host (51 MB here) and all-gathered each
     * tensor whole, both ranks stood 76-79 MB above it. */
    const char *tp = "--set training.num_workers=2 --set training.tensor_parallel=2 --set training.cpu_threads_per_worker=1";
    CHECK_INT_EQ(run("%s --config configs/finetune-bytes.yaml %s %s --dry-run", DTRAIN_BIN, shape, tp), 0);
    const double est_t = number_after(out_text, "MB of weights, gradients and AdamW state, ~"),
                 staged = number_after(out_text, "on the host, one at a time (~"),
                 others = number_after(out_text, "; the other workers stage at most ");
    printf("tensor_parallel 2: rank 0 gathers %.1f MB more to save, rank 1 stages %.1f MB\n", staged, others);
    CHECK(others > 0 && others < staged);
    two_ranks_within("tensor_parallel 2", shape, tp, "tp", est_t + staged, 1, peak);
    CHECK(peak[0] < est_t + staged + 64);
    CHECK(peak[1] < est_t + others + 64);
}

int main(void) {
    test_dir_init("e2e");
    test_adapt_threads();
    test_cli();
    test_dry_run();
    test_bad_data();
    test_secrets();
    test_eval_limit();
    test_not_regular();
    test_not_regular_json();
    test_planted_links();
    test_not_retried();
    test_finished_changed();
    test_unfinished_run();
    test_truncated();
    test_language_model();
    test_finetune();
    test_generate();
    test_predict();
    test_tokenizer_fit();
    test_own_input();
    test_early_stopping();
    test_val_sets();
    test_memory_estimate();
    test_dir_remove();
    TEST_PASS("test_e2e");
}
