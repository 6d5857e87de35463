/* launch.c — fork one worker per rank, supervise, stop everyone when one fails, restart.
 *
 * Parent:  status block + shm world (anonymous shared mappings) -> fork N -> poll waitpid
 *          every 20 ms -> on the first failure: abort the collective, SIGTERM (+SIGCONT) the
 *          rest, SIGKILL after a grace period -> reap all -> one message -> maybe restart
 *          all after a backoff (a new world, ctx.attempt + 1).
 *          SIGINT/SIGTERM: set the shared stop flag (workers checkpoint and exit 0); a
 *          second signal kills them at once.
 * Child:   PR_SET_PDEATHSIG, name "dtrain-rN", default signal dispositions, logs, comm,
 *          fn() -> message into the status block -> _exit(code). */
#include "dtrain/launch.h"

#include "dtrain/clock.h"
#include "dtrain/device.h"
#include "dtrain/file.h"
#ifdef DTRAIN_HAVE_MPI
#include "dtrain/comm_mpi.h"
#endif
#include "dtrain/monitor.h"
#include "dtrain/nvml.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MSG_LEN 1024
#define POLL_NS 20000000L   /* 20 ms between waitpid polls */
#define GRACE_S 3.0         /* SIGTERM -> SIGKILL */

typedef struct rank_slot {
    _Atomic int has_msg;
    char msg[MSG_LEN];
} rank_slot;

/* the block every worker shares with the launcher */
typedef struct shared_block {
    volatile int stop;      /* preemption requested: the signal that asked for it */
    char note[1024];        /* rank 0's note of a clean stop */
    dt_worker_slot stats[DT_MAX_WORLD]; /* /proc samples of each worker, by the launcher */
    volatile int waiting[DT_MAX_WORLD];  /* set by a worker while it waits for rank 0's disk */
    _Atomic uint32_t foreign_mcores; /* cores other processes kept busy over the last round, x 1000 */
    _Atomic uint32_t foreign_round;  /* the round it is from (0: none yet) */
    rank_slot slots[];      /* (world) */
} shared_block;

static volatile sig_atomic_t g_signal;  /* the first SIGINT/SIGTERM received by the launcher */
static volatile sig_atomic_t g_signals; /* how many */

static void on_signal(int sig) {
    if (!g_signal) g_signal = sig;
    g_signals++;
}

static volatile int *g_child_stop; /* in a worker: the shared stop flag */

static void on_child_signal(int sig) {
    if (g_child_stop) *g_child_stop = sig;
}

/* rank-N.log in the log dir; "" when there is none */
static void log_path(const dt_launch_cfg *cfg, int rank, char *buf, size_t n) {
    if (cfg->log_dir) snprintf(buf, n, "%s/rank-%d.log", cfg->log_dir, rank);
    else if (n) buf[0] = '\0';
}

/* ---- child ---- */

static void append_log(const char *path, const char *line) {
    if (!path[0]) return;
    int fd; /* never through a link planted in the run directory */
    if (dt_file_open_write(path, 1, &fd) != DT_OK) return;
    FILE *f = dt_file_stream(fd, "a", path);
    if (!f) return;
    char stamp[DT_CLOCK_STAMP_LEN];
    fprintf(f, "%s %s\n", dt_clock_stamp(stamp), line);
    fclose(f);
}

/* The shared memory of the model-parallel groups (cfg->tp or pp > 1): one world per
 * tensor-parallel group (tp > 1) and, with more than one replica, one per data-parallel group
 * (comm_plan.h dt_mesh); with pipeline stages, per pipeline (the ranks of one d and t: q = d * T
 * + t) a world of two for each pair of neighbouring stages (pair[q * (P - 1) + p]: stages p and
 * p + 1) and one of its first and last stages (ends[q]). Made before fork like the job's own. */
typedef struct group_worlds {
    dt_shm_world *tp[DT_MAX_WORLD], *dp[DT_MAX_WORLD], *pair[DT_MAX_WORLD], *ends[DT_MAX_WORLD];
    int n_tp, n_dp, n_pair, n_ends;
} group_worlds;

/* The kinds of group a rank may be in (group_worlds' arrays, in this order) */
enum { G_TP, G_DP, G_PAIR, G_ENDS, G_KINDS };

/* group_worlds' count of each kind for the mesh of `world` ranks (none without model parallelism) */
static void group_counts(int world, int tp, int pp, int n[G_KINDS]) {
    const int dp = world / (tp * pp);
    n[G_TP] = tp > 1 ? world / tp : 0;
    n[G_DP] = dp > 1 && tp * pp > 1 ? tp * pp : 0; /* data parallelism alone: the job's collective */
    n[G_PAIR] = pp > 1 ? dp * tp * (pp - 1) : 0;
    n[G_ENDS] = pp > 1 ? dp * tp : 0;
}

static dt_status groups_create(group_worlds *g, const dt_launch_cfg *cfg) {
    memset(g, 0, sizeof *g);
    const int tp = cfg->tp > 1 ? cfg->tp : 1, pp = cfg->pp > 1 ? cfg->pp : 1;
    if (tp * pp == 1) return DT_OK;
    const int dp = cfg->world / (tp * pp);
    int n[G_KINDS];
    group_counts(cfg->world, tp, pp, n);
    for (; g->n_tp < n[G_TP]; g->n_tp++) DT_TRY(dt_shm_world_create(&g->tp[g->n_tp], tp, 0));
    for (; g->n_dp < n[G_DP]; g->n_dp++) DT_TRY(dt_shm_world_create(&g->dp[g->n_dp], dp, 0));
    for (; g->n_pair < n[G_PAIR]; g->n_pair++) DT_TRY(dt_shm_world_create(&g->pair[g->n_pair], 2, 0));
    for (; g->n_ends < n[G_ENDS]; g->n_ends++) DT_TRY(dt_shm_world_create(&g->ends[g->n_ends], 2, 0));
    return DT_OK;
}

static void groups_abort(group_worlds *g, const char *why) {
    for (int i = 0; i < g->n_tp; i++) dt_shm_world_abort(g->tp[i], why);
    for (int i = 0; i < g->n_dp; i++) dt_shm_world_abort(g->dp[i], why);
    for (int i = 0; i < g->n_pair; i++) dt_shm_world_abort(g->pair[i], why);
    for (int i = 0; i < g->n_ends; i++) dt_shm_world_abort(g->ends[i], why);
}

static void groups_destroy(group_worlds *g) {
    for (int i = 0; i < g->n_tp; i++) dt_shm_world_destroy(g->tp[i]);
    for (int i = 0; i < g->n_dp; i++) dt_shm_world_destroy(g->dp[i]);
    for (int i = 0; i < g->n_pair; i++) dt_shm_world_destroy(g->pair[i]);
    for (int i = 0; i < g->n_ends; i++) dt_shm_world_destroy(g->ends[i]);
    g->n_tp = g->n_dp = g->n_pair = g->n_ends = 0;
}

/* joins world w as member idx, its messages naming the job's rank */
static dt_status group_join(dt_shm_world *w, int idx, int rank, double timeout_s, dt_comm **out) {
    dt_shm_world_name_rank(w, idx, rank);
    return dt_comm_init_shm(out, w, idx, timeout_s);
}

/* One group a rank is in: its kind, its index among that kind's, the rank's index in it, its
 * size, and where the rank's collective of it goes. */
typedef struct membership {
    int kind, i, idx, size;
    dt_comm **comm;
} membership;

/* The groups of mesh rank m (at most 5: its tensor- and data-parallel groups, its pairs with the
 * stages before and after, its pipeline's ends) into out; how many. */
