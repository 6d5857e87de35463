/* test_nvml.c — GPU monitoring without a GPU: src/io/nvml.c against the fake NVML library
 * (tests/mockgpu/fake_nvml.c, built as build/fakenvml/libnvidia-ml.so.1), the idle-GPU rule of
 * src/base/monitor.c, and what src/io/metrics.c makes of GPU samples (the workers record, the
 * TensorBoard tags, the workers: line, the summary's peak GPU memory). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "dtrain/metrics.h"
#include "dtrain/monitor.h"
#include "dtrain/nvml.h"
#include "testutil.h"

#define BUS0 "00000000:3B:00.0"
#define BUS1 "00000000:5E:00.0"

static void test_open_errors(void) {
    dt_nvml *nv = NULL;
    /* no driver library: one error naming it */
    CHECK_INT_EQ(dt_nvml_open(DTRAIN_TEST_TMP "/no-such/libnvidia-ml.so.1", &nv), DT_ERR_DEVICE);
    CHECK(nv == NULL);
    CHECK_STR_CONTAINS(dt_error_msg(), "cannot load " DTRAIN_TEST_TMP "/no-such/libnvidia-ml.so.1 (part of the NVIDIA driver)");
    /* the library is there but the driver is not loaded */
    setenv("FAKE_NVML_INIT", "fail", 1);
    CHECK_INT_EQ(dt_nvml_open(FAKE_NVML, &nv), DT_ERR_DEVICE);
    CHECK_STR_CONTAINS(dt_error_msg(), "nvmlInit failed: Driver Not Loaded (error 9)");
    unsetenv("FAKE_NVML_INIT");
}

static void test_samples(void) {
    setenv("FAKE_NVML_GPUS", BUS0 "=87/30720/143771/61/412;" BUS1 "=3/1024/143771/-/-;00000000:86:00.0=x/1/2/3/4", 1);
    dt_nvml *nv = NULL;
    CHECK_OK(dt_nvml_open(FAKE_NVML, &nv));
    dt_gpu_sample g;
    CHECK_OK(dt_nvml_sample(nv, BUS0, &g));
    CHECK_INT_EQ(g.index, 0);
    CHECK(g.util_pct == 87 && g.temp_c == 61 && g.power_w == 412);
    CHECK_NEAR_REL(g.mem_used_mb, 30720, 1e-9, 1);
    CHECK_NEAR_REL(g.mem_total_mb, 143771, 1e-9, 1);
    CHECK_OK(dt_nvml_sample(nv, "00000000:3b:00.0", &g)); /* NVML's own case rules */
    /* a GPU that does not report temperature and power: no numbers, not zeros */
    CHECK_OK(dt_nvml_sample(nv, BUS1, &g));
    CHECK_INT_EQ(g.index, 1);
    CHECK(g.util_pct == 3 && isnan(g.temp_c) && isnan(g.power_w));
    /* a bus id NVML does not know, and a GPU whose utilisation cannot be read: errors naming it */
    CHECK_INT_EQ(dt_nvml_sample(nv, "00000000:99:00.0", &g), DT_ERR_DEVICE);
    CHECK_STR_CONTAINS(dt_error_msg(), "NVML has no GPU at PCI bus id 00000000:99:00.0: Not Found");
    /* a GPU whose utilisation cannot be read (MIG): its memory still counts */
    CHECK_OK(dt_nvml_sample(nv, "00000000:86:00.0", &g));
    CHECK(isnan(g.util_pct) && g.mem_used_mb == 1 && g.index == 2);
    dt_nvml_close(nv);
    dt_nvml_close(NULL);
}

static void test_slot_and_idle(void) {
    dt_worker_slot slot;
    memset(&slot, 0, sizeof slot);
    char bus[32];
    CHECK_INT_EQ(dt_worker_slot_gpu(&slot, bus, sizeof bus), 0); /* not named yet */
    dt_worker_slot_set_gpu(&slot, BUS1);
    CHECK_INT_EQ(dt_worker_slot_gpu(&slot, bus, sizeof bus), 1);
    CHECK_STR_EQ(bus, BUS1);

    const char ids[3][32] = {BUS0, BUS1, "00000000:86:00.0"};
    dt_worker_sample round[3] = {
        {.pid = 10, .cpu_pct = 99, .samples = 4, .has_gpu = 1, .gpu = {.index = 0, .util_pct = 97}},
        {.pid = 11, .cpu_pct = 99, .samples = 4, .has_gpu = 1, .gpu = {.index = 1, .util_pct = 2}},
        {.pid = 12, .cpu_pct = 99, .samples = 4, .has_gpu = 1, .gpu = {.index = 2, .util_pct = 93}}};
    char msg[600];
    /* a GPU idle while the others work is called out by rank, GPU index and bus id; its CPU is
     * busy (spinning on a stream), so the CPU rule alone would not see it */
    CHECK_INT_EQ(dt_monitor_idle_rank(round, 3, 2.0, msg, sizeof msg), -1);
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 3, 2.0, msg, sizeof msg), 1);
    CHECK_STR_CONTAINS(msg, "rank 1's GPU 1 (" BUS1 ") is idle: busy 2% of the last 2 s while the other workers' GPUs "
                            "were busy 93-97%");
    round[2].gpu.util_pct = 30; /* not every other GPU is busy: nobody is singled out */
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 3, 2.0, msg, sizeof msg), -1);
    round[1].gpu.util_pct = NAN; /* utilisation not reported: never called idle */
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 3, 2.0, msg, sizeof msg), -1);
    round[1].gpu.util_pct = 2;
    round[2].gpu.util_pct = 93;
    round[2].has_gpu = 0; /* a rank without a GPU sample: the others are not known to work */
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 3, 2.0, msg, sizeof msg), -1);
    round[2].has_gpu = 1;
    round[1].has_gpu = 0; /* the idle one has no sample: not called out */
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 3, 2.0, msg, sizeof msg), -1);
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 1, 2.0, msg, sizeof msg), -1); /* one worker: no others */
    round[1].has_gpu = 1;
    CHECK_INT_EQ(dt_monitor_idle_gpu(round, ids, 2, 2.0, msg, sizeof msg), 1);
    CHECK_STR_CONTAINS(msg, "rank 1's GPU 1 (00000000:5E:00.0) is idle: busy 2% of the last 2 s while the other worker's "
                            "GPU was busy 97%");
}

