/* bench.c — `dtrain bench`: a scaling sweep over worker counts (include/dtrain/bench.h). */
#include "dtrain/bench.h"

#include "dtrain/comm_plan.h"

#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dtrain/backend.h"
#include "dtrain/device.h"
#include "dtrain/worker.h"

dt_status dt_bench_parse_workers(const char *list, int *workers, int *n) {
    *n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 1 || v > DT_MAX_WORLD || (*end && *end != ','))
            return dt_error_set(DT_ERR_USAGE, "--workers: expected worker counts 1..%d separated by commas, e.g. 1,2,4; got \"%s\"",
                                DT_MAX_WORLD, list);
        for (int i = 0; i < *n; i++)
            if (workers[i] == v) return dt_error_set(DT_ERR_USAGE, "--workers: %ld appears twice in \"%s\"", v, list);
        if (*n == DT_BENCH_MAX_RUNS)
            return dt_error_set(DT_ERR_USAGE, "--workers: at most %d counts", DT_BENCH_MAX_RUNS);
        workers[(*n)++] = (int)v;
        if (*end == ',' && !end[1])
            return dt_error_set(DT_ERR_USAGE, "--workers: \"%s\" ends with a comma", list);
        p = *end ? end + 1 : end;
    }
    if (*n == 0) return dt_error_set(DT_ERR_USAGE, "--workers: expected worker counts such as 1,2,4");
    return DT_OK;
}

dt_status dt_bench_parse_layouts(const char *list, dt_bench_layout *out, int *n) {
    *n = 0;
    const char *p = list;
    while (*p) {
        dt_bench_layout l = {1, 1, 1};
        int seen = 0; /* letters given: d 1, p 2, t 4 */
        const char *item = p;
        while (*p && *p != ',') {
            const int bit = *p == 'd' ? 1 : *p == 'p' ? 2 : *p == 't' ? 4 : 0;
            char *end;
            errno = 0;
            const long v = bit ? strtol(p + 1, &end, 10) : 0;
            if (!bit || (seen & bit) || end == p + 1 || errno || v < 1 || v > DT_MAX_WORLD || p[1] == '+' || p[1] == '-')
                return dt_error_set(DT_ERR_USAGE, "--layouts: expected layouts such as d4,d2t2,t4 (d: data-parallel "
                                    "replicas, p: pipeline stages, t: tensor-parallel shares; each 1 when left out), "
                                    "got \"%.*s\" in \"%s\"", (int)strcspn(item, ","), item, list);
            seen |= bit;
            *(bit == 1 ? &l.dp : bit == 2 ? &l.pp : &l.tp) = (int)v;
            p = end;
        }
        if ((long)l.dp * l.pp * l.tp > DT_MAX_WORLD)
            return dt_error_set(DT_ERR_USAGE, "--layouts: \"%.*s\" needs %ld workers, more than %d",
                                (int)strcspn(item, ","), item, (long)l.dp * l.pp * l.tp, DT_MAX_WORLD);
        if (*n == DT_BENCH_MAX_RUNS) return dt_error_set(DT_ERR_USAGE, "--layouts: at most %d layouts", DT_BENCH_MAX_RUNS);
        out[(*n)++] = l;
        if (*p == ',' && !p[1]) return dt_error_set(DT_ERR_USAGE, "--layouts: \"%s\" ends with a comma", list);
        if (*p == ',') p++;
    }
    if (*n == 0) return dt_error_set(DT_ERR_USAGE, "--layouts: expected layouts such as d4,d2t2,t4");
    return DT_OK;
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb;
    (void)flag;
    (void)ftw;
    return remove(path);
}

