/* test_data.c — datasets (token shards, tsv, .gz, globs, directories), every bad-data
 * message, the world-size-independent sampler, eval slicing and shard writing; hostile
 * files: a header claiming more than the file holds, FIFOs and devices, planted links;
 * a tokenizer that does not fit the model, an output that is its own input, SHA-256. */
#include "dtrain/data.h"

#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "dtrain/file.h"
#include "testutil.h"


static void write_gz(const char *path, const void *data, size_t len) {
    gzFile f = gzopen(path, "wb");
    CHECK(f != NULL);
    CHECK(gzwrite(f, data, (unsigned)len) == (int)len);
    CHECK(gzclose(f) == Z_OK);
}

static void put32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Builds a shard in memory: header (magic, version, declared count) then `ntok` tokens of
 * `width` bytes, then `extra` zero bytes. Returns the byte length; caller frees *out. */
static size_t make_shard(unsigned char **out, int32_t magic, int32_t version, int32_t declared,
                         const uint32_t *tok, size_t ntok, int width, size_t extra) {
    size_t len = 1024 + ntok * (size_t)width + extra;
    unsigned char *b = calloc(1, len);
    CHECK(b != NULL);
    put32(b, (uint32_t)magic);
    put32(b + 4, (uint32_t)version);
    put32(b + 8, (uint32_t)declared);
    for (size_t i = 0; i < ntok; i++) {
        unsigned char *p = b + 1024 + i * (size_t)width;
        if (width == 2) {
            p[0] = (unsigned char)tok[i];
            p[1] = (unsigned char)(tok[i] >> 8);
        } else {
            put32(p, tok[i]);
        }
    }
    *out = b;
    return len;
}

static void write_shard(const char *path, int32_t magic, int32_t version, int32_t declared,
                        const uint32_t *tok, size_t ntok, int width, size_t extra, int gz) {
    unsigned char *b;
    size_t len = make_shard(&b, magic, version, declared, tok, ntok, width, extra);
    if (gz) write_gz(path, b, len);
    else test_write_file(path, b, len);
    free(b);
}

static dt_status open_ds(dt_dataset **ds, const char *path, dt_data_format fmt, int T,
                         int num_labels, int vocab) {
    dt_dataset_cfg cfg = {.path = path, .format = fmt, .seq_len = T, .num_labels = num_labels,
                          .vocab_size = vocab};
    dt_error_clear();
    dt_status st = dt_dataset_open(ds, &cfg);
    if (st != DT_OK) CHECK(*ds == NULL);
    return st;
}

/* Opens `path` expecting failure with status `want` and exactly message `msg`. */
static void expect_err(const char *path, dt_data_format fmt, int T, int num_labels, int vocab,
                       dt_status want, const char *msg) {
    dt_dataset *ds = (dt_dataset *)1;
    dt_status st = open_ds(&ds, path, fmt, T, num_labels, vocab);
    if (st != want) fprintf(stderr, "message: %s\n", dt_error_msg());
    CHECK_INT_EQ(st, want);
    CHECK_STR_EQ(dt_error_msg(), msg);
}

static char g_msg[4096];
#define MSG(...) (snprintf(g_msg, sizeof g_msg, __VA_ARGS__), g_msg)

/* ---------------------------------------------------------------- bad data */

static void test_bad_shards(void) {
    uint32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint32_t)i;
    const char *p;

    p = test_path("badmagic.bin");
    write_shard(p, 12345, 1, 64, tok, 64, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 0: bad magic 12345 (expected 20240520 or 20240801: not an llm.c token "
                   "shard)",
                   p));

    p = test_path("trunc.bin");
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 100, tok, 50, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 1124: truncated: header says 100 tokens (200 bytes), file has only 100 "
                   "bytes of tokens",
                   p));

    p = test_path("badversion.bin");
    write_shard(p, DT_SHARD_MAGIC_V1, 7, 64, tok, 64, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 4: unsupported version 7 (magic 20240520 needs version 1)", p));
    p = test_path("badversion2.bin");
    write_shard(p, DT_SHARD_MAGIC_V2, 1, 64, tok, 64, 4, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 4: unsupported version 1 (magic 20240801 needs version 7)", p));

    p = test_path("bigtoken.bin");
    uint32_t big[8] = {1, 2, 3, 70000, 5, 6, 7, 8};
    write_shard(p, DT_SHARD_MAGIC_V2, 7, 8, big, 8, 4, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 4, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 1036: token 70000 >= model.vocab_size 50257", p));
    p = test_path("bigtoken1.bin"); /* v1: token 300 >= vocab 257 at index 5 */
    uint32_t mid[8] = {1, 2, 3, 4, 5, 300, 7, 8};
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 8, mid, 8, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 4, 0, 257, DT_ERR_DATA,
               MSG("%s: offset 1034: token 300 >= model.vocab_size 257", p));

    p = test_path("short.bin");
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 64, tok, 0, 2, 0, 0);
    CHECK(truncate(p, 100) == 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 100: file has only 100 bytes, shorter than the 1024-byte shard header",
                   p));

    p = test_path("extra.bin");
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 64, tok, 64, 2, 3, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 1152: 3 extra bytes after the 64 tokens the header declares", p));

    p = test_path("zero.bin");
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 0, tok, 0, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: offset 8: header says 0 tokens (expected at least 1)", p));

    p = test_path("few.bin"); /* 8 tokens cannot make one sample of T = 8 */
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 8, tok, 8, 2, 0, 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: only 8 tokens in 1 file(s), but data.seq_len 8 needs at least 9 for one "
                   "sample (hint: lower data.seq_len or add data)",
                   p));
    dt_dataset *ds = NULL;
    CHECK_INT_EQ(open_ds(&ds, p, DT_FORMAT_AUTO, 7, 0, 50257), DT_OK); /* 8 = T+1 is enough */
    CHECK_INT_EQ(dt_dataset_size(ds), 1);
    dt_dataset_free(ds);

    /* a truncated .gz stream */
    p = test_path("cut.bin.gz");
    write_shard(p, DT_SHARD_MAGIC_V1, 1, 64, tok, 64, 2, 0, 1);
    struct stat st;
    CHECK(stat(p, &st) == 0);
    CHECK(truncate(p, st.st_size - 12) == 0);
    ds = (dt_dataset *)1;
    CHECK_INT_EQ(open_ds(&ds, p, DT_FORMAT_AUTO, 8, 0, 50257), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), p);
}