static int memberships(const dt_mesh *m, const int n[G_KINDS], dt_launch_ctx *ctx, membership *out) {
    int k = 0;
    const int q = m->d * m->tp + m->t, P = m->pp; /* its pipeline */
    if (n[G_TP]) out[k++] = (membership){G_TP, dt_mesh_tp_group(m), m->t, m->tp, &ctx->tp_comm};
    if (n[G_DP]) out[k++] = (membership){G_DP, dt_mesh_dp_group(m), m->d, m->dp, &ctx->dp_comm};
    if (n[G_PAIR] && m->p > 0) out[k++] = (membership){G_PAIR, q * (P - 1) + m->p - 1, 1, 2, &ctx->pp_prev};
    if (n[G_PAIR] && m->p < P - 1) out[k++] = (membership){G_PAIR, q * (P - 1) + m->p, 0, 2, &ctx->pp_next};
    if (n[G_ENDS] && (m->p == 0 || m->p == P - 1)) out[k++] = (membership){G_ENDS, q, m->p ? 1 : 0, 2, &ctx->pp_ends};
    return k;
}

/* This rank's communicators in its groups (ctx->tp_comm, dp_comm, pp_*), when there are groups. */
static dt_status groups_join(const group_worlds *g, const dt_launch_cfg *cfg, int rank, dt_launch_ctx *ctx) {
    const int tp = cfg->tp > 1 ? cfg->tp : 1, pp = cfg->pp > 1 ? cfg->pp : 1;
    const dt_mesh m = dt_mesh_of(cfg->world, tp, pp, rank);
    int n[G_KINDS];
    group_counts(cfg->world, tp, pp, n);
    dt_shm_world *const *const worlds[G_KINDS] = {g->tp, g->dp, g->pair, g->ends};
    membership in[5];
    const int k = memberships(&m, n, ctx, in);
    for (int j = 0; j < k; j++) DT_TRY(group_join(worlds[in[j].kind][in[j].i], in[j].idx, rank, cfg->timeout_s, in[j].comm));
    return DT_OK;
}

/* the collectives groups_join made */
static void groups_leave(dt_launch_ctx *ctx) {
    dt_comm *c[] = {ctx->pp_ends, ctx->pp_next, ctx->pp_prev, ctx->dp_comm, ctx->tp_comm};
    for (size_t i = 0; i < sizeof c / sizeof *c; i++) dt_comm_free(c[i]);
}

static void child_main(const dt_launch_cfg *cfg, int rank, int attempt, pid_t parent, dt_shm_world *world,
                       const group_worlds *groups, shared_block *shared, dt_launch_fn fn, void *arg) {
    rank_slot *slot = &shared->slots[rank];
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(1); /* the launcher died before we got here */
    char name[16];
    snprintf(name, sizeof name, "dtrain-r%d", rank);
    prctl(PR_SET_NAME, name);
    if (cfg->clean_stop) {
        /* the first SIGINT/SIGTERM (e.g. Ctrl-C to the process group) asks every worker to
         * stop cleanly; SA_RESETHAND: a second one kills */
        g_child_stop = &shared->stop;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_child_signal;
        sa.sa_flags = SA_RESETHAND | SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGINT, &sa, NULL);
        sigaction(SIGTERM, &sa, NULL);
    } else {
        signal(SIGINT, SIG_DFL);
        signal(SIGTERM, SIG_DFL);
    }

    char log[1200];
    log_path(cfg, rank, log, sizeof log);
    if (rank != 0) { /* only rank 0 speaks on the console */
        int fd = -1; /* a link, a hard link or a FIFO planted as its log is refused (exit 2), not written through */
        dt_status lst = log[0] ? dt_file_open_write(log, 1, &fd) : DT_OK;
        if (lst != DT_OK) {
            snprintf(slot->msg, sizeof slot->msg, "%s", dt_error_msg());
            atomic_store(&slot->has_msg, 1);
            _exit(dt_status_exit_code(lst));
        }
        if (fd < 0) fd = open("/dev/null", O_WRONLY);
        if (fd >= 0) {
            dup2(fd, STDOUT_FILENO);
            dup2(fd, STDERR_FILENO);
            close(fd);
        }
        int null = open("/dev/null", O_RDONLY);
        if (null >= 0) {
            dup2(null, STDIN_FILENO);
            close(null);
        }
    }
    char line[MSG_LEN + 64];
    snprintf(line, sizeof line, "rank %d of %d: pid %ld, %s%s", rank, cfg->world, (long)getpid(), cfg->what,
             attempt ? " (restarted)" : "");
    append_log(log, line);

    dt_launch_ctx ctx = {.attempt = attempt, .stop = &shared->stop, .note = shared->note,
                         .note_size = sizeof shared->note, .stats = shared->stats, .own_stats = &shared->stats[rank],
                         .foreign_mcores = &shared->foreign_mcores, .foreign_round = &shared->foreign_round,
                         .waiting = &shared->waiting[rank], .local_rank = rank, .plan = cfg->plan};
    dt_comm *comm = NULL;
    dt_status st = dt_comm_init_shm(&comm, world, rank, cfg->timeout_s);
    if (st == DT_OK) st = groups_join(groups, cfg, rank, &ctx);
    if (st == DT_OK) st = fn(arg, comm, &ctx);
    if (st != DT_OK) {
        snprintf(slot->msg, sizeof slot->msg, "%s", dt_error_msg());
        atomic_store(&slot->has_msg, 1);
        snprintf(line, sizeof line, "error: %s", dt_error_msg());
        append_log(log, line);
    }
    groups_leave(&ctx);
    dt_comm_free(comm);
    fflush(NULL);
    _exit(dt_status_exit_code(st));
}

/* ---- parent ---- */

typedef struct child {
    pid_t pid;
    int alive;
} child;

static void signal_all(child *kids, int n, int sig) {
    for (int r = 0; r < n; r++)
        if (kids[r].alive) kill(kids[r].pid, sig);
}

static void describe_exit(int status, char *buf, size_t n) {
    if (WIFSIGNALED(status)) {
        int sig = WTERMSIG(status);
        const char *abbrev = sigabbrev_np(sig);
        snprintf(buf, n, "was killed by signal %d (SIG%s)", sig, abbrev ? abbrev : "?");
    } else {
        snprintf(buf, n, "exited with status %d", WEXITSTATUS(status));
    }
}

/* A line on stderr and in log_dir/train.log. */
/* On a terminal a line of ours starts on a line of its own: the worker's progress bar may be on
 * the current one (it is drawn again below). */
static const char *fresh_line(void) { return isatty(STDERR_FILENO) ? "\r\033[K" : ""; }

static void supervisor_say(const dt_launch_cfg *cfg, const char *line) {
    fprintf(stderr, "%sdtrain: %s\n", fresh_line(), line);
    if (!cfg->log_dir) return;
    char path[1200];
    snprintf(path, sizeof path, "%s/train.log", cfg->log_dir);
    append_log(path, line);
}

/* NVML, for the GPU workers' GPUs: opened the first time a worker names its GPU, at most once
 * per process (a machine without the driver's library says so once and has CPU samples only). */
static dt_nvml *g_nvml;
static int g_nvml_tried;

/* The launcher's watch over its workers, one attempt long: CPU time at the last sample, and
 * the idle rounds of each measure. */
