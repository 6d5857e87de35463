/* backend.c — the backend registry (include/dtrain/backend.h): one entry per backend, the
 * GPU count without CUDA, training.device resolution, open and close. */
#include "dtrain/backend.h"

#include <ctype.h>
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "dtrain/device.h"

extern const dt_ops dt_ops_cpu;  /* src/ops/ops_cpu.c */
extern const dt_ops dt_ops_cuda; /* src/ops/ops_cuda.c, in CUDA builds */

/* The registry: one entry per backend, by training.device kind; none where not built. */
static const dt_ops *const registry[DT_DEVICE_CUDA + 1] = {
    [DT_DEVICE_CPU] = &dt_ops_cpu,
#ifdef DTRAIN_HAVE_CUDA
    [DT_DEVICE_CUDA] = &dt_ops_cuda,
#endif
};
#define CUDA_OPS (registry[DT_DEVICE_CUDA])

const dt_ops *dt_backend_ops(dt_device_kind kind) {
    return kind >= 0 && (size_t)kind < sizeof registry / sizeof registry[0] ? registry[kind] : NULL;
}

/* Entries of `dir` whose name starts with `prefix` followed by a digit (prefix "" : any
 * entry not starting with '.'); -1 when the directory is not there. */
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

/* NVIDIA GPUs visible to this process, with no CUDA call (counted in CPU-only builds too, so
 * that the messages can say what is there). */
static int nvidia_gpus(void) {
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

int dt_backend_count(dt_device_kind kind) {
    switch (kind) {
    case DT_DEVICE_CPU: return 1;
    case DT_DEVICE_CUDA: return CUDA_OPS ? nvidia_gpus() : 0;
    default: return 0;
    }
}

dt_status dt_backend_resolve(const dt_config *cfg, dt_device_kind *out) {
    const int gpus = nvidia_gpus();
    const char *src = cfg->source[0] ? cfg->source : "config";
    switch (cfg->training.device) {
    case DT_DEVICE_CPU:
        *out = DT_DEVICE_CPU;
        return DT_OK;
    case DT_DEVICE_AUTO:
        *out = gpus > 0 && CUDA_OPS ? DT_DEVICE_CUDA : DT_DEVICE_CPU; /* bf16 on a CPU: its backend checks */
        return DT_OK;
    case DT_DEVICE_CUDA:
        if (gpus == 0)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: training.use_gpu/device asks for CUDA but no GPU is visible%s (hint: set "
                                "training.use_gpu: false, or training.device: auto to use what exists; check nvidia-smi "
                                "and CUDA_VISIBLE_DEVICES)", src,
                                getenv("CUDA_VISIBLE_DEVICES") ? " (CUDA_VISIBLE_DEVICES is set)" : "");
        if (!CUDA_OPS)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: training.use_gpu/device asks for CUDA, but this dtrain was built without the CUDA "
                                "backend (hint: install the CUDA toolkit, cuDNN and NCCL and rebuild, or set "
                                "training.use_gpu: false)", src);
        *out = DT_DEVICE_CUDA;
        return DT_OK;
    }
    return dt_error_set(DT_ERR_INTERNAL, "unknown device kind %d", (int)cfg->training.device);
}

dt_status dt_backend_check_workers(const dt_config *cfg, dt_device_kind kind, int workers) {
    if (kind != DT_DEVICE_CUDA) return DT_OK;
    const int gpus = dt_backend_count(kind);
    if (workers <= gpus) return DT_OK;
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    return dt_error_set(DT_ERR_CONFIG,
                        "%s: training.num_workers: %d workers need %d GPUs, but %d %s visible%s%s%s (hint: one worker "
                        "per GPU: set training.num_workers: %d)",
                        cfg->source[0] ? cfg->source : "config", workers, workers, gpus, gpus == 1 ? "is" : "are",
                        vis ? " (CUDA_VISIBLE_DEVICES=" : "", vis ? vis : "", vis ? ")" : "", gpus);
}

int dt_backend_unused_note(dt_device_kind kind, int workers, char *buf, size_t n) {
    const int devices = kind == DT_DEVICE_CUDA ? dt_backend_count(kind) : 0;
    if (devices <= workers) return 0;
    const int idle = devices - workers;
    snprintf(buf, n, "note: %d GPUs are visible but training.num_workers is %d: %d GPU%s stay%s unused (hint: "
             "training.num_workers: %d uses them all, with the same batch per worker; CUDA_VISIBLE_DEVICES picks which)",
             devices, workers, idle, idle > 1 ? "s" : "", idle > 1 ? "" : "s", devices);
    return 1;
}

dt_status dt_backend_require(dt_device_kind kind, const char *who, const char *alternative) {
    if (kind != DT_DEVICE_CUDA) return DT_OK;
    if (nvidia_gpus() == 0)
        return dt_error_set(DT_ERR_CONFIG, "%s: no GPU is visible (hint: check nvidia-smi and CUDA_VISIBLE_DEVICES, or %s)",
                            who, alternative);
    if (!CUDA_OPS)
        return dt_error_set(DT_ERR_CONFIG, "%s: this dtrain was built without the CUDA backend (hint: %s, or rebuild "
                            "with the CUDA toolkit, cuDNN and NCCL installed)", who, alternative);
    return DT_OK;
}

dt_status dt_backend_open(dt_device_kind kind, const dt_backend_cfg *cfg, dt_backend **out) {
    *out = NULL;
    const dt_ops *ops = dt_backend_ops(kind);
    if (!ops)
        return dt_error_set(DT_ERR_CONFIG, "training.device: %s: this dtrain was built without that backend (hint: "
                            "install the CUDA toolkit, cuDNN and NCCL and rebuild, or use training.device: cpu)",
                            dt_device_name(kind));
    dt_backend *be = dt_calloc(1, sizeof *be, "backend");
    if (!be) return DT_ERR_NOMEM;
    dt_backend_cfg c = *cfg;
    if (kind != DT_DEVICE_CPU && dt_backend_count(kind) == 1) c.device = 0;
    be->ops = ops;
    dt_status st = ops->open(&c, &be->ctx);
    if (st != DT_OK) {
        free(be);
        return st;
    }
    *out = be;
    return DT_OK;
}

void dt_backend_close(dt_backend *be) {
    if (!be) return;
    be->ops->close(be->ctx);
    free(be);
}

int dt_backend_print_versions(FILE *out) {
    int bad = 0;
    char buf[2048];
    if (dt_ops_cpu.versions) {
        bad += dt_ops_cpu.versions(buf, sizeof buf);
        fputs(buf, out);
    }
    if (CUDA_OPS && CUDA_OPS->versions) {
        bad += CUDA_OPS->versions(buf, sizeof buf);
        fputs(buf, out);
    } else {
        fprintf(out, "  CUDA      backend not built (cmake found no CUDA toolkit, or DTRAIN_CUDA=OFF)\n");
    }
    fprintf(out, "  CPUs      %d usable, NVIDIA GPUs visible: %d\n", dt_device_cpu_cores(), nvidia_gpus());
    return bad;
}

void dt_backend_print_devices(FILE *out) {
    fprintf(out, "  NVIDIA GPUs visible: %d (CUDA backend %s)\n", nvidia_gpus(), CUDA_OPS ? "built" : "not built");
}
