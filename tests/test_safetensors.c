/* test_safetensors.c — safetensors read/write: round trip, files laid out byte by byte as the
 * reference Python library writes them (F16/BF16 conversion), every malformed-header message,
 * short reads, and atomic writes (that never follow a link planted at the temporary name). When python3 with safetensors and numpy is installed the
 * files are also cross-checked against the reference implementation; otherwise that part is
 * skipped (the rest never needs Python). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "testutil.h"
#include "dtrain/safetensors.h"


static unsigned char *read_bytes(const char *path, size_t *len) {
    FILE *fp = fopen(path, "rb");
    CHECK(fp != NULL);
    CHECK(fseek(fp, 0, SEEK_END) == 0);
    long n = ftell(fp);
    CHECK(n >= 0);
    rewind(fp);
    unsigned char *b = malloc((size_t)n + 1);
    CHECK(b != NULL);
    CHECK(fread(b, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    *len = (size_t)n;
    return b;
}

/* A safetensors file: 8-byte LE `hlen`, the header text padded with spaces to hlen, data. */
static void write_st_raw(const char *path, const char *header, uint64_t hlen, const void *data,
                         size_t data_len) {
    size_t jl = strlen(header);
    size_t body = jl > hlen ? jl : (size_t)hlen;
    if (hlen > 1000000) body = jl; /* lying length prefix: write only the text */
    unsigned char *b = calloc(1, 8 + body + data_len);
    CHECK(b != NULL);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(hlen >> (8 * i));
    memcpy(b + 8, header, jl);
    memset(b + 8 + jl, ' ', body - jl);
    if (data_len) memcpy(b + 8 + body, data, data_len);
    test_write_file(path, b, 8 + body + data_len);
    free(b);
}

/* As the reference writer does: header padded to a multiple of 8. */
static void write_st(const char *path, const char *header, const void *data, size_t data_len) {
    write_st_raw(path, header, (strlen(header) + 7) / 8 * 8, data, data_len);
}

static uint32_t fbits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float bitsf(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* Counts the entries of test_dir() whose name contains ".tmp." (leftover temp files). */
static int count_temp_files(const char *dir) {
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL)
        if (strstr(e->d_name, ".tmp.")) n++;
    closedir(d);
    return n;
}

/* Opening `path` must fail with `st` and exactly "<path>: <what>". */
static void expect_open_error(const char *path, dt_status st, const char *what) {
    char want[2048];
    snprintf(want, sizeof want, "%s: %s", path, what);
    dt_st_file *f = (dt_st_file *)test_dir(); /* any non-NULL value: must be reset to NULL */
    dt_error_clear();
    CHECK_INT_EQ(dt_st_open(&f, path), st);
    CHECK(f == NULL);
    CHECK_STR_EQ(dt_error_msg(), want);
}

static void expect_bad_header(const char *header, size_t data_len, const char *what) {
    static int k;
    char name[64];
    snprintf(name, sizeof name, "bad%d.safetensors", k++);
    const char *path = test_path(name);
    unsigned char zeros[64] = {0};
    CHECK(data_len <= sizeof zeros);
    write_st(path, header, zeros, data_len);
    expect_open_error(path, DT_ERR_DATA, what);
}

/* ---- write -> open -> read ---- */

