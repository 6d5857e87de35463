/* sft.c — supervised fine-tuning examples: chat and prompt/completion JSON lines into token
 * rows with the tokens the loss counts (include/dtrain/sft.h).
 *
 * Every example is kept as its ids (cut to T + 1) and one flag a token: whether it is part of
 * the answer. Which tokens are the answer's is decided on the whole rendered text's encoding,
 * never on pieces encoded apart (a piece boundary can fall inside a token): a chat token is the
 * answer's when its bytes overlap an answer's span of the rendered text (as transformers'
 * assistant mask: the tokens from the one holding the span's first byte to the one holding its
 * last), found by decoding the ids one by one (byte-level BPE spells the text back exactly,
 * unless a normalizer changed it: refused). */
#include "dtrain/sft.h"

#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SFT_CHAT_LINE "{\"messages\": [{\"role\": \"user\", \"content\": \"...\"}, {\"role\": \"assistant\", ...}]}"
#define SFT_COMPLETION_LINE "{\"prompt\": \"...\", \"completion\": \"...\"}"

struct dt_sft {
    dt_sft_cfg cfg;
    int eot;            /* the end-of-text id: padding */
    char *eot_text;     /* its text: a completion's end */
    size_t n, cap;      /* examples */
    size_t *off;        /* (n + 1) example i's ids are ids[off[i], off[i+1]) */
    int *counted;       /* (n) targets that count in row i */
    uint32_t *ids;      /* (off[n]) */
    unsigned char *ans; /* (off[n]) 1: the token is the answer's */
    size_t ids_cap;
    dt_sft_stats stats;
    uint32_t *enc;      /* one example's ids while reading */
    size_t enc_cap;
    /* packed (dt_sft_pack): row r holds examples ex[row[r] .. row[r+1]) */
    size_t n_rows, *row, *ex;
};

