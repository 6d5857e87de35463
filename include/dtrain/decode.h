/* decode.h — incremental decoding of a language model with a key/value cache (generation).
 *
 * A decoder holds, for one sequence of at most max_len positions, every layer's keys and
 * values (backend memory) and the buffers of one forward over the new tokens. Feeding tokens
 * runs the model over those tokens only (attention_cached reads the earlier positions from
 * the cache), so a new token costs the same matmuls whatever the length so far; only
 * attention grows with it. The numbers are those of dt_model_forward at the same positions
 * (the same ops in the same order), which the tests check. */
#ifndef DTRAIN_DECODE_H
#define DTRAIN_DECODE_H

#include "dtrain/model.h"
#include "dtrain/status.h"

typedef struct dt_decoder dt_decoder;

/* Allocates the cache and buffers for max_len (1..n_positions) positions through the model's
 * backend; the model must outlive the decoder. dt_decoder_free accepts NULL. */
dt_status dt_decoder_open(dt_decoder **out, dt_model *m, int max_len);
void dt_decoder_free(dt_decoder *d);

/* Feeds tokens[0..n) (n >= 1) at the next n positions; logits (host, vocab_size floats)
 * receives the model's next-token logits after the last of them. DT_ERR_DATA for a token
 * outside the vocabulary; DT_ERR_INTERNAL past max_len (callers check lengths first). */
dt_status dt_decoder_feed(dt_decoder *d, const int *tokens, int n, float *logits);

/* Pipeline stages (the model's pp > 1): prev and next, the pairs of collectives with the stage
 * before and after (NULL at the ends), as training passes activations over them. Every stage
 * of one pipeline (each share of each) feeds the same tokens: the first embeds them, each runs
 * its layers (its cache holds theirs only) and passes their rows on, the last computes the
 * logits, and they come back through every stage, so each feed returns the same row
 * everywhere. Without it, a stage's decoder refuses to feed. */
void dt_decoder_set_stages(dt_decoder *d, dt_comm *prev, dt_comm *next);

/* Positions fed so far; reset forgets them (the next feed starts at position 0). */
int dt_decoder_len(const dt_decoder *d);
void dt_decoder_reset(dt_decoder *d);

#endif
