/* jsonfile.h — JSON files: one read as every input is opened (a regular file only: a FIFO or a
 * device never blocks), a value written as a new file: indented by 2, keys in insertion order, a
 * final newline, fsynced (dt_file_write_new: never through a link planted at the path). */
#ifndef DTRAIN_JSONFILE_H
#define DTRAIN_JSONFILE_H

#include <jansson.h>

#include "dtrain/status.h"

/* Writes obj (consumed; NULL: out of memory building it) to the new file `path`. Reals with
 * `real_digits` significant digits (0: jansson's 17, which read back exactly). DT_ERR_NOMEM or
 * DT_ERR_IO naming the path. */
dt_status dt_json_write_new(const char *path, json_t *obj, int real_digits);

/* Reads the JSON file `path` (dt_file_open_regular, then json_loadfd with jansson's decoding
 * `flags`) into *out, the caller's to json_decref (NULL on error). DT_ERR_DATA naming the file:
 * "PATH: not a regular file (a FIFO)", "PATH: cannot open: REASON", "PATH:LINE: not valid JSON:
 * REASON"; DT_ERR_IO for an I/O failure. */
dt_status dt_json_read(const char *path, size_t flags, json_t **out);

#endif
