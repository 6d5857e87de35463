/* comm_tcp.c — the `tcp` collective: CPU workers on several hosts without mpirun (torchrun,
 * a Kubernetes Indexed Job). The rendezvous connects the ranks in a ring (each rank sends to
 * rank+1 and receives from rank-1 over TCP); the collectives run around it:
 *
 *   all-reduce   ring reduce-scatter then ring all-gather (2(n-1)/n of the data per link);
 *                each chunk is summed once, on one rank, in a fixed order, and copied to the
 *                others, so every rank gets the same bits
 *   broadcast    store-and-forward along the ring from the root
 *   all-gather   ring, one block per step
 *   reduce-scatter, all-gather of parts: the all-reduce's two halves, shifted by one chunk so
 *                that each rank ends with (or starts from) its own part (dt_comm_part)
 *   DT_WIRE_BF16 the all-reduce's and reduce-scatter's chunks travel as bf16 (each partial sum
 *                rounded as it leaves), added in float32 on arrival
 *   barrier      an all-reduce of one float
 *
 * Every transfer sends and receives at the same time (non-blocking sockets, poll), so the
 * ring never deadlocks on full socket buffers, and gives up at the deadline naming the
 * neighbour it was waiting for. */
#include "dtrain/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/bf16.h"
#include "dtrain/clock.h"

typedef struct tcp_ctx {
    int rank, world;
    int next_fd, prev_fd;   /* send to rank+1, receive from rank-1 */
    const dt_comm_deadline *dl; /* the running collective's (comm.c's) */
    unsigned long seq;
    float *tmp;             /* a received chunk before it is added */
    size_t tmp_n;
    uint16_t *out16, *in16; /* DT_WIRE_BF16: a chunk as sent and as received */
    size_t n16;
} tcp_ctx;

static int prev_of(const tcp_ctx *x) { return (x->rank + x->world - 1) % x->world; }
static int next_of(const tcp_ctx *x) { return (x->rank + 1) % x->world; }

/* Sends slen bytes to next and receives rlen bytes from prev, both at once. */
static dt_status exchange_(tcp_ctx *x, const void *sbuf, size_t slen, void *rbuf, size_t rlen, double deadline,
                           const char *what);

/* On any failure both connections are shut down, so the neighbours notice at once instead of
 * at their deadline; the communicator is unusable afterwards anyway (comm.c). */
static dt_status exchange(tcp_ctx *x, const void *sbuf, size_t slen, void *rbuf, size_t rlen, double deadline,
                          const char *what) {
    dt_status st = exchange_(x, sbuf, slen, rbuf, rlen, deadline, what);
    if (st != DT_OK) {
        shutdown(x->next_fd, SHUT_RDWR);
        shutdown(x->prev_fd, SHUT_RDWR);
    }
    return st;
}

