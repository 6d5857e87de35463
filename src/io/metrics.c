/* metrics.c — console (progress bar or plain lines), train.log and metrics.jsonl. */
#include "dtrain/metrics.h"

#include "dtrain/clock.h"
#include "dtrain/file.h"
#include "dtrain/monitor.h"
#include "dtrain/tboard.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

struct dt_metrics {
    dt_metrics_cfg cfg;
    FILE *jsonl, *log, *rank_log;
    int console;          /* rank 0 */
    int bar;              /* drawing a progress bar */
    int bar_visible;      /* the bar is on the current console line */
    double t0;            /* monotonic seconds at open */
    double last_draw;     /* monotonic seconds of the last bar redraw */
    long rate_step;       /* the step and time the smoothed rate was last updated at (0: no step yet) */
    double rate_t, rate;  /* steps per second, smoothed (tqdm's smoothing: 0.3 of the newest) */
    double last_workers;  /* monotonic seconds of the last console workers line */
    dt_tb *tb;            /* TensorBoard events (rank 0, when on) */
    int tb_failed;        /* a write failed: said once, then off */
};

void dt_metrics_close(dt_metrics *m) {
    if (!m) return;
    if (m->bar_visible) { fputs("\r\033[K", stdout); fflush(stdout); }
    dt_tb_close(m->tb);
    if (m->jsonl) fclose(m->jsonl);
    if (m->log) fclose(m->log);
    if (m->rank_log) fclose(m->rank_log);
    free(m);
}

void dt_metrics_set_total(dt_metrics *m, long total_steps) { m->cfg.total_steps = total_steps; }

/* dir/name opened to append to; never through a link planted in the run directory */
static dt_status open_append(const char *dir, const char *name, FILE **out) {
    char path[2048];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd;
    DT_TRY(dt_file_open_write(path, 1, &fd));
    *out = dt_file_stream(fd, "a", path);
    return *out ? DT_OK : DT_ERR_NOMEM;
}

dt_status dt_metrics_open(dt_metrics **out, const dt_metrics_cfg *cfg) {
    *out = NULL;
    dt_metrics *m = dt_calloc(1, sizeof *m, "metrics");
    if (!m) return DT_ERR_NOMEM;
    m->cfg = *cfg;
    if (m->cfg.log_every < 1) m->cfg.log_every = 1;
    m->console = cfg->rank == 0;
    m->bar = m->console && !cfg->quiet && (cfg->progress == 1 || (cfg->progress < 0 && isatty(STDOUT_FILENO)));
    m->t0 = dt_clock_now();
    if (cfg->run_dir) {
        char name[32];
        snprintf(name, sizeof name, "rank-%d.log", cfg->rank);
        dt_status st = open_append(cfg->run_dir, name, &m->rank_log);
        if (st == DT_OK && m->console) st = open_append(cfg->run_dir, "metrics.jsonl", &m->jsonl);
        if (st == DT_OK && m->console) st = open_append(cfg->run_dir, "train.log", &m->log);
        if (st == DT_OK && m->console && cfg->tensorboard) st = dt_tb_open(&m->tb, cfg->run_dir);
        if (st != DT_OK) {
            dt_metrics_close(m);
            return st;
        }
    }
    *out = m;
    return DT_OK;
}

static void clear_bar(dt_metrics *m) {
    if (m->bar_visible) {
        fputs("\r\033[K", stdout);
        m->bar_visible = 0;
    }
}

static void vline(dt_metrics *m, int force, const char *fmt, va_list ap) {
    char buf[1024];
    vsnprintf(buf, sizeof buf, fmt, ap);
    if (m->console && (!m->cfg.quiet || force)) {
        clear_bar(m);
        fprintf(stdout, "%s\n", buf);
        fflush(stdout);
    }
    FILE *files[2] = {m->log, m->rank_log};
    char stamp[DT_CLOCK_STAMP_LEN];
    dt_clock_stamp(stamp);
    for (int i = 0; i < 2; i++)
        if (files[i]) {
            fprintf(files[i], "%s %s\n", stamp, buf);
            fflush(files[i]);
        }
}

