/* comm_plan.h — which collectives a job uses, decided in one place: one pure function of
 * training.communication_backend, who started the workers, the device backend and where the
 * ranks are. Everything that sets up collectives (launch, rendezvous, worker) follows its
 * answer; its reason is logged at start.
 *
 *   host collective   shm  workers on one host (dtrain forked them, or an outside launcher
 *                          started them and the rendezvous found them on one host)
 *                     tcp  a ring over TCP (ranks on several hosts, no mpi; or asked for)
 *                     mpi  Open MPI (asked for, or automatic under mpirun/srun across hosts)
 *   device collective the backend's own for device buffers (NCCL on GPUs): gradients and
 *                     weights always travel over it when there is one and more than one rank;
 *                     the host collective then carries its start-up and small exchanges.
 *   hierarchical      (training.hierarchical_allreduce) gradients and weights of CPU ranks on
 *                     several hosts with more than one each, host by host in rank order: through
 *                     shared memory inside each host and a tcp ring of the hosts' first ranks
 *                     (comm.h dt_comm_init_hier); the flat tcp ring still carries the rest.
 *                     auto: whenever that holds (and training.zero_stage is 0); on: refused
 *                     where it cannot; off: never. */
#ifndef DTRAIN_COMM_PLAN_H
#define DTRAIN_COMM_PLAN_H

#include <stddef.h>

#include "dtrain/config.h"
#include "dtrain/status.h"

/* who started the workers */
typedef enum {
    DT_LAUNCHER_FORK = 0, /* dtrain itself, one host */
    DT_LAUNCHER_TORCHRUN,
    DT_LAUNCHER_MPIRUN,
    DT_LAUNCHER_SLURM,
    DT_LAUNCHER_K8S,
} dt_launcher;

typedef enum { DT_HOSTCOMM_SHM = 0, DT_HOSTCOMM_TCP, DT_HOSTCOMM_MPI } dt_hostcomm;

typedef struct dt_comm_plan_in {
    dt_comm_kind requested;  /* training.communication_backend */
    const char *source;      /* the config file, named in refusals (NULL or "": "config") */
    dt_launcher launcher;
    int world;               /* ranks */
    int local_world;         /* ranks on this host, as the launcher counts them (fork: world) */
    int hosts;               /* distinct hosts the ranks reported at the rendezvous; 0: not met yet */
    const char *device;      /* the device backend's name: "cpu", "cuda" */
    const char *device_comm; /* its collective for device buffers ("nccl"); NULL: none */
    int have_mpi;            /* this binary has the mpi collective */
    dt_hier_mode hier;       /* training.hierarchical_allreduce */
    int ranks_per_host;      /* L when the ranks are host by host in rank order, L on each; 0: not so, or not met */
    int zero_stage;          /* training.zero_stage: 1 keeps the flat ring (see decide_hier in comm_plan.c) */
} dt_comm_plan_in;

typedef struct dt_comm_plan {
    dt_hostcomm host;        /* every rank's host collective */
    const char *device_comm; /* gradients and weights over this (world > 1 and the backend has one), else NULL */
    int hier;                /* ranks per host when gradients and weights go hierarchically, else 0 */
    char reason[256];        /* why, for the start-up log */
} dt_comm_plan;

/* Decides *out from *in. DT_ERR_CONFIG "FILE: training.communication_backend: ..." (exit 2)
 * for a value that cannot do what it says here: mpi or tcp when dtrain forks its workers, mpi
 * in a build without Open MPI, shm across hosts, nccl where the backend has no device
 * collective. Before the ranks have met (hosts 0) the choice between shm and tcp follows the
 * launcher's count of local ranks; rank 0 decides again at the rendezvous, once it has seen
 * every rank's host. */
dt_status dt_comm_plan_decide(const dt_comm_plan_in *in, dt_comm_plan *out);

/* The mesh of a job with model parallelism (training.tensor_parallel T, pipeline_parallel P):
 * world = D x P x T ranks laid out as rank = (d * P + p) * T + t, so that the T ranks of a
 * tensor-parallel group are consecutive (on one host: their collectives on shared memory) and
 * the D ranks of a data-parallel group (one p and t, every d) hold the same share of the model.
 * Gradients are summed over the data-parallel group; activations over the tensor-parallel one. */
typedef struct dt_mesh {
    int dp, pp, tp;   /* D, P, T */
    int d, p, t;      /* this rank's coordinates */
} dt_mesh;

/* The mesh of `world` ranks (a multiple of tp * pp) and rank's place in it. */
static inline dt_mesh dt_mesh_of(int world, int tp, int pp, int rank) {
    dt_mesh m = {world / (tp * pp), pp, tp, rank / (tp * pp), (rank / tp) % pp, rank % tp};
    return m;
}
/* The tensor-parallel groups are numbered g = rank / T (D x P of them, members g*T .. g*T+T-1);
 * the data-parallel ones g = p * T + t (P x T of them, members d*P*T + g for every d). */
static inline int dt_mesh_tp_group(const dt_mesh *m) { return m->d * m->pp + m->p; }
static inline int dt_mesh_dp_group(const dt_mesh *m) { return m->p * m->tp + m->t; }
/* Pipeline stages, 1F1B over M micro-batches a step: the micro-batches stage p of P keeps in
 * flight (its activation sets), and the share of a step the schedule idles (the bubble). */
static inline int dt_mesh_in_flight(int pp, int p, int M) { return pp - p < M ? pp - p : M; }
static inline double dt_mesh_bubble(int pp, int M) { return pp > 1 ? (double)(pp - 1) / (double)(M + pp - 1) : 0.0; }

/* "shm", "tcp", "mpi" */
const char *dt_hostcomm_name(dt_hostcomm h);
/* "shm (why); gradients and weights over nccl" into buf */
void dt_comm_plan_describe(const dt_comm_plan *p, char *buf, size_t n);

#endif