static void test_bad_tsv(void) {
    const char *p;
    p = test_path("empty.tsv");
    test_write_file(p, "", 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s: empty file (expected lines of \"label<TAB>text\")", p));

    p = test_path("range.tsv");
    const char *range = "0\tgood\n1\tfine\n3\tbad\n";
    test_write_file(p, range, strlen(range));
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:3: label 3 out of range [0, 2) (hint: model.num_labels is 2)", p));
    p = test_path("neg.tsv");
    test_write_file(p, "-1\tx\n", 5);
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:1: label -1 out of range [0, 2) (hint: model.num_labels is 2)", p));

    p = test_path("notab.tsv");
    const char *notab = "0\tok\r\n1 no tab here\n";
    test_write_file(p, notab, strlen(notab));
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:2: no tab: expected \"label<TAB>text\"", p));

    p = test_path("nonint.tsv");
    const char *nonint = "0\tok\npos\ttext\n";
    test_write_file(p, nonint, strlen(nonint));
    expect_err(p, DT_FORMAT_AUTO, 8, 3, 257, DT_ERR_DATA,
               MSG("%s:2: label \"pos\" is not an integer (expected \"label<TAB>text\" with an "
                   "integer label in [0, 3))",
                   p));

    p = test_path("emptyline.tsv");
    const char *el = "0\ta\n\n1\tb\n";
    test_write_file(p, el, strlen(el));
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:2: empty line (expected \"label<TAB>text\")", p));

    p = test_path("nul.tsv");
    test_write_file(p, "0\tab\0c\n", 7);
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:1: NUL byte in the text at column 5 (the byte tokenizer uses 0 as padding)", p));

    expect_err(test_path("good.tsv"), DT_FORMAT_AUTO, 8, 2, 200, DT_ERR_CONFIG,
               "model.vocab_size: 200 is too small for tsv data: the byte tokenizer needs >= 257 "
               "(256 bytes + <cls>)");
}

static void test_bad_paths(void) {
    const char *p = test_path("nothing*.bin");
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: no files match (hint: data.train_path and data.val_path take a file, a "
                   "directory or a glob such as \"data/*.bin\"; relative paths start from the "
                   "working directory)",
                   p));
    p = test_path("missing.bin");
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: no files match (hint: data.train_path and data.val_path take a file, a "
                   "directory or a glob such as \"data/*.bin\"; relative paths start from the "
                   "working directory)",
                   p));
    test_mkdir_p(test_path("emptydir"));
    test_write_file(test_path("emptydir/.hidden"), "x", 1);
    p = test_path("emptydir");
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: no files match (hint: the directory has no regular, non-hidden files)", p));

    /* format vs model.num_labels */
    p = test_path("good.tsv");
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: data is tsv (data.format auto: the name does not end in .bin or .bin.gz), "
                   "but model.num_labels is 0 and language modelling reads token shards (hint: set "
                   "model.num_labels to the number of classes to classify, or make a shard with "
                   "\"dtrain data tokenize\"; JSON lines of conversations or prompts and completions: "
                   "data.format chat or completion)",
                   p));
    p = test_path("good.bin");
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 50257, DT_ERR_DATA,
               MSG("%s: data is token shards (data.format auto: the name ends in .bin), but "
                   "model.num_labels is 2 and classification reads \"label<TAB>text\" lines (hint: "
                   "set model.num_labels: 0 for language modelling, or data.format: tsv)",
                   p));
    expect_err(p, DT_FORMAT_TOKENS, 8, 2, 50257, DT_ERR_DATA,
               MSG("%s: data is token shards (data.format: tokens), but model.num_labels is 2 and "
                   "classification reads \"label<TAB>text\" lines (hint: set model.num_labels: 0 "
                   "for language modelling, or data.format: tsv)",
                   p));
    /* an explicit format overrides the name: a .bin read as tsv */
    {
        dt_dataset *ds = (dt_dataset *)1;
        CHECK_INT_EQ(open_ds(&ds, p, DT_FORMAT_TSV, 8, 2, 257), DT_ERR_DATA);
        CHECK_STR_CONTAINS(dt_error_msg(), MSG("%s:1: label \"\\x88\\xd84\\x01\\x01\\x00", p));
    }
    /* non-printable label bytes are escaped, long labels cut at 32 bytes */
    p = test_path("weird.tsv");
    const char *weird = "\x01\"\\ab0123456789012345678901234567890123456789\ttext\n";
    test_write_file(p, weird, strlen(weird));
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA,
               MSG("%s:1: label \"\\x01\\x22\\x5cab012345678901234567890123456...\" is not an integer "
                   "(expected \"label<TAB>text\" with an integer label in [0, 2))",
                   p));

    /* mixed formats in one directory */
    test_mkdir_p(test_path("mixed"));
    test_write_file(test_path("mixed/a.tsv"), "0\tx\n", 4);
    uint32_t tok[16] = {0};
    write_shard(test_path("mixed/b.bin"), DT_SHARD_MAGIC_V1, 1, 16, tok, 16, 2, 0, 0);
    p = test_path("mixed");
    expect_err(p, DT_FORMAT_AUTO, 4, 0, 50257, DT_ERR_DATA,
               MSG("%s: mixed formats: %s/b.bin is a token shard (.bin) but %s/a.tsv is tsv (hint: "
                   "keep one format per path; data.format auto reads .bin/.bin.gz files as tokens "
                   "and anything else as tsv)",
                   p, p, p));

    /* unreadable files (bad input: exit 2, never retried): a dangling symlink matched by a
     * glob; a mode-000 file (not as root) */
    test_mkdir_p(test_path("io"));
    CHECK(symlink(test_path("io/nowhere"), test_path("io/dangling.bin")) == 0);
    p = test_path("io/*.bin");
    expect_err(p, DT_FORMAT_AUTO, 4, 0, 50257, DT_ERR_DATA,
               MSG("%s: cannot open: No such file or directory", test_path("io/dangling.bin")));
    if (geteuid() != 0) {
        p = test_path("noperm.bin");
        write_shard(p, DT_SHARD_MAGIC_V1, 1, 16, tok, 16, 2, 0, 0);
        CHECK(chmod(p, 0) == 0);
        expect_err(p, DT_FORMAT_AUTO, 4, 0, 50257, DT_ERR_DATA,
                   MSG("%s: cannot open: Permission denied", p));
    }

    /* bad settings */
    expect_err(test_path("good.bin"), DT_FORMAT_AUTO, 8, 1, 50257, DT_ERR_CONFIG,
               "model.num_labels: expected 0 (language modelling) or >= 2, got 1");
    expect_err(test_path("good.bin"), DT_FORMAT_AUTO, 0, 0, 50257, DT_ERR_CONFIG,
               "data.seq_len: expected an integer >= 1, got 0");
}