void dt_metrics_info(dt_metrics *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(m, 0, fmt, ap);
    va_end(ap);
}

void dt_metrics_summary(dt_metrics *m, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vline(m, 1, fmt, ap);
    va_end(ap);
}

static void write_json(dt_metrics *m, json_t *obj) {
    if (!obj) return;
    char stamp[DT_CLOCK_STAMP_LEN]; /* every record starts with when it was written */
    json_t *rec = json_pack("{s:s}", "time", dt_clock_stamp(stamp));
    if (rec && json_object_update(rec, obj) == 0) {
        json_decref(obj);
        obj = rec;
    } else {
        json_decref(rec);
    }
    if (m->jsonl) {
        char *s = json_dumps(obj, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(17));
        if (s) {
            fprintf(m->jsonl, "%s\n", s);
            fflush(m->jsonl);
            free(s);
        }
    }
    json_decref(obj);
}

/* json reals must be finite; NaN/inf become null */
static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static void fmt_duration(char *buf, size_t n, double s) {
    if (!isfinite(s) || s < 0) s = 0;
    long t = (long)(s + 0.5);
    if (t >= 3600) snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

/* The terminal's width now (it may change while we run), else $COLUMNS, else 80. */
static int term_width(void) {
    struct winsize ws;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 0) return ws.ws_col;
    const char *c = getenv("COLUMNS");
    int w = c ? atoi(c) : 0;
    return w > 0 ? w : 80;
}

/* This process's own rate: steps since its first one over the time since, smoothed like
 * tqdm's (an exponential average, 0.3 of each new interval), so a resume does not count the
 * steps done before it. */
static void update_rate(dt_metrics *m, long step, double t, double step_ms) {
    if (m->rate_t == 0) { /* this process's first step: its own time is all there is to go by */
        m->rate_t = t;
        m->rate_step = step;
        m->rate = step_ms > 0 ? 1000.0 / step_ms : 0;
        return;
    }
    if (step > m->rate_step && t > m->rate_t) {
        double inst = (double)(step - m->rate_step) / (t - m->rate_t);
        m->rate = m->rate > 0 ? 0.3 * inst + 0.7 * m->rate : inst;
        m->rate_step = step;
        m->rate_t = t;
    }
}

/* One progress line that fits in `cols` - 1 columns: "LABEL  37%|=====>    | 925/2500
 * [00:12<00:21, 75.3 step/s] EXTRA". What does not fit goes first: EXTRA, then the bar
 * shrinks to 10 columns, then it goes too. */
static void draw_line(dt_metrics *m, const char *label, const char *unit, long done, long total, double elapsed,
                      double rate, const char *extra) {
    int cols = term_width() - 1;
    char el[32], eta[32], right[160];
    fmt_duration(el, sizeof el, elapsed);
    if (rate > 0 && total >= done) fmt_duration(eta, sizeof eta, (double)(total - done) / rate);
    else snprintf(eta, sizeof eta, "?");
    int pct = total > 0 ? (int)(100.0 * (double)done / (double)total) : 0;
    snprintf(right, sizeof right, " %ld/%ld [%s<%s, %.1f %s/s]", done, total, el, eta, rate, unit);
    char left[32];
    snprintf(left, sizeof left, "%s%3d%%", label, pct);
    int fixed = (int)strlen(left) + (int)strlen(right);
    char more[96] = "";
    if (extra) snprintf(more, sizeof more, "%s", extra);
    if (fixed + (int)strlen(more) + 12 > cols) { /* keep what comes before " |" (the loss) if that fits */
        char *cut = strstr(more, " |");
        if (cut) *cut = '\0';
    }
    extra = more;
    int with_extra = more[0] && fixed + (int)strlen(more) + 12 <= cols;
    int barw = cols - fixed - (with_extra ? (int)strlen(extra) : 0) - 2;
    if (barw > 40) barw = 40;
    char bar[48] = "";
    if (barw >= 10) {
        int filled = total > 0 ? (int)((double)done / (double)total * barw) : 0;
        bar[0] = '|';
        for (int i = 0; i < barw; i++) bar[1 + i] = i < filled ? '=' : (i == filled ? '>' : ' ');
        bar[1 + barw] = '|';
        bar[2 + barw] = '\0';
    }
    char line[512];
    snprintf(line, sizeof line, "%s%s%s%s", left, bar, right, with_extra ? extra : "");
    if ((int)strlen(line) > cols && cols > 0) line[cols] = '\0'; /* a very narrow terminal */
    fprintf(stdout, "\r\033[K%s", line);
    fflush(stdout);
    m->bar_visible = 1;
}

