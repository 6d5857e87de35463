/* comm.c — the backend-independent half of the collectives: a communicator is a backend
 * (a table of blocking collectives, see comm.h) plus ONE thread that runs the queued
 * requests in issue order. `*_start` queues a request, dt_comm_wait blocks on a condition
 * variable until it is done; the blocking calls are start + wait.
 *
 * A backend with `issue` (nccl) keeps several float collectives in flight: the thread issues
 * every queued one it can (up to be->max_in_flight) before it looks at the oldest in flight
 * with `poll`, then at the queue again, so each bucket is queued on the device as soon as it
 * is started and completions are still seen, and handed over, in issue order. A request the
 * backend declines (and every other kind) waits until nothing is in flight, then runs as
 * before. Other backends never have anything in flight: their path is the old one.
 *
 * Errors: the backend records its message with dt_error_set on the comm thread; the
 * thread copies it into the request and the waiting caller re-sets it on its own thread.
 * The first failure breaks the communicator: queued and later requests fail at once with
 * that first message (the ranks can no longer be in step). */
#include "dtrain/comm.h"

#include "dtrain/bf16.h"

#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    REQ_ALLREDUCE, REQ_BROADCAST, REQ_ALLGATHER, REQ_BARRIER, REQ_REDUCE_SCATTER, REQ_GATHER_PARTS, REQ_RESERVE,
    REQ_ALLREDUCE_BF16
};

struct dt_comm_req {
    int kind;
    void *buf;          /* all-reduce, reduce-scatter, parts: float (n) (bf16 all-reduce: uint16_t); broadcast:
                           bytes; all-gather: out (world * bytes) */
    const void *in;     /* all-gather: this rank's bytes */
    size_t n;           /* all-reduce, reduce-scatter, parts: elements; broadcast / all-gather: bytes */
    dt_reduce_op op;
    dt_wire wire;       /* all-reduce, reduce-scatter */
    int root;
    double timeout_s;   /* barrier: its own deadline (0: the backend's) */
    int done;           /* under c->mu */
    dt_status st;
    char msg[1024];
    struct dt_comm_req *next; /* queue, done list or free list */
};

struct dt_comm {
    const dt_comm_backend_ops *be;
    void *ctx;
    int rank, world;
    double timeout_s;           /* training.collective_timeout_s: every collective's deadline */
    pthread_t thread;
    int thread_started;
    int mu_ok, cv_ok;
    pthread_mutex_t mu;
    pthread_cond_t cv;          /* queue changed or a request finished */
    dt_comm_req *head, *tail;   /* pending, in issue order */
    dt_comm_req *fly, *fly_tail; /* issued by be->issue, not yet seen complete, in issue order */
    int n_fly;
    dt_comm_req *done_list;     /* finished, not yet waited for */
    dt_comm_req *free_list;     /* recycled requests */
    int stop;
    dt_status broken;           /* first failure (DT_OK while healthy) */
    uint64_t sent;              /* bytes this rank sent, as a ring moves them (dt_comm_bytes_sent) */
    int remote;                 /* dt_comm_mark_remote: they all went to another host */
    char broken_msg[1024];
};

static void list_remove(dt_comm_req **list, dt_comm_req *r) {
    for (dt_comm_req **p = list; *p; p = &(*p)->next)
        if (*p == r) {
            *p = r->next;
            return;
        }
}

/* The one place a collective's deadline is decided: a barrier's own, or the communicator's. */
static dt_comm_deadline deadline_of(const dt_comm *c, const dt_comm_req *r) {
    if (r->timeout_s > 0) return (dt_comm_deadline){r->timeout_s, ""};
    return (dt_comm_deadline){c->timeout_s, "; training.collective_timeout_s sets the deadline"};
}

/* dt_comm_allreduce_bf16 where the backend has no bf16 sum of its own: as floats, rounded once */
static dt_status allreduce_bf16_as_floats(dt_comm *c, uint16_t *buf, size_t n, const dt_comm_deadline *dl) {
    float *f = dt_malloc((n ? n : 1) * sizeof(float), "bf16 all-reduce staging");
    if (!f) return DT_ERR_NOMEM;
    dt_bf16_unpack(f, buf, n);
    dt_status st = c->be->allreduce(c->ctx, f, n, DT_REDUCE_SUM, DT_WIRE_F32, dl);
    if (st == DT_OK) dt_bf16_pack(buf, f, n);
    free(f);
    return st;
}