/* ---------------------------------------------------------------- good data */

static void check_lm(dt_dataset *ds, const uint32_t *want, size_t n_tok, int T) {
    CHECK_INT_EQ(dt_dataset_is_classification(ds), 0);
    CHECK_INT_EQ(dt_dataset_size(ds), (n_tok - 1) / (size_t)T);
    CHECK_INT_EQ(dt_dataset_num_truncated(ds), 0);
    int *x = malloc((size_t)T * sizeof *x), *y = malloc((size_t)T * sizeof *y);
    CHECK(x && y);
    for (size_t i = 0; i < dt_dataset_size(ds); i++) {
        dt_dataset_get(ds, i, x, y);
        for (int t = 0; t < T; t++) {
            CHECK_INT_EQ(x[t], want[i * (size_t)T + (size_t)t]);
            CHECK_INT_EQ(y[t], want[i * (size_t)T + (size_t)t + 1]);
        }
    }
    free(x);
    free(y);
}

static void test_round_trip(void) {
    enum { N = 1000, T = 16 };
    unsigned char text[N];
    uint32_t want[N];
    uint64_t s = 7;
    for (int i = 0; i < N; i++) {
        s = s * 6364136223846793005ULL + 1442695040888963407ULL;
        text[i] = (unsigned char)(i < 256 ? (uint64_t)i : (s >> 33)); /* every byte value, incl. 0 */
        want[i] = text[i];
    }
    test_write_file(test_path("text.txt"), text, N);
    size_t n_tok = 0;
    CHECK_INT_EQ(dt_data_tokenize("bytes", test_path("text.txt"), test_path("text.bin"), &n_tok), DT_OK);
    CHECK_INT_EQ(n_tok, N);

    /* the file is exactly an llm.c v1 shard */
    FILE *f = fopen(test_path("text.bin"), "rb");
    CHECK(f != NULL);
    unsigned char *raw = malloc(1024 + 2 * N + 1);
    CHECK_INT_EQ(fread(raw, 1, 1024 + 2 * N + 1, f), 1024 + 2 * N);
    fclose(f);
    CHECK_INT_EQ(raw[0] | raw[1] << 8 | raw[2] << 16 | raw[3] << 24, DT_SHARD_MAGIC_V1);
    CHECK_INT_EQ(raw[4], 1);
    CHECK_INT_EQ(raw[8] | raw[9] << 8, N);
    for (int i = 0; i < N; i++) CHECK_INT_EQ(raw[1024 + 2 * i] | raw[1025 + 2 * i] << 8, text[i]);
    free(raw);

    dt_dataset *ds = NULL;
    CHECK_INT_EQ(open_ds(&ds, test_path("text.bin"), DT_FORMAT_AUTO, T, 0, 256), DT_OK);
    CHECK_INT_EQ(dt_dataset_num_files(ds), 1);
    check_lm(ds, want, N, T);
    dt_dataset_free(ds);

    /* gz input to the tokenizer, and a .bin.gz shard */
    write_gz(test_path("text.txt.gz"), text, N);
    CHECK_INT_EQ(dt_data_tokenize("bytes", test_path("text.txt.gz"), test_path("text2.bin"), &n_tok), DT_OK);
    CHECK_INT_EQ(n_tok, N);
    write_shard(test_path("textgz.bin.gz"), DT_SHARD_MAGIC_V1, 1, N, want, N, 2, 0, 1);
    CHECK_INT_EQ(open_ds(&ds, test_path("textgz.bin.gz"), DT_FORMAT_AUTO, T, 0, 256), DT_OK);
    check_lm(ds, want, N, T);
    dt_dataset_free(ds);
    CHECK_INT_EQ(open_ds(&ds, test_path("text2.bin"), DT_FORMAT_AUTO, T, 0, 256), DT_OK);
    check_lm(ds, want, N, T);
    dt_dataset_free(ds);

    /* a version-7 (uint32) shard with tokens beyond uint16, and one whose tokens all fit */
    uint32_t wide[300];
    for (int i = 0; i < 300; i++) wide[i] = (uint32_t)(i * 331u % 100000u);
    write_shard(test_path("wide.bin"), DT_SHARD_MAGIC_V2, 7, 300, wide, 300, 4, 0, 0);
    CHECK_INT_EQ(open_ds(&ds, test_path("wide.bin"), DT_FORMAT_AUTO, 10, 0, 100000), DT_OK);
    check_lm(ds, wide, 300, 10);
    dt_dataset_free(ds);
    write_shard(test_path("narrow7.bin"), DT_SHARD_MAGIC_V2, 7, N, want, N, 4, 0, 0);
    CHECK_INT_EQ(open_ds(&ds, test_path("narrow7.bin"), DT_FORMAT_AUTO, T, 0, 256), DT_OK);
    check_lm(ds, want, N, T);
    dt_dataset_free(ds);

    /* a glob over 2 shards (a v1 and a v7) concatenates in sorted name order */
    test_mkdir_p(test_path("glob"));
    write_shard(test_path("glob/s_b.bin"), DT_SHARD_MAGIC_V2, 7, 300, wide, 300, 4, 0, 0);
    write_shard(test_path("glob/s_a.bin"), DT_SHARD_MAGIC_V1, 1, 500, want, 500, 2, 0, 0);
    test_write_file(test_path("glob/other.txt"), "not matched", 11);
    uint32_t cat[800];
    memcpy(cat, want, 500 * sizeof *cat);
    memcpy(cat + 500, wide, 300 * sizeof *cat);
    CHECK_INT_EQ(open_ds(&ds, test_path("glob/s_*.bin"), DT_FORMAT_AUTO, 12, 0, 100000), DT_OK);
    CHECK_INT_EQ(dt_dataset_num_files(ds), 2);
    check_lm(ds, cat, 800, 12);
    dt_dataset_free(ds);

    /* a directory: regular non-hidden files, sorted; hidden files and subdirectories skipped */
    test_mkdir_p(test_path("dir/sub"));
    write_shard(test_path("dir/2.bin"), DT_SHARD_MAGIC_V2, 7, 300, wide, 300, 4, 0, 0);
    write_shard(test_path("dir/1.bin.gz"), DT_SHARD_MAGIC_V1, 1, 500, want, 500, 2, 0, 1);
    test_write_file(test_path("dir/.junk.bin"), "junk", 4);
    CHECK_INT_EQ(open_ds(&ds, test_path("dir/"), DT_FORMAT_AUTO, 12, 0, 100000), DT_OK);
    CHECK_INT_EQ(dt_dataset_num_files(ds), 2);
    check_lm(ds, cat, 800, 12);
    dt_dataset_free(ds);

    /* dt_shard_write: round trip, a token >= 65536 refused, no temporary left behind */
    CHECK_INT_EQ(dt_shard_write(test_path("w.bin"), want, N), DT_OK);
    CHECK_INT_EQ(open_ds(&ds, test_path("w.bin"), DT_FORMAT_AUTO, T, 0, 256), DT_OK);
    check_lm(ds, want, N, T);
    dt_dataset_free(ds);
    char tmpname[1100];
    snprintf(tmpname, sizeof tmpname, "%s.tmp.%ld", test_path("w.bin"), (long)getpid());
    CHECK(access(tmpname, F_OK) != 0);
    uint32_t bad[3] = {1, 65536, 2};
    dt_error_clear();
    CHECK_INT_EQ(dt_shard_write(test_path("w2.bin"), bad, 3), DT_ERR_DATA);
    CHECK_STR_EQ(dt_error_msg(),
                 MSG("%s: token 65536 at index 1 does not fit a version-1 shard (uint16 tokens must "
                     "be < 65536)",
                     test_path("w2.bin")));
    CHECK(access(test_path("w2.bin"), F_OK) != 0);

    test_write_file(test_path("nothing.txt"), "", 0);
    dt_error_clear();
    CHECK_INT_EQ(dt_data_tokenize("bytes", test_path("nothing.txt"), test_path("nothing.bin"), &n_tok), DT_ERR_DATA);
    CHECK_STR_EQ(dt_error_msg(), MSG("%s: empty input (nothing to tokenize)", test_path("nothing.txt")));
    CHECK(access(test_path("nothing.bin"), F_OK) != 0);
}

