/* fuzz_sft.c — chat and prompt/completion JSON lines (src/io/sft.c) read with the shipped BPE
 * (data/bpe/tokenizer.json) and a ChatML template (chat.c).
 *
 * Input: one byte of options (bit 0: completion, else chat; bit 1: data.train_on all; the rest:
 * seq_len 1..64), then the lines. Checked besides the sanitizers:
 *   - refused lines are an error with a message;
 *   - every kept example has a counted target (none of them could make a batch divide by 0), the
 *     counts add up to the stats, and the examples read are those kept plus those left out;
 *   - each row's ids lie in the vocabulary, its targets are -1 or the next token, and as many
 *     count as dt_sft_counted says. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/chat.h"
#include "dtrain/sft.h"
#include "dtrain/tokenizer.h"
#include "fuzz_util.h"

static dt_tokenizer *tok;
static dt_chat *tmpl;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    char path[700];
    snprintf(path, sizeof path, "%s/tokenizer_config.json", fuzz_scratch());
    static const char cfg[] = "{\"eos_token\": \"<|im_end|>\", \"chat_template\": \"{% for message in messages %}"
                              "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
                              "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}\"}";
    fuzz_write(path, cfg, sizeof cfg - 1);
    if (dt_tokenizer_open(DTRAIN_SOURCE_DIR "/data/bpe/tokenizer.json", &tok) != DT_OK ||
        dt_chat_open(fuzz_scratch(), &tmpl) != DT_OK) {
        fprintf(stderr, "fuzz_sft: %s\n", dt_error_msg());
        abort();
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const dt_sft_cfg cfg = {.chat = !(data[0] & 1), .train_on_all = (data[0] >> 1) & 1, .seq_len = 1 + (data[0] >> 2),
                            .tok = tok, .tmpl = tmpl};
    dt_sft *s = NULL;
    dt_status st = dt_sft_new(&s, &cfg);
    FUZZ_ASSERT(st == DT_OK, "dt_sft_new: %s", dt_error_msg());
    st = dt_sft_read(s, "input.jsonl", (const char *)data + 1, size - 1);
    fuzz_debug("dt_sft_read", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "refused with no message");
    dt_sft_stats ss;
    dt_sft_stats_get(s, &ss);
    const size_t n = dt_sft_size(s);
    FUZZ_ASSERT(st != DT_OK || n + ss.no_answer == ss.examples, "%zu kept + %zu left out != %zu read", n, ss.no_answer,
                ss.examples);
    int tokens[64], targets[64];
    const int V = dt_tokenizer_vocab_size(tok);
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        const int c = dt_sft_get(s, i, tokens, targets, NULL), len = dt_sft_tokens(s, i);
        int counted = 0;
        FUZZ_ASSERT(c >= 1 && c == dt_sft_counted(s, i), "row %zu: %d counted, dt_sft_counted %d", i, c,
                    dt_sft_counted(s, i));
        FUZZ_ASSERT(len >= 2 && len <= cfg.seq_len + 1, "row %zu: %d tokens for seq_len %d", i, len, cfg.seq_len);
        for (int t = 0; t < cfg.seq_len; t++) {
            FUZZ_ASSERT(tokens[t] >= 0 && tokens[t] < V, "row %zu token %d: id %d", i, t, tokens[t]);
            FUZZ_ASSERT(targets[t] == -1 || (t + 1 < len && (t + 1 >= cfg.seq_len || targets[t] == tokens[t + 1]) &&
                                             targets[t] < V),
                        "row %zu target %d: %d", i, t, targets[t]);
            counted += targets[t] >= 0;
        }
        FUZZ_ASSERT(counted == c, "row %zu: %d targets count, %d said", i, counted, c);
        total += (size_t)c;
    }
    FUZZ_ASSERT(total == ss.counted, "%zu counted in the rows, %zu in the stats", total, ss.counted);
    dt_sft_free(s);
    return 0;
}
