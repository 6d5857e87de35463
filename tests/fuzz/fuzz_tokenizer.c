/* fuzz_tokenizer.c — the tokenizer.json reader and the tokenizer it builds (src/io/tokenizer.c),
 * and hfdir's test for dtrain's own byte tokenizer (dt_hf_is_byte_tokenizer).
 *
 * Input: tokenizer.json, then (after FUZZ_SEP) a text to encode. Checked besides the sanitizers:
 *   - a refused file is an error with a message;
 *   - an accepted one has a vocabulary of at least one id, its end-of-text id is -1 or one of
 *     them, and the text and a few fixed ones encode to ids inside the vocabulary, which decode;
 *   - a file dt_hf_is_byte_tokenizer calls dtrain's byte tokenizer opens, and encodes every
 *     text to its bytes (id = byte value): a model's texts are then read as bytes, so a file
 *     that would tokenize otherwise must not be taken for one. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/hfdir.h"
#include "dtrain/tokenizer.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_scratch();
    return 0;
}

/* Encodes text[0..n), checks the ids against the vocabulary, decodes them; returns the ids
 * (n_ids of them; the caller frees). */
static uint32_t *encode_checked(dt_tokenizer *t, const char *text, size_t n, size_t *n_ids) {
    uint32_t *ids = NULL;
    size_t cap = 0;
    *n_ids = 0;
    dt_status st = dt_tokenizer_encode(t, text, n, &ids, n_ids, &cap);
    fuzz_debug("encode", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "encode refused with no message");
    if (st != DT_OK) {
        free(ids);
        *n_ids = 0;
        return NULL;
    }
    const int v = dt_tokenizer_vocab_size(t);
    for (size_t i = 0; i < *n_ids; i++)
        FUZZ_ASSERT(ids[i] < (uint32_t)v, "id %u at %zu of a vocabulary of %d", ids[i], i, v);
    char *out = NULL;
    size_t len = 0;
    st = dt_tokenizer_decode(t, ids, *n_ids, &out, &len);
    fuzz_debug("decode", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "decode refused with no message");
    free(out);
    return ids;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part parts[2];
    fuzz_split(data, size, parts, 2);
    char path[600];
    snprintf(path, sizeof path, "%s/tokenizer.json", fuzz_scratch());
    fuzz_write(path, parts[0].p, parts[0].n);
    const int is_bytes = dt_hf_is_byte_tokenizer(path);

    dt_tokenizer *t = NULL;
    dt_status st = dt_tokenizer_open(path, &t);
    fuzz_debug("dt_tokenizer_open", st);
    if (st != DT_OK) {
        FUZZ_ASSERT(dt_error_msg()[0], "refused with no message");
        FUZZ_ASSERT(!is_bytes, "dt_hf_is_byte_tokenizer accepts a file the tokenizer refuses: %s", dt_error_msg());
        return 0;
    }
    const int v = dt_tokenizer_vocab_size(t), eot = dt_tokenizer_eot(t);
    FUZZ_ASSERT(v >= 1, "vocabulary of %d", v);
    FUZZ_ASSERT(eot >= -1 && eot < v, "end-of-text id %d of a vocabulary of %d", eot, v);

    static const char *fixed[] = {"Hello, world!", " the  quick\tbrown\n\nfox 12345 ", "caf\xc3\xa9 \xe2\x80\x94 \xe4\xb8\xad",
                                  "<|endoftext|>x<|im_end|>", ""};
    const size_t nf = sizeof fixed / sizeof fixed[0];
    for (size_t k = 0; k <= nf; k++) {
        const char *text = k < nf ? fixed[k] : (const char *)parts[1].p;
        const size_t n = k < nf ? strlen(fixed[k]) : parts[1].n;
        size_t n_ids = 0;
        uint32_t *ids = encode_checked(t, text, n, &n_ids);
        if (is_bytes && ids) {
            /* dtrain's byte tokenizer: one id per byte, the byte's value; a special token's
             * text is left to the added tokens, so only texts without "<|" are compared */
            if (!memmem(text, n, "<|", 2)) {
                FUZZ_ASSERT(n_ids == n, "a byte tokenizer gave %zu ids for %zu bytes", n_ids, n);
                for (size_t i = 0; i < n; i++)
                    FUZZ_ASSERT(ids[i] == (uint8_t)text[i], "a byte tokenizer gave id %u for byte %u at %zu", ids[i],
                                (unsigned)(uint8_t)text[i], i);
            }
        }
        free(ids);
    }
    dt_tokenizer_free(t);
    return 0;
}