static void draw_bar(dt_metrics *m, const dt_train_point *p) {
    double t = dt_clock_now();
    update_rate(m, p->step, t, p->step_ms);
    char extra[96];
    snprintf(extra, sizeof extra, " loss %.4f | %.0f tok/s", p->loss, p->tokens_per_s);
    draw_line(m, "", "step", p->step, m->cfg.total_steps, t - m->t0, m->rate, extra);
}

void dt_metrics_eval_progress(dt_metrics *m, long done, long total, double elapsed_s) {
    if (!m->bar) return;
    double t = dt_clock_now();
    if (t - m->last_draw < 0.1 && done < total) return;
    m->last_draw = t;
    draw_line(m, "eval ", "batch", done, total, elapsed_s, elapsed_s > 0 ? (double)done / elapsed_s : 0, NULL);
}

/* One TensorBoard scalar; a failing event file is reported once, then left alone (the run
 * matters more than its plots). */
static void tb(dt_metrics *m, const char *tag, long step, double v) {
    if (!m->tb || m->tb_failed || !isfinite(v)) return;
    if (dt_tb_scalar(m->tb, tag, step, v) != DT_OK) {
        m->tb_failed = 1;
        dt_metrics_info(m, "warning: TensorBoard events are off from here: %s", dt_error_msg());
    }
}

void dt_metrics_config_text(dt_metrics *m, const char *config_text) {
    if (!m->tb || m->tb_failed) return;
    size_t n = strlen(config_text) + 16;
    char *md = dt_malloc(n, "config text");
    if (!md) return;
    snprintf(md, n, "```\n%s```\n", config_text); /* markdown: shown as it is, one key a line */
    if (dt_tb_text(m->tb, "config", 0, md) != DT_OK) {
        m->tb_failed = 1;
        dt_metrics_info(m, "warning: TensorBoard events are off from here: %s", dt_error_msg());
    }
    free(md);
}

void dt_metrics_train(dt_metrics *m, const dt_train_point *p) {
    json_t *rec = json_pack("{s:s, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "type", "train", "step",
                            (json_int_t)p->step, "epoch", (json_int_t)p->epoch, "loss", num(p->loss), "lr", num(p->lr),
                            "grad_norm", num(p->grad_norm), "step_ms", num(p->step_ms), "tokens_per_s",
                            num(p->tokens_per_s), "comm_ms", num(p->comm_ms), "sent_bytes", num(p->sent_bytes));
    if (rec && isfinite(p->fwd_ms)) { /* logging.phase_times */
        json_object_set_new(rec, "fwd_ms", num(p->fwd_ms));
        json_object_set_new(rec, "bwd_ms", num(p->bwd_ms));
        json_object_set_new(rec, "opt_ms", num(p->opt_ms));
    }
    write_json(m, rec);
    tb(m, "train/loss", p->step, p->loss);
    tb(m, "train/lr", p->step, p->lr);
    tb(m, "train/grad_norm", p->step, p->grad_norm);
    tb(m, "train/tokens_per_s", p->step, p->tokens_per_s);
    tb(m, "train/step_ms", p->step, p->step_ms);
    tb(m, "train/comm_ms", p->step, p->comm_ms);
    if (p->step == 1 || p->step % m->cfg.log_every == 0 || p->step == m->cfg.total_steps) {
        int w = snprintf(NULL, 0, "%ld", m->cfg.total_steps);
        dt_metrics_info(m, "step %*ld/%ld | epoch %ld | loss %.6f | lr %.3e | grad norm %.4f | %.1f ms | %.0f tok/s", w,
                        p->step, m->cfg.total_steps, p->epoch, p->loss, p->lr, p->grad_norm, p->step_ms,
                        p->tokens_per_s);
    }
    /* redraw at most 10 times a second (fast steps would flood the terminal) */
    double t = dt_clock_now();
    if (m->bar && (t - m->last_draw >= 0.1 || p->step == m->cfg.total_steps || !m->bar_visible)) {
        draw_bar(m, p);
        m->last_draw = t;
    }
}

