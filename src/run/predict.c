/* predict.c — dtrain predict (predict.h): input lines in, one JSON object per line out. */
#include "dtrain/predict.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/clock.h"
#include "dtrain/data.h"
#include "dtrain/file.h"

typedef struct pred {
    dt_infer *s;
    const dt_predict_opts *o;
    dt_predict_result *res;
    FILE *in, *out;
    char tmp[DT_PATH_MAX + 64];
    int B, T, NL, bar;
    long line;                 /* lines read */
    off_t in_bytes, read_bytes;
    double t0, last_draw;
    /* classification batch */
    int n;                     /* rows in the batch */
    int *tokens, *labels;      /* (B,T), (B) */
    long *line_of;             /* (B) */
    int *has_label;            /* (B) */
    uint16_t *row;             /* (T) */
    uint32_t *ids;             /* tokenizer output */
    size_t ids_cap;
    int *targets;              /* LM: (T) */
} pred;

static void progress(pred *p, int last) {
    if (!p->bar) return;
    const double now = dt_clock_now();
    if (!last && now - p->last_draw < 0.1) return;
    p->last_draw = now;
    const double pct = p->in_bytes > 0 ? 100.0 * (double)p->read_bytes / (double)p->in_bytes : 100.0;
    fprintf(stderr, "\rpredict: %5.1f%% | %ld lines | %.1f s", pct, p->line, now - p->t0);
    if (last) fputs("\r\033[K", stderr);
    fflush(stderr);
}

/* The label of "LABEL<TAB>TEXT" when the part before the first tab is an integer: 1, with
 * the text after the tab; 0: the whole line is the text. */
static int split_label(char *line, size_t len, long *label, char **text, size_t *tlen) {
    char *tab = memchr(line, '\t', len);
    if (!tab || tab == line) return 0;
    char *end;
    errno = 0;
    long v = strtol(line, &end, 10);
    if (end != tab || errno) return 0;
    *label = v;
    *text = tab + 1;
    *tlen = len - (size_t)(tab + 1 - line);
    return 1;
}

static dt_status flush_cls(pred *p) {
    if (p->n == 0) return DT_OK;
    dt_fwd_result r;
    if (p->s->cfg.data.pad_to_longest) /* as training's evaluation runs them (dt_model_cut_rows) */
        DT_TRY(dt_model_cut_rows(p->s->model, p->tokens, p->labels, NULL, p->n));
    DT_TRY(dt_model_forward(p->s->model, p->tokens, p->labels, p->n, &r));
    for (int i = 0; i < p->n; i++) {
        const float *pr = r.probs + (size_t)i * p->NL;
        fprintf(p->out, "{\"line\":%ld,\"label\":%d,\"probs\":[", p->line_of[i], r.pred[i]);
        for (int k = 0; k < p->NL; k++) fprintf(p->out, "%s%.9g", k ? "," : "", pr[k]);
        fputc(']', p->out);
        if (p->has_label[i]) {
            fprintf(p->out, ",\"true_label\":%d", p->labels[i]);
            p->res->labelled++;
            p->res->correct += r.pred[i] == p->labels[i];
            p->res->loss_sum += r.losses[i];
        }
        fputs("}\n", p->out);
    }
    p->res->lines += p->n;
    p->n = 0;
    return DT_OK;
}

static dt_status add_cls(pred *p, char *line, size_t len) {
    long label = 0;
    char *text = line;
    size_t tlen = len;
    const int labelled = split_label(line, len, &label, &text, &tlen);
    if (labelled && (label < 0 || label >= p->NL))
        return dt_error_set(DT_ERR_DATA, "%s:%ld: label %ld out of range [0, %d) (hint: a line is LABEL<TAB>TEXT or "
                            "TEXT; model.num_labels is %d)", p->o->input, p->line, label, p->NL, p->NL);
    int cut;
    if (dt_data_text_row(p->s->tok, text, tlen, p->T, p->row, &cut, &p->ids, &p->ids_cap) != DT_OK) {
        dt_error_prefix("%s:%ld", p->o->input, p->line);
        return DT_ERR_DATA;
    }
    for (int t = 0; t < p->T; t++) p->tokens[(size_t)p->n * p->T + t] = p->row[t];
    p->labels[p->n] = labelled ? (int)label : 0;
    p->has_label[p->n] = labelled;
    p->line_of[p->n] = p->line;
    if (++p->n == p->B) return flush_cls(p);
    return DT_OK;
}

