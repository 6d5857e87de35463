/* data.c — datasets, the world-size-independent sampler, eval sharding and shard
 * writing (DESIGN.md §5, include/dtrain/data.h).
 *
 * Every input file is read through zlib (gzopen/gzread), so `.gz` and plain files take the
 * same path; a FIFO or a device is refused before it is opened for good. Token shards are
 * streamed in 1 MiB chunks straight into one token array (uint16 while every shard is
 * version 1; uint32 otherwise, narrowed to uint16 at the end when every token fits),
 * allocated for the header's count only once the size on disk vouches for it (a .gz
 * shard's array grows as it decompresses). TSV files are read whole and tokenized in one linear pass into
 * an (N, T) uint16 matrix. Byte offsets in messages about `.gz` shards are offsets in the
 * decompressed stream. */
#include "dtrain/data.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "dtrain/chat.h"
#include "dtrain/file.h"
#include "dtrain/sft.h"
#include "dtrain/tokenizer.h"

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES (SHARD_HEADER_INTS * 4)
#define READ_CHUNK ((size_t)1 << 20)
#define TSV_LINE "\"label<TAB>text\""

struct dt_dataset {
    int classification;   /* 1: tsv examples, 0: language modelling over tokens */
    int seq_len;          /* T */
    size_t num_samples;
    size_t num_files;
    size_t num_truncated; /* tsv examples cut to T-1 text bytes */
    /* language modelling: the concatenated shards, exactly one of tok16/tok32 is set */
    size_t num_tokens;
    size_t tok_cap;       /* tokens allocated in tok16/tok32 */
    uint16_t *tok16;      /* (num_tokens) */
    uint32_t *tok32;      /* (num_tokens) */
    /* classification */
    uint16_t *ids;        /* (num_samples, T) byte ids, DT_CLS_TOKEN, 0 padding; or BPE ids, end-of-text padding */
    uint32_t *bpe_ids;    /* one text's BPE ids while reading */
    size_t bpe_cap;
    int32_t *labels;      /* (num_samples) */
    size_t cap;           /* rows allocated in ids/labels */
    /* chat and prompt/completion examples (sft.h) */
    dt_sft *sft;
    int packed; /* data.packing: rows of several examples */
    dt_chat *chat;
};

/* ---------------------------------------------------------------- file lists */

typedef struct file_list {
    char **v;
    size_t n, cap;
} file_list;

static void file_list_free(file_list *fl) {
    for (size_t i = 0; i < fl->n; i++) free(fl->v[i]);
    free(fl->v);
    fl->v = NULL;
    fl->n = fl->cap = 0;
}

/* Appends dir/name (or name alone when dir is NULL). */
static dt_status file_list_push(file_list *fl, const char *dir, const char *name) {
    if (fl->n == fl->cap) {
        size_t cap = fl->cap ? fl->cap * 2 : 16;
        char **v = realloc(fl->v, cap * sizeof *v);
        if (!v) return dt_error_set(DT_ERR_NOMEM, "out of memory listing data files");
        fl->v = v;
        fl->cap = cap;
    }
    size_t dlen = 0;
    if (dir) {
        dlen = strlen(dir);
        while (dlen > 1 && dir[dlen - 1] == '/') dlen--;
    }
    size_t nlen = strlen(name);
    char *s = malloc(dlen + 1 + nlen + 1);
    if (!s) return dt_error_set(DT_ERR_NOMEM, "out of memory listing data files");
    if (dir) {
        memcpy(s, dir, dlen);
        if (!(dlen == 1 && dir[0] == '/')) s[dlen++] = '/';
    }
    memcpy(s + dlen, name, nlen + 1);
    fl->v[fl->n++] = s;
    return DT_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static dt_status no_match(const char *path) {
    return dt_error_set(DT_ERR_DATA,
                        "%s: no files match (hint: data.train_path and data.val_path take a file, "
                        "a directory or a glob such as \"data/*.bin\"; relative paths start from "
                        "the working directory)",
                        path);
}

/* A file, a directory (its regular, non-hidden files) or a glob (its matches that are not
 * directories), sorted by name. Entries that cannot be stat'ed are kept, so that opening
 * them reports the real error. */
static dt_status list_files(const char *path, file_list *fl) {
    struct stat st;
    int stat_err = stat(path, &st) == 0 ? 0 : errno;
    if (!stat_err) {
        if (!S_ISDIR(st.st_mode)) return file_list_push(fl, NULL, path);
        DIR *d = opendir(path);
        if (!d)
            return dt_error_set(dt_file_errno_status(errno, DT_ERR_DATA), "%s: cannot open directory: %s", path,
                                strerror(errno));
        for (;;) {
            errno = 0;
            struct dirent *e = readdir(d);
            if (!e) {
                if (errno) {
                    int err = errno;
                    closedir(d);
                    return dt_error_set(DT_ERR_IO, "%s: cannot read directory: %s", path, strerror(err));
                }
                break;
            }
            if (e->d_name[0] == '.') continue;
            dt_status s = file_list_push(fl, path, e->d_name);
            if (s != DT_OK) {
                closedir(d);
                return s;
            }
            struct stat fst;
            if (stat(fl->v[fl->n - 1], &fst) == 0 && !S_ISREG(fst.st_mode)) free(fl->v[--fl->n]);
        }
        closedir(d);
        if (fl->n == 0)
            return dt_error_set(DT_ERR_DATA,
                                "%s: no files match (hint: the directory has no regular, non-hidden "
                                "files)",
                                path);
        qsort(fl->v, fl->n, sizeof *fl->v, cmp_str);
        return DT_OK;
    }
    if (!strpbrk(path, "*?[")) {
        if (stat_err == ENOENT || stat_err == ENOTDIR) return no_match(path);
        return dt_error_set(dt_file_errno_status(stat_err, DT_ERR_DATA), "%s: cannot access: %s", path,
                            strerror(stat_err));
    }
    glob_t g;
    memset(&g, 0, sizeof g);
    int rc = glob(path, 0, NULL, &g);
    if (rc == GLOB_NOMATCH) {
        globfree(&g);
        return no_match(path);
    }
    if (rc == GLOB_NOSPACE) {
        globfree(&g);
        return dt_error_set(DT_ERR_NOMEM, "%s: out of memory matching the pattern", path);
    }
    if (rc != 0) {
        globfree(&g);
        return dt_error_set(DT_ERR_IO, "%s: cannot read a directory while matching the pattern", path);
    }
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct stat fst;
        if (stat(g.gl_pathv[i], &fst) == 0 && S_ISDIR(fst.st_mode)) continue;
        dt_status s = file_list_push(fl, NULL, g.gl_pathv[i]);
        if (s != DT_OK) {
            globfree(&g);
            return s;
        }
    }
    globfree(&g);
    if (fl->n == 0) return no_match(path);
    qsort(fl->v, fl->n, sizeof *fl->v, cmp_str);
    return DT_OK;
}