/* Removes `dir` and everything below it (nothing when it does not exist). */
static dt_status remove_tree(const char *dir) {
    if (access(dir, F_OK) != 0) return DT_OK;
    if (nftw(dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return dt_error_set(DT_ERR_IO, "%s: cannot remove the previous bench run: %s", dir, strerror(errno));
    return DT_OK;
}

static double median(double *v, int n);

/* The largest resident memory of a rank in a "workers" record (the launcher's samples) */
static double largest_rss(json_t *o) {
    json_t *w = json_object_get(o, "workers");
    double most = 0;
    for (size_t i = 0; i < json_array_size(w); i++)
        most = fmax(most, json_number_value(json_object_get(json_array_get(w, i), "rss_mb")));
    return most;
}

/* The last "summary" record of a run's metrics.jsonl, and the training's memory: the median over
 * the launcher's samples but the last (which may see the final save's staging) of the largest
 * rank's resident memory; 0 without samples. */
static dt_status read_summary(const char *run_dir, dt_bench_row *row) {
    char path[DT_PATH_MAX + 32], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    int found = 0, n_rss = 0;
    enum { MAX_SAMPLES = 4096 };
    double *rss = malloc(MAX_SAMPLES * sizeof *rss);
    if (!rss) {
        fclose(f);
        return dt_error_set(DT_ERR_NOMEM, "out of memory");
    }
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (type && strcmp(type, "workers") == 0 && n_rss < MAX_SAMPLES) rss[n_rss++] = largest_rss(o);
        if (type && strcmp(type, "summary") == 0) {
            row->steps = (long)json_integer_value(json_object_get(o, "steps"));
            row->train_s = json_number_value(json_object_get(o, "train_s"));
            row->eval_s = json_number_value(json_object_get(o, "eval_s"));
            row->samples_per_s = json_number_value(json_object_get(o, "samples_per_s"));
            row->tokens_per_s = json_number_value(json_object_get(o, "tokens_per_s"));
            row->comm_share = json_number_value(json_object_get(o, "comm_share"));
            row->sent_bytes = json_number_value(json_object_get(o, "sent_bytes_per_step"));
            found = 1;
        }
        json_decref(o);
    }
    fclose(f);
    row->rss_mb = n_rss > 1 ? median(rss, n_rss - 1) : n_rss ? rss[0] : 0;
    free(rss);
    if (!found) return dt_error_set(DT_ERR_INTERNAL, "%s: no summary record (did the run finish?)", path);
    return DT_OK;
}

static dt_status write_csv(const char *path, const dt_bench_row *rows, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    /* the first nine columns as before --repeat; then the runs, the spread and the flags */
    fprintf(f, "workers,steps,train_s,eval_s,samples_per_s,tokens_per_s,speedup,efficiency,comm_share,runs,"
               "tokens_per_s_min,tokens_per_s_max,flags,sent_bytes_per_step,layout,tensor_parallel,rss_mb,"
               "pipeline_parallel,micro_batches,bubble\n");
    for (int i = 0; i < n; i++) {
        const dt_bench_row *r = &rows[i];
        fprintf(f, "%d,%ld,%.4f,%.4f,%.2f,%.2f,%.4f,%.4f,%.4f,%d,%.2f,%.2f,%s%s%s,%.0f,%s,%d,%.1f,%d,%d,%.4f\n", r->workers,
                r->steps, r->train_s, r->eval_s, r->samples_per_s, r->tokens_per_s, r->speedup, r->efficiency,
                r->comm_share, r->runs, r->tokens_min, r->tokens_max, r->flags & DT_BENCH_NOISY ? "noisy;" : "",
                r->flags & DT_BENCH_SUPERLINEAR ? "above-110%;" : "", r->flags & DT_BENCH_LOW ? "under-50%;" : "",
                r->sent_bytes, r->layout, r->tp, r->rss_mb, r->pp, r->micro, r->bubble);
    }
    if (fclose(f) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return DT_OK;
}

/* text for an SVG element: &, < and > escaped */
static void svg_text(FILE *f, const char *s) {
    for (; *s; s++) {
        if (*s == '&') fputs("&amp;", f);
        else if (*s == '<') fputs("&lt;", f);
        else if (*s == '>') fputs("&gt;", f);
        else fputc(*s, f);
    }
}

#define BAD_FLAGS (DT_BENCH_NOISY | DT_BENCH_SUPERLINEAR)

/* Two panels side by side: tokens/s against workers (with the ideal line) and scaling
 * efficiency against workers. */
static dt_status write_svg(const char *path, const dt_bench_row *rows, int n, const char *title) {
    FILE *f = fopen(path, "w");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    const double W = 380, H = 270, L = 60, R = 20, T = 50, B = 50; /* one panel */
    int wmax = 1;
    double tmax = 0, base = rows[0].tokens_per_s / rows[0].workers;
    for (int i = 0; i < n; i++) {
        if (rows[i].workers > wmax) wmax = rows[i].workers;
        if (rows[i].tokens_per_s > tmax) tmax = rows[i].tokens_per_s;
    }
    if (base * wmax > tmax) tmax = base * wmax;
    double emax = 1.2; /* efficiency axis: 0..120%, more when a point is above */
    for (int i = 0; i < n; i++)
        if (rows[i].efficiency * 1.1 > emax) emax = rows[i].efficiency * 1.1;
    tmax *= 1.1;
    if (!(tmax > 0)) tmax = 1;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"12\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", 2 * W, H);
    fprintf(f, "<text x=\"%.0f\" y=\"18\" text-anchor=\"middle\" font-size=\"14\">dtrain bench: ", W);
    svg_text(f, title);
    fprintf(f, "</text>\n");
    for (int panel = 0; panel < 2; panel++) {
        double x0 = panel * W + L, x1 = panel * W + W - R, y0 = H - B, y1 = T;
        double ymax = panel == 0 ? tmax : emax;
#define PX(w) (x0 + (x1 - x0) * ((wmax > 1 ? (double)((w) - 1) / (wmax - 1) : 0.5)))
#define PY(v) (y0 - (y0 - y1) * ((v) / ymax))
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x0, y0, x1, y0);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"black\"/>\n", x0, y0, x0, y1);
        for (int k = 0; k <= 4; k++) { /* y ticks */
            double v = ymax * k / 4, y = PY(v);
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", x0, y, x1, y);
            if (panel == 0)
                fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3g%s</text>\n", x0 - 4, y + 4,
                        v >= 1e6 ? v / 1e6 : v >= 1e3 ? v / 1e3 : v, v >= 1e6 ? "M" : v >= 1e3 ? "k" : "");
            else fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.0f%%</text>\n", x0 - 4, y + 4, 100 * v);
        }
        for (int i = 0; i < n; i++) /* x ticks at the measured counts */
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%d</text>\n", PX(rows[i].workers), y0 + 16,
                    rows[i].workers);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">workers</text>\n", (x0 + x1) / 2, y0 + 36);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%s</text>\n", (x0 + x1) / 2, y1 - 8,
                panel == 0 ? "throughput (tokens/s; dashed: linear scaling)" : "scaling efficiency");
        /* reference: linear scaling, or 100% efficiency */
        if (panel == 0)
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"gray\" stroke-dasharray=\"4 3\"/>\n",
                    PX(1), PY(base), PX(wmax), PY(base * wmax));
        else
            fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"gray\" stroke-dasharray=\"4 3\"/>\n",
                    x0, PY(1.0), x1, PY(1.0));
        /* the line joins the results only; a flagged point (noisy, above 110%) is drawn hollow with a "?" */
        const char *color = panel == 0 ? "#1f77b4" : "#d62728";
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", color);
        for (int i = 0; i < n; i++)
            if (!(rows[i].flags & BAD_FLAGS))
                fprintf(f, "%.1f,%.1f ", PX(rows[i].workers), PY(panel == 0 ? rows[i].tokens_per_s : rows[i].efficiency));
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n; i++) {
            const double x = PX(rows[i].workers), y = PY(panel == 0 ? rows[i].tokens_per_s : rows[i].efficiency);
            if (rows[i].flags & BAD_FLAGS)
                fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"4\" fill=\"white\" stroke=\"%s\"/>"
                           "<text x=\"%.1f\" y=\"%.1f\" fill=\"%s\">?</text>\n", x, y, color, x + 6, y - 6, color);
            else fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", x, y, color);
        }