static void check_row(const int *x, int T, const char *text, size_t n) {
    for (size_t t = 0; t < n; t++) CHECK_INT_EQ(x[t], (unsigned char)text[t]);
    CHECK_INT_EQ(x[n], DT_CLS_TOKEN);
    for (int t = (int)n + 1; t < T; t++) CHECK_INT_EQ(x[t], 0);
}

static void test_tsv(void) {
    enum { T = 8 };
    /* BOM, CRLF, a tab inside the text, an exact T-1 text, a long one, an empty text, byte 0xff,
     * exactly T bytes, no final newline */
    const char *tsv = "\xEF\xBB\xBF"
                      "1\tabc\r\n"
                      "0\t0123456789\n"
                      "2\tx\ty\n"
                      "1\t1234567\n"
                      "0\t\n"
                      "2\t\xff\xfe\n"
                      "1\t12345678";
    test_write_file(test_path("good.tsv"), tsv, strlen(tsv));
    write_gz(test_path("good.tsv.gz"), tsv, strlen(tsv));
    const char *paths[2] = {test_path("good.tsv"), test_path("good.tsv.gz")};
    for (int k = 0; k < 2; k++) {
        dt_dataset *ds = NULL;
        CHECK_INT_EQ(open_ds(&ds, paths[k], DT_FORMAT_AUTO, T, 3, 257), DT_OK);
        CHECK_INT_EQ(dt_dataset_is_classification(ds), 1);
        CHECK_INT_EQ(dt_dataset_size(ds), 7);
        CHECK_INT_EQ(dt_dataset_num_truncated(ds), 2);
        int x[T], y[T];
        dt_dataset_get(ds, 0, x, y);
        check_row(x, T, "abc", 3);
        CHECK_INT_EQ(y[0], 1);
        dt_dataset_get(ds, 1, x, y);
        check_row(x, T, "0123456", 7);
        CHECK_INT_EQ(y[0], 0);
        dt_dataset_get(ds, 2, x, y);
        check_row(x, T, "x\ty", 3);
        CHECK_INT_EQ(y[0], 2);
        dt_dataset_get(ds, 3, x, y);
        check_row(x, T, "1234567", 7);
        CHECK_INT_EQ(y[0], 1);
        dt_dataset_get(ds, 4, x, y);
        check_row(x, T, "", 0);
        CHECK_INT_EQ(y[0], 0);
        dt_dataset_get(ds, 5, x, y);
        check_row(x, T, "\xff\xfe", 2);
        CHECK_INT_EQ(x[0], 255);
        CHECK_INT_EQ(y[0], 2);
        dt_dataset_get(ds, 6, x, y); /* exactly T text bytes: cut to T-1 */
        check_row(x, T, "1234567", 7);
        CHECK_INT_EQ(y[0], 1);
        dt_dataset_free(ds);
    }

    /* a large file, across two files of a directory: linear time, labels kept in order */
    test_mkdir_p(test_path("tsvdir"));
    enum { LINES = 100000 };
    char *big = malloc((size_t)LINES * 24);
    CHECK(big != NULL);
    for (int part = 0; part < 2; part++) {
        size_t len = 0;
        for (int i = 0; i < LINES; i++)
            len += (size_t)sprintf(big + len, "%d\texample %d/%d\n", (i + part) % 5, part, i);
        test_write_file(test_path(part ? "tsvdir/b.txt" : "tsvdir/a.txt"), big, len);
    }
    free(big);
    dt_dataset *ds = NULL;
    CHECK_INT_EQ(open_ds(&ds, test_path("tsvdir"), DT_FORMAT_AUTO, 12, 5, 257), DT_OK);
    CHECK_INT_EQ(dt_dataset_size(ds), 2 * LINES);
    CHECK_INT_EQ(dt_dataset_num_files(ds), 2);
    int x[12], y[1];
    for (size_t i = 0; i < 2 * LINES; i += 997) {
        int part = i >= LINES, line = (int)(i % LINES);
        char want[32];
        snprintf(want, sizeof want, "example %d/%d", part, line);
        dt_dataset_get(ds, i, x, y);
        CHECK_INT_EQ(y[0], (line + part) % 5);
        check_row(x, 12, want, strlen(want) < 11 ? strlen(want) : 11);
    }
    dt_dataset_free(ds);
}

