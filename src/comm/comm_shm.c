/* comm_shm.c — the `shm` backend: collectives between the CPU worker processes of one
 * host through ONE shared mapping: anonymous, made before fork by dtrain's own launcher
 * (nothing is ever left in /dev/shm, the memory goes away with the last process), or a named
 * segment the rendezvous makes for an external launcher's ranks (see below).
 *
 * Layout: a control block (the barrier, the abort flag and message, one cache line per
 * rank), then world+1 data slots of slot_bytes: slot r belongs to rank r, slot `world`
 * holds results. Each slot is used as two halves, picked by the parity of the barrier
 * generation that follows the write; that lets a chunked collective run with ONE barrier
 * per chunk:
 *   - a rank writes its own slot half g%2 before barrier g; the others read it between
 *     barriers g and g+1 (the next write to that half comes after barrier g+1);
 *   - a reduced result is written to the result half g%2 after barrier g and read back
 *     between barriers g+1 and g+2 (the next write to it comes after barrier g+2).
 *
 * All-reduce of one chunk (at most half a slot, at most 1 MiB): copy in -> barrier ->
 * rank r sums its 1/N share over the N ranks' data in rank order 0..N-1 (so every rank
 * gets bit-identical results) into the result slot -> barrier -> copy back. Per-rank
 * traffic stays flat as N grows. Two savings: a rank's own share never goes through its
 * slot (only that rank reads it; it sums it straight from the caller's buffer and writes
 * the result there too), and the copy back of chunk k shares a barrier with the copy in
 * of chunk k+1.
 *
 * The barrier: a generation barrier on C11 atomics; a waiter spins briefly, then sleeps on
 * a process-shared futex (no FUTEX_PRIVATE_FLAG) in short slices that check the deadline
 * and the abort flag. Each rank records the generation it has arrived at, so a timeout
 * names exactly the ranks that did not arrive. A timeout or a collective mismatch aborts
 * the whole world (every rank fails promptly); the world is then unusable.
 *
 * Reduce-scatter and all-gather of parts (dt_comm_part) move only what they must, in rounds
 * of one barrier each: in round k a reduce-scatter's rank copies the k-th piece of every
 * OTHER rank's part into its slot (one place per destination rank), and after the barrier
 * each rank sums the k-th piece of its own part over ranks 0..N-1 in that order (the
 * all-reduce's order: the same bits) straight into the caller's buffer; an all-gather's rank
 * copies the k-th piece of its own part into its slot, and after the barrier every rank
 * copies the others' pieces out. The slot halves alternate as above.
 *
 * With DT_WIRE_BF16 the slots hold bf16 (half the bytes copied in and out): each rank rounds
 * what it copies in; the share's owner rounds its own floats the same way before it sums, in
 * float32, and rounds the all-reduce's result, which it keeps as well as publishes.
 *
 * Under an external launcher the world lives in a named segment (dt_shm_world_create_fd /
 * attach_fd): an attaching rank refuses a file that is not this user's with mode 0600, reads
 * the sizes at the start of the shared block once, checks them and keeps its own copy (struct
 * dt_shm_world), so that nothing written there later moves its slots. Each rank says its pid
 * (dt_shm_world_join); a rank waiting in a barrier looks a few times a second whether a rank
 * that has not arrived is still there (a pidfd, else kill(pid, 0)) and, when it is gone, fails
 * the world naming it (no supervisor of ours watches these ranks, as launch.c does ours).
 *
 * Test-only switch: dt_fault_break_allreduce (fault.h) makes one rank's all-reduce results
 * wrong, so that the doctor's self-test can prove it catches a bad collective. */
#include "dtrain/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/bf16.h"
#include "dtrain/clock.h"
#include "dtrain/fault.h"

#define SHM_LINE 64
#define SHM_SPIN_S 20e-6   /* busy-wait this long before sleeping (only when ranks <= cpus) */
#define SHM_SLICE_S 0.01   /* futex sleep slice: bounds how late a missed abort is noticed */

enum { OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_BARRIER, OP_REDUCE_SCATTER, OP_GATHER_PARTS, OP_KINDS };
static const char *const op_names[OP_KINDS] = {"all-reduce", "broadcast",      "all-gather",
                                               "barrier",    "reduce-scatter", "all-gather of parts"};

/* What a rank is doing, published before the first barrier of each collective (two
 * copies, by barrier parity), so that mismatched collectives are reported, not run. */
typedef struct {
    uint32_t kind;
    int32_t root;
    uint64_t seq;   /* 1-based count of this kind on this rank */
    uint64_t count; /* floats (all-reduce) or bytes */
} op_desc;

typedef struct {
    _Alignas(SHM_LINE) _Atomic uint32_t arrived; /* generation + 1 of the last barrier entered */
    op_desc desc[2];
    _Atomic int32_t pid; /* the rank's process (dt_shm_world_join; 0: not said), then: */
    int32_t grank;       /* its rank in the job, for messages */
    _Atomic int32_t named; /* grank was said without the pid (dt_shm_world_name_rank) */
    uint64_t pidns;      /* its pid namespace (0: unknown): its pid means something only in the same one */
} rank_line;

#define SHM_READY 0x64747731u /* "dtw1": the creator has written the sizes */

/* The control block at the start of the mapping, shared with every rank of the world (and, for
 * a named segment, with whatever else can open it): the sizes, written once by the creator and
 * read once by each attaching rank, which checks them and keeps its own copy (dt_shm_world);
 * then the barrier, the abort flag and message, and a line per rank. */
