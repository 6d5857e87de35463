/* test_cuda_probe.c — (label gpu) the CUDA toolchain, driver and device work: one kernel
 * runs and writes its value back. Skips (77) without a visible GPU. */
#include <stdio.h>

#include "check.h"
#include "dtrain/cuda.h"
#include "dtrain/device.h"

int main(void) {
    char v[512];
    dt_cuda_versions(v, sizeof v);
    printf("%s\n", v);
    CHECK_STR_CONTAINS(v, "cuDNN");
    if (dt_device_cuda_count() == 0) {
        printf("no GPU visible: skipped\n");
        return 77;
    }
    dt_status st = dt_cuda_probe(0);
    if (st != DT_OK) fprintf(stderr, "%s\n", dt_error_msg());
    CHECK(st == DT_OK);
    TEST_PASS("test_cuda_probe");
}
