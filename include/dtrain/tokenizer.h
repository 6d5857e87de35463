/* tokenizer.h — text to token ids and back: the byte tokenizer (id = byte value, dtrain's
 * default) or a byte-level BPE read from a Hugging Face tokenizer.json (GPT-2's, SmolLM2's,
 * Llama 3's, Qwen 2's, or any the `tokenizers` library makes from the parts below).
 *
 * BPE encoding is what `tokenizers` does for such a file, token for token, as
 * Tokenizer.encode(text, add_special_tokens=False):
 *   1. added tokens with normalized false are split out of the raw text (leftmost, longest;
 *      their single_word, lstrip and rstrip flags as tokenizers applies them);
 *   2. the `normalizer` runs on each piece between them: none, NFC, NFD, NFKC or NFKD (utf8proc),
 *      or a Sequence of those; then added tokens with normalized true are split out;
 *   3. the `pre_tokenizer` splits each piece: a Sequence of Split (a String or a Regex, in
 *      tokenizers' Oniguruma syntax, run by PCRE2 with Oniguruma's meaning of \s; any of the five
 *      behaviours, invert), Digits (individual_digits) and, last, ByteLevel (add_prefix_space;
 *      use_regex: GPT-2's pattern 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+);
 *   4. each piece's bytes are mapped to GPT-2's byte characters and merged by rank (the model's
 *      ignore_merges: a piece that is itself in the vocabulary is that one token).
 * Unicode as tokenizers 0.23 has it: \p{L} and \p{N} hold Unicode 16's letters and numbers (PCRE2
 * 10.42 has 14's; Digits also 17's digits, as Rust's char::is_numeric), and the normalizers leave
 * code points Unicode 9.0 lacked as tokenizers' 9.0 tables do (utf8proc has 15's). Added tokens
 * take the ids tokenizers gives them reading the file (the vocabulary's id of their content, else
 * the next after the vocabulary's entries, in file order), whatever "id" says.
 * The post_processor (ByteLevel, TemplateProcessing, or a Sequence of them) adds nothing there
 * and is not applied. Anything else — another normalizer, pre-tokenizer or post-processor, a
 * step after ByteLevel, a pattern using what Oniguruma and PCRE2 read differently (\w, \d, \b,
 * \h, anchors, POSIX classes, options other than i) or one that can match nothing — is refused
 * naming the file, the part and the option, never approximated. Text must be UTF-8: invalid
 * UTF-8 is an error naming the byte offset (`tokenizers` only takes valid strings). Decoding
 * maps ids back to bytes (an added token: its content, in byte characters where it is written
 * in them), as tokenizers' ByteLevel decoder does. */
#ifndef DTRAIN_TOKENIZER_H
#define DTRAIN_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/status.h"

typedef struct dt_tokenizer dt_tokenizer;

/* "bytes", or the path of a tokenizer.json. DT_ERR_DATA naming the file and what is wrong (not
 * JSON, not a BPE model, a normalizer, pre-tokenizer step or option dtrain does not read, a
 * pattern PCRE2 cannot read as Oniguruma does, a merge whose parts are not in the vocabulary, ...). */
dt_status dt_tokenizer_open(const char *spec, dt_tokenizer **out);
void dt_tokenizer_free(dt_tokenizer *t);

/* Whether texts read with `t` (NULL, or one opened as "bytes": the byte tokenizer) fit a model of
 * vocab_size ids and num_labels labels (0: a language model): the one check every command that
 * pairs a tokenizer with a model runs (dt_dataset_open, and through dt_infer_tokenizer train,
 * eval, predict, generate, export and --dry-run). A BPE's ids (added tokens included) below
 * vocab_size; a classifier's texts (data.h) need an end-of-text token to pad with and ids below
 * 65536 (their rows are uint16), or with bytes vocab_size >= 257 (<cls> = 256). DT_ERR_CONFIG
 * naming data.tokenizer and model.vocab_size otherwise. */
dt_status dt_tokenizer_check_model(const dt_tokenizer *t, int vocab_size, int num_labels);

/* Ids are < this (the vocabulary and the added tokens). */
int dt_tokenizer_vocab_size(const dt_tokenizer *t);
/* The end-of-text token's id (<|endoftext|>, or the only special added token), -1 if none. */
int dt_tokenizer_eot(const dt_tokenizer *t);
/* The id of `text` when it encodes to one token (a special token's text: "<|im_end|>"); -1
 * otherwise, or when text is NULL. */
int dt_tokenizer_token_id(dt_tokenizer *t, const char *text);
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