#undef PX
#undef PY
    }
    int flagged = 0;
    for (int i = 0; i < n; i++) flagged |= rows[i].flags & BAD_FLAGS;
    if (flagged)
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\" fill=\"#a00\">hollow points (?): too noisy or "
                   "above 110%% efficiency, not results (see the verdict under the table)</text>\n", W, H - 6);
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return DT_OK;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }
static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The median of v[0..n) (sorted in place). */
static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* One row from the K runs of one count: the median of each measure, the slowest and fastest. */
static void combine_runs(const dt_bench_row *runs, int k, dt_bench_row *row) {
    double v[6][DT_BENCH_MAX_REPEAT];
    row->workers = runs[0].workers;
    row->tp = runs[0].tp;
    row->pp = runs[0].pp;
    row->micro = runs[0].micro;
    row->bubble = runs[0].bubble;
    snprintf(row->layout, sizeof row->layout, "%s", runs[0].layout);
    row->steps = runs[0].steps;
    row->runs = k;
    row->tokens_min = row->tokens_max = runs[0].tokens_per_s;
    for (int j = 0; j < k; j++) {
        v[0][j] = runs[j].train_s;
        v[1][j] = runs[j].eval_s;
        v[2][j] = runs[j].samples_per_s;
        v[3][j] = runs[j].tokens_per_s;
        v[4][j] = runs[j].comm_share;
        v[5][j] = runs[j].rss_mb;
        row->tokens_min = fmin(row->tokens_min, runs[j].tokens_per_s);
        row->tokens_max = fmax(row->tokens_max, runs[j].tokens_per_s);
    }
    row->train_s = median(v[0], k);
    row->eval_s = median(v[1], k);
    row->samples_per_s = median(v[2], k);
    row->tokens_per_s = median(v[3], k);
    row->comm_share = median(v[4], k);
    row->rss_mb = median(v[5], k);
    row->sent_bytes = runs[0].sent_bytes;
}

