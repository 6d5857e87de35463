/* fuzz_hfconfig.c — a Hugging Face model directory's config.json and tokenizer_config.json as
 * model.init_from reads them (src/io/hfdir.c: dt_hf_read_config, dt_hf_read_tokens), and
 * config.json written back by export's dt_hf_write_config.
 *
 * Input: config.json, then (after FUZZ_SEP) tokenizer_config.json (absent when the input has
 * no separator). Checked besides the sanitizers:
 *   - a refused directory is an error with a message;
 *   - an accepted config has the shape its architecture's fields allow (arch.h's minimums:
 *     layers, heads, width, vocabulary and positions at least 1; the Llama family's key/value
 *     heads divide the query heads), and what dt_hf_write_config writes of it reads back to the
 *     same shape;
 *   - tokenizer_config.json's special tokens and template read or are refused with a message. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/hfdir.h"
#include "fuzz_util.h"

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_scratch();
    return 0;
}

static void check_shape(const dt_model_shape *s) {
    FUZZ_ASSERT(s->arch >= 0 && s->arch < DT_ARCH_COUNT, "architecture %d", (int)s->arch);
    FUZZ_ASSERT(s->n_layer >= 1 && s->n_head >= 1 && s->n_embd >= 1 && s->vocab_size >= 1 && s->n_positions >= 1,
                "shape L %d NH %d C %d V %d P %d", s->n_layer, s->n_head, s->n_embd, s->vocab_size, s->n_positions);
    FUZZ_ASSERT(s->num_labels == 0 || s->num_labels >= 2, "num_labels %d", s->num_labels);
    if (s->arch == DT_ARCH_LLAMA)
        FUZZ_ASSERT(s->num_key_value_heads >= 1 && s->num_key_value_heads <= s->n_head &&
                        s->n_head % s->num_key_value_heads == 0,
                    "key/value heads %d for %d query heads", s->num_key_value_heads, s->n_head);
}

static int same_shape(const dt_model_shape *a, const dt_model_shape *b) {
    return a->arch == b->arch && a->n_layer == b->n_layer && a->n_head == b->n_head && a->n_embd == b->n_embd &&
           a->vocab_size == b->vocab_size && a->n_positions == b->n_positions && a->num_labels == b->num_labels &&
           a->num_key_value_heads == b->num_key_value_heads && a->intermediate_size == b->intermediate_size &&
           a->head_dim == b->head_dim && a->rope_theta == b->rope_theta && a->rms_norm_eps == b->rms_norm_eps &&
           a->tie_word_embeddings == b->tie_word_embeddings && a->attention_bias == b->attention_bias &&
           a->qkv_bias == b->qkv_bias && a->rope_scaling_factor == b->rope_scaling_factor &&
           a->rope_low_freq_factor == b->rope_low_freq_factor && a->rope_high_freq_factor == b->rope_high_freq_factor &&
           a->rope_original_max_position_embeddings == b->rope_original_max_position_embeddings;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    fuzz_part parts[2];
    const int k = fuzz_split(data, size, parts, 2);
    char dir[600], out[620], path[700];
    snprintf(dir, sizeof dir, "%s/in", fuzz_scratch());
    snprintf(out, sizeof out, "%s/out", fuzz_scratch());
    fuzz_rm_tree(dir);
    fuzz_rm_tree(out);
    if (mkdir(dir, 0700) != 0 || mkdir(out, 0700) != 0) {
        perror("fuzz: mkdir");
        abort();
    }
    snprintf(path, sizeof path, "%s/config.json", dir);
    fuzz_write(path, parts[0].p, parts[0].n);
    if (k > 1) {
        snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
        fuzz_write(path, parts[1].p, parts[1].n);
    }

    dt_hf_tokens tok;
    void *held = NULL;
    dt_status st = dt_hf_read_tokens(dir, &tok, &held);
    fuzz_debug("dt_hf_read_tokens", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "tokenizer_config.json refused with no message");
    dt_hf_tokens_free(held);

    dt_hf_config c;
    st = dt_hf_read_config(dir, &c);
    fuzz_debug("dt_hf_read_config", st);
    if (st != DT_OK) {
        FUZZ_ASSERT(dt_error_msg()[0], "refused with no message");
        return 0;
    }
    check_shape(&c.shape);
    st = dt_hf_write_config(out, &c);
    FUZZ_ASSERT(st == DT_OK, "an accepted config does not write back: %s", dt_error_msg());
    dt_hf_config back;
    st = dt_hf_read_config(out, &back);
    FUZZ_ASSERT(st == DT_OK, "config.json as written does not read back: %s", dt_error_msg());
    FUZZ_ASSERT(same_shape(&c.shape, &back.shape), "config.json as written reads back to another shape");
    return 0;
}