/* ---------------------------------------------------------------- reading through zlib */

/* Opens a data file (a regular file: a FIFO or a device is refused before it can block);
 * *size is its size on disk (the compressed size of a .gz). */
static dt_status gz_open(const char *file, gzFile *out, off_t *size) {
    int fd;
    DT_TRY(dt_file_open_regular(file, DT_ERR_DATA, &fd));
    struct stat st;
    *size = fstat(fd, &st) == 0 ? st.st_size : 0;
    gzFile f = gzdopen(fd, "rb");
    if (!f) {
        close(fd);
        return dt_error_set(DT_ERR_NOMEM, "%s: cannot open: out of memory", file);
    }
    gzbuffer(f, 1 << 17);
    *out = f;
    return DT_OK;
}

static dt_status gz_fail(gzFile f, const char *file) {
    int errnum = Z_OK;
    int saved = errno;
    const char *msg = gzerror(f, &errnum);
    if (errnum == Z_ERRNO) return dt_error_set(DT_ERR_IO, "%s: read error: %s", file, strerror(saved));
    if (errnum == Z_MEM_ERROR) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory decompressing", file);
    /* zlib prefixes its message with "PATH: " */
    size_t flen = strlen(file);
    if (strncmp(msg, file, flen) == 0 && msg[flen] == ':' && msg[flen + 1] == ' ') msg += flen + 2;
    return dt_error_set(DT_ERR_DATA, "%s: bad gzip data: %s", file, msg);
}

/* Reads up to len bytes; *got < len only at the end of the file. */
static dt_status gz_read_full(gzFile f, const char *file, void *buf, size_t len, size_t *got) {
    unsigned char *p = buf;
    size_t total = 0;
    while (total < len) {
        size_t want = len - total;
        if (want > ((size_t)1 << 30)) want = (size_t)1 << 30;
        int r = gzread(f, p + total, (unsigned)want);
        if (r < 0) return gz_fail(f, file);
        if (r == 0) break;
        total += (size_t)r;
    }
    *got = total;
    if (total < len) {
        int errnum = Z_OK;
        gzerror(f, &errnum);
        if (errnum != Z_OK) return gz_fail(f, file); /* e.g. a truncated .gz stream */
    }
    return DT_OK;
}

/* Reads the whole (decompressed) file; the caller frees *out. */
dt_status dt_data_read_all(const char *file, unsigned char **out, size_t *out_len) {
    gzFile f;
    off_t size;
    DT_TRY(gz_open(file, &f, &size));
    size_t cap = (size_t)1 << 16, len = 0;
    if (size > 0) cap = (size_t)size + 1;
    unsigned char *buf = malloc(cap);
    if (!buf) {
        gzclose(f);
        return dt_error_set(DT_ERR_NOMEM, "%s: out of memory reading %zu bytes", file, cap);
    }
    for (;;) {
        if (len == cap) {
            unsigned char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                gzclose(f);
                return dt_error_set(DT_ERR_NOMEM, "%s: out of memory reading %zu bytes", file, cap * 2);
            }
            buf = nb;
            cap *= 2;
        }
        size_t want = cap - len, got = 0;
        dt_status s = gz_read_full(f, file, buf + len, want, &got);
        if (s != DT_OK) {
            free(buf);
            gzclose(f);
            return s;
        }
        len += got;
        if (got < want) break;
    }
    gzclose(f);
    *out = buf;
    *out_len = len;
    return DT_OK;
}

/* ---------------------------------------------------------------- token shards */

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void put_le32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

/* Makes room for `need` tokens of at least `width` bytes (of `file`, for the message);
 * widens uint16 storage to uint32 the first time a version-7 shard arrives (call it before
 * the shard's first token is stored: the tokens of the shards before are copied). */
static dt_status tokens_reserve(dt_dataset *ds, size_t need, int width, const char *file) {
    if (need <= ds->tok_cap && (width == 2 || ds->tok32)) return DT_OK;
    if (need < ds->tok_cap) need = ds->tok_cap;
    if (width == 4 && !ds->tok32) {
        uint32_t *t = malloc((need ? need : 1) * sizeof *t);
        if (!t) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory for %zu tokens", file, need);
        for (size_t i = 0; i < ds->num_tokens; i++) t[i] = ds->tok16[i];
        free(ds->tok16);
        ds->tok16 = NULL;
        ds->tok32 = t;
    } else if (ds->tok32) {
        uint32_t *t = realloc(ds->tok32, need * sizeof *t);
        if (!t) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory for %zu tokens", file, need);
        ds->tok32 = t;
    } else {
        uint16_t *t = realloc(ds->tok16, need * sizeof *t);
        if (!t) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory for %zu tokens", file, need);
        ds->tok16 = t;
    }
    ds->tok_cap = need;
    return DT_OK;
}

/* Reads and checks a shard's header: *count tokens of *width bytes follow. `size` is the
 * file's size on disk: a file read as it is (not compressed) whose header claims more
 * tokens than it holds is refused here, before anything is allocated for them. */
