/* gen_seeds.c — writes the generated seeds of the fuzz targets (tests/fuzz/README.md):
 *
 *   gen_seeds SOURCE_DIR OUT_DIR   ->  OUT_DIR/{data,safetensors,ckpt}/...
 *
 * They come from the shipped data (data/sentiment, data/tinytext) and from the writers of
 * this tree (dt_shard_write, dt_st_write, dt_model_save, dt_ckpt_save), so they follow the
 * formats as they are now; run.sh makes them before every run. The config target's seeds are
 * the shipped configs themselves, copied by run.sh. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/data.h"
#include "dtrain/safetensors.h"
#include "dtrain/hfdir.h"
#include "fuzz_model.h"
#include "fuzz_util.h"

static const char *out_dir;

static void die(const char *what) {
    fprintf(stderr, "gen_seeds: %s: %s\n", what, dt_error_msg());
    exit(1);
}

/* The whole file (at most max bytes of it); *n receives its length. */
static uint8_t *slurp(const char *path, size_t max, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) die(path);
    uint8_t *buf = malloc(max + 1);
    *n = fread(buf, 1, max, f);
    fclose(f);
    return buf;
}

/* OUT_DIR/target/name = prefix (np bytes) + body */
static void seed(const char *target, const char *name, const void *prefix, size_t np, const void *body, size_t nb) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", out_dir, target);
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/%s/%s", out_dir, target, name);
    FILE *f = fopen(p, "wb");
    if (!f || fwrite(prefix, 1, np, f) != np || fwrite(body, 1, nb, f) != nb || fclose(f) != 0) die(p);
}

/* The first `lines` lines of a file. */
static uint8_t *head_lines(const char *path, int lines, size_t *n) {
    uint8_t *buf = slurp(path, 1 << 16, n);
    size_t i = 0;
    for (int l = 0; i < *n && l < lines; i++) l += buf[i] == '\n';
    *n = i;
    return buf;
}

static void data_seeds(const char *src) {
    char p[1024];
    size_t n;
    snprintf(p, sizeof p, "%s/data/sentiment/train.tsv", src);
    uint8_t *tsv = head_lines(p, 12, &n);
    /* option bytes: see fuzz_data.c */
    seed("data", "tsv", (uint8_t[]){2, 31, 2, 0}, 4, tsv, n);
    seed("data", "tsv-auto-gz", (uint8_t[]){0 | 4, 15, 2, 1}, 4, tsv, n);
    size_t half = n / 2;
    while (half < n && tsv[half - 1] != '\n') half++;
    uint8_t *two = malloc(n + 16);
    memcpy(two, tsv, half);
    memcpy(two + half, FUZZ_SEP, strlen(FUZZ_SEP));
    memcpy(two + half + strlen(FUZZ_SEP), tsv + half, n - half);
    seed("data", "tsv-dir", (uint8_t[]){2 | 16 | 128, 7, 3 | 8, 0 | 16}, 4, two, n + strlen(FUZZ_SEP));
    free(two);
    free(tsv);

    snprintf(p, sizeof p, "%s/data/tinytext/corpus.txt", src);
    uint8_t *text = slurp(p, 200, &n);
    uint32_t tok[200];
    for (size_t i = 0; i < n; i++) tok[i] = text[i];
    free(text);
    snprintf(p, sizeof p, "%s/shard.bin", fuzz_scratch());
    if (dt_shard_write(p, tok, n) != DT_OK) die(p);
    uint8_t *shard = slurp(p, 1 << 16, &n);
    seed("data", "shard-v1", (uint8_t[]){1 | 8, 15, 0, 0}, 4, shard, n);
    seed("data", "shard-v1-gz", (uint8_t[]){0 | 8 | 4 | 32, 7, 0 | 8, 0}, 4, shard, n);
    /* version 7: uint32 tokens (no writer in the tree: the header of the v1 shard, widened) */
    uint8_t *v2 = calloc(1, 1024 + 4 * 200);
    int32_t hdr[256] = {DT_SHARD_MAGIC_V2, 7, 200};
    memcpy(v2, hdr, sizeof hdr);
    for (size_t i = 0; i < 200; i++) {
        uint32_t t = tok[i] * 3000u;
        memcpy(v2 + 1024 + 4 * i, &t, 4);
    }
    seed("data", "shard-v2", (uint8_t[]){1 | 8, 31, 0, 4}, 4, v2, 1024 + 4 * 200);
    free(v2);
    free(shard);
}

