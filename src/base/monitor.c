/* monitor.c — worker processes seen from /proc (include/dtrain/monitor.h). */
#include "dtrain/monitor.h"

#include <errno.h>
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

dt_status dt_proc_read(pid_t pid, double *cpu_s, double *rss_mb, double *peak_rss_mb) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(path, "r");
    if (!f) return dt_error_set(DT_ERR_IO, "%s: %s", path, strerror(errno));
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    /* fields after the command name (which may contain spaces) start after the last ')' */
    const char *p = strrchr(buf, ')');
    unsigned long long utime = 0, stime = 0;
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &utime, &stime) != 2)
        return dt_error_set(DT_ERR_IO, "%s: unexpected format", path);
    long hz = sysconf(_SC_CLK_TCK);
    *cpu_s = (double)(utime + stime) / (double)(hz > 0 ? hz : 100);
    snprintf(path, sizeof path, "/proc/%ld/status", (long)pid);
    f = fopen(path, "r");
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

int dt_monitor_idle_rank(const dt_worker_sample *s, int n, double interval_s, char *msg, size_t msg_size) {
    if (n < 2) return -1;
    for (int r = 0; r < n; r++) {
        if (s[r].samples < 1 || s[r].cpu_pct >= 10.0) continue;
        double lo = 1e30, hi = 0;
        int busy = 1;
        for (int q = 0; q < n && busy; q++) {
            if (q == r) continue;
            if (s[q].samples < 1 || s[q].cpu_pct <= 50.0) busy = 0;
            if (s[q].cpu_pct < lo) lo = s[q].cpu_pct;
            if (s[q].cpu_pct > hi) hi = s[q].cpu_pct;
        }
        if (!busy) continue;
        char range[64];
        if (hi - lo >= 1.0) snprintf(range, sizeof range, "%.0f-%.0f%%", lo, hi);
        else snprintf(range, sizeof range, "%.0f%%", hi);
        snprintf(msg, msg_size,
                 "rank %d (pid %ld) is idle: %.0f%% CPU over the last %.0f s while the other worker%s used %s "
                 "(stuck in I/O, or starved of data?)",
                 r, s[r].pid, s[r].cpu_pct, interval_s, n > 2 ? "s" : "", range);
        return r;
    }
    return -1;
}