static void test_round_trip(void) {
    float wte[12], bias[5], scale = 3.5f;
    for (int i = 0; i < 12; i++) wte[i] = (float)i * 0.25f - 1.0f;
    wte[1] = -0.0f;
    wte[2] = bitsf(0x00000001u);  /* smallest float subnormal */
    wte[3] = bitsf(0x7f7fffffu);  /* FLT_MAX */
    wte[4] = bitsf(0xff800000u);  /* -inf */
    wte[5] = bitsf(0x7fc12345u);  /* nan with a payload */
    for (int i = 0; i < 5; i++) bias[i] = 1.0f / (float)(i + 3);
    dt_st_entry e[4] = {
        {.name = "wte.weight", .ndim = 2, .shape = {4, 3}, .data = wte},
        {.name = "ln_f.bias", .ndim = 1, .shape = {5}, .data = bias},
        {.name = "scale", .ndim = 0, .data = &scale},
        {.name = "empty", .ndim = 1, .shape = {0}, .data = NULL},
    };
    const char *mk[] = {"format", "dtrain.step"}, *mv[] = {"pt", "42"};
    const char *path = test_path("rt.safetensors");
    dt_error_clear();
    CHECK_INT_EQ(dt_st_write(path, e, 4, mk, mv, 2), DT_OK);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);

    /* the bytes on disk */
    size_t len;
    unsigned char *b = read_bytes(path, &len);
    CHECK(len >= 8);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | b[i];
    CHECK_INT_EQ(hlen % 8, 0);
    CHECK_INT_EQ(len, 8 + hlen + 72);
    const char *want =
        "{\"__metadata__\":{\"format\":\"pt\",\"dtrain.step\":\"42\"},"
        "\"wte.weight\":{\"dtype\":\"F32\",\"shape\":[4,3],\"data_offsets\":[0,48]},"
        "\"ln_f.bias\":{\"dtype\":\"F32\",\"shape\":[5],\"data_offsets\":[48,68]},"
        "\"scale\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[68,72]},"
        "\"empty\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[72,72]}}";
    size_t wl = strlen(want);
    CHECK(hlen >= wl && hlen - wl < 8);
    char *hdr = calloc(1, hlen + 1);
    CHECK(hdr != NULL);
    memcpy(hdr, b + 8, hlen);
    for (size_t i = wl; i < hlen; i++) CHECK_INT_EQ(hdr[i], ' ');
    hdr[wl] = '\0';
    CHECK_STR_EQ(hdr, want);
    /* valid JSON; offsets contiguous in order and covering the data exactly */
    json_error_t jerr;
    json_t *root = json_loadb((const char *)b + 8, hlen, JSON_REJECT_DUPLICATES, &jerr);
    CHECK(root != NULL && json_is_object(root));
    const char *key;
    json_t *val;
    json_int_t prev_end = 0;
    int first = 1;
    json_object_foreach(root, key, val) {
        if (first) CHECK_STR_EQ(key, "__metadata__");
        first = 0;
        if (strcmp(key, "__metadata__") == 0) continue;
        json_t *off = json_object_get(val, "data_offsets");
        CHECK_INT_EQ(json_integer_value(json_array_get(off, 0)), prev_end);
        prev_end = json_integer_value(json_array_get(off, 1));
    }
    CHECK_INT_EQ(prev_end, (json_int_t)(len - 8 - hlen));
    json_decref(root);
    CHECK(memcmp(b + 8 + hlen, wte, 48) == 0);
    CHECK(memcmp(b + 8 + hlen + 48, bias, 20) == 0);
    CHECK(memcmp(b + 8 + hlen + 68, &scale, 4) == 0);
    free(hdr);
    free(b);

    /* open and read back */
    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, path), DT_OK);
    CHECK_INT_EQ(dt_st_count(f), 4);
    CHECK_STR_EQ(dt_st_metadata(f, "format"), "pt");
    CHECK_STR_EQ(dt_st_metadata(f, "dtrain.step"), "42");
    CHECK(dt_st_metadata(f, "nope") == NULL);
    CHECK(dt_st_find(f, "nope") == NULL);
    CHECK(dt_st_find(f, "__metadata__") == NULL);
    CHECK(dt_st_tensor_at(f, 4) == NULL);
    CHECK(dt_st_tensor_at(f, -1) == NULL);
    size_t want_numel[4] = {12, 5, 1, 0}, want_off[4] = {0, 48, 68, 72};
    for (int i = 0; i < 4; i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        CHECK(t != NULL);
        CHECK_STR_EQ(t->name, e[i].name);
        CHECK(dt_st_find(f, e[i].name) == t);
        CHECK_INT_EQ(t->dtype, DT_ST_F32);
        CHECK_STR_EQ(t->dtype_name, "F32");
        CHECK_INT_EQ(t->ndim, e[i].ndim);
        for (int d = 0; d < t->ndim; d++) CHECK_INT_EQ(t->shape[d], e[i].shape[d]);
        CHECK_INT_EQ(t->numel, want_numel[i]);
        CHECK_INT_EQ(t->offset, want_off[i]);
        CHECK_INT_EQ(t->nbytes, want_numel[i] * 4);
    }
    float got[12];
    memset(got, 0xAB, sizeof got);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "wte.weight"), got), DT_OK);
    CHECK(memcmp(got, wte, sizeof wte) == 0);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "ln_f.bias"), got), DT_OK);
    CHECK(memcmp(got, bias, sizeof bias) == 0);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "scale"), got), DT_OK);
    CHECK_INT_EQ(fbits(got[0]), fbits(3.5f));
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "empty"), NULL), DT_OK);
    dt_st_close(f);
    dt_st_close(NULL);

    /* no metadata: no __metadata__ key; 54 bytes of JSON padded to 56 */
    float x = 7.0f;
    dt_st_entry one = {.name = "x", .ndim = 1, .shape = {1}, .data = &x};
    const char *p1 = test_path("nometa.safetensors");
    CHECK_INT_EQ(dt_st_write(p1, &one, 1, NULL, NULL, 0), DT_OK);
    b = read_bytes(p1, &len);
    const char *want1 = "{\"x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}  ";
    CHECK_INT_EQ(len, 8 + 56 + 4);
    CHECK_INT_EQ(b[0], 56);
    CHECK(memcmp(b + 8, want1, 56) == 0);
    free(b);
    CHECK_INT_EQ(dt_st_open(&f, p1), DT_OK);
    CHECK(dt_st_metadata(f, "format") == NULL);
    CHECK_INT_EQ(dt_st_count(f), 1);
    dt_st_close(f);
}