static void write_half_floats(void) {
    /* F16 and BF16 tensors and a non-float one (written by hand: dt_st_write writes F32) */
    const char *json = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F16\",\"shape\":[2,2],"
                       "\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[8,14]},"
                       "\"c\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[14,22]}}";
    size_t jl = strlen(json), hl = (jl + 7) / 8 * 8;
    uint8_t *buf = calloc(1, 8 + hl + 22);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)hl >> (8 * i));
    memset(buf + 8, ' ', hl);
    memcpy(buf + 8, json, jl);
    static const uint16_t vals[11] = {0x3c00, 0xc000, 0x7c00, 0x0001, 0x3f80, 0xff80, 0x7fc0, 7, 0, 0, 0};
    memcpy(buf + 8 + hl, vals, 22);
    seed("safetensors", "f16-bf16-i64", "", 0, buf, 8 + hl + 22);
    free(buf);
}

static void safetensors_seeds(const fuzz_model *fm) {
    char p[1024];
    size_t n;
    float a[6] = {1, -2, 3.5f, 0, 1e-30f, 6}, b[1] = {42};
    dt_st_entry e[3] = {{.name = "w", .ndim = 2, .shape = {2, 3}, .data = a},
                        {.name = "scalar", .ndim = 0, .data = b},
                        {.name = "empty", .ndim = 1, .shape = {0}, .data = b}};
    const char *k[] = {"format", "producer"}, *v[] = {"pt", "dtrain"};
    snprintf(p, sizeof p, "%s/small.safetensors", fuzz_scratch());
    if (dt_st_write(p, e, 3, k, v, 2) != DT_OK) die(p);
    uint8_t *buf = slurp(p, 1 << 16, &n);
    seed("safetensors", "small", "", 0, buf, n);
    free(buf);
    snprintf(p, sizeof p, "%s/model.safetensors", fuzz_scratch());
    if (dt_model_save(fm->m, p) != DT_OK) die(p);
    buf = slurp(p, 1 << 20, &n);
    seed("safetensors", "model", "", 0, buf, n);
    free(buf);
    write_half_floats();
}

/* The fixture's checkpoint, its files joined in fuzz_ckpt.c's order. */
static void ckpt_seed(const fuzz_model *fm) {
    static const char *const files[5] = {"manifest.json", "trainer.json", "config.yaml", "model.safetensors",
                                         "optimizer.safetensors"};
    dt_config cfg;
    dt_config_defaults(&cfg);
    snprintf(cfg.data.train_path, sizeof cfg.data.train_path, "data/sentiment/train.tsv");
    dt_ckpt_state s = {.step = 7, .epoch = 1, .cursor = 24, .seed = 1337, .config_digest = dt_config_digest(&cfg),
                       .world = 2, .global_batch = 8, .train_samples = 100, .model = dt_model_config(fm->m)->shape};
    char run[1024], dir[1200], p[1400];
    snprintf(run, sizeof run, "%s/run", fuzz_scratch());
    mkdir(run, 0755);
    if (dt_ckpt_save(run, fm->m, fm->o, &s, &cfg, dir, sizeof dir) != DT_OK) die("dt_ckpt_save");
    size_t cap = 1 << 16, len = 0;
    uint8_t *all = malloc(cap);
    for (int i = 0; i < 5; i++) {
        size_t n;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        uint8_t *buf = slurp(p, 1 << 16, &n);
        if (len + n + 16 > cap) all = realloc(all, cap = 2 * (len + n + 16));
        if (i) memcpy(all + len, FUZZ_SEP, strlen(FUZZ_SEP)), len += strlen(FUZZ_SEP);
        memcpy(all + len, buf, n);
        len += n;
        free(buf);
    }
    seed("ckpt", "step7", "", 0, all, len);
    free(all);
}

/* A libFuzzer dictionary of the config's keys, from the printed defaults: "key:" for the file
 * and "#--set section.key=" for the overrides (so it follows the schema as it is now). */
