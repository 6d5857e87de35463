/* tboard.c — TensorBoard event files: TFRecord framing and the few protobuf fields of
 * tensorflow.Event / Summary that scalars need, encoded by hand (include/dtrain/tboard.h). */
#include "dtrain/tboard.h"

#include "dtrain/file.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

struct dt_tb {
    FILE *f;
    char path[4096];
};

/* ---- CRC32C, reflected polynomial 0x82F63B78, table-driven (no Debian package ships it) */
static uint32_t crc_table[256];
static int crc_ready;

static void crc_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
    crc_ready = 1;
}

uint32_t dt_crc32c(const void *data, size_t n) {
    if (!crc_ready) crc_init();
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

static uint32_t masked(uint32_t c) { return ((c >> 15) | (c << 17)) + 0xa282ead8u; }

/* ---- protobuf wire format: the three encodings we need */
typedef struct buf {
    unsigned char *b; /* cap bytes: a local array, or for a text summary the heap */
    size_t n, cap;
    int overflow;
} buf;

#define BUF(name, storage) buf name = {.b = (storage), .n = 0, .cap = sizeof(storage), .overflow = 0}

static void put(buf *o, const void *p, size_t n) {
    if (o->n + n > o->cap) {
        o->overflow = 1;
        return;
    }
    memcpy(o->b + o->n, p, n);
    o->n += n;
}

static void put_varint(buf *o, uint64_t v) {
    unsigned char t[10];
    size_t k = 0;
    do {
        t[k] = (unsigned char)(v & 0x7F);
        v >>= 7;
        if (v) t[k] |= 0x80;
        k++;
    } while (v);
    put(o, t, k);
}

static void put_le(buf *o, uint64_t v, int bytes) {
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    put(o, t, (size_t)bytes);
}

/* field `num` of wire type `type` (0 varint, 1 fixed64, 2 length-delimited, 5 fixed32) */
static void put_key(buf *o, int num, int type) { put_varint(o, (uint64_t)(num << 3 | type)); }

static void put_bytes(buf *o, int num, const void *p, size_t n) {
    put_key(o, num, 2);
    put_varint(o, n);
    put(o, p, n);
}

static double wall_time(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* Event header: wall_time (1, double) and step (2, int64) */
static void event_head(buf *o, long step) {
    double t = wall_time();
    uint64_t bits;
    memcpy(&bits, &t, sizeof bits);
    put_key(o, 1, 1);
    put_le(o, bits, 8);
    put_key(o, 2, 0);
    put_varint(o, (uint64_t)(int64_t)step);
}

static dt_status write_record(dt_tb *tb, const buf *ev) {
    if (ev->overflow) return dt_error_set(DT_ERR_INTERNAL, "%s: event too large", tb->path);
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)ev->n >> (8 * i));
    uint32_t c1 = masked(dt_crc32c(len, 8)), c2 = masked(dt_crc32c(ev->b, ev->n));
    unsigned char t1[4], t2[4];
    for (int i = 0; i < 4; i++) {
        t1[i] = (unsigned char)(c1 >> (8 * i));
        t2[i] = (unsigned char)(c2 >> (8 * i));
    }
    int ok = fwrite(len, 1, 8, tb->f) == 8 && fwrite(t1, 1, 4, tb->f) == 4 && fwrite(ev->b, 1, ev->n, tb->f) == ev->n &&
             fwrite(t2, 1, 4, tb->f) == 4 && fflush(tb->f) == 0;
    if (!ok) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", tb->path, strerror(errno));
    return DT_OK;
}

dt_status dt_tb_open(dt_tb **out, const char *run_dir) {
    *out = NULL;
    dt_tb *tb = dt_calloc(1, sizeof *tb, "TensorBoard writer");
    if (!tb) return DT_ERR_NOMEM;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    snprintf(tb->path, sizeof tb->path, "%s/events.out.tfevents.%ld.%s.%ld.dtrain", run_dir, (long)time(NULL), host,
             (long)getpid());
    int fd; /* a new file: a file or link already of that name is never followed or truncated */
    dt_status st = dt_file_create_new(tb->path, &fd);
    if (st == DT_OK && !(tb->f = dt_file_stream(fd, "wb", tb->path))) st = DT_ERR_NOMEM;
    if (st != DT_OK) {
        free(tb);
        return st;
    }
    unsigned char evb[256];
    BUF(ev, evb);
    event_head(&ev, 0);
    static const char version[] = "brain.Event:2";
    put_bytes(&ev, 3, version, sizeof version - 1);
    st = write_record(tb, &ev);
    if (st != DT_OK) {
        dt_tb_close(tb);
        return st;
    }
    *out = tb;
    return DT_OK;
}

void dt_tb_close(dt_tb *tb) {
    if (!tb) return;
    if (tb->f) fclose(tb->f);
    free(tb);
}

const char *dt_tb_path(const dt_tb *tb) { return tb->path; }

dt_status dt_tb_scalar(dt_tb *tb, const char *tag, long step, double value) {
    size_t tl = strlen(tag);
    if (tl > 256) return dt_error_set(DT_ERR_INTERNAL, "TensorBoard tag too long: %.40s...", tag);
    unsigned char vb[512], sb[512], eb[600];
    BUF(val, vb);
    BUF(sum, sb);
    BUF(ev, eb);
    put_bytes(&val, 1, tag, tl); /* Summary.Value.tag */
    float f = (float)value;
    uint32_t fb;
    memcpy(&fb, &f, sizeof fb);
    put_key(&val, 2, 5); /* Summary.Value.simple_value */
    put_le(&val, fb, 4);
    put_bytes(&sum, 1, val.b, val.n); /* Summary.value */
    event_head(&ev, step);
    put_bytes(&ev, 5, sum.b, sum.n); /* Event.summary */
    return write_record(tb, &ev);
}

dt_status dt_tb_text(dt_tb *tb, const char *tag, long step, const char *text) {
    size_t tl = strlen(tag), xl = strlen(text);
    if (tl > 256) return dt_error_set(DT_ERR_INTERNAL, "TensorBoard tag too long: %.40s...", tag);
    size_t cap = xl + tl + 256; /* the text, the tag and the few headers around them */
    unsigned char *mem = dt_malloc(4 * cap, "TensorBoard text event");
    if (!mem) return DT_ERR_NOMEM;
    buf tensor = {mem, 0, cap, 0}, val = {mem + cap, 0, cap, 0}, sum = {mem + 2 * cap, 0, cap, 0},
        ev = {mem + 3 * cap, 0, cap, 0};
    put_key(&tensor, 1, 0); /* TensorProto.dtype = DT_STRING */
    put_varint(&tensor, 7);
    put_bytes(&tensor, 2, "", 0);        /* tensor_shape: a scalar */
    put_bytes(&tensor, 8, text, xl);     /* string_val */
    static const unsigned char plugin[] = {0x0a, 0x06, 0x0a, 0x04, 't', 'e', 'x', 't'}; /* plugin_data{plugin_name} */
    put_bytes(&val, 1, tag, tl);                      /* Summary.Value.tag */
    put_bytes(&val, 9, plugin, sizeof plugin);        /* Summary.Value.metadata */
    put_bytes(&val, 8, tensor.b, tensor.n);           /* Summary.Value.tensor */
    put_bytes(&sum, 1, val.b, val.n);                 /* Summary.value */
    event_head(&ev, step);
    put_bytes(&ev, 5, sum.b, sum.n);                  /* Event.summary */
    dt_status st = write_record(tb, &ev);
    free(mem);
    return st;
}
