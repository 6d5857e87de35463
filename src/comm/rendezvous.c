/* rendezvous.c — launcher environments and the TCP rendezvous (include/dtrain/rendezvous.h).
 *
 * Wire protocol, one text line per message. Every connection (to rank 0, and between ring
 * neighbours) starts with the challenge-response of src/comm/rdzv_auth.h:
 *   accepting side:  "DTRAIN-AUTH 2 hmac-sha256 nonce=NS" (a shared secret) or "DTRAIN-AUTH 2 open"
 *   rank r -> 0:  "DTRAIN-RDZV 2 rank=R world=W digest=XXXXXXXX host=HOST data=PORT[ nonce=NC mac=M]"
 *   0 -> rank r:  "AUTH mac=M2" (with a secret: rank 0 knows it too), then
 *                 "OK shm=/NAME" (one host: sent before rank 0 makes it, see open_segment) or
 *                 "OK tcp IP:PORT[ remote][ hier=L nonce=N[ leader=IP:PORT]]" (the ring listener of
 *                 rank r+1, "@master:PORT" for rank 0's, at MASTER_ADDR; N: a nonce for rank r's
 *                 host alone, from which its ranks derive the name of their shared memory)
 *                 or "ERR message"
 *   ring:         rank r connects to rank r+1's listener, which greets it as above; r says
 *                 "DTRAIN-RING 2 rank=R[ nonce=NC mac=M]", r+1 proves itself with "AUTH mac=M2"
 *   rank r -> 0:  "MAPPED"        (the last rank of a host to map its segment removes the name;
 *                                  the maker and every rank that fails do too)
 *   0 -> rank r:  "GO"            or  "ERR message"
 * Rank 0 and the ring listeners serve every connection that has not said who it is at once,
 * each for RDZV_HELLO_S, at most RDZV_HUB_PER_IP from one address (rdzv_hub_wait): idle or
 * unauthenticated peers are dropped (with one log line, for the first few) and never end the job;
 * a rank dropped before the peer's proof connects again until the deadline; only a rank that proved the secret (or, without one, any
 * rank) with another config does. Text from the network is sanitised before it is printed. */
#include "dtrain/rendezvous.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/clock.h"
#include "rdzv_auth.h"

#define DEFAULT_PORT 29500

/* milliseconds for poll(), never negative or overflowing */
static int poll_ms(double seconds) {
    if (!(seconds > 0)) return 0;
    if (seconds > 3600) return 3600 * 1000;
    return (int)(seconds * 1000) + 1;
}

/* ------------------------------------------------------------------ environment */

/* An integer environment variable: 0 absent, 1 present and valid; DT_ERR_USAGE otherwise. */
static dt_status env_int(const char *name, long lo, long hi, long *out, int *present) {
    const char *v = getenv(name);
    *present = 0;
    if (!v || !*v) return DT_OK;
    char *end;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || end == v || x < lo || x > hi)
        return dt_error_set(DT_ERR_USAGE, "environment: %s=\"%s\": expected an integer %ld..%ld", name, v, lo, hi);
    *out = x;
    *present = 1;
    return DT_OK;
}

typedef struct source {
    const char *name;                         /* for messages */
    dt_launcher launcher;
    const char *rank, *world, *local_rank, *local_world;
} source;

/* "2(x3),1" -> 2: the tasks on this node for the usual homogeneous case */
static int leading_int(const char *s) { return s ? atoi(s) : 0; }

/* first host of a Slurm node list: "node[03-05,09],gpu1" -> "node03" */
static void first_host(const char *list, char *out, size_t n) {
    size_t k = 0;
    const char *p = list;
    while (*p && *p != ',' && *p != '[' && k + 1 < n) out[k++] = *p++;
    if (*p == '[')
        for (p++; *p && *p != '-' && *p != ',' && *p != ']' && k + 1 < n;) out[k++] = *p++;
    out[k] = '\0';
}

dt_status dt_ext_env_detect(int config_world, dt_ext_env *e, int *found) {
    memset(e, 0, sizeof *e);
    *found = 0;
    static const source sources[] = {
        {"torchrun (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)", DT_LAUNCHER_TORCHRUN, "RANK", "WORLD_SIZE",
         "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"Open MPI (OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE)", DT_LAUNCHER_MPIRUN, "OMPI_COMM_WORLD_RANK",
         "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"Slurm (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID)", DT_LAUNCHER_SLURM, "SLURM_PROCID", "SLURM_NTASKS",
         "SLURM_LOCALID", NULL},
    };
    const int n_src = (int)(sizeof sources / sizeof sources[0]);
    int have = 0;
    for (int i = 0; i < n_src; i++) {
        const source *s = &sources[i];
        /* Slurm's variables count only inside an srun step: a batch script runs once, with
         * SLURM_PROCID=0 of the whole allocation */
        if (i == 2 && !getenv("SLURM_STEP_ID")) continue;
        long rank = 0, world = 0, lr = 0, lw = 0;
        int pr = 0, pw = 0, plr = 0, plw = 0;
        dt_status ps = env_int(s->rank, 0, DT_MAX_WORLD - 1, &rank, &pr);
        if (ps == DT_OK) ps = env_int(s->world, 1, DT_MAX_WORLD, &world, &pw);
        if (ps == DT_OK) ps = env_int(s->local_rank, 0, DT_MAX_WORLD - 1, &lr, &plr);
        if (ps == DT_OK && s->local_world) ps = env_int(s->local_world, 1, DT_MAX_WORLD, &lw, &plw);
        if (have) {
            /* an outer launcher's variables (srun around torchrun or mpirun) describe another
             * level of the job: they must agree only when they count the same processes */
            if (ps == DT_OK && pr && pw && world == e->world && rank != e->rank)
                return dt_error_set(DT_ERR_USAGE,
                                    "environment: %s says rank %d of %d but %s=%ld, %s=%ld disagree: which launcher "
                                    "started dtrain? (unset the other's variables)",
                                    e->source, e->rank, e->world, s->rank, rank, s->world, world);
            dt_error_clear();
            continue;
        }
        DT_TRY(ps);
        if (!pr && !pw) continue;
        if (pr != pw)
            return dt_error_set(DT_ERR_USAGE, "environment: %s is set but %s is not (started by %s?)",
                                pr ? s->rank : s->world, pr ? s->world : s->rank, s->name);
        if (rank >= world)
            return dt_error_set(DT_ERR_USAGE, "environment: %s=%ld is not below %s=%ld", s->rank, rank, s->world, world);
        if (!plr) lr = world == 1 ? 0 : rank; /* no local rank: assume one host */
        if (!plw) lw = i == 2 ? leading_int(getenv("SLURM_STEP_TASKS_PER_NODE")) : 0;
        if (lw < 1) lw = world;
        have = 1;
        snprintf(e->source, sizeof e->source, "%s", s->name);
        e->launcher = s->launcher;
        e->rank = (int)rank;
        e->world = (int)world;
        e->local_rank = (int)lr;
        e->local_world = (int)lw;
    }
    if (!have) {
        long idx;
        int pi;
        DT_TRY(env_int("JOB_COMPLETION_INDEX", 0, DT_MAX_WORLD - 1, &idx, &pi));
        if (pi) {
            if (idx >= config_world)
                return dt_error_set(DT_ERR_USAGE,
                                    "environment: JOB_COMPLETION_INDEX=%ld but training.num_workers is %d (hint: the "
                                    "Job's completions and parallelism must equal training.num_workers)",
                                    idx, config_world);
            snprintf(e->source, sizeof e->source,
                     "Kubernetes Indexed Job (JOB_COMPLETION_INDEX, world size from training.num_workers)");
            e->launcher = DT_LAUNCHER_K8S;
            e->rank = (int)idx;
            e->world = config_world;
            e->local_rank = 0;
            e->local_world = 1;
            have = 1;
        }
    }
    if (!have || e->world == 1) return DT_OK; /* not launched, or a world of one: fork mode */

    long port = DEFAULT_PORT;
    int pp;
    DT_TRY(env_int("MASTER_PORT", 1, 65535, &port, &pp));
    if (pp && getenv("TORCHELASTIC_RUN_ID")) {
        /* torchrun's own agent (its TCPStore) listens on MASTER_PORT: meet on the next one */
        port = port == 65535 ? 65534 : port + 1;
    }
    if (!pp) { /* one port per job, so that concurrent jobs on a host do not meet each other */
        const char *job = NULL;
        if (e->launcher == DT_LAUNCHER_MPIRUN) job = getenv("OMPI_MCA_ess_base_jobid");
        else if (e->launcher == DT_LAUNCHER_SLURM) job = getenv("SLURM_JOB_ID");
        if (job && *job) {
            unsigned long h = strtoul(job, NULL, 10) * 31ul + strtoul(getenv("SLURM_STEP_ID") ? getenv("SLURM_STEP_ID") : "0", NULL, 10);
            port = 20000 + (long)(h % 20000ul);
        }
    }
    e->port = (int)port;
    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) snprintf(e->addr, sizeof e->addr, "%s", addr);
    else if (e->local_world == e->world) /* every rank on this host */
        snprintf(e->addr, sizeof e->addr, "127.0.0.1");
    else if (e->launcher == DT_LAUNCHER_SLURM && (getenv("SLURM_STEP_NODELIST") || getenv("SLURM_JOB_NODELIST")))
        first_host(getenv("SLURM_STEP_NODELIST") ? getenv("SLURM_STEP_NODELIST") : getenv("SLURM_JOB_NODELIST"), e->addr,
                   sizeof e->addr);
    /* else unknown: only the TCP rendezvous needs it (dt_rendezvous says so), not the mpi collective */
    *found = 1;
    return DT_OK;
}

