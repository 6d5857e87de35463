/* sft.h — supervised fine-tuning examples: JSON lines of conversations or prompt/completion
 * pairs into token rows, with the tokens the loss counts.
 *
 *   chat:       {"messages": [{"role": "system"|"user"|"assistant", "content": "..."}, ...]}
 *               (Hugging Face's and OpenAI's convention), rendered with the model's chat template
 *               (chat.h) and encoded whole, as transformers' apply_chat_template(tokenize=True)
 *               does; the answer's tokens are those that overlap an assistant message's content
 *               or its end-of-turn token (transformers' assistant mask, TRL's assistant-only loss).
 *   completion: {"prompt": "...", "completion": "..."} (TRL's convention): prompt + completion +
 *               the end-of-text token's text unless the completion ends with it, encoded whole;
 *               the answer is every token after the prompt's own encoding's length (as TRL's
 *               completion mask).
 * Ids are the tokenizer's without its post-processor's additions (tokenizer.h). Each example is
 * cut to seq_len + 1 tokens (one whose answer starts past them is left out, counted in the
 * stats); row i is tokens [0, T) of example i padded with the end-of-text id (chat data with a
 * tokenizer that has none, as Llama 3's: the template's end-of-turn token),
 * and its targets the next tokens where they count, -1 elsewhere (model.h ignores those). Every
 * malformed line is DT_ERR_DATA naming file:line and what was expected. */
#ifndef DTRAIN_SFT_H
#define DTRAIN_SFT_H

#include <stddef.h>

#include "dtrain/chat.h"
#include "dtrain/status.h"
#include "dtrain/tokenizer.h"

typedef struct dt_sft dt_sft;

typedef struct dt_sft_cfg {
    int chat;            /* 1: chat lines, 0: prompt/completion lines */
    int seq_len;         /* T */
    int train_on_all;    /* data.train_on: all (every next token counts), else the answer's */
    dt_tokenizer *tok;   /* a BPE tokenizer with an end-of-text token; not owned */
    const dt_chat *tmpl; /* chat: the model's template; not owned */
} dt_sft_cfg;

/* What the examples hold (for --dry-run). */
typedef struct dt_sft_stats {
    size_t examples;  /* read, those left out included */
    size_t tokens;    /* before cutting */
    size_t counted;   /* targets that count, after cutting */
    size_t cut;       /* examples longer than seq_len + 1 tokens */
    size_t no_answer; /* examples left out: no counted target within the cut (their answer starts
                         past T; training on none of it, a batch of them would divide by 0) */
    size_t rows;      /* examples, or packed rows (dt_sft_size) */
    double padding, padding_packed; /* the share of the rows' T tokens that are padding (not an
                                       example's token with a next token), one example a row and as
                                       packed (the same where not packed) */
} dt_sft_stats;

dt_status dt_sft_new(dt_sft **out, const dt_sft_cfg *cfg);
void dt_sft_free(dt_sft *s);
/* Reads `len` bytes of `file`'s JSON lines (a UTF-8 byte order mark skipped), appending its
 * examples. */
dt_status dt_sft_read(dt_sft *s, const char *file, const char *buf, size_t len);

/* data.packing: from now on a row holds several examples, whole (every example fits a row:
 * each was cut to T + 1 tokens, and takes its first T inputs, those with a next token). Best-fit
 * decreasing: the longest example first, each into the fullest row with room, else a new row;
 * a row's examples in the data's order. Row i: its examples' inputs one after another, each at
 * positions 0.. of its own (pos), then padding (end-of-text ids, positions from 0 again, no
 * target counted). The rows depend on the examples only: the same for any world size. */
dt_status dt_sft_pack(dt_sft *s);
size_t dt_sft_size(const dt_sft *s); /* rows: examples, or packed rows */
void dt_sft_stats_get(const dt_sft *s, dt_sft_stats *out);
/* Row i: tokens(T) and targets(T) (-1: not counted), and pos(T) (may be NULL) each token's
 * position in its example (0..T-1 unpacked); returns the targets that count. */
int dt_sft_get(const dt_sft *s, size_t i, int *tokens, int *targets, int *pos);
/* How many of row i's targets count (dt_sft_get's return, without filling a row). */
int dt_sft_counted(const dt_sft *s, size_t i);
/* The tokens of row i before its padding: unpacked, its example's (its first T inputs and the
 * last target: at most T + 1); packed, its examples' inputs that have a next token. */
int dt_sft_tokens(const dt_sft *s, size_t i);
/* The positions of row i that hold an example's token with a next token of its own (text, not
 * padding; at most T): what the stats' padding shares count. */
int dt_sft_text(const dt_sft *s, size_t i);

/* What exact match (answers.h) asks and expects, a line each: chat: the conversation up to its
 * last message, which must be the assistant's (else DT_ERR_DATA naming file:line), rendered with
 * the assistant's turn opened (apply_chat_template's add_generation_prompt), and that message's
 * content; completion: the prompt, and the completion without a final end-of-text token. */
typedef struct dt_sft_question {
    char *prompt;
    char *answer;
} dt_sft_question;
dt_status dt_sft_questions(const dt_sft *s, const char *file, const char *buf, size_t len, dt_sft_question **out,
                           size_t *n);
void dt_sft_questions_free(dt_sft_question *q, size_t n);

/* The chat template of a tokenizer: the tokenizer_config.json beside its tokenizer.json. */
dt_status dt_sft_open_chat(dt_tokenizer *tok, dt_chat **out);

#endif