typedef struct watch {
    double interval, next_sample;
    uint32_t round_no;
    double cpu_prev[DT_MAX_WORLD], t_prev[DT_MAX_WORLD];
    int idle_rounds[DT_MAX_WORLD], idle_said[DT_MAX_WORLD];         /* CPU */
    int gpu_idle_rounds[DT_MAX_WORLD], gpu_idle_said[DT_MAX_WORLD]; /* GPU */
    char bus_id[DT_MAX_WORLD][32]; /* each worker's GPU, once it has named it */
    int gpu_said[DT_MAX_WORLD];        /* its GPU could not be sampled, and that was said */
    double machine_busy, machine_total; /* the CPUs' time at the last round (dt_device_cpu_time) */
    int machine_ok;
} watch;

/* How many cores processes other than the workers kept busy since the last round: the
 * machine's busy time less the workers' own (`workers_s`), over the round; published for the
 * workers, which use fewer threads while others need cores (training.adapt_cpu_threads). */
static void measure_foreign(shared_block *shared, watch *wt, double workers_s, int complete, uint32_t round_no) {
    double busy, total;
    if (dt_device_cpu_time(&busy, &total) != DT_OK) return;
    /* a round in which a worker exited or could not be read is not published: its CPU time
     * would count as someone else's */
    if (wt->machine_ok && complete && total > wt->machine_total) {
        const double wall = (total - wt->machine_total) / dt_device_cpu_cores(); /* seconds per core */
        double foreign = (busy - wt->machine_busy - workers_s) / wall;
        atomic_store(&shared->foreign_mcores, foreign > 0 ? (uint32_t)(1000.0 * foreign + 0.5) : 0u);
        atomic_store(&shared->foreign_round, round_no);
    }
    wt->machine_busy = busy;
    wt->machine_total = total;
    wt->machine_ok = 1;
}

/* w's GPU fields from NVML when the worker (rank r) has named its GPU; the peak carried over.
 * What NVML cannot do is said once (per process, or per rank for its GPU), and the message
 * the launcher's thread held before is kept: it may be a failure's cause still to report. */
static void sample_gpu(const dt_launch_cfg *cfg, const dt_worker_slot *slot, dt_worker_sample *w, int r,
                       watch *wt) {
    char *bus_id = wt->bus_id[r];
    if (!dt_worker_slot_gpu(slot, bus_id, 32)) return;
    char kept[MSG_LEN], line[MSG_LEN + 128];
    snprintf(kept, sizeof kept, "%s", dt_error_msg());
    if (!g_nvml && !g_nvml_tried) {
        g_nvml_tried = 1;
        if (dt_nvml_open(NULL, &g_nvml) != DT_OK) {
            snprintf(line, sizeof line, "note: no GPU samples (utilisation, memory, temperature, power): %s",
                     dt_error_msg());
            supervisor_say(cfg, line);
        }
    }
    dt_gpu_sample g;
    dt_status st = g_nvml ? dt_nvml_sample(g_nvml, bus_id, &g) : DT_ERR_DEVICE;
    if (st == DT_OK) {
        w->has_gpu = 1;
        w->gpu = g;
        if (g.mem_used_mb > w->gpu_peak_mem_mb) w->gpu_peak_mem_mb = g.mem_used_mb;
    } else if (g_nvml && !wt->gpu_said[r]) { /* the last sample stays */
        wt->gpu_said[r] = 1;
        snprintf(line, sizeof line, "note: no GPU samples for rank %d: %s", r, dt_error_msg());
        supervisor_say(cfg, line);
    }
    dt_error_set(DT_OK, "%s", kept);
}

/* A worker idle for two rounds in a row while the others work is called out once per measure. */
static void call_out_idle(const dt_launch_cfg *cfg, int idle, int *rounds, int *said, const char *msg,
                          double interval) {
    for (int r = 0; r < cfg->world; r++) rounds[r] = r == idle ? rounds[r] + 1 : 0;
    if (idle >= 0 && rounds[idle] >= 2 && !said[idle]) {
        said[idle] = 1;
        char line[700];
        snprintf(line, sizeof line, "warning: %s (for %.1f s now)", msg, 2 * interval);
        supervisor_say(cfg, line);
    }
}

/* Every `interval` seconds: each live worker's CPU share, memory and GPU into its shared slot,
 * and the idle check over the round. */
static void sample_workers(const dt_launch_cfg *cfg, shared_block *shared, const child *kids, watch *wt) {
    const int n = cfg->world;
    const uint32_t round_no = ++wt->round_no;
    dt_worker_sample round[DT_MAX_WORLD];
    double workers_s = 0; /* CPU time the workers used since the last round */
    int complete = 1;     /* every worker alive and read */
    for (int r = 0; r < n; r++) { /* in rank order: rank n-1 carrying round k means all have it */
        dt_worker_sample w = dt_worker_slot_read(&shared->stats[r]);
        double cpu_s, rss, peak;
        double t = dt_clock_now();
        if (kids[r].alive && dt_proc_read(kids[r].pid, &cpu_s, &rss, &peak) == DT_OK) {
            w.pid = (long)kids[r].pid;
            w.cpu_pct = t > wt->t_prev[r] ? 100.0 * (cpu_s - wt->cpu_prev[r]) / (t - wt->t_prev[r]) : 0.0;
            workers_s += cpu_s - wt->cpu_prev[r];
            wt->t_prev[r] = t;
            wt->cpu_prev[r] = cpu_s;
            w.rss_mb = rss;
            w.peak_rss_mb = peak > w.peak_rss_mb ? peak : w.peak_rss_mb;
            w.samples = round_no;
            sample_gpu(cfg, &shared->stats[r], &w, r, wt);
            dt_worker_slot_publish(&shared->stats[r], &w);
        } else {
            complete = 0;
        }
        round[r] = w;
    }
    measure_foreign(shared, wt, workers_s, complete, round_no);
    char msg[600];
    int idle = dt_monitor_idle_rank(round, n, wt->interval, msg, sizeof msg);
    /* a worker waiting for rank 0's disk (checkpoint) is not idle */
    if (idle >= 0 && shared->waiting[idle]) idle = -1;
    call_out_idle(cfg, idle, wt->idle_rounds, wt->idle_said, msg, wt->interval);
    idle = dt_monitor_idle_gpu(round, (const char(*)[32])wt->bus_id, n, wt->interval, msg, sizeof msg);
    if (idle >= 0 && shared->waiting[idle]) idle = -1;
    call_out_idle(cfg, idle, wt->gpu_idle_rounds, wt->gpu_idle_said, msg, wt->interval);
}

/* One start of all workers, supervised until every one has exited: its state, and a handler
 * for each thing that can happen (a signal to the launcher, a worker's exit, a deadline). */
typedef struct attempt {
    const dt_launch_cfg *cfg;
    shared_block *shared;
    dt_shm_world *world;
    group_worlds groups;     /* the model-parallel groups' */
    child kids[DT_MAX_WORLD];
    int alive;               /* workers not reaped yet */
    dt_status st;            /* how the attempt ends */
    int final;               /* do not restart: bad config/data (exit 2) or the user stopped the run */
    char msg[MSG_LEN + 256]; /* its cause, for the user */
    int failed_rank;         /* the first worker that failed, -1 */
    int seen_signals;        /* SIGINT/SIGTERM to the launcher handled so far */
    int unclean;             /* a worker did not exit cleanly after a signal */
    double stop_deadline;    /* > 0: stopping after a failure; SIGKILL after it */
    double preempt_deadline; /* > 0: a clean stop was requested; SIGKILL after it */
    watch watch;             /* monitoring */
} attempt;

/* Stops every worker: the collective fails at once with `why`, then `sig` (and SIGCONT, for
 * stopped ones); SIGKILL after `grace` seconds. */
