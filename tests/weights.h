/* weights.h — a run's final weights and its losses, for comparisons between runs. */
#ifndef DTRAIN_TEST_WEIGHTS_H
#define DTRAIN_TEST_WEIGHTS_H

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtrain/safetensors.h"
#include "testutil.h"

/* the train records' losses of a run's metrics.jsonl (at most max); returns how many */
static inline int read_losses(const char *run, double *loss, int max) {
    char path[1300], line[1 << 14];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(o != NULL);
        if (strcmp(json_string_value(json_object_get(o, "type")), "train") == 0 && n < max)
            loss[n++] = json_number_value(json_object_get(o, "loss"));
        json_decref(o);
    }
    fclose(f);
    return n;
}

/* all tensors of a run's model.safetensors, concatenated in file order */
static inline float *read_weights(const char *run, size_t *n) {
    char path[1300];
    snprintf(path, sizeof path, "%s/model.safetensors", run);
    dt_st_file *f;
    CHECK(dt_st_open(&f, path) == DT_OK);
    size_t total = 0;
    for (int i = 0; i < dt_st_count(f); i++) total += dt_st_tensor_at(f, i)->numel;
    float *w = malloc(total * sizeof(float));
    size_t off = 0;
    for (int i = 0; i < dt_st_count(f); i++) {
        const dt_st_tensor *t = dt_st_tensor_at(f, i);
        CHECK(dt_st_read_f32(f, t, w + off) == DT_OK);
        off += t->numel;
    }
    dt_st_close(f);
    *n = total;
    return w;
}

/* ||a - b|| / ||b|| over n floats */
static inline double rel_l2(const float *a, const float *b, size_t n) {
    double d2 = 0, b2 = 0;
    for (size_t i = 0; i < n; i++) {
        d2 += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        b2 += (double)b[i] * b[i];
    }
    return b2 > 0 ? sqrt(d2 / b2) : sqrt(d2);
}

/* Relative L2 distance between the final weights of two runs in test_dir(), printed. */
static inline double run_distance(const char *run_a, const char *run_b) {
    char ra[1300], rb[1300];
    snprintf(ra, sizeof ra, "%s/%s", test_dir(), run_a);
    snprintf(rb, sizeof rb, "%s/%s", test_dir(), run_b);
    size_t na, nb;
    float *wa = read_weights(ra, &na), *wb = read_weights(rb, &nb);
    CHECK_INT_EQ(na, nb);
    double dist = rel_l2(wa, wb, na);
    printf("%s vs %s: weights rel L2 distance %.2e\n", run_a, run_b, dist);
    free(wa);
    free(wb);
    return dist;
}

/* the last evaluation's confusion matrix, as JSON text (the counts summed over the workers) */
static inline void read_confusion(const char *run, char *out, size_t n) {
    char path[1300], line[1 << 14];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run);
    FILE *f = fopen(path, "r");
    CHECK(f != NULL);
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        CHECK(o != NULL);
        json_t *c = json_object_get(o, "val_confusion");
        if (c) {
            char *d = json_dumps(c, JSON_COMPACT);
            snprintf(out, n, "%s", d);
            free(d);
        }
        json_decref(o);
    }
    fclose(f);
    CHECK(out[0] == '[');
}

#endif