static dt_status exchange_(tcp_ctx *x, const void *sbuf, size_t slen, void *rbuf, size_t rlen, double deadline,
                           const char *what) {
    const char *s = sbuf;
    char *r = rbuf;
    size_t sent = 0, got = 0;
    while (sent < slen || got < rlen) {
        struct pollfd p[2];
        int n = 0, is = -1, ir = -1;
        if (sent < slen) {
            p[n] = (struct pollfd){.fd = x->next_fd, .events = POLLOUT};
            is = n++;
        }
        if (got < rlen) {
            p[n] = (struct pollfd){.fd = x->prev_fd, .events = POLLIN};
            ir = n++;
        }
        double left = deadline - dt_clock_now();
        if (left <= 0)
            return dt_error_set(DT_ERR_DEVICE,
                                "collective timeout: %s #%lu on rank %d waited %.1f s for rank %d (hint: a worker is "
                                "stuck, stopped or dead, or the network between them is%s)",
                                what, x->seq, x->rank, x->dl->timeout_s, got < rlen ? prev_of(x) : next_of(x),
                                x->dl->setting);
        int rc = poll(p, (nfds_t)n, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
        if (rc < 0 && errno != EINTR) return dt_error_set(DT_ERR_DEVICE, "tcp collective: poll: %s", strerror(errno));
        if (rc <= 0) continue;
        if ((is >= 0 && (p[is].revents & POLLNVAL)) || (ir >= 0 && (p[ir].revents & POLLNVAL)))
            return dt_error_set(DT_ERR_INTERNAL, "tcp collective: %s on rank %d: a ring socket is closed", what, x->rank);
        if (is >= 0 && (p[is].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(x->next_fd, s + sent, slen - sent, MSG_NOSIGNAL);
            if (k > 0) sent += (size_t)k;
            else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return dt_error_set(DT_ERR_DEVICE, "tcp collective: %s on rank %d: sending to rank %d failed: %s (it "
                                                   "exited?)", what, x->rank, next_of(x), strerror(errno));
        }
        if (ir >= 0 && (p[ir].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t k = recv(x->prev_fd, r + got, rlen - got, 0);
            if (k > 0) got += (size_t)k;
            else if (k == 0)
                return dt_error_set(DT_ERR_DEVICE, "tcp collective: %s on rank %d: rank %d closed the connection (it "
                                                   "exited?)", what, x->rank, prev_of(x));
            else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
                return dt_error_set(DT_ERR_DEVICE, "tcp collective: %s on rank %d: receiving from rank %d failed: %s",
                                    what, x->rank, prev_of(x), strerror(errno));
        }
    }
    return DT_OK;
}

/* Every collective starts by passing a header around: what it is, its sequence number and
 * its size. A rank that issued another collective (or another size) is caught here instead of
 * shifting the byte stream. */
typedef struct op_header {
    uint32_t kind, root;
    uint64_t seq, count;
} op_header;

static const char *const op_names[] = {"all-reduce", "broadcast", "all-gather", "barrier", "reduce-scatter",
                                       "all-gather of parts", "all-reduce (bf16)", "reduce-scatter (bf16)"};
enum {
    OP_ALLREDUCE, OP_BROADCAST, OP_ALLGATHER, OP_BARRIER, OP_REDUCE_SCATTER, OP_GATHER_PARTS, OP_ALLREDUCE_BF16,
    OP_REDUCE_SCATTER_BF16, OP_KINDS
};

static const char *op_name(uint32_t kind) { return kind < OP_KINDS ? op_names[kind] : "?"; }

static dt_status check_op(tcp_ctx *x, uint32_t kind, uint64_t count, int root, double deadline, const char *what) {
    op_header mine = {kind, (uint32_t)root, x->seq, count}, theirs;
    DT_TRY(exchange(x, &mine, sizeof mine, &theirs, sizeof theirs, deadline, what));
    if (memcmp(&mine, &theirs, sizeof mine) != 0) {
        shutdown(x->next_fd, SHUT_RDWR);
        shutdown(x->prev_fd, SHUT_RDWR);
        return dt_error_set(DT_ERR_INTERNAL,
                            "collective mismatch: rank %d issued %s #%lu of %lu items, rank %d issued %s #%lu of %lu "
                            "(the ranks took different paths)",
                            x->rank, op_name(mine.kind), (unsigned long)mine.seq, (unsigned long)mine.count, prev_of(x),
                            op_name(theirs.kind), (unsigned long)theirs.seq, (unsigned long)theirs.count);
    }
    return DT_OK;
}

/* Counts collective `kind` and checks that the whole ring issued it (world > 1). */
static dt_status begin(tcp_ctx *x, uint32_t kind, uint64_t count, int root, const dt_comm_deadline *dl, double *deadline) {
    x->seq++;
    x->dl = dl;
    *deadline = dt_clock_now() + dl->timeout_s;
    return check_op(x, kind, count, root, *deadline, op_name(kind));
}

/* chunk i (mod world) of n floats split in `world` parts: dt_comm_part's */
static size_t chunk(size_t n, int world, int i, size_t *len) {
    size_t lo, hi;
    dt_comm_part(n, world, ((i % world) + world) % world, &lo, &hi);
    *len = hi - lo;
    return lo;
}

static dt_status grow(tcp_ctx *x, size_t n, int bf) {
    if (x->tmp_n < n) {
        float *t = realloc(x->tmp, n * sizeof(float));
        if (!t) return dt_error_set(DT_ERR_NOMEM, "tcp collective: out of memory for a %zu-float chunk", n);
        x->tmp = t;
        x->tmp_n = n;
    }
    if (bf && x->n16 < n) {
        uint16_t *a = realloc(x->out16, n * sizeof *a);
        if (a) x->out16 = a;
        uint16_t *b = a ? realloc(x->in16, n * sizeof *b) : NULL;
        if (b) x->in16 = b;
        if (!a || !b) return dt_error_set(DT_ERR_NOMEM, "tcp collective: out of memory for a %zu-value chunk", n);
        x->n16 = n;
    }
    return DT_OK;
}

/* Sends buf(sn) and receives rn values into x->tmp (floats) or, bf16 on the wire, x->in16. */
static dt_status send_recv(tcp_ctx *x, const float *sbuf, size_t sn, size_t rn, int bf, double deadline,
                           const char *what) {
    if (!bf) return exchange(x, sbuf, sn * sizeof(float), x->tmp, rn * sizeof(float), deadline, what);
    dt_bf16_pack(x->out16, sbuf, sn);
    return exchange(x, x->out16, sn * 2, x->in16, rn * 2, deadline, what);
}

/* Ring reduce-scatter: at step s rank r sends chunk r+shift-s and adds what it receives into
 * chunk r+shift-s-1; afterwards it holds the sum of chunk r+shift+1 (shift 0: the all-reduce's
 * first half, -1: every rank its own part). bf: the values travel as bf16, the chunk a rank
 * adds into holds its own values rounded the same way. */
static dt_status ring_reduce(tcp_ctx *x, float *buf, size_t n, int shift, int bf, double deadline, const char *what) {
    const int W = x->world, r = x->rank;
    DT_TRY(grow(x, n / (size_t)W + 1, bf));
    for (int s = 0; s < W - 1; s++) {
        size_t sn, rn, so = chunk(n, W, r + shift - s, &sn), ro = chunk(n, W, r + shift - s - 1, &rn);
        DT_TRY(send_recv(x, buf + so, sn, rn, bf, deadline, what));
        if (bf) { /* each chunk is added into once: its own values are still raw */
            dt_bf16_round_all(buf + ro, rn);
            dt_bf16_add(buf + ro, x->in16, rn);
        } else
            for (size_t i = 0; i < rn; i++) buf[ro + i] += x->tmp[i];
    }
    return DT_OK;
}

/* Ring all-gather of chunks, rank r starting with chunk `own`: at step s it sends chunk
 * own-s and receives chunk own-s-1 (bf: as bf16, the owner's chunk rounded first). */
static dt_status ring_gather(tcp_ctx *x, float *buf, size_t n, int own, int bf, double deadline, const char *what) {
    const int W = x->world;
    DT_TRY(grow(x, n / (size_t)W + 1, bf));
    if (bf) {
        size_t len, off = chunk(n, W, own, &len);
        dt_bf16_round_all(buf + off, len);
    }
    for (int s = 0; s < W - 1; s++) {
        size_t sn, rn, so = chunk(n, W, own - s, &sn), ro = chunk(n, W, own - s - 1, &rn);
        if (!bf) {
            DT_TRY(exchange(x, buf + so, sn * sizeof(float), buf + ro, rn * sizeof(float), deadline, what));
            continue;
        }
        DT_TRY(send_recv(x, buf + so, sn, rn, 1, deadline, what)); /* exact: what it sends is bf16 already */
        dt_bf16_unpack(buf + ro, x->in16, rn);
    }
    return DT_OK;
}

static dt_status tcp_allreduce(void *vctx, float *buf, size_t n, dt_reduce_op op, dt_wire wire,
                               const dt_comm_deadline *dl) {
    tcp_ctx *x = vctx;
    const int bf = wire == DT_WIRE_BF16;
    if (x->world == 1) {
        x->seq++;
        if (bf) dt_bf16_round_all(buf, n); /* as it would travel */
        return DT_OK;
    }
    double deadline;
    DT_TRY(begin(x, bf ? OP_ALLREDUCE_BF16 : OP_ALLREDUCE, n, -1, dl, &deadline));
    if (n == 0) return DT_OK;
    DT_TRY(ring_reduce(x, buf, n, 0, bf, deadline, "all-reduce"));
    if (op == DT_REDUCE_AVG) { /* each rank scales the chunk it owns, before it travels on */
        size_t len, off = chunk(n, x->world, x->rank + 1, &len);
        for (size_t i = 0; i < len; i++) buf[off + i] /= (float)x->world;
    }
    return ring_gather(x, buf, n, x->rank + 1, bf, deadline, "all-reduce");
}

static dt_status tcp_reduce_scatter(void *vctx, float *buf, size_t n, dt_wire wire, const dt_comm_deadline *dl) {
    tcp_ctx *x = vctx;
    const int bf = wire == DT_WIRE_BF16;
    if (x->world == 1) {
        x->seq++;
        if (bf) dt_bf16_round_all(buf, n);
        return DT_OK;
    }
    double deadline;
    DT_TRY(begin(x, bf ? OP_REDUCE_SCATTER_BF16 : OP_REDUCE_SCATTER, n, -1, dl, &deadline));
    return n ? ring_reduce(x, buf, n, -1, bf, deadline, "reduce-scatter") : DT_OK;
}

static dt_status tcp_allgather_parts(void *vctx, float *buf, size_t n, const dt_comm_deadline *dl) {
    tcp_ctx *x = vctx;
    if (x->world == 1) return x->seq++, DT_OK;
    double deadline;
    DT_TRY(begin(x, OP_GATHER_PARTS, n, -1, dl, &deadline));
    return n ? ring_gather(x, buf, n, x->rank, 0, deadline, "all-gather of parts") : DT_OK;
}

static dt_status tcp_broadcast(void *vctx, void *buf, size_t bytes, int root, const dt_comm_deadline *dl) {
    tcp_ctx *x = vctx;
    if (x->world == 1) return x->seq++, DT_OK;
    double deadline;
    DT_TRY(begin(x, OP_BROADCAST, bytes, root, dl, &deadline));
    if (bytes == 0) return DT_OK;
    if (x->rank != root) DT_TRY(exchange(x, NULL, 0, buf, bytes, deadline, "broadcast"));
    if (next_of(x) != root) DT_TRY(exchange(x, buf, bytes, NULL, 0, deadline, "broadcast"));
    return DT_OK;
}

static dt_status tcp_allgather(void *vctx, const void *in, size_t bytes, void *out, const dt_comm_deadline *dl) {
    tcp_ctx *x = vctx;
    const int W = x->world, r = x->rank;
    char *o = out;
    memmove(o + (size_t)r * bytes, in, bytes);
    if (W == 1) return x->seq++, DT_OK;
    double deadline;
    DT_TRY(begin(x, OP_ALLGATHER, bytes, -1, dl, &deadline));
    for (int s = 0; s < W - 1; s++) {
        int si = (r - s + W) % W, ri = (r - s - 1 + W) % W;
        DT_TRY(exchange(x, o + (size_t)si * bytes, bytes, o + (size_t)ri * bytes, bytes, deadline, "all-gather"));
    }
    return DT_OK;
}

static dt_status tcp_barrier(void *vctx, const dt_comm_deadline *dl) {
    float one = 1.0f;
    return tcp_allreduce(vctx, &one, 1, DT_REDUCE_SUM, DT_WIRE_F32, dl);
}

static void tcp_free(void *vctx) {
    tcp_ctx *x = vctx;
    if (!x) return;
    if (x->next_fd >= 0) close(x->next_fd);
    if (x->prev_fd >= 0) close(x->prev_fd);
    free(x->tmp);
    free(x->out16);
    free(x->in16);
    free(x);
}

static const dt_comm_backend_ops tcp_backend = {
    .name = "tcp",
    .allreduce = tcp_allreduce,
    .broadcast = tcp_broadcast,
    .allgather = tcp_allgather,
    .reduce_scatter = tcp_reduce_scatter,
    .allgather_parts = tcp_allgather_parts,
    .barrier = tcp_barrier,
    .free = tcp_free,
};

dt_status dt_comm_init_tcp(dt_comm **out, int rank, int world, int next_fd, int prev_fd, double timeout_s) {
    *out = NULL;
    tcp_ctx *x = dt_calloc(1, sizeof *x, "tcp communicator");
    if (!x) {
        if (next_fd >= 0) close(next_fd);
        if (prev_fd >= 0) close(prev_fd);
        return DT_ERR_NOMEM;
    }
    x->rank = rank;
    x->world = world;
    x->next_fd = next_fd;
    x->prev_fd = prev_fd;
    int one = 1;
    for (int i = 0; i < 2; i++) {
        int fd = i ? prev_fd : next_fd;
        if (fd < 0) continue;
        setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        int fl = fcntl(fd, F_GETFL);
        if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) { /* blocking sends could deadlock the ring */
            dt_status st = dt_error_set(DT_ERR_DEVICE, "tcp collective: cannot make a ring socket non-blocking: %s",
                                        strerror(errno));
            tcp_free(x);
            return st;
        }
    }
    return dt_comm_create(out, &tcp_backend, x, rank, world, timeout_s);
}