/* One training run of the sweep into dir/wN (or wN-rK with repeats; a layout: dir/LAYOUT,
 * LAYOUT-rK), measured from its summary. `layout` NULL: the config's. */
static dt_status bench_one(const dt_config *cfg, dt_config *c, const dt_bench_opts *o, int workers,
                           const dt_bench_layout *layout, int k, const char *dir, FILE *out, dt_bench_row *row) {
    *c = *cfg;
    char name[32] = "";
    if (layout) { /* the first layout's global batch: batch_size_per_worker x its replicas */
        const int G = cfg->data.batch_size_per_worker * o->layouts[0].dp;
        workers = layout->dp * layout->pp * layout->tp;
        c->training.tensor_parallel = layout->tp;
        c->training.pipeline_parallel = layout->pp;
        if (G % layout->dp)
            return dt_error_set(DT_ERR_USAGE, "bench: --layouts: a global batch of %d (data.batch_size_per_worker %d x "
                                "%d replicas of the first layout) cannot be split over %d replicas", G,
                                cfg->data.batch_size_per_worker, o->layouts[0].dp, layout->dp);
        c->data.batch_size_per_worker = G / layout->dp;
        if (layout->pp > 1) { /* a pipeline takes its replica's batch in micro-batches of the first layout's batch */
            const int b0 = cfg->data.batch_size_per_worker, b = c->data.batch_size_per_worker;
            if (b % b0)
                return dt_error_set(DT_ERR_USAGE, "bench: --layouts: a replica's batch of %d does not split into "
                                    "micro-batches of %d (data.batch_size_per_worker)", b, b0);
            c->data.batch_size_per_worker = b0;
            c->training.grad_accum_steps *= b / b0;
        }
        size_t k0 = 0;
        const int f[3] = {layout->dp, layout->pp, layout->tp};
        for (int i = 0; i < 3; i++)
            if (f[i] > 1 || (i == 0 && workers == 1))
                k0 += (size_t)snprintf(name + k0, sizeof name - k0, "%c%d", "dpt"[i], f[i]);
    }
    c->training.num_workers = workers;
    const char *key;
    char why[512];
    if (dt_config_mesh_problem(c, &key, why, sizeof why))
        return dt_error_set(DT_ERR_USAGE, "bench: %s%s%d workers: %s: %s", name, name[0] ? ", " : "", workers, key, why);
    if (o->steps > 0) c->training.max_steps = o->steps;
    c->checkpoint.every_steps = 0;        /* measure training, not the disk */
    c->checkpoint.resume = DT_RESUME_NEVER;
    c->fault_tolerance.max_restarts = 0;  /* a failure is a result, not something to retry */
    char base[40];
    if (layout) snprintf(base, sizeof base, "%s", name);
    else snprintf(base, sizeof base, "w%d", workers);
    if (o->repeat > 1) snprintf(c->run.dir, sizeof c->run.dir, "%s/%s-r%d", dir, base, k + 1);
    else snprintf(c->run.dir, sizeof c->run.dir, "%s/%s", dir, base);
    char rep[32] = "";
    if (o->repeat > 1) snprintf(rep, sizeof rep, " (run %d of %d)", k + 1, o->repeat);
    fprintf(out, "bench: %s%s%d worker%s x batch %d%s, run dir %s ...\n", name, name[0] ? ": " : "", workers,
            workers > 1 ? "s" : "", c->data.batch_size_per_worker, rep, c->run.dir);
    fflush(out);
    /* bench owns bench/wN: start each run from an empty directory (no old checkpoints,
     * logs or event files to pile up or mix in) */
    DT_TRY(remove_tree(c->run.dir));
    dt_worker_opts wo = {.quiet = 1, .progress = 0};
    dt_launch_result res;
    dt_status st = dt_worker_launch(c, &wo, &res);
    if (st != DT_OK) {
        dt_error_prefix("bench with %d workers", workers);
        return st;
    }
    if (res.stopped_by)
        return dt_error_set(DT_ERR_INTERRUPTED, "bench interrupted by SIG%s during the run with %d workers",
                            sigabbrev_np(res.stopped_by), workers);
    row->workers = workers;
    row->tp = c->training.tensor_parallel;
    row->pp = c->training.pipeline_parallel;
    row->micro = c->training.grad_accum_steps;
    row->bubble = dt_mesh_bubble(row->pp, row->micro);
    snprintf(row->layout, sizeof row->layout, "%s", name);
    return read_summary(c->run.dir, row);
}