/* ---- files as the reference library lays them out ---- */

static void test_reference_layout(void) {
    /* save_file({"h": float16 (12,), "bf": bfloat16 (2, 3)}, metadata={"format": "pt"}):
     * sorted by dtype (BF16 before F16) then name, compact JSON, space padding. */
    static const uint16_t bf[6] = {0x3F80, 0xC049, 0x0001, 0x7F80, 0xFF80, 0x7FC1};
    static const uint32_t bf_want[6] = {0x3F800000u, 0xC0490000u, 0x00010000u,
                                        0x7F800000u, 0xFF800000u, 0x7FC10000u};
    static const uint16_t h[12] = {0x0000, 0x8000, 0x3C00, 0xC000, 0x3555, 0x7BFF,
                                   0x0400, 0x0001, 0x03FF, 0x7C00, 0xFC00, 0xFE01};
    static const uint32_t h_want[12] = {
        0x00000000u, /* +0 */
        0x80000000u, /* -0 */
        0x3F800000u, /* 1 */
        0xC0000000u, /* -2 */
        0x3EAAA000u, /* 0.333251953125 */
        0x477FE000u, /* 65504, largest half */
        0x38800000u, /* 2^-14, smallest normal half */
        0x33800000u, /* 2^-24, smallest subnormal half */
        0x387FC000u, /* 1023 * 2^-24, largest subnormal half */
        0x7F800000u, /* inf */
        0xFF800000u, /* -inf */
        0xFFC02000u, /* -nan, payload kept */
    };
    /* independent spot checks of the hex constants above */
    CHECK_INT_EQ(h_want[4], fbits(0x1.554p-2f));
    CHECK_INT_EQ(h_want[5], fbits(65504.0f));
    CHECK_INT_EQ(h_want[7], fbits(0x1p-24f));
    CHECK_INT_EQ(h_want[8], fbits(1023.0f * 0x1p-24f));
    CHECK_INT_EQ(bf_want[1], fbits(-3.140625f));

    const char *hdr =
        "{\"__metadata__\":{\"format\":\"pt\"},"
        "\"bf\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[0,12]},"
        "\"h\":{\"dtype\":\"F16\",\"shape\":[12],\"data_offsets\":[12,36]}}";
    unsigned char data[36];
    for (int i = 0; i < 6; i++) {
        data[2 * i] = (unsigned char)(bf[i] & 0xff);
        data[2 * i + 1] = (unsigned char)(bf[i] >> 8);
    }
    for (int i = 0; i < 12; i++) {
        data[12 + 2 * i] = (unsigned char)(h[i] & 0xff);
        data[12 + 2 * i + 1] = (unsigned char)(h[i] >> 8);
    }
    const char *path = test_path("ref.safetensors");
    write_st(path, hdr, data, sizeof data);

    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, path), DT_OK);
    CHECK_INT_EQ(dt_st_count(f), 2);
    CHECK_STR_EQ(dt_st_metadata(f, "format"), "pt");
    const dt_st_tensor *tb = dt_st_tensor_at(f, 0), *th = dt_st_tensor_at(f, 1);
    CHECK_STR_EQ(tb->name, "bf");
    CHECK_INT_EQ(tb->dtype, DT_ST_BF16);
    CHECK_STR_EQ(tb->dtype_name, "BF16");
    CHECK_INT_EQ(tb->numel, 6);
    CHECK_INT_EQ(tb->nbytes, 12);
    CHECK_STR_EQ(th->name, "h");
    CHECK_INT_EQ(th->dtype, DT_ST_F16);
    CHECK_INT_EQ(th->offset, 12);
    CHECK_INT_EQ(th->nbytes, 24);
    float got[12];
    CHECK_INT_EQ(dt_st_read_f32(f, tb, got), DT_OK);
    for (int i = 0; i < 6; i++) CHECK_INT_EQ(fbits(got[i]), bf_want[i]);
    CHECK_INT_EQ(dt_st_read_f32(f, th, got), DT_OK);
    for (int i = 0; i < 12; i++) CHECK_INT_EQ(fbits(got[i]), h_want[i]);
    dt_st_close(f);

    /* every half: finite values round-trip through double arithmetic */
    unsigned char *all = malloc(2 * 65536);
    CHECK(all != NULL);
    for (int i = 0; i < 65536; i++) {
        all[2 * i] = (unsigned char)(i & 0xff);
        all[2 * i + 1] = (unsigned char)(i >> 8);
    }
    const char *pall = test_path("allhalf.safetensors");
    write_st(pall, "{\"all\":{\"dtype\":\"F16\",\"shape\":[256,256],\"data_offsets\":[0,131072]}}",
             all, 2 * 65536);
    free(all);
    float *v = malloc(65536 * sizeof *v);
    CHECK(v != NULL);
    CHECK_INT_EQ(dt_st_open(&f, pall), DT_OK);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "all"), v), DT_OK);
    dt_st_close(f);
    for (int i = 0; i < 65536; i++) {
        int sign = i >> 15, ex = (i >> 10) & 31, man = i & 1023;
        double want = ex == 0 ? ldexp(man, -24) : ldexp(1024 + man, ex - 25);
        if (sign) want = -want;
        if (ex == 31) {
            CHECK(man ? isnan(v[i]) : isinf(v[i]));
            CHECK_INT_EQ(signbit(v[i]) != 0, sign);
        } else {
            CHECK((double)v[i] == want);
            CHECK_INT_EQ(signbit(v[i]) != 0, sign);
        }
    }
    free(v);

    /* other dtypes open (sizes checked where known) but cannot be read as float */
    const char *pother = test_path("other.safetensors");
    unsigned char zeros[24] = {0};
    write_st(pother,
             "{\"i\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]},"
             "\"q\":{\"dtype\":\"Q4_K\",\"shape\":[5],\"data_offsets\":[16,19]}}",
             zeros, 19);
    CHECK_INT_EQ(dt_st_open(&f, pother), DT_OK);
    const dt_st_tensor *ti = dt_st_find(f, "i"), *tq = dt_st_find(f, "q");
    CHECK(ti && tq);
    CHECK_INT_EQ(ti->dtype, DT_ST_OTHER);
    CHECK_STR_EQ(ti->dtype_name, "I64");
    CHECK_INT_EQ(tq->dtype, DT_ST_OTHER);
    CHECK_STR_EQ(tq->dtype_name, "Q4_K");
    CHECK_INT_EQ(tq->numel, 5);
    CHECK_INT_EQ(tq->nbytes, 3);
    char want[1024];
    snprintf(want, sizeof want,
             "%s: tensor i has dtype I64; only F32, F16 and BF16 can be read as float", pother);
    CHECK_INT_EQ(dt_st_read_f32(f, ti, got), DT_ERR_DATA);
    CHECK_STR_EQ(dt_error_msg(), want);
    snprintf(want, sizeof want,
             "%s: tensor q has dtype Q4_K; only F32, F16 and BF16 can be read as float", pother);
    CHECK_INT_EQ(dt_st_read_f32(f, tq, got), DT_ERR_DATA);
    CHECK_STR_EQ(dt_error_msg(), want);
    dt_st_close(f);
}

