/* file.h — opening the files a user names, and creating the files dtrain writes, without
 * being redirected by what is already on disk.
 *
 * Inputs (config, data, weights, checkpoint files) are opened with dt_file_open_regular: a
 * FIFO, a device, a socket or a directory is refused at once, naming the file and what it
 * is, instead of blocking forever in open() or read(). Outputs never follow a symbolic link
 * in the last component of their path: a new file is created O_EXCL|O_NOFOLLOW (a name that
 * is taken — by a stale file or a planted link — is left alone and another one is used), a
 * log that is appended to is opened O_NOFOLLOW. Every function records a message naming the
 * path on error (dt_error_set) and leaves no descriptor open. */
#ifndef DTRAIN_FILE_H
#define DTRAIN_FILE_H

#include <stddef.h>
#include <stdio.h>

#include "dtrain/status.h"

/* The status for an input that failed with errno `e`: `bad_input` (the caller's status for bad
 * input, e.g. DT_ERR_DATA: exit 2, never retried) when a restart cannot fix it — the file is
 * missing (ENOENT, ENOTDIR), unreadable (EACCES, EPERM) or not reachable by its name (ELOOP,
 * ENAMETOOLONG, EISDIR) —, DT_ERR_IO (exit 1, retried) for anything else (EIO, EMFILE, ...). */
dt_status dt_file_errno_status(int e, dt_status bad_input);

/* Opens `path` for reading (following links: a user may link their inputs). It is opened
 * O_NONBLOCK|O_NOCTTY, checked with fstat and made blocking again, so a FIFO or a device
 * never blocks the open. On success *fd (O_CLOEXEC) is the caller's to close. Errors:
 * `not_regular` (the caller's status for bad input, e.g. DT_ERR_DATA: exit 2) with
 * "PATH: not a regular file (a FIFO)"; "PATH: cannot open: REASON" (errno kept from open())
 * with dt_file_errno_status(errno, not_regular). */
dt_status dt_file_open_regular(const char *path, dt_status not_regular, int *fd);

/* Creates a fresh temporary file for an atomic replace of `path`: "PATH.tmp.PID", or
 * "PATH.tmp.PID.K" (K = 1, 2, ...) when that name is taken by anything, a link included;
 * an existing entry is never opened, truncated or removed. O_WRONLY|O_CREAT|O_EXCL|
 * O_NOFOLLOW|O_CLOEXEC, mode 0644. `tmp` (n bytes) receives the name, *fd the descriptor.
 * DT_ERR_IO "PATH: cannot create TMP: REASON" on error. */
dt_status dt_file_create_temp(const char *path, char *tmp, size_t n, int *fd);

/* Writes all of buf (retrying short writes and EINTR); -1 with errno set on failure. */
int dt_file_write_all(int fd, const void *buf, size_t n);

/* Ends an atomic replace: renames the temporary file `tmp` (written, fsynced and closed) onto
 * `path` and fsyncs the directory holding it, so that the new file survives a crash. On a
 * failed rename `tmp` is removed. DT_ERR_IO naming both on error. */
dt_status dt_file_commit(const char *tmp, const char *path);

/* Creates `path`, which must not exist (O_EXCL|O_NOFOLLOW, 0644): for files written into a
 * directory dtrain has just made, and names that carry the pid. DT_ERR_IO on error. */
dt_status dt_file_create_new(const char *path, int *fd);

/* Creates `path` (as dt_file_create_new), writes buf[0..n) and fsyncs it. DT_ERR_IO naming the
 * path on error (the file may then be left partly written, as for a directory being built). */
dt_status dt_file_write_new(const char *path, const void *buf, size_t n);

/* Opens `path` for writing — appending (append = 1) or truncated — creating it (0644) when
 * missing. A symbolic link as the last component is refused ("PATH: is a symbolic link:
 * refusing to write through it"), and so are a file with more than one hard link ("PATH:
 * has 2 hard links: ...") and anything but a regular file: DT_ERR_DATA (what is on disk is
 * wrong: exit 2, not worth a retry); DT_ERR_IO when the open fails. */
dt_status dt_file_open_write(const char *path, int append, int *fd);

/* fdopen(fd, mode) that closes fd when it fails; NULL then, with a message naming `path`. */
FILE *dt_file_stream(int fd, const char *mode, const char *path);

/* Refuses an output that would destroy its command's input: `out` is `in` (the same file, by
 * any name or link), or `out` is a directory that holds `in` at any depth (the command replaces
 * the directory whole). No conflict when either does not exist. DT_ERR_USAGE (exit 2) naming
 * both as the command line does (in_name, out_name: "--input", "--out"): "OUT_NAME OUT and
 * IN_NAME IN are the same file: ..." ("directory" for two directories) or "OUT_NAME OUT holds
 * IN_NAME IN, and the output replaces the directory whole: ...". Every command that writes a
 * file from another calls it first. */
dt_status dt_file_check_output(const char *in_name, const char *in, const char *out_name, const char *out);

/* The SHA-256 of the file at `path` (a regular file, as dt_file_open_regular opens it; errors
 * as there, with `bad_input`) as 64 lowercase hex digits into hex. DT_ERR_IO on a read error. */
dt_status dt_file_sha256(const char *path, dt_status bad_input, char hex[65]);

#endif
