/* status.h — error status codes and the per-thread error message.
 *
 * Recoverable errors are returned as dt_status; the function that detects the error
 * also records a human-readable message with dt_error_set() (file, key/line, what was
 * expected, a hint). Callers pass the status up with DT_TRY and the top level prints
 * dt_error_msg() and exits with dt_status_exit_code(). */
#ifndef DTRAIN_STATUS_H
#define DTRAIN_STATUS_H

#include <stddef.h>

/* The largest job: ranks 0 .. DT_MAX_WORLD-1. The config schema (training.num_workers), the
 * launchers, the collectives and every per-rank table use this one number. */
#define DT_MAX_WORLD 64

typedef enum dt_status {
    DT_OK = 0,
    DT_ERR_USAGE,    /* bad command line                       -> exit 2 */
    DT_ERR_CONFIG,   /* bad config file or --set override       -> exit 2 */
    DT_ERR_DATA,     /* bad input data or weights file          -> exit 2 */
    DT_ERR_IO,       /* file system error                       -> exit 1 */
    DT_ERR_NOMEM,    /* allocation failed                       -> exit 1 */
    DT_ERR_DEVICE,   /* device / library failure                -> exit 1 */
    DT_ERR_INTERNAL, /* a bug or an unexpected state            -> exit 1 */
    DT_ERR_INTERRUPTED /* SIGINT/SIGTERM stopped the run         -> exit 1 */
} dt_status;

/* Records the message for the current thread (printf-style); returns `st` so that
 * `return dt_error_set(DT_ERR_DATA, "...")` reads naturally. */
dt_status dt_error_set(dt_status st, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "prefix: " to the current message (adds context on the way up). */
void dt_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The last message recorded on this thread ("" if none). */
const char *dt_error_msg(void);
void dt_error_clear(void);

const char *dt_status_str(dt_status st);
/* 2 for usage/config/data errors, 1 for anything else, 0 for DT_OK. */
int dt_status_exit_code(dt_status st);

#define DT_TRY(expr)                               \
    do {                                           \
        dt_status dt_try_st_ = (expr);             \
        if (dt_try_st_ != DT_OK) return dt_try_st_; \
    } while (0)

/* Allocation helpers that record a message naming what failed. */
void *dt_malloc(size_t bytes, const char *what);
void *dt_calloc(size_t n, size_t size, const char *what);

#endif
