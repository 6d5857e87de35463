/* fuzz_config.c — the config loader (src/io/config.c) on arbitrary YAML and `--set` overrides.
 *
 * Input: the config file's text. Every line that starts with "#--set " (a YAML comment, so
 * the file still parses the same) also gives one override: the rest of the line, as
 * `dtrain train --set` would pass it. Checked besides the sanitizers:
 *   - a refused config is DT_ERR_CONFIG with a message (never a silent failure);
 *   - an accepted one prints (dt_config_print) as YAML that loads back to the same config
 *     (same digest, no key differs). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/config.h"
#include "fuzz_util.h"

#define MAX_OVERRIDES 8
#define SET_PREFIX "#--set "

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    setenv("DTRAIN_FUZZ_WORKERS", "2", 1); /* for ${...} substitution in the seeds */
    setenv("DTRAIN_FUZZ_EMPTY", "", 1);
    fuzz_scratch();
    return 0;
}

/* The overrides: malloc'd copies of the "#--set " lines; returns how many. */
static int collect_overrides(const uint8_t *data, size_t size, char **ovr) {
    int n = 0;
    size_t plen = strlen(SET_PREFIX);
    for (size_t i = 0; i < size && n < MAX_OVERRIDES;) {
        const uint8_t *nl = memchr(data + i, '\n', size - i);
        size_t end = nl ? (size_t)(nl - data) : size;
        if (end - i >= plen && memcmp(data + i, SET_PREFIX, plen) == 0) {
            size_t len = end - i - plen;
            ovr[n] = malloc(len + 1);
            memcpy(ovr[n], data + i + plen, len);
            ovr[n][len] = '\0';
            n++;
        }
        i = end + 1;
    }
    return n;
}

static void check_round_trip(const dt_config *cfg) {
    char *text = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&text, &len);
    FUZZ_ASSERT(mem != NULL, "open_memstream");
    dt_config_print(cfg, mem);
    fclose(mem);
    dt_config *back = malloc(sizeof *back);
    dt_status st = dt_config_load_string(back, "printed", text, NULL, 0);
    FUZZ_ASSERT(st == DT_OK, "the printed config does not load back: %s\n--- printed:\n%s", dt_error_msg(), text);
    char diff[1024];
    int nd = dt_config_diff(cfg, back, diff, sizeof diff);
    FUZZ_ASSERT(nd == 0 && dt_config_digest(cfg) == dt_config_digest(back),
                "the printed config loads back different: %s\n--- printed:\n%s", diff, text);
    free(back);
    free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[600];
    snprintf(path, sizeof path, "%s/fuzz.yaml", fuzz_scratch());
    fuzz_write(path, data, size);
    char *ovr[MAX_OVERRIDES];
    int n = collect_overrides(data, size, ovr);
    dt_config *cfg = malloc(sizeof *cfg);
    dt_error_clear();
    dt_status st = dt_config_load(cfg, path, (const char *const *)ovr, n);
    fuzz_debug("dt_config_load", st);
    if (st == DT_OK) check_round_trip(cfg);
    else FUZZ_ASSERT(st == DT_ERR_CONFIG && dt_error_msg()[0], "status %s, message \"%s\"", dt_status_str(st),
                     dt_error_msg());
    free(cfg);
    for (int i = 0; i < n; i++) free(ovr[i]);
    return 0;
}