static void config_dict(void) {
    dt_config cfg;
    dt_config_defaults(&cfg);
    char *text = NULL, path[1024], keys[4][64] = {{0}};
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    dt_config_print(&cfg, mem);
    fclose(mem);
    snprintf(path, sizeof path, "%s/config.dict", out_dir);
    FILE *d = fopen(path, "w");
    if (!d) die(path);
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        int indent = (int)strspn(line, " "), depth = indent / 2;
        char *colon = strchr(line, ':');
        if (line[indent] == '#' || !colon || depth > 3) continue;
        int klen = (int)(colon - line - indent);
        fprintf(d, "\"%.*s:\"\n", klen, line + indent);
        snprintf(keys[depth], sizeof keys[depth], "%.*s", klen, line + indent);
        if (!colon[1]) continue; /* a section: its keys follow */
        fputs("\"#--set ", d);
        for (int k = 0; k <= depth; k++) fprintf(d, "%s%s", k ? "." : "", keys[k]);
        fputs("=\"\n", d);
    }
    fputs("\"${DTRAIN_FUZZ_WORKERS}\"\n\"${DTRAIN_FUZZ_EMPTY}\"\n", d);
    fclose(d);
    free(text);
}

/* tokenizer: the shipped BPE tokenizer and dtrain's byte tokenizers (as export writes them),
 * each with a text; hfconfig: the shipped pretrained model's config.json and
 * tokenizer_config.json, and a Llama config.json as export writes it. */
static void hf_seeds(const char *src) {
    static const char text[] = FUZZ_SEP "Hello, world! caf\xc3\xa9 12345 <|endoftext|>";
    char p[1024], dir[1100];
    size_t n, m;
    snprintf(p, sizeof p, "%s/data/bpe/tokenizer.json", src);
    uint8_t *buf = slurp(p, 1 << 20, &n);
    seed("tokenizer", "bpe.json", buf, n, text, sizeof text - 1);
    free(buf);
    for (int cls = 0; cls < 2; cls++) {
        snprintf(dir, sizeof dir, "%s/bytes-%d", out_dir, cls);
        mkdir(dir, 0755);
        if (dt_hf_write_byte_tokenizer(dir, cls, 64) != DT_OK) die(dir);
        snprintf(p, sizeof p, "%s/tokenizer.json", dir);
        buf = slurp(p, 1 << 20, &n);
        seed("tokenizer", cls ? "bytes-cls.json" : "bytes.json", buf, n, text, sizeof text - 1);
        free(buf);
        fuzz_rm_tree(dir);
    }
    snprintf(p, sizeof p, "%s/data/pretrained/config.json", src);
    buf = slurp(p, 1 << 20, &n);
    snprintf(p, sizeof p, "%s/data/pretrained/tokenizer_config.json", src);
    uint8_t *tc = slurp(p, 1 << 20, &m);
    uint8_t *both = malloc(n + strlen(FUZZ_SEP) + m + 1);
    memcpy(both, buf, n);
    memcpy(both + n, FUZZ_SEP, strlen(FUZZ_SEP));
    memcpy(both + n + strlen(FUZZ_SEP), tc, m);
    seed("hfconfig", "pretrained.json", both, n + strlen(FUZZ_SEP) + m, "", 0);
    free(both);
    free(tc);
    free(buf);
    dt_hf_config c = {.shape = {.arch = DT_ARCH_LLAMA, .n_layer = 2, .n_head = 4, .n_embd = 64, .vocab_size = 300,
                                .n_positions = 128, .num_key_value_heads = 2, .intermediate_size = 160,
                                .rope_theta = 10000.0, .rms_norm_eps = 1e-5, .tie_word_embeddings = 1},
                      .pad_token_id = -1, .eos_token_id = 2, .bos_token_id = 1, .max_length = 128};
    snprintf(dir, sizeof dir, "%s/llama", out_dir);
    mkdir(dir, 0755);
    if (dt_hf_write_config(dir, &c) != DT_OK) die(dir);
    snprintf(p, sizeof p, "%s/config.json", dir);
    buf = slurp(p, 1 << 20, &n);
    seed("hfconfig", "llama.json", buf, n, "", 0);
    free(buf);
    fuzz_rm_tree(dir);
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: gen_seeds SOURCE_DIR OUT_DIR\n");
        return 2;
    }
    out_dir = argv[2];
    mkdir(out_dir, 0755);
    fuzz_model fm;
    fuzz_model_init(&fm);
    config_dict();
    data_seeds(argv[1]);
    safetensors_seeds(&fm);
    ckpt_seed(&fm);
    hf_seeds(argv[1]);
    fuzz_model_free(&fm);
    return 0;
}