typedef struct {
    size_t map_bytes, slot_bytes, data_offset; /* first: see tests/test_comm.c's scribble */
    int32_t world;
    _Atomic uint32_t ready;  /* SHM_READY once the sizes are written */
    _Atomic uint32_t joined; /* ranks that have called dt_shm_world_join */
    _Alignas(SHM_LINE) _Atomic uint32_t bar_count; /* arrivals in the current generation */
    _Alignas(SHM_LINE) _Atomic uint32_t bar_gen;   /* the futex word */
    _Atomic uint32_t bar_sleepers;                 /* waiters in (or entering) FUTEX_WAIT */
    _Alignas(SHM_LINE) _Atomic uint32_t abort_state; /* 0 none, 1 message being written, 2 set */
    char abort_msg[768];
    rank_line ranks[DT_MAX_WORLD];
} shm_ctl;

/* This process's own view of the world: the sizes it checked (never read again from the shared
 * block, which another process may scribble over) and where its mapping is. */
struct dt_shm_world {
    shm_ctl *s; /* the mapping */
    size_t map_bytes, slot_bytes, data_offset;
    int world;
};

_Static_assert(ATOMIC_INT_LOCK_FREE == 2, "the shm backend needs lock-free atomics");

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

/* Shared (not private) futex: the word lives in a mapping shared between processes. */
static void futex_wait(_Atomic uint32_t *word, uint32_t expect, double timeout_s) {
    struct timespec ts = {(time_t)timeout_s, (long)((timeout_s - (double)(time_t)timeout_s) * 1e9)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expect, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* ---- the world ---- */

static size_t data_offset_of(void) { return round_up(sizeof(shm_ctl), (size_t)sysconf(_SC_PAGESIZE)); }

/* The slot size world_create uses for `slot_bytes` (0: the default); 0 when too large. */
static size_t slot_size(int world, size_t slot_bytes) {
    if (slot_bytes == 0) {
        slot_bytes = ((size_t)256 << 20) / (size_t)(world + 1);
        if (slot_bytes < ((size_t)1 << 20)) slot_bytes = (size_t)1 << 20;
        if (slot_bytes > ((size_t)32 << 20)) slot_bytes = (size_t)32 << 20;
        slot_bytes &= ~(size_t)(SHM_LINE - 1);
    } else {
        /* two halves of whole cache lines, each with a line per rank (a reduce-scatter round) */
        const size_t min = 2 * SHM_LINE * (size_t)world;
        slot_bytes = slot_bytes < min ? min : round_up(slot_bytes, 2 * SHM_LINE);
    }
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    if (slot_bytes > (SIZE_MAX - data_offset_of()) / (size_t)(world + 1) - page) return 0;
    return slot_bytes;
}

/* fd < 0: an anonymous shared mapping (inherited over fork); else the file behind fd */
static dt_status world_create(dt_shm_world **out, int world, size_t slot_bytes, int fd) {
    *out = NULL;
    if (world < 1 || world > DT_MAX_WORLD)
        return dt_error_set(DT_ERR_CONFIG,
                            "shm communicator: %d workers, expected 1..%d (hint: lower training.num_workers)",
                            world, DT_MAX_WORLD);
    size_t asked = slot_bytes;
    if ((slot_bytes = slot_size(world, slot_bytes)) == 0)
        return dt_error_set(DT_ERR_CONFIG, "shm communicator: slot size %zu bytes is too large", asked);
    const size_t data_offset = data_offset_of();
    size_t map_bytes = round_up(data_offset + (size_t)(world + 1) * slot_bytes, (size_t)sysconf(_SC_PAGESIZE));
    /* reserve the pages now: a sparse file in a small /dev/shm would fail later with SIGBUS */
    if (fd >= 0) {
        int rc = posix_fallocate(fd, 0, (off_t)map_bytes);
        if (rc != 0)
            return dt_error_set(DT_ERR_NOMEM,
                                "shm communicator: cannot reserve %zu MiB of shared memory in /dev/shm: %s (hint: in a "
                                "container, give it a larger /dev/shm: docker run --shm-size=1g, or a Kubernetes emptyDir "
                                "with medium: Memory)",
                                map_bytes >> 20, strerror(rc));
    }
    dt_shm_world *w = dt_calloc(1, sizeof *w, "shm communicator");
    if (!w) return DT_ERR_NOMEM;
    void *p = mmap(NULL, map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | (fd >= 0 ? 0 : MAP_ANONYMOUS), fd, 0);
    if (p == MAP_FAILED) {
        free(w);
        return dt_error_set(DT_ERR_NOMEM,
                            "shm communicator: cannot map %zu bytes of shared memory for %d workers: %s "
                            "(hint: fewer workers, or more memory)",
                            map_bytes, world, strerror(errno));
    }
    shm_ctl *s = p; /* the mapping is zero-filled */
    *w = (dt_shm_world){.s = s, .map_bytes = map_bytes, .slot_bytes = slot_bytes, .data_offset = data_offset,
                        .world = world};
    s->map_bytes = map_bytes;
    s->slot_bytes = slot_bytes;
    s->data_offset = data_offset;
    s->world = world;
    atomic_init(&s->joined, 0);
    atomic_init(&s->bar_count, 0);
    atomic_init(&s->bar_gen, 0);
    atomic_init(&s->bar_sleepers, 0);
    atomic_init(&s->abort_state, 0);
    for (int r = 0; r < DT_MAX_WORLD; r++) {
        atomic_init(&s->ranks[r].arrived, 0);
        atomic_init(&s->ranks[r].pid, 0);
    }
    atomic_store_explicit(&s->ready, SHM_READY, memory_order_release);
    *out = w;
    return DT_OK;
}

dt_status dt_shm_world_create(dt_shm_world **out, int world, size_t slot_bytes) {
    return world_create(out, world, slot_bytes, -1);
}

dt_status dt_shm_world_create_fd(dt_shm_world **out, int world, size_t slot_bytes, int fd) {
    return world_create(out, world, slot_bytes, fd);
}

/* The segment behind fd is this user's, a regular file that nobody else may open: else
 * DT_ERR_USAGE naming it. */
static dt_status check_owner(const struct stat *sb, const char *name) {
    if (S_ISREG(sb->st_mode) && sb->st_uid == geteuid() && (sb->st_mode & 07777) == 0600) return DT_OK;
    return dt_error_set(DT_ERR_USAGE,
                        "shm communicator: the shared memory %s is %s owned by uid %ld with mode %04o, expected a file "
                        "of this user (uid %ld) with mode 0600: it is not this job's, and no rank maps it (hint: "
                        "another user or program made a segment of that name: look at ls -l /dev/shm%s, remove it, "
                        "and start the job again)",
                        name, S_ISREG(sb->st_mode) ? "a file" : "not a regular file,", (long)sb->st_uid,
                        (unsigned)(sb->st_mode & 07777), (long)geteuid(), name);
}

/* The sizes the creator wrote, read once from the mapping p of `bytes` and checked: *w */
static int read_sizes(shm_ctl *s, size_t bytes, int world, dt_shm_world *w) {
    if (atomic_load_explicit(&s->ready, memory_order_acquire) != SHM_READY) return 0;
    *w = (dt_shm_world){.map_bytes = s->map_bytes, .slot_bytes = s->slot_bytes, .data_offset = s->data_offset,
                        .world = s->world};
    return w->world == world && w->map_bytes == bytes && w->data_offset == data_offset_of() &&
           w->map_bytes > w->data_offset && w->slot_bytes % SHM_LINE == 0 &&
           w->slot_bytes >= 2 * SHM_LINE * (size_t)world &&
           w->slot_bytes <= (w->map_bytes - w->data_offset) / (size_t)(world + 1);
}

dt_status dt_shm_world_attach_fd(dt_shm_world **out, int world, int fd, const char *name) {
    *out = NULL;
    struct stat sb;
    if (fstat(fd, &sb) != 0)
        return dt_error_set(DT_ERR_DEVICE, "shm communicator: the shared memory %s: %s", name, strerror(errno));
    DT_TRY(check_owner(&sb, name));
    if (world < 1 || world > DT_MAX_WORLD || sb.st_size < (off_t)data_offset_of())
        return dt_error_set(DT_ERR_DEVICE, "shm communicator: the shared memory %s is not ready (%lld bytes)", name,
                            (long long)sb.st_size);
    dt_shm_world *w = dt_calloc(1, sizeof *w, "shm communicator");
    if (!w) return DT_ERR_NOMEM;
    void *p = mmap(NULL, (size_t)sb.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) {
        free(w);
        return dt_error_set(DT_ERR_NOMEM, "shm communicator: cannot map the shared memory %s: %s", name,
                            strerror(errno));
    }
    if (!read_sizes(p, (size_t)sb.st_size, world, w)) {
        munmap(p, (size_t)sb.st_size);
        free(w);
        return dt_error_set(DT_ERR_DEVICE, "shm communicator: the shared memory %s does not (yet) describe a world "
                            "of %d workers", name, world);
    }
    w->s = p;
    *out = w;
    return DT_OK;
}

/* this process's pid namespace, 0 when /proc cannot tell */
static uint64_t my_pidns(void) {
    struct stat sb;
    if (stat("/proc/self/ns/pid", &sb) != 0) return 0;
    return (uint64_t)sb.st_ino ^ ((uint64_t)sb.st_dev << 32);
}

int dt_shm_world_join(dt_shm_world *w, int rank, int grank) {
    if (!w || rank < 0 || rank >= w->world) return 0;
    rank_line *l = &w->s->ranks[rank];
    l->grank = grank;
    l->pidns = my_pidns();
    atomic_store_explicit(&l->pid, (int32_t)getpid(), memory_order_release);
    return atomic_fetch_add_explicit(&w->s->joined, 1, memory_order_acq_rel) + 1 == (uint32_t)w->world;
}

void dt_shm_world_name_rank(dt_shm_world *w, int rank, int grank) {
    if (!w || rank < 0 || rank >= w->world) return;
    w->s->ranks[rank].grank = grank;
    atomic_store_explicit(&w->s->ranks[rank].named, 1, memory_order_release);
}

void dt_shm_world_destroy(dt_shm_world *w) {
    if (!w) return;
    munmap(w->s, w->map_bytes);
    free(w);
}

/* Async-signal-safe: lock-free atomics, a byte loop into the mapping, a futex wake. The
 * first reason wins. */
void dt_shm_world_abort(dt_shm_world *w, const char *why) {
    if (!w) return;
    shm_ctl *s = w->s;
    uint32_t expect = 0;
    if (atomic_compare_exchange_strong(&s->abort_state, &expect, 1)) {
        size_t i = 0;
        if (why)
            for (; why[i] && i + 1 < sizeof s->abort_msg; i++) s->abort_msg[i] = why[i];
        s->abort_msg[i] = '\0';
        atomic_store(&s->abort_state, 2);
    }
    futex_wake_all(&s->bar_gen);
}

static char *slot(dt_shm_world *w, int r, uint32_t gen) {
    return (char *)w->s + w->data_offset + (size_t)r * w->slot_bytes + (gen & 1u) * (w->slot_bytes / 2);
}

/* ---- one rank ---- */

typedef struct {
    dt_shm_world *w;
    int rank, world;
    double spin_s;
    int break_allreduce; /* the test switch, see the top of the file */
    uint64_t seq[OP_KINDS];
    op_desc cur;         /* the collective in progress, for messages */
    dt_comm_deadline dl; /* and its deadline (comm.c's) */
    uint64_t pidns;      /* ours (0: unknown: no rank is watched) */
    double next_watch;   /* when a waiting barrier next looks for ranks that are gone */
    int pidfd[DT_MAX_WORLD]; /* each rank's process: -1 not opened yet, -2 none (kill() is asked) */
    int32_t pid[DT_MAX_WORLD]; /* the pid behind pidfd[r] */
} shm_ctx;

/* rank r's rank in the job, as it said (dt_shm_world_join, dt_shm_world_name_rank), else r */
static int grank_of(const shm_ctx *x, int r) {
    const rank_line *l = &x->w->s->ranks[r];
    const int said = atomic_load_explicit((_Atomic int32_t *)&l->pid, memory_order_acquire) > 0 ||
                     atomic_load_explicit((_Atomic int32_t *)&l->named, memory_order_acquire);
    return said ? l->grank : r;
}

static void describe(const op_desc *d, char *buf, size_t cap) {
    const char *name = d->kind < OP_KINDS ? op_names[d->kind] : "?";
    switch (d->kind) {
    case OP_ALLREDUCE: case OP_REDUCE_SCATTER: case OP_GATHER_PARTS:
        snprintf(buf, cap, "%s #%llu (%llu floats%s)", name, (unsigned long long)d->seq, (unsigned long long)d->count,
                 d->root == (int32_t)DT_WIRE_BF16 && d->kind != OP_GATHER_PARTS ? ", as bf16" : "");
        break;
    case OP_BROADCAST:
        snprintf(buf, cap, "%s #%llu (%llu bytes from rank %d)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count, (int)d->root);
        break;
    case OP_ALLGATHER:
        snprintf(buf, cap, "%s #%llu (%llu bytes per rank)", name, (unsigned long long)d->seq,
                 (unsigned long long)d->count);
        break;
    default: snprintf(buf, cap, "%s #%llu", name, (unsigned long long)d->seq); break;
    }
}

static dt_status fail_aborted(shm_ctx *x) {
    shm_ctl *s = x->w->s;
    /* a writer between its two stores (a signal handler, another rank) finishes quickly */
    for (int i = 0; i < 100000 && atomic_load(&s->abort_state) == 1; i++) cpu_relax();
    char what[160], why[sizeof s->abort_msg];
    describe(&x->cur, what, sizeof what);
    memcpy(why, s->abort_msg, sizeof why); /* our own copy, ended: the block is shared */
    why[sizeof why - 1] = '\0';
    return dt_error_set(DT_ERR_DEVICE, "collective aborted: %s (rank %d, in %s)",
                        atomic_load(&s->abort_state) == 2 ? why : "no reason recorded", grank_of(x, x->rank), what);
}

/* Fails this rank with the message already set and takes the world down with it, so the
 * other ranks stop waiting at once instead of running into their own deadlines. */
static dt_status fail_world(shm_ctx *x, dt_status st) {
    dt_shm_world_abort(x->w, dt_error_msg());
    return st;
}

/* "1, 3-5, 9" */
static void format_ranks(const int *missing, int n, char *buf, size_t cap) {
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; i < n && len < cap; i++) {
        int j = i;
        while (j + 1 < n && missing[j + 1] == missing[j] + 1) j++;
        len += (size_t)(j > i ? snprintf(buf + len, cap - len, "%s%d-%d", i ? ", " : "", missing[i], missing[j])
                              : snprintf(buf + len, cap - len, "%s%d", i ? ", " : "", missing[i]));
        i = j;
    }
}

/* Returns DT_OK when every rank has arrived at barrier `g`, or fails naming the late ranks. */
static dt_status barrier_timeout(shm_ctx *x, uint32_t g, int *retry) {
    int missing[DT_MAX_WORLD], n = 0;
    for (int r = 0; r < x->world; r++)
        if (atomic_load(&x->w->s->ranks[r].arrived) != g + 1) missing[n++] = grank_of(x, r);
    if (n == 0 || atomic_load(&x->w->s->bar_gen) != g) { /* everyone came just now */
        *retry = 1;
        return DT_OK;
    }
    char what[160], list[256];
    describe(&x->cur, what, sizeof what);
    format_ranks(missing, n, list, sizeof list);
    double t10 = x->dl.timeout_s * 10;
    dt_error_set(DT_ERR_DEVICE,
                 "collective timeout: %s on rank %d waited %.*f s for rank(s) %s (hint: a worker is stuck or "
                 "stopped%s)",
                 what, grank_of(x, x->rank), t10 == (double)(long long)t10 ? 1 : 3, x->dl.timeout_s, list,
                 x->dl.setting);
    return fail_world(x, DT_ERR_DEVICE);
}

/* ---- ranks that are gone ----
 * Under an external launcher no supervisor of ours watches the ranks (dtrain's own launcher
 * does: it aborts the world when a worker exits, launch.c). A rank that said its pid
 * (dt_shm_world_join) is watched by the ranks that wait for it in a barrier, a few times a
 * second: through a pidfd (readable once the process has exited, reaped or not, and immune to
 * pid reuse), else kill(pid, 0) and /proc/PID/stat (a zombie). Only within one pid namespace:
 * elsewhere the number means another process, or none. */

#define SHM_WATCH_S 0.2

/* 1 when pid is known to have exited (no pidfd: kill() and /proc) */
static int pid_gone(int32_t pid) {
    if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 1;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%ld/stat", (long)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    const char *end = strrchr(buf, ')'); /* "PID (COMM) STATE ..." */
    return end && end[1] == ' ' && (end[2] == 'Z' || end[2] == 'X');
}

static int open_pidfd(int32_t pid) {
#ifdef SYS_pidfd_open
    return (int)syscall(SYS_pidfd_open, (pid_t)pid, 0);
#else
    (void)pid;
    errno = ENOSYS;
    return -1;
#endif
}

/* 1 when rank r said its pid (in our pid namespace) and that process has exited */
static int rank_gone(shm_ctx *x, int r) {
    const rank_line *l = &x->w->s->ranks[r];
    int32_t pid = atomic_load_explicit((_Atomic int32_t *)&l->pid, memory_order_acquire);
    if (pid <= 0 || !x->pidns || l->pidns != x->pidns) return 0;
    if (x->pidfd[r] == -1 || x->pid[r] != pid) {
        if (x->pidfd[r] >= 0) close(x->pidfd[r]);
        int fd = open_pidfd(pid);
        x->pid[r] = pid;
        x->pidfd[r] = fd >= 0 ? fd : -2; /* ENOSYS (before Linux 5.3), EPERM (a seccomp filter): kill() */
        if (fd < 0 && errno == ESRCH) return 1;
    }
    if (x->pidfd[r] < 0) return pid_gone(pid);
    struct pollfd p = {.fd = x->pidfd[r], .events = POLLIN};
    return poll(&p, 1, 0) > 0;
}

/* While waiting at barrier g: fails the world when a rank that has not arrived is gone. */
static dt_status watch_ranks(shm_ctx *x, uint32_t g, double now) {
    if (!x->pidns || now < x->next_watch) return DT_OK;
    x->next_watch = now + SHM_WATCH_S;
    for (int r = 0; r < x->world; r++) {
        if (r == x->rank || atomic_load(&x->w->s->ranks[r].arrived) == g + 1 || !rank_gone(x, r)) continue;
        if (atomic_load(&x->w->s->bar_gen) != g) return DT_OK; /* it came after all */
        const int gr = grank_of(x, r);
        char what[160];
        describe(&x->cur, what, sizeof what);
        dt_error_set(DT_ERR_DEVICE,
                     "collective failed: rank %d (pid %ld on this host) exited or was killed while rank %d waited for it "
                     "in %s (hint: rank %d's own output and rank-%d.log say why; if they say nothing, something outside "
                     "killed it, e.g. the kernel's out-of-memory killer: dmesg)",
                     gr, (long)x->pid[r], grank_of(x, x->rank), what, gr, gr);
        return fail_world(x, DT_ERR_DEVICE);
    }
    return DT_OK;
}

static dt_status barrier(shm_ctx *x) {
    dt_shm_world *w = x->w;
    if (atomic_load_explicit(&w->s->abort_state, memory_order_acquire)) return fail_aborted(x);
    uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_acquire);
    atomic_store_explicit(&w->s->ranks[x->rank].arrived, g + 1, memory_order_relaxed);
    if (atomic_fetch_add_explicit(&w->s->bar_count, 1, memory_order_acq_rel) == (uint32_t)x->world - 1) {
        /* last in: reset the count, then open the next generation */
        atomic_store_explicit(&w->s->bar_count, 0, memory_order_relaxed);
        atomic_store_explicit(&w->s->bar_gen, g + 1, memory_order_seq_cst);
        if (atomic_load_explicit(&w->s->bar_sleepers, memory_order_seq_cst)) futex_wake_all(&w->s->bar_gen);
        return DT_OK;
    }
    double t0 = dt_clock_now();
    if (x->spin_s > 0)
        for (unsigned i = 1;; i++) {
            if (atomic_load_explicit(&w->s->bar_gen, memory_order_acquire) != g) return DT_OK;
            if ((i & 63) == 0 && dt_clock_now() - t0 > x->spin_s) break;
            cpu_relax();
        }
    double deadline = t0 + x->dl.timeout_s;
    for (;;) {
        if (atomic_load_explicit(&w->s->bar_gen, memory_order_acquire) != g) return DT_OK;
        if (atomic_load_explicit(&w->s->abort_state, memory_order_acquire)) return fail_aborted(x);
        double t = dt_clock_now();
        DT_TRY(watch_ranks(x, g, t));
        if (t >= deadline) {
            int retry = 0;
            dt_status st = barrier_timeout(x, g, &retry);
            if (!retry) return st;
        }
        double left = deadline - t;
        atomic_fetch_add_explicit(&w->s->bar_sleepers, 1, memory_order_seq_cst);
        futex_wait(&w->s->bar_gen, g, left < SHM_SLICE_S ? (left > 0 ? left : 1e-4) : SHM_SLICE_S);
        atomic_fetch_sub_explicit(&w->s->bar_sleepers, 1, memory_order_seq_cst);
    }
}

/* Starts collective `kind` with deadline `dl`: counts it, fails at once if the world was
 * aborted, and publishes what this rank is doing for the check after the first barrier. */
static dt_status begin(shm_ctx *x, int kind, uint64_t count, int root, const dt_comm_deadline *dl) {
    x->cur = (op_desc){.kind = (uint32_t)kind, .root = root, .seq = ++x->seq[kind], .count = count};
    x->dl = *dl;
    if (atomic_load_explicit(&x->w->s->abort_state, memory_order_acquire)) return fail_aborted(x);
    uint32_t g = atomic_load_explicit(&x->w->s->bar_gen, memory_order_relaxed);
    x->w->s->ranks[x->rank].desc[g & 1] = x->cur;
    return DT_OK;
}

/* After the first barrier of a collective (generation g): did every rank issue the same one? */
static dt_status check_same(shm_ctx *x, uint32_t g) {
    for (int r = 0; r < x->world; r++) {
        const op_desc *d = &x->w->s->ranks[r].desc[g & 1];
        if (d->kind == x->cur.kind && d->count == x->cur.count && d->root == x->cur.root && d->seq == x->cur.seq)
            continue;
        char mine[160], theirs[160];
        describe(&x->cur, mine, sizeof mine);
        describe(d, theirs, sizeof theirs);
        dt_error_set(DT_ERR_INTERNAL,
                     "collective mismatch: rank %d is in %s but rank %d is in %s (hint: every rank must issue "
                     "the same collectives in the same order)",
                     x->rank, mine, r, theirs);
        return fail_world(x, DT_ERR_INTERNAL);
    }
    return DT_OK;
}

/* First barrier of a collective, with the mismatch check. */
static dt_status barrier_first(shm_ctx *x) {
    uint32_t g = atomic_load_explicit(&x->w->s->bar_gen, memory_order_relaxed);
    DT_TRY(barrier(x));
    return check_same(x, g);
}

/* The share [lo, hi) of a chunk of m floats that `rank` reduces: as even as possible, on
 * 16-float (cache line) boundaries so that no two ranks write the same line. */
static size_t share_edge(size_t m, int rank, int world) {
    if (rank >= world) return m;
    size_t e = (m * (size_t)rank / (size_t)world + 8) & ~(size_t)15;
    return e < m ? e : m;
}

/* Plain loops with a fixed-size inner block, which the compiler vectorises at -O2. */
#define VB 16
static void add2(float *restrict dst, const float *restrict a, const float *restrict b, size_t n) {
    size_t i = 0;
    for (; i + VB <= n; i += VB)
        for (int j = 0; j < VB; j++) dst[i + j] = a[i + j] + b[i + j];
    for (; i < n; i++) dst[i] = a[i] + b[i];
}
static void add1(float *restrict dst, const float *restrict a, size_t n) {
    size_t i = 0;
    for (; i + VB <= n; i += VB)
        for (int j = 0; j < VB; j++) dst[i + j] += a[i + j];
    for (; i < n; i++) dst[i] += a[i];
}
static void scale1(float *restrict dst, float s, size_t n) {
    size_t i = 0;
    for (; i + VB <= n; i += VB)
        for (int j = 0; j < VB; j++) dst[i + j] *= s;
    for (; i < n; i++) dst[i] *= s;
}

/* Slot contents: float32, or bf16 for a DT_WIRE_BF16 collective (half the bytes). */
static void put(void *slot_dst, const float *src, size_t n, int bf) {
    if (bf) dt_bf16_pack(slot_dst, src, n);
    else memcpy(slot_dst, src, n * sizeof(float));
}
static void get(float *dst, const void *slot_src, size_t n, int bf) {
    if (bf) dt_bf16_unpack(dst, slot_src, n);
    else memcpy(dst, slot_src, n * sizeof(float));
}

/* acc(len <= 1024) = sum over ranks 0..N-1, in that order, of rank r's floats: `mine` for this
 * rank (rounded to bf16 first when bf, as the others' were on their way in), else slot r at
 * element `at`. The caller blocks so that acc stays in L1. */
static void sum_ranks(shm_ctx *x, uint32_t g, float *acc, const float *mine, size_t at, size_t len, int bf) {
    if (!bf) {
#define SRC(r) ((r) == x->rank ? mine : (const float *)slot(x->w, (r), g) + at)
        add2(acc, SRC(0), SRC(1), len);
        for (int r = 2; r < x->world; r++) add1(acc, SRC(r), len);
#undef SRC
        return;
    }
    uint16_t own[1024];
    dt_bf16_pack(own, mine, len);
    memset(acc, 0, len * sizeof(float)); /* 0 + v is v: the sum starts with rank 0's values */
    for (int r = 0; r < x->world; r++)
        dt_bf16_add(acc, r == x->rank ? own : (const uint16_t *)slot(x->w, r, g) + at, len);
}

/* My share [lo, hi) of the chunk at `mine` (this rank's own floats, which never went
 * through its slot): sum over ranks 0..N-1 in that order, times 1/N for AVG (then rounded
 * to bf16 when bf: what the others receive), into both `mine` and the result slot `res`. */
static void reduce_share(shm_ctx *x, uint32_t g, size_t lo, size_t hi, float *mine, void *res, int avg, int bf) {
    enum { BLOCK = 1024 };
    float acc[BLOCK];
    const float inv = 1.0f / (float)x->world;
    for (size_t b = lo; b < hi; b += BLOCK) {
        size_t len = hi - b < BLOCK ? hi - b : BLOCK;
        sum_ranks(x, g, acc, mine + b, b, len, bf);
        if (avg) scale1(acc, inv, len);
        if (bf) dt_bf16_round_all(acc, len);
        memcpy(mine + b, acc, len * sizeof(float));
        put((char *)res + b * (bf ? 2 : sizeof(float)), acc, len, bf);
    }
}

/* All-reduce chunks are at most this big (and at most half a slot): a chunk's working set
 * (the slot halves it is copied into, the result, the caller's buffer) then stays in L2,
 * so that mostly only the caller's buffer itself goes to and from DRAM. Measured on 2
 * workers, 64 MiB: 1-2 MiB chunks need ~35% less CPU time than 16 MiB ones. */
#define SHM_ALLREDUCE_CHUNK_MAX ((size_t)1 << 20)

static size_t chunk_floats(const dt_shm_world *w) {
    size_t c = w->slot_bytes / 2;
    return (c < SHM_ALLREDUCE_CHUNK_MAX ? c : SHM_ALLREDUCE_CHUNK_MAX) / sizeof(float);
}

static dt_status shm_allreduce(void *vctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire,
                               const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_ALLREDUCE, n, (int)wire, dl)); /* "root": the wire type, which every rank must share */
    const int bf = wire == DT_WIRE_BF16;
    const size_t es = bf ? 2 : sizeof(float);
    if (n > 0 && x->world > 1) {
        dt_shm_world *w = x->w;
        const size_t chunk = chunk_floats(w);
        const size_t nchunks = (n + chunk - 1) / chunk;
        uint32_t prev_g = 0;
        /* iteration k: copy in chunk k, barrier, copy back chunk k-1, reduce my share of
         * chunk k. My own share never goes through my slot: only I read it. */
        for (size_t k = 0; k <= nchunks; k++) {
            uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_relaxed);
            size_t off = k * chunk, m = k < nchunks ? (n - off < chunk ? n - off : chunk) : 0;
            size_t lo = share_edge(m, x->rank, x->world), hi = share_edge(m, x->rank + 1, x->world);
            if (m) {
                char *mine = slot(w, x->rank, g);
                put(mine, buf + off, lo, bf);
                put(mine + hi * es, buf + off + hi, m - hi, bf);
            }
            DT_TRY(k == 0 ? barrier_first(x) : barrier(x));
            if (k > 0) { /* chunk k-1: everything but my own share, which is in buf already */
                size_t poff = off - chunk, pm = n - poff < chunk ? n - poff : chunk;
                size_t plo = share_edge(pm, x->rank, x->world), phi = share_edge(pm, x->rank + 1, x->world);
                const char *res = slot(w, x->world, prev_g);
                get(buf + poff, res, plo, bf);
                get(buf + poff + phi, res + phi * es, pm - phi, bf);
            }
            if (m) reduce_share(x, g, lo, hi, buf + off, slot(w, x->world, g), op == DT_REDUCE_AVG, bf);
            prev_g = g;
        }
    } else if (bf) { /* one rank: its own values, rounded as they would travel */
        dt_bf16_round_all(buf, n);
    }
    if (x->break_allreduce && n > 0) buf[0] += 1.0f;
    return DT_OK;
}

