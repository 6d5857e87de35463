/* file.c — opening inputs that may not be regular files, creating outputs that do not
 * follow links, an output that would replace its own input refused, a file's SHA-256
 * (include/dtrain/file.h). */
#include "dtrain/file.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
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

/* ---- an output that is its own input ---- */

static int same_file(const struct stat *a, const struct stat *b) {
    return a->st_dev == b->st_dev && a->st_ino == b->st_ino;
}

dt_status dt_file_check_output(const char *in_name, const char *in, const char *out_name, const char *out) {
    struct stat si, so;
    if (stat(in, &si) != 0 || stat(out, &so) != 0) return DT_OK; /* nothing to destroy, or no input (said later) */
    if (same_file(&si, &so))
        return dt_error_set(DT_ERR_USAGE, "%s %s and %s %s are the same %s: writing the output would destroy the input "
                            "(hint: write the output to another path)", out_name, out, in_name, in,
                            S_ISDIR(so.st_mode) ? "directory" : "file");
    if (!S_ISDIR(so.st_mode)) return DT_OK;
    char *real = realpath(in, NULL); /* every directory the input lies in, links resolved */
    if (!real) return DT_OK;
    dt_status st = DT_OK;
    for (char *slash; st == DT_OK && (slash = strrchr(real, '/')) != NULL;) {
        slash[slash == real] = '\0'; /* "/a/b" -> "/a" -> "/" */
        struct stat sd;
        if (stat(real, &sd) == 0 && same_file(&sd, &so))
            st = dt_error_set(DT_ERR_USAGE, "%s %s holds %s %s, and the output replaces the directory whole: writing "
                              "it would destroy the input (hint: write the output to another directory)", out_name, out,
                              in_name, in);
        if (slash == real) break;
    }
    free(real);
    return st;
}

/* ---- SHA-256 (FIPS 180-4) ---- */

static const uint32_t SHA256_K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

#define ROR32(x, n) ((x) >> (n) | (x) << (32 - (n)))

/* One 64-byte block into the state h. */
static void sha256_block(uint32_t h[8], const unsigned char *p) {
    uint32_t w[64], v[8];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 | (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++)
        w[i] = w[i - 16] + (ROR32(w[i - 15], 7) ^ ROR32(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
               (ROR32(w[i - 2], 17) ^ ROR32(w[i - 2], 19) ^ (w[i - 2] >> 10));
    memcpy(v, h, sizeof v);
    for (int i = 0; i < 64; i++) {
        const uint32_t t1 = v[7] + (ROR32(v[4], 6) ^ ROR32(v[4], 11) ^ ROR32(v[4], 25)) +
                            ((v[4] & v[5]) ^ (~v[4] & v[6])) + SHA256_K[i] + w[i];
        const uint32_t t2 = (ROR32(v[0], 2) ^ ROR32(v[0], 13) ^ ROR32(v[0], 22)) +
                            ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
        memmove(v + 1, v, 7 * sizeof *v);
        v[4] += t1;
        v[0] = t1 + t2;
    }
    for (int i = 0; i < 8; i++) h[i] += v[i];
}

dt_status dt_file_sha256(const char *path, dt_status bad_input, char hex[65]) {
    int fd;
    DT_TRY(dt_file_open_regular(path, bad_input, &fd));
    uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    unsigned char buf[1 << 16];
    uint64_t total = 0;
    size_t have = 0; /* bytes of buf not yet hashed (less than a block between reads) */
    for (;;) {
        const ssize_t got = read(fd, buf + have, sizeof buf - have);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) {
            const int e = errno;
            close(fd);
            return dt_error_set(DT_ERR_IO, "%s: read error: %s", path, strerror(e));
        }
        if (got == 0) break;
        total += (uint64_t)got;
        have += (size_t)got;
        size_t done = 0;
        for (; have - done >= 64; done += 64) sha256_block(h, buf + done);
        memmove(buf, buf + done, have - done);
        have -= done;
    }
    close(fd);
    buf[have++] = 0x80; /* the padding: 1, zeros, then the length in bits, big-endian, ending a block */
    const size_t end = have + 8 <= 64 ? 64 : 128;
    memset(buf + have, 0, end - have);
    for (int i = 0; i < 8; i++) buf[end - 1 - i] = (unsigned char)((total * 8) >> (8 * i));
    for (size_t done = 0; done < end; done += 64) sha256_block(h, buf + done);
    for (int i = 0; i < 8; i++) snprintf(hex + 8 * i, 9, "%08x", (unsigned)h[i]);
    return DT_OK;
}
