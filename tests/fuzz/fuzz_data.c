/* fuzz_data.c — the dataset loader (src/io/data.c: tsv files and llm.c token shards, plain or
 * .gz, one file or a directory of them) and the sampler over what it loaded.
 *
 * Input: 4 option bytes, then the file's bytes.
 *   opt[0]: bits 0-1 data.format (0 auto, 1 tokens, 2 tsv, 3 auto); bit 2 gzip the file;
 *           bit 3 name it .bin (else .tsv); bit 4 a directory: the content is split at
 *           "\n--8<--\n" into up to 3 files; bits 5-6 accum - 1; bit 7 shuffle
 *   opt[1]: data.seq_len = 1 + opt[1] % 64
 *   opt[2]: model.num_labels = low 3 bits % 5 (1 is refused); world - 1 = high bits % 4
 *   opt[3]: model.vocab_size from a table (low 3 bits); batch per worker - 1 = high bits % 4
 * Checked besides the sanitizers: a refusal has a message; every sample of an accepted set
 * has tokens in [0, vocab_size) and targets in range (LM: < vocab_size, classification: a
 * label < num_labels); the sampler's indices are < the set size and one step's global batch
 * holds no sample twice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dtrain/data.h"
#include "fuzz_util.h"


int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_scratch();
    return 0;
}

static void write_gz(const char *path, const uint8_t *p, size_t n) {
    gzFile f = gzopen(path, "wb");
    FUZZ_ASSERT(f != NULL, "gzopen %s", path);
    if (n) FUZZ_ASSERT(gzwrite(f, p, (unsigned)n) == (int)n, "gzwrite %s", path);
    FUZZ_ASSERT(gzclose(f) == Z_OK, "gzclose %s", path);
}

/* Writes the file(s) under a fresh directory of the scratch; *path receives what to open. */
static int write_input(uint8_t opt, const uint8_t *data, size_t size, char *path, size_t n) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/d", fuzz_scratch());
    fuzz_rm_tree(dir);
    FUZZ_ASSERT(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    fuzz_part parts[3];
    int np = (opt & 16) ? fuzz_split(data, size, parts, 3) : 1;
    if (np == 1) parts[0] = (fuzz_part){data, size};
    const char *ext = (opt & 8) ? ".bin" : ".tsv";
    for (int i = 0; i < np; i++) {
        char file[700];
        snprintf(file, sizeof file, "%s/part%d%s%s", dir, i, ext, (opt & 4) ? ".gz" : "");
        if (opt & 4) write_gz(file, parts[i].p, parts[i].n);
        else fuzz_write(file, parts[i].p, parts[i].n);
        if (!(opt & 16)) snprintf(path, n, "%s", file);
    }
    if (opt & 16) snprintf(path, n, "%s", dir);
    return 1;
}

static void check_samples(const dt_dataset *ds, const dt_dataset_cfg *cfg, int *tok, int *tgt) {
    size_t n = dt_dataset_size(ds);
    int cls = dt_dataset_is_classification(ds);
    FUZZ_ASSERT(cls == (cfg->num_labels >= 2), "classification %d with num_labels %d", cls, cfg->num_labels);
    for (size_t k = 0; n && k <= 64; k++) { /* 65 samples spread over the set, the last one included */
        size_t i = (n - 1) / 64 * k + (n - 1) % 64 * k / 64;
        dt_dataset_get(ds, i, tok, tgt);
        for (int t = 0; t < cfg->seq_len; t++) {
            FUZZ_ASSERT(tok[t] >= 0 && tok[t] < cfg->vocab_size, "sample %zu token %d = %d", i, t, tok[t]);
            if (!cls) FUZZ_ASSERT(tgt[t] >= 0 && tgt[t] < cfg->vocab_size, "sample %zu target %d = %d", i, t, tgt[t]);
        }
        if (cls) FUZZ_ASSERT(tgt[0] >= 0 && tgt[0] < cfg->num_labels, "sample %zu label %d", i, tgt[0]);
    }
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

/* Every rank's micro-batches of the first steps: indices < n, and one step's global batch
 * (all ranks, all micro-batches) never holds a sample twice. */
static void check_sampler(size_t n, const uint8_t *opt) {
    dt_sampler_cfg sc = {.num_samples = n, .seed = opt[1], .shuffle = opt[0] >> 7, .world = 1 + (opt[2] >> 3) % 4,
                         .batch_per_worker = 1 + (opt[3] >> 3) % 4, .accum = 1 + ((opt[0] >> 5) & 3)};
    size_t G = (size_t)sc.world * (size_t)sc.batch_per_worker * (size_t)sc.accum, seen[64];
    for (size_t j = 0; j < 2 && j < n / G; j++) {
        size_t m = 0;
        for (sc.rank = 0; sc.rank < sc.world; sc.rank++) {
            dt_sampler *s = NULL;
            dt_status st = dt_sampler_init(&s, &sc);
            FUZZ_ASSERT(st == DT_OK, "sampler over %zu samples: %s", n, dt_error_msg());
            FUZZ_ASSERT(dt_sampler_global_batch(s) == G && dt_sampler_steps_per_epoch(s) == n / G,
                        "global batch %zu, %zu steps for %zu samples", dt_sampler_global_batch(s),
                        dt_sampler_steps_per_epoch(s), n);
            for (int a = 0; a < sc.accum; a++, m += (size_t)sc.batch_per_worker) {
                dt_sampler_batch(s, 1, j, a, seen + m);
                for (int k = 0; k < sc.batch_per_worker; k++)
                    FUZZ_ASSERT(seen[m + k] < n, "index %zu of %zu", seen[m + k], n);
            }
            dt_sampler_free(s);
        }
        qsort(seen, m, sizeof seen[0], cmp_size);
        for (size_t k = 1; k < m; k++) FUZZ_ASSERT(seen[k] != seen[k - 1], "step %zu: sample %zu twice", j, seen[k]);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static const int vocab[8] = {257, 300, 50257, 65536, 1 << 20, 2, 256, 1};
    if (size < 4) return 0;
    char path[800];
    if (!write_input(data[0], data + 4, size - 4, path, sizeof path)) return 0;
    dt_dataset_cfg cfg = {.path = path, .format = (dt_data_format)((data[0] & 3) % 3), .seq_len = 1 + data[1] % 64,
                          .num_labels = (data[2] & 7) % 5, .vocab_size = vocab[data[3] & 7]};
    dt_dataset *ds = NULL;
    dt_error_clear();
    dt_status st = dt_dataset_open(&ds, &cfg);
    fuzz_debug("dt_dataset_open", st);
    if (st != DT_OK) {
        FUZZ_ASSERT(ds == NULL && dt_error_msg()[0], "status %s without a message", dt_status_str(st));
        return 0;
    }
    int *tok = malloc(64 * sizeof *tok), *tgt = malloc(64 * sizeof *tgt);
    check_samples(ds, &cfg, tok, tgt);
    if (dt_dataset_size(ds) > 0) check_sampler(dt_dataset_size(ds), data);
    free(tok);
    free(tgt);
    dt_dataset_free(ds);
    return 0;
}