static dt_status run_request(dt_comm *c, dt_comm_req *r) {
    const dt_comm_deadline dl = deadline_of(c, r);
    switch (r->kind) {
    case REQ_ALLREDUCE_BF16:
        return c->be->allreduce_bf16 ? c->be->allreduce_bf16(c->ctx, (uint16_t *)r->buf, r->n, &dl)
                                     : allreduce_bf16_as_floats(c, (uint16_t *)r->buf, r->n, &dl);
    case REQ_ALLREDUCE: return c->be->allreduce(c->ctx, (float *)r->buf, r->n, r->op, r->wire, &dl);
    case REQ_BROADCAST: return c->be->broadcast(c->ctx, r->buf, r->n, r->root, &dl);
    case REQ_ALLGATHER: return c->be->allgather(c->ctx, r->in, r->n, r->buf, &dl);
    case REQ_BARRIER: return c->be->barrier(c->ctx, &dl);
    case REQ_REDUCE_SCATTER: return c->be->reduce_scatter(c->ctx, (float *)r->buf, r->n, r->wire, &dl);
    case REQ_GATHER_PARTS: return c->be->allgather_parts(c->ctx, (float *)r->buf, r->n, &dl);
    case REQ_RESERVE: return c->be->reserve ? c->be->reserve(c->ctx, r->n) : DT_OK;
    }
    return dt_error_set(DT_ERR_INTERNAL, "comm: unknown request kind %d", r->kind);
}

/* r is over: handed to its waiting caller. Comm thread, under c->mu. */
static void done_locked(dt_comm *c, dt_comm_req *r, dt_status st) {
    r->st = st;
    r->done = 1;
    r->next = c->done_list;
    c->done_list = r;
    pthread_cond_broadcast(&c->cv);
}

/* r fails at once: the communicator broke before it ran. */
static void refuse_locked(dt_comm *c, dt_comm_req *r) {
    snprintf(r->msg, sizeof r->msg, "%s", c->broken_msg);
    done_locked(c, r, c->broken);
}

/* r finished with st; a failure's message was recorded on this thread. The first failure
 * breaks the communicator; a backend's failure also gave up what it had in flight (comm.h:
 * issue, poll), so those fail with it. Under c->mu. */
static void finish_locked(dt_comm *c, dt_comm_req *r, dt_status st) {
    if (st != DT_OK) {
        snprintf(r->msg, sizeof r->msg, "%s", dt_error_msg()[0] ? dt_error_msg() : dt_status_str(st));
        if (c->broken == DT_OK) {
            c->broken = st;
            snprintf(c->broken_msg, sizeof c->broken_msg, "%s", r->msg);
        }
    }
    done_locked(c, r, st);
    while (st != DT_OK && c->fly) {
        dt_comm_req *f = c->fly;
        c->fly = f->next;
        c->n_fly--;
        refuse_locked(c, f);
    }
    if (!c->fly) c->fly_tail = NULL;
}

/* One look at the oldest collective in flight (the backend may nap in it). Under c->mu,
 * released during the backend's call. */
static void poll_locked(dt_comm *c) {
    pthread_mutex_unlock(&c->mu);
    dt_error_clear();
    int done = 0;
    const dt_status st = c->be->poll(c->ctx, &done);
    pthread_mutex_lock(&c->mu);
    if (st == DT_OK && !done) return;
    dt_comm_req *r = c->fly;
    c->fly = r->next;
    if (!c->fly) c->fly_tail = NULL;
    c->n_fly--;
    finish_locked(c, r, st);
}

static int is_float(const dt_comm_req *r) {
    return r->kind == REQ_ALLREDUCE || r->kind == REQ_REDUCE_SCATTER || r->kind == REQ_GATHER_PARTS;
}

/* r, just taken from the queue: issued to fly behind the ones before it, or run blocking once
 * every collective in flight has completed. Under c->mu, released during the backend's calls. */