/* ------------------------------------------------------------------ sockets */

static dt_status send_line(int fd, const char *line) {
    char buf[1200];
    int n = snprintf(buf, sizeof buf, "%s\n", line);
    for (int off = 0; off < n;) {
        ssize_t k = send(fd, buf + off, (size_t)(n - off), MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return dt_error_set(DT_ERR_DEVICE, "rendezvous: send failed: %s", strerror(errno));
        off += (int)k;
    }
    return DT_OK;
}

/* One line (without the newline) before the deadline. */
static dt_status recv_line(int fd, char *buf, size_t n, double deadline, const char *who) {
    size_t k = 0;
    for (;;) {
        double left = deadline - dt_clock_now();
        if (left <= 0) return dt_error_set(DT_ERR_DEVICE, "rendezvous: no answer from %s in time", who);
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, poll_ms(left));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) continue;
        char c;
        ssize_t got = recv(fd, &c, 1, 0);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return dt_error_set(DT_ERR_DEVICE, "rendezvous: %s closed the connection", who);
        if (c == '\n') break;
        if (k + 1 < n) buf[k++] = c;
    }
    buf[k] = '\0';
    return DT_OK;
}

static void say_all(const int *fds, int n, const char *line) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) send_line(fds[i], line);
}

static void close_all(int *fds, int n) {
    for (int i = 0; i < n; i++)
        if (fds[i] >= 0) {
            close(fds[i]);
            fds[i] = -1;
        }
}

/* this host's name as a hello carries it: [A-Za-z0-9._-], anything else becomes '_' */
static void my_host(char *buf, size_t n) {
    if (gethostname(buf, n - 1) != 0) buf[0] = '\0';
    buf[n - 1] = '\0';
    if (!buf[0]) snprintf(buf, n, "unknown");
    for (char *p = buf; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '-' && *p != '_') *p = '_';
}

/* MASTER_ADDR is a loopback address itself (all ranks on this host): its value in host order, else 0 */
static uint32_t loopback_literal(const char *addr) {
    struct in_addr a;
    if (strcasecmp(addr, "localhost") == 0) return INADDR_LOOPBACK;
    if (inet_pton(AF_INET, addr, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127) return ntohl(a.s_addr);
    return 0;
}

uint32_t dt_rdzv_listen_addr(const char *addr, int resolved, uint32_t ip, const char **why) {
    *why = NULL;
    uint32_t lo = loopback_literal(addr);
    if (lo) return lo;
    if (!addr[0]) *why = "MASTER_ADDR is not set";
    else if (!resolved) *why = "it does not resolve here";
    else if ((ip >> 24) == 127) *why = "it is a loopback address here, and ranks elsewhere could not reach that";
    else return ip;
    return INADDR_ANY;
}

uint32_t dt_rdzv_ring_listen_addr(const char *addr, uint32_t local) {
    return (local >> 24) == 127 && !loopback_literal(addr) ? INADDR_ANY : local;
}

/* A listening socket at a:port (port 0: an ephemeral one), or -1 with errno. */
static int listen_at(struct in_addr a, int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    if (port) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port), .sin_addr = a};
    if (bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, DT_MAX_WORLD) != 0) {
        int err = errno;
        close(fd);
        errno = err;
        return -1;
    }
    return fd;
}

/* Where rank 0 listens (the rendezvous port, then its ring listener): at MASTER_ADDR, the
 * address the others use, as dt_rdzv_listen_addr decides, with a note when that is every
 * address of this host; also when it is no address of this host (a Service or NAT address).
 * Returns the fd, or -1 with errno. */
static int rank0_listen(const dt_ext_env *e, struct in_addr *at) {
    const char *why = NULL;
    char ip[INET_ADDRSTRLEN + 3] = "";
    struct in_addr got = {0};
    int resolved = 0;
    if (e->addr[0] && !loopback_literal(e->addr)) {
        struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
        if (getaddrinfo(e->addr, NULL, &hints, &res) == 0 && res) {
            resolved = 1;
            got = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
            char buf[INET_ADDRSTRLEN];
            inet_ntop(AF_INET, &got, buf, sizeof buf);
            if (strcmp(buf, e->addr) != 0) snprintf(ip, sizeof ip, " (%s)", buf);
        }
        if (res) freeaddrinfo(res);
    }
    at->s_addr = htonl(dt_rdzv_listen_addr(e->addr, resolved, ntohl(got.s_addr), &why));
    int fd = listen_at(*at, e->port);
    if (fd < 0 && errno == EADDRNOTAVAIL && at->s_addr != htonl(INADDR_ANY)) {
        why = "it is no address of this host (a Service or NAT address?)";
        at->s_addr = htonl(INADDR_ANY);
        fd = listen_at(*at, e->port);
    }
    if (fd >= 0 && why)
        fprintf(stderr, "dtrain: rendezvous: listening on every address of this host%s%s%s: %s\n",
                e->addr[0] ? ", not at MASTER_ADDR=" : "", e->addr, ip, why);
    return fd;
}

/* A rank's ring listener: at the address it reached rank 0 from (dt_rdzv_ring_listen_addr),
 * or -1 with errno. */
static int ring_listener(const dt_ext_env *e, int fd0) {
    struct sockaddr_in la;
    socklen_t l = sizeof la;
    struct in_addr at = {htonl(INADDR_ANY)};
    if (getsockname(fd0, (struct sockaddr *)&la, &l) == 0 && la.sin_family == AF_INET)
        at.s_addr = htonl(dt_rdzv_ring_listen_addr(e->addr, ntohl(la.sin_addr.s_addr)));
    return listen_at(at, 0);
}

static int listener_port(int fd) {
    struct sockaddr_in sa;
    socklen_t l = sizeof sa;
    return getsockname(fd, (struct sockaddr *)&sa, &l) == 0 ? ntohs(sa.sin_port) : 0;
}

/* The hello in the hub's pending connection i, parsed, checked (with a secret: its MAC) and
 * answered with our proof: 1. Anything else is dropped, learning nothing: 0. `ring`: a ring
 * hello is expected, else a rank's hello to rank 0; role/proof: the MACs' roles. */