void dt_class_scores(const long *conf, int nl, dt_class_score *out, double *macro_f1) {
    double sum = 0;
    for (int k = 0; k < nl; k++) {
        long tp = conf[k * nl + k], support = 0, predicted = 0;
        for (int j = 0; j < nl; j++) {
            support += conf[k * nl + j];
            predicted += conf[j * nl + k];
        }
        dt_class_score *c = &out[k];
        c->support = support;
        c->precision = predicted ? (double)tp / (double)predicted : 0.0;
        c->recall = support ? (double)tp / (double)support : 0.0;
        c->f1 = c->precision + c->recall > 0 ? 2 * c->precision * c->recall / (c->precision + c->recall) : 0.0;
        sum += c->f1;
    }
    *macro_f1 = nl ? sum / nl : NAN;
}

/* The classification part of an eval: record fields, TensorBoard, and the console lines (only
 * up to 16 labels). */
static void eval_classes(dt_metrics *m, const dt_eval_point *p, const dt_class_score *sc, double macro, json_t *rec,
                         const char *prefix) {
    const int nl = p->num_labels;
    json_t *classes = json_array(), *conf = json_array();
    char line[2048], mat[2048];
    size_t k = 0, km = 0;
    for (int c = 0; c < nl; c++) {
        json_array_append_new(classes, json_pack("{s:i, s:o, s:o, s:o, s:I}", "label", c, "precision",
                                                 num(sc[c].precision), "recall", num(sc[c].recall), "f1", num(sc[c].f1),
                                                 "support", (json_int_t)sc[c].support));
        json_t *row = json_array();
        if (km < sizeof mat) km += (size_t)snprintf(mat + km, sizeof mat - km, "%s%d:", c ? " | " : "", c);
        for (int j = 0; j < nl; j++) {
            json_array_append_new(row, json_integer(p->confusion[c * nl + j]));
            if (km < sizeof mat) km += (size_t)snprintf(mat + km, sizeof mat - km, " %ld", p->confusion[c * nl + j]);
        }
        json_array_append_new(conf, row);
        if (k < sizeof line)
            k += (size_t)snprintf(line + k, sizeof line - k, "%s%d: precision %.4f recall %.4f f1 %.4f (%ld)", c ? " | " : "",
                                  c, sc[c].precision, sc[c].recall, sc[c].f1, sc[c].support);
        static const char *const what[] = {"precision", "recall", "f1"};
        const double v[] = {sc[c].precision, sc[c].recall, sc[c].f1};
        for (int w = 0; w < 3; w++) {
            char tag[96];
            snprintf(tag, sizeof tag, "%sclass%d/%s", prefix, c, what[w]);
            tb(m, tag, p->step, v[w]);
        }
    }
    json_object_set_new(rec, "val_f1_macro", num(macro));
    json_object_set_new(rec, "val_classes", classes);
    json_object_set_new(rec, "val_confusion", conf);
    char tag[96];
    snprintf(tag, sizeof tag, "%sf1_macro", prefix);
    tb(m, tag, p->step, macro);
    if (nl <= 16) {
        dt_metrics_info(m, "  per class: %s", line);
        dt_metrics_info(m, "  confusion (row: label, columns: predicted 0..%d): %s", nl - 1, mat);
    }
}

