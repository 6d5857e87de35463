/* data.h — datasets and the world-size-independent sampler (DESIGN.md §5).
 *
 * Two formats:
 *   tokens: llm.c shards (header of 256 int32 LE: magic 20240520 version 1 uint16 tokens, or
 *           magic 20240801 version 7 uint32 tokens; [2] = token count). Sample i of the
 *           concatenated shards = tokens [i*T, i*T+T+1): inputs first T, targets shifted by 1.
 *   tsv:    UTF-8 lines "label<TAB>text"; byte tokenizer: text bytes truncated to T-1, then
 *           DT_CLS_TOKEN, right-padded with 0 to T; BPE (data.tokenizer): the text's ids cut to T,
 *           right-padded with the end-of-text id; target = the label.
 *   chat, completion (explicit data.format only): JSON lines of conversations or of prompts and
 *           completions (sft.h): a language model's rows, the targets outside the answer -1.
 * Paths may be a file, a directory (all regular, non-hidden files, sorted) or a glob;
 * `.gz` files are decompressed transparently. A FIFO or a device named as data (directly or
 * by a glob) is refused at once; a directory's non-regular entries are skipped. Errors in the
 * data are DT_ERR_DATA with the file and line (tsv) or byte offset (tokens) named; a shard
 * whose header claims more tokens than the file holds is refused before they are allocated. */
#ifndef DTRAIN_DATA_H
#define DTRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#include "dtrain/config.h"
#include "dtrain/sft.h"
#include "dtrain/status.h"
#include "dtrain/tokenizer.h"

#define DT_CLS_TOKEN 256
#define DT_SHARD_MAGIC_V1 20240520
#define DT_SHARD_MAGIC_V2 20240801

typedef struct dt_dataset dt_dataset;

typedef struct dt_dataset_cfg {
    const char *path;          /* file, directory or glob */
    dt_data_format format;     /* auto: ".bin"/".bin.gz" -> tokens, anything else -> tsv */
    int seq_len;               /* T */
    int num_labels;            /* 0 = language modelling (requires tokens), >= 2 = tsv labels */
    int vocab_size;            /* tokens must be < vocab_size (tsv needs >= 257) */
    dt_tokenizer *tokenizer;   /* tsv text: NULL = bytes + <cls>; else its BPE ids, padded with its
                                  end-of-text id (vocab_size must hold its ids); not owned;
                                  chat and completion: required (chat: its directory's
                                  tokenizer_config.json gives the template) */
    int train_on_all;          /* chat, completion: data.train_on all (else the answer only) */
    int packing;               /* chat, completion: data.packing (sft.h dt_sft_pack): a sample is a row
                                  of several examples, with each token's position in its example */
} dt_dataset_cfg;

/* Reads every file into memory. The dataset owns its memory; dt_dataset_free accepts NULL. */
dt_status dt_dataset_open(dt_dataset **out, const dt_dataset_cfg *cfg);
void dt_dataset_free(dt_dataset *ds);

size_t dt_dataset_size(const dt_dataset *ds);        /* number of samples */
int dt_dataset_is_classification(const dt_dataset *ds);
size_t dt_dataset_num_files(const dt_dataset *ds);
/* tsv: how many examples had more than T-1 text bytes and were cut (0 for token shards);
 * chat, completion: how many had more than T + 1 tokens. */
size_t dt_dataset_num_truncated(const dt_dataset *ds);
/* The targets of sample i that count in the loss: T for token shards, 1 for classification,
 * the answer's for chat and completion (0 when its answer was cut off). */
int dt_dataset_counted(const dt_dataset *ds, size_t i);
/* The tokens of sample i before the padding, its last target included: T + 1 for token shards,
 * T for classification, the example's (at most T + 1) for chat and completion. */
int dt_dataset_row_tokens(const dt_dataset *ds, size_t i);
/* Chat and completion: *out filled, returns 1; other formats: 0. */
int dt_dataset_sft_stats(const dt_dataset *ds, dt_sft_stats *out);

/* The tokens of sample i that are text, not padding: chat and completion, its examples' inputs
 * that have a next token (sft.h dt_sft_text); token shards T; classification its text's. */
int dt_dataset_text_tokens(const dt_dataset *ds, size_t i);
/* 1 when samples are packed rows (data.packing): read them with dt_dataset_get_pos. */
int dt_dataset_packed(const dt_dataset *ds);
/* dt_dataset_get, and pos(T): each token's position in its example (0..T-1 unless packed). */
void dt_dataset_get_pos(const dt_dataset *ds, size_t i, int *tokens, int *targets, int *pos);
/* Sample i: tokens(T) always; targets(T) for language modelling (-1 where a target does not
 * count: chat and completion), targets(1) = label for classification. i < dt_dataset_size(). */
void dt_dataset_get(const dt_dataset *ds, size_t i, int *tokens, int *targets);