static dt_status shard_header(gzFile f, const char *file, off_t size, int32_t *count_out, int *width_out) {
    unsigned char hdr[SHARD_HEADER_BYTES];
    size_t got = 0;
    DT_TRY(gz_read_full(f, file, hdr, sizeof hdr, &got));
    int32_t magic = got >= 4 ? (int32_t)le32(hdr) : 0;
    if (got >= 4 && magic != DT_SHARD_MAGIC_V1 && magic != DT_SHARD_MAGIC_V2)
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset 0: bad magic %d (expected %d or %d: not an llm.c token shard)",
                            file, (int)magic, DT_SHARD_MAGIC_V1, DT_SHARD_MAGIC_V2);
    if (got < SHARD_HEADER_BYTES)
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset %zu: file has only %zu bytes, shorter than the %d-byte shard "
                            "header",
                            file, got, got, SHARD_HEADER_BYTES);
    int32_t version = (int32_t)le32(hdr + 4);
    int32_t count = (int32_t)le32(hdr + 8);
    int expect_version = magic == DT_SHARD_MAGIC_V1 ? 1 : 7;
    if (version != expect_version)
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset 4: unsupported version %d (magic %d needs version %d)", file,
                            (int)version, (int)magic, expect_version);
    if (count <= 0)
        return dt_error_set(DT_ERR_DATA, "%s: offset 8: header says %d tokens (expected at least 1)",
                            file, (int)count);
    int width = magic == DT_SHARD_MAGIC_V1 ? 2 : 4;
    size_t expect = (size_t)count * (size_t)width;
    if (gzdirect(f) && size >= SHARD_HEADER_BYTES && (size_t)size - SHARD_HEADER_BYTES < expect) {
        size_t have = (size_t)size - SHARD_HEADER_BYTES;
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset %zu: truncated: header says %d tokens (%zu bytes), file has "
                            "only %zu bytes of tokens",
                            file, (size_t)SHARD_HEADER_BYTES + have, (int)count, expect, have);
    }
    *count_out = count;
    *width_out = width;
    return DT_OK;
}

/* Room for `need` tokens while reading a shard that ends at token `limit` (what its header
 * claims): all of it at once when the size on disk vouched for it (`direct`), else grown
 * as the decompressed tokens arrive, so a lying .gz header allocates no more than it holds. */
static dt_status tokens_grow(dt_dataset *ds, size_t need, size_t limit, int direct, int width, const char *file) {
    if (need <= ds->tok_cap) return DT_OK;
    size_t want = limit;
    if (!direct && 2 * ds->tok_cap < want) want = 2 * ds->tok_cap > need ? 2 * ds->tok_cap : need;
    return tokens_reserve(ds, want, width, file);
}

/* Reads the `count` tokens that follow the header, then checks that nothing follows them. */
static dt_status shard_tokens(dt_dataset *ds, gzFile f, const char *file, int32_t count, int width, int vocab,
                              unsigned char *chunk, uint32_t *max_tok) {
    size_t expect = (size_t)count * (size_t)width, have = 0, got = 0;
    size_t base = ds->num_tokens, limit = base + (size_t)count;
    int direct = gzdirect(f);
    size_t first_need = base + (direct ? (size_t)count : READ_CHUNK / (size_t)width);
    DT_TRY(tokens_reserve(ds, first_need < limit ? first_need : limit, width, file));
    uint32_t mx = *max_tok;
    while (have < expect) {
        size_t want = expect - have < READ_CHUNK ? expect - have : READ_CHUNK;
        DT_TRY(gz_read_full(f, file, chunk, want, &got));
        size_t ntok = got / (size_t)width, first = have / (size_t)width;
        DT_TRY(tokens_grow(ds, base + first + ntok, limit, direct, width, file));
        for (size_t k = 0; k < ntok; k++) {
            const unsigned char *p = chunk + k * (size_t)width;
            uint32_t v = width == 2 ? (uint32_t)p[0] | (uint32_t)p[1] << 8 : le32(p);
            if ((uint64_t)v >= (uint64_t)vocab)
                return dt_error_set(DT_ERR_DATA, "%s: offset %zu: token %u >= model.vocab_size %d",
                                    file, (size_t)SHARD_HEADER_BYTES + have + k * (size_t)width, v,
                                    vocab);
            if (v > mx) mx = v;
            if (ds->tok32) ds->tok32[base + first + k] = v;
            else ds->tok16[base + first + k] = (uint16_t)v;
        }
        have += got;
        if (got < want) break;
    }
    if (have < expect)
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset %zu: truncated: header says %d tokens (%zu bytes), file has "
                            "only %zu bytes of tokens",
                            file, (size_t)SHARD_HEADER_BYTES + have, (int)count, expect, have);
    size_t extra = 0;
    for (;;) {
        DT_TRY(gz_read_full(f, file, chunk, READ_CHUNK, &got));
        extra += got;
        if (got < READ_CHUNK) break;
    }
    if (extra)
        return dt_error_set(DT_ERR_DATA,
                            "%s: offset %zu: %zu extra bytes after the %d tokens the header declares",
                            file, (size_t)SHARD_HEADER_BYTES + expect, extra, (int)count);
    ds->num_tokens += (size_t)count;
    *max_tok = mx;
    return DT_OK;
}

/* Appends one shard's tokens to ds; `chunk` is a READ_CHUNK scratch buffer. */
static dt_status read_shard(dt_dataset *ds, const char *file, int vocab, unsigned char *chunk,
                            uint32_t *max_tok) {
    gzFile f;
    off_t size;
    DT_TRY(gz_open(file, &f, &size));
    int32_t count = 0;
    int width = 0;
    dt_status st = shard_header(f, file, size, &count, &width);
    if (st == DT_OK) st = shard_tokens(ds, f, file, count, width, vocab, chunk, max_tok);
    gzclose(f);
    return st;
}