void dt_metrics_eval(dt_metrics *m, const dt_eval_point *p) {
    json_t *rec = json_pack("{s:s, s:I, s:o, s:o, s:I, s:o}", "type", "eval", "step", (json_int_t)p->step, "val_loss",
                            num(p->loss), "val_accuracy", num(p->accuracy), "val_examples", (json_int_t)p->examples,
                            "eval_ms", num(p->eval_ms));
    char prefix[48] = "val/", label[48] = "", tag[96];
    if (p->set) {
        json_object_set_new(rec, "set", json_string(p->set));
        snprintf(prefix, sizeof prefix, "val/%s/", p->set);
        snprintf(label, sizeof label, " [%s]", p->set);
    }
    snprintf(tag, sizeof tag, "%sloss", prefix);
    tb(m, tag, p->step, p->loss);
    snprintf(tag, sizeof tag, "%saccuracy", prefix);
    tb(m, tag, p->step, p->accuracy);
    const int cls = p->confusion && p->num_labels > 0 && p->num_labels <= DT_MAX_CLASS_METRICS;
    char f1[48] = "";
    dt_class_score sc[DT_MAX_CLASS_METRICS];
    double macro = NAN;
    if (cls) {
        dt_class_scores(p->confusion, p->num_labels, sc, &macro);
        snprintf(f1, sizeof f1, " | macro-F1 %.4f", macro);
    }
    dt_metrics_info(m, "eval at step %ld%s | val loss %.6f | val accuracy %.4f%s | %ld examples | %.1f s", p->step, label,
                    p->loss, p->accuracy, f1, p->examples, p->eval_ms / 1000.0);
    if (cls) eval_classes(m, p, sc, macro, rec, prefix); /* the per-class and confusion lines, under it */
    write_json(m, rec);
}

/* A GPU worker's GPU: its fields in the record, its TensorBoard scalars, its part of the line. */
static void worker_gpu(dt_metrics *m, long step, int r, const dt_worker_sample *w, json_t *rec, char *line, size_t n) {
    const dt_gpu_sample *g = &w->gpu;
    json_object_set_new(rec, "gpu", json_integer(g->index));
    json_object_set_new(rec, "gpu_util_pct", num(g->util_pct));
    json_object_set_new(rec, "gpu_mem_mb", num(g->mem_used_mb));
    json_object_set_new(rec, "gpu_mem_total_mb", num(g->mem_total_mb));
    json_object_set_new(rec, "gpu_temp_c", num(g->temp_c));
    json_object_set_new(rec, "gpu_power_w", num(g->power_w));
    json_object_set_new(rec, "gpu_peak_mem_mb", num(w->gpu_peak_mem_mb));
    static const char *const names[] = {"gpu_util", "gpu_mem_mb", "gpu_temp_c", "gpu_power_w"};
    const double vals[] = {g->util_pct, g->mem_used_mb, g->temp_c, g->power_w};
    for (int i = 0; i < 4; i++) {
        char tag[64];
        snprintf(tag, sizeof tag, "worker/rank%d/%s", r, names[i]);
        if (isfinite(vals[i])) tb(m, tag, step, vals[i]);
    }
    size_t k = strlen(line);
    if (k < n) k += (size_t)snprintf(line + k, n - k, ", gpu %d:", g->index);
    if (k < n && isfinite(g->util_pct)) k += (size_t)snprintf(line + k, n - k, " %.0f%% busy,", g->util_pct);
    if (k < n)
        k += (size_t)snprintf(line + k, n - k, " %.1f/%.1f GiB", g->mem_used_mb / 1024.0, g->mem_total_mb / 1024.0);
    if (k < n && isfinite(g->temp_c)) k += (size_t)snprintf(line + k, n - k, ", %.0f C", g->temp_c);
    if (k < n && isfinite(g->power_w)) snprintf(line + k, n - k, ", %.0f W", g->power_w);
}

