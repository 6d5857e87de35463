/* device.c — CPU/GPU discovery without CUDA initialisation, thread budget, versions. */
#include "dtrain/device.h"

#include <ctype.h>
#include <dirent.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <yaml.h>
#include <zlib.h>
#include <jansson.h>

#ifdef DTRAIN_HAVE_CUDA
#include "dtrain/cuda.h"
#endif

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

/* Entries of `dir` whose name starts with `prefix` followed by a digit (prefix "" : any
 * entry not starting with '.'). */
static int count_entries(const char *dir, const char *prefix) {
    int n = 0;
    size_t k = strlen(prefix);
    DIR *d = opendir(dir);
    if (!d) return -1;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (k && (strncmp(e->d_name, prefix, k) != 0 || !isdigit((unsigned char)e->d_name[k]))) continue;
        n++;
    }
    closedir(d);
    return n;
}

int dt_device_cuda_count(void) {
    /* the driver's list; where /proc has no driver entries (some container runtimes), the
     * device nodes /dev/nvidia0, /dev/nvidia1, ... */
    int n = count_entries("/proc/driver/nvidia/gpus", "");
    if (n < 0) n = count_entries("/dev", "nvidia");
    if (n < 0) n = 0;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis && n > 0) {
        /* count the comma-separated entries up to the first invalid one, as CUDA does */
        int k = 0;
        const char *p = vis;
        while (*p && *p != '-') {
            while (*p == ' ') p++;
            if (!*p || *p == ',') break;
            k++;
            p = strchr(p, ',');
            if (!p) break;
            p++;
        }
        if (k < n) n = k;
    }
    return n;
}

int dt_device_cuda_built(void) {
#ifdef DTRAIN_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

dt_status dt_device_resolve(const dt_config *cfg, dt_device_kind *out) {
    int gpus = dt_device_cuda_count();
    const char *src = cfg->source[0] ? cfg->source : "config";
    switch (cfg->training.device) {
    case DT_DEVICE_CPU:
        *out = DT_DEVICE_CPU;
        return DT_OK;
    case DT_DEVICE_AUTO:
        *out = gpus > 0 && dt_device_cuda_built() ? DT_DEVICE_CUDA : DT_DEVICE_CPU;
        if (*out == DT_DEVICE_CPU && cfg->training.precision == DT_PREC_BF16)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: training.precision: bf16 needs a GPU, and training.device: auto found none "
                                "(hint: precision: auto or fp32)", src);
        return DT_OK;
    case DT_DEVICE_CUDA:
        if (gpus == 0)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: training.use_gpu/device asks for CUDA but no GPU is visible%s (hint: set "
                                "training.use_gpu: false, or training.device: auto to use what exists; check nvidia-smi "
                                "and CUDA_VISIBLE_DEVICES)", src,
                                getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : "");
        if (!dt_device_cuda_built())
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: training.use_gpu/device asks for CUDA, but this dtrain was built without the CUDA "
                                "backend (hint: install the CUDA toolkit, cuDNN and NCCL and rebuild, or set "
                                "training.use_gpu: false)", src);
        *out = DT_DEVICE_CUDA;
        return DT_OK;
    }
    return dt_error_set(DT_ERR_INTERNAL, "unknown device kind %d", (int)cfg->training.device);
}

dt_status dt_device_check_gpus_for_workers(const dt_config *cfg) {
    int gpus = dt_device_cuda_count();
    if (cfg->training.num_workers <= gpus) return DT_OK;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return dt_error_set(DT_ERR_CONFIG,
                        "%s: training.num_workers: %d workers need %d GPUs, but %d %s visible%s%s%s (hint: one worker "
                        "per GPU: set training.num_workers: %d)",
                        cfg->source[0] ? cfg->source : "config", cfg->training.num_workers, cfg->training.num_workers,
                        gpus, gpus == 1 ? "is" : "are", vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "",
                        vis ? ")" : "", gpus);
}

int dt_device_threads_per_worker(const dt_config *cfg) {
    if (cfg->training.cpu_threads_per_worker > 0) return cfg->training.cpu_threads_per_worker;
    int n = dt_device_cpu_cores() / (cfg->training.num_workers > 0 ? cfg->training.num_workers : 1);
    return n > 0 ? n : 1;
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
#ifdef DTRAIN_HAVE_CUDA
    char cuda[2048];
    bad += dt_cuda_versions(cuda, sizeof cuda);
    fputs(cuda, out);
#else
    fprintf(out, "  CUDA      backend not built (cmake found no CUDA toolkit, or DTRAIN_CUDA=OFF)\n");
#endif
    fprintf(out, "  CPUs      %d usable, NVIDIA GPUs visible: %d\n", dt_device_cpu_cores(), dt_device_cuda_count());
    return bad;
}

void dt_device_print_version_verdict(FILE *out, int bad) {
    if (bad)
        fprintf(out, "warning: %d librar%s differ%s from the version dtrain was built with (marked MISMATCH): "
                     "rebuild dtrain on this machine, or install the matching version\n",
                bad, bad > 1 ? "ies" : "y", bad > 1 ? "" : "s");
    else
        fprintf(out, "  every library matches the version dtrain was built with\n");
}
