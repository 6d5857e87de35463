/* clock.h — the one clock every module measures with: monotonic seconds (CLOCK_MONOTONIC),
 * for deadlines, timeouts and step times. Never goes back; unrelated to the wall clock.
 * And the wall-clock stamp that log lines and metrics records carry. */
#ifndef DTRAIN_CLOCK_H
#define DTRAIN_CLOCK_H

/* Seconds since an arbitrary fixed point, with nanosecond resolution. */
double dt_clock_now(void);

/* The wall clock now as "2026-12-01T18:20:01.123Z" (UTC, ISO 8601, milliseconds): the stamp
 * of log lines and metrics records. buf: at least 32 bytes. Returns buf. */
#define DT_CLOCK_STAMP_LEN 32
char *dt_clock_stamp(char *buf);

#endif