static int hub_hello(rdzv_hub *h, int i, int ring, const char *role, const char *proof, dt_rdzv_hello *out) {
    rdzv_pend *p = &h->p[i];
    char why[400], clean[120], mac[RDZV_MAC_HEX + 1], line[128];
    int parsed = dt_rdzv_parse_hello(p->line, out) == DT_OK;
    if (!parsed || out->ring != ring) {
        dt_rdzv_sanitize(p->line, clean, sizeof clean);
        snprintf(why, sizeof why, "%s: \"%s\"", parsed ? "a hello for another port" : dt_error_msg(), clean);
        rdzv_hub_drop(h, i, NULL, why);
        return 0;
    }
    if (!h->secret->len) {
        if (!out->mac[0]) return 1;
        rdzv_hub_drop(h, i, "authentication failed", "a MAC, but this rank has no shared secret");
        return 0;
    }
    if (!out->mac[0] || !rdzv_mac_ok(h->secret, role, p->nonce, out->nonce, p->line, out->signed_len, out->mac)) {
        rdzv_hub_drop(h, i, "authentication failed",
                      out->mac[0] ? "a wrong MAC (another DTRAIN_RDZV_SECRET there?)" : "no MAC (no shared secret there?)");
        return 0;
    }
    if (rdzv_mac(h->secret, proof, p->nonce, out->nonce, p->line, out->signed_len, mac) != DT_OK) {
        rdzv_hub_drop(h, i, NULL, dt_error_msg());
        return 0;
    }
    snprintf(line, sizeof line, "AUTH mac=%s", mac);
    if (send_line(p->fd, line) != DT_OK) {
        rdzv_hub_drop(h, i, NULL, "closed before our proof");
        return 0;
    }
    return 1;
}

static int connect_by(const struct addrinfo *a, double deadline, char *why, size_t n);

/* our connection to the ring successor while it is authenticated */
typedef struct ring_out {
    int fd, state; /* 0: waiting for its greeting, 1: for its proof, 2: done */
    int dropped;   /* it closed before its proof: connect again */
    size_t k;
    char ns[RDZV_NONCE_HEX + 1], nc[RDZV_NONCE_HEX + 1];
    char hello[160], line[RDZV_LINE];
} ring_out;

/* What has arrived from the successor: its greeting (answered with our hello), its proof. */
static dt_status ring_out_step(const rdzv_secret *sec, const dt_ext_env *e, int next, ring_out *o) {
    char who[32], line[300], mac[RDZV_MAC_HEX + 1];
    snprintf(who, sizeof who, "rank %d", next);
    int got = rdzv_read_line(o->fd, o->line, sizeof o->line, &o->k);
    if (got < 0) { /* its listener pushed us out (a flood?) before it proved itself */
        o->dropped = 1;
        return DT_OK;
    }
    if (got == 0) return DT_OK;
    o->k = 0;
    if (o->state == 1) {
        DT_TRY(rdzv_check_proof(sec, "ring-next", o->ns, o->nc, o->hello, o->line, who, e->rank));
        o->state = 2;
        return DT_OK;
    }
    DT_TRY(rdzv_read_greeting(sec, o->line, who, e->rank, o->ns));
    snprintf(o->hello, sizeof o->hello, "DTRAIN-RING 2 rank=%d", e->rank);
    snprintf(line, sizeof line, "%s", o->hello);
    if (sec->len) {
        DT_TRY(rdzv_nonce(o->nc));
        snprintf(o->hello + strlen(o->hello), sizeof o->hello - strlen(o->hello), " nonce=%s", o->nc);
        DT_TRY(rdzv_mac(sec, "ring", o->ns, o->nc, o->hello, strlen(o->hello), mac));
        snprintf(line, sizeof line, "%s mac=%s", o->hello, mac);
    }
    if (send_line(o->fd, line) != DT_OK) {
        dt_error_clear();
        o->dropped = 1;
        return DT_OK;
    }
    o->state = sec->len ? 1 : 2;
    return DT_OK;
}

/* where our ring successor listens */
typedef struct ring_peer {
    struct sockaddr_storage sa;
    socklen_t len;
    char name[300]; /* for messages */
} ring_peer;

/* A new connection to the successor, for a new handshake (fresh nonces). */
static dt_status ring_out_connect(const dt_ext_env *e, const ring_peer *np, double deadline, ring_out *o) {
    char why[256] = "";
    if (o->fd >= 0) close(o->fd);
    *o = (ring_out){.fd = -1};
    struct addrinfo a = {.ai_family = np->sa.ss_family, .ai_socktype = SOCK_STREAM, .ai_addr = (struct sockaddr *)&np->sa,
                         .ai_addrlen = np->len};
    o->fd = connect_by(&a, deadline, why, sizeof why);
    if (o->fd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d cannot connect to rank %d at %s for the ring: %s",
                            e->rank, (e->rank + 1) % e->world, np->name, why);
    return DT_OK;
}

/* Until our successor is authenticated and our predecessor has connected and proved itself:
 * both ends of the ring, every other connection to our listener dropped. A connection the
 * successor's listener dropped before it proved itself is made again, until the deadline. */
static dt_status ring_handshake(const dt_ext_env *e, const rdzv_secret *sec, int data_fd, const ring_peer *np,
                                double deadline, int *next_fd, int *prev_fd) {
    const int next = (e->rank + 1) % e->world, prev = (e->rank + e->world - 1) % e->world;
    rdzv_hub *hub = dt_calloc(1, sizeof *hub, "the ring's handshakes");
    if (!hub) return DT_ERR_NOMEM;
    char what[48];
    snprintf(what, sizeof what, "rank %d: ring", e->rank);
    rdzv_hub_init(hub, data_fd, sec, what);
    ring_out out = {.fd = *next_fd};
    *next_fd = -1;
    dt_status st = DT_OK;
    while (st == DT_OK && (*prev_fd < 0 || out.state < 2)) {
        if (dt_clock_now() >= deadline) {
            st = *prev_fd < 0 ? dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: rank %d did not connect for the ring "
                                             "in time", e->rank, prev)
                              : dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: rank %d did not answer on the ring "
                                             "in time", e->rank, next);
            break;
        }
        int i = rdzv_hub_wait(hub, deadline, out.state < 2 ? out.fd : -1);
        dt_rdzv_hello h;
        if (i == -3) st = DT_ERR_DEVICE;
        else if (i == -2 && (st = ring_out_step(sec, e, next, &out)) == DT_OK && out.dropped)
            st = ring_out_connect(e, np, deadline, &out);
        else if (i >= 0 && hub_hello(hub, i, 1, "ring", "ring-next", &h)) {
            if (h.rank == prev && *prev_fd < 0) *prev_fd = rdzv_hub_take(hub, i);
            else rdzv_hub_drop(hub, i, NULL, "not this rank's ring neighbour");
        }
    }
    rdzv_hub_close(hub);
    free(hub);
    if (st != DT_OK && *prev_fd >= 0) {
        close(*prev_fd);
        *prev_fd = -1;
    }
    if (st != DT_OK && out.fd >= 0) close(out.fd);
    else *next_fd = out.fd;
    return st;
}

/* The first connection to our successor at "IP:PORT" ("@master:PORT": rank 0, at the address
 * our rendezvous connection reached it, `master`, else at every address MASTER_ADDR has). */
static dt_status ring_first(const dt_ext_env *e, const char *next_addr, const struct sockaddr_storage *master,
                            double deadline, ring_peer *np, int *fd) {
    const int next = (e->rank + 1) % e->world;
    char ip[300] = "", clean[220], ports[16], why[256] = "no address";
    int port = 0;
    if (sscanf(next_addr, "%255[^:]:%d", ip, &port) != 2 || port <= 0 || port > 65535) {
        dt_rdzv_sanitize(next_addr, clean, sizeof clean);
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: no ring address for rank %d in \"%s\"", next, clean);
    }
    int at_master = strcmp(ip, "@master") == 0;
    if (at_master) snprintf(ip, sizeof ip, "%s", e->addr);
    dt_rdzv_sanitize(ip, clean, sizeof clean);
    snprintf(np->name, sizeof np->name, "%s:%d", clean, port);
    *fd = -1;
    if (at_master && master && master->ss_family == AF_INET) {
        memcpy(&np->sa, master, sizeof *master);
        ((struct sockaddr_in *)&np->sa)->sin_port = htons((uint16_t)port);
        np->len = sizeof(struct sockaddr_in);
        struct addrinfo a = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_addr = (struct sockaddr *)&np->sa,
                             .ai_addrlen = np->len};
        *fd = connect_by(&a, deadline, why, sizeof why);
    }
    snprintf(ports, sizeof ports, "%d", port);
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV}, *res = NULL;
    if (*fd < 0 && getaddrinfo(ip, ports, &hints, &res) == 0)
        for (struct addrinfo *a = res; a && *fd < 0; a = a->ai_next) {
            *fd = connect_by(a, deadline, why, sizeof why);
            memcpy(&np->sa, a->ai_addr, a->ai_addrlen);
            np->len = a->ai_addrlen;
        }
    if (res) freeaddrinfo(res);
    if (*fd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d cannot connect to rank %d at %s for the ring: %s",
                            e->rank, next, np->name, why);
    return DT_OK;
}

