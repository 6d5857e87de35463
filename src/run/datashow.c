/* datashow.c — `dtrain data show` (include/dtrain/datashow.h). */
#include "dtrain/datashow.h"

#include <stdlib.h>

#include "dtrain/data.h"
#include "dtrain/infer.h"
#include "dtrain/tokenizer.h"

/* ids[0..n) decoded (bytes: each id < 256 its byte, others as <ID>) */
static void put_text(FILE *out, const dt_tokenizer *tok, const int *ids, size_t n) {
    for (size_t k = 0; k < n; k++) {
        const uint32_t id = (uint32_t)ids[k];
        char *s = NULL;
        size_t len = 0;
        if (tok && dt_tokenizer_decode(tok, &id, 1, &s, &len) == DT_OK) fwrite(s, 1, len, out);
        else if (!tok && id < 256) fputc((int)id, out);
        else fprintf(out, "<%u>", id);
        free(s);
    }
}

static void show_json(FILE *out, size_t i, const int *tokens, const int *targets, int T) {
    fprintf(out, "{\"example\": %zu, \"ids\": [", i);
    for (int t = 0; t < T; t++) fprintf(out, "%s%d", t ? ", " : "", tokens[t]);
    fputs("], \"targets\": [", out);
    for (int t = 0; t < T; t++) fprintf(out, "%s%d", t ? ", " : "", targets[t]);
    fputs("]}\n", out);
}

/* The row as text: its first token, then each target in turn, the counted runs in «». */
static void show_text(FILE *out, const dt_tokenizer *tok, size_t i, const int *tokens, const int *targets, int T,
                      int n, int counted) {
    fprintf(out, "example %zu: %d tokens, %d of the %d targets count\n", i, n, counted, n - 1);
    put_text(out, tok, tokens, 1);
    int in = 0;
    for (int t = 0; t + 1 < n; t++) {
        const int counts = targets[t] >= 0, next = counts ? targets[t] : t + 1 < T ? tokens[t + 1] : -1;
        if (next < 0) break; /* the row's last target, not counted: not in the row */
        if (counts != in) fputs(counts ? "«" : "»", out);
        in = counts;
        put_text(out, tok, &next, 1);
    }
    fputs(in ? "»\n\n" : "\n\n", out);
}

dt_status dt_datashow(const dt_config *cfg, const dt_datashow_opts *o, FILE *out) {
    if (cfg->model.shape.num_labels)
        return dt_error_set(DT_ERR_USAGE, "data show: shows a language model's rows (model.num_labels is %d: a "
                            "classifier reads a text and its label, \"dtrain --dry-run\" checks those)",
                            cfg->model.shape.num_labels);
    dt_tokenizer *tok;
    DT_TRY(dt_infer_tokenizer(cfg, &tok));
    const dt_dataset_cfg dc = {.path = cfg->data.train_path, .format = cfg->data.format, .seq_len = cfg->data.seq_len,
                               .vocab_size = cfg->model.shape.vocab_size, .tokenizer = tok,
                               .train_on_all = cfg->data.train_on_all, .packing = cfg->data.packing};
    dt_dataset *ds = NULL;
    dt_status st = dt_dataset_open(&ds, &dc);
    const int T = cfg->data.seq_len;
    int *tokens = st == DT_OK ? malloc((size_t)T * sizeof(int)) : NULL, *targets = tokens ? malloc((size_t)T * sizeof(int)) : NULL;
    if (st == DT_OK && !targets) st = dt_error_set(DT_ERR_NOMEM, "out of memory");
    const size_t n = st == DT_OK ? dt_dataset_size(ds) : 0;
    for (size_t i = 0; i < n && (long)i < o->limit; i++) {
        dt_dataset_get(ds, i, tokens, targets);
        if (o->json) show_json(out, i, tokens, targets, T);
        else show_text(out, tok, i, tokens, targets, T, dt_dataset_row_tokens(ds, i), dt_dataset_counted(ds, i));
    }
    free(tokens);
    free(targets);
    dt_dataset_free(ds);
    dt_tokenizer_free(tok);
    return st;
}