static dt_status open_tokens(dt_dataset *ds, const file_list *fl, const dt_dataset_cfg *cfg) {
    unsigned char *chunk = malloc(READ_CHUNK);
    if (!chunk) return dt_error_set(DT_ERR_NOMEM, "out of memory for the shard read buffer");
    uint32_t max_tok = 0;
    for (size_t i = 0; i < fl->n; i++) {
        dt_status st = read_shard(ds, fl->v[i], cfg->vocab_size, chunk, &max_tok);
        if (st != DT_OK) {
            free(chunk);
            return st;
        }
    }
    free(chunk);
    size_t T = (size_t)cfg->seq_len;
    if (ds->num_tokens < T + 1)
        return dt_error_set(DT_ERR_DATA,
                            "%s: only %zu tokens in %zu file(s), but data.seq_len %d needs at least "
                            "%zu for one sample (hint: lower data.seq_len or add data)",
                            cfg->path, ds->num_tokens, fl->n, cfg->seq_len, T + 1);
    ds->num_samples = (ds->num_tokens - 1) / T;
    if (ds->tok32 && max_tok < 65536) { /* narrow: every token fits uint16 */
        uint16_t *t = malloc(ds->num_tokens * sizeof *t);
        if (t) {
            for (size_t i = 0; i < ds->num_tokens; i++) t[i] = (uint16_t)ds->tok32[i];
            free(ds->tok32);
            ds->tok32 = NULL;
            ds->tok16 = t;
        }
    } else if (ds->tok16) {
        uint16_t *t = realloc(ds->tok16, ds->num_tokens * sizeof *t);
        if (t) ds->tok16 = t;
    } else if (ds->tok32) { /* a .gz shard's storage grew in doublings */
        uint32_t *t = realloc(ds->tok32, ds->num_tokens * sizeof *t);
        if (t) ds->tok32 = t;
    }
    ds->tok_cap = ds->num_tokens;
    return DT_OK;
}

/* ---------------------------------------------------------------- tsv */

static dt_status tsv_reserve(dt_dataset *ds, size_t rows) {
    if (rows <= ds->cap) return DT_OK;
    size_t cap = ds->cap ? ds->cap * 2 : 1024;
    while (cap < rows) cap *= 2;
    size_t T = (size_t)ds->seq_len;
    uint16_t *ids = realloc(ds->ids, cap * T * sizeof *ids);
    if (!ids) return dt_error_set(DT_ERR_NOMEM, "out of memory for %zu examples of %zu tokens", cap, T);
    ds->ids = ids;
    int32_t *labels = realloc(ds->labels, cap * sizeof *labels);
    if (!labels) return dt_error_set(DT_ERR_NOMEM, "out of memory for %zu labels", cap);
    ds->labels = labels;
    ds->cap = cap;
    return DT_OK;
}

/* Parses [s, e) as an optionally signed decimal integer. Returns 0 when it is not one;
 * *overflow is set when it is one but does not fit in a long. */
static int parse_label(const char *s, const char *e, long *out, int *overflow) {
    int neg = 0;
    *overflow = 0;
    if (s < e && (*s == '+' || *s == '-')) neg = *s++ == '-';
    if (s == e) return 0;
    long v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9') return 0;
        if (v > (LONG_MAX - (*s - '0')) / 10) *overflow = 1;
        else v = v * 10 + (*s - '0');
    }
    *out = neg ? -v : v;
    return 1;
}

/* Quotes [s, e) for a message: at most 32 bytes, non-printable bytes as \xNN. */
static const char *show_bytes(const char *s, const char *e, char *buf, size_t cap) {
    size_t o = 0, n = (size_t)(e - s) > 32 ? 32 : (size_t)(e - s);
    for (size_t i = 0; i < n && o + 5 < cap; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7f && c != '"' && c != '\\') buf[o++] = (char)c;
        else o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", c);
    }
    if ((size_t)(e - s) > n && o + 4 < cap) {
        memcpy(buf + o, "...", 3);
        o += 3;
    }
    buf[o] = '\0';
    return buf;
}

dt_status dt_data_text_row(dt_tokenizer *tok, const char *text, size_t tlen, int seq_len, uint16_t *row,
                           int *truncated, uint32_t **ids, size_t *cap) {
    const size_t T = (size_t)seq_len;
    *truncated = 0;
    if (!tok) {
        const char *nul = memchr(text, '\0', tlen);
        if (nul)
            return dt_error_set(DT_ERR_DATA, "NUL byte in the text at byte %zu (the byte tokenizer uses 0 as padding)",
                                (size_t)(nul - text) + 1);
        size_t n = tlen;
        if (n > T - 1) {
            n = T - 1;
            *truncated = 1;
        }
        for (size_t k = 0; k < n; k++) row[k] = (unsigned char)text[k];
        row[n] = DT_CLS_TOKEN;
        for (size_t k = n + 1; k < T; k++) row[k] = 0;
        return DT_OK;
    }
    size_t n = 0;
    DT_TRY(dt_tokenizer_encode(tok, text, tlen, ids, &n, cap));
    const uint32_t pad = (uint32_t)dt_tokenizer_eot(tok);
    if (dt_tokenizer_eot(tok) < 0 || pad > UINT16_MAX) /* dt_tokenizer_check_model refuses such a tokenizer first */
        return dt_error_set(DT_ERR_DATA, "the tokenizer %s has no end-of-text token to pad the text with (below id "
                            "65536)", dt_tokenizer_name(tok));
    if (n == 0) return dt_error_set(DT_ERR_DATA, "the text has no tokens");
    for (size_t k = 0; k < n; k++) {
        if ((*ids)[k] == pad)
            return dt_error_set(DT_ERR_DATA, "the text holds the end-of-text token (id %u), which pads the sequence: "
                                "the classifier would read the wrong position", pad);
        if ((*ids)[k] > UINT16_MAX) /* never cut to 16 bits: another token's id */
            return dt_error_set(DT_ERR_DATA, "token %u does not fit a classification row (ids below 65536)", (*ids)[k]);
    }
    if (n > T) {
        n = T;
        *truncated = 1;
    }
    for (size_t k = 0; k < n; k++) row[k] = (uint16_t)(*ids)[k];
    for (size_t k = n; k < T; k++) row[k] = (uint16_t)pad;
    return DT_OK;
}