/* ---- malformed files ---- */

static void test_malformed(void) {
    char what[512];
    /* shorter than the length prefix */
    const char *p = test_path("short.safetensors");
    test_write_file(p, "\x10\0\0\0\0", 5);
    expect_open_error(p, DT_ERR_DATA,
                      "file is 5 bytes, too short for the 8-byte header length "
                      "(not a safetensors file?)");
    /* header length over the limit, and larger than the file */
    p = test_path("huge.safetensors");
    write_st_raw(p, "{}", 100000001ull, NULL, 0);
    expect_open_error(p, DT_ERR_DATA,
                      "header length 100000001 exceeds the 100 MB limit (not a safetensors "
                      "file?)");
    p = test_path("trunc.safetensors");
    write_st_raw(p, "{\"a\":{}}", 64, NULL, 0);
    {
        /* keep 8 + 16 bytes only */
        size_t len;
        unsigned char *b = read_bytes(p, &len);
        test_write_file(p, b, 24);
        free(b);
    }
    expect_open_error(p, DT_ERR_DATA,
                      "header length 64 is larger than the rest of the file (16 bytes; "
                      "truncated?)");
    /* JSON errors, with line and column from jansson */
    expect_bad_header("{\"a\": {\"dtype\": \"F32\",}}", 0,
                      "header JSON error at line 1 column 23: string or '}' expected near '}'");
    expect_bad_header("{\n  \"a\": [1, 2\n}", 0,
                      "header JSON error at line 3 column 1: ']' expected near '}'");
    expect_bad_header("{\"a\": 1, \"a\": 2}", 0,
                      "header JSON error at line 1 column 12: duplicate object key near '\"a\"'");
    expect_bad_header("", 0,
                      "header JSON error at line 1 column 0: '[' or '{' expected near end of file");
    expect_bad_header("[1, 2]", 0, "header is not a JSON object");
    expect_bad_header("{\"__metadata__\": [\"pt\"]}", 0,
                      "\"__metadata__\" must be an object of string values");
    expect_bad_header("{\"__metadata__\": {\"format\": \"pt\", \"step\": 3}}", 0,
                      "\"__metadata__\" key step: value must be a string");
    /* entries */
    expect_bad_header("{\"a\": 5}", 0,
                      "tensor a: expected an object with \"dtype\", \"shape\" and \"data_offsets\"");
    expect_bad_header("{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                      "tensor a: missing \"dtype\"");
    expect_bad_header("{\"a\": {\"dtype\": 32, \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                      "tensor a: \"dtype\" must be a string");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"data_offsets\": [0, 4]}}", 4,
                      "tensor a: missing \"shape\"");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": 1, \"data_offsets\": [0, 4]}}", 4,
                      "tensor a: \"shape\" must be an array of integers");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1.0], \"data_offsets\": [0, 4]}}",
                      4, "tensor a: \"shape\" must be an array of integers");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1]}}", 4,
                      "tensor a: missing \"data_offsets\"");
    const char *bad_offsets =
        "tensor a: \"data_offsets\" must be [begin, end] with two non-negative integers";
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4]}}", 4,
                      bad_offsets);
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [-4, 0]}}",
                      4, bad_offsets);
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": \"0:4\"}}",
                      4, bad_offsets);
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}",
                      8, "tensor a: data_offsets [8, 4] end before begin");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2, -3], \"data_offsets\": [0, 24]}}",
                      24, "tensor a: shape [2, -3] has a negative dimension");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                      "\"data_offsets\": [0, 4]}}",
                      4, "tensor a: shape has 9 dimensions, at most 8 are supported");
    expect_bad_header("{\"w\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"data_offsets\": [0, 20]}}",
                      20, "tensor w: data_offsets span 20 bytes but shape [2, 3] of F32 needs 24");
    expect_bad_header("{\"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 8]}}", 8,
                      "tensor s: data_offsets span 8 bytes but shape [] of F32 needs 4");
    expect_bad_header("{\"h\": {\"dtype\": \"F16\", \"shape\": [3], \"data_offsets\": [0, 4]}}", 4,
                      "tensor h: data_offsets span 4 bytes but shape [3] of F16 needs 6");
    expect_bad_header("{\"i\": {\"dtype\": \"I64\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4,
                      "tensor i: data_offsets span 4 bytes but shape [1] of I64 needs 8");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 4,
                      "tensor a: data_offsets end 8 is beyond the data section (4 bytes)");
    expect_bad_header("{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                      " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
                      12, "tensors a [0, 8) and b [4, 12) overlap in the data section");
    expect_bad_header("{\"b\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [8, 20]},"
                      " \"a\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 12]}}",
                      20, "tensors a [0, 12) and b [8, 20) overlap in the data section");
    snprintf(what, sizeof what, "tensor big: shape [4294967296, 4294967296] is too large");
    expect_bad_header("{\"big\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296], "
                      "\"data_offsets\": [0, 4]}}", 4, what);

    /* accepted: holes (trailing and interior), empty tensors sharing an offset, unknown keys */
    p = test_path("holes.safetensors");
    unsigned char d[32] = {0};
    write_st(p,
             "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12], \"x\": 1},"
             " \"e\": {\"dtype\": \"F32\", \"shape\": [0, 5], \"data_offsets\": [8, 8]},"
             " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [12, 16]}}",
             d, sizeof d);
    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, p), DT_OK);
    CHECK_INT_EQ(dt_st_count(f), 3);
    CHECK_INT_EQ(dt_st_find(f, "e")->numel, 0);
    dt_st_close(f);

    /* not there, or not a file: bad input (exit 2, never retried), DT_ERR_DATA; a FIFO is
     * refused at once instead of blocking in open() */
    p = test_path("missing.safetensors");
    expect_open_error(p, DT_ERR_DATA, "cannot open: No such file or directory");
    expect_open_error(test_dir(), DT_ERR_DATA, "not a regular file (a directory)");
    p = test_path("fifo.safetensors");
    CHECK(mkfifo(p, 0644) == 0);
    alarm(20); /* a hang fails the test */
    expect_open_error(p, DT_ERR_DATA, "not a regular file (a FIFO)");
    alarm(0);
    expect_open_error("/dev/null", DT_ERR_DATA, "not a regular file (a character device)");
}

