/* fuzz_ckpt.c — checkpoint verification and loading (src/model/ckpt.c): the manifest, the
 * trainer state (trainer.json), and the weights and moments loaded into a model.
 *
 * Input: the files of one checkpoint, separated by "\n--8<--\n", in this order:
 *   manifest.json, trainer.json, config.yaml, model.safetensors, optimizer.safetensors
 * (an empty part: that file is missing). They are written to RUN/checkpoints/step_00000007.
 * Two passes over each input:
 *   1. dt_ckpt_find_latest(RUN) with the manifest as given (the manifest parser, the sizes
 *      and CRCs, the step directory listing);
 *   2. the manifest replaced by a correct one for the files given, then dt_ckpt_verify (so the
 *      mutations reach trainer.json), dt_ckpt_check_shape, dt_ckpt_load into a tiny model, and
 *      dt_config_load of config.yaml (as a resume does to report what changed).
 * Checked besides the sanitizers: every refusal has a message; a checkpoint that verifies
 * has a sane trainer state (world >= 1, global batch >= 1, step >= 0). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "dtrain/ckpt.h"
#include "fuzz_model.h"
#include "fuzz_util.h"

#define N_PARTS 5
static const char *const part_files[N_PARTS] = {"manifest.json", "trainer.json", "config.yaml", "model.safetensors",
                                                "optimizer.safetensors"};
static fuzz_model fixture;

static void fixture_free(void) { fuzz_model_free(&fixture); }

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    fuzz_scratch();
    fuzz_model_init(&fixture);
    atexit(fixture_free);
    return 0;
}

static void report(void *user, const char *msg) {
    FUZZ_ASSERT(msg[0], "a skipped checkpoint reported without a message");
    ++*(int *)user;
}

static void check_state(const dt_ckpt_state *s) {
    FUZZ_ASSERT(s->step >= 0 && s->epoch >= 0 && s->world >= 1 && s->global_batch >= 1,
                "verified state: step %ld epoch %ld world %d global batch %ld", s->step, s->epoch, s->world,
                s->global_batch);
}

/* The manifest dt_ckpt_save would have written for the files given. */
static void write_manifest(const char *dir, const fuzz_part *parts) {
    char *text = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&text, &len);
    fprintf(m, "{\"format\": \"dtrain-checkpoint\", \"version\": 1, \"step\": 7, \"files\": {");
    const char *comma = "";
    for (int i = 1; i < N_PARTS; i++) {
        if (!parts[i].n) continue;
        uint32_t crc = (uint32_t)crc32(0L, parts[i].p, (uInt)parts[i].n);
        fprintf(m, "%s\"%s\": {\"bytes\": %zu, \"crc32\": \"%08" PRIx32 "\"}", comma, part_files[i], parts[i].n, crc);
        comma = ", ";
    }
    fprintf(m, "}}\n");
    fclose(m);
    char p[800];
    snprintf(p, sizeof p, "%s/manifest.json", dir);
    fuzz_write(p, text, len);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char run[600], ckpts[700], dir[800], p[900];
    snprintf(run, sizeof run, "%s/run", fuzz_scratch());
    snprintf(ckpts, sizeof ckpts, "%s/checkpoints", run);
    snprintf(dir, sizeof dir, "%s/step_00000007", ckpts);
    fuzz_rm_tree(run);
    FUZZ_ASSERT(mkdir(run, 0755) == 0 && mkdir(ckpts, 0755) == 0 && mkdir(dir, 0755) == 0, "mkdir %s", dir);
    fuzz_part parts[N_PARTS];
    fuzz_split(data, size, parts, N_PARTS);
    for (int i = 0; i < N_PARTS; i++) {
        if (!parts[i].n) continue;
        snprintf(p, sizeof p, "%s/%s", dir, part_files[i]);
        fuzz_write(p, parts[i].p, parts[i].n);
    }

    dt_ckpt_state s;
    char found_dir[1200];
    int found = 0, skipped = 0;
    dt_error_clear();
    dt_status st = dt_ckpt_find_latest(run, report, &skipped, found_dir, sizeof found_dir, &s, &found);
    fuzz_debug(found ? "dt_ckpt_find_latest: found" : "dt_ckpt_find_latest: none", st);
    FUZZ_ASSERT(st == DT_OK && found + skipped == 1, "find_latest: %s, found %d, skipped %d", dt_status_str(st),
                found, skipped);
    if (found) check_state(&s);

    write_manifest(dir, parts);
    dt_error_clear();
    st = dt_ckpt_verify(dir, &s);
    fuzz_debug("dt_ckpt_verify (manifest made)", st);
    if (st != DT_OK) {
        FUZZ_ASSERT(st == DT_ERR_DATA && dt_error_msg()[0], "verify: %s \"%s\"", dt_status_str(st), dt_error_msg());
        return 0;
    }
    check_state(&s);
    dt_error_clear();
    st = dt_ckpt_check_shape(&s, &dt_model_config(fixture.m)->shape, dir);
    fuzz_debug("dt_ckpt_check_shape", st);
    FUZZ_ASSERT(st == DT_OK || (st == DT_ERR_CONFIG && dt_error_msg()[0]), "check_shape: %s", dt_status_str(st));
    dt_error_clear();
    st = dt_ckpt_load(dir, fixture.m, fixture.o);
    fuzz_debug("dt_ckpt_load", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "load: %s without a message", dt_status_str(st));
    snprintf(p, sizeof p, "%s/config.yaml", dir); /* read back on resume to say what changed */
    dt_config *saved = malloc(sizeof *saved);
    dt_error_clear();
    st = dt_config_load(saved, p, NULL, 0);
    fuzz_debug("dt_config_load(config.yaml)", st);
    FUZZ_ASSERT(st == DT_OK || dt_error_msg()[0], "config.yaml: %s without a message", dt_status_str(st));
    free(saved);
    return 0;
}