/* Floats of the pieces a round of reduce-scatter (per destination rank) or of all-gather of
 * parts moves: whole cache lines, within half a slot and the all-reduce's chunk size. */
static size_t piece_floats(const shm_ctx *x, int per_rank) {
    size_t c = chunk_floats(x->w);
    if (per_rank) c /= (size_t)x->world;
    return c & ~(size_t)15; /* >= 16: half a slot holds a line per rank (world_create) */
}

/* The k-th piece [off, off + len) of rank q's part of n floats, pieces of `pc`. */
static size_t piece(size_t n, int world, int q, size_t k, size_t pc, size_t *off) {
    size_t lo, hi;
    dt_comm_part(n, world, q, &lo, &hi);
    size_t a = lo + k * pc;
    *off = a;
    if (a >= hi) return 0;
    return hi - a < pc ? hi - a : pc;
}

static size_t rounds_of(size_t n, int world, size_t pc) {
    size_t longest = (n + (size_t)world - 1) / (size_t)world; /* dt_comm_part's largest part */
    return (longest + pc - 1) / pc;
}

static dt_status shm_reduce_scatter(void *vctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_REDUCE_SCATTER, n, (int)wire, dl));
    const int bf = wire == DT_WIRE_BF16;
    if (n == 0) return DT_OK;
    if (x->world == 1) {
        if (bf) dt_bf16_round_all(buf, n);
        return DT_OK;
    }
    dt_shm_world *w = x->w;
    const size_t pc = piece_floats(x, 1), rounds = rounds_of(n, x->world, pc);
    enum { BLOCK = 1024 };
    float acc[BLOCK];
    for (size_t k = 0; k < rounds; k++) {
        uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_relaxed);
        char *mine = slot(w, x->rank, g);
        for (int q = 0; q < x->world; q++) {
            size_t off, len = piece(n, x->world, q, k, pc, &off);
            if (q != x->rank && len) put(mine + (size_t)q * pc * (bf ? 2 : sizeof(float)), buf + off, len, bf);
        }
        DT_TRY(k == 0 ? barrier_first(x) : barrier(x));
        size_t off, len = piece(n, x->world, x->rank, k, pc, &off);
        for (size_t b = 0; b < len; b += BLOCK) {
            size_t m = len - b < BLOCK ? len - b : BLOCK;
            sum_ranks(x, g, acc, buf + off + b, (size_t)x->rank * pc + b, m, bf);
            memcpy(buf + off + b, acc, m * sizeof(float));
        }
    }
    if (x->break_allreduce) {
        size_t lo, hi;
        dt_comm_part(n, x->world, x->rank, &lo, &hi);
        if (hi > lo) buf[lo] += 1.0f;
    }
    return DT_OK;
}

