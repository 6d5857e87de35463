/* test_comm_plan.c — the collective plan (src/comm/comm_plan.c) for every combination of
 * training.communication_backend, launcher, host layout, device collective and mpi build,
 * against a decision table written here: each combination must match a row, and the plan
 * must be the row's. The rows are the documented rules (README "Config reference",
 * docs/multinode.md), first match wins. */
#include <stdio.h>
#include <string.h>

#include "check.h"
#include "dtrain/comm_plan.h"

/* the layouts a plan can be asked for */
enum { L_LOCAL, L_REMOTE, L_SEEN1, L_SEENN, N_LAYOUT };
static const char *const layout_names[] = {"launcher: all local", "launcher: several hosts", "rendezvous: one host",
                                           "rendezvous: several hosts"};
static const char *const req_names[] = {"auto", "shm", "nccl", "mpi", "tcp"};
static const char *const launcher_names[] = {"fork", "torchrun", "mpirun", "slurm", "k8s"};

#define ALL (~0u)
#define B(x) (1u << (x))
enum { REFUSE = -1 };

typedef struct row {
    unsigned req, launcher, layout, device_comm, mpi; /* masks of the values a row covers */
    int host;          /* DT_HOSTCOMM_*, or REFUSE */
    const char *msg;   /* REFUSE: in the message */
} row;

static const row rows[] = {
    /* mpi and tcp need one process per worker started by someone else */
    {B(DT_COMM_MPI) | B(DT_COMM_TCP), B(DT_LAUNCHER_FORK), ALL, ALL, ALL, REFUSE, "needs one dtrain process per worker"},
    {B(DT_COMM_MPI), ALL, ALL, ALL, B(0), REFUSE, "built without Open MPI"},
    {B(DT_COMM_MPI), ALL, ALL, ALL, ALL, DT_HOSTCOMM_MPI, NULL},
    {B(DT_COMM_TCP), ALL, ALL, ALL, ALL, DT_HOSTCOMM_TCP, NULL},
    /* shm: one host, or refused (it used to become the tcp ring without a word) */
    {B(DT_COMM_SHM), ALL, B(L_SEENN), ALL, ALL, REFUSE, "needs every rank on one host"},
    {B(DT_COMM_SHM), ALL, ALL, ALL, ALL, DT_HOSTCOMM_SHM, NULL},
    /* nccl: only where the backend has a device collective (it used to behave as auto on CPU) */
    {B(DT_COMM_NCCL), ALL, ALL, B(0), ALL, REFUSE, "needs GPUs"},
    /* collective/auto and nccl choose the host collective */
    {B(DT_COMM_AUTO) | B(DT_COMM_NCCL), B(DT_LAUNCHER_FORK), ALL, ALL, ALL, DT_HOSTCOMM_SHM, NULL},
    {B(DT_COMM_AUTO) | B(DT_COMM_NCCL), B(DT_LAUNCHER_MPIRUN) | B(DT_LAUNCHER_SLURM), B(L_REMOTE) | B(L_SEENN), ALL, B(1),
     DT_HOSTCOMM_MPI, NULL},
    {B(DT_COMM_AUTO) | B(DT_COMM_NCCL), ALL, B(L_LOCAL) | B(L_SEEN1), ALL, ALL, DT_HOSTCOMM_SHM, NULL},
    {B(DT_COMM_AUTO) | B(DT_COMM_NCCL), ALL, B(L_REMOTE) | B(L_SEENN), ALL, ALL, DT_HOSTCOMM_TCP, NULL},
};
#define N_ROWS ((int)(sizeof rows / sizeof rows[0]))

static int covers(const row *r, int req, int launcher, int layout, int dc, int mpi) {
    return (r->req & B(req)) && (r->launcher & B(launcher)) && (r->layout & B(layout)) && (r->device_comm & B(dc)) &&
           (r->mpi & B(mpi));
}

/* training.hierarchical_allreduce: chosen only for CPU ranks over the tcp collective on several
 * hosts, host by host with more than one each; `on` refused elsewhere (naming why), `off` never. */
