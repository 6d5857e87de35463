/* jsonfile.c — JSON files read and written (include/dtrain/jsonfile.h). */
#include "dtrain/jsonfile.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dtrain/file.h"

dt_status dt_json_write_new(const char *path, json_t *obj, int real_digits) {
    if (!obj) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory building JSON", path);
    size_t flags = JSON_INDENT(2) | JSON_PRESERVE_ORDER | (real_digits > 0 ? JSON_REAL_PRECISION(real_digits) : 0);
    char *s = json_dumps(obj, flags);
    json_decref(obj);
    if (!s) return dt_error_set(DT_ERR_NOMEM, "%s: out of memory building JSON", path);
    size_t n = strlen(s);
    char *t = realloc(s, n + 2);
    if (!t) {
        free(s);
        return dt_error_set(DT_ERR_NOMEM, "%s: out of memory building JSON", path);
    }
    t[n++] = '\n';
    dt_status st = dt_file_write_new(path, t, n);
    free(t);
    return st;
}

dt_status dt_json_read(const char *path, size_t flags, json_t **out) {
    *out = NULL;
    int fd;
    DT_TRY(dt_file_open_regular(path, DT_ERR_DATA, &fd));
    json_error_t err;
    *out = json_loadfd(fd, flags, &err);
    close(fd);
    if (!*out) return dt_error_set(DT_ERR_DATA, "%s:%d: not valid JSON: %s", path, err.line, err.text);
    return DT_OK;
}