/* The ring from "IP:PORT" of our successor (see ring_first): connect to rank+1, accept rank-1
 * on our listener, and make the tcp communicator of them. */
static dt_status make_ring(const dt_ext_env *e, const rdzv_secret *sec, const char *next_addr,
                           const struct sockaddr_storage *master, int data_fd, double deadline, dt_comm **comm_out,
                           double timeout_s) {
    ring_peer np;
    int next_fd = -1, prev_fd = -1;
    DT_TRY(ring_first(e, next_addr, master, deadline, &np, &next_fd));
    DT_TRY(ring_handshake(e, sec, data_fd, &np, deadline, &next_fd, &prev_fd));
    return dt_comm_init_tcp(comm_out, e->rank, e->world, next_fd, prev_fd, timeout_s);
}

/* ---- a model-parallel group's ring (rendezvous.h) ---- */

dt_status dt_rdzv_group_listen(const dt_ext_env *e, int *fd, char *addr, size_t n) {
    *fd = -1;
    struct in_addr at = {htonl(INADDR_ANY)}, local = {htonl(INADDR_LOOPBACK)};
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    const int resolved = e->addr[0] && getaddrinfo(e->addr, NULL, &hints, &res) == 0 && res;
    if (resolved) { /* a datagram socket "connected" to MASTER_ADDR says which local address faces it: nothing is sent */
        struct sockaddr_in to = *(struct sockaddr_in *)res->ai_addr, la;
        to.sin_port = htons((uint16_t)(e->port > 0 ? e->port : 29500));
        socklen_t l = sizeof la;
        int u = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        if (u >= 0 && connect(u, (struct sockaddr *)&to, sizeof to) == 0 &&
            getsockname(u, (struct sockaddr *)&la, &l) == 0)
            local = la.sin_addr;
        if (u >= 0) close(u);
    }
    if (e->rank == 0) {
        const char *why;
        const uint32_t ip = resolved ? ntohl(((struct sockaddr_in *)res->ai_addr)->sin_addr.s_addr) : 0;
        at.s_addr = htonl(dt_rdzv_listen_addr(e->addr, resolved, ip, &why));
    } else {
        at.s_addr = htonl(dt_rdzv_ring_listen_addr(e->addr, ntohl(local.s_addr)));
    }
    if (res) freeaddrinfo(res);
    *fd = listen_at(at, 0);
    if (*fd < 0 && errno == EADDRNOTAVAIL && at.s_addr != htonl(INADDR_ANY)) *fd = listen_at((struct in_addr){0}, 0);
    if (*fd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rank %d: cannot listen for its model-parallel groups' connections: %s",
                            e->rank, strerror(errno));
    char ip[INET_ADDRSTRLEN] = "";
    inet_ntop(AF_INET, &local, ip, sizeof ip);
    snprintf(addr, n, "%s:%d", e->rank == 0 ? "@master" : ip, listener_port(*fd));
    return DT_OK;
}

dt_status dt_rdzv_group_ring(const dt_ext_env *e, int idx, int size, const char *next_addr, int listen_fd,
                             const char *what, double timeout_s, dt_comm **out) {
    *out = NULL;
    rdzv_secret *sec = dt_malloc(sizeof *sec, "the rendezvous secret");
    if (!sec) return DT_ERR_NOMEM;
    dt_ext_env ge = *e; /* the ring's ranks are the group's; MASTER_ADDR as the job's ("@master") */
    ge.rank = idx;
    ge.world = size;
    dt_status st = rdzv_secret_load(sec);
    if (st == DT_OK) st = make_ring(&ge, sec, next_addr, NULL, listen_fd, dt_clock_now() + timeout_s, out, timeout_s);
    if (st != DT_OK) dt_error_prefix("rank %d, %s", e->rank, what);
    rdzv_secret_wipe(sec);
    free(sec);
    return st;
}

/* ---- rank 0: the server ---- */

typedef struct server {
    const dt_ext_env *e;
    const rdzv_secret *sec;
    uint32_t digest;
    double timeout_s, deadline;
    int lfd, data_fd;                            /* the rendezvous port; our ring listener */
    int arrived;                                 /* ranks checked in, rank 0 included */
    int fds[DT_MAX_WORLD];                       /* each rank's connection, -1 until it arrives */
    int data_port[DT_MAX_WORLD];                 /* each rank's ring listener */
    char peer_ip[DT_MAX_WORLD][INET_ADDRSTRLEN]; /* each rank as this host sees it ([0]: us, as they see us) */
    char host[DT_MAX_WORLD][256];                /* each rank's host name */
    char err[1100];                              /* the ERR line every rank gets when the rendezvous fails */
    rdzv_hub hub;                                /* the connections that have not said who they are */
} server;