/* A language model's loss over one line, in windows of T tokens. */
static dt_status add_lm(pred *p, const char *line, size_t len) {
    size_t n = 0;
    const int eot = p->s->tok ? dt_tokenizer_eot(p->s->tok) : -1;
    if (p->s->tok) {
        if (eot >= 0) {
            if (!p->ids && !(p->ids = malloc(64 * sizeof *p->ids))) return dt_error_set(DT_ERR_NOMEM, "out of memory");
            if (!p->ids_cap) p->ids_cap = 64;
            p->ids[n++] = (uint32_t)eot;
        }
        if (dt_tokenizer_encode(p->s->tok, line, len, &p->ids, &n, &p->ids_cap) != DT_OK) {
            dt_error_prefix("%s:%ld", p->o->input, p->line);
            return DT_ERR_DATA;
        }
    } else {
        if (len > p->ids_cap) {
            uint32_t *q = realloc(p->ids, len * sizeof *q);
            if (!q) return dt_error_set(DT_ERR_NOMEM, "out of memory");
            p->ids = q;
            p->ids_cap = len;
        }
        for (size_t i = 0; i < len; i++) p->ids[n++] = (unsigned char)line[i];
    }
    double loss = 0;
    long rows = 0;
    for (size_t k = 0; k + 1 < n; k += (size_t)p->T) {
        for (int t = 0; t < p->T; t++) {
            const size_t i = k + (size_t)t;
            p->tokens[t] = i < n ? (int)p->ids[i] : 0;
            p->targets[t] = i + 1 < n ? (int)p->ids[i + 1] : -1;
        }
        dt_fwd_result r;
        if (p->s->cfg.data.pad_to_longest) DT_TRY(dt_model_cut_rows(p->s->model, p->tokens, p->targets, NULL, 1));
        DT_TRY(dt_model_forward(p->s->model, p->tokens, p->targets, 1, &r));
        loss += r.loss_sum;
        rows += r.rows;
    }
    if (rows) fprintf(p->out, "{\"line\":%ld,\"tokens\":%ld,\"loss\":%.9g,\"perplexity\":%.9g}\n", p->line, rows,
                      loss / (double)rows, exp(loss / (double)rows));
    else fprintf(p->out, "{\"line\":%ld,\"tokens\":0,\"loss\":null,\"perplexity\":null}\n", p->line);
    p->res->lines++;
    p->res->loss_sum += loss;
    p->res->tokens += rows;
    return DT_OK;
}

static dt_status open_files(pred *p) {
    int fd;
    DT_TRY(dt_file_check_output("--input", p->o->input, "--out", p->o->out)); /* never replaced by its predictions */
    DT_TRY(dt_file_open_regular(p->o->input, DT_ERR_DATA, &fd));
    struct stat sb;
    p->in_bytes = fstat(fd, &sb) == 0 ? sb.st_size : 0;
    if (!(p->in = dt_file_stream(fd, "r", p->o->input))) return DT_ERR_IO;
    DT_TRY(dt_file_create_temp(p->o->out, p->tmp, sizeof p->tmp, &fd));
    if (!(p->out = dt_file_stream(fd, "w", p->tmp))) return DT_ERR_IO;
    return DT_OK;
}

static dt_status run_lines(pred *p) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    dt_status st = DT_OK;
    while (st == DT_OK && (got = getline(&line, &cap, p->in)) >= 0) {
        p->line++;
        p->read_bytes += got;
        size_t len = (size_t)got;
        if (len && line[len - 1] == '\n') len--;
        if (len && line[len - 1] == '\r') len--;
        if (p->line == 1 && len >= 3 && memcmp(line, "\xEF\xBB\xBF", 3) == 0) { /* UTF-8 byte order mark */
            memmove(line, line + 3, len - 3);
            len -= 3;
        }
        if (len == 0 && p->NL) { /* a language model scores an empty line as nothing (null) */
            st = dt_error_set(DT_ERR_DATA, "%s:%ld: empty line (expected LABEL<TAB>TEXT or TEXT on every line of a classifier's input)",
                              p->o->input, p->line);
            break;
        }
        st = p->NL ? add_cls(p, line, len) : add_lm(p, line, len);
        progress(p, 0);
    }
    if (st == DT_OK && ferror(p->in)) st = dt_error_set(DT_ERR_IO, "%s: read error: %s", p->o->input, strerror(errno));
    if (st == DT_OK && p->NL) st = flush_cls(p);
    if (st == DT_OK && p->line == 0) st = dt_error_set(DT_ERR_DATA, "%s: no lines to predict", p->o->input);
    free(line);
    return st;
}

dt_status dt_predict(dt_infer *s, const dt_predict_opts *o, dt_predict_result *res) {
    memset(res, 0, sizeof *res);
    const dt_model_cfg *mc = dt_model_config(s->model);
    pred p = {.s = s, .o = o, .res = res, .B = mc->max_batch, .T = mc->seq_len, .NL = mc->shape.num_labels};
    p.bar = o->progress == 1 || (o->progress < 0 && isatty(STDERR_FILENO));
    p.t0 = dt_clock_now();
    const size_t BT = (size_t)p.B * p.T;
    p.tokens = dt_malloc(BT * sizeof *p.tokens, "token batch");
    p.labels = dt_malloc((size_t)p.B * sizeof *p.labels, "labels");
    p.has_label = dt_malloc((size_t)p.B * sizeof *p.has_label, "labels");
    p.line_of = dt_malloc((size_t)p.B * sizeof *p.line_of, "line numbers");
    p.row = dt_malloc((size_t)p.T * sizeof *p.row, "row");
    p.targets = dt_malloc((size_t)p.T * sizeof *p.targets, "targets");
    dt_status st = !p.tokens || !p.labels || !p.has_label || !p.line_of || !p.row || !p.targets ? DT_ERR_NOMEM
                                                                                               : open_files(&p);
    if (st == DT_OK) st = run_lines(&p);
    progress(&p, 1);
    if (p.in) fclose(p.in);
    if (p.out) {
        int bad = fflush(p.out) != 0 || fsync(fileno(p.out)) != 0;
        bad |= fclose(p.out) != 0;
        if (st == DT_OK && bad) st = dt_error_set(DT_ERR_IO, "%s: cannot write: %s", p.tmp, strerror(errno));
        if (st == DT_OK) st = dt_file_commit(p.tmp, o->out);
        else unlink(p.tmp);
    }
    res->seconds = dt_clock_now() - p.t0;
    free(p.tokens);
    free(p.labels);
    free(p.has_label);
    free(p.line_of);
    free(p.row);
    free(p.targets);
    free(p.ids);
    return st;
}
