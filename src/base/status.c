/* status.c — per-thread error message store and status helpers. */
#include "dtrain/status.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static _Thread_local char dt_err_buf[2048];

dt_status dt_error_set(dt_status st, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(dt_err_buf, sizeof dt_err_buf, fmt, ap);
    va_end(ap);
    return st;
}

void dt_error_prefix(const char *fmt, ...) {
    char prefix[1024], old[sizeof dt_err_buf];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, dt_err_buf, sizeof old);
    snprintf(dt_err_buf, sizeof dt_err_buf, "%s: %s", prefix, old);
}

const char *dt_error_msg(void) { return dt_err_buf; }
void dt_error_clear(void) { dt_err_buf[0] = '\0'; }

const char *dt_status_str(dt_status st) {
    switch (st) {
    case DT_OK: return "ok";
    case DT_ERR_USAGE: return "usage error";
    case DT_ERR_CONFIG: return "config error";
    case DT_ERR_DATA: return "data error";
    case DT_ERR_IO: return "i/o error";
    case DT_ERR_NOMEM: return "out of memory";
    case DT_ERR_DEVICE: return "device error";
    case DT_ERR_INTERNAL: return "internal error";
    case DT_ERR_INTERRUPTED: return "interrupted";
    }
    return "unknown error";
}

int dt_status_exit_code(dt_status st) {
    switch (st) {
    case DT_OK: return 0;
    case DT_ERR_USAGE:
    case DT_ERR_CONFIG:
    case DT_ERR_DATA: return 2;
    default: return 1;
    }
}

void *dt_malloc(size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) dt_error_set(DT_ERR_NOMEM, "out of memory allocating %zu bytes for %s", bytes, what);
    return p;
}

void *dt_calloc(size_t n, size_t size, const char *what) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) dt_error_set(DT_ERR_NOMEM, "out of memory allocating %zu x %zu bytes for %s", n, size, what);
    return p;
}