void dt_metrics_workers(dt_metrics *m, long step, const dt_worker_sample *w, int n) {
    if (!m->console) return;
    json_t *arr = json_array();
    char line[2048];
    size_t k = 0;
    line[0] = '\0';
    for (int r = 0; r < n; r++) {
        if (w[r].samples < 1) continue; /* no sample (yet) */
        json_t *rec = json_pack("{s:i, s:I, s:o, s:o, s:o}", "rank", r, "pid", (json_int_t)w[r].pid, "cpu_pct",
                                num(w[r].cpu_pct), "rss_mb", num(w[r].rss_mb), "peak_rss_mb", num(w[r].peak_rss_mb));
        char tag[64];
        snprintf(tag, sizeof tag, "worker/rank%d/cpu_pct", r);
        tb(m, tag, step, w[r].cpu_pct);
        snprintf(tag, sizeof tag, "worker/rank%d/rss_mb", r);
        tb(m, tag, step, w[r].rss_mb);
        if (k < sizeof line)
            k += (size_t)snprintf(line + k, sizeof line - k, "%s rank %d: cpu %.0f%%, rss %.0f MB", k ? " |" : "", r,
                                  w[r].cpu_pct, w[r].rss_mb);
        if (w[r].has_gpu) {
            worker_gpu(m, step, r, &w[r], rec, line, sizeof line);
            k = strlen(line);
        }
        json_array_append_new(arr, rec);
    }
    write_json(m, json_pack("{s:s, s:I, s:o}", "type", "workers", "step", (json_int_t)step, "workers", arr));
    double t = dt_clock_now();
    if (k && t - m->last_workers >= 30.0) {
        m->last_workers = t;
        dt_metrics_info(m, "workers:%s", line);
    }
}

/* The summary's GPU memory: the JSON array (NULL when no rank has a GPU sample) and the
 * line's part (" | GPU: rank 0 31.2 GiB, ..."). */
static json_t *peak_gpu(const dt_run_summary *s, char *line, size_t n) {
    int any = 0;
    for (int r = 0; s->peak_gpu_mb && r < s->workers; r++) any |= isfinite(s->peak_gpu_mb[r]);
    if (!any) return NULL;
    json_t *arr = json_array();
    size_t k = (size_t)snprintf(line, n, " | GPU (NVML samples): ");
    for (int r = 0; r < s->workers; r++) {
        const double v = s->peak_gpu_mb[r];
        json_array_append_new(arr, num(v));
        if (k >= n) continue;
        if (s->workers > 1) k += (size_t)snprintf(line + k, n - k, "%srank %d ", r ? ", " : "", r);
        if (k < n) k += (size_t)(isfinite(v) ? snprintf(line + k, n - k, "%.1f GiB", v / 1024.0)
                                             : snprintf(line + k, n - k, "no sample"));
    }
    return arr;
}