static void run_locked(dt_comm *c, dt_comm_req *r) {
    dt_status st = DT_OK;
    if (c->broken == DT_OK && c->be->issue && is_float(r)) {
        const dt_comm_deadline dl = deadline_of(c, r);
        const dt_comm_float_op f = {r->kind == REQ_ALLREDUCE ? DT_COMM_ALLREDUCE
                                    : r->kind == REQ_REDUCE_SCATTER ? DT_COMM_REDUCE_SCATTER : DT_COMM_GATHER_PARTS,
                                    (float *)r->buf, r->n, r->op, r->wire};
        int issued = 0;
        pthread_mutex_unlock(&c->mu);
        dt_error_clear();
        st = c->be->issue(c->ctx, &f, &dl, &issued);
        pthread_mutex_lock(&c->mu);
        if (issued) {
            r->next = NULL;
            if (c->fly_tail) c->fly_tail->next = r;
            else c->fly = r;
            c->fly_tail = r;
            c->n_fly++;
            return;
        }
    }
    while (st == DT_OK && c->n_fly) poll_locked(c); /* a blocking one runs after everything in flight */
    if (st == DT_OK) {
        if (c->broken != DT_OK) {
            refuse_locked(c, r);
            return;
        }
        pthread_mutex_unlock(&c->mu);
        dt_error_clear();
        st = run_request(c, r);
        pthread_mutex_lock(&c->mu);
    }
    finish_locked(c, r, st);
}

static void *comm_thread(void *arg) {
    dt_comm *c = arg;
    pthread_mutex_lock(&c->mu);
    for (;;) {
        dt_comm_req *r = c->head;
        if (r && (c->n_fly == 0 || c->n_fly < c->be->max_in_flight)) { /* issue all it can first */
            c->head = r->next;
            if (!c->head) c->tail = NULL;
            run_locked(c, r);
        } else if (c->n_fly) {
            poll_locked(c);
        } else if (c->stop) {
            break; /* stop requested, the queue drained and nothing in flight */
        } else {
            pthread_cond_wait(&c->cv, &c->mu);
        }
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

dt_status dt_comm_create(dt_comm **out, const dt_comm_backend_ops *be, void *ctx, int rank, int world,
                         double timeout_s) {
    *out = NULL;
    if (!(timeout_s > 0)) {
        if (be->free) be->free(ctx);
        return dt_error_set(DT_ERR_CONFIG, "training.collective_timeout_s: expected a number > 0, got %g", timeout_s);
    }
    dt_comm *c = dt_calloc(1, sizeof *c, "communicator");
    if (!c) {
        if (be->free) be->free(ctx);
        return DT_ERR_NOMEM;
    }
    c->be = be;
    c->ctx = ctx;
    c->rank = rank;
    c->world = world;
    c->timeout_s = timeout_s;
    if (pthread_mutex_init(&c->mu, NULL) != 0) goto fail;
    c->mu_ok = 1;
    if (pthread_cond_init(&c->cv, NULL) != 0) goto fail;
    c->cv_ok = 1;
    /* the comm thread takes no signals: SIGTERM/SIGINT stay with the training thread */
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&c->thread, NULL, comm_thread, c);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (err != 0) goto fail;
    c->thread_started = 1;
    *out = c;
    return DT_OK;
fail:
    dt_comm_free(c);
    return dt_error_set(DT_ERR_INTERNAL, "comm (%s) rank %d: cannot start the communication thread",
                        be->name, rank);
}

void dt_comm_free(dt_comm *c) {
    if (!c) return;
    if (c->thread_started) {
        pthread_mutex_lock(&c->mu);
        c->stop = 1;
        pthread_cond_broadcast(&c->cv);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->thread, NULL);
    }
    if (c->be && c->be->free) c->be->free(c->ctx);
    /* requests nobody waited for are ours to release now */
    dt_comm_req *lists[3] = {c->head, c->done_list, c->free_list};
    for (int i = 0; i < 3; i++)
        for (dt_comm_req *r = lists[i], *next; r; r = next) {
            next = r->next;
            free(r);
        }
    if (c->cv_ok) pthread_cond_destroy(&c->cv);
    if (c->mu_ok) pthread_mutex_destroy(&c->mu);
    free(c);
}

int dt_comm_rank(const dt_comm *c) { return c->rank; }
int dt_comm_world(const dt_comm *c) { return c->world; }
const char *dt_comm_backend(const dt_comm *c) { return c->be->name; }

double dt_comm_last_exposed_ms(dt_comm *c) { return c->be->exposed_ms ? c->be->exposed_ms(c->ctx) : NAN; }

uint64_t dt_comm_bytes_sent(dt_comm *c) {
    if (c->be->sent) return c->be->sent(c->ctx, 0);
    pthread_mutex_lock(&c->mu);
    const uint64_t v = c->sent;
    pthread_mutex_unlock(&c->mu);
    return v;
}