dt_status dt_sft_new(dt_sft **out, const dt_sft_cfg *cfg) {
    *out = NULL;
    int eot = cfg->tok ? dt_tokenizer_eot(cfg->tok) : -1;
    /* a chat model's tokenizer without one (Llama 3's: many special tokens, no <|endoftext|>): its
     * template's end of turn pads the rows */
    if (cfg->tok && eot < 0 && cfg->chat && cfg->tmpl) eot = dt_tokenizer_token_id(cfg->tok, dt_chat_eos(cfg->tmpl));
    if (!cfg->tok || eot < 0)
        return dt_error_set(DT_ERR_CONFIG, "data.tokenizer %s has no end-of-text token to end answers and pad rows with "
                            "(data.format chat and completion need the model's BPE tokenizer.json)",
                            cfg->tok ? dt_tokenizer_name(cfg->tok) : "bytes");
    if (cfg->chat && !cfg->tmpl) return dt_error_set(DT_ERR_INTERNAL, "data.format chat without a chat template");
    dt_sft *s = calloc(1, sizeof *s);
    if (!s) return dt_error_set(DT_ERR_NOMEM, "out of memory for the examples");
    s->cfg = *cfg;
    s->eot = eot;
    const uint32_t id = (uint32_t)eot;
    size_t len;
    dt_status st = dt_tokenizer_decode(cfg->tok, &id, 1, &s->eot_text, &len);
    if (st == DT_OK) st = (s->off = calloc(1, sizeof *s->off)) ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (st != DT_OK) {
        dt_sft_free(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

void dt_sft_free(dt_sft *s) {
    if (!s) return;
    free(s->eot_text);
    free(s->off);
    free(s->counted);
    free(s->ids);
    free(s->ans);
    free(s->enc);
    free(s->row);
    free(s->ex);
    free(s);
}

size_t dt_sft_size(const dt_sft *s) { return s->row ? s->n_rows : s->n; }
static void padding(const dt_sft *s, double *unpacked, double *packed);
void dt_sft_stats_get(const dt_sft *s, dt_sft_stats *out) {
    *out = s->stats;
    out->rows = dt_sft_size(s);
    padding(s, &out->padding, &out->padding_packed);
}

/* room for one more example of up to k ids */
static dt_status reserve(dt_sft *s, size_t k) {
    if (s->n + 1 >= s->cap) {
        const size_t cap = s->cap ? 2 * s->cap : 256;
        size_t *off = realloc(s->off, (cap + 1) * sizeof *off);
        if (off) s->off = off;
        int *counted = off ? realloc(s->counted, cap * sizeof *counted) : NULL;
        if (!counted) return dt_error_set(DT_ERR_NOMEM, "out of memory for the examples");
        s->counted = counted;
        s->cap = cap;
    }
    const size_t need = s->off[s->n] + k;
    if (need > s->ids_cap) {
        size_t cap = s->ids_cap ? s->ids_cap : 4096;
        while (cap < need) cap *= 2;
        uint32_t *ids = realloc(s->ids, cap * sizeof *ids);
        if (ids) s->ids = ids;
        unsigned char *ans = ids ? realloc(s->ans, cap) : NULL;
        if (!ans) return dt_error_set(DT_ERR_NOMEM, "out of memory for the examples' tokens");
        s->ans = ans;
        s->ids_cap = cap;
    }
    return DT_OK;
}

/* Appends the example in s->enc[0..n), token k the answer's when ans[k]; cut to T + 1. */
static dt_status append(dt_sft *s, size_t n, const unsigned char *ans) {
    const size_t keep = n < (size_t)s->cfg.seq_len + 1 ? n : (size_t)s->cfg.seq_len + 1;
    DT_TRY(reserve(s, keep));
    const size_t o = s->off[s->n];
    int counted = 0;
    for (size_t k = 0; k < keep; k++) {
        s->ids[o + k] = s->enc[k];
        s->ans[o + k] = s->cfg.train_on_all || ans[k];
        if (k > 0) counted += s->ans[o + k];
    }
    s->stats.examples++;
    s->stats.tokens += n;
    s->stats.cut += n > keep;
    if (counted == 0) { /* its answer starts past T: nothing to learn, and a batch of such would divide by 0 */
        s->stats.no_answer++;
        return DT_OK;
    }
    s->counted[s->n] = counted;
    s->off[++s->n] = o + keep;
    s->stats.counted += (size_t)counted;
    return DT_OK;
}

/* obj[key] as a string, or DT_ERR_DATA naming the line and what was expected */
static dt_status get_str(json_t *obj, const char *key, const char *where, const char *file, size_t line,
                         const char *expect, const char **out) {
    json_t *j = json_object_get(obj, key);
    if (json_is_string(j)) {
        *out = json_string_value(j);
        return DT_OK;
    }
    return dt_error_set(DT_ERR_DATA, "%s:%zu: %s%s: expected a string, got %s (expected lines of %s)", file, line, where,
                        key, !j ? "nothing" : json_is_null(j) ? "null" : json_is_object(j) ? "an object"
                                              : json_is_array(j) ? "an array" : "a number or a boolean", expect);
}

/* The answer's tokens of a rendered conversation: those that overlap a span. The ids must spell
 * the text back byte for byte. */
static dt_status mark_answers(dt_sft *s, const char *text, size_t len, size_t n, const size_t *spans, int n_spans,
                              unsigned char *ans, const char *file, size_t line) {
    size_t at = 0;
    int sp = 0;
    for (size_t k = 0; k < n; k++) {
        char *piece;
        size_t plen;
        DT_TRY(dt_tokenizer_decode(s->cfg.tok, &s->enc[k], 1, &piece, &plen));
        const int same = at + plen <= len && memcmp(text + at, piece, plen) == 0;
        free(piece);
        if (!same)
            return dt_error_set(DT_ERR_DATA, "%s:%zu: data.tokenizer %s does not spell the rendered conversation back "
                                "at byte %zu (its normalizer changes the text), so the answer's tokens cannot be told "
                                "apart (hint: write the text in the normalizer's form, e.g. NFC)", file, line,
                                dt_tokenizer_name(s->cfg.tok), at);
        while (sp < n_spans && spans[2 * sp + 1] <= at) sp++; /* spans that end before this token */
        ans[k] = sp < n_spans && spans[2 * sp] < at + plen;      /* it overlaps the next one */
        at += plen;
    }
    if (at != len)
        return dt_error_set(DT_ERR_DATA, "%s:%zu: data.tokenizer %s spells %zu of the rendered conversation's %zu bytes",
                            file, line, dt_tokenizer_name(s->cfg.tok), at, len);
    return DT_OK;
}

static dt_status encode(dt_sft *s, const char *text, size_t len, size_t *n, const char *file, size_t line) {
    *n = 0;
    dt_status st = dt_tokenizer_encode(s->cfg.tok, text, len, &s->enc, n, &s->enc_cap);
    if (st != DT_OK) dt_error_prefix("%s:%zu", file, line);
    return st;
}

/* A line's messages into *out (n of them, malloc'ed; the strings are o's); *answers: how many are
 * the assistant's. */
static dt_status messages(json_t *o, const char *file, size_t line, dt_chat_msg **out, size_t *n_out, int *answers) {
    json_t *msgs = json_object_get(o, "messages");
    const size_t n = json_array_size(msgs);
    *out = NULL;
    *answers = 0;
    if (!json_is_array(msgs) || n == 0)
        return dt_error_set(DT_ERR_DATA, "%s:%zu: messages: expected a non-empty array of messages (expected lines of "
                            "%s)", file, line, SFT_CHAT_LINE);
    if (n > 100000) return dt_error_set(DT_ERR_DATA, "%s:%zu: messages: more than 100000", file, line);
    dt_chat_msg *m = calloc(n, sizeof *m);
    dt_status st = m ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; i < n && st == DT_OK; i++) {
        json_t *msg = json_array_get(msgs, i);
        char where[64];
        snprintf(where, sizeof where, "messages[%zu].", i);
        if (!json_is_object(msg)) {
            st = dt_error_set(DT_ERR_DATA, "%s:%zu: messages[%zu]: expected an object with role and content "
                              "(expected lines of %s)", file, line, i, SFT_CHAT_LINE);
            break;
        }
        st = get_str(msg, "role", where, file, line, SFT_CHAT_LINE, &m[i].role);
        if (st == DT_OK) st = get_str(msg, "content", where, file, line, SFT_CHAT_LINE, &m[i].content);
        if (st == DT_OK && strcmp(m[i].role, "system") && strcmp(m[i].role, "user") && strcmp(m[i].role, "assistant"))
            st = dt_error_set(DT_ERR_DATA, "%s:%zu: messages[%zu].role: expected system, user or assistant, got \"%.40s\"",
                              file, line, i, m[i].role);
        *answers += st == DT_OK && strcmp(m[i].role, "assistant") == 0;
    }
    if (st != DT_OK) {
        free(m);
        return st;
    }
    *out = m;
    *n_out = n;
    return DT_OK;
}

static dt_status chat_line(dt_sft *s, json_t *o, const char *file, size_t line) {
    dt_chat_msg *m;
    size_t n;
    int answers;
    DT_TRY(messages(o, file, line, &m, &n, &answers));
    size_t *spans = calloc(2 * n, sizeof *spans);
    unsigned char *ans = NULL;
    char *text = NULL;
    dt_status st = spans ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK && !answers && !s->cfg.train_on_all)
        st = dt_error_set(DT_ERR_DATA, "%s:%zu: messages: no assistant message, so nothing of it would count in the "
                          "loss (data.train_on: assistant) (hint: data.train_on: all trains on the whole text)",
                          file, line);
    int n_spans = 0;
    size_t len = 0, k = 0;
    if (st == DT_OK) st = dt_chat_render_answers(s->cfg.tmpl, m, (int)n, &text, spans, &n_spans);
    if (st == DT_OK) st = encode(s, text, len = strlen(text), &k, file, line);
    if (st == DT_OK) st = (ans = malloc(k ? k : 1)) ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
    if (st == DT_OK) st = mark_answers(s, text, len, k, spans, n_spans, ans, file, line);
    if (st == DT_OK) st = append(s, k, ans);
    free(ans);
    free(text);
    free(spans);
    free(m);
    return st;
}

static dt_status completion_line(dt_sft *s, json_t *o, const char *file, size_t line) {
    const char *prompt, *completion;
    DT_TRY(get_str(o, "prompt", "", file, line, SFT_COMPLETION_LINE, &prompt));
    DT_TRY(get_str(o, "completion", "", file, line, SFT_COMPLETION_LINE, &completion));
    if (!completion[0])
        return dt_error_set(DT_ERR_DATA, "%s:%zu: completion: empty (expected lines of %s)", file, line,
                            SFT_COMPLETION_LINE);
    const size_t pl = strlen(prompt), cl = strlen(completion), el = strlen(s->eot_text);
    const int add_eot = cl < el || strcmp(completion + cl - el, s->eot_text) != 0;
    char *text = malloc(pl + cl + el + 1);
    if (!text) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    memcpy(text, prompt, pl);
    memcpy(text + pl, completion, cl);
    memcpy(text + pl + cl, s->eot_text, add_eot ? el : 0);
    const size_t len = pl + cl + (add_eot ? el : 0);
    size_t np = 0, k = 0;
    unsigned char *ans = NULL;
    dt_status st = encode(s, prompt, pl, &np, file, line); /* the prompt's own length, as TRL's mask */
    if (st == DT_OK) st = encode(s, text, len, &k, file, line);
    if (st == DT_OK) st = (ans = malloc(k ? k : 1)) ? DT_OK : dt_error_set(DT_ERR_NOMEM, "out of memory");
    for (size_t i = 0; st == DT_OK && i < k; i++) ans[i] = i >= np;
    if (st == DT_OK) st = append(s, k, ans);
    free(ans);
    free(text);
    return st;
}

/* fn(user, object, file, line) for every line's JSON object, in order; the first failure stops */
typedef dt_status (*line_fn)(void *user, json_t *o, const char *file, size_t line);

static dt_status for_lines(int chat, const char *file, const char *buf, size_t len, line_fn fn, void *user) {
    const char *p = buf, *end = buf + len;
    const char *expect = chat ? SFT_CHAT_LINE : SFT_COMPLETION_LINE;
    if (len == 0) return dt_error_set(DT_ERR_DATA, "%s: empty file (expected lines of %s)", file, expect);
    if (len >= 3 && memcmp(p, "\xEF\xBB\xBF", 3) == 0) p += 3;
    for (size_t line = 1; p < end; line++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl ? nl : end, *next = nl ? nl + 1 : end;
        if (le > p && le[-1] == '\r') le--;
        if (le == p) return dt_error_set(DT_ERR_DATA, "%s:%zu: empty line (expected lines of %s)", file, line, expect);
        json_error_t je;
        json_t *o = json_loadb(p, (size_t)(le - p), JSON_REJECT_DUPLICATES, &je);
        if (!o)
            return dt_error_set(DT_ERR_DATA, "%s:%zu: not JSON: %s at column %d (expected lines of %s)", file, line,
                                je.text, je.column, expect);
        dt_status st = !json_is_object(o) ? dt_error_set(DT_ERR_DATA, "%s:%zu: expected a JSON object (lines of %s)",
                                                         file, line, expect)
                                          : fn(user, o, file, line);
        json_decref(o);
        DT_TRY(st);
        p = next;
    }
    return DT_OK;
}

static dt_status example_line(void *user, json_t *o, const char *file, size_t line) {
    dt_sft *s = user;
    return s->cfg.chat ? chat_line(s, o, file, line) : completion_line(s, o, file, line);
}

dt_status dt_sft_read(dt_sft *s, const char *file, const char *buf, size_t len) {
    return for_lines(s->cfg.chat, file, buf, len, example_line, s);
}

/* ---- questions: what exact match asks and expects ---- */

typedef struct questions {
    const dt_sft_cfg *cfg;
    const char *eot_text;
    dt_sft_question *q;
    size_t n, cap;
} questions;

static dt_status question_line(void *user, json_t *o, const char *file, size_t line) {
    questions *qs = user;
    if (qs->n == qs->cap) {
        const size_t cap = qs->cap ? 2 * qs->cap : 64;
        dt_sft_question *q = realloc(qs->q, cap * sizeof *q);
        if (!q) return dt_error_set(DT_ERR_NOMEM, "out of memory");
        qs->q = q;
        qs->cap = cap;
    }
    dt_sft_question *q = &qs->q[qs->n];
    memset(q, 0, sizeof *q);
    if (!qs->cfg->chat) {
        const char *prompt, *completion;
        DT_TRY(get_str(o, "prompt", "", file, line, SFT_COMPLETION_LINE, &prompt));
        DT_TRY(get_str(o, "completion", "", file, line, SFT_COMPLETION_LINE, &completion));
        size_t cl = strlen(completion);
        const size_t el = strlen(qs->eot_text);
        if (cl >= el && strcmp(completion + cl - el, qs->eot_text) == 0) cl -= el;
        q->prompt = strdup(prompt);
        q->answer = strndup(completion, cl);
    } else {
        dt_chat_msg *m;
        size_t n;
        int answers;
        DT_TRY(messages(o, file, line, &m, &n, &answers));
        dt_status st = strcmp(m[n - 1].role, "assistant") == 0 && n > 1
                           ? dt_chat_render(qs->cfg->tmpl, m, (int)n - 1, 1, &q->prompt)
                           : dt_error_set(DT_ERR_DATA, "%s:%zu: messages: the last message is not the assistant's "
                                          "answer to the ones before it, so there is nothing to compare a generated "
                                          "answer with", file, line);
        if (st == DT_OK) q->answer = strdup(m[n - 1].content);
        free(m);
        if (st != DT_OK) return st;
    }
    qs->n++;
    if (!q->prompt || !q->answer) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    return DT_OK;
}

dt_status dt_sft_questions(const dt_sft *s, const char *file, const char *buf, size_t len, dt_sft_question **out,
                           size_t *n) {
    questions qs = {.cfg = &s->cfg, .eot_text = s->eot_text};
    dt_status st = for_lines(s->cfg.chat, file, buf, len, question_line, &qs);
    if (st != DT_OK) {
        dt_sft_questions_free(qs.q, qs.n);
        return st;
    }
    *out = qs.q;
    *n = qs.n;
    return DT_OK;
}

void dt_sft_questions_free(dt_sft_question *q, size_t n) {
    for (size_t i = 0; i < n; i++) {
        free(q[i].prompt);
        free(q[i].answer);
    }
    free(q);
}

dt_status dt_sft_open_chat(dt_tokenizer *tok, dt_chat **out) {
    char dir[4200];
    snprintf(dir, sizeof dir, "%s", dt_tokenizer_name(tok));
    char *slash = strrchr(dir, '/');
    if (slash) *slash = '\0';
    else snprintf(dir, sizeof dir, ".");
    dt_status st = dt_chat_open(dir, out);
    if (st != DT_OK) dt_error_prefix("data.format chat: the template of data.tokenizer %s", dt_tokenizer_name(tok));
    return st;
}

/* the rows example e takes in a packed row: its inputs that have a next token (at most T) */
static size_t ex_rows(const dt_sft *s, size_t e) { return s->off[e + 1] - s->off[e] - 1; }

int dt_sft_get(const dt_sft *s, size_t i, int *tokens, int *targets, int *pos) {
    const size_t T = (size_t)s->cfg.seq_len;
    if (!s->row) {
        const size_t o = s->off[i], n = s->off[i + 1] - o;
        for (size_t t = 0; t < T; t++) {
            tokens[t] = t < n ? (int)s->ids[o + t] : s->eot;
            targets[t] = t + 1 < n && s->ans[o + t + 1] ? (int)s->ids[o + t + 1] : -1;
            if (pos) pos[t] = (int)t;
        }
        return s->counted[i];
    }
    size_t t = 0;
    for (size_t k = s->row[i]; k < s->row[i + 1]; k++) {
        const size_t e = s->ex[k], o = s->off[e], n = ex_rows(s, e);
        for (size_t j = 0; j < n; j++, t++) {
            tokens[t] = (int)s->ids[o + j];
            targets[t] = s->ans[o + j + 1] ? (int)s->ids[o + j + 1] : -1;
            if (pos) pos[t] = (int)j;
        }
    }
    for (size_t j = 0; t < T; t++, j++) { /* padding: a last example of its own, never counted */
        tokens[t] = s->eot;
        targets[t] = -1;
        if (pos) pos[t] = (int)j;
    }
    return dt_sft_counted(s, i);
}

int dt_sft_counted(const dt_sft *s, size_t i) {
    if (!s->row) return s->counted[i];
    int c = 0;
    for (size_t k = s->row[i]; k < s->row[i + 1]; k++) c += s->counted[s->ex[k]];
    return c;
}

int dt_sft_tokens(const dt_sft *s, size_t i) {
    if (!s->row) return (int)(s->off[i + 1] - s->off[i]);
    size_t n = 0;
    for (size_t k = s->row[i]; k < s->row[i + 1]; k++) n += ex_rows(s, s->ex[k]);
    return (int)n;
}

int dt_sft_text(const dt_sft *s, size_t i) { return s->row ? dt_sft_tokens(s, i) : (int)ex_rows(s, i); }

/* an example to pack: its length (ex_rows) and index */
typedef struct pack_item {
    size_t len, e;
} pack_item;

/* by decreasing length, then by index (qsort's order is not stable: the index makes it total) */
static int by_length(const void *a, const void *b) {
    const pack_item *x = a, *y = b;
    return x->len != y->len ? (x->len < y->len) - (x->len > y->len) : (x->e > y->e) - (x->e < y->e);
}

dt_status dt_sft_pack(dt_sft *s) {
    const size_t T = (size_t)s->cfg.seq_len, n = s->n;
    free(s->row);
    free(s->ex);
    s->row = s->ex = NULL;
    pack_item *order = malloc((n + 1) * sizeof *order);
    size_t *room = malloc((n + 1) * sizeof *room);
    size_t *which = malloc((n + 1) * sizeof *which), *count = calloc(n + 1, sizeof *count);
    s->row = malloc((n + 2) * sizeof *s->row);
    s->ex = malloc((n + 1) * sizeof *s->ex);
    dt_status st = order && room && which && count && s->row && s->ex ? DT_OK
                                                                     : dt_error_set(DT_ERR_NOMEM, "out of memory packing the examples");
    size_t rows = 0;
    if (st == DT_OK) {
        for (size_t i = 0; i < n; i++) order[i] = (pack_item){ex_rows(s, i), i};
        qsort(order, n, sizeof *order, by_length);
        /* best fit, longest first: each example into the fullest row it fits in, else a new one
         * (a scan of the rows for each example: examples x rows steps) */
        for (size_t k = 0; k < n; k++) {
            const size_t len = order[k].len;
            size_t best = rows;
            for (size_t r = 0; r < rows; r++)
                if (room[r] >= len && (best == rows || room[r] < room[best])) best = r;
            if (best == rows) room[rows++] = T;
            room[best] -= len;
            which[order[k].e] = best;
            count[best]++;
        }
        /* each row's examples in the data's order */
        s->row[0] = 0;
        for (size_t r = 0; r < rows; r++) s->row[r + 1] = s->row[r] + count[r];
        for (size_t r = 0; r < rows; r++) count[r] = s->row[r];
        for (size_t e = 0; e < n; e++) s->ex[count[which[e]]++] = e;
        s->n_rows = rows;
    }
    free(order);
    free(room);
    free(which);
    free(count);
    if (st != DT_OK) {
        free(s->row);
        free(s->ex);
        s->row = s->ex = NULL;
    }
    return st;
}

static void padding(const dt_sft *s, double *unpacked, double *packed) {
    size_t real = 0;
    for (size_t e = 0; e < s->n; e++) real += ex_rows(s, e);
    const double T = (double)s->cfg.seq_len;
    *unpacked = s->n ? 1.0 - (double)real / (T * (double)s->n) : 0.0;
    *packed = s->row && s->n_rows ? 1.0 - (double)real / (T * (double)s->n_rows) : *unpacked;
}