#define SAY(...) (k < size ? (void)(k += (size_t)snprintf(buf + k, size - k, __VA_ARGS__)) : (void)0)

/* Why row r (efficiency under 50%) scales badly: the first cause that fits. */
static size_t explain_low(const dt_bench_row *r, const dt_bench_env *env, char *buf, size_t size) {
    size_t k = 0;
    SAY("note: %d workers: %.0f%% efficiency: ", r->workers, 100 * r->efficiency);
    if (r->comm_share >= 0.25)
        SAY("%.0f%% of each step is spent waiting for the gradient all-reduce, so communication, not compute, limits "
            "scaling: every step sums the whole gradient while a worker computes only %ld tokens (batch_size_per_worker x "
            "seq_len x grad_accum_steps); raise data.batch_size_per_worker or training.grad_accum_steps so that compute "
            "hides the all-reduce, or use fewer workers\n", 100 * r->comm_share, env->tokens_per_worker_step);
    else if (env->cpu && (env->threads_fixed == 0 || (long)r->workers * env->threads_fixed > env->cores))
        SAY("CPU workers share this machine's %d cores (%s), so more workers add no compute here: a speedup can only "
            "come from costs one worker pays alone; on CPU use the fewest workers that fit, and add hosts or GPUs for "
            "more compute\n", env->cores,
            env->threads_fixed ? "more threads than cores in all" : "cores / workers threads each");
    else
        SAY("only %.0f%% of step time is all-reduce, but each worker's step (%.1f ms for %ld tokens) is too small for "
            "the costs every step adds with more workers (synchronisation, the slowest worker setting the pace); raise "
            "data.batch_size_per_worker so that each step does more work\n", 100 * r->comm_share,
            r->steps > 0 ? 1e3 * r->train_s / (double)r->steps : 0.0, env->tokens_per_worker_step);
    return k;
}

void dt_bench_verdict(dt_bench_row *rows, int n, const dt_bench_env *env, char *buf, size_t size) {
    size_t k = 0;
    if (size) buf[0] = '\0';
    const int busy = env->busy_before >= 0.5; /* half a core or more in use by others before the first run */
    for (int i = 0; i < n; i++) {
        dt_bench_row *r = &rows[i];
        r->flags = 0;
        const double spread = r->tokens_per_s > 0 ? (r->tokens_max - r->tokens_min) / r->tokens_per_s : 0;
        if (r->runs > 1 && spread > 0.15) {
            r->flags |= DT_BENCH_NOISY;
            SAY("warning: %d worker%s: its %d runs differ by %.0f%% in tokens/s (slowest %.0f, fastest %.0f): too noisy "
                "to compare (other processes, or CPU frequency changes); rerun on an idle machine\n", r->workers,
                r->workers > 1 ? "s" : "", r->runs,
                100 * spread, r->tokens_min, r->tokens_max);
        } else if (busy && r->runs == 1) {
            r->flags |= DT_BENCH_NOISY;
        }
        if (env->layouts) continue; /* the same workers laid out otherwise: no scaling to judge */
        if (i > 0 && r->efficiency > 1.10) {
            r->flags |= DT_BENCH_SUPERLINEAR;
            SAY("warning: %d workers: %.0f%% efficiency (%.2fx the throughput with %.0fx the workers) is above 100%%: with "
                "the same batch per worker that is not a real result; the %d-worker run was probably slowed (a busy "
                "machine, a cold cache): flagged ? in the table and hollow in bench.svg; rerun with --repeat 3 (medians) "
                "on an idle machine\n", r->workers, 100 * r->efficiency, r->speedup,
                (double)r->workers / rows[0].workers, rows[0].workers);
        } else if (i > 0 && r->efficiency < 0.5 && !(r->flags & DT_BENCH_NOISY)) {
            r->flags |= DT_BENCH_LOW;
            if (k < size) k += explain_low(r, env, buf + k, size - k);
        }
    }
    if (busy)
        SAY("warning: %.1f of the %d cores were busy with other processes when the bench started: they share the "
            "machine with the runs, so these times may not compare%s\n", env->busy_before, env->cores,
            rows[0].runs == 1 ? " (flagged ?); --repeat 3 shows how much they vary" : "");
}