uint64_t dt_comm_bytes_remote(dt_comm *c) {
    if (c->be->sent) return c->be->sent(c->ctx, 1);
    pthread_mutex_lock(&c->mu);
    const uint64_t v = c->remote ? c->sent : 0;
    pthread_mutex_unlock(&c->mu);
    return v;
}

void dt_comm_mark_remote(dt_comm *c) {
    pthread_mutex_lock(&c->mu);
    c->remote = 1;
    pthread_mutex_unlock(&c->mu);
}

/* Marks the communicator broken with the message already recorded on this thread. */
static dt_status break_locked(dt_comm *c, dt_status st) {
    if (c->broken == DT_OK) {
        c->broken = st;
        snprintf(c->broken_msg, sizeof c->broken_msg, "%s", dt_error_msg());
    }
    return st;
}

/* What one rank sends for `r` in a ring of `world` (nccl-tests' busbw count): all-reduce
 * 2(N-1)/N of the buffer (reduce-scatter, then all-gather), broadcast (N-1)/N of it (a chain,
 * averaged over the ranks), all-gather N-1 pieces, reduce-scatter and all-gather of parts
 * (N-1)/N of the buffer; a barrier nothing. */
static uint64_t ring_bytes(const dt_comm *c, const dt_comm_req *r) {
    const int world = c->world;
    if (world < 2) return 0;
    const uint64_t N = (uint64_t)world, elem = r->wire == DT_WIRE_BF16 ? 2 : sizeof(float);
    switch (r->kind) {
    case REQ_ALLREDUCE: return 2 * (N - 1) * (uint64_t)r->n * elem / N;
    case REQ_ALLREDUCE_BF16: /* as floats where the backend has no bf16 sum (allreduce_bf16_as_floats) */
        return 2 * (N - 1) * (uint64_t)r->n * (c->be->allreduce_bf16 ? 2 : sizeof(float)) / N;
    case REQ_BROADCAST: return (N - 1) * (uint64_t)r->n / N;
    case REQ_ALLGATHER: return (N - 1) * (uint64_t)r->n;
    case REQ_REDUCE_SCATTER: return (N - 1) * (uint64_t)r->n * elem / N;
    case REQ_GATHER_PARTS: return (N - 1) * (uint64_t)r->n * sizeof(float) / N;
    default: return 0;
    }
}

/* Checks the arguments, then queues a copy of `tmpl`. A bad argument breaks the
 * communicator too: this rank would otherwise fall out of step with the others. */