static dt_status read_tsv(dt_dataset *ds, const char *file, int num_labels, dt_tokenizer *tok) {
    unsigned char *buf;
    size_t len;
    DT_TRY(dt_data_read_all(file, &buf, &len));
    dt_status st = DT_OK;
    if (len == 0) {
        st = dt_error_set(DT_ERR_DATA, "%s: empty file (expected lines of " TSV_LINE ")", file);
        goto done;
    }
    const char *p = (const char *)buf, *end = p + len;
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3; /* UTF-8 byte order mark */
    size_t T = (size_t)ds->seq_len;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end;
        const char *next = nl ? nl + 1 : end;
        if (le > p && le[-1] == '\r') le--;
        if (le == p) {
            st = dt_error_set(DT_ERR_DATA, "%s:%zu: empty line (expected " TSV_LINE ")", file, line);
            goto done;
        }
        const char *tab = memchr(p, '\t', (size_t)(le - p));
        if (!tab) {
            st = dt_error_set(DT_ERR_DATA, "%s:%zu: no tab: expected " TSV_LINE, file, line);
            goto done;
        }
        long label = 0;
        int overflow = 0;
        char shown[160];
        if (!parse_label(p, tab, &label, &overflow)) {
            st = dt_error_set(DT_ERR_DATA,
                              "%s:%zu: label \"%s\" is not an integer (expected " TSV_LINE
                              " with an integer label in [0, %d))",
                              file, line, show_bytes(p, tab, shown, sizeof shown), num_labels);
            goto done;
        }
        if (overflow || label < 0 || label >= num_labels) {
            st = dt_error_set(DT_ERR_DATA,
                              "%s:%zu: label %s out of range [0, %d) (hint: model.num_labels is %d)",
                              file, line, show_bytes(p, tab, shown, sizeof shown), num_labels,
                              num_labels);
            goto done;
        }
        const char *text = tab + 1;
        size_t tlen = (size_t)(le - text);
        const char *nul = tok ? NULL : memchr(text, '\0', tlen);
        if (nul) {
            st = dt_error_set(DT_ERR_DATA,
                              "%s:%zu: NUL byte in the text at column %zu (the byte tokenizer uses 0 "
                              "as padding)",
                              file, line, (size_t)(nul - p) + 1);
            goto done;
        }
        st = tsv_reserve(ds, ds->num_samples + 1);
        if (st != DT_OK) goto done;
        int cut;
        st = dt_data_text_row(tok, text, tlen, ds->seq_len, ds->ids + ds->num_samples * T, &cut, &ds->bpe_ids,
                              &ds->bpe_cap);
        if (st != DT_OK) {
            dt_error_prefix("%s:%zu", file, line);
            goto done;
        }
        ds->num_truncated += (size_t)cut;
        ds->labels[ds->num_samples++] = (int32_t)label;
        p = next;
    }
done:
    free(buf);
    return st;
}

/* ---------------------------------------------------------------- chat, completion */

static dt_status open_sft(dt_dataset *ds, const file_list *fl, const dt_dataset_cfg *cfg, int chat) {
    if (!cfg->tokenizer)
        return dt_error_set(DT_ERR_CONFIG, "data.format %s needs the model's BPE tokenizer, but data.tokenizer is bytes",
                            chat ? "chat" : "completion");
    if (chat) DT_TRY(dt_sft_open_chat(cfg->tokenizer, &ds->chat));
    const dt_sft_cfg sc = {.chat = chat, .seq_len = cfg->seq_len, .train_on_all = cfg->train_on_all,
                           .tok = cfg->tokenizer, .tmpl = ds->chat};
    DT_TRY(dt_sft_new(&ds->sft, &sc));
    for (size_t i = 0; i < fl->n; i++) {
        unsigned char *buf;
        size_t len;
        DT_TRY(dt_data_read_all(fl->v[i], &buf, &len));
        dt_status st = dt_sft_read(ds->sft, fl->v[i], (const char *)buf, len);
        free(buf);
        DT_TRY(st);
    }
    if (cfg->packing) {
        DT_TRY(dt_sft_pack(ds->sft));
        ds->packed = 1;
    }
    ds->num_samples = dt_sft_size(ds->sft);
    dt_sft_stats stats;
    dt_sft_stats_get(ds->sft, &stats);
    ds->num_truncated = stats.cut;
    return DT_OK;
}

/* ---------------------------------------------------------------- dataset */

static dt_data_format detect_format(const char *file) {
    size_t n = strlen(file);
    if (n >= 4 && strcmp(file + n - 4, ".bin") == 0) return DT_FORMAT_TOKENS;
    if (n >= 7 && strcmp(file + n - 7, ".bin.gz") == 0) return DT_FORMAT_TOKENS;
    return DT_FORMAT_TSV;
}

static dt_status check_format(const file_list *fl, const dt_dataset_cfg *cfg, dt_data_format *out) {
    dt_data_format fmt = cfg->format;
    if (fmt == DT_FORMAT_AUTO) {
        fmt = detect_format(fl->v[0]);
        for (size_t i = 1; i < fl->n; i++) {
            if (detect_format(fl->v[i]) == fmt) continue;
            const char *tok = fmt == DT_FORMAT_TOKENS ? fl->v[0] : fl->v[i];
            const char *tsv = fmt == DT_FORMAT_TOKENS ? fl->v[i] : fl->v[0];
            return dt_error_set(DT_ERR_DATA,
                                "%s: mixed formats: %s is a token shard (.bin) but %s is tsv (hint: "
                                "keep one format per path; data.format auto reads .bin/.bin.gz "
                                "files as tokens and anything else as tsv)",
                                cfg->path, tok, tsv);
        }
    }
    const char *why_tsv = cfg->format == DT_FORMAT_AUTO
                              ? "data.format auto: the name does not end in .bin or .bin.gz"
                              : "data.format: tsv";
    const char *why_tok = cfg->format == DT_FORMAT_AUTO ? "data.format auto: the name ends in .bin"
                                                        : "data.format: tokens";
    if (cfg->num_labels == 0 && fmt == DT_FORMAT_TSV)
        return dt_error_set(DT_ERR_DATA,
                            "%s: data is tsv (%s), but model.num_labels is 0 and language modelling "
                            "reads token shards (hint: set model.num_labels to the number of classes "
                            "to classify, or make a shard with \"dtrain data tokenize\"; JSON lines of "
                            "conversations or prompts and completions: data.format chat or completion)",
                            fl->v[0], why_tsv);
    if (cfg->num_labels >= 2 && (fmt == DT_FORMAT_CHAT || fmt == DT_FORMAT_COMPLETION))
        return dt_error_set(DT_ERR_DATA, "%s: data.format %s trains a language model, but model.num_labels is %d",
                            fl->v[0], fmt == DT_FORMAT_CHAT ? "chat" : "completion", cfg->num_labels);
    if (cfg->num_labels >= 2 && fmt == DT_FORMAT_TOKENS)
        return dt_error_set(DT_ERR_DATA,
                            "%s: data is token shards (%s), but model.num_labels is %d and "
                            "classification reads " TSV_LINE
                            " lines (hint: set model.num_labels: 0 for language modelling, or "
                            "data.format: tsv)",
                            fl->v[0], why_tok, cfg->num_labels);
    *out = fmt;
    return DT_OK;
}

