/* comm_plan.c — the collective plan (include/dtrain/comm_plan.h): a pure function, tested by
 * a table of every combination (tests/test_comm_plan.c). */
#include "dtrain/comm_plan.h"

#include <stdio.h>
#include <string.h>

static const char *const launcher_names[] = {"dtrain", "torchrun", "mpirun", "srun", "a Kubernetes Indexed Job"};

const char *dt_hostcomm_name(dt_hostcomm h) { return h == DT_HOSTCOMM_TCP ? "tcp" : h == DT_HOSTCOMM_MPI ? "mpi" : "shm"; }

static dt_status refuse(const dt_comm_plan_in *in, const char *value, const char *why) {
    return dt_error_set(DT_ERR_CONFIG, "%s: training.communication_backend: %s %s",
                        in->source && in->source[0] ? in->source : "config", value, why);
}

/* the host collective when the value leaves the choice to dtrain (collective/auto, nccl) */
static dt_hostcomm automatic(const dt_comm_plan_in *in, char *why, size_t n) {
    const int many = in->hosts > 1 || (in->hosts == 0 && in->local_world < in->world);
    if (in->launcher == DT_LAUNCHER_FORK) {
        snprintf(why, n, "dtrain started its %d worker%s on this host", in->world, in->world > 1 ? "s" : "");
        return DT_HOSTCOMM_SHM;
    }
    if (many && in->have_mpi && (in->launcher == DT_LAUNCHER_MPIRUN || in->launcher == DT_LAUNCHER_SLURM)) {
        snprintf(why, n, "%s started %d ranks across hosts (%d on this one)", launcher_names[in->launcher], in->world,
                 in->local_world);
        return DT_HOSTCOMM_MPI;
    }
    if (in->hosts == 0) {
        snprintf(why, n, "%s says %d of %d ranks are on this host; the rendezvous decides once it has seen them",
                 launcher_names[in->launcher], in->local_world, in->world);
        return many ? DT_HOSTCOMM_TCP : DT_HOSTCOMM_SHM;
    }
    if (in->hosts == 1) snprintf(why, n, "all %d ranks are on this host", in->world);
    else snprintf(why, n, "the %d ranks are on %d hosts", in->world, in->hosts);
    return many ? DT_HOSTCOMM_TCP : DT_HOSTCOMM_SHM;
}

/* training.hierarchical_allreduce, once the host collective is chosen (see comm_plan.h) */
static dt_status decide_hier(const dt_comm_plan_in *in, dt_comm_plan *out) {
    out->hier = 0;
    if (in->hier == DT_HIER_OFF) return DT_OK;
    const int L = in->ranks_per_host, H = L > 0 ? in->world / L : 0;
    const char *why = NULL;
    if (out->device_comm) why = "the GPUs' collective (NCCL) arranges hosts itself";
    else if (out->host != DT_HOSTCOMM_TCP) why = out->host == DT_HOSTCOMM_MPI ? "it is built on the tcp collective, and "
                                                 "this job uses mpi" : "every rank is on one host";
    else if (in->zero_stage == 1)
        why = "training.zero_stage 1 would send more between the hosts, not less (the hierarchical reduce-scatter and "
              "all-gather run as all-reduces)";
    else if (in->hosts == 0) return DT_OK; /* decided at the rendezvous, once the hosts are known */
    else if (in->hosts < 2) why = "every rank is on one host";
    else if (L == 0) why = "the ranks are not host by host in rank order with as many on each host";
    else if (L < 2) why = "there is one rank per host";
    if (!why) {
        out->hier = L;
        size_t k = strlen(out->reason);
        snprintf(out->reason + k, sizeof out->reason - k, "; gradients hierarchical: %d hosts x %d ranks, shared memory "
                 "inside each host, a tcp ring of the %d hosts' first ranks between them "
                 "(training.hierarchical_allreduce: %s)", H, L, H, in->hier == DT_HIER_ON ? "on" : "auto");
        return DT_OK;
    }
    if (in->hier == DT_HIER_AUTO) return DT_OK;
    return dt_error_set(DT_ERR_CONFIG, "%s: training.hierarchical_allreduce: on needs CPU ranks on several hosts, more "
                        "than one on each, host by host in rank order, over the tcp collective, but %s (hint: auto, or "
                        "off)", in->source && in->source[0] ? in->source : "config", why);
}

dt_status dt_comm_plan_decide(const dt_comm_plan_in *in, dt_comm_plan *out) {
    const int fork = in->launcher == DT_LAUNCHER_FORK;
    char why[200] = "";
    out->reason[0] = '\0';
    switch (in->requested) {
    case DT_COMM_MPI:
    case DT_COMM_TCP: {
        const char *value = in->requested == DT_COMM_MPI ? "mpi" : "tcp";
        if (fork)
            return refuse(in, value, "needs one dtrain process per worker started by a launcher (mpirun, srun, "
                                     "torchrun, a Kubernetes Indexed Job) (hint: or use collective/shm to let dtrain "
                                     "fork its workers)");
        if (in->requested == DT_COMM_MPI && !in->have_mpi)
            return refuse(in, value, "this dtrain was built without Open MPI (hint: apt-get install libopenmpi-dev, "
                                     "then rebuild; or use collective/tcp)");
        out->host = in->requested == DT_COMM_MPI ? DT_HOSTCOMM_MPI : DT_HOSTCOMM_TCP;
        snprintf(why, sizeof why, "training.communication_backend: %s", value);
        break;
    }
    case DT_COMM_SHM:
        if (in->hosts > 1)
            return refuse(in, "shm", "needs every rank on one host, but the ranks are on several (hint: use "
                                     "collective, tcp or mpi across hosts)");
        out->host = DT_HOSTCOMM_SHM;
        snprintf(why, sizeof why, "training.communication_backend: shm");
        break;
    case DT_COMM_NCCL: /* the device collective; the host one is chosen as for collective/auto */
        if (!in->device_comm) {
            char what[160];
            snprintf(what, sizeof what, "needs GPUs, and training.device is %s here (hint: collective, or training.device: "
                                        "cuda)", in->device ? in->device : "cpu");
            return refuse(in, "nccl", what);
        }
        out->host = automatic(in, why, sizeof why);
        break;
    case DT_COMM_AUTO:
    default:
        out->host = automatic(in, why, sizeof why);
        break;
    }
    out->device_comm = in->device_comm && in->world > 1 ? in->device_comm : NULL;
    snprintf(out->reason, sizeof out->reason, "%s", why);
    return decide_hier(in, out);
}

void dt_comm_plan_describe(const dt_comm_plan *p, char *buf, size_t n) {
    int k = snprintf(buf, n, "%s (%s)", dt_hostcomm_name(p->host), p->reason);
    if (p->device_comm && k >= 0 && (size_t)k < n)
        snprintf(buf + k, n - (size_t)k, "; gradients and weights over %s", p->device_comm);
}
