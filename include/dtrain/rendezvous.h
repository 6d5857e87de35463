/* rendezvous.h — running under someone else's launcher (torchrun, mpirun, srun, a
 * Kubernetes Indexed Job): one dtrain process per worker, started by them, not forked by us.
 *
 * dt_ext_env_detect reads rank, world size and local rank from the environment, in this
 * order: RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE (torchrun, Kubeflow PyTorchJob),
 * OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE} (Open MPI), SLURM_PROCID/SLURM_NTASKS/
 * SLURM_LOCALID inside an srun step (Slurm), JOB_COMPLETION_INDEX with the world size from
 * training.num_workers (Kubernetes). The rendezvous address is MASTER_ADDR:MASTER_PORT (port
 * default: derived from the job id under mpirun and srun, else 29500); when MASTER_ADDR is unset: 127.0.0.1 if the launcher says every rank is on
 * this host (local world == world), else under Slurm the first host of the step's node list.
 *
 * dt_rendezvous: rank 0 listens there, every other rank connects (retrying with backoff
 * while rank 0 is not up yet) and says who it is and the digest of its config; rank 0
 * checks that every rank came, once, with the same config, before a deadline, and names
 * the ranks that did not. On one host it then creates the job's shared memory
 * (shm_open, under a random name every rank learns first), every rank maps it (refusing a
 * segment that is not this user's with mode 0600) and says its pid (dt_shm_world_join: a
 * rank that dies is noticed by the others at once), and the last one in removes the name, as
 * does every rank that fails, so nothing is left in /dev/shm; across hosts (or when asked) it
 * connects the ranks in a ring for the tcp collective, the hierarchical collective's leaders
 * in a ring of their own, each host's ranks in shared memory the same way (the name from a
 * nonce for that host alone, through HMAC with the shared secret when there is one). */
#ifndef DTRAIN_RENDEZVOUS_H
#define DTRAIN_RENDEZVOUS_H

#include <stdint.h>

#include "dtrain/comm.h"
#include "dtrain/comm_plan.h"
#include "dtrain/status.h"

typedef struct dt_ext_env {
    char source[96];      /* which variables were used, for the log */
    dt_launcher launcher; /* which launcher they belong to */
    int rank, world, local_rank, local_world;
    char addr[256];       /* rendezvous host */
    int port;
} dt_ext_env;

/* *found = 0 when no launcher started us (or it started a world of one: then dtrain forks
 * its workers as usual). DT_ERR_USAGE naming the variables when they are incomplete,
 * malformed or contradict each other. */
dt_status dt_ext_env_detect(int config_world, dt_ext_env *env, int *found);

/* Meets the other ranks (see above) within timeout_s. Once every rank has checked in, rank 0
 * decides the collective plan (comm_plan.h) from *plan_in and the hosts it saw, and every rank
 * gets it in *plan: for shm it maps the job's shared memory (*world_out is ready for
 * dt_comm_init_shm); for tcp the ranks connect in a ring and *comm_out is the `tcp`
 * communicator (comm.h). A plan refused there (shm across hosts) fails every rank with its
 * message (DT_ERR_CONFIG on rank 0). `before_ok` (may be NULL) runs on rank 0 once every rank
 * has checked in and before any is let go (e.g. to create the run directory).
 * When the plan is hierarchical (plan->hier = L ranks per host), once every rank's flat ring is
 * up each host's first rank (the leader) makes the host's shared memory, which its other ranks
 * map (*world_out: a world of L for dt_comm_init_shm with index rank % L; its name is unlinked
 * before this returns), and the leaders connect in a ring of their own through the same
 * listeners (*leaders_out: the `tcp` communicator of rank / L among world / L; NULL on the other
 * ranks). */
dt_status dt_rendezvous(const dt_ext_env *env, uint32_t config_digest, double timeout_s, const dt_comm_plan_in *plan_in,
                        dt_comm_plan *plan, dt_status (*before_ok)(void *), void *user, dt_shm_world **world_out,
                        dt_comm **comm_out, dt_comm **leaders_out);

/* ---- a model-parallel group's ring under the tcp collective (launch.c) ----
 * dt_rdzv_group_listen: a new listener for one round of group rings, and where the others reach
 * it: "@master:PORT" on rank 0 (at MASTER_ADDR, as its ring listener), "IP:PORT" elsewhere (the
 * address of this host that faces MASTER_ADDR). dt_rdzv_group_ring: rank idx of a group of
 * `size` connects to its successor at next_addr (another rank's dt_rdzv_group_listen address),
 * takes its predecessor from listen_fd, both proved with the rendezvous' secret as the job's
 * ring is (every other connection dropped), within timeout_s: the group's tcp communicator.
 * `what` names the group in messages ("tensor-parallel group 1"). */
dt_status dt_rdzv_group_listen(const dt_ext_env *env, int *fd, char *addr, size_t n);
dt_status dt_rdzv_group_ring(const dt_ext_env *env, int idx, int size, const char *next_addr, int listen_fd,
                             const char *what, double timeout_s, dt_comm **out);

/* ---- the wire, exposed for tests and fuzzing (src/comm/rendezvous.c describes the protocol) ---- */

/* A connecting rank's first line:
 *   "DTRAIN-RDZV 2 rank=R world=W digest=XXXXXXXX host=HOST data=PORT[ nonce=NC mac=M]"  to rank 0
 *   "DTRAIN-RING 2 rank=R[ nonce=NC mac=M]"                                      to a ring neighbour
 * with decimal numbers, 8 hex digits of digest, a host name of [A-Za-z0-9._-], and with a shared
 * secret 32 hex digits of nonce and 64 of HMAC-SHA256. */
typedef struct dt_rdzv_hello {
    int ring;                 /* 1: "DTRAIN-RING" (world, digest, host, data_port unset) */
    int rank, world, data_port;
    uint32_t digest;
    char host[256];
    char nonce[33], mac[65];  /* "" when the line has none */
    size_t signed_len;        /* the bytes of the line the mac covers: all before " mac=" */
} dt_rdzv_hello;

/* Parses `line` (NUL-terminated, any bytes) into *h. DT_ERR_DATA with a fixed message (never
 * quoting the line) when it is anything else. Pure: no I/O, no global state but the message. */
dt_status dt_rdzv_parse_hello(const char *line, dt_rdzv_hello *h);

/* Text from the network made safe to print: at most n - 1 bytes of `in` into out, every byte
 * outside printable ASCII (control characters, ESC, DEL, bytes >= 0x80) replaced by '?', and
 * "..." at the end when it was cut. */
void dt_rdzv_sanitize(const char *in, char *out, size_t n);

/* Where rank 0 listens, from MASTER_ADDR `addr` ("" when unset) and, for a name, what it
 * resolves to here (resolved 1 and ip in host order, or resolved 0): the address to bind in
 * host order, 0 (INADDR_ANY) for every address of this host, with *why the note saying why
 * (NULL otherwise). Loopback only when MASTER_ADDR is itself a loopback address (127.x.y.z) or
 * "localhost"; a name that resolves to a loopback address here (Debian maps the host name to
 * 127.0.1.1), an unset MASTER_ADDR and one that does not resolve get every address. Pure. */
uint32_t dt_rdzv_listen_addr(const char *addr, int resolved, uint32_t ip, const char **why);
/* A rank's ring listener, from the local address (host order) of its connection to rank 0:
 * that address, or every address (0) when it is a loopback one and MASTER_ADDR is not. Pure. */
uint32_t dt_rdzv_ring_listen_addr(const char *addr, uint32_t local);

#endif