/* ---- reads of a file that shrank after open ---- */

static void test_short_read(void) {
    float v[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    dt_st_entry e = {.name = "v", .ndim = 1, .shape = {8}, .data = v};
    const char *p = test_path("shrink.safetensors");
    CHECK_INT_EQ(dt_st_write(p, &e, 1, NULL, NULL, 0), DT_OK);
    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, p), DT_OK);
    struct stat sb;
    CHECK(stat(p, &sb) == 0);
    CHECK(truncate(p, sb.st_size - 6) == 0);
    float got[8];
    char want[1024];
    snprintf(want, sizeof want,
             "%s: short read of tensor v: got 26 of 32 bytes (file truncated?)", p);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "v"), got), DT_ERR_IO);
    CHECK_STR_EQ(dt_error_msg(), want);
    dt_st_close(f);

    /* same through the F16 conversion path */
    const char *ph = test_path("shrink16.safetensors");
    unsigned char d[10] = {0};
    write_st(ph, "{\"h\":{\"dtype\":\"F16\",\"shape\":[5],\"data_offsets\":[0,10]}}", d, 10);
    CHECK_INT_EQ(dt_st_open(&f, ph), DT_OK);
    CHECK(stat(ph, &sb) == 0);
    CHECK(truncate(ph, sb.st_size - 3) == 0);
    snprintf(want, sizeof want,
             "%s: short read of tensor h: got 7 of 10 bytes (file truncated?)", ph);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "h"), got), DT_ERR_IO);
    CHECK_STR_EQ(dt_error_msg(), want);
    dt_st_close(f);
}