static dt_status shm_allgather_parts(void *vctx, float *buf, size_t n, const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_GATHER_PARTS, n, -1, dl));
    if (n == 0 || x->world == 1) return DT_OK;
    dt_shm_world *w = x->w;
    const size_t pc = piece_floats(x, 0), rounds = rounds_of(n, x->world, pc);
    for (size_t k = 0; k < rounds; k++) {
        uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_relaxed);
        size_t off, len = piece(n, x->world, x->rank, k, pc, &off);
        if (len) memcpy(slot(w, x->rank, g), buf + off, len * sizeof(float));
        DT_TRY(k == 0 ? barrier_first(x) : barrier(x));
        for (int q = 0; q < x->world; q++)
            if (q != x->rank && (len = piece(n, x->world, q, k, pc, &off)))
                memcpy(buf + off, slot(w, q, g), len * sizeof(float));
    }
    return DT_OK;
}

static dt_status shm_broadcast(void *vctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_BROADCAST, bytes, root, dl));
    if (bytes == 0 || x->world == 1) return DT_OK;
    dt_shm_world *w = x->w;
    const size_t chunk = w->slot_bytes / 2;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_relaxed);
        if (x->rank == root) memcpy(slot(w, root, g), (char *)buf + off, m);
        DT_TRY(off == 0 ? barrier_first(x) : barrier(x));
        if (x->rank != root) memcpy((char *)buf + off, slot(w, root, g), m);
    }
    return DT_OK;
}