static void print_table(FILE *out, const dt_bench_row *rows, int n, int repeat) {
    fprintf(out, "\n%7s  %6s  %9s  %8s  %10s  %10s  %7s  %10s  %15s  %12s%s\n", "workers", "steps", "train s", "eval s",
            "samples/s", "tokens/s", "speedup", "efficiency", "all-reduce wait", "MB sent/step",
            repeat > 1 ? "  tokens/s min-max" : "");
    for (int i = 0; i < n; i++) {
        const dt_bench_row *r = &rows[i];
        char range[64] = "";
        if (repeat > 1) snprintf(range, sizeof range, "  %8.0f-%.0f", r->tokens_min, r->tokens_max);
        fprintf(out, "%7d  %6ld  %9.2f  %8.2f  %10.1f  %10.0f  %6.2fx  %9.0f%%%s %14.1f%%  %12.3f%s\n", r->workers,
                r->steps, r->train_s, r->eval_s, r->samples_per_s, r->tokens_per_s, r->speedup, 100 * r->efficiency,
                r->flags & BAD_FLAGS ? "?" : " ", 100 * r->comm_share, r->sent_bytes / 1e6, range);
    }
    int flagged = 0;
    for (int i = 0; i < n; i++) flagged |= rows[i].flags & BAD_FLAGS;
    fprintf(out, "(speedup and efficiency against %d worker%s%s; all-reduce wait: share of step time spent waiting for "
                 "gradient and loss all-reduces; MB sent/step: by each worker, counted as a ring moves it%s)\n",
            rows[0].workers, rows[0].workers > 1 ? "s" : "", repeat > 1 ? ", from the medians of the runs" : "",
            flagged ? "; ?: not a result, see below" : "");
}

/* --layouts: each layout against the first */
static void print_layouts(FILE *out, const dt_bench_row *rows, int n, int repeat) {
    fprintf(out, "\n%-12s  %7s  %6s  %9s  %8s  %10s  %8s  %17s  %12s  %13s%s\n", "layout", "workers", "steps", "ms/step",
            "bubble", "tokens/s", "vs first", "collectives wait", "MB sent/step", "MB/rank (RSS)",
            repeat > 1 ? "  tokens/s min-max" : "");
    for (int i = 0; i < n; i++) {
        const dt_bench_row *r = &rows[i];
        char range[64] = "";
        if (repeat > 1) snprintf(range, sizeof range, "  %8.0f-%.0f", r->tokens_min, r->tokens_max);
        char bubble[32] = "-";
        if (r->pp > 1) snprintf(bubble, sizeof bubble, "%.0f%% (M%d)", 100 * r->bubble, r->micro);
        fprintf(out, "%-12s  %7d  %6ld  %9.1f  %8s  %10.0f  %7.2fx%s %16.1f%%  %12.3f  %13.0f%s\n", r->layout, r->workers,
                r->steps, r->steps > 0 ? 1e3 * r->train_s / (double)r->steps : 0.0, bubble, r->tokens_per_s, r->speedup,
                r->flags & BAD_FLAGS ? "?" : " ", 100 * r->comm_share, r->sent_bytes / 1e6, r->rss_mb, range);
    }
    fprintf(out, "(layout dDpPtT: D data-parallel replicas x P pipeline stages x T tensor-parallel shares, 1 when left out, "
                 "all at the first's global batch, a pipeline's in micro-batches of the first's batch per worker; bubble: "
                 "1F1B's estimated idle share of a step with M micro-batches, (P - 1) / (M + P - 1); vs first: "
                 "tokens/s against %s%s; collectives wait: share of step time in collectives compute did not hide "
                 "(gradients, the shares' activation sums, the stages' activations and their gradients, the per-step agreement); MB sent/step: by rank 0, counted as "
                 "a ring moves it; MB/rank: the largest rank's resident memory while it trained, the median of the launcher's "
                 "samples)\n", rows[0].layout,
            repeat > 1 ? ", from the medians of the runs" : "");
}