/* ---- atomic writes ---- */

static void test_write_errors(void) {
    float a[2] = {1, 2}, b[3] = {4, 5, 6};
    dt_st_entry ea = {.name = "a", .ndim = 1, .shape = {2}, .data = a};
    dt_st_entry eb = {.name = "b", .ndim = 2, .shape = {1, 3}, .data = b};
    char want[2048];

    /* into a directory that does not exist */
    const char *p = test_path("no/such/dir/m.safetensors");
    snprintf(want, sizeof want, "%s: cannot create %s.tmp.%ld: No such file or directory", p, p,
             (long)getpid());
    CHECK_INT_EQ(dt_st_write(p, &ea, 1, NULL, NULL, 0), DT_ERR_IO);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);

    /* the temp file is written but the rename fails (the target is a non-empty directory):
     * the temp file must be removed */
    const char *pd = test_path("isdir.safetensors");
    test_mkdir_p(pd);
    test_write_file(test_path("isdir.safetensors/keep"), "x", 1);
    snprintf(want, sizeof want, "%s: cannot rename %s.tmp.%ld onto it: Is a directory", pd, pd,
             (long)getpid());
    CHECK_INT_EQ(dt_st_write(pd, &ea, 1, NULL, NULL, 0), DT_ERR_IO);
    CHECK_STR_EQ(dt_error_msg(), want);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);

    /* over an existing file: replaced entirely */
    const char *pm = test_path("over.safetensors");
    const char *k[] = {"v"}, *v1[] = {"1"}, *v2[] = {"2"};
    dt_st_entry both[2] = {ea, eb};
    CHECK_INT_EQ(dt_st_write(pm, both, 2, k, v1, 1), DT_OK);
    CHECK_INT_EQ(dt_st_write(pm, &eb, 1, k, v2, 1), DT_OK);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);
    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, pm), DT_OK);
    CHECK_INT_EQ(dt_st_count(f), 1);
    CHECK(dt_st_find(f, "a") == NULL);
    CHECK_STR_EQ(dt_st_metadata(f, "v"), "2");
    const dt_st_tensor *t = dt_st_find(f, "b");
    CHECK(t != NULL);
    CHECK_INT_EQ(t->offset, 0);
    float got[3];
    CHECK_INT_EQ(dt_st_read_f32(f, t, got), DT_OK);
    CHECK(memcmp(got, b, sizeof b) == 0);
    dt_st_close(f);
    struct stat sb;
    CHECK(stat(pm, &sb) == 0);
    CHECK_INT_EQ(sb.st_size, 8 + 88 + 12); /* 82 bytes of JSON padded to 88 */

    /* caller mistakes are refused before anything is created */
    const char *pn = test_path("never.safetensors");
    dt_st_entry dup[2] = {ea, ea};
    CHECK(dt_st_write(pn, dup, 2, NULL, NULL, 0) != DT_OK);
    dt_st_entry neg = {.name = "n", .ndim = 1, .shape = {-1}, .data = a};
    CHECK(dt_st_write(pn, &neg, 1, NULL, NULL, 0) != DT_OK);
    CHECK(access(pn, F_OK) != 0);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);
}