static dt_status shm_allgather(void *vctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_ALLGATHER, bytes, -1, dl));
    if (bytes == 0) return DT_OK;
    if (x->world == 1) {
        memmove(out, in, bytes);
        return DT_OK;
    }
    dt_shm_world *w = x->w;
    const size_t chunk = w->slot_bytes / 2;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t m = bytes - off < chunk ? bytes - off : chunk;
        uint32_t g = atomic_load_explicit(&w->s->bar_gen, memory_order_relaxed);
        memcpy(slot(w, x->rank, g), (const char *)in + off, m);
        DT_TRY(off == 0 ? barrier_first(x) : barrier(x));
        for (int r = 0; r < x->world; r++) memcpy((char *)out + (size_t)r * bytes + off, slot(w, r, g), m);
    }
    return DT_OK;
}

static dt_status shm_barrier(void *vctx, const dt_comm_deadline *dl) {
    shm_ctx *x = vctx;
    DT_TRY(begin(x, OP_BARRIER, 0, -1, dl));
    return x->world == 1 ? DT_OK : barrier_first(x);
}

static void shm_free(void *vctx) {
    shm_ctx *x = vctx;
    if (!x) return;
    for (int r = 0; r < DT_MAX_WORLD; r++)
        if (x->pidfd[r] >= 0) close(x->pidfd[r]);
    free(x);
}