dt_status dt_bench_run(const dt_config *cfg, const dt_bench_opts *o, FILE *out, dt_bench_row *rows_out) {
    const int layouts = o->n_layouts > 0, n = layouts ? o->n_layouts : o->n, repeat = o->repeat > 0 ? o->repeat : 1;
    if (n < 1 || n > DT_BENCH_MAX_RUNS || repeat > DT_BENCH_MAX_REPEAT)
        return dt_error_set(DT_ERR_USAGE, "bench: 1..%d worker counts and 1..%d repeats, got %d and %d", DT_BENCH_MAX_RUNS,
                            DT_BENCH_MAX_REPEAT, n, repeat);
    int workers[DT_BENCH_MAX_RUNS] = {0};
    if (!layouts) {
        memcpy(workers, o->workers, (size_t)n * sizeof *workers);
        qsort(workers, (size_t)n, sizeof *workers, cmp_int);
    }
    char dir[DT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/bench", cfg->run.dir);
    dt_bench_env env = {.cpu = 1, .cores = dt_device_cpu_cores(), .threads_fixed = cfg->training.cpu_threads_per_worker,
                        .busy_before = dt_device_busy_cores(0.5),
                        .tokens_per_worker_step = (long)cfg->data.batch_size_per_worker * cfg->data.seq_len *
                                                  cfg->training.grad_accum_steps,
                        .layouts = layouts};
    dt_device_kind dev;
    if (dt_backend_resolve(cfg, &dev) == DT_OK) env.cpu = dev == DT_DEVICE_CPU;
    static dt_bench_row runs[DT_BENCH_MAX_RUNS][DT_BENCH_MAX_REPEAT];
    dt_bench_row rows[DT_BENCH_MAX_RUNS];
    memset(rows, 0, sizeof rows);
    dt_config *c = malloc(sizeof *c);
    if (!c) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    dt_status st = DT_OK;
    /* interleaved (1,2,4,1,2,4, ...): a machine that gets busier or quieter meanwhile touches every count alike */
    for (int k = 0; k < repeat && st == DT_OK; k++)
        for (int i = 0; i < n && st == DT_OK; i++) {
            memset(&runs[i][k], 0, sizeof runs[i][k]);
            st = bench_one(cfg, c, o, workers[i], layouts ? &o->layouts[i] : NULL, k, dir, out, &runs[i][k]);
        }
    free(c);
    if (st != DT_OK) return st;
    for (int i = 0; i < n; i++) combine_runs(runs[i], repeat, &rows[i]);
    for (int i = 0; i < n; i++) {
        rows[i].speedup = rows[0].tokens_per_s > 0 ? rows[i].tokens_per_s / rows[0].tokens_per_s : 0;
        rows[i].efficiency = rows[i].speedup * (double)rows[0].workers / (double)rows[i].workers;
    }
    char verdict[4096];
    dt_bench_verdict(rows, n, &env, verdict, sizeof verdict);
    if (layouts) print_layouts(out, rows, n, repeat);
    else print_table(out, rows, n, repeat);
    fputs(verdict, out);
    char csv[DT_PATH_MAX + 32], svg[DT_PATH_MAX + 32];
    snprintf(csv, sizeof csv, "%s/bench.csv", dir);
    snprintf(svg, sizeof svg, "%s/bench.svg", dir);
    DT_TRY(write_csv(csv, rows, n));
    if (!layouts) DT_TRY(write_svg(svg, rows, n, cfg->source[0] ? cfg->source : "config"));
    if (layouts) fprintf(out, "wrote %s\n", csv);
    else fprintf(out, "wrote %s and %s\n", csv, svg);
    if (rows_out) memcpy(rows_out, rows, sizeof rows);
    return DT_OK;
}