void dt_metrics_final(dt_metrics *m, const dt_run_summary *s) {
    double share = s->train_s > 0 ? s->comm_s / s->train_s : 0.0;
    double sps = s->train_s > 0 ? (double)s->samples / s->train_s : 0.0, tps = s->train_s > 0 ? s->tokens / s->train_s : 0.0;
    json_t *peaks = json_array();
    char mem[1024];
    size_t k = 0;
    mem[0] = '\0';
    for (int r = 0; r < s->workers; r++) {
        json_array_append_new(peaks, num(s->peak_rss_mb[r]));
        if (k >= sizeof mem) continue;
        if (s->workers > 1)
            k += (size_t)snprintf(mem + k, sizeof mem - k, "%srank %d %.0f MB", r ? ", " : "", r, s->peak_rss_mb[r]);
        else
            k += (size_t)snprintf(mem + k, sizeof mem - k, "%.0f MB", s->peak_rss_mb[r]);
    }
    const char *verb = s->verb ? s->verb : "done";
    char gpu[1024] = "";
    json_t *gpu_peaks = peak_gpu(s, gpu, sizeof gpu);
    json_t *rec = json_pack("{s:s, s:s, s:I, s:I, s:I, s:o, s:o, s:I, s:o, s:o, s:o, s:i, s:o, s:o, s:o, s:o, s:o, s:I}",
                            "type", "summary", "status", verb, "steps", (json_int_t)s->steps, "first_step",
                            (json_int_t)s->first_step, "last_step", (json_int_t)s->last_step, "train_s",
                            num(s->train_s), "eval_s", num(s->eval_s),
                            "samples", (json_int_t)s->samples, "tokens", num(s->tokens), "samples_per_s", num(sps),
                            "tokens_per_s", num(tps), "workers", s->workers, "comm_s", num(s->comm_s), "comm_share",
                            num(share), "val_loss", num(s->val_loss), "val_accuracy", num(s->val_accuracy),
                            "peak_rss_mb", peaks, "checkpoints", (json_int_t)s->checkpoints);
    if (gpu_peaks) json_object_set_new(rec, "peak_gpu_mem_mb", gpu_peaks);
    const double sent_step = s->steps > 0 ? s->sent_bytes / (double)s->steps : 0;
    if (rec) json_object_set_new(rec, "sent_bytes_per_step", num(sent_step));
    const double comm_step_ms = s->steps > 0 ? 1e3 * s->comm_s / (double)s->steps : 0;
    if (rec) json_object_set_new(rec, "comm_ms_per_step", num(comm_step_ms));
    const double remote_step = s->steps > 0 ? s->remote_bytes / (double)s->steps : 0;
    if (rec && remote_step > 0) json_object_set_new(rec, "remote_bytes_per_step", num(remote_step));
    if (isfinite(s->val_f1_macro)) json_object_set_new(rec, "val_f1_macro", num(s->val_f1_macro));
    const double text_tps = s->text_tokens > 0 && s->train_s > 0 ? s->text_tokens / s->train_s : NAN;
    if (rec && s->text_tokens > 0) {
        json_object_set_new(rec, "text_tokens_per_s", num(text_tps));
        json_object_set_new(rec, "padding_share", num(s->padding));
        json_object_set_new(rec, "padding_share_unpacked", num(s->padding_unpacked));
    }
    const int cut = isfinite(s->row_len) && s->row_len > 0 && s->seq_len > 0; /* rows shorter than data.seq_len ran */
    if (rec && cut) json_object_set_new(rec, "row_len", num(s->row_len));
    write_json(m, rec);
    char range[64] = "";
    if (s->first_step > 0 && s->steps > 0) /* resumed: say which steps this run trained */
        snprintf(range, sizeof range, " (steps %ld-%ld)", s->first_step + 1, s->last_step);
    dt_metrics_summary(m, "%s: %ld steps%s | train %.1f s, eval %.1f s | %.0f samples/s, %.0f tokens/s", verb, s->steps,
                       range, s->train_s, s->eval_s, sps, tps);
    if (cut)
        dt_metrics_summary(m, "rows: %.1f positions on average of data.seq_len's %d (data.pad_to: longest; %.0f%%)",
                           s->row_len, s->seq_len, 100.0 * s->row_len / s->seq_len);
    if (s->text_tokens > 0)
        dt_metrics_summary(m, "text: %.0f tokens/s | padding %.1f%% of the rows' tokens (one example a row: %.1f%%)",
                           text_tps, 100.0 * s->padding, 100.0 * s->padding_unpacked);
    char between[96] = "";
    if (remote_step > 0)
        snprintf(between, sizeof between, " (all workers: %.3f MB per step between hosts)", remote_step / 1e6);
    if (s->workers > 1)
        dt_metrics_summary(m, "per worker: %.0f samples/s, %.0f tokens/s | waiting for all-reduce: %.1f%% of step time, "
                           "%.1f ms per step | sent %.3f MB per step%s", sps / s->workers, tps / s->workers, 100.0 * share,
                           comm_step_ms, sent_step / 1e6, between);
    if (isfinite(s->val_loss) && isfinite(s->val_f1_macro))
        dt_metrics_summary(m, "final: val loss %.6f | val accuracy %.4f | macro-F1 %.4f", s->val_loss, s->val_accuracy,
                           s->val_f1_macro);
    else if (isfinite(s->val_loss))
        dt_metrics_summary(m, "final: val loss %.6f | val accuracy %.4f", s->val_loss, s->val_accuracy);
    dt_metrics_summary(m, "peak memory: %s%s | checkpoints written: %ld", mem, gpu, s->checkpoints);
}

void dt_metrics_resume(dt_metrics *m, long step, const char *checkpoint, int attempt) {
    write_json(m, json_pack("{s:s, s:I, s:s, s:i}", "type", "resume", "step", (json_int_t)step, "checkpoint", checkpoint,
                            "attempt", attempt));
}
