/* monitor.c — worker processes seen from /proc (include/dtrain/monitor.h). */
#include "dtrain/monitor.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void dt_worker_slot_publish(dt_worker_slot *slot, const dt_worker_sample *s) {
    uint32_t q = atomic_load_explicit(&slot->seq, memory_order_relaxed);
    atomic_store_explicit(&slot->seq, q + 1, memory_order_relaxed); /* odd: writing */
    atomic_thread_fence(memory_order_release);
    slot->s = *s;
    atomic_store_explicit(&slot->seq, q + 2, memory_order_release);
}

dt_worker_sample dt_worker_slot_read(const dt_worker_slot *slot) {
    dt_worker_sample s;
    for (long tries = 0; tries < 100000; tries++) {
        uint32_t a = atomic_load_explicit(&slot->seq, memory_order_acquire);
        if (!(a & 1)) {
            s = slot->s;
            atomic_thread_fence(memory_order_acquire);
            if (atomic_load_explicit(&slot->seq, memory_order_relaxed) == a) return s;
        }
        if ((tries & 63) == 63) sched_yield(); /* the writer may have been preempted mid-write */
    }
    memset(&s, 0, sizeof s); /* "no sample": callers skip it */
    return s;
}

/* /proc/PID/stat's fields after the command name (which may contain spaces): from the state on;
 * NULL when the process is gone or the line is not as expected */
static const char *stat_fields(pid_t pid, char *path, size_t path_cap, char *buf, size_t cap) {
    snprintf(path, path_cap, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return NULL;
    size_t n = fread(buf, 1, cap - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    if (p && p[1] == ' ' && p[2]) return p + 2;
    errno = 0; /* read, but not as expected */
    return NULL;
}

char dt_proc_state(pid_t pid) {
    char path[64], buf[4096];
    const char *p = stat_fields(pid, path, sizeof path, buf, sizeof buf);
    return p ? *p : 0;
}

dt_status dt_proc_read(pid_t pid, double *cpu_s, double *rss_mb, double *peak_rss_mb) {
    char path[64], buf[4096];
    const char *p = stat_fields(pid, path, sizeof path, buf, sizeof buf);
    if (!p) return dt_error_set(DT_ERR_IO, "%s: %s", path, errno ? strerror(errno) : "unexpected format");
    unsigned long long utime = 0, stime = 0;
    if (sscanf(p, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return dt_error_set(DT_ERR_IO, "%s: unexpected format", path);
    long hz = sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(utime + stime) / (double)(hz > 0 ? hz : 100);
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: %s", path, strerror(errno));
    long rss_kb = 0, hwm_kb = 0;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "VmRSS:", 6) == 0) sscanf(line + 6, "%ld", &rss_kb);
        else if (strncmp(line, "VmHWM:", 6) == 0) sscanf(line + 6, "%ld", &hwm_kb);
    }
    fclose(f);
    *rss_mb = (double)rss_kb / 1024.0;
    *peak_rss_mb = (double)hwm_kb / 1024.0;
    return DT_OK;
}

void dt_worker_slot_set_gpu(dt_worker_slot *slot, const char *bus_id) {
    snprintf(slot->gpu_bus_id, sizeof slot->gpu_bus_id, "%s", bus_id);
    atomic_store_explicit(&slot->gpu_set, 1, memory_order_release);
}

int dt_worker_slot_gpu(const dt_worker_slot *slot, char *buf, size_t n) {
    if (!atomic_load_explicit(&slot->gpu_set, memory_order_acquire)) return 0;
    snprintf(buf, n, "%s", slot->gpu_bus_id);
    return 1;
}

/* The idle rule for one measure (v[r], has[r]: rank r has a sample): the first rank below 10
 * while every other is above 50; lo..hi of the others into range. -1 when none. */
static int idle_among(const double *v, const int *has, int n, char *range, size_t range_size) {
    if (n < 2) return -1;
    for (int r = 0; r < n; r++) {
        if (!has[r] || v[r] >= 10.0) continue;
        double lo = 1e30, hi = 0;
        int busy = 1;
        for (int q = 0; q < n && busy; q++) {
            if (q == r) continue;
            if (!has[q] || v[q] <= 50.0) busy = 0;
            if (v[q] < lo) lo = v[q];
            if (v[q] > hi) hi = v[q];
        }
        if (!busy) continue;
        if (hi - lo >= 1.0) snprintf(range, range_size, "%.0f-%.0f%%", lo, hi);
        else snprintf(range, range_size, "%.0f%%", hi);
        return r;
    }
    return -1;
}

int dt_monitor_idle_rank(const dt_worker_sample *s, int n, double interval_s, char *msg, size_t msg_size) {
    double v[DT_MAX_WORLD];
    int has[DT_MAX_WORLD];
    if (n > DT_MAX_WORLD) n = DT_MAX_WORLD;
    for (int r = 0; r < n; r++) {
        v[r] = s[r].cpu_pct;
        has[r] = s[r].samples >= 1;
    }
    char range[64];
    int r = idle_among(v, has, n, range, sizeof range);
    if (r >= 0)
        snprintf(msg, msg_size,
                 "rank %d (pid %ld) is idle: %.0f%% CPU over the last %.0f s while the other worker%s used %s "
                 "(stuck in I/O, or starved of data?)",
                 r, s[r].pid, s[r].cpu_pct, interval_s, n > 2 ? "s" : "", range);
    return r;
}

int dt_monitor_idle_gpu(const dt_worker_sample *s, const char (*bus_id)[32], int n, double interval_s, char *msg,
                        size_t msg_size) {
    double v[DT_MAX_WORLD];
    int has[DT_MAX_WORLD];
    if (n > DT_MAX_WORLD) n = DT_MAX_WORLD;
    for (int r = 0; r < n; r++) {
        v[r] = s[r].gpu.util_pct;
        has[r] = s[r].samples >= 1 && s[r].has_gpu && isfinite(s[r].gpu.util_pct); /* NaN: not reported */
    }
    char range[64];
    int r = idle_among(v, has, n, range, sizeof range);
    if (r >= 0)
        snprintf(msg, msg_size,
                 "rank %d's GPU %d (%s) is idle: busy %.0f%% of the last %.0f s while the other %s busy %s (is "
                 "rank %d on the GPU it should be, or waiting for its data or the CPU?)",
                 r, s[r].gpu.index, bus_id[r], s[r].gpu.util_pct, interval_s,
                 n > 2 ? "workers' GPUs were" : "worker's GPU was", range, r);
    return r;
}