/* One classification text as the model reads it, into row (seq_len ids): with the byte
 * tokenizer (tok NULL) its bytes cut to seq_len - 1, <cls>, then 0 padding; with a BPE
 * tokenizer its ids cut to seq_len, padded with the end-of-text id (the classifier reads the
 * last text token: GPT2ForSequenceClassification's convention). *truncated = 1 when cut.
 * *ids / *cap: the caller's BPE id buffer (grown with realloc; free it). DT_ERR_DATA (without
 * file or line: the caller's prefix) for a NUL byte (bytes), invalid UTF-8, no tokens, the
 * end-of-text token inside the text, or an id past 16 bits or no end-of-text token at all (BPE:
 * never cut to 16 bits; dt_tokenizer_check_model refuses such a tokenizer before). */
dt_status dt_data_text_row(dt_tokenizer *tok, const char *text, size_t len, int seq_len, uint16_t *row,
                           int *truncated, uint32_t **ids, size_t *cap);

/* A data file whole (a .gz one decompressed; a FIFO or a device refused), malloc'ed into *out. */
dt_status dt_data_read_all(const char *file, unsigned char **out, size_t *len);

/* ---- sampler ----
 * Epoch order: identity when !shuffle, else a permutation seeded by (seed, epoch) only.
 * Global batch j of an epoch = order[j*G, (j+1)*G), G = world * batch_per_worker * accum;
 * micro-batch a of rank r = its consecutive slice: offset (a*world + r) * batch_per_worker... see
 * dt_sampler_batch. The incomplete last global batch is dropped. */
typedef struct dt_sampler dt_sampler;

typedef struct dt_sampler_cfg {
    size_t num_samples;
    uint64_t seed;
    int shuffle;
    int rank, world;          /* 0 <= rank < world */
    int batch_per_worker;     /* b */
    int accum;                /* micro-batches per optimizer step */
} dt_sampler_cfg;

dt_status dt_sampler_init(dt_sampler **out, const dt_sampler_cfg *cfg);
void dt_sampler_free(dt_sampler *s);
/* floor(num_samples / G) */
size_t dt_sampler_steps_per_epoch(const dt_sampler *s);
/* Writes the b sample indices of micro-batch `micro` (0..accum-1) of step `step`
 * (0..steps_per_epoch-1) of `epoch` for this rank. The global batch is split so that
 * micro-batch a holds order[j*G + a*world*b, j*G + (a+1)*world*b) and rank r takes the
 * r-th b-sized slice of that: the same samples are seen by one worker with world*b per
 * micro-batch as by `world` workers with b each. */
void dt_sampler_batch(dt_sampler *s, long epoch, size_t step, int micro, size_t *idx);
/* The same for the global batch that starts at sample `cursor` of the epoch's order
 * (dt_sampler_batch(step) == dt_sampler_batch_at(step * G)). A run resumed with another
 * world size continues the epoch from the saved cursor: no sample is seen twice or skipped. */
void dt_sampler_batch_at(dt_sampler *s, long epoch, size_t cursor, int micro, size_t *idx);
/* All G samples of the global batch at `cursor`, every rank's and micro-batch's (what a loss
 * averaged over the whole global batch needs to know on each rank, without a collective). */
void dt_sampler_global_at(dt_sampler *s, long epoch, size_t cursor, size_t *idx);
size_t dt_sampler_global_batch(const dt_sampler *s);           /* G */
size_t dt_sampler_steps_from(const dt_sampler *s, size_t cursor); /* whole global batches left after cursor */

/* Evaluation sharding: eval batch j covers samples [j*E, (j+1)*E), E = world * b, in order;
 * rank r takes its consecutive slice, which may be short or empty at the end. Returns the
 * number of eval batches ceil(n / E), and for batch j sets *start and *count for `rank`. */
size_t dt_eval_num_batches(size_t n, int world, int b);
void dt_eval_slice(size_t n, size_t j, int rank, int world, int b, size_t *start, int *count);

/* ---- shards ---- */
/* Writes an llm.c shard (version 1, uint16 tokens; tokens must be < 65536). Atomic: written
 * to a fresh temporary file (PATH.tmp.PID, or PATH.tmp.PID.K when that name is taken;
 * created O_EXCL|O_NOFOLLOW, so a link planted there is never followed) and renamed. */
dt_status dt_shard_write(const char *path, const uint32_t *tokens, size_t n);
/* `dtrain data tokenize --tokenizer T IN OUT` (IN: .gz read transparently; OUT the same file as
 * IN is refused, DT_ERR_USAGE, dt_file_check_output): with T "bytes"
 * every byte becomes one token; with T a tokenizer.json (tokenizer.h) IN is one document,
 * preceded by the end-of-text token when the tokenizer has one, in a version-1 shard when its
 * ids fit uint16, else version 7 (uint32). *n_tokens receives the count. */
dt_status dt_data_tokenize(const char *tokenizer, const char *in_path, const char *out_path, size_t *n_tokens);
/* `dtrain data detokenize --tokenizer T IN.bin OUT.txt`: a shard's tokens back to text (every
 * token, the end-of-text ones as their text), written atomically (OUT as IN refused, as above).
 * *n_bytes receives the size. */
dt_status dt_data_detokenize(const char *tokenizer, const char *in_path, const char *out_path, size_t *n_bytes);

#endif
