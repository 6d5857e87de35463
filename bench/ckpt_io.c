/* ckpt_io.c — benchmark: how long a checkpoint takes to write (fsynced), verify (CRC32 of
 * every file) and load, for a model of a given shape (default: GPT-2 124M).
 *
 *   bench_ckpt_io [--dir DIR] [--reps K] [--V 50257 --P 1024 --L 12 --C 768 --H 12]
 *
 * Prints the checkpoint size and, for each phase, the best time over K repetitions and the
 * bytes per second it implies. The write is what a training step that checkpoints waits for
 * (rank 0; the other ranks wait at a barrier). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/ckpt.h"
#include "dtrain/config.h"
#include "dtrain/backend.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) {
    fprintf(stderr, "bench_ckpt_io: %s: %s\n", what, dt_error_msg());
    exit(1);
}

static long dir_bytes(const char *dir) {
    static const char *const files[] = {"model.safetensors", "optimizer.safetensors", "trainer.json", "config.yaml",
                                        "manifest.json"};
    long total = 0;
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        char p[4200];
        struct stat sb;
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        if (stat(p, &sb) == 0) total += (long)sb.st_size;
    }
    return total;
}

int main(int argc, char **argv) {
    const char *dir = "/tmp/dtrain-bench-ckpt";
    int reps = 3;
    dt_model_cfg mc = {.shape = {.vocab_size = 50257, .n_positions = 1024, .n_layer = 12, .n_head = 12, .n_embd = 768, .num_labels = 0},
                       .seq_len = 8, .max_batch = 1, .seed = 1};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i];
        int v = atoi(argv[i + 1]);
        if (strcmp(k, "--dir") == 0) dir = argv[i + 1];
        else if (strcmp(k, "--reps") == 0) reps = v;
        else if (strcmp(k, "--V") == 0) mc.shape.vocab_size = v;
        else if (strcmp(k, "--P") == 0) mc.shape.n_positions = v;
        else if (strcmp(k, "--L") == 0) mc.shape.n_layer = v;
        else if (strcmp(k, "--C") == 0) mc.shape.n_embd = v;
        else if (strcmp(k, "--H") == 0) mc.shape.n_head = v;
        else {
            fprintf(stderr, "usage: bench_ckpt_io [--dir DIR] [--reps K] [--V n --P n --L n --C n --H n]\n");
            return 2;
        }
    }
    dt_backend *be;
    dt_model *m;
    dt_optim *o;
    if (dt_backend_open(DT_DEVICE_CPU, &(dt_backend_cfg){.threads = 1}, &be) != DT_OK) die("be");
    if (dt_model_init(&m, &mc, be) != DT_OK) die("model");
    int nt = dt_model_num_tensors(m);
    dt_param_seg *segs = calloc((size_t)nt, sizeof *segs);
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *t = dt_model_tensor(m, i);
        segs[i] = (dt_param_seg){t->offset, t->numel, t->ndim >= 2};
    }
    dt_optim_cfg oc = {.lr = 1e-3, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .total_steps = 1};
    if (dt_optim_init(&o, &oc, be, dt_model_num_params(m), segs, nt) != DT_OK) die("optimizer");
    dt_config cfg;
    if (dt_config_load_string(&cfg, "bench.yaml", "data: {train_path: none.bin}\n", NULL, 0) != DT_OK) die("config");
    mkdir(dir, 0755);
    dt_ckpt_state s = {.step = 1, .seed = 1, .world = 1, .global_batch = 1, .train_samples = 1, .model = mc.shape};
    char ck[4096];
    double best_save = 1e30, best_verify = 1e30, best_load = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = now_s();
        if (dt_ckpt_save(dir, m, o, &s, &cfg, ck, sizeof ck) != DT_OK) die("save");
        double t1 = now_s();
        dt_ckpt_state got;
        if (dt_ckpt_verify(ck, &got) != DT_OK) die("verify");
        double t2 = now_s();
        if (dt_ckpt_load(ck, m, o) != DT_OK) die("load");
        double t3 = now_s();
        if (t1 - t0 < best_save) best_save = t1 - t0;
        if (t2 - t1 < best_verify) best_verify = t2 - t1;
        if (t3 - t2 < best_load) best_load = t3 - t2;
    }
    double mb = (double)dir_bytes(ck) / 1e6;
    printf("checkpoint of %zu parameters: %.1f MB in %s (best of %d)\n", dt_model_num_params(m), mb, ck, reps);
    printf("  save (write + fsync + CRC32 + rename): %7.3f s  %7.1f MB/s\n", best_save, mb / best_save);
    printf("  verify (CRC32 of every file):          %7.3f s  %7.1f MB/s\n", best_verify, mb / best_verify);
    printf("  load (weights + moments):              %7.3f s  %7.1f MB/s\n", best_load, mb / best_load);
    dt_ckpt_prune(dir, 1);
    dt_optim_free(o);
    dt_model_free(m);
    dt_backend_close(be);
    free(segs);
    return 0;
}
