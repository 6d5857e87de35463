/* jsonfile.h — a JSON value written as a new file: indented by 2, keys in insertion order, a
 * final newline, fsynced (dt_file_write_new: never through a link planted at the path). */
#ifndef DTRAIN_JSONFILE_H
#define DTRAIN_JSONFILE_H

#include <jansson.h>

#include "dtrain/status.h"

/* Writes obj (consumed; NULL: out of memory building it) to the new file `path`. Reals with
 * `real_digits` significant digits (0: jansson's 17, which read back exactly). DT_ERR_NOMEM or
 * DT_ERR_IO naming the path. */
dt_status dt_json_write_new(const char *path, json_t *obj, int real_digits);

#endif
