/* clock.c — monotonic seconds (include/dtrain/clock.h). */
#include "dtrain/clock.h"

#include <time.h>

double dt_clock_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}