/* ---------------------------------------------------------------- sampler */

static dt_sampler *sampler(size_t n, uint64_t seed, int shuffle, int rank, int world, int b, int accum) {
    dt_sampler_cfg cfg = {.num_samples = n, .seed = seed, .shuffle = shuffle, .rank = rank,
                          .world = world, .batch_per_worker = b, .accum = accum};
    dt_sampler *s = NULL;
    CHECK_INT_EQ(dt_sampler_init(&s, &cfg), DT_OK);
    return s;
}

/* The concatenation of every (micro, rank) slice of step `step`: G indices into out. */
static void global_batch(size_t n, uint64_t seed, int shuffle, int world, int b, int accum,
                         long epoch, size_t step, size_t *out) {
    size_t k = 0;
    for (int a = 0; a < accum; a++) {
        for (int r = 0; r < world; r++) {
            dt_sampler *s = sampler(n, seed, shuffle, r, world, b, accum);
            dt_sampler_batch(s, epoch, step, a, out + k);
            k += (size_t)b;
            dt_sampler_free(s);
        }
    }
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return x < y ? -1 : x > y;
}

static void test_sampler(void) {
    enum { N = 100 };
    size_t idx[N];

    /* no shuffle: identity, incomplete last batch dropped */
    dt_sampler *s = sampler(N, 1, 0, 1, 2, 4, 2);
    CHECK_INT_EQ(dt_sampler_steps_per_epoch(s), N / 16);
    for (size_t j = 0; j < dt_sampler_steps_per_epoch(s); j++)
        for (int a = 0; a < 2; a++) {
            dt_sampler_batch(s, 3, j, a, idx);
            for (int k = 0; k < 4; k++) CHECK_INT_EQ(idx[k], j * 16 + (size_t)a * 8 + 4 + (size_t)k);
        }
    dt_sampler_free(s);

    /* shuffle: each epoch a permutation; epochs differ; seeds differ; revisiting is stable */
    size_t e0[N], e1[N], e0b[N], other[N];
    s = sampler(N, 42, 1, 0, 1, 10, 1);
    CHECK_INT_EQ(dt_sampler_steps_per_epoch(s), 10);
    for (size_t j = 0; j < 10; j++) dt_sampler_batch(s, 0, j, 0, e0 + j * 10);
    for (size_t j = 0; j < 10; j++) dt_sampler_batch(s, 1, j, 0, e1 + j * 10);
    for (size_t j = 0; j < 10; j++) dt_sampler_batch(s, 0, j, 0, e0b + j * 10);
    dt_sampler_free(s);
    s = sampler(N, 43, 1, 0, 1, 10, 1);
    for (size_t j = 0; j < 10; j++) dt_sampler_batch(s, 0, j, 0, other + j * 10);
    dt_sampler_free(s);
    CHECK(memcmp(e0, e0b, sizeof e0) == 0);
    CHECK(memcmp(e0, e1, sizeof e0) != 0);
    CHECK(memcmp(e0, other, sizeof e0) != 0);
    size_t ident = 0;
    for (size_t i = 0; i < N; i++) ident += e0[i] == i;
    CHECK(ident < N / 2);
    size_t *eps[2] = {e0, e1};
    for (int e = 0; e < 2; e++) {
        int seen[N] = {0};
        for (size_t i = 0; i < N; i++) {
            CHECK(eps[e][i] < N);
            seen[eps[e][i]]++;
        }
        for (size_t i = 0; i < N; i++) CHECK_INT_EQ(seen[i], 1);
    }

    /* the global batch is every rank's micro-batches: what each rank counts for the loss's mean */
    {
        size_t all[24], mine[3];
        for (int r = 0; r < 4; r++) {
            dt_sampler *g = sampler(N, 7, 1, r, 4, 3, 2);
            dt_sampler_global_at(g, 2, 48, all);
            for (int a = 0; a < 2; a++) {
                dt_sampler_batch_at(g, 2, 48, a, mine);
                for (int k = 0; k < 3; k++) CHECK_INT_EQ(mine[k], all[(a * 4 + r) * 3 + k]);
            }
            dt_sampler_free(g);
        }
    }

    /* the key property: the same global batches for any (world, b, accum) with the same G */
    const int cfgs[4][3] = {{1, 8, 1}, {2, 4, 1}, {4, 2, 1}, {2, 2, 2}};
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        for (long epoch = 0; epoch < 3; epoch++) {
            s = sampler(N, 1234, shuffle, 0, 1, 8, 1);
            size_t steps = dt_sampler_steps_per_epoch(s);
            CHECK_INT_EQ(steps, 12);
            int seen[N] = {0};
            for (size_t j = 0; j < steps; j++) {
                size_t ref[8];
                dt_sampler_batch(s, epoch, j, 0, ref);
                for (int k = 0; k < 8; k++) seen[ref[k]]++;
                for (int c = 1; c < 4; c++) {
                    size_t got[8];
                    dt_sampler *t = sampler(N, 1234, shuffle, 0, cfgs[c][0], cfgs[c][1], cfgs[c][2]);
                    CHECK_INT_EQ(dt_sampler_steps_per_epoch(t), steps);
                    dt_sampler_free(t);
                    global_batch(N, 1234, shuffle, cfgs[c][0], cfgs[c][1], cfgs[c][2], epoch, j, got);
                    size_t a[8], b[8];
                    memcpy(a, ref, sizeof a);
                    memcpy(b, got, sizeof b);
                    qsort(a, 8, sizeof *a, cmp_size);
                    qsort(b, 8, sizeof *b, cmp_size);
                    CHECK(memcmp(a, b, sizeof a) == 0);     /* the same set */
                    CHECK(memcmp(ref, got, sizeof ref) == 0); /* and the same order */
                }
            }
            for (size_t i = 0; i < N; i++) CHECK(seen[i] <= 1);
            dt_sampler_free(s);
        }
    }

    /* elastic resume: 3 steps at 2 workers x 3, then the rest of the epoch at 4 workers x 2
     * from the saved cursor: every sample of the epoch's order at most once, and exactly the
     * prefix that whole global batches cover */
    for (int shuffle = 0; shuffle < 2; shuffle++) {
        int seen[N] = {0};
        size_t cursor = 0, idx[8];
        dt_sampler *r0 = sampler(N, 77, shuffle, 0, 2, 3, 1), *r1 = sampler(N, 77, shuffle, 1, 2, 3, 1);
        CHECK_INT_EQ(dt_sampler_global_batch(r0), 6);
        for (int j = 0; j < 3; j++, cursor += 6) {
            dt_sampler_batch_at(r0, 2, cursor, 0, idx);
            dt_sampler_batch_at(r1, 2, cursor, 0, idx + 3);
            for (int k = 0; k < 6; k++) seen[idx[k]]++;
        }
        dt_sampler_free(r0);
        dt_sampler_free(r1);
        dt_sampler *q[4];
        for (int r = 0; r < 4; r++) q[r] = sampler(N, 77, shuffle, r, 4, 2, 1);
        size_t left = dt_sampler_steps_from(q[0], cursor);
        CHECK_INT_EQ(left, (N - 18) / 8);
        for (size_t j = 0; j < left; j++, cursor += 8)
            for (int r = 0; r < 4; r++) {
                dt_sampler_batch_at(q[r], 2, cursor, 0, idx);
                for (int k = 0; k < 2; k++) seen[idx[k]]++;
            }
        CHECK_INT_EQ(dt_sampler_steps_from(q[0], cursor), 0);
        CHECK_INT_EQ(dt_sampler_steps_from(q[0], N + 5), 0);
        size_t covered = 0;
        for (size_t i = 0; i < N; i++) {
            CHECK(seen[i] <= 1);
            covered += (size_t)seen[i];
        }
        CHECK_INT_EQ(covered, cursor);
        /* the covered samples are the first `cursor` of the epoch's order */
        dt_sampler *one = sampler(N, 77, shuffle, 0, 1, 1, 1);
        for (size_t j = 0; j < cursor; j++) {
            dt_sampler_batch(one, 2, j, 0, idx);
            CHECK_INT_EQ(seen[idx[0]], 1);
        }
        dt_sampler_free(one);
        for (int r = 0; r < 4; r++) dt_sampler_free(q[r]);
    }

    /* empty dataset, bad settings */
    s = sampler(0, 1, 1, 0, 1, 4, 1);
    CHECK_INT_EQ(dt_sampler_steps_per_epoch(s), 0);
    dt_sampler_free(s);
    dt_sampler_free(NULL);
    dt_sampler_cfg bad = {.num_samples = 10, .rank = 2, .world = 2, .batch_per_worker = 1, .accum = 1};
    s = (dt_sampler *)1;
    CHECK_INT_EQ(dt_sampler_init(&s, &bad), DT_ERR_INTERNAL);
    CHECK(s == NULL);
}