static void stop_all(attempt *a, const char *why, int sig, double grace) {
    dt_shm_world_abort(a->world, why);
    groups_abort(&a->groups, why);
    signal_all(a->kids, a->cfg->world, sig);
    signal_all(a->kids, a->cfg->world, SIGCONT);
    a->stop_deadline = dt_clock_now() + grace;
}

/* Forks every worker; a fork that fails stops the ones already started. */
static void fork_all(attempt *a, int attempt_no, dt_launch_fn fn, void *arg) {
    fflush(NULL); /* nothing buffered may be written twice */
    const pid_t parent = getpid();
    for (int r = 0; r < a->cfg->world; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            a->st = dt_error_set(DT_ERR_INTERNAL, "cannot start worker %d: fork: %s", r, strerror(errno));
            snprintf(a->msg, sizeof a->msg, "%s", dt_error_msg());
            a->failed_rank = r;
            stop_all(a, "the launcher could not start every worker", SIGTERM, GRACE_S);
            return;
        }
        if (pid == 0) child_main(a->cfg, r, attempt_no, parent, a->world, &a->groups, a->shared, fn, arg);
        a->kids[r].pid = pid;
        a->kids[r].alive = 1;
        a->watch.t_prev[r] = dt_clock_now();
        a->alive++;
    }
}

/* New SIGINT/SIGTERM to the launcher: the first asks for a clean stop (preemption: every
 * worker finishes its step, checkpoints and exits 0); a second, or one during a failure
 * without clean stops, stops every worker at once. */
static void on_signals(attempt *a) {
    const dt_launch_cfg *cfg = a->cfg;
    a->seen_signals = g_signals;
    a->final = 1;
    if (a->seen_signals == 1 && a->failed_rank < 0 && cfg->clean_stop) {
        a->shared->stop = g_signal;
        a->preempt_deadline = dt_clock_now() + cfg->timeout_s + 30.0;
        fprintf(stderr, "%sdtrain: SIG%s: stopping after the current step with a checkpoint (send it again to stop at once)\n",
                fresh_line(),
                sigabbrev_np(g_signal));
    } else if (a->failed_rank < 0 || a->seen_signals > 1) {
        snprintf(a->msg, sizeof a->msg, "interrupted by SIG%s%s: stopped %d worker(s) at once", sigabbrev_np(g_signal),
                 a->seen_signals > 1 ? " twice" : "", cfg->world);
        a->st = DT_ERR_INTERRUPTED;
        a->unclean = 1;
        a->preempt_deadline = 0;
        stop_all(a, "the launcher was interrupted", cfg->clean_stop ? SIGKILL : g_signal, cfg->clean_stop ? 3600 : GRACE_S);
    }
}

/* A SIGKILL the launcher did not send: most often the kernel's out-of-memory killer. The hint,
 * with the worker's memory at the last sample, or "". */
static const char *oom_hint(const attempt *a, int r, int status) {
    static char hint[320];
    hint[0] = '\0';
    if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL || a->stop_deadline > 0 || a->preempt_deadline > 0)
        return hint;
    dt_worker_sample w = dt_worker_slot_read(&a->shared->stats[r]);
    char mem[96] = "";
    if (w.samples > 0) snprintf(mem, sizeof mem, " (it had %.0f MB resident at the last sample, %.0f MB at most)", w.rss_mb,
                                w.peak_rss_mb);
    snprintf(hint, sizeof hint, "; a SIGKILL from outside dtrain is often the kernel's out-of-memory killer%s: "
             "`dmesg | grep -i oom` tells; `--dry-run` shows the memory a worker needs", mem);
    return hint;
}

/* Worker r exited with `status`. Its failure (also one while stopping cleanly) stops everyone
 * and becomes the attempt's cause: its own message when it left one, else how it died. */
/* The rank a collective timeout's message says it waited for (comm_shm: "for rank(s) 3, 5",
 * comm_tcp: "for rank 3"): the first one; -1 when the message is not such a timeout. */
static int blamed_rank(const char *msg) {
    if (!strstr(msg, "collective timeout")) return -1;
    const char *p = strstr(msg, "for rank(s) "), *q = strstr(msg, "for rank ");
    const char *at = p ? p + 12 : q ? q + 9 : NULL;
    return at && *at >= '0' && *at <= '9' ? atoi(at) : -1;
}

/* Which rank times out first when one stops depends on timing (with model parallelism it may be
 * one waiting for a rank that waits for the stopped one); a stopped process (SIGSTOP, Ctrl-Z, a
 * debugger) is certainly a cause: appended to `see` by rank and pid. */
static void stopped_worker(const attempt *a, char *see, size_t cap) {
    for (int r = 0; r < a->cfg->world; r++) {
        const char st = a->kids[r].alive ? dt_proc_state(a->kids[r].pid) : 0;
        if (st != 'T' && st != 't') continue;
        const size_t len = strlen(see);
        snprintf(see + len, cap - len, "; worker rank %d (pid %ld) is stopped (process state %c: SIGSTOP, Ctrl-Z or a "
                 "debugger)", r, (long)a->kids[r].pid, st);
        return;
    }
}

static void on_exit_status(attempt *a, int r, int status) {
    const dt_launch_cfg *cfg = a->cfg;
    a->kids[r].alive = 0;
    a->alive--;
    const int ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok && a->seen_signals) a->unclean = 1;
    if (ok || a->failed_rank >= 0 || (a->seen_signals && a->preempt_deadline <= 0)) return;
    a->failed_rank = r;
    char how[128], log[1200], see[1500] = "";
    describe_exit(status, how, sizeof how);
    const rank_slot *slot = &a->shared->slots[r];
    const int exited = r;
    /* A collective timeout names the rank it waited for; when that rank failed too (it waited in
     * another group's collective: model parallelism), its message is nearer the cause: follow the
     * chain to a rank that did not fail by itself (stopped, hung). Each rank gets a second to say. */
    const int said = atomic_load(&slot->has_msg) && WIFEXITED(status);
    for (int hops = 0; said && WEXITSTATUS(status) != 2 && hops < cfg->world; hops++) {
        const int b = blamed_rank(slot->msg);
        if (b < 0 || b >= cfg->world || b == r) break;
        for (int k = 0; k < 100 && !atomic_load(&a->shared->slots[b].has_msg); k++) {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
        if (!atomic_load(&a->shared->slots[b].has_msg)) break; /* b is the cause */
        slot = &a->shared->slots[b];
        a->failed_rank = r = b;
    }
    log_path(cfg, r, log, sizeof log);
    if (log[0]) snprintf(see, sizeof see, " (log: %s)", log);
    if (said && blamed_rank(slot->msg) >= 0) stopped_worker(a, see, sizeof see);
    if (said) {
        if (cfg->world > 1) snprintf(a->msg, sizeof a->msg, "rank %d: %s%s", r, slot->msg, see);
        else snprintf(a->msg, sizeof a->msg, "%s", slot->msg);
        a->st = WEXITSTATUS(status) == 2 ? DT_ERR_CONFIG : DT_ERR_INTERNAL;
        if (WEXITSTATUS(status) == 2) a->final = 1;
    } else {
        snprintf(a->msg, sizeof a->msg, "worker rank %d %s during %s%s%s", r, how, cfg->what, see,
                 oom_hint(a, r, status));
        a->st = DT_ERR_INTERNAL;
    }
    if (a->preempt_deadline > 0) { /* no restart when asked to stop */
        a->final = 1;
        a->preempt_deadline = 0;
    }
    char why[160];
    snprintf(why, sizeof why, "rank %d %s", exited, how);
    stop_all(a, why, SIGTERM, GRACE_S);
}

