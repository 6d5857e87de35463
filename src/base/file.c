/* file.c — opening inputs that may not be regular files, creating outputs that do not
 * follow links (include/dtrain/file.h). */
#include "dtrain/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* "a FIFO", "a directory", ... for a message; NULL for a regular file */
static const char *kind_of(mode_t m) {
    if (S_ISREG(m)) return NULL;
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISDIR(m)) return "a directory";
    if (S_ISCHR(m)) return "a character device";
    if (S_ISBLK(m)) return "a block device";
    if (S_ISSOCK(m)) return "a socket";
    if (S_ISLNK(m)) return "a symbolic link";
    return "not a file";
}

static dt_status not_regular_error(dt_status st, const char *path, mode_t m) {
    return dt_error_set(st, "%s: not a regular file (%s)", path, kind_of(m));
}

dt_status dt_file_errno_status(int e, dt_status bad_input) {
    switch (e) {
    case ENOENT:
    case ENOTDIR:
    case EACCES:
    case EPERM:
    case ELOOP:
    case ENAMETOOLONG:
    case EISDIR: return bad_input;
    default: return DT_ERR_IO;
    }
}

dt_status dt_file_open_regular(const char *path, dt_status not_regular, int *fd) {
    *fd = -1;
    struct stat pre; /* a device is refused before its driver's open() runs; fstat below closes the race */
    if (stat(path, &pre) == 0 && kind_of(pre.st_mode)) return not_regular_error(not_regular, path, pre.st_mode);
    int f = open(path, O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
    if (f < 0) {
        int e = errno;
        struct stat sb; /* a socket cannot be opened at all (ENXIO): say what it is */
        if (stat(path, &sb) == 0 && kind_of(sb.st_mode)) return not_regular_error(not_regular, path, sb.st_mode);
        dt_status st = dt_error_set(dt_file_errno_status(e, not_regular), "%s: cannot open: %s", path, strerror(e));
        errno = e; /* for a caller that words its own message */
        return st;
    }
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return dt_error_set(DT_ERR_IO, "%s: cannot stat: %s", path, strerror(e));
    }
    if (kind_of(sb.st_mode)) {
        close(f);
        return not_regular_error(not_regular, path, sb.st_mode);
    }
    int fl = fcntl(f, F_GETFL);
    if (fl < 0 || fcntl(f, F_SETFL, fl & ~O_NONBLOCK) != 0) {
        int e = errno;
        close(f);
        return dt_error_set(DT_ERR_IO, "%s: cannot open: %s", path, strerror(e));
    }
    *fd = f;
    return DT_OK;
}

dt_status dt_file_create_new(const char *path, int *fd) {
    *fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd < 0) return dt_error_set(DT_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    return DT_OK;
}

dt_status dt_file_write_new(const char *path, const void *buf, size_t n) {
    int fd;
    DT_TRY(dt_file_create_new(path, &fd));
    int ok = dt_file_write_all(fd, buf, n) == 0 && fsync(fd) == 0;
    int e = errno;
    if (close(fd) != 0 && ok) ok = 0, e = errno;
    if (!ok) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s (hint: is the disk full?)", path, strerror(e));
    return DT_OK;
}

dt_status dt_file_create_temp(const char *path, char *tmp, size_t n, int *fd) {
    *fd = -1;
    for (int k = 0; k < 1000; k++) {
        int len = k ? snprintf(tmp, n, "%s.tmp.%ld.%d", path, (long)getpid(), k)
                    : snprintf(tmp, n, "%s.tmp.%ld", path, (long)getpid());
        if (len < 0 || (size_t)len >= n) return dt_error_set(DT_ERR_IO, "%s: path too long for a temporary file", path);
        *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (*fd >= 0) return DT_OK;
        if (errno != EEXIST) break; /* EEXIST: a stale file or a planted link there; leave it, try the next name */
    }
    return dt_error_set(DT_ERR_IO, "%s: cannot create %s: %s", path, tmp, strerror(errno));
}

dt_status dt_file_open_write(const char *path, int append, int *fd) {
    int f = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (append ? O_APPEND : 0),
                 0644);
    struct stat sb;
    if (f < 0) {
        int e = errno;
        *fd = -1;
        if (e == ELOOP && lstat(path, &sb) == 0 && S_ISLNK(sb.st_mode))
            return dt_error_set(DT_ERR_DATA, "%s: is a symbolic link: refusing to write through it (hint: remove the link)",
                                path);
        if (stat(path, &sb) == 0 && kind_of(sb.st_mode)) return not_regular_error(DT_ERR_DATA, path, sb.st_mode);
        return dt_error_set(DT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(e));
    }
    int ok = fstat(f, &sb) == 0;
    if (ok && kind_of(sb.st_mode)) {
        close(f);
        *fd = -1;
        return not_regular_error(DT_ERR_DATA, path, sb.st_mode);
    }
    if (ok && sb.st_nlink > 1) { /* a hard link planted there: writing would change the other name's file */
        close(f);
        *fd = -1;
        return dt_error_set(DT_ERR_DATA, "%s: has %ju hard links: refusing to write through it (hint: remove it)", path,
                            (uintmax_t)sb.st_nlink);
    }
    int fl = ok ? fcntl(f, F_GETFL) : -1;
    ok = fl >= 0 && fcntl(f, F_SETFL, fl & ~O_NONBLOCK) == 0 && (append || ftruncate(f, 0) == 0);
    if (!ok) {
        int e = errno;
        close(f);
        *fd = -1;
        return dt_error_set(DT_ERR_IO, "%s: cannot open for writing: %s", path, strerror(e));
    }
    *fd = f;
    return DT_OK;
}

FILE *dt_file_stream(int fd, const char *mode, const char *path) {
    FILE *f = fdopen(fd, mode);
    if (!f) {
        dt_error_set(DT_ERR_NOMEM, "%s: cannot open a stream: %s", path, strerror(errno));
        close(fd);
    }
    return f;
}

int dt_file_write_all(int fd, const void *buf, size_t n) {
    for (size_t done = 0; done < n;) {
        ssize_t w = write(fd, (const char *)buf + done, n - done);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) {
            if (w == 0) errno = EIO;
            return -1;
        }
        done += (size_t)w;
    }
    return 0;
}

/* fsync of the directory that holds `path`; -1 with errno set on failure. */
static int fsync_parent(const char *path) {
    char dir[4096];
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(dir, sizeof dir, ".");
    else if (slash == path) snprintf(dir, sizeof dir, "/");
    else snprintf(dir, sizeof dir, "%.*s", (int)(slash - path), path);
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return -1;
    int rc = fsync(fd), e = errno;
    close(fd);
    errno = e;
    return rc;
}

dt_status dt_file_commit(const char *tmp, const char *path) {
    if (rename(tmp, path) != 0) {
        dt_status st = dt_error_set(DT_ERR_IO, "%s: cannot rename %s onto it: %s", path, tmp, strerror(errno));
        unlink(tmp);
        return st;
    }
    if (fsync_parent(path) != 0)
        return dt_error_set(DT_ERR_IO, "%s: cannot fsync its directory: %s", path, strerror(errno));
    return DT_OK;
}
