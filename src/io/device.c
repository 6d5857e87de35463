/* device.c — the host: CPU cores, the thread budget, OpenBLAS advice, host library versions. */
#include "dtrain/device.h"

#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>
#include <yaml.h>
#include <zlib.h>
#include <jansson.h>

#include <openblas_config.h> /* OPENBLAS_VERSION: the headers this binary was built with */
char *openblas_get_config(void);   /* OpenBLAS: build configuration string */
char *openblas_get_corename(void); /* OpenBLAS: the kernel set chosen at load time */

int dt_device_cpu_cores(void) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
        int n = CPU_COUNT(&set);
        if (n > 0) return n;
    }
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int dt_device_threads_per_worker(const dt_config *cfg) {
    if (cfg->training.cpu_threads_per_worker > 0) return cfg->training.cpu_threads_per_worker;
    int n = dt_device_cpu_cores() / (cfg->training.num_workers > 0 ? cfg->training.num_workers : 1);
    return n > 0 ? n : 1;
}

dt_status dt_device_cpu_time(double *busy_s, double *total_s) {
    cpu_set_t set;
    int have_set = sched_getaffinity(0, sizeof set, &set) == 0;
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return dt_error_set(DT_ERR_IO, "/proc/stat: %s", strerror(errno));
    char line[512];
    unsigned long long busy = 0, total = 0;
    int seen = 0;
    while (fgets(line, sizeof line, f)) {
        int cpu;
        unsigned long long v[8] = {0}; /* user nice system idle iowait irq softirq steal */
        if (strncmp(line, "cpu", 3) != 0 || line[3] < '0' || line[3] > '9' || sscanf(line + 3, "%d %llu %llu %llu %llu %llu %llu %llu %llu", &cpu, &v[0],
                                                   &v[1], &v[2], &v[3], &v[4], &v[5], &v[6], &v[7]) < 5)
            continue; /* the aggregate "cpu " line, and the rest of the file */
        if (have_set && (cpu < 0 || cpu >= CPU_SETSIZE || !CPU_ISSET(cpu, &set))) continue;
        const unsigned long long b = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
        busy += b;
        total += b + v[3] + v[4];
        seen++;
    }
    fclose(f);
    if (!seen) return dt_error_set(DT_ERR_IO, "/proc/stat: no per-CPU lines");
    long hz = sysconf(_SC_CLK_TCK);
    *busy_s = (double)busy / (double)(hz > 0 ? hz : 100);
    *total_s = (double)total / (double)(hz > 0 ? hz : 100);
    return DT_OK;
}

double dt_device_busy_cores(double window_s) {
    double b0, t0, b1, t1;
    if (dt_device_cpu_time(&b0, &t0) != DT_OK) return -1;
    struct timespec ts = {(time_t)window_s, (long)((window_s - (double)(time_t)window_s) * 1e9)};
    nanosleep(&ts, NULL);
    if (dt_device_cpu_time(&b1, &t1) != DT_OK || t1 <= t0) return -1;
    /* the share of the cores' time that was busy, times the cores */
    return (b1 - b0) / (t1 - t0) * dt_device_cpu_cores();
}

int dt_device_blas_advice(char *buf, size_t n) {
#if defined(__x86_64__)
    const char *core = openblas_get_corename();
    if (!core || (strcasecmp(core, "Prescott") != 0 && strcasecmp(core, "Core2") != 0 &&
                  strcasecmp(core, "Nehalem") != 0))
        return 0;
    __builtin_cpu_init();
    const char *better = __builtin_cpu_supports("avx512f") ? "SkylakeX"
                         : __builtin_cpu_supports("avx2")  ? "Haswell"
                                                           : NULL;
    if (!better) return 0;
    snprintf(buf, n,
             "note: OpenBLAS chose its generic %s kernels on a CPU with %s; matrix products may run several "
             "times faster with OPENBLAS_CORETYPE=%s in the environment (docs/PERFORMANCE.md)",
             core, strcmp(better, "SkylakeX") == 0 ? "AVX-512" : "AVX2", better);
    return 1;
#else
    (void)buf;
    (void)n;
    return 0;
#endif
}

/* "0.3.21" out of OpenBLAS's " OpenBLAS 0.3.21 " or "OpenBLAS 0.3.21 NO_LAPACKE ..." */
static void openblas_version(const char *s, char *buf, size_t n) {
    const char *p = strstr(s, "OpenBLAS ");
    p = p ? p + 9 : s;
    size_t k = 0;
    while (p[k] && p[k] != ' ' && k + 1 < n) {
        buf[k] = p[k];
        k++;
    }
    buf[k] = '\0';
}

/* One "  name  now (built with then)" line; returns 1 (and says MISMATCH) when they differ. */
static int version_line(FILE *out, const char *name, const char *now, const char *built, const char *extra) {
    int bad = strcmp(now, built) != 0;
    fprintf(out, "  %-9s %s (built with %s)%s%s\n", name, now, built, bad ? "  MISMATCH" : "", extra ? extra : "");
    return bad;
}

int dt_device_print_versions(FILE *out) {
    int bad = 0;
    bad += version_line(out, "libyaml", yaml_get_version_string(), DTRAIN_YAML_BUILD_VERSION, NULL);
    bad += version_line(out, "zlib", zlibVersion(), ZLIB_VERSION, NULL);
    bad += version_line(out, "jansson", jansson_version_str(), JANSSON_VERSION, NULL);
    char now[64], built[64], extra[128];
    openblas_version(openblas_get_config(), now, sizeof now);
    openblas_version(OPENBLAS_VERSION, built, sizeof built);
    snprintf(extra, sizeof extra, ", kernels %s", openblas_get_corename());
    bad += version_line(out, "OpenBLAS", now, built, extra);
    char advice[512];
    if (dt_device_blas_advice(advice, sizeof advice)) fprintf(out, "  %s\n", advice);
    return bad;
}

void dt_device_print_version_verdict(FILE *out, int bad) {
    if (bad)
        fprintf(out, "warning: %d librar%s differ%s from the version dtrain was built with (marked MISMATCH): "
                     "rebuild dtrain on this machine, or install the matching version\n",
                bad, bad > 1 ? "ies" : "y", bad > 1 ? "" : "s");
    else
        fprintf(out, "  every library found matches the version dtrain was built with\n");
}