/* The rendezvous port and rank 0's ring listener, at the address the ranks use. */
static dt_status server_listen(server *s) {
    struct in_addr at;
    s->lfd = rank0_listen(s->e, &at);
    if (s->lfd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank 0 cannot listen on port %d: %s (hint: another job uses it? "
                            "set MASTER_PORT)", s->e->port, strerror(errno));
    s->data_fd = listen_at(at, 0);
    if (s->data_fd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: cannot open a listening socket: %s", strerror(errno));
    rdzv_hub_init(&s->hub, s->lfd, s->sec, "rendezvous");
    return DT_OK;
}

/* The ranks that have not arrived, as "1, 3, 4". */
static void server_missing(const server *s, char *buf, size_t n) {
    size_t k = 0;
    buf[0] = '\0';
    for (int r = 1; r < s->e->world && k < n; r++)
        if (s->fds[r] < 0) k += (size_t)snprintf(buf + k, n - k, "%s%d", k ? ", " : "", r);
}

/* A hello from rank `rank` on connection c: where its ring listener is, and its host. */
static void server_admit(server *s, int c, int rank, int dport, const char *host) {
    struct sockaddr_in pa;
    socklen_t pl = sizeof pa;
    if (getpeername(c, (struct sockaddr *)&pa, &pl) == 0)
        inet_ntop(AF_INET, &pa.sin_addr, s->peer_ip[rank], sizeof s->peer_ip[rank]);
    if (!s->peer_ip[0][0] && getsockname(c, (struct sockaddr *)&pa, &pl) == 0)
        inet_ntop(AF_INET, &pa.sin_addr, s->peer_ip[0], sizeof s->peer_ip[0]); /* ours, as the others reach us */
    snprintf(s->host[rank], sizeof s->host[rank], "%s", host);
    s->data_port[rank] = dport;
    s->fds[rank] = c;
    s->arrived++;
}

/* The hub's connection i has sent its line: a rank's hello, or a stranger (another job on
 * this port, a restarted rank, a port scanner, someone without the secret) dropped while we
 * keep waiting. Fails only for a rank of this job (with the secret, when there is one) that
 * runs another config; rank 0's digest is told only to a rank that proved the secret. */
static dt_status server_hello(server *s, int i) {
    const dt_ext_env *e = s->e;
    dt_rdzv_hello h;
    if (!hub_hello(&s->hub, i, 0, "rank", "rank0", &h)) return DT_OK;
    char peer[sizeof s->hub.p[i].peer];
    snprintf(peer, sizeof peer, "%s", s->hub.p[i].peer);
    int c = rdzv_hub_take(&s->hub, i);
    char line[1024];
    if (h.world != e->world || h.rank < 1 || h.rank >= e->world || s->fds[h.rank] >= 0) {
        snprintf(line, sizeof line, "ERR rank 0 expects ranks 1..%d of a world of %d, once each; got rank %d of %d%s",
                 e->world - 1, e->world, h.rank, h.world,
                 h.rank >= 1 && h.rank < e->world && s->fds[h.rank] >= 0 ? " twice" : "");
        send_line(c, line);
        close(c);
        rdzv_hub_log(&s->hub, "turned away", peer, line + 4);
        return DT_OK;
    }
    if (h.digest != s->digest) {
        char ours[40] = "";
        if (s->sec->len) snprintf(ours, sizeof ours, ", rank 0 has %08x", s->digest);
        snprintf(s->err, sizeof s->err,
                 "ERR rank %d runs another config than rank 0 (config digest %08x%s): every rank must run the same "
                 "config", h.rank, h.digest, ours);
        send_line(c, s->err);
        close(c);
        return dt_error_set(DT_ERR_USAGE,
                            "rendezvous: rank %d runs another config than rank 0 (config digest %08x, rank 0 has "
                            "%08x): every rank must run the same config",
                            h.rank, h.digest, s->digest);
    }
    server_admit(s, c, h.rank, h.data_port, h.host);
    return DT_OK;
}

/* Every rank checks in before the deadline, or the late ones are named. */
static dt_status server_gather(server *s) {
    while (s->arrived < s->e->world) {
        if (dt_clock_now() >= s->deadline) {
            char missing[512];
            server_missing(s, missing, sizeof missing);
            snprintf(s->err, sizeof s->err, "ERR rank(s) %s did not arrive at the rendezvous in time", missing);
            return dt_error_set(DT_ERR_DEVICE,
                                "rendezvous at port %d: rank(s) %s did not arrive within %.0f s (%d of %d here; hint: "
                                "were they started, with MASTER_ADDR pointing at this host? training.collective_timeout_s "
                                "sets the deadline)",
                                s->e->port, missing, s->timeout_s, s->arrived, s->e->world);
        }
        int i = rdzv_hub_wait(&s->hub, s->deadline, -1);
        if (i == -3) return DT_ERR_DEVICE;
        if (i >= 0) DT_TRY(server_hello(s, i));
    }
    return DT_OK;
}


/* distinct host names among the ranks */
static int server_hosts(const server *s) {
    int n = 0;
    for (int r = 0; r < s->e->world; r++) {
        int seen = 0;
        for (int q = 0; q < r && !seen; q++) seen = strcmp(s->host[q], s->host[r]) == 0;
        n += !seen;
    }
    return n;
}

/* Waits for every rank's "MAPPED" (it has its end of the collective), then lets all go. */
static dt_status server_mapped_go(server *s, double deadline, const char *err, const char *go) {
    dt_status st = DT_OK;
    char line[1024];
    for (int r = 1; r < s->e->world && st == DT_OK; r++) {
        char who[32];
        snprintf(who, sizeof who, "rank %d", r);
        if ((st = recv_line(s->fds[r], line, sizeof line, deadline, who)) == DT_OK && strcmp(line, "MAPPED") != 0) {
            char clean[300];
            dt_rdzv_sanitize(line, clean, sizeof clean);
            st = dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: %s", r, clean);
        }
    }
    say_all(s->fds, s->e->world, st == DT_OK ? go : err);
    return st;
}

static dt_status server_mapped(server *s, double deadline, const char *err) {
    return server_mapped_go(s, deadline, err, "GO");
}

/* L when the ranks are host by host in rank order with L on each host (the hierarchical
 * collective's layout), else 0. */
static int server_ranks_per_host(const server *s) {
    const int W = s->e->world;
    int L = 1;
    while (L < W && strcmp(s->host[L], s->host[0]) == 0) L++;
    if (W % L) return 0;
    for (int r = 0; r < W; r++) {
        if (strcmp(s->host[r], s->host[r / L * L]) != 0) return 0;
        for (int q = 0; r % L == 0 && q < r; q += L)
            if (strcmp(s->host[q], s->host[r]) == 0) return 0; /* a host comes back later */
    }
    return L;
}

/* ---- the shared memory of a host ----
 * Made by one rank of the host (rank 0 for a job on one host, the host's leader in the
 * hierarchical collective) under a name every rank of the host knows before it exists; the
 * others open it as soon as it is there, check that it is this user's with mode 0600
 * (dt_shm_world_attach_fd) and say their pids (dt_shm_world_join: the others notice when a
 * rank dies); the last one to join removes the name, and so does every rank that fails, so that
 * a rank killed at any point leaves nothing in /dev/shm while another rank of its host lives. */

/* A segment of ours at `name` for `world` ranks, made by this rank (local rank 0, rank e->rank). */
static dt_status make_segment(const dt_ext_env *e, const char *name, int world, size_t slot_bytes, dt_shm_world **out) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: cannot make the shared memory %s: %s%s", e->rank, name,
                            strerror(errno),
                            errno == EEXIST ? " (hint: the names are random, so another program or user made it, "
                                              "perhaps to stand in for the job's: look at ls -l /dev/shm)"
                                            : "");
    dt_status st = DT_OK;
    if (fchmod(fd, 0600) != 0) /* whatever the umask */
        st = dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: chmod of %s: %s", e->rank, name, strerror(errno));
    if (st == DT_OK) st = dt_shm_world_create_fd(out, world, slot_bytes, fd);
    close(fd);
    if (st == DT_OK && dt_shm_world_join(*out, 0, e->rank)) shm_unlink(name);
    return st;
}

/* After a line from rank 0 ended a wait: its text (an ERR), for the message. */
static void rank0_said(int fd, char *buf, size_t n) {
    char line[1200];
    buf[0] = '\0';
    if (recv_line(fd, line, sizeof line, dt_clock_now() + 1, "rank 0") == DT_OK)
        dt_rdzv_sanitize(strncmp(line, "ERR ", 4) == 0 ? line + 4 : line, buf, n);
    dt_error_clear();
}

/* The segment `name` that rank `maker` of this host makes at about this time, opened, checked
 * and joined as local rank `lrank` of `world`, until the deadline. watch_fd (>= 0): the
 * connection to rank 0, whose line (an ERR) or close ends the wait at once. */