static void test_eval_slices(void) {
    const int cases[][3] = {{0, 2, 4}, {1, 1, 1}, {3, 4, 2}, {7, 4, 2},  {8, 4, 2},
                            {9, 4, 2}, {10, 3, 2}, {16, 2, 4}, {17, 2, 4}, {100, 3, 7}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        size_t n = (size_t)cases[c][0];
        int world = cases[c][1], b = cases[c][2];
        size_t E = (size_t)world * (size_t)b;
        size_t nb = dt_eval_num_batches(n, world, b);
        CHECK_INT_EQ(nb, (n + E - 1) / E);
        int *seen = calloc(n + 1, sizeof *seen);
        CHECK(seen != NULL);
        size_t next = 0;
        for (size_t j = 0; j < nb; j++) {
            for (int r = 0; r < world; r++) {
                size_t start = 12345;
                int count = -1;
                dt_eval_slice(n, j, r, world, b, &start, &count);
                CHECK(count >= 0 && count <= b);
                if (count > 0) CHECK_INT_EQ(start, next); /* consecutive, in order */
                for (int k = 0; k < count; k++) {
                    CHECK(start + (size_t)k < n);
                    seen[start + (size_t)k]++;
                }
                next += (size_t)count;
            }
        }
        for (size_t i = 0; i < n; i++) CHECK_INT_EQ(seen[i], 1);
        free(seen);
    }
    CHECK_INT_EQ(dt_eval_num_batches(0, 2, 4), 0);
}

/* ---------------------------------------------------------------- hostile files */

/* A header that claims far more tokens than the file holds is refused, naming the file and
 * both counts, before the claimed size is allocated: run under a 256 MiB address-space limit
 * (the claim is 4 or 8 GiB), in a child so the limit stays there. */