/* Between exits: the monitoring round when due, and the deadlines of a clean stop (the
 * workers get timeout_s + 30 s) and of a stop after a failure (then SIGKILL). */
static void on_tick(attempt *a) {
    const dt_launch_cfg *cfg = a->cfg;
    if (dt_clock_now() >= a->watch.next_sample) {
        sample_workers(cfg, a->shared, a->kids, &a->watch);
        a->watch.next_sample = dt_clock_now() + a->watch.interval;
    }
    if (a->preempt_deadline > 0 && dt_clock_now() > a->preempt_deadline) {
        snprintf(a->msg, sizeof a->msg, "workers did not stop within %.0f s of SIG%s: killed them", cfg->timeout_s + 30.0,
                 sigabbrev_np(g_signal));
        a->st = DT_ERR_INTERRUPTED;
        a->unclean = 1;
        a->preempt_deadline = 0;
        stop_all(a, "the workers did not stop in time", SIGKILL, 3600);
    }
    if (a->stop_deadline > 0 && dt_clock_now() > a->stop_deadline) {
        signal_all(a->kids, cfg->world, SIGKILL);
        a->stop_deadline = dt_clock_now() + 3600; /* SIGKILL cannot be ignored: just reap */
    }
}

/* One attempt, from the fork of every worker to the last one reaped. */
static dt_status run_attempt(attempt *a, int attempt_no, dt_launch_fn fn, void *arg) {
    const int n = a->cfg->world;
    shared_block *shared = a->shared;
    DT_TRY(dt_shm_world_create(&a->world, n, 0));
    dt_status gst = groups_create(&a->groups, a->cfg);
    if (gst != DT_OK) {
        groups_destroy(&a->groups);
        dt_shm_world_destroy(a->world);
        a->world = NULL;
        return gst;
    }
    shared->stop = 0;
    shared->note[0] = '\0';
    memset(shared->stats, 0, sizeof shared->stats);
    memset((void *)shared->waiting, 0, sizeof shared->waiting);
    for (int r = 0; r < n; r++) {
        atomic_store(&shared->slots[r].has_msg, 0);
        shared->slots[r].msg[0] = '\0';
    }
    /* a new process has used no CPU: the first sample measures from its fork */
    a->watch.interval = a->cfg->monitor_every_s > 0 ? a->cfg->monitor_every_s : 2.0;
    a->watch.next_sample = dt_clock_now() + a->watch.interval;
    atomic_store(&shared->foreign_round, 0);
    measure_foreign(shared, &a->watch, 0, 0, 0); /* the machine's time at the fork: round 1 measures from it */
    fork_all(a, attempt_no, fn, arg);
    while (a->alive > 0) {
        if (g_signals > a->seen_signals) on_signals(a); /* first: an exit they caused is no failure */
        int status, r = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid > 0) {
            while (r < n && a->kids[r].pid != pid) r++;
            if (r < n) on_exit_status(a, r, status);
            continue;
        }
        if (pid < 0 && errno != EINTR) {
            a->st = dt_error_set(DT_ERR_INTERNAL, "waitpid: %s", strerror(errno));
            snprintf(a->msg, sizeof a->msg, "%s", dt_error_msg());
            break;
        }
        on_tick(a);
        struct timespec ts = {0, POLL_NS};
        nanosleep(&ts, NULL);
    }
    for (int r = 0; r < n; r++) /* reap anything left (only after a waitpid error) */
        if (a->kids[r].alive) {
            kill(a->kids[r].pid, SIGKILL);
            waitpid(a->kids[r].pid, NULL, 0);
        }
    groups_destroy(&a->groups);
    dt_shm_world_destroy(a->world);
    a->world = NULL;
    if (a->seen_signals && a->st == DT_OK && a->unclean) {
        snprintf(a->msg, sizeof a->msg, "interrupted by SIG%s: a worker did not stop cleanly (see the rank logs)",
                 sigabbrev_np(g_signal));
        a->st = DT_ERR_INTERRUPTED;
    }
    return a->st;
}

/* After failed attempt k: says why and waits backoff_s * 2^k (at most DT_LAUNCH_BACKOFF_MAX_S)
 * before the restart. Returns 0 when a signal came meanwhile (then nothing restarts). */
static int pause_before_restart(const dt_launch_cfg *cfg, int k, const char *cause) {
    double delay = cfg->backoff_s;
    for (int i = 0; i < k && delay < DT_LAUNCH_BACKOFF_MAX_S; i++) delay *= 2;
    if (delay > DT_LAUNCH_BACKOFF_MAX_S) delay = DT_LAUNCH_BACKOFF_MAX_S;
    char line[MSG_LEN + 512];
    snprintf(line, sizeof line, "%s failed (attempt %d): %s", cfg->what, k + 1, cause);
    supervisor_say(cfg, line);
    snprintf(line, sizeof line, "restart %d of %d in %.1f s: all %d worker(s) resume from the last checkpoint", k + 1,
             cfg->max_restarts, delay, cfg->world);
    supervisor_say(cfg, line);
    const double until = dt_clock_now() + delay;
    while (dt_clock_now() < until && !g_signals) {
        struct timespec ts = {0, POLL_NS};
        nanosleep(&ts, NULL);
    }
    return !g_signals;
}

/* The last attempt's cause after restarts: printed like the earlier ones, and the message says
 * why it was the last. */
static void conclude_restarts(const dt_launch_cfg *cfg, const dt_launch_result *res, attempt *a) {
    char line[MSG_LEN + 512], last[MSG_LEN + 256];
    snprintf(line, sizeof line, "%s failed (attempt %d): %s", cfg->what, res->restarts + 1, a->msg);
    supervisor_say(cfg, line);
    snprintf(last, sizeof last, "%s", a->msg);
    if (a->final)
        snprintf(a->msg, sizeof a->msg, "%s (after %d restart%s; not retried: a config or data error)", last,
                 res->restarts, res->restarts > 1 ? "s" : "");
    else
        snprintf(a->msg, sizeof a->msg,
                 "%s failed %d times, giving up (fault_tolerance.max_restarts: %d; each cause is above); the last: %s",
                 cfg->what, res->restarts + 1, cfg->max_restarts, last);
}

/* Attempts until one succeeds, is final (a config error, a stop) or the restarts run out. */
static dt_status supervise(const dt_launch_cfg *cfg, shared_block *shared, dt_launch_fn fn, void *arg,
                           dt_launch_result *res, attempt *a) {
    dt_status st;
    for (int k = 0;; k++) {
        *a = (attempt){.cfg = cfg, .shared = shared, .failed_rank = -1};
        st = run_attempt(a, k, fn, arg);
        if (st == DT_OK || a->final || st == DT_ERR_INTERRUPTED || k >= cfg->max_restarts) break;
        res->restarts++;
        if (!pause_before_restart(cfg, k, a->msg[0] ? a->msg : dt_error_msg())) {
            /* a signal while waiting: nothing runs, the last checkpoint is where a rerun continues */
            res->stopped_by = g_signal;
            snprintf(res->note, sizeof res->note,
                     "stopped while waiting to restart after a failure (a rerun continues from the last checkpoint)");
            if (cfg->clean_stop) return DT_OK;
            snprintf(a->msg, sizeof a->msg, "interrupted by SIG%s while waiting to restart", sigabbrev_np(g_signal));
            return DT_ERR_INTERRUPTED;
        }
    }
    if (st == DT_OK && (g_signals || shared->stop)) { /* signalled: the launcher, or workers only */
        res->stopped_by = g_signals ? g_signal : shared->stop;
        snprintf(res->note, sizeof res->note, "%s", shared->note);
    } else if (st != DT_OK && res->restarts > 0 && st != DT_ERR_INTERRUPTED) {
        conclude_restarts(cfg, res, a);
    }
    return st;
}