/* metrics.jsonl, TensorBoard and the console from GPU samples */
static void test_metrics(void) {
    const char *dir = test_path("run");
    test_mkdir_p(dir);
    dt_metrics *m = NULL;
    dt_metrics_cfg mc = {.run_dir = dir, .rank = 0, .total_steps = 10, .log_every = 1, .progress = 0, .tensorboard = 1};
    CHECK_OK(dt_metrics_open(&m, &mc));
    dt_worker_sample w[2] = {
        {.pid = 10, .cpu_pct = 99, .rss_mb = 900, .peak_rss_mb = 950, .samples = 1, .has_gpu = 1,
         .gpu = {.index = 0, .util_pct = 87, .mem_used_mb = 30720, .mem_total_mb = 143771, .temp_c = 61, .power_w = 412},
         .gpu_peak_mem_mb = 31744},
        {.pid = 11, .cpu_pct = 98, .rss_mb = 880, .peak_rss_mb = 930, .samples = 1, .has_gpu = 1,
         .gpu = {.index = 1, .util_pct = 85, .mem_used_mb = 30000, .mem_total_mb = 143771, .temp_c = NAN, .power_w = NAN},
         .gpu_peak_mem_mb = 30000}};
    dt_metrics_workers(m, 5, w, 2);
    const double rss[2] = {950, 930}, gpu[2] = {31744, NAN};
    dt_run_summary sum = {.verb = "done", .steps = 10, .last_step = 10, .workers = 2, .val_loss = NAN,
                          .val_accuracy = NAN, .peak_rss_mb = rss, .peak_gpu_mb = gpu};
    dt_metrics_final(m, &sum);
    dt_metrics_close(m);

    static char text[1 << 16];
    test_slurp(test_path("run/metrics.jsonl"), text, sizeof text);
    CHECK_STR_CONTAINS(text, "\"rank\":0,\"pid\":10,\"cpu_pct\":99.0,\"rss_mb\":900.0,\"peak_rss_mb\":950.0,"
                             "\"gpu\":0,\"gpu_util_pct\":87.0,\"gpu_mem_mb\":30720.0,\"gpu_mem_total_mb\":143771.0,"
                             "\"gpu_temp_c\":61.0,\"gpu_power_w\":412.0,\"gpu_peak_mem_mb\":31744.0");
    CHECK_STR_CONTAINS(text, "\"gpu\":1,\"gpu_util_pct\":85.0,\"gpu_mem_mb\":30000.0,\"gpu_mem_total_mb\":143771.0,"
                             "\"gpu_temp_c\":null,\"gpu_power_w\":null");
    CHECK_STR_CONTAINS(text, "\"peak_gpu_mem_mb\":[31744.0,null]");
    CHECK(strstr(text, "row_len") == NULL); /* a summary left at 0 there: no rows were cut */
    /* a GPU that does not report its utilisation: the line leaves it out */
    dt_worker_sample mig = w[1];
    mig.gpu.util_pct = NAN;
    const char *dir2 = test_path("run2");
    test_mkdir_p(dir2);
    dt_metrics_cfg mc2 = mc;
    mc2.run_dir = dir2;
    CHECK_OK(dt_metrics_open(&m, &mc2));
    dt_metrics_workers(m, 1, &mig, 1);
    dt_metrics_close(m);
    test_slurp(test_path("run2/train.log"), text, sizeof text);
    CHECK_STR_CONTAINS(text, "workers: rank 0: cpu 98%, rss 880 MB, gpu 1: 29.3/140.4 GiB\n");
    test_slurp(test_path("run/train.log"), text, sizeof text);
    CHECK_STR_CONTAINS(text, "workers: rank 0: cpu 99%, rss 900 MB, gpu 0: 87% busy, 30.0/140.4 GiB, 61 C, 412 W | "
                             "rank 1: cpu 98%, rss 880 MB, gpu 1: 85% busy, 29.3/140.4 GiB\n");
    CHECK_STR_CONTAINS(text, "peak memory: rank 0 950 MB, rank 1 930 MB | GPU (NVML samples): rank 0 31.0 GiB, rank 1 no "
                             "sample | checkpoints written: 0");
    /* the TensorBoard scalars: their tags in the event file (test_monitoring reads the CPU ones
     * back with the tensorboard package; the writer is the same) */
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "for t in rank0/gpu_util rank0/gpu_mem_mb rank0/gpu_temp_c rank0/gpu_power_w rank1/gpu_util "
             "rank1/gpu_mem_mb; do grep -q -a worker/$t %s/events.out.tfevents.* || exit 1; done; "
             "! grep -q -a -e worker/rank1/gpu_temp_c -e worker/rank1/gpu_power_w %s/events.out.tfevents.*", dir, dir);
    CHECK_INT_EQ(system(cmd), 0); /* every reported measure, and none for what the GPU does not report */
}

int main(void) {
    test_dir_init("nvml");
    test_open_errors();
    test_samples();
    test_slot_and_idle();
    test_metrics();
    test_dir_remove();
    TEST_PASS("test_nvml");
}