/* dt_st_write_parts: the bytes dt_st_write makes from the same tensors, asked for a part at a
 * time (a tensor of more than DT_ST_PART floats in parts, an empty one never); a fill that fails
 * leaves no file and no temporary. */
typedef struct parts_src {
    const float *data[3];
    int calls, fail_at;
    size_t most;
} parts_src;

static dt_status fill_from(void *user, int i, size_t first, size_t n, float *buf) {
    parts_src *s = user;
    if (++s->calls == s->fail_at) return dt_error_set(DT_ERR_IO, "device lost");
    if (n > s->most) s->most = n;
    memcpy(buf, s->data[i] + first, n * sizeof(float));
    return DT_OK;
}

static void test_write_parts(void) {
    const size_t big = 2 * DT_ST_PART + 3; /* two whole parts and 3 floats */
    float *a = malloc(big * sizeof(float)), b[5] = {1, -2, 3.5f, 0, 9};
    CHECK(a != NULL);
    for (size_t i = 0; i < big; i++) a[i] = (float)i * 0.25f - 7.0f;
    dt_st_entry e[3] = {{.name = "big", .ndim = 2, .shape = {1, (int64_t)big}, .data = a},
                        {.name = "empty", .ndim = 1, .shape = {0}, .data = NULL},
                        {.name = "small", .ndim = 1, .shape = {5}, .data = b}};
    const char *k[] = {"format"}, *v[] = {"pt"};
    const char *whole = test_path("whole.safetensors"), *parts = test_path("parts.safetensors");
    CHECK_OK(dt_st_write(whole, e, 3, k, v, 1));
    parts_src src = {{a, NULL, b}, 0, 0, 0};
    dt_st_entry ne[3] = {e[0], e[1], e[2]};
    for (int i = 0; i < 3; i++) ne[i].data = NULL; /* never read */
    CHECK_OK(dt_st_write_parts(parts, ne, 3, k, v, 1, fill_from, &src));
    CHECK_INT_EQ(src.calls, 4); /* big in 3 parts, small in 1 */
    CHECK_INT_EQ(src.most, DT_ST_PART);
    size_t n1, n2;
    unsigned char *w = read_bytes(whole, &n1), *p = read_bytes(parts, &n2);
    CHECK_INT_EQ(n1, n2);
    CHECK(n1 == n2 && memcmp(w, p, n1) == 0);
    free(w);
    free(p);
    const char *failed = test_path("failed.safetensors");
    parts_src bad = {{a, NULL, b}, 0, 2, 0};
    CHECK_INT_EQ(dt_st_write_parts(failed, ne, 3, k, v, 1, fill_from, &bad), DT_ERR_IO);
    CHECK_STR_EQ(dt_error_msg(), "device lost");
    CHECK(access(failed, F_OK) != 0);
    CHECK_INT_EQ(count_temp_files(test_dir()), 0);
    free(a);
}

/* A link planted at the writer's temporary name (PATH.tmp.PID) is neither followed nor
 * removed: its target keeps its bytes, and the file is written under another name. */
static void test_planted_temp(void) {
    test_mkdir_p(test_path("planted"));
    const char *victim = test_path("victim.txt"), *out = test_path("planted/m.safetensors");
    char tmp[1300];
    test_plant_temp_link(out, victim, tmp, sizeof tmp);
    float a[2] = {1, 2};
    dt_st_entry ea = {.name = "a", .ndim = 1, .shape = {2}, .data = a};
    CHECK_OK(dt_st_write(out, &ea, 1, NULL, NULL, 0));
    test_planted_kept(victim, tmp);
    struct stat sb;
    CHECK(lstat(out, &sb) == 0 && S_ISREG(sb.st_mode));
    dt_st_file *f = NULL;
    CHECK_OK(dt_st_open(&f, out));
    CHECK_INT_EQ(dt_st_count(f), 1);
    dt_st_close(f);
    CHECK_INT_EQ(count_temp_files(test_path("planted")), 1); /* only the planted link */
}

