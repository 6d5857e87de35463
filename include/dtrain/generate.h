/* generate.h — text generation from a language model: the sampler (temperature, top-k,
 * top-p, seeded) and the loop that feeds the prompt to a key/value-cache decoder, then one
 * sampled token at a time, handing each token's text on as soon as it is chosen. */
#ifndef DTRAIN_GENERATE_H
#define DTRAIN_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/model.h"
#include "dtrain/status.h"
#include "dtrain/tokenizer.h"

/* ---- the sampler ---- */

typedef struct dt_gen_sampler dt_gen_sampler;

/* temperature 0: the largest logit (the first one on ties), no randomness; > 0: softmax of
 * logits / temperature, restricted to the top_k largest (0: all) and then to the smallest set
 * of the largest whose probabilities add up to top_p (1: all), renormalised, drawn with a
 * splitmix64 stream from `seed`: the same seed and logits give the same tokens. Only ids
 * below n (the ids the tokenizer can decode) are drawn. */
dt_status dt_gen_sampler_new(dt_gen_sampler **out, int n, double temperature, int top_k, double top_p, uint64_t seed);
void dt_gen_sampler_free(dt_gen_sampler *s);
int dt_gen_sampler_next(dt_gen_sampler *s, const float *logits);

/* ---- generation ---- */

typedef struct dt_gen_opts {
    const char *prompt;      /* UTF-8 text; with a BPE tokenizer it follows the end-of-text token
                                (as every document of `dtrain data tokenize` does) and may be "" */
    size_t prompt_len;
    int max_new_tokens;      /* >= 1 */
    double temperature;      /* >= 0 */
    int top_k;               /* >= 0 */
    double top_p;            /* (0, 1] */
    uint64_t seed;
    int no_cache;            /* 1: every token from a fresh forward over the whole text (testing aid) */
    int bare;                /* 1: no end-of-text token before the prompt (a chat template's text) */
    int stop_id;             /* another token that ends the text (a chat template's end of turn); -1: none */
    dt_comm *pp_prev, *pp_next; /* pipeline stages: this stage's pairs with its neighbours (dt_decoder_set_stages),
                                   every stage of the pipeline generating together; else NULL */
} dt_gen_opts;

typedef struct dt_gen_result {
    int prompt_tokens, new_tokens;
    int stop;                /* 0 max_new_tokens, 1 end-of-text token (or stop_id), 2 model.n_positions reached */
    double prompt_s, decode_s; /* wall time of the prompt's forward, and of the new tokens */
} dt_gen_result;

/* Called with the bytes of each new token (n may be 0). */
typedef void (*dt_gen_emit_fn)(void *user, const char *bytes, size_t n);

/* Generates from language model m (num_labels 0) with tokenizer tok (NULL: bytes).
 * DT_ERR_USAGE naming --prompt when the prompt is empty (bytes) or longer than
 * model.n_positions; DT_ERR_DATA for a prompt that is not UTF-8 (BPE). Generation stops at
 * max_new_tokens, at the end-of-text token (not emitted), or where the model's positions end. */
dt_status dt_generate(dt_model *m, dt_tokenizer *tok, const dt_gen_opts *o, dt_gen_emit_fn emit, void *user,
                      dt_gen_result *res);

#endif