static const dt_comm_backend_ops shm_backend = {
    .name = "shm",
    .allreduce = shm_allreduce,
    .broadcast = shm_broadcast,
    .allgather = shm_allgather,
    .reduce_scatter = shm_reduce_scatter,
    .allgather_parts = shm_allgather_parts,
    .barrier = shm_barrier,
    .free = shm_free,
};

dt_status dt_comm_init_shm(dt_comm **out, dt_shm_world *w, int rank, double timeout_s) {
    *out = NULL;
    if (!w) return dt_error_set(DT_ERR_INTERNAL, "shm communicator: no shared world (create it before fork)");
    if (rank < 0 || rank >= w->world)
        return dt_error_set(DT_ERR_INTERNAL, "shm communicator: rank %d is not in [0, %d)", rank, w->world);
    shm_ctx *x = dt_calloc(1, sizeof *x, "shm communicator");
    if (!x) return DT_ERR_NOMEM;
    x->w = w;
    x->rank = rank;
    x->world = w->world;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    x->spin_s = cpus > 0 && w->world <= cpus ? SHM_SPIN_S : 0; /* spinning only helps with a core each */
    x->break_allreduce = dt_fault_break_allreduce(rank);
    x->pidns = my_pidns();
    for (int r = 0; r < DT_MAX_WORLD; r++) x->pidfd[r] = -1;
    return dt_comm_create(out, &shm_backend, x, rank, w->world, timeout_s);
}
