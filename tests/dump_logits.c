/* dump_logits.c — a test tool: dump_logits DIR IDS OUT. Opens the model at DIR as `dtrain
 * predict --checkpoint DIR` does (a run, a checkpoint, or a Hugging Face directory), feeds the
 * token ids of IDS (little-endian int32) one at a time through the key/value-cache decoder, and
 * writes each position's next-token logits to OUT (float32, n x vocab_size), for
 * tests/test_smollm2.py to compare with an independent forward. Exit 0, or 1 with a message. */
#include <stdio.h>
#include <stdlib.h>

#include "dtrain/decode.h"
#include "dtrain/infer.h"

static int fail(const char *what) {
    fprintf(stderr, "dump_logits: %s: %s\n", what, dt_error_msg());
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: dump_logits DIR IDS OUT\n");
        return 2;
    }
    FILE *f = fopen(argv[2], "rb");
    int ids[4096];
    const size_t n = f ? fread(ids, sizeof *ids, sizeof ids / sizeof *ids, f) : 0;
    if (f) fclose(f);
    if (n == 0) {
        fprintf(stderr, "dump_logits: %s: no token ids\n", argv[2]);
        return 1;
    }
    dt_infer s;
    dt_infer_opts o = {.cmd = "dump_logits", .checkpoint = argv[1], .seq_len = (int)n};
    if (dt_infer_open(&s, &o) != DT_OK) return fail("open");
    const int V = dt_model_config(s.model)->shape.vocab_size;
    dt_decoder *d = NULL;
    float *lg = malloc((size_t)V * sizeof *lg);
    FILE *out = fopen(argv[3], "wb");
    int rc = !lg || !out || dt_decoder_open(&d, s.model, (int)n) != DT_OK ? fail("decoder") : 0;
    for (size_t i = 0; rc == 0 && i < n; i++) {
        if (dt_decoder_feed(d, ids + i, 1, lg) != DT_OK) rc = fail("feed");
        else if (fwrite(lg, sizeof *lg, (size_t)V, out) != (size_t)V) rc = fail("write");
    }
    if (out && fclose(out) != 0) rc = 1;
    free(lg);
    dt_decoder_free(d);
    dt_infer_close(&s);
    return rc;
}