dt_status dt_dataset_open(dt_dataset **out, const dt_dataset_cfg *cfg) {
    *out = NULL;
    if (!cfg->path || !cfg->path[0])
        return dt_error_set(DT_ERR_CONFIG, "data path is empty (hint: set data.train_path)");
    if (cfg->seq_len < 1)
        return dt_error_set(DT_ERR_CONFIG, "data.seq_len: expected an integer >= 1, got %d", cfg->seq_len);
    if (cfg->num_labels < 0 || cfg->num_labels == 1)
        return dt_error_set(DT_ERR_CONFIG,
                            "model.num_labels: expected 0 (language modelling) or >= 2, got %d",
                            cfg->num_labels);
    if (cfg->vocab_size < 1)
        return dt_error_set(DT_ERR_CONFIG, "model.vocab_size: expected an integer >= 1, got %d",
                            cfg->vocab_size);
    DT_TRY(dt_tokenizer_check_model(cfg->tokenizer, cfg->vocab_size, cfg->num_labels));

    file_list fl = {0};
    dt_data_format fmt = DT_FORMAT_AUTO;
    dt_status st = list_files(cfg->path, &fl);
    if (st == DT_OK) st = check_format(&fl, cfg, &fmt);
    if (st != DT_OK) {
        file_list_free(&fl);
        return st;
    }
    dt_dataset *ds = calloc(1, sizeof *ds);
    if (!ds) {
        file_list_free(&fl);
        return dt_error_set(DT_ERR_NOMEM, "out of memory for the dataset");
    }
    ds->seq_len = cfg->seq_len;
    ds->num_files = fl.n;
    ds->classification = fmt == DT_FORMAT_TSV;
    if (fmt == DT_FORMAT_CHAT || fmt == DT_FORMAT_COMPLETION) {
        st = open_sft(ds, &fl, cfg, fmt == DT_FORMAT_CHAT);
    } else if (ds->classification) {
        for (size_t i = 0; i < fl.n && st == DT_OK; i++) st = read_tsv(ds, fl.v[i], cfg->num_labels, cfg->tokenizer);
    } else {
        st = open_tokens(ds, &fl, cfg);
    }
    file_list_free(&fl);
    if (st != DT_OK) {
        dt_dataset_free(ds);
        return st;
    }
    *out = ds;
    return DT_OK;
}

void dt_dataset_free(dt_dataset *ds) {
    if (!ds) return;
    dt_sft_free(ds->sft);
    dt_chat_free(ds->chat);
    free(ds->tok16);
    free(ds->tok32);
    free(ds->ids);
    free(ds->labels);
    free(ds->bpe_ids);
    free(ds);
}

size_t dt_dataset_size(const dt_dataset *ds) { return ds->num_samples; }
int dt_dataset_is_classification(const dt_dataset *ds) { return ds->classification; }
size_t dt_dataset_num_files(const dt_dataset *ds) { return ds->num_files; }
size_t dt_dataset_num_truncated(const dt_dataset *ds) { return ds->num_truncated; }

int dt_dataset_counted(const dt_dataset *ds, size_t i) {
    return ds->sft ? dt_sft_counted(ds->sft, i) : ds->classification ? 1 : ds->seq_len;
}

int dt_dataset_row_tokens(const dt_dataset *ds, size_t i) {
    return ds->sft ? dt_sft_tokens(ds->sft, i) : ds->seq_len + !ds->classification;
}

int dt_dataset_sft_stats(const dt_dataset *ds, dt_sft_stats *out) {
    if (ds->sft) dt_sft_stats_get(ds->sft, out);
    return ds->sft != NULL;
}

int dt_dataset_packed(const dt_dataset *ds) { return ds->packed; }

int dt_dataset_text_tokens(const dt_dataset *ds, size_t i) {
    return ds->sft ? dt_sft_text(ds->sft, i) : ds->classification ? dt_dataset_row_tokens(ds, i) : ds->seq_len;
}

void dt_dataset_get_pos(const dt_dataset *ds, size_t i, int *tokens, int *targets, int *pos) {
    if (ds->sft) {
        dt_sft_get(ds->sft, i, tokens, targets, pos);
        return;
    }
    dt_dataset_get(ds, i, tokens, targets);
    for (int t = 0; t < ds->seq_len; t++) pos[t] = t;
}

void dt_dataset_get(const dt_dataset *ds, size_t i, int *tokens, int *targets) {
    size_t T = (size_t)ds->seq_len;
    if (ds->sft) {
        dt_sft_get(ds->sft, i, tokens, targets, NULL);
        return;
    }
    if (ds->classification) {
        const uint16_t *row = ds->ids + i * T;
        for (size_t t = 0; t < T; t++) tokens[t] = row[t];
        targets[0] = ds->labels[i];
        return;
    }
    size_t off = i * T;
    if (ds->tok32) {
        for (size_t t = 0; t < T; t++) {
            tokens[t] = (int)ds->tok32[off + t];
            targets[t] = (int)ds->tok32[off + t + 1];
        }
    } else {
        for (size_t t = 0; t < T; t++) {
            tokens[t] = ds->tok16[off + t];
            targets[t] = ds->tok16[off + t + 1];
        }
    }
}

/* ---------------------------------------------------------------- sampler */

struct dt_sampler {
    dt_sampler_cfg cfg;
    size_t global_batch; /* G = world * b * accum */
    size_t steps;        /* floor(num_samples / G) */
    size_t *order;       /* (num_samples) permutation of cached_epoch; NULL when !shuffle */
    long cached_epoch;
    int have_order;
};

