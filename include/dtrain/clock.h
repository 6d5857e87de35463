/* clock.h — the one clock every module measures with: monotonic seconds (CLOCK_MONOTONIC),
 * for deadlines, timeouts and step times. Never goes back; unrelated to the wall clock. */
#ifndef DTRAIN_CLOCK_H
#define DTRAIN_CLOCK_H

/* Seconds since an arbitrary fixed point, with nanosecond resolution. */
double dt_clock_now(void);

#endif
