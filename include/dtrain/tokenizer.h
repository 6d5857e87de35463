/* tokenizer.h — text to token ids and back: the byte tokenizer (id = byte value, dtrain's
 * default) or a byte-level BPE read from a Hugging Face tokenizer.json (GPT-2's, or any the
 * `tokenizers` library makes with ByteLevel pre-tokenization and a BPE model).
 *
 * BPE encoding is what `tokenizers` does for such a file, token for token: the added tokens
 * (<|endoftext|>, ...) are split out first (leftmost, longest); the rest is pre-tokenized with
 * GPT-2's pattern ('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+,
 * Unicode categories from PCRE2 with UCP), each piece's bytes are mapped to GPT-2's byte
 * characters and merged by rank. Text must be UTF-8: invalid UTF-8 is an error naming the byte
 * offset (`tokenizers` only takes valid strings). Decoding maps ids back to bytes. */
#ifndef DTRAIN_TOKENIZER_H
#define DTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

typedef struct dt_tokenizer dt_tokenizer;

/* "bytes", or the path of a tokenizer.json. DT_ERR_DATA naming the file and what is wrong (not
 * JSON, not a BPE model, a normalizer or pre-tokenizer other than ByteLevel, a merge whose
 * parts are not in the vocabulary, ...). */
dt_status dt_tokenizer_open(const char *spec, dt_tokenizer **out);
void dt_tokenizer_free(dt_tokenizer *t);

/* Ids are < this (the vocabulary and the added tokens). */
int dt_tokenizer_vocab_size(const dt_tokenizer *t);
/* The end-of-text token's id (<|endoftext|>, or the only special added token), -1 if none. */
int dt_tokenizer_eot(const dt_tokenizer *t);
/* "bytes" or the file it was read from. */
const char *dt_tokenizer_name(const dt_tokenizer *t);

/* GPT-2's character for byte b (0..255) as UTF-8 into out (NUL-terminated); its length (1 or 2).
 * A byte-level vocabulary's token strings are made of these. */
size_t dt_tokenizer_byte_string(unsigned b, char out[3]);

/* Appends the ids of text[0..len) to *ids (grown with realloc; *n ids, *cap allocated).
 * DT_ERR_DATA "invalid UTF-8 at byte offset N" for such text (BPE only). */
dt_status dt_tokenizer_encode(dt_tokenizer *t, const char *text, size_t len, uint32_t **ids, size_t *n, size_t *cap);
/* The bytes of ids[0..n) into a malloc'ed buffer (*out, *len; NUL-terminated). DT_ERR_DATA for
 * an id out of range. */
dt_status dt_tokenizer_decode(const dt_tokenizer *t, const uint32_t *ids, size_t n, char **out, size_t *len);

#endif