/* splitmix64 (Steele, Lea, Flood 2014). The epoch permutation is a Fisher-Yates shuffle
 * driven by a splitmix64 stream whose state starts at seed ^ mix64(epoch + golden); it
 * depends on nothing else, so every rank and every world size computes the same order. */
#define SPLITMIX_GOLDEN 0x9E3779B97F4A7C15ULL

static uint64_t mix64(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static uint64_t splitmix_next(uint64_t *s) {
    *s += SPLITMIX_GOLDEN;
    return mix64(*s);
}

/* Uniform in [0, n) without modulo bias (rejects the low (2^64 mod n) values). */
static uint64_t splitmix_below(uint64_t *s, uint64_t n) {
    uint64_t threshold = (0 - n) % n;
    for (;;) {
        uint64_t r = splitmix_next(s);
        if (r >= threshold) return r % n;
    }
}

static void epoch_permutation(size_t *order, size_t n, uint64_t seed, long epoch) {
    uint64_t s = seed ^ mix64((uint64_t)epoch + SPLITMIX_GOLDEN);
    for (size_t i = 0; i < n; i++) order[i] = i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)splitmix_below(&s, (uint64_t)i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}

dt_status dt_sampler_init(dt_sampler **out, const dt_sampler_cfg *cfg) {
    *out = NULL;
    if (cfg->world < 1 || cfg->rank < 0 || cfg->rank >= cfg->world || cfg->batch_per_worker < 1 ||
        cfg->accum < 1)
        return dt_error_set(DT_ERR_INTERNAL,
                            "dt_sampler_init: bad settings rank %d world %d batch_per_worker %d "
                            "accum %d (need 0 <= rank < world, batch and accum >= 1)",
                            cfg->rank, cfg->world, cfg->batch_per_worker, cfg->accum);
    size_t G;
    if (__builtin_mul_overflow((size_t)cfg->world, (size_t)cfg->batch_per_worker, &G) ||
        __builtin_mul_overflow(G, (size_t)cfg->accum, &G))
        return dt_error_set(DT_ERR_INTERNAL, "dt_sampler_init: global batch size overflows");
    dt_sampler *s = calloc(1, sizeof *s);
    if (!s) return dt_error_set(DT_ERR_NOMEM, "out of memory for the sampler");
    s->cfg = *cfg;
    s->global_batch = G;
    s->steps = cfg->num_samples / G;
    if (cfg->shuffle) {
        s->order = malloc((cfg->num_samples ? cfg->num_samples : 1) * sizeof *s->order);
        if (!s->order) {
            free(s);
            return dt_error_set(DT_ERR_NOMEM, "out of memory for the order of %zu samples",
                                cfg->num_samples);
        }
    }
    *out = s;
    return DT_OK;
}

void dt_sampler_free(dt_sampler *s) {
    if (!s) return;
    free(s->order);
    free(s);
}

size_t dt_sampler_steps_per_epoch(const dt_sampler *s) { return s->steps; }

size_t dt_sampler_global_batch(const dt_sampler *s) { return s->global_batch; }

size_t dt_sampler_steps_from(const dt_sampler *s, size_t cursor) {
    return cursor >= s->cfg.num_samples ? 0 : (s->cfg.num_samples - cursor) / s->global_batch;
}

void dt_sampler_batch(dt_sampler *s, long epoch, size_t step, int micro, size_t *idx) {
    dt_sampler_batch_at(s, epoch, step * s->global_batch, micro, idx);
}

/* idx[0..k) = the epoch's order at positions base, base + 1, ... */
static void order_at(dt_sampler *s, long epoch, size_t base, size_t k, size_t *idx) {
    size_t n = s->cfg.num_samples;
    if (s->order && (!s->have_order || s->cached_epoch != epoch)) {
        epoch_permutation(s->order, n, s->cfg.seed, epoch);
        s->cached_epoch = epoch;
        s->have_order = 1;
    }
    for (size_t i = 0; i < k; i++) {
        size_t pos = n ? (base + i) % n : 0; /* in range for valid step/micro; never reads out of bounds */
        idx[i] = s->order ? s->order[pos] : pos;
    }
}

void dt_sampler_batch_at(dt_sampler *s, long epoch, size_t cursor, int micro, size_t *idx) {
    size_t b = (size_t)s->cfg.batch_per_worker, world = (size_t)s->cfg.world;
    order_at(s, epoch, cursor + (size_t)micro * world * b + (size_t)s->cfg.rank * b, b, idx);
}

void dt_sampler_global_at(dt_sampler *s, long epoch, size_t cursor, size_t *idx) {
    order_at(s, epoch, cursor, s->global_batch, idx);
}

/* ---------------------------------------------------------------- evaluation */

size_t dt_eval_num_batches(size_t n, int world, int b) {
    size_t E = (size_t)world * (size_t)b;
    return E ? (n + E - 1) / E : 0;
}

void dt_eval_slice(size_t n, size_t j, int rank, int world, int b, size_t *start, int *count) {
    size_t s = j * (size_t)world * (size_t)b + (size_t)rank * (size_t)b;
    if (s >= n) {
        *start = n;
        *count = 0;
        return;
    }
    size_t c = n - s < (size_t)b ? n - s : (size_t)b;
    *start = s;
    *count = (int)c;
}

/* ---------------------------------------------------------------- shard writing */

/* Writes a shard from either 32-bit tokens or bytes (exactly one non-NULL): version 1 (uint16
 * tokens), or with `wide` version 7 (uint32 tokens, for vocabularies past 65536). */
static dt_status write_shard(const char *path, const uint32_t *t32, const unsigned char *t8, size_t n, int wide) {
    if (n == 0)
        return dt_error_set(DT_ERR_DATA, "%s: no tokens to write (a shard needs at least 1)", path);
    if (n > (size_t)INT32_MAX)
        return dt_error_set(DT_ERR_DATA, "%s: %zu tokens do not fit one shard (at most %d)", path, n,
                            INT32_MAX);
    if (t32 && !wide) {
        for (size_t i = 0; i < n; i++)
            if (t32[i] >= 65536)
                return dt_error_set(DT_ERR_DATA,
                                    "%s: token %u at index %zu does not fit a version-1 shard "
                                    "(uint16 tokens must be < 65536)",
                                    path, t32[i], i);
    }
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 48);
    if (!tmp) return dt_error_set(DT_ERR_NOMEM, "out of memory writing %s", path);
    int fd; /* a fresh PATH.tmp.PID[.K]: a file or link already there is never followed or truncated */
    dt_status cst = dt_file_create_temp(path, tmp, plen + 48, &fd);
    FILE *fp = cst == DT_OK ? dt_file_stream(fd, "wb", tmp) : NULL;
    if (!fp) {
        free(tmp);
        return cst != DT_OK ? cst : DT_ERR_NOMEM;
    }
    unsigned char buf[1 << 15];
    memset(buf, 0, SHARD_HEADER_BYTES);
    put_le32(buf, wide ? DT_SHARD_MAGIC_V2 : DT_SHARD_MAGIC_V1);
    put_le32(buf + 4, wide ? 7 : 1);
    put_le32(buf + 8, (uint32_t)n);
    int ok = fwrite(buf, 1, SHARD_HEADER_BYTES, fp) == SHARD_HEADER_BYTES;
    const size_t width = wide ? 4 : 2;
    for (size_t i = 0; ok && i < n;) {
        size_t m = 0;
        for (; i < n && m + width <= sizeof buf; i++, m += width) {
            uint32_t v = t32 ? t32[i] : t8[i];
            for (size_t b = 0; b < width; b++) buf[m + b] = (unsigned char)(v >> (8 * b));
        }
        ok = fwrite(buf, 1, m, fp) == m;
    }
    if (ok) ok = fflush(fp) == 0 && fsync(fileno(fp)) == 0;
    int err = errno;
    if (fclose(fp) != 0 && ok) {
        ok = 0;
        err = errno;
    }
    dt_status st = ok ? dt_file_commit(tmp, path) : dt_error_set(DT_ERR_IO, "%s: write failed: %s", path, strerror(err));
    if (!ok) unlink(tmp);
    free(tmp);
    return st;
}