dt_status dt_launch_run(const dt_launch_cfg *cfg, dt_launch_fn fn, void *arg, dt_launch_result *res) {
    if (cfg->world < 1 || cfg->world > DT_MAX_WORLD)
        return dt_error_set(DT_ERR_CONFIG, "training.num_workers: expected 1..%d on one machine, got %d", DT_MAX_WORLD,
                            cfg->world);
    if (!cfg->plan || cfg->plan->host != DT_HOSTCOMM_SHM)
        return dt_error_set(DT_ERR_INTERNAL, "launch: forked workers meet over shared memory, the plan says %s",
                            cfg->plan ? dt_hostcomm_name(cfg->plan->host) : "nothing");
    dt_launch_result local;
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    const size_t shared_bytes = sizeof(shared_block) + sizeof(rank_slot) * (size_t)cfg->world;
    shared_block *shared = mmap(NULL, shared_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (shared == MAP_FAILED) return dt_error_set(DT_ERR_NOMEM, "cannot map the worker status block: %s", strerror(errno));
    memset(shared, 0, shared_bytes);
    attempt *a = dt_calloc(1, sizeof *a, "launch state");
    if (!a) {
        munmap(shared, shared_bytes);
        return DT_ERR_NOMEM;
    }
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    g_signal = 0;
    g_signals = 0;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    dt_status st = supervise(cfg, shared, fn, arg, res, a);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    munmap(shared, shared_bytes);
    if (st != DT_OK && a->msg[0]) dt_error_set(st, "%s", a->msg);
    free(a);
    return st;
}

/* ---- workers started by someone else (torchrun, mpirun, srun, a Kubernetes Indexed Job) ---- */

static volatile sig_atomic_t g_ext_stop; /* the signal that asked this worker to stop */

/* SA_RESETHAND: the first SIGINT/SIGTERM stops cleanly after the step, a second one kills */
static void on_ext_signal(int sig) { g_ext_stop = sig; }

#ifdef DTRAIN_HAVE_MPI
static const int have_mpi = 1;
#else
static const int have_mpi = 0;
#endif

void dt_launch_plan_in(dt_comm_kind requested, const char *source, const dt_ext_env *env, int world,
                       const char *device, const char *device_comm, dt_comm_plan_in *out) {
    *out = (dt_comm_plan_in){.requested = requested, .source = source, .world = env ? env->world : world,
                             .local_world = env ? env->local_world : world, .hosts = env ? 0 : 1,
                             .launcher = env ? env->launcher : DT_LAUNCHER_FORK, .device = device,
                             .device_comm = device_comm, .have_mpi = have_mpi};
}

/* How often the outer launcher has restarted this job (torchrun, Slurm requeue): after a
 * restart, resume from this run's own checkpoints first, as after our own restarts. */
static int launcher_restart_count(void) {
    const char *names[] = {"TORCHELASTIC_RESTART_COUNT", "SLURM_RESTART_COUNT"};
    for (int i = 0; i < 2; i++) {
        const char *v = getenv(names[i]);
        if (v && atoi(v) > 0) return atoi(v);
    }
    return 0;
}

/* The mpi collective: MPI_Init, the same checks as the TCP rendezvous (who is who, one
 * config), then rank 0's before_ok; *comm is ready. res->mpi_agreed = 1 when every rank saw
 * the failure (then MPI can be finalised cleanly instead of aborting the job). */
static dt_status join_mpi(const dt_launch_ext_cfg *cfg, dt_comm **comm, dt_launch_result *res) {
#ifdef DTRAIN_HAVE_MPI
    const dt_ext_env *e = cfg->env;
    int rank, world;
    res->mpi = 1;
    DT_TRY(dt_mpi_init(&rank, &world, cfg->tp * cfg->pp > 1)); /* model-parallel groups: a thread each */
    if (rank != e->rank || world != e->world)
        return dt_error_set(DT_ERR_USAGE, "mpi: MPI says rank %d of %d, but %s says rank %d of %d", rank, world, e->source,
                            e->rank, e->world);
    DT_TRY(dt_comm_init_mpi(comm, cfg->timeout_s));
    uint32_t all[DT_MAX_WORLD];
    DT_TRY(dt_comm_allgather(*comm, &cfg->digest, sizeof cfg->digest, all));
    for (int i = 1; i < world; i++)
        if (all[i] != all[0])
            return res->mpi_agreed = 1,
                   dt_error_set(DT_ERR_USAGE,
                                "mpi: rank %d runs another config than rank 0 (config digest %08x, rank 0 has %08x): every "
                                "rank must run the same config",
                                i, all[i], all[0]);
    int ok = 1;
    if (rank == 0 && cfg->before_ok && cfg->before_ok(cfg->user) != DT_OK) ok = 0;
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", ok ? "" : dt_error_msg());
    DT_TRY(dt_comm_broadcast(*comm, &ok, sizeof ok, 0));
    if (!ok) {
        res->mpi_agreed = 1; /* every rank knows: MPI can finish cleanly */
        return dt_error_set(DT_ERR_IO, "%s", rank == 0 ? msg : "rank 0 could not prepare the run directory");
    }
    return DT_OK;
#else
    (void)cfg, (void)comm, (void)res; /* dt_comm_plan_decide refuses mpi in such a build */
    return dt_error_set(DT_ERR_INTERNAL, "launch: the mpi collective is not built");
#endif
}

/* Meets the other ranks as the plan says: mpi, or the TCP rendezvous (which completes the
 * plan), with the job's shared memory when every rank is on this host; a hierarchical plan
 * adds the host's shared memory and (on leaders) the leaders' ring, made into *grad (the
 * gradients' and weights' collective; NULL: *comm carries them). */
static dt_status meet(const dt_launch_ext_cfg *cfg, dt_comm_plan *plan, dt_shm_world **world, dt_comm **comm,
                      dt_comm **grad, dt_launch_result *res) {
    const dt_ext_env *e = cfg->env;
    *grad = NULL;
    if (plan->host == DT_HOSTCOMM_MPI) return join_mpi(cfg, comm, res);
    dt_comm *leaders = NULL;
    DT_TRY(dt_rendezvous(e, cfg->digest, cfg->timeout_s, &cfg->plan, plan, e->rank == 0 ? cfg->before_ok : NULL,
                         cfg->user, world, comm, &leaders));
    dt_status st = DT_OK;
    if (*world && plan->hier) {
        dt_comm *local = NULL;
        st = dt_comm_init_shm(&local, *world, e->rank % plan->hier, cfg->timeout_s);
        if (st == DT_OK) st = dt_comm_init_hier(grad, local, leaders, e->rank, e->world, cfg->timeout_s);
        else dt_comm_free(leaders);
    } else if (*world) {
        st = dt_comm_init_shm(comm, *world, e->rank, cfg->timeout_s);
    }
    if (st != DT_OK && e->world > 1) dt_error_prefix("rank %d", e->rank);
    return st;
}

/* Under a launcher's mpi or tcp collective the groups are made one kind after another, the pairs
 * of stages in two rounds (a rank is in at most one pair whose first stage is even and one whose
 * first stage is odd): how many rounds a kind takes, and this rank's group in a round (NULL: none). */
static int group_rounds(int kind) { return kind == G_PAIR ? 2 : 1; }
static const membership *round_member(const membership *in, int k, int kind, int round, int pp) {
    for (int j = 0; j < k; j++)
        if (in[j].kind == kind && (kind != G_PAIR || (in[j].i % (pp - 1)) % 2 == round)) return &in[j];
    return NULL;
}

/* The mpi collective: each group a communicator split from MPI_COMM_WORLD (comm_mpi.h), on any
 * hosts. Every rank makes the splits in the same order, one a kind of group (the pairs of stages
 * in two rounds, a rank being in at most one pair whose first stage is even and one whose first
 * stage is odd), ranked as the shared-memory groups are. */
static dt_status groups_mpi(const dt_launch_ext_cfg *cfg, const dt_mesh *m, const int n[G_KINDS], dt_launch_ctx *ctx) {
#ifdef DTRAIN_HAVE_MPI
    membership in[5];
    const int k = memberships(m, n, ctx, in);
    for (int kind = 0; kind < G_KINDS; kind++)
        for (int round = 0; n[kind] && round < group_rounds(kind); round++) {
            const membership *g = round_member(in, k, kind, round, m->pp);
            dt_comm *c = NULL;
            DT_TRY(dt_comm_init_mpi_split(&c, g ? g->i : -1, g ? g->idx : 0, cfg->timeout_s));
            if (g) *g->comm = c;
        }
    return DT_OK;
#else
    (void)cfg, (void)m, (void)n, (void)ctx; /* dt_comm_plan_decide refuses mpi in such a build */
    return dt_error_set(DT_ERR_INTERNAL, "launch: the mpi collective is not built");
#endif
}

#define GROUP_ADDR 64
/* One exchange of groups_tcp: every rank's `mine` ("!" where st failed) into all; a failure of
 * any rank fails every rank. */
static dt_status share_addresses(dt_comm *comm, dt_status st, char *mine, char (*all)[GROUP_ADDR], int world) {
    if (st != DT_OK) snprintf(mine, GROUP_ADDR, "!");
    dt_status a = dt_comm_allgather(comm, mine, GROUP_ADDR, all);
    if (st != DT_OK || a != DT_OK) return st != DT_OK ? st : a;
    for (int r = 0; r < world; r++)
        if (all[r][0] == '!')
            return dt_error_set(DT_ERR_DEVICE, "rank %d could not make its model-parallel groups' TCP connections (its "
                                "log says why)", r);
    return DT_OK;
}

/* The tcp collective (ranks on several hosts without MPI): each group a ring of TCP connections
 * made as the job's ring was (rendezvous.h dt_rdzv_group_ring: proved with the rendezvous'
 * secret), round by round (group_rounds), each round with listeners of its own, so that no
 * connection of one round meets a listener of another: every rank says where its listener is
 * (an all-gather over the job's collective, share_addresses; "" when it is in no group of the
 * round, "!" once it has failed, so that every rank stops at the next exchange instead of at a
 * deadline), connects to its successor in its group and takes its predecessor. */
static dt_status groups_tcp(const dt_launch_ext_cfg *cfg, const dt_mesh *m, const int n[G_KINDS], dt_comm *comm,
                            dt_launch_ctx *ctx) {
    const dt_ext_env *e = cfg->env;
    static const char *const names[G_KINDS] = {"tensor-parallel group", "data-parallel group", "pair of stages",
                                               "pipeline's first and last stages"};
    static char all[DT_MAX_WORLD][GROUP_ADDR];
    membership in[5];
    const int k = memberships(m, n, ctx, in);
    dt_status st = DT_OK;
    for (int kind = 0; kind < G_KINDS; kind++)
        for (int round = 0; n[kind] && round < group_rounds(kind); round++) {
            const membership *g = round_member(in, k, kind, round, m->pp);
            char mine[GROUP_ADDR] = "";
            int fd = -1;
            if (st == DT_OK && g) st = dt_rdzv_group_listen(e, &fd, mine, sizeof mine);
            st = share_addresses(comm, st, mine, all, e->world);
            int next = -1; /* the rank of our successor in the group */
            for (int r = 0; st == DT_OK && g && r < e->world && next < 0; r++) {
                dt_launch_ctx scratch = {0};
                membership theirs[5];
                const dt_mesh rm = dt_mesh_of(e->world, m->tp, m->pp, r);
                const int kr = memberships(&rm, n, &scratch, theirs);
                for (int j = 0; j < kr; j++)
                    if (theirs[j].kind == kind && theirs[j].i == g->i && theirs[j].idx == (g->idx + 1) % g->size) next = r;
            }
            if (st == DT_OK && g && (next < 0 || !all[next][0]))
                st = dt_error_set(DT_ERR_INTERNAL, "rank %d: no address of its successor in its %s", e->rank, names[kind]);
            char what[64];
            snprintf(what, sizeof what, "%s %d", names[kind], g ? g->i : 0);
            if (st == DT_OK && g) st = dt_rdzv_group_ring(e, g->idx, g->size, all[next], fd, what, cfg->timeout_s, g->comm);
            if (fd >= 0) close(fd);
        }
    char done[GROUP_ADDR] = ""; /* a ring that failed in the last round fails every rank too */
    return share_addresses(comm, st, done, all, e->world);
}

/* One host's ranks started by someone else: the model-parallel groups' shared memory (fork mode
 * makes it before it forks: groups_create). Rank 0 makes every group's segment under a random
 * name and broadcasts the names; each rank maps its groups' (memberships: at most 5), and once
 * every rank has said how that went (an all-gather) rank 0 removes the names: nothing stays in
 * /dev/shm. g holds this rank's worlds; ctx gets their collectives. Under the mpi collective the
 * groups are MPI's instead (groups_mpi). */
#define GROUP_NAME 64
#define MAX_GROUPS (4 * DT_MAX_WORLD) /* group_counts' sum is at most world / 2 + world + world + world / 2 */
static dt_status groups_external(const dt_launch_ext_cfg *cfg, const dt_comm_plan *plan, dt_comm *comm, group_worlds *g,
                                 dt_launch_ctx *ctx) {
    const dt_ext_env *e = cfg->env;
    memset(g, 0, sizeof *g);
    const int tp = cfg->tp > 1 ? cfg->tp : 1, pp = cfg->pp > 1 ? cfg->pp : 1;
    if (tp * pp == 1) return DT_OK;
    const char *key = tp > 1 ? "training.tensor_parallel" : "training.pipeline_parallel";
    if (e->world % (tp * pp))
        return dt_error_set(DT_ERR_CONFIG, "%s: expected pipeline_parallel x tensor_parallel (%d) to divide the %d "
                            "ranks %s started", key, tp * pp, e->world, e->source);
    int n[G_KINDS], first[G_KINDS + 1] = {0}; /* each kind's groups, and where their names start */
    group_counts(e->world, tp, pp, n);
    const dt_mesh m = dt_mesh_of(e->world, tp, pp, e->rank);
    if (plan->host == DT_HOSTCOMM_MPI) return groups_mpi(cfg, &m, n, ctx);
    if (plan->host == DT_HOSTCOMM_TCP) return groups_tcp(cfg, &m, n, comm, ctx);
    for (int k = 0; k < G_KINDS; k++) first[k + 1] = first[k] + n[k];
    const int total = first[G_KINDS], size[G_KINDS] = {tp, e->world / (tp * pp), 2, 2};
    static char names[MAX_GROUPS][GROUP_NAME];      /* every group's, kind after kind */
    static char made_names[MAX_GROUPS][GROUP_NAME]; /* rank 0: what it made, to remove */
    memset(names, 0, sizeof names);
    memset(made_names, 0, sizeof made_names);
    membership in[5];
    const int n_in = memberships(&m, n, ctx, in);
    static dt_shm_world *made[MAX_GROUPS];
    memset(made, 0, sizeof made);
    dt_status st = DT_OK;
    if (e->rank == 0) {
        uint64_t nonce = 0;
        if (getrandom(&nonce, sizeof nonce, 0) != sizeof nonce) nonce ^= (uint64_t)getpid() << 20 ^ (uint64_t)time(NULL);
        for (int i = 0, kind = 0; st == DT_OK && i < total; i++) {
            while (i >= first[kind + 1]) kind++;
            snprintf(names[i], GROUP_NAME, "/dtrain-%ld-%016llx-g%d", (long)getpid(), (unsigned long long)nonce, i);
            int fd = shm_open(names[i], O_CREAT | O_EXCL | O_RDWR, 0600);
            if (fd >= 0) memcpy(made_names[i], names[i], GROUP_NAME);
            if (fd < 0) {
                st = dt_error_set(DT_ERR_DEVICE, "rank 0: cannot make the shared memory %s of a model-parallel group: %s",
                                  names[i], strerror(errno));
                break;
            }
            if (fchmod(fd, 0600) == 0) st = dt_shm_world_create_fd(&made[i], size[kind], 0, fd);
            else st = dt_error_set(DT_ERR_DEVICE, "rank 0: chmod of %s: %s", names[i], strerror(errno));
            close(fd);
        }
        if (st != DT_OK) memset(names, 0, sizeof names); /* the others see no names and fail with rank 0 */
    }
    dt_status b = dt_comm_broadcast(comm, names, (size_t)total * GROUP_NAME, 0);
    if (st == DT_OK) st = b;
    dt_shm_world **const slots[G_KINDS] = {g->tp, g->dp, g->pair, g->ends};
    int *const counts[G_KINDS] = {&g->n_tp, &g->n_dp, &g->n_pair, &g->n_ends};
    for (int j = 0; j < n_in && st == DT_OK; j++) {
        const int i = first[in[j].kind] + in[j].i;
        dt_shm_world **w = &slots[in[j].kind][(*counts[in[j].kind])++];
        if (!names[i][0]) {
            st = dt_error_set(DT_ERR_DEVICE, "rank %d: rank 0 could not make the model-parallel groups' shared memory",
                              e->rank);
        } else if (made[i]) {
            *w = made[i];
            made[i] = NULL;
        } else {
            int fd = shm_open(names[i], O_RDWR, 0);
            st = fd < 0 ? dt_error_set(DT_ERR_DEVICE, "rank %d: cannot open %s: %s", e->rank, names[i], strerror(errno))
                        : dt_shm_world_attach_fd(w, in[j].size, fd, names[i]);
            if (fd >= 0) close(fd);
        }
        if (st == DT_OK) {
            (void)dt_shm_world_join(*w, in[j].idx, e->rank); /* no supervisor of ours: the peers watch this pid */
            st = dt_comm_init_shm(in[j].comm, *w, in[j].idx, cfg->timeout_s);
        }
        if (!*w) (*counts[in[j].kind])--; /* not mapped: nothing to destroy */
    }
    for (int i = 0; i < total; i++) dt_shm_world_destroy(made[i]); /* rank 0's of groups it is not in */
    int ok = st == DT_OK, all[DT_MAX_WORLD];
    dt_status a = dt_comm_allgather(comm, &ok, sizeof ok, all);
    for (int i = 0; i < total; i++)
        if (made_names[i][0]) shm_unlink(made_names[i]); /* every rank has mapped its groups' (or failed) */
    if (st != DT_OK) return st;
    if (a != DT_OK) return a;
    for (int i = 0; i < e->world; i++)
        if (!all[i])
            return dt_error_set(DT_ERR_DEVICE, "rank %d could not join its model-parallel groups' shared memory (its "
                                "log says why)", i);
    return DT_OK;
}

/* fn as this rank, with SIGINT/SIGTERM asking it to stop cleanly */
static dt_status run_rank(const dt_launch_ext_cfg *cfg, const dt_launch_ctx *ctx, dt_shm_world *world, dt_comm *comm,
                          dt_launch_fn fn, void *arg) {
    struct sigaction sa, old_int, old_term;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_ext_signal;
    sa.sa_flags = SA_RESETHAND | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    dt_status st = fn(arg, comm, ctx);
    if (st != DT_OK && world) dt_shm_world_abort(world, dt_error_msg()); /* the others fail now, not at the deadline */
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    /* the launcher (torchrun, srun, the Job) decides about restarts; a rerun resumes */
    if (st != DT_OK && cfg->env->world > 1) dt_error_prefix("rank %d", cfg->env->rank);
    return st;
}

dt_status dt_launch_external(const dt_launch_ext_cfg *cfg, dt_launch_fn fn, void *arg, dt_launch_result *res) {
    const dt_ext_env *e = cfg->env;
    memset(res, 0, sizeof *res);
    dt_comm_plan plan;
    DT_TRY(dt_comm_plan_decide(&cfg->plan, &plan)); /* mpi now; shm or tcp once the rendezvous sees the hosts */
    char where[300], launched[512], info[640], note[1024] = "";
    if (plan.host == DT_HOSTCOMM_MPI) snprintf(where, sizeof where, "the mpi collective");
    else if (!e->addr[0] && e->rank == 0) snprintf(where, sizeof where, "rendezvous on port %d", e->port);
    else snprintf(where, sizeof where, "rendezvous at %s:%d", e->addr[0] ? e->addr : "(MASTER_ADDR unset)", e->port);
    snprintf(launched, sizeof launched, "launched by %s: rank %d of %d, local rank %d of %d; %s", e->source, e->rank,
             e->world, e->local_rank, e->local_world, where);
    if (e->rank == 0) printf("dtrain: %s\n", launched);
    fflush(stdout);
    const double t0 = dt_clock_now();
    dt_shm_world *world = NULL;
    dt_comm *comm = NULL, *grad = NULL;
    dt_status st = meet(cfg, &plan, &world, &comm, &grad, res);
    if (st == DT_OK) {
        snprintf(info, sizeof info, "%s; %s took %.3f s", launched,
                 plan.host == DT_HOSTCOMM_MPI ? "MPI start-up" : "rendezvous", dt_clock_now() - t0);
        g_ext_stop = 0;
        dt_launch_ctx ctx = {.attempt = launcher_restart_count(), .stop = (const volatile int *)&g_ext_stop,
                             .note = note, .note_size = sizeof note, .local_rank = e->local_rank,
                             .launched_by = info, .plan = &plan, .grad_comm = grad};
        group_worlds *groups = calloc(1, sizeof *groups);
        st = groups ? groups_external(cfg, &plan, comm, groups, &ctx) : dt_error_set(DT_ERR_NOMEM, "out of memory");
        if (st == DT_OK) st = run_rank(cfg, &ctx, world, comm, fn, arg);
        if (st != DT_OK && groups) groups_abort(groups, dt_error_msg());
        groups_leave(&ctx);
        if (groups) groups_destroy(groups);
        free(groups);
        res->stopped_by = g_ext_stop;
        snprintf(res->note, sizeof res->note, "%s", note);
    }
    dt_comm_free(grad);
    dt_comm_free(comm);
    dt_shm_world_destroy(world);
    return st;
}

void dt_launch_finish(const dt_launch_result *res, int exit_code) {
#ifdef DTRAIN_HAVE_MPI
    if (res->mpi) dt_mpi_finalize(res->mpi_agreed ? 0 : exit_code);
#else
    (void)res, (void)exit_code;
#endif
}