static void test_hier(void) {
    const struct {
        dt_hier_mode mode;
        dt_comm_kind req;
        dt_launcher launcher;
        int hosts, per_host, gpu, zero;
        int want;          /* ranks per host chosen, or REFUSE */
        const char *why;   /* in the refusal */
    } cases[] = {
        {DT_HIER_AUTO, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 0, 0, 2, NULL},
        {DT_HIER_ON, DT_COMM_TCP, DT_LAUNCHER_K8S, 2, 2, 0, 0, 2, NULL},
        {DT_HIER_OFF, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 0, 0, 0, NULL},
        {DT_HIER_AUTO, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 1, 0, 0, 0, NULL},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 1, 0, 0, REFUSE, "there is one rank per host"},
        {DT_HIER_AUTO, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 0, 0, 0, 0, NULL},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 0, 0, 0, REFUSE, "not host by host in rank order"},
        {DT_HIER_AUTO, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 1, 0, 0, NULL},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 1, 0, REFUSE, "NCCL"},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_FORK, 1, 0, 0, 0, REFUSE, "every rank is on one host"},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 1, 4, 0, 0, REFUSE, "every rank is on one host"},
        {DT_HIER_ON, DT_COMM_MPI, DT_LAUNCHER_MPIRUN, 2, 2, 0, 0, REFUSE, "this job uses mpi"},
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 0, 0, 0, 0, 0, NULL}, /* not met yet: the rendezvous decides */
        {DT_HIER_AUTO, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 0, 1, 0, NULL}, /* ZeRO-1: the flat ring sends less */
        {DT_HIER_ON, DT_COMM_AUTO, DT_LAUNCHER_TORCHRUN, 2, 2, 0, 1, REFUSE, "training.zero_stage 1 would send more"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        dt_comm_plan_in in = {.requested = cases[i].req, .source = "job.yaml", .launcher = cases[i].launcher, .world = 4,
                              .local_world = cases[i].hosts == 1 ? 4 : 2, .hosts = cases[i].hosts,
                              .device = cases[i].gpu ? "cuda" : "cpu", .device_comm = cases[i].gpu ? "nccl" : NULL,
                              .have_mpi = 1, .hier = cases[i].mode, .ranks_per_host = cases[i].per_host,
                              .zero_stage = cases[i].zero};
        dt_comm_plan plan;
        dt_error_clear();
        dt_status st = dt_comm_plan_decide(&in, &plan);
        printf("hierarchical case %zu: %s\n", i, st == DT_OK ? plan.reason : dt_error_msg());
        if (cases[i].want == REFUSE) {
            CHECK_INT_EQ(st, DT_ERR_CONFIG);
            CHECK_STR_CONTAINS(dt_error_msg(), "job.yaml: training.hierarchical_allreduce: on needs CPU ranks on several hosts");
            CHECK_STR_CONTAINS(dt_error_msg(), cases[i].why);
        } else {
            CHECK_INT_EQ(st, DT_OK);
            CHECK_INT_EQ(plan.hier, cases[i].want);
            if (plan.hier) CHECK_STR_CONTAINS(plan.reason, "gradients hierarchical: 2 hosts x 2 ranks");
        }
    }
}

int main(void) {
    test_hier();
    int combos = 0;
    for (int req = DT_COMM_AUTO; req <= DT_COMM_TCP; req++)
        for (int launcher = DT_LAUNCHER_FORK; launcher <= DT_LAUNCHER_K8S; launcher++)
            for (int layout = 0; layout < N_LAYOUT; layout++)
                for (int dc = 0; dc < 2; dc++)
                    for (int mpi = 0; mpi < 2; mpi++)
                        for (int world = 1; world <= 4; world += 3) {
                            /* dtrain forks on one host only; outside launchers start worlds of > 1 */
                            if (launcher == DT_LAUNCHER_FORK ? layout != L_SEEN1 : world == 1) continue;
                            dt_comm_plan_in in = {
                                .requested = (dt_comm_kind)req, .source = "job.yaml", .launcher = (dt_launcher)launcher,
                                .world = world, .local_world = layout == L_LOCAL || layout == L_SEEN1 ? world : 1,
                                .hosts = layout == L_SEEN1 ? 1 : layout == L_SEENN ? 2 : 0,
                                .device = dc ? "cuda" : "cpu", .device_comm = dc ? "nccl" : NULL, .have_mpi = mpi};
                            int k = 0;
                            while (k < N_ROWS && !covers(&rows[k], req, launcher, layout, dc, mpi)) k++;
                            printf("%-5s %-8s %-26s %-4s mpi %d world %d: ", req_names[req], launcher_names[launcher],
                                   layout_names[layout], dc ? "nccl" : "-", mpi, world);
                            CHECK(k < N_ROWS); /* every combination is in the table */
                            dt_comm_plan plan;
                            dt_error_clear();
                            dt_status st = dt_comm_plan_decide(&in, &plan);
                            if (rows[k].host == REFUSE) {
                                printf("refused: %s\n", dt_error_msg());
                                CHECK_INT_EQ(st, DT_ERR_CONFIG);
                                CHECK(strncmp(dt_error_msg(), "job.yaml: training.communication_backend: ", 42) == 0);
                                CHECK_STR_CONTAINS(dt_error_msg(), rows[k].msg);
                            } else {
                                char d[400];
                                dt_comm_plan_describe(&plan, d, sizeof d);
                                printf("%s\n", d);
                                CHECK_INT_EQ(st, DT_OK);
                                CHECK_INT_EQ(plan.host, rows[k].host);
                                CHECK(plan.reason[0] != '\0');
                                /* gradients and weights over the device collective whenever there
                                 * is one and more than one rank, whatever the host collective */
                                CHECK((plan.device_comm != NULL) == (dc && world > 1));
                                CHECK_STR_CONTAINS(d, dt_hostcomm_name(plan.host));
                            }
                            combos++;
                        }
    printf("%d combinations\n", combos);
    CHECK(combos > 300);
    TEST_PASS("test_comm_plan");
}
