/* test_cuda_probe.c — (label gpu) the CUDA backend as the registry has it: its libraries are
 * found (versions), and on a GPU it opens and its probe kernel runs and writes its value back.
 * Skips (77) without a visible GPU. */
#include <stdio.h>

#include "check.h"
#include "dtrain/backend.h"

int main(void) {
    const dt_ops *cuda = dt_backend_ops(DT_DEVICE_CUDA);
    CHECK(cuda != NULL && cuda->versions != NULL && cuda->probe != NULL);
    char v[2048];
    cuda->versions(v, sizeof v);
    printf("%s\n", v);
    CHECK_STR_CONTAINS(v, "cuDNN");
    if (dt_backend_count(DT_DEVICE_CUDA) == 0) {
        printf("no GPU visible: skipped\n");
        return 77;
    }
    dt_backend *be = NULL;
    dt_backend_cfg bc = {.device = 0, .precision = 0, .rank = 0};
    dt_status st = dt_backend_open(DT_DEVICE_CUDA, &bc, &be);
    if (st == DT_OK) st = be->ops->probe(be->ctx);
    if (st != DT_OK) fprintf(stderr, "%s\n", dt_error_msg());
    CHECK(st == DT_OK);
    dt_backend_close(be);
    TEST_PASS("test_cuda_probe");
}
