/* answers.h — exact match of greedy answers, for chat and prompt/completion data (sft.h):
 * `dtrain eval` on such validation data generates each line's answer greedily (temperature 0,
 * the key/value cache of decode.h) from its prompt (chat: the conversation up to its last
 * message, the assistant's turn opened; completion: the prompt), until the chat template's end
 * of turn or the end-of-text token, and compares the text with the reference (that last
 * message's content; the completion), both with surrounding whitespace trimmed. */
#ifndef DTRAIN_ANSWERS_H
#define DTRAIN_ANSWERS_H

#include <stdio.h>

#include "dtrain/infer.h"
#include "dtrain/status.h"

typedef struct dt_answers_result {
    long asked, exact;
    double seconds;
} dt_answers_result;

/* The first `limit` lines (0: all) of `path` asked of the model of s (a language model with a
 * BPE tokenizer; data.format chat or completion in s->cfg). `show` (may be NULL): each
 * mismatch's question number, expected and generated text, for the first few. */
dt_status dt_answers_exact_match(dt_infer *s, const char *path, long limit, FILE *show, dt_answers_result *r);

#endif