static dt_status start(dt_comm *c, const dt_comm_req *tmpl, dt_comm_req **out) {
    *out = NULL;
    dt_status st = DT_OK;
    if (tmpl->n > 0 && tmpl->kind != REQ_RESERVE && (!tmpl->buf || (tmpl->kind == REQ_ALLGATHER && !tmpl->in)))
        st = dt_error_set(DT_ERR_INTERNAL, "comm rank %d: NULL buffer for %zu %s", c->rank, tmpl->n,
                          tmpl->kind == REQ_BROADCAST || tmpl->kind == REQ_ALLGATHER ? "bytes" : "floats");
    else if (tmpl->kind == REQ_BROADCAST && (tmpl->root < 0 || tmpl->root >= c->world))
        st = dt_error_set(DT_ERR_INTERNAL, "comm rank %d: broadcast root %d is not in [0, %d)", c->rank,
                          tmpl->root, c->world);
    else if (tmpl->kind == REQ_ALLREDUCE && tmpl->op != DT_REDUCE_SUM && tmpl->op != DT_REDUCE_AVG)
        st = dt_error_set(DT_ERR_INTERNAL, "comm rank %d: unknown reduction %d", c->rank, (int)tmpl->op);
    else if (tmpl->wire != DT_WIRE_F32 && tmpl->wire != DT_WIRE_BF16)
        st = dt_error_set(DT_ERR_INTERNAL, "comm rank %d: unknown wire type %d", c->rank, (int)tmpl->wire);
    pthread_mutex_lock(&c->mu);
    if (c->broken != DT_OK) {
        st = dt_error_set(c->broken, "%s", c->broken_msg);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    if (st != DT_OK) {
        break_locked(c, st);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    dt_comm_req *r = c->free_list;
    if (r) {
        c->free_list = r->next;
    } else if (!(r = malloc(sizeof *r))) {
        st = break_locked(c, dt_error_set(DT_ERR_NOMEM, "comm rank %d: out of memory for a request", c->rank));
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    *r = *tmpl;
    c->sent += ring_bytes(c, tmpl);
    r->done = 0;
    r->st = DT_OK;
    r->msg[0] = '\0';
    r->next = NULL;
    /* in queue order, on the caller's thread; a reservation waits for no compute */
    if (c->be->prepare && tmpl->kind != REQ_RESERVE) c->be->prepare(c->ctx);
    if (c->tail) c->tail->next = r;
    else c->head = r;
    c->tail = r;
    pthread_cond_broadcast(&c->cv);
    pthread_mutex_unlock(&c->mu);
    *out = r;
    return DT_OK;
}

dt_status dt_comm_wait(dt_comm *c, dt_comm_req *r) {
    pthread_mutex_lock(&c->mu);
    if (!r) {
        dt_status st = c->broken != DT_OK
            ? dt_error_set(c->broken, "%s", c->broken_msg)
            : dt_error_set(DT_ERR_INTERNAL, "comm rank %d: dt_comm_wait on a request that was never started",
                           c->rank);
        pthread_mutex_unlock(&c->mu);
        return st;
    }
    while (!r->done) pthread_cond_wait(&c->cv, &c->mu);
    list_remove(&c->done_list, r);
    dt_status st = r->st;
    if (st != DT_OK) dt_error_set(st, "%s", r->msg);
    r->next = c->free_list;
    c->free_list = r;
    pthread_mutex_unlock(&c->mu);
    return st;
}

static dt_status start_wait(dt_comm *c, const dt_comm_req *tmpl) {
    dt_comm_req *r;
    DT_TRY(start(c, tmpl, &r));
    return dt_comm_wait(c, r);
}

dt_status dt_comm_allreduce_start(dt_comm *c, float *buf, size_t n, dt_reduce_op op, dt_wire wire, dt_comm_req **req) {
    dt_comm_req t = {.kind = REQ_ALLREDUCE, .buf = buf, .n = n, .op = op, .wire = wire};
    return start(c, &t, req);
}

dt_status dt_comm_allreduce(dt_comm *c, float *buf, size_t n, dt_reduce_op op) {
    dt_comm_req t = {.kind = REQ_ALLREDUCE, .buf = buf, .n = n, .op = op};
    return start_wait(c, &t);
}

dt_status dt_comm_allreduce_bf16(dt_comm *c, uint16_t *buf, size_t n) {
    dt_comm_req t = {.kind = REQ_ALLREDUCE_BF16, .buf = buf, .n = n};
    return start_wait(c, &t);
}

dt_status dt_comm_reduce_scatter_start(dt_comm *c, float *buf, size_t n, dt_wire wire, dt_comm_req **req) {
    dt_comm_req t = {.kind = REQ_REDUCE_SCATTER, .buf = buf, .n = n, .wire = wire};
    return start(c, &t, req);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, float *buf, size_t n) {
    dt_comm_req t = {.kind = REQ_REDUCE_SCATTER, .buf = buf, .n = n};
    return start_wait(c, &t);
}

dt_status dt_comm_allgather_parts_start(dt_comm *c, float *buf, size_t n, dt_comm_req **req) {
    dt_comm_req t = {.kind = REQ_GATHER_PARTS, .buf = buf, .n = n};
    return start(c, &t, req);
}

dt_status dt_comm_allgather_parts(dt_comm *c, float *buf, size_t n) {
    dt_comm_req t = {.kind = REQ_GATHER_PARTS, .buf = buf, .n = n};
    return start_wait(c, &t);
}

dt_status dt_comm_reserve(dt_comm *c, size_t floats) {
    dt_comm_req t = {.kind = REQ_RESERVE, .n = floats};
    return start_wait(c, &t);
}

dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t bytes, int root) {
    dt_comm_req t = {.kind = REQ_BROADCAST, .buf = buf, .n = bytes, .root = root};
    return start_wait(c, &t);
}

dt_status dt_comm_allgather(dt_comm *c, const void *in, size_t bytes, void *out) {
    dt_comm_req t = {.kind = REQ_ALLGATHER, .buf = out, .in = in, .n = bytes};
    return start_wait(c, &t);
}

dt_status dt_comm_barrier(dt_comm *c) { return dt_comm_barrier_timeout(c, 0); }

dt_status dt_comm_barrier_timeout(dt_comm *c, double timeout_s) {
    dt_comm_req t = {.kind = REQ_BARRIER, .timeout_s = timeout_s > 0 ? timeout_s : 0};
    return start_wait(c, &t);
}