static void test_huge_header(void) {
    uint32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (uint32_t)i;
    const char *plain = test_path("huge.bin"), *wide = test_path("huge7.bin"), *gz = test_path("huge.bin.gz");
    write_shard(plain, DT_SHARD_MAGIC_V1, 1, INT32_MAX, tok, 16, 2, 0, 0);
    write_shard(wide, DT_SHARD_MAGIC_V2, 7, INT32_MAX, tok, 16, 4, 0, 0);
    write_shard(gz, DT_SHARD_MAGIC_V1, 1, INT32_MAX, tok, 16, 2, 0, 1);
    fflush(NULL);
    pid_t pid = fork();
    CHECK(pid >= 0);
    if (pid == 0) {
        struct rlimit rl = {256u << 20, 256u << 20};
        CHECK(setrlimit(RLIMIT_AS, &rl) == 0);
        expect_err(plain, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
                   MSG("%s: offset 1056: truncated: header says 2147483647 tokens (4294967294 bytes), file "
                       "has only 32 bytes of tokens", plain));
        expect_err(wide, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
                   MSG("%s: offset 1088: truncated: header says 2147483647 tokens (8589934588 bytes), file "
                       "has only 64 bytes of tokens", wide));
        expect_err(gz, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA, /* the size shows only as it is read */
                   MSG("%s: offset 1056: truncated: header says 2147483647 tokens (4294967294 bytes), file "
                       "has only 32 bytes of tokens", gz));
        fflush(NULL);
        _exit(0);
    }
    int wst;
    CHECK(waitpid(pid, &wst, 0) == pid);
    CHECK(WIFEXITED(wst));
    CHECK_INT_EQ(WEXITSTATUS(wst), 0);
    /* a .gz shard that really holds its tokens still reads, grown as it is decompressed */
    size_t n = 400000; /* 1.6 MB of tokens: more than one read chunk */
    uint32_t *many = malloc(n * sizeof *many);
    CHECK(many != NULL);
    for (size_t i = 0; i < n; i++) many[i] = (uint32_t)(i * 7 % 70000);
    write_shard(gz, DT_SHARD_MAGIC_V2, 7, (int32_t)n, many, n, 4, 0, 1);
    dt_dataset *ds = NULL;
    CHECK_OK(open_ds(&ds, gz, DT_FORMAT_AUTO, 9, 0, 70001));
    check_lm(ds, many, n, 9);
    dt_dataset_free(ds);
    free(many);
}

/* A FIFO or a device named as data is refused at once (it used to block in open()). */
static void test_not_regular(void) {
    const char *p = test_path("fifo.bin");
    CHECK(mkfifo(p, 0644) == 0);
    alarm(20); /* a hang fails the test */
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA, MSG("%s: not a regular file (a FIFO)", p));
    p = test_path("fifo.tsv");
    CHECK(mkfifo(p, 0644) == 0);
    expect_err(p, DT_FORMAT_AUTO, 8, 2, 257, DT_ERR_DATA, MSG("%s: not a regular file (a FIFO)", p));
    p = test_path("fifo*.bin"); /* matched by a glob */
    expect_err(p, DT_FORMAT_AUTO, 8, 0, 50257, DT_ERR_DATA,
               MSG("%s: not a regular file (a FIFO)", test_path("fifo.bin")));
    expect_err("/dev/zero", DT_FORMAT_TOKENS, 8, 0, 50257, DT_ERR_DATA, "/dev/zero: not a regular file (a character device)");
    alarm(0);
    /* dtrain data tokenize reads its input the same way */
    CHECK_INT_EQ(dt_data_tokenize("bytes", "/dev/zero", test_path("zero-tok.bin"), NULL), DT_ERR_DATA);
    CHECK_STR_EQ(dt_error_msg(), "/dev/zero: not a regular file (a character device)");
}

/* The shard writer's temporary name (PATH.tmp.PID) holding a planted link: the link is
 * neither followed (its target keeps its bytes) nor removed; the shard is still written. */
