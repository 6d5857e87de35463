/* bench.c — `dtrain bench`: a scaling sweep over worker counts (include/dtrain/bench.h). */
#include "dtrain/bench.h"

#include <errno.h>
#include <ftw.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

/* The last "summary" record of a run's metrics.jsonl. */
static dt_status read_summary(const char *run_dir, dt_bench_row *row) {
    char path[DT_PATH_MAX + 32], line[8192];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
    int found = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        const char *type = json_string_value(json_object_get(o, "type"));
        if (type && strcmp(type, "summary") == 0) {
            row->steps = (long)json_integer_value(json_object_get(o, "steps"));
            row->train_s = json_number_value(json_object_get(o, "train_s"));
            row->eval_s = json_number_value(json_object_get(o, "eval_s"));
            row->samples_per_s = json_number_value(json_object_get(o, "samples_per_s"));
            row->tokens_per_s = json_number_value(json_object_get(o, "tokens_per_s"));
            row->comm_share = json_number_value(json_object_get(o, "comm_share"));
            found = 1;
        }
        json_decref(o);
    }
    fclose(f);
    if (!found) return dt_error_set(DT_ERR_INTERNAL, "%s: no summary record (did the run finish?)", path);
    return DT_OK;
}

static dt_status write_csv(const char *path, const dt_bench_row *rows, int n) {
    FILE *f = fopen(path, "w");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    fprintf(f, "workers,steps,train_s,eval_s,samples_per_s,tokens_per_s,speedup,efficiency,comm_share\n");
    for (int i = 0; i < n; i++)
        fprintf(f, "%d,%ld,%.4f,%.4f,%.2f,%.2f,%.4f,%.4f,%.4f\n", rows[i].workers, rows[i].steps, rows[i].train_s,
                rows[i].eval_s, rows[i].samples_per_s, rows[i].tokens_per_s, rows[i].speedup, rows[i].efficiency,
                rows[i].comm_share);
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
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", panel == 0 ? "#1f77b4" : "#d62728");
        for (int i = 0; i < n; i++)
            fprintf(f, "%.1f,%.1f ", PX(rows[i].workers), PY(panel == 0 ? rows[i].tokens_per_s : rows[i].efficiency));
        fprintf(f, "\"/>\n");
        for (int i = 0; i < n; i++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n", PX(rows[i].workers),
                    PY(panel == 0 ? rows[i].tokens_per_s : rows[i].efficiency), panel == 0 ? "#1f77b4" : "#d62728");
#undef PX
#undef PY
    }
    fprintf(f, "</svg>\n");
    if (fclose(f) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return DT_OK;
}

static int cmp_int(const void *a, const void *b) { return *(const int *)a - *(const int *)b; }

dt_status dt_bench_run(const dt_config *cfg, const int *workers_in, int n, long steps, FILE *out, dt_bench_row *rows_out) {
    int workers[DT_BENCH_MAX_RUNS];
    memcpy(workers, workers_in, (size_t)n * sizeof *workers);
    qsort(workers, (size_t)n, sizeof *workers, cmp_int);
    char dir[DT_PATH_MAX + 16];
    snprintf(dir, sizeof dir, "%s/bench", cfg->run.dir);
    dt_bench_row rows[DT_BENCH_MAX_RUNS];
    memset(rows, 0, sizeof rows);
    dt_config *c = malloc(sizeof *c);
    if (!c) return dt_error_set(DT_ERR_NOMEM, "out of memory");
    dt_status st = DT_OK;
    for (int i = 0; i < n && st == DT_OK; i++) {
        *c = *cfg;
        c->training.num_workers = workers[i];
        if (steps > 0) c->training.max_steps = steps;
        c->checkpoint.every_steps = 0;        /* measure training, not the disk */
        c->checkpoint.resume = DT_RESUME_NEVER;
        c->fault_tolerance.max_restarts = 0;  /* a failure is a result, not something to retry */
        snprintf(c->run.dir, sizeof c->run.dir, "%s/w%d", dir, workers[i]);
        fprintf(out, "bench: %d worker%s x batch %d, run dir %s ...\n", workers[i], workers[i] > 1 ? "s" : "",
                c->data.batch_size_per_worker, c->run.dir);
        fflush(out);
        /* bench owns bench/wN: start each run from an empty directory (no old checkpoints,
         * logs or event files to pile up or mix in) */
        if ((st = remove_tree(c->run.dir)) != DT_OK) break;
        dt_worker_opts opts = {.quiet = 1, .progress = 0};
        dt_launch_result res;
        if ((st = dt_worker_launch(c, &opts, &res)) != DT_OK) {
            dt_error_prefix("bench with %d workers", workers[i]);
            break;
        }
        if (res.stopped_by) {
            st = dt_error_set(DT_ERR_INTERRUPTED, "bench interrupted by SIG%s during the run with %d workers",
                              sigabbrev_np(res.stopped_by), workers[i]);
            break;
        }
        rows[i].workers = workers[i];
        if ((st = read_summary(c->run.dir, &rows[i])) != DT_OK) break;
    }
    free(c);
    if (st != DT_OK) return st;
    for (int i = 0; i < n; i++) {
        rows[i].speedup = rows[0].tokens_per_s > 0 ? rows[i].tokens_per_s / rows[0].tokens_per_s : 0;
        rows[i].efficiency = rows[i].speedup * (double)rows[0].workers / (double)rows[i].workers;
    }
    fprintf(out, "\n%7s  %6s  %9s  %8s  %10s  %10s  %7s  %10s  %15s\n", "workers", "steps", "train s", "eval s",
            "samples/s", "tokens/s", "speedup", "efficiency", "all-reduce wait");
    for (int i = 0; i < n; i++)
        fprintf(out, "%7d  %6ld  %9.2f  %8.2f  %10.1f  %10.0f  %6.2fx  %9.0f%%  %14.1f%%\n", rows[i].workers,
                rows[i].steps, rows[i].train_s, rows[i].eval_s, rows[i].samples_per_s, rows[i].tokens_per_s,
                rows[i].speedup, 100 * rows[i].efficiency, 100 * rows[i].comm_share);
    fprintf(out, "(speedup and efficiency against %d worker%s; all-reduce wait: share of step time spent waiting for "
                 "gradient and loss all-reduces)\n",
            rows[0].workers, rows[0].workers > 1 ? "s" : "");
    char csv[DT_PATH_MAX + 32], svg[DT_PATH_MAX + 32];
    snprintf(csv, sizeof csv, "%s/bench.csv", dir);
    snprintf(svg, sizeof svg, "%s/bench.svg", dir);
    DT_TRY(write_csv(csv, rows, n));
    DT_TRY(write_svg(svg, rows, n, cfg->source[0] ? cfg->source : "config"));
    fprintf(out, "wrote %s and %s\n", csv, svg);
    if (rows_out) memcpy(rows_out, rows, sizeof rows);
    return DT_OK;
}