dt_status dt_shard_write(const char *path, const uint32_t *tokens, size_t n) {
    return write_shard(path, tokens, NULL, n, 0);
}

dt_status dt_data_tokenize(const char *tokenizer, const char *in_path, const char *out_path, size_t *n_tokens) {
    unsigned char *buf;
    size_t len;
    if (n_tokens) *n_tokens = 0;
    DT_TRY(dt_file_check_output("IN", in_path, "OUT", out_path));
    DT_TRY(dt_data_read_all(in_path, &buf, &len));
    if (len == 0) {
        free(buf);
        return dt_error_set(DT_ERR_DATA, "%s: empty input (nothing to tokenize)", in_path);
    }
    if (strcmp(tokenizer, "bytes") == 0) { /* one token per byte, as always */
        dt_status st = write_shard(out_path, NULL, buf, len, 0);
        free(buf);
        if (st == DT_OK && n_tokens) *n_tokens = len;
        return st;
    }
    dt_tokenizer *tok;
    dt_status st = dt_tokenizer_open(tokenizer, &tok);
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    const int eot = st == DT_OK ? dt_tokenizer_eot(tok) : -1;
    if (st == DT_OK && eot >= 0) { /* the document starts with the end-of-text token, as llm.c's shards do */
        cap = 1024;
        if ((ids = malloc(cap * sizeof *ids)) == NULL) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
        else ids[n++] = (uint32_t)eot;
    }
    if (st == DT_OK && (st = dt_tokenizer_encode(tok, (const char *)buf, len, &ids, &n, &cap)) != DT_OK)
        dt_error_prefix("%s", in_path);
    if (st == DT_OK) st = write_shard(out_path, ids, NULL, n, dt_tokenizer_vocab_size(tok) > 65536);
    if (st == DT_OK && n_tokens) *n_tokens = n;
    free(ids);
    free(buf);
    dt_tokenizer_free(tok);
    return st;
}

/* data[0..len) into path through a fresh temporary file, fsynced, renamed onto it. */
static dt_status write_file_atomic(const char *path, const char *data, size_t len) {
    char tmp[DT_PATH_MAX + 48];
    int fd;
    DT_TRY(dt_file_create_temp(path, tmp, sizeof tmp, &fd));
    int ok = dt_file_write_all(fd, data, len) == 0 && fsync(fd) == 0;
    int err = errno;
    if (close(fd) != 0 && ok) ok = 0, err = errno;
    if (ok) return dt_file_commit(tmp, path);
    unlink(tmp);
    return dt_error_set(DT_ERR_IO, "%s: cannot write %s: %s", path, tmp, strerror(err));
}

dt_status dt_data_detokenize(const char *tokenizer, const char *in_path, const char *out_path, size_t *n_bytes) {
    DT_TRY(dt_file_check_output("IN", in_path, "OUT", out_path));
    dt_tokenizer *tok;
    DT_TRY(dt_tokenizer_open(tokenizer, &tok));
    dt_dataset ds;
    memset(&ds, 0, sizeof ds);
    unsigned char *chunk = malloc(READ_CHUNK);
    uint32_t mx = 0, *ids = NULL;
    char *text = NULL;
    size_t len = 0;
    dt_status st = chunk ? read_shard(&ds, in_path, INT32_MAX, chunk, &mx) : dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK && !ds.tok32 && !(ids = malloc(ds.num_tokens * sizeof *ids))) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK && !ds.tok32)
        for (size_t i = 0; i < ds.num_tokens; i++) ids[i] = ds.tok16[i];
    if (st == DT_OK && (st = dt_tokenizer_decode(tok, ds.tok32 ? ds.tok32 : ids, ds.num_tokens, &text, &len)) != DT_OK)
        dt_error_prefix("%s", in_path);
    if (st == DT_OK) st = write_file_atomic(out_path, text, len);
    if (st == DT_OK && n_bytes) *n_bytes = len;
    free(text);
    free(ids);
    free(chunk);
    free(ds.tok16);
    free(ds.tok32);
    dt_tokenizer_free(tok);
    return st;
}