static dt_status open_segment(const dt_ext_env *e, const char *name, int world, int lrank, int maker, int watch_fd,
                              double deadline, dt_shm_world **out) {
    for (;;) {
        int fd = shm_open(name, O_RDWR, 0);
        dt_status st = DT_OK;
        if (fd >= 0) {
            st = dt_shm_world_attach_fd(out, world, fd, name);
            close(fd);
            if (st == DT_OK) {
                if (dt_shm_world_join(*out, lrank, e->rank)) shm_unlink(name); /* the last one in */
                return DT_OK;
            }
            if (st == DT_ERR_USAGE) { /* not ours: never to be mapped */
                dt_error_prefix("rendezvous: rank %d", e->rank);
                return st;
            }
        }
        if (dt_clock_now() >= deadline)
            return fd < 0 ? dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: the shared memory of its host (%s, made by "
                                         "rank %d) did not appear in time", e->rank, name, maker)
                          : st;
        dt_error_clear();
        struct pollfd p = {.fd = watch_fd, .events = POLLIN}; /* waits 5 ms, or less when rank 0 gives up */
        if (watch_fd >= 0 && poll(&p, 1, 5) > 0) {
            char said[400];
            rank0_said(watch_fd, said, sizeof said);
            return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: rank 0 ended the rendezvous while this rank waited "
                                "for its host's shared memory (%s, made by rank %d)%s%s%s", e->rank, name, maker,
                                said[0] ? ": \"" : "; its log says why", said, said[0] ? "\"" : "");
        }
        if (watch_fd < 0) {
            struct timespec ts = {0, 5 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
}

/* The hierarchical collective's parts of this rank, after the flat ring: its host's shared
 * memory (made by the host's first rank, the leader) and, on leaders, the ring of the leaders
 * over TCP through the same listener (leader ring ranks: rank / L). */
typedef struct hier_in {
    int L;                              /* ranks per host */
    char nonce[RDZV_NONCE_HEX + 1];     /* rank 0's for this host alone: other hosts never see it */
    char leader_next[300]; /* leaders: the next leader's "IP:PORT" (or "@master:PORT") */
} hier_in;

/* "/dtrain-PORT-hLEADER-X": X is the host's nonce, through HMAC with the shared secret when
 * there is one, so that no name can be told from another host's, nor (with a secret) from
 * the rendezvous's traffic. */
static dt_status hier_shm_name(const dt_ext_env *e, const rdzv_secret *sec, const hier_in *h, char *name, size_t n) {
    const int leader = e->rank / h->L * h->L;
    char id[RDZV_MAC_HEX + 1], text[32];
    snprintf(text, sizeof text, "shm leader=%d", leader);
    if (sec->len) DT_TRY(rdzv_mac(sec, "shm", h->nonce, "", text, strlen(text), id));
    else snprintf(id, sizeof id, "%s", h->nonce);
    snprintf(name, n, "/dtrain-%d-h%d-%.32s", e->port, leader, id);
    return DT_OK;
}

/* Slots of the host's shared world: 2 MiB (the all-reduce's chunks are at most half a slot, 1
 * MiB, so no slower than the default's larger slots), (L + 1) x 2 MiB of /dev/shm a host. */
#define HIER_SLOT_BYTES ((size_t)2 << 20)

/* watch_fd (>= 0): the connection to rank 0, whose line (an ERR) or close ends a wait at once */
static dt_status hier_setup(const dt_ext_env *e, const rdzv_secret *sec, const hier_in *h, const char *name,
                            const struct sockaddr_storage *master, int data_fd, int watch_fd, double deadline,
                            double timeout_s, dt_shm_world **world_out, dt_comm **leaders_out) {
    const int leader = e->rank / h->L * h->L;
    if (e->rank != leader) return open_segment(e, name, h->L, e->rank - leader, leader, watch_fd, deadline, world_out);
    DT_TRY(make_segment(e, name, h->L, HIER_SLOT_BYTES, world_out));
    dt_ext_env le = *e; /* the leaders' ring: its own ranks, the same listener */
    le.rank = e->rank / h->L;
    le.world = e->world / h->L;
    DT_TRY(make_ring(&le, sec, h->leader_next, master, data_fd, deadline, leaders_out, timeout_s));
    dt_comm_mark_remote(*leaders_out);
    return DT_OK;
}

/* Where rank r reaches rank nx's ring listener: "@master" for rank 0 (where r met it), a rank on
 * rank 0's host that rank 0 saw over loopback at the address r used to reach rank 0. */
static void succ_addr(const server *s, int r, int nx, char *buf, size_t n) {
    char ip[INET_ADDRSTRLEN + 8];
    if (nx == 0) snprintf(ip, sizeof ip, "@master");
    else if (strncmp(s->peer_ip[nx], "127.", 4) == 0 && r != 0) {
        struct sockaddr_in la;
        socklen_t ll = sizeof la;
        if (getsockname(s->fds[r], (struct sockaddr *)&la, &ll) == 0) inet_ntop(AF_INET, &la.sin_addr, ip, sizeof ip);
        else snprintf(ip, sizeof ip, "%s", s->peer_ip[nx]);
    } else snprintf(ip, sizeof ip, "%s", s->peer_ip[nx]);
    snprintf(buf, n, "%s:%d", ip, s->data_port[nx]);
}

/* The ranks form a ring over TCP: each gets the address of its successor as IT can reach it
 * (rank W-1 meets rank 0 where it met it: MASTER_ADDR, "@master"; a successor on rank 0's host
 * that rank 0 saw over loopback is reached at the address the rank used to reach rank 0). */
static dt_status server_ring(server *s, const dt_comm_plan *plan, dt_comm **comm_out, dt_shm_world **world_out,
                             dt_comm **leaders_out) {
    const int W = s->e->world, L = plan->hier;
    struct sockaddr_in sa0;
    socklen_t l0 = sizeof sa0;
    s->data_port[0] = getsockname(s->data_fd, (struct sockaddr *)&sa0, &l0) == 0 ? ntohs(sa0.sin_port) : 0;
    hier_in h = {.L = L};
    char hn[DT_MAX_WORLD][RDZV_NONCE_HEX + 1]; /* each host's nonce, told to its ranks only */
    dt_status st = DT_OK;
    for (int i = 0; L && i < W / L && st == DT_OK; i++) st = rdzv_nonce(hn[i]);
    if (st != DT_OK) {
        say_all(s->fds, W, "ERR rank 0 has no random numbers for the hosts' shared memory");
        return st;
    }
    if (L) snprintf(h.nonce, sizeof h.nonce, "%s", hn[0]);
    char mine[512] = "", line[1024];
    for (int r = 0; r < W; r++) {
        /* "OK tcp ADDR[ remote][ hier=L nonce=N[ leader=ADDR]]": the successor, whether it is on
         * another host (for the bytes between hosts), and the hierarchical collective's parts */
        char addr[320];
        succ_addr(s, r, (r + 1) % W, addr, sizeof addr);
        int k = snprintf(line, sizeof line, "OK tcp %s%s", addr, strcmp(s->host[r], s->host[(r + 1) % W]) ? " remote" : "");
        if (L) k += snprintf(line + k, sizeof line - (size_t)k, " hier=%d nonce=%s", L, hn[r / L]);
        if (L && r % L == 0) {
            succ_addr(s, r, (r + L) % W, addr, sizeof addr);
            snprintf(line + k, sizeof line - (size_t)k, " leader=%s", addr);
        }
        if (r == 0) snprintf(mine, sizeof mine, "%s", line + 7);
        else send_line(s->fds[r], line);
    }
    if (L) {
        const char *la = strstr(mine, " leader=");
        snprintf(h.leader_next, sizeof h.leader_next, "%s", la ? la + 8 : "");
    }
    st = make_ring(s->e, s->sec, mine, NULL, s->data_fd, s->deadline + 30, comm_out, s->timeout_s);
    if (st == DT_OK && strstr(mine, " remote")) dt_comm_mark_remote(*comm_out);
    if (st == DT_OK)
        st = server_mapped_go(s, s->deadline + 60, "ERR the ring of TCP connections could not be completed",
                              L ? "HIER" : "GO");
    else say_all(s->fds, W, "ERR the ring of TCP connections could not be completed");
    char name[96] = "";
    if (st == DT_OK && L) { /* every flat ring is up: the listeners now see the leaders' ring only */
        st = hier_shm_name(s->e, s->sec, &h, name, sizeof name);
        if (st == DT_OK)
            st = hier_setup(s->e, s->sec, &h, name, NULL, s->data_fd, -1, s->deadline + 90, s->timeout_s, world_out,
                            leaders_out);
        if (st == DT_OK) st = server_mapped(s, s->deadline + 120, "ERR the hierarchical collective could not be completed");
        else say_all(s->fds, W, "ERR the hierarchical collective could not be completed");
    }
    if (name[0]) shm_unlink(name); /* every rank of this host has it mapped (or failed) */
    if (st != DT_OK) {
        dt_comm_free(*comm_out);
        *comm_out = NULL;
        dt_comm_free(*leaders_out);
        *leaders_out = NULL;
        dt_shm_world_destroy(*world_out);
        *world_out = NULL;
    }
    return st;
}

/* One host: the job's shared memory, made by rank 0 and mapped by every rank, then unlinked
 * so that nothing stays in /dev/shm. Its name goes out first: every rank knows it before it
 * exists, and removes it if the rendezvous fails (open_segment). */
static dt_status server_shm(server *s, dt_shm_world **world_out) {
    char name[96], line[160], nonce[RDZV_NONCE_HEX + 1];
    dt_status st = rdzv_nonce(nonce);
    if (st != DT_OK) {
        say_all(s->fds, s->e->world, "ERR rank 0 could not create the job's shared memory");
        return st;
    }
    snprintf(name, sizeof name, "/dtrain-%ld-%d-%s", (long)getpid(), s->e->port, nonce);
    snprintf(line, sizeof line, "OK shm=%s", name);
    say_all(s->fds, s->e->world, line);
    st = make_segment(s->e, name, s->e->world, 0, world_out);
    if (st == DT_OK) st = server_mapped(s, s->deadline + 30, "ERR another rank could not map the job's shared memory");
    else say_all(s->fds, s->e->world, "ERR rank 0 could not create the job's shared memory");
    shm_unlink(name); /* every rank has it mapped (or failed) */
    if (st != DT_OK) {
        dt_shm_world_destroy(*world_out);
        *world_out = NULL;
    }
    return st;
}

/* Once every rank is in: rank 0's own work (before_ok), then the plan for the hosts seen. */
static dt_status server_decide(server *s, const dt_comm_plan_in *pin, dt_comm_plan *plan,
                               dt_status (*before_ok)(void *), void *user) {
    dt_status st = before_ok ? before_ok(user) : DT_OK;
    if (st != DT_OK) {
        snprintf(s->err, sizeof s->err, "ERR rank 0 failed: %.1000s", dt_error_msg());
        return st;
    }
    dt_comm_plan_in in = *pin;
    in.hosts = server_hosts(s);
    in.have_mpi = 0; /* the ranks meet over TCP already: mpi is no longer an option */
    in.ranks_per_host = server_ranks_per_host(s);
    st = dt_comm_plan_decide(&in, plan);
    if (st != DT_OK) snprintf(s->err, sizeof s->err, "ERR %.1000s", dt_error_msg());
    return st;
}

static dt_status serve(const dt_ext_env *e, const rdzv_secret *sec, uint32_t digest, double timeout_s,
                       const dt_comm_plan_in *pin, dt_comm_plan *plan, dt_status (*before_ok)(void *), void *user,
                       dt_shm_world **world_out, dt_comm **comm_out, dt_comm **leaders_out) {
    server *s = dt_calloc(1, sizeof *s, "rendezvous state");
    if (!s) return DT_ERR_NOMEM;
    s->e = e;
    s->sec = sec;
    s->digest = digest;
    s->timeout_s = timeout_s;
    s->deadline = dt_clock_now() + timeout_s;
    s->lfd = s->data_fd = -1;
    s->arrived = 1;
    for (int i = 0; i < DT_MAX_WORLD; i++) s->fds[i] = -1;
    my_host(s->host[0], sizeof s->host[0]);
    rdzv_hub_init(&s->hub, -1, sec, "rendezvous");
    dt_status st = server_listen(s);
    if (st == DT_OK) st = server_gather(s);
    rdzv_hub_close(&s->hub);
    if (s->lfd >= 0) close(s->lfd);
    if (st == DT_OK) st = server_decide(s, pin, plan, before_ok, user);
    if (st == DT_OK)
        st = plan->host == DT_HOSTCOMM_TCP ? server_ring(s, plan, comm_out, world_out, leaders_out) : server_shm(s, world_out);
    else if (s->err[0]) say_all(s->fds, e->world, s->err);
    close_all(s->fds, e->world);
    if (s->data_fd >= 0) close(s->data_fd);
    free(s);
    return st;
}


/* connect() that gives up at the deadline (a blocking one may wait minutes for a host
 * that drops packets); returns a blocking socket or -1 with the reason in why */
static int connect_by(const struct addrinfo *a, double deadline, char *why, size_t n) {
    int c = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, a->ai_protocol);
    if (c < 0) {
        snprintf(why, n, "socket: %s", strerror(errno));
        return -1;
    }
    int err = 0;
    if (connect(c, a->ai_addr, a->ai_addrlen) != 0) {
        err = errno;
        if (err == EINPROGRESS) {
            struct pollfd p = {.fd = c, .events = POLLOUT};
            int r;
            do r = poll(&p, 1, poll_ms(deadline - dt_clock_now()));
            while (r < 0 && errno == EINTR);
            socklen_t len = sizeof err;
            if (r <= 0) err = ETIMEDOUT;
            else if (getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
        }
    }
    if (err) {
        snprintf(why, n, "%s", strerror(err));
        close(c);
        return -1;
    }
    int fl = fcntl(c, F_GETFL);
    if (fl >= 0) fcntl(c, F_SETFL, fl & ~O_NONBLOCK);
    return c;
}

/* every other rank */

/* A connection to rank 0, retried with backoff while it is not listening yet. */
static dt_status join_connect(const dt_ext_env *e, double deadline, double timeout_s, int *fd_out) {
    char port[16], last[256] = "";
    snprintf(port, sizeof port, "%d", e->port);
    int fd = -1;
    for (double wait = 0.05; fd < 0;) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM}, *res = NULL;
        int gai = getaddrinfo(e->addr, port, &hints, &res);
        if (gai != 0) snprintf(last, sizeof last, "cannot resolve %s: %s", e->addr, gai_strerror(gai));
        for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
            int c = connect_by(a, deadline, last, sizeof last);
            if (c >= 0) fd = c;
        }
        if (res) freeaddrinfo(res);
        if (fd >= 0) break;
        if (dt_clock_now() + wait > deadline)
            return dt_error_set(DT_ERR_DEVICE,
                                "rendezvous: rank %d could not reach rank 0 at %s:%d within %.0f s (%s) (hint: is rank 0 "
                                "running? MASTER_ADDR and MASTER_PORT must name its host and a free port)",
                                e->rank, e->addr, e->port, timeout_s, last);
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        nanosleep(&ts, NULL);
        wait = wait * 2 > 1.0 ? 1.0 : wait * 2;
    }
    *fd_out = fd;
    return DT_OK;
}

