/* answers.c — exact match of greedy answers (include/dtrain/answers.h). */
#include "dtrain/answers.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/chat.h"
#include "dtrain/clock.h"
#include "dtrain/data.h"
#include "dtrain/generate.h"
#include "dtrain/sft.h"

#define SHOWN_MISSES 3

typedef struct text_buf {
    char *p;
    size_t n, cap;
    int failed;
} text_buf;

static void collect(void *user, const char *bytes, size_t n) {
    text_buf *b = user;
    if (b->failed || n == 0) return;
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? 2 * b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        char *p = realloc(b->p, cap);
        if (!p) {
            b->failed = 1;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->n, bytes, n);
    b->n += n;
    b->p[b->n] = '\0';
}

/* s[0..n) without leading and trailing white space: *start, returned length */
static size_t trimmed(const char *s, size_t n, const char **start) {
    while (n && isspace((unsigned char)*s)) s++, n--;
    while (n && isspace((unsigned char)s[n - 1])) n--;
    *start = s;
    return n;
}

static int same_answer(const char *a, size_t na, const char *b) {
    const char *x, *y;
    const size_t lx = trimmed(a, na, &x), ly = trimmed(b, strlen(b), &y);
    return lx == ly && memcmp(x, y, lx) == 0;
}

/* s[0..n) on one line, at most 200 bytes of it: newlines, tabs, quotes and backslashes escaped */
static void put_escaped(FILE *f, const char *s, size_t n) {
    for (size_t i = 0; i < n && i < 200; i++) {
        const char c = s[i];
        if (c == '\n') fputs("\\n", f);
        else if (c == '\t') fputs("\\t", f);
        else if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else fputc(c, f);
    }
    if (n > 200) fputs("...", f);
}

/* One question: the greedy answer into buf; whether it is the reference. */
static dt_status ask(dt_infer *s, const dt_sft_question *q, int stop_id, text_buf *buf, int *exact) {
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    DT_TRY(dt_tokenizer_encode(s->tok, q->answer, strlen(q->answer), &ids, &n, &cap));
    free(ids);
    dt_gen_opts go = {.prompt = q->prompt, .prompt_len = strlen(q->prompt), .max_new_tokens = (int)n + 16,
                      .temperature = 0, .top_k = 0, .top_p = 1, .bare = 1, .stop_id = stop_id};
    dt_gen_result r;
    buf->n = 0;
    if (buf->p) buf->p[0] = '\0';
    DT_TRY(dt_generate(s->model, s->tok, &go, collect, buf, &r));
    if (buf->failed) return dt_error_set(DT_ERR_NOMEM, "out of memory collecting a generated answer");
    *exact = same_answer(buf->p ? buf->p : "", buf->n, q->answer);
    return DT_OK;
}

dt_status dt_answers_exact_match(dt_infer *s, const char *path, long limit, FILE *show, dt_answers_result *r) {
    memset(r, 0, sizeof *r);
    const int chat = s->cfg.data.format == DT_FORMAT_CHAT;
    if (!s->tok) return dt_error_set(DT_ERR_INTERNAL, "exact match without a BPE tokenizer");
    dt_chat *tmpl = NULL;
    dt_sft *sft = NULL;
    if (chat) DT_TRY(dt_sft_open_chat(s->tok, &tmpl));
    const dt_sft_cfg sc = {.chat = chat, .seq_len = s->cfg.data.seq_len, .tok = s->tok, .tmpl = tmpl};
    unsigned char *buf = NULL;
    size_t len = 0, n = 0;
    dt_sft_question *q = NULL;
    dt_status st = dt_sft_new(&sft, &sc);
    if (st == DT_OK) st = dt_data_read_all(path, &buf, &len);
    if (st == DT_OK) st = dt_sft_questions(sft, path, (const char *)buf, len, &q, &n);
    const int stop_id = chat ? dt_tokenizer_token_id(s->tok, dt_chat_eos(tmpl)) : -1;
    const double t0 = dt_clock_now();
    text_buf out = {0};
    for (size_t i = 0; st == DT_OK && i < n && (limit <= 0 || (long)i < limit); i++) {
        int exact = 0;
        st = ask(s, &q[i], stop_id, &out, &exact);
        if (st != DT_OK) {
            dt_error_prefix("%s: question %zu", path, i + 1);
            break;
        }
        r->asked++;
        r->exact += exact;
        if (!exact && show && r->asked - r->exact <= SHOWN_MISSES) {
            fprintf(show, "not matched: question %zu: expected \"", i + 1);
            put_escaped(show, q[i].answer, strlen(q[i].answer));
            fputs("\", generated \"", show);
            put_escaped(show, out.p ? out.p : "", out.n);
            fputs("\"\n", show);
        }
    }
    r->seconds = dt_clock_now() - t0;
    free(out.p);
    dt_sft_questions_free(q, n);
    free(buf);
    dt_sft_free(sft);
    dt_chat_free(tmpl);
    return st;
}
