/* predict.h — a trained model over new inputs, one JSON line per input line (dtrain predict).
 *
 * Classification: each line is "LABEL<TAB>TEXT" (the training TSV; the label is optional and
 * only compared) or plain TEXT; the output is {"line": N, "label": predicted, "probs": [...]}
 * plus "true_label" when the line has one. The text is encoded exactly as training encodes
 * TSV (dt_data_text_row), so the probabilities are the ones evaluation computes.
 * Language models: each line is a text; the output is {"line": N, "tokens": scored, "loss":
 * mean cross-entropy per token, "perplexity": exp(loss)} (null for a line with nothing to
 * score, an empty line among them). With a BPE tokenizer each line follows the end-of-text token, as documents do in
 * training; lines longer than data.seq_len are scored in windows of data.seq_len tokens.
 * The input is read as it goes (any size); the output is written to a temporary file and
 * renamed onto OUT at the end, so a failed run leaves no partial file. */
#ifndef DTRAIN_PREDICT_H
#define DTRAIN_PREDICT_H

#include "dtrain/infer.h"
#include "dtrain/status.h"

typedef struct dt_predict_opts {
    const char *input, *out;
    int progress; /* a progress line on stderr: -1 when stderr is a terminal, 0 never, 1 always */
} dt_predict_opts;

typedef struct dt_predict_result {
    long lines;        /* inputs predicted */
    long labelled;     /* classification: lines with a label */
    long correct;      /* ... whose prediction equals it */
    double loss_sum;   /* classification: sum of -log p[label] over labelled lines; LM: over scored tokens */
    long tokens;       /* LM: tokens scored */
    double seconds;
} dt_predict_result;

/* Runs s's model over o->input. DT_ERR_DATA naming INPUT:LINE for a line the model cannot
 * read (empty, for a classifier; a label outside [0, num_labels), invalid UTF-8 for BPE, ...);
 * DT_ERR_USAGE when o->out is o->input (dt_file_check_output: the input is never replaced). */
dt_status dt_predict(dt_infer *s, const dt_predict_opts *o, dt_predict_result *res);

#endif