/* Rank 0's greeting, our hello (with a secret: our MAC), rank 0's proof. *again = 1 when the
 * connection broke before that proof (with a secret) or before our hello went (without one):
 * rank 0 may have pushed it out for a flood of strangers, and a new one may do. */
static dt_status join_hello(const dt_ext_env *e, const rdzv_secret *sec, uint32_t digest, int fd, int data_fd,
                            double deadline, int *again) {
    char line[1200], hello[600], host[256], ns[RDZV_NONCE_HEX + 1], nc[RDZV_NONCE_HEX + 1] = "",
                                                                      mac[RDZV_MAC_HEX + 1];
    *again = 1;
    DT_TRY(recv_line(fd, line, sizeof line, deadline, "rank 0"));
    *again = 0;
    DT_TRY(rdzv_read_greeting(sec, line, "rank 0", e->rank, ns));
    my_host(host, sizeof host);
    snprintf(hello, sizeof hello, "DTRAIN-RDZV 2 rank=%d world=%d digest=%08x host=%s data=%d", e->rank, e->world,
             digest, host, listener_port(data_fd));
    snprintf(line, sizeof line, "%s", hello);
    if (sec->len) {
        DT_TRY(rdzv_nonce(nc));
        snprintf(hello + strlen(hello), sizeof hello - strlen(hello), " nonce=%s", nc);
        DT_TRY(rdzv_mac(sec, "rank", ns, nc, hello, strlen(hello), mac));
        snprintf(line, sizeof line, "%s mac=%s", hello, mac);
    }
    *again = 1;
    DT_TRY(send_line(fd, line));
    if (!sec->len) return *again = 0, DT_OK;
    DT_TRY(recv_line(fd, line, sizeof line, deadline, "rank 0"));
    *again = 0;
    return rdzv_check_proof(sec, "rank0", ns, nc, hello, line, "rank 0", e->rank);
}

/* A connection to rank 0 that has passed the handshake, and our ring listener; made again
 * (after a short pause) when rank 0 dropped it before the end of the handshake, until the
 * deadline. *master: where that connection reached rank 0. */