/* ---- optional: the reference implementation, when installed ---- */

static void test_python_reference(void) {
    if (system("python3 -c 'import safetensors, numpy' >/dev/null 2>&1") != 0) {
        printf("test_safetensors: python3 safetensors/numpy not available, reference "
               "cross-check skipped\n");
        return;
    }
    const char *script = test_path("ref.py");
    const char *py =
        "import sys, numpy as np\n"
        "from safetensors.numpy import save_file, load_file\n"
        "from safetensors import safe_open\n"
        "a = np.array([1.5, -2.0, 0.25], dtype=np.float32)\n"
        "b = (np.arange(6, dtype=np.float32) / 8 - 0.3).reshape(2, 3)\n"
        "h = np.array([1, -2, 65504, 2.0**-24, 0.1], dtype=np.float16)\n"
        "if sys.argv[1] == 'write':\n"
        "    save_file({'a': a, 'b': b, 'h': h}, sys.argv[2], metadata={'format': 'np'})\n"
        "    save_file({'a': a, 'b': b}, sys.argv[3], metadata={'format': 'np'})\n"
        "else:\n"
        "    t = load_file(sys.argv[2])\n"
        "    assert sorted(t) == ['a', 'b'], sorted(t)\n"
        "    assert t['a'].dtype == np.float32 and np.array_equal(t['a'], a)\n"
        "    assert t['b'].shape == (2, 3) and np.array_equal(t['b'], b)\n"
        "    with safe_open(sys.argv[2], 'np') as f:\n"
        "        assert f.metadata() == {'format': 'np'}, f.metadata()\n";
    test_write_file(script, py, strlen(py));
    const char *pyh = test_path("py_abh.safetensors"), *pyab = test_path("py_ab.safetensors");
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "python3 '%s' write '%s' '%s'", script, pyh, pyab);
    CHECK_INT_EQ(system(cmd), 0);

    /* read what Python wrote */
    float a[3] = {1.5f, -2.0f, 0.25f}, b[6];
    for (int i = 0; i < 6; i++) b[i] = (float)i / 8 - 0.3f;
    float hw[5] = {1, -2, 65504, 0x1p-24f, 0x1.998p-4f}; /* 0.1 rounded to half */
    dt_st_file *f = NULL;
    CHECK_INT_EQ(dt_st_open(&f, pyh), DT_OK);
    CHECK_INT_EQ(dt_st_count(f), 3);
    CHECK_STR_EQ(dt_st_metadata(f, "format"), "np");
    float got[6];
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "a"), got), DT_OK);
    CHECK(memcmp(got, a, sizeof a) == 0);
    CHECK_INT_EQ(dt_st_read_f32(f, dt_st_find(f, "b"), got), DT_OK);
    CHECK(memcmp(got, b, sizeof b) == 0);
    const dt_st_tensor *th = dt_st_find(f, "h");
    CHECK(th && th->dtype == DT_ST_F16);
    CHECK_INT_EQ(dt_st_read_f32(f, th, got), DT_OK);
    for (int i = 0; i < 5; i++) CHECK_INT_EQ(fbits(got[i]), fbits(hw[i]));
    dt_st_close(f);

    /* our writer produces the same bytes as the reference for the same F32 tensors */
    dt_st_entry e[2] = {{.name = "a", .ndim = 1, .shape = {3}, .data = a},
                        {.name = "b", .ndim = 2, .shape = {2, 3}, .data = b}};
    const char *mk[] = {"format"}, *mv[] = {"np"};
    const char *ours = test_path("ours_ab.safetensors");
    CHECK_INT_EQ(dt_st_write(ours, e, 2, mk, mv, 1), DT_OK);
    size_t l1, l2;
    unsigned char *b1 = read_bytes(ours, &l1), *b2 = read_bytes(pyab, &l2);
    CHECK_INT_EQ(l1, l2);
    CHECK(memcmp(b1, b2, l1) == 0);
    free(b1);
    free(b2);

    /* and the reference reads ours */
    snprintf(cmd, sizeof cmd, "python3 '%s' read '%s'", script, ours);
    CHECK_INT_EQ(system(cmd), 0);
    printf("test_safetensors: reference cross-check passed\n");
}

int main(void) {
    test_dir_init("safetensors");
    test_round_trip();
    test_reference_layout();
    test_malformed();
    test_short_read();
    test_write_errors();
    test_write_parts();
    test_planted_temp();
    test_python_reference();
    test_dir_remove();
    TEST_PASS("test_safetensors");
}