static void test_planted_temp(void) {
    test_mkdir_p(test_path("planted"));
    const char *victim = test_path("victim.txt"), *out = test_path("planted/s.bin");
    char tmp[1300];
    test_plant_temp_link(out, victim, tmp, sizeof tmp);
    uint32_t tok[16];
    for (int i = 0; i < 16; i++) tok[i] = (uint32_t)i;
    CHECK_OK(dt_shard_write(out, tok, 16));
    test_planted_kept(victim, tmp);
    struct stat sb;
    CHECK(lstat(out, &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 1024 + 32);
}

/* A byte-level BPE tokenizer.json at path: the 256 byte characters (ids 0..255), "qx" made of q and x
 * by a merge with id `qx_id`, and <|endoftext|> (the next id after the vocabulary's) unless !eot. */
static void write_qx_tokenizer(const char *path, int qx_id, int eot) {
    json_t *vocab = json_object();
    char ch[3];
    for (unsigned b = 0; b < 256; b++) {
        dt_tokenizer_byte_string(b, ch);
        json_object_set_new(vocab, ch, json_integer(b));
    }
    json_object_set_new(vocab, "qx", json_integer(qx_id));
    json_t *t = json_pack("{s:s, s:[], s:n, s:{s:s, s:b, s:b, s:b}, s:{s:s, s:o, s:[[s,s]]}}", "version", "1.0",
                          "added_tokens", "normalizer", "pre_tokenizer", "type", "ByteLevel", "add_prefix_space", 0,
                          "trim_offsets", 1, "use_regex", 1, "model", "type", "BPE", "vocab", vocab, "merges", "q", "x");
    CHECK(t != NULL);
    if (eot)
        json_array_append_new(json_object_get(t, "added_tokens"),
                              json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", 0, "content", "<|endoftext|>",
                                        "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    CHECK(json_dump_file(t, path, 0) == 0);
    json_decref(t);
}

/* The one check of a tokenizer against a model (dt_tokenizer_check_model: every command runs it):
 * ids beyond model.vocab_size, a classifier's ids past 16 bits or without an end-of-text token
 * to pad with are refused naming data.tokenizer and model.vocab_size; and a classification row
 * never holds an id cut to 16 bits (65600 used to become 64, "qx" read as "a"). */
static void test_tokenizer_fit(void) {
    const char *big = test_path("qx-big.json"), *noeot = test_path("qx-noeot.json");
    write_qx_tokenizer(big, 65600, 1);
    write_qx_tokenizer(noeot, 300, 0);
    dt_tokenizer *tb, *tn;
    CHECK_OK(dt_tokenizer_open(big, &tb));
    CHECK_OK(dt_tokenizer_open(noeot, &tn));
    char want[2048];
    CHECK_INT_EQ(dt_tokenizer_check_model(tb, 1025, 2), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "model.vocab_size: 1025 is smaller than the 65601 ids of data.tokenizer %s (hint: "
             "model.vocab_size: 65601)", big);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(dt_tokenizer_check_model(tb, 65601, 0), DT_OK); /* a language model's shards hold uint32 ids */
    CHECK_INT_EQ(dt_tokenizer_check_model(tb, 65601, 2), DT_ERR_CONFIG);
    snprintf(want, sizeof want, "data.tokenizer %s: 65601 ids; classification texts hold ids below 65536", big);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(dt_tokenizer_check_model(tn, 1025, 2), DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "has no end-of-text token to pad classification texts with");
    CHECK_INT_EQ(dt_tokenizer_check_model(tn, 1025, 0), DT_OK);
    CHECK_INT_EQ(dt_tokenizer_check_model(NULL, 256, 2), DT_ERR_CONFIG); /* bytes: 256 + <cls> */
    CHECK_STR_CONTAINS(dt_error_msg(), "model.vocab_size: 256 is too small for tsv data");
    CHECK_INT_EQ(dt_tokenizer_check_model(NULL, 257, 2), DT_OK);
    CHECK_INT_EQ(dt_tokenizer_check_model(NULL, 100, 0), DT_OK); /* a language model's shards: checked as read */
    /* the row itself: an id past 16 bits, and no end-of-text token, are errors, never cut */
    uint16_t row[8];
    uint32_t *ids = NULL;
    size_t cap = 0;
    int cut;
    CHECK_INT_EQ(dt_data_text_row(tb, "qx", 2, 8, row, &cut, &ids, &cap), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "token 65600 does not fit a classification row");
    CHECK_OK(dt_data_text_row(tb, "a", 1, 8, row, &cut, &ids, &cap));
    CHECK_INT_EQ(row[0], 97);
    CHECK_INT_EQ(dt_data_text_row(tn, "a", 1, 8, row, &cut, &ids, &cap), DT_ERR_DATA);
    CHECK_STR_CONTAINS(dt_error_msg(), "no end-of-text token to pad the text with");
    free(ids);
    dt_tokenizer_free(tb);
    dt_tokenizer_free(tn);
}

/* dt_file_check_output: an output that is its input (by any name) or a directory holding it
 * is refused naming both; another file, or a path not there yet, is not. */
static void test_own_output(void) {
    const char *in = test_path("own-in.txt"), *link = test_path("own-link.txt"), *other = test_path("own-other.txt");
    test_write_file(in, "text\n", 5);
    CHECK(symlink(in, link) == 0);
    char want[2048];
    CHECK_INT_EQ(dt_file_check_output("--input", in, "--out", in), DT_ERR_USAGE);
    snprintf(want, sizeof want, "--out %s and --input %s are the same file: writing the output would destroy the input "
             "(hint: write the output to another path)", in, in);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(dt_file_check_output("IN", in, "OUT", link), DT_ERR_USAGE);
    CHECK_STR_CONTAINS(dt_error_msg(), "are the same file");
    CHECK_INT_EQ(dt_file_check_output("--input", in, "--out", other), DT_OK);
    test_write_file(other, "x", 1);
    CHECK_INT_EQ(dt_file_check_output("--input", in, "--out", other), DT_OK);
    CHECK_INT_EQ(dt_file_check_output("--checkpoint", in, "--out", test_dir()), DT_ERR_USAGE);
    snprintf(want, sizeof want, "--out %s holds --checkpoint %s, and the output replaces the directory whole: "
             "writing it would destroy the input (hint: write the output to another directory)", test_dir(), in);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(dt_file_check_output("--checkpoint", test_dir(), "--out", test_dir()), DT_ERR_USAGE);
    CHECK_STR_CONTAINS(dt_error_msg(), "are the same directory");
    test_mkdir_p(test_path("own-sub"));
    CHECK_INT_EQ(dt_file_check_output("--checkpoint", test_dir(), "--out", test_path("own-sub")), DT_OK);
    /* data tokenize IN IN: refused, IN untouched */
    CHECK_INT_EQ(dt_data_tokenize("bytes", in, in, NULL), DT_ERR_USAGE);
    CHECK_STR_CONTAINS(dt_error_msg(), "are the same file");
    CHECK_INT_EQ(dt_data_detokenize("bytes", in, link, NULL), DT_ERR_USAGE);
    char got[64];
    test_slurp(in, got, sizeof got);
    CHECK_STR_EQ(got, "text\n");
}

/* dt_file_sha256 against FIPS 180-2's vectors, across block and read boundaries. */
static void test_sha256(void) {
    static const struct {
        const char *text;
        long repeat;
        const char *hex;
    } cases[] = {
        {"", 1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"},
        {"abc", 1, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"},
        {"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq", 1,
         "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"},
        {"a", 1000000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"},
    };
    const char *path = test_path("sha.txt");
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        FILE *f = fopen(path, "wb");
        CHECK(f != NULL);
        for (long k = 0; k < cases[i].repeat; k++) fputs(cases[i].text, f);
        CHECK(fclose(f) == 0);
        char hex[65];
        CHECK_OK(dt_file_sha256(path, DT_ERR_DATA, hex));
        CHECK_STR_EQ(hex, cases[i].hex);
    }
    char hex[65];
    CHECK_INT_EQ(dt_file_sha256(test_path("no-such-file"), DT_ERR_CONFIG, hex), DT_ERR_CONFIG);
    CHECK_STR_CONTAINS(dt_error_msg(), "no-such-file: cannot open: ");
}

int main(void) {
    test_dir_init("data");
    test_tsv(); /* writes good.tsv, used by the path tests */
    uint32_t tok[64];
    for (int i = 0; i < 64; i++) tok[i] = (uint32_t)i;
    write_shard(test_path("good.bin"), DT_SHARD_MAGIC_V1, 1, 64, tok, 64, 2, 0, 0);
    test_bad_shards();
    test_bad_tsv();
    test_bad_paths();
    test_round_trip();
    test_huge_header();
    test_not_regular();
    test_planted_temp();
    test_tokenizer_fit();
    test_own_output();
    test_sha256();
    test_sampler();
    test_eval_slices();
    dt_dataset_free(NULL);
    test_dir_remove(); /* kept when a check fails */
    TEST_PASS("test_data");
}