static dt_status join_meet(const dt_ext_env *e, const rdzv_secret *sec, uint32_t digest, double deadline,
                           double timeout_s, int *fd, int *data_fd, struct sockaddr_storage *master) {
    for (int tries = 0;; tries++) {
        DT_TRY(join_connect(e, deadline, timeout_s, fd));
        if (*data_fd < 0 && (*data_fd = ring_listener(e, *fd)) < 0)
            return dt_error_set(DT_ERR_DEVICE, "rendezvous: cannot open a listening socket: %s", strerror(errno));
        int again = 0;
        dt_status st = join_hello(e, sec, digest, *fd, *data_fd, deadline, &again);
        socklen_t ml = sizeof *master;
        if (st == DT_OK && getpeername(*fd, (struct sockaddr *)master, &ml) != 0) master->ss_family = AF_UNSPEC;
        if (st == DT_OK) return DT_OK;
        close(*fd);
        *fd = -1;
        if (!again || dt_clock_now() + 0.05 >= deadline) return st;
        if (tries == 0)
            fprintf(stderr, "dtrain: rank %d: %s before the handshake was done; connecting again\n", e->rank,
                    dt_error_msg());
        dt_error_clear();
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* A name rank 0 may have sent for the job's shared memory: "/dtrain-" and [A-Za-z0-9-] */
static int shm_name_ok(const char *n) {
    if (strncmp(n, "/dtrain-", 8) != 0 || strlen(n) >= 96) return 0;
    for (const char *p = n + 1; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-') return 0;
    return 1;
}

/* One host: the job's shared memory, named by rank 0 (`said`, into name), as rank 0 makes it */
static dt_status join_shm(const dt_ext_env *e, int fd, const char *said, double deadline, char *name, size_t n,
                          dt_shm_world **world_out) {
    char clean[200];
    name[0] = '\0';
    if (!shm_name_ok(said)) {
        dt_rdzv_sanitize(said, clean, sizeof clean);
        return dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: rank 0 named shared memory it cannot use: \"%s\"",
                            e->rank, clean);
    }
    snprintf(name, n, "%s", said);
    return open_segment(e, name, e->world, e->rank, 0, fd, deadline, world_out);
}

/* every other rank */
static dt_status join(const dt_ext_env *e, const rdzv_secret *sec, uint32_t digest, double timeout_s,
                      const dt_comm_plan_in *pin, dt_comm_plan *plan, dt_shm_world **world_out, dt_comm **comm_out,
                      dt_comm **leaders_out) {
    const double deadline = dt_clock_now() + timeout_s;
    int fd = -1, data_fd = -1; /* data_fd: for the ring, in case rank 0 asks for one */
    struct sockaddr_storage master = {.ss_family = AF_UNSPEC};
    char line[1200], clean[600];
    dt_status st = join_meet(e, sec, digest, deadline, timeout_s, &fd, &data_fd, &master);
    /* rank 0 answers when everyone is in: up to its own deadline, which may be later than ours */
    if (st == DT_OK) st = recv_line(fd, line, sizeof line, deadline + timeout_s + 5, "rank 0");
    if (st == DT_OK && strncmp(line, "OK shm=", 7) != 0 && strncmp(line, "OK tcp ", 7) != 0) {
        dt_rdzv_sanitize(strncmp(line, "ERR ", 4) == 0 ? line + 4 : line, clean, sizeof clean);
        st = dt_error_set(DT_ERR_USAGE, "rendezvous: rank 0 refused rank %d: %s", e->rank, clean);
    }
    hier_in h = {0};
    if (st == DT_OK && strncmp(line, "OK tcp ", 7) == 0) { /* " hier=L nonce=N[ leader=ADDR]" */
        const char *hp = strstr(line, " hier="), *lp = strstr(line, " leader=");
        if (hp && (sscanf(hp, " hier=%d nonce=%32[0-9a-f]", &h.L, h.nonce) != 2 || strlen(h.nonce) != RDZV_NONCE_HEX ||
                   h.L < 2 || e->world % h.L))
            st = dt_error_set(DT_ERR_DEVICE, "rendezvous: rank %d: rank 0 sent a hierarchical layout it cannot use",
                              e->rank);
        if (lp) sscanf(lp, " leader=%299s", h.leader_next);
    }
    if (st == DT_OK) { /* rank 0 decided for the hosts it saw: the same plan here */
        dt_comm_plan_in in = *pin;
        in.hosts = strncmp(line, "OK shm=", 7) == 0 ? 1 : 2;
        in.have_mpi = 0;
        in.ranks_per_host = h.L;
        in.hier = h.L ? pin->hier : DT_HIER_OFF; /* as rank 0 decided */
        st = dt_comm_plan_decide(&in, plan);
    }
    int made = 0;
    char name[96] = "";
    if (st == DT_OK && strncmp(line, "OK tcp ", 7) == 0) {
        const int remote = strstr(line, " remote") != NULL;
        st = make_ring(e, sec, line + 7, &master, data_fd, deadline + timeout_s + 30, comm_out, timeout_s);
        if (st == DT_OK && remote) dt_comm_mark_remote(*comm_out);
        send_line(fd, st == DT_OK ? "MAPPED" : "ERR no ring");
        if (st == DT_OK && h.L) { /* then, once every flat ring is up, the hierarchical parts */
            if ((st = recv_line(fd, line, sizeof line, deadline + timeout_s + 60, "rank 0")) == DT_OK &&
                strcmp(line, "HIER") != 0) {
                dt_rdzv_sanitize(strncmp(line, "ERR ", 4) == 0 ? line + 4 : line, clean, sizeof clean);
                st = dt_error_set(DT_ERR_DEVICE, "rendezvous: %s", clean);
            }
            if (st == DT_OK && (st = hier_shm_name(e, sec, &h, name, sizeof name)) == DT_OK) {
                made = 1; /* the name is known: removed at the end, whatever happens */
                st = hier_setup(e, sec, &h, name, &master, data_fd, fd, deadline + timeout_s + 90, timeout_s, world_out,
                                leaders_out);
                send_line(fd, st == DT_OK ? "MAPPED" : "ERR no hierarchical collective");
            }
        }
    } else if (st == DT_OK) {
        st = join_shm(e, fd, line + 7, deadline + timeout_s + 30, name, sizeof name, world_out);
        made = name[0] != '\0';
        send_line(fd, st == DT_OK ? "MAPPED" : "ERR cannot map");
    }
    if (st == DT_OK && (st = recv_line(fd, line, sizeof line, deadline + timeout_s + 40, "rank 0")) == DT_OK &&
        strcmp(line, "GO") != 0) {
        dt_rdzv_sanitize(strncmp(line, "ERR ", 4) == 0 ? line + 4 : line, clean, sizeof clean);
        st = dt_error_set(DT_ERR_DEVICE, "rendezvous: %s", clean);
    }
    if (made) shm_unlink(name); /* after GO every rank of this host has it mapped; after a failure: gone too */
    if (fd >= 0) close(fd);
    if (data_fd >= 0) close(data_fd);
    if (st != DT_OK && *world_out) {
        dt_shm_world_destroy(*world_out);
        *world_out = NULL;
    }
    if (st != DT_OK) {
        dt_comm_free(*comm_out);
        *comm_out = NULL;
        dt_comm_free(*leaders_out);
        *leaders_out = NULL;
    }
    return st;
}

dt_status dt_rendezvous(const dt_ext_env *e, uint32_t digest, double timeout_s, const dt_comm_plan_in *plan_in,
                        dt_comm_plan *plan, dt_status (*before_ok)(void *), void *user, dt_shm_world **world_out,
                        dt_comm **comm_out, dt_comm **leaders_out) {
    *world_out = NULL;
    *comm_out = NULL;
    *leaders_out = NULL;
    if (e->rank != 0 && !e->addr[0])
        return dt_error_set(DT_ERR_USAGE,
                            "environment: MASTER_ADDR is not set: rank %d of %d (%s) needs the address of rank 0 "
                            "(hint: MASTER_ADDR=host MASTER_PORT=29500; with mpirun: -x MASTER_ADDR -x MASTER_PORT, or "
                            "training.communication_backend: mpi)",
                            e->rank, e->world, e->source);
    rdzv_secret *sec = dt_malloc(sizeof *sec, "the rendezvous secret");
    if (!sec) return DT_ERR_NOMEM;
    dt_status st = rdzv_secret_load(sec);
    if (st == DT_OK && !sec->len && e->rank == 0)
        fprintf(stderr,
                "dtrain: warning: the rendezvous at %s:%d has no shared secret: whoever reaches it can join the job or "
                "stall it (hint: set DTRAIN_RDZV_SECRET (or DTRAIN_RDZV_SECRET_FILE) to the same secret on every rank; "
                "docs/multinode.md)\n",
                e->addr[0] ? e->addr : "*", e->port);
    if (st == DT_OK)
        st = e->rank == 0 ? serve(e, sec, digest, timeout_s, plan_in, plan, before_ok, user, world_out, comm_out, leaders_out)
                          : join(e, sec, digest, timeout_s, plan_in, plan, world_out, comm_out, leaders_out);
    rdzv_secret_wipe(sec);
    free(sec);
    return st;
}
