/* worker.c — one worker's training loop and evaluation.
 *
 * Order of one optimizer step: for each micro-batch (grad_accum_steps): sample this rank's
 * slice -> forward -> backward (grads accumulate, scaled by 1/rows of the GLOBAL batch);
 * during the last micro-batch's backward every finished bucket (layer) starts its gradient
 * all-reduce (sum) while backward goes on; wait for all buckets -> clip + AdamW (identical
 * on every rank) -> log (rank 0), evaluate every eval.every_steps (each rank its slice,
 * sums all-reduced; a stop request ends it between batches, unrecorded), compare replica
 * checksums every training.check_replicas_every steps; at the end evaluate and save weights
 * (rank 0). */
#include "dtrain/worker.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <zlib.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dtrain/agree.h"
#include "dtrain/backend.h"
#include "dtrain/ckpt.h"
#include "dtrain/clock.h"
#include "dtrain/comm.h"
#include "dtrain/data.h"
#include "dtrain/fault.h"
#include "dtrain/file.h"
#include "dtrain/generate.h"
#include "dtrain/infer.h"
#include "dtrain/device.h"
#include "dtrain/model.h"
#include "dtrain/ops.h"
#include "dtrain/optim.h"
#include "dtrain/safetensors.h"
#include "dtrain/tokenizer.h"

typedef struct run {
    const dt_config *cfg;
    dt_comm *comm;          /* NULL: a single process */
    dt_comm *gcomm;         /* gradients and weights: comm, or the backend's device collective */
    dt_comm *dcomm;         /* owned: the backend's collective for device buffers (world > 1) */
    int rank, world;
    /* model parallelism (training.tensor_parallel, pipeline_parallel): this rank's place in the
     * mesh, its tensor-parallel group's collective (NULL: none), and its data-parallel group: the
     * replicas that read different data and sum gradients (gcomm); without model parallelism
     * drank, dworld = rank, world. Pipeline stages: the collectives with the stage before and
     * after (launch.h dt_launch_ctx pp_*), a staging buffer for their exchanges, and bucket 0's
     * all-reduce held back until the tied embedding's two gradients are summed. */
    dt_mesh mesh;
    dt_comm *tp_comm, *pp_prev, *pp_next, *pp_ends;
    dt_comm *group_dcomm[4]; /* owned: on devices, the device collectives of tp_comm, pp_prev, pp_next, pp_ends
                                (which then point to them) */
    void *pp_buf;           /* backend memory: two micro-batches' boundaries (dt_model_stage_bytes) */
    int embed_held;
    int drank, dworld;
    dt_device_kind dev;     /* what training.device resolved to */
    dt_tokenizer *tok;      /* data.tokenizer: NULL for bytes */
    uint32_t lora_base;     /* model.lora: dt_model_frozen_digest of the base the adapters apply to */
    long confusion[DT_MAX_VAL_SETS][DT_MAX_CLASS_METRICS * DT_MAX_CLASS_METRICS]; /* each set's last evaluation's
                                                                                    [label][predicted] */
    dt_comm_req **reqs;     /* (n_buckets) in-flight gradient all-reduces (reduce-scatters, all-gathers) */
    int zero;               /* training.zero_stage 1 with more than one worker: the optimizer holds this
                               rank's part of every bucket (dt_comm_part) */
    dt_range *own;          /* ... those parts (n_own), in the parameters' layout */
    int n_own;
    int device_alone;       /* DTRAIN_TEST_DEVICE_COMM (fault.h): one worker through the device collective */
    int reduces;            /* gradients go through a collective: world > 1, or device_alone */
    dt_shm_world *alone_world; /* ... and its host collective of one, to bootstrap it (owned) */
    dt_comm *alone_boot;
    dt_status comm_st;      /* first failure to start one */
    dt_backend *be;
    const dt_comm_plan *plan; /* the collectives (NULL: one process) */
    dt_dataset *train, *val[DT_MAX_VAL_SETS]; /* val[0]: the first validation set (NULL: none) */
    int n_val;
    dt_model *model;
    dt_optim *optim;
    dt_sampler *sampler;
    dt_metrics *metrics;
    int *tokens;    /* host (b, T) */
    int *targets;   /* host (b, T) or (b) */
    int *pos;       /* host (b, T): packed rows' positions (data.packing) */
    size_t *idx;    /* host (b) */
    double len_sum, len_rows; /* training: the length of the batches' rows, summed over the rows, and the rows */
    volatile int *waiting; /* the launcher's "waiting for rank 0's disk" flag of this worker (may be NULL) */
    const volatile int *stop; /* the launcher's stop flag (SIGINT/SIGTERM): evaluation ends early (NULL: never) */
} run;

static double now_ms(void) { return 1e3 * dt_clock_now(); }

/* `st`: how the run ended. After a failure the device collective is left to the process exit:
 * destroying NCCL's waits for the peers on this host, which may be gone or stuck. */
static void run_free(run *r, dt_status st) {
    dt_metrics_close(r->metrics);
    dt_sampler_free(r->sampler);
    dt_optim_free(r->optim);
    dt_model_free(r->model);
    for (int i = 0; i < r->n_val; i++) dt_dataset_free(r->val[i]);
    dt_dataset_free(r->train);
    dt_tokenizer_free(r->tok);
    if (st == DT_OK) dt_comm_free(r->dcomm);
    for (int i = 0; i < 4; i++)
        if (st == DT_OK) dt_comm_free(r->group_dcomm[i]);
    dt_comm_free(r->alone_boot);
    dt_shm_world_destroy(r->alone_world);
    if (r->be && r->pp_buf) r->be->ops->free(r->be->ctx, r->pp_buf);
    dt_backend_close(r->be);
    free(r->tokens);
    free(r->targets);
    free(r->pos);
    free(r->idx);
    free(r->reqs);
    free(r->own);
}

static dt_status mkdir_p(const char *path) {
    char buf[DT_PATH_MAX];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *p = buf + 1;; p++) {
        if (*p == '/' || *p == '\0') {
            char c = *p;
            *p = '\0';
            if (mkdir(buf, 0755) != 0 && errno != EEXIST)
                return dt_error_set(DT_ERR_IO, "%s: cannot create directory: %s (hint: check run.dir)", buf, strerror(errno));
            *p = c;
            if (c == '\0') break;
        }
    }
    return DT_OK;
}

static dt_status open_dataset(const dt_config *c, const char *path, dt_tokenizer *tok, dt_dataset **out) {
    dt_dataset_cfg dc = {
        .path = path,
        .format = c->data.format,
        .seq_len = c->data.seq_len,
        .num_labels = c->model.shape.num_labels,
        .vocab_size = c->model.shape.vocab_size,
        .tokenizer = tok,
        .train_on_all = c->data.train_on_all,
        .packing = c->data.packing,
    };
    return dt_dataset_open(out, &dc);
}

/* Everything train and eval share: backend (device `local_rank` on device runs), model, host
 * batch buffers, datasets. */
static dt_status run_setup(run *r, const dt_config *c, dt_comm *comm, int need_train, const dt_launch_ctx *l) {
    memset(r, 0, sizeof *r);
    r->cfg = c;
    r->comm = r->gcomm = comm;
    r->rank = r->drank = comm ? dt_comm_rank(comm) : 0;
    r->world = r->dworld = comm ? dt_comm_world(comm) : 1;
    r->mesh = dt_mesh_of(r->world, 1, 1, r->rank);
    const int tp = c->training.tensor_parallel, pp = c->training.pipeline_parallel;
    dt_infer_share share = {.tp = 1};
    if (comm && (tp > 1 || pp > 1)) { /* training: the launcher made the groups' collectives */
        r->mesh = dt_mesh_of(r->world, tp, pp, r->rank);
        if (!l || (tp > 1 && !l->tp_comm) || (pp > 1 && !(r->mesh.p ? l->pp_prev : l->pp_next)))
            return dt_error_set(DT_ERR_INTERNAL, "training.tensor_parallel %d, pipeline_parallel %d, but the worker "
                                "has no collective of its groups", tp, pp); /* the launchers make them (launch.c) */
        r->tp_comm = l->tp_comm;
        r->pp_prev = l->pp_prev;
        r->pp_next = l->pp_next;
        r->pp_ends = l->pp_ends;
        r->gcomm = l->dp_comm; /* NULL with one replica: nothing to sum */
        r->drank = r->mesh.d;
        r->dworld = r->mesh.dp;
        share = (dt_infer_share){.tp = tp, .tp_rank = r->mesh.t, .tp_comm = r->tp_comm, .pp = pp, .pp_rank = r->mesh.p,
                                 .act_sets = need_train ? dt_mesh_in_flight(pp, r->mesh.p, c->training.grad_accum_steps) : 1};
    }
    DT_TRY(dt_backend_resolve(c, &r->dev));
    r->device_alone = r->world == 1 && need_train && dt_backend_ops(r->dev)->device_comm && dt_fault_device_comm_alone();
    r->reduces = r->dworld > 1 || r->device_alone;
    /* one worker: its shard is everything (unless the test switch sends it through the collective) */
    r->zero = c->training.zero_stage == 1 && r->reduces;
    DT_TRY(dt_infer_build_share(c, l ? l->local_rank : 0, r->rank, c->data.batch_size_per_worker, c->data.seq_len,
                                (need_train ? DT_INFER_TRAIN : 0) | DT_INFER_DATA_ROWS, &share, &r->be, &r->tok,
                                &r->model));
    size_t b = (size_t)c->data.batch_size_per_worker, T = (size_t)c->data.seq_len;
    if (r->mesh.pp > 1)
        DT_TRY(r->be->ops->alloc(r->be->ctx, 2 * dt_model_stage_bytes(r->model, (int)b), "pipeline staging", &r->pp_buf));
    r->tokens = dt_malloc(b * T * sizeof(int), "token batch");
    r->targets = dt_malloc(b * T * sizeof(int), "target batch");
    r->pos = dt_malloc(b * T * sizeof(int), "position batch");
    r->idx = dt_malloc(b * sizeof(size_t), "batch indices");
    r->reqs = dt_calloc((size_t)dt_model_num_buckets(r->model), sizeof *r->reqs, "bucket requests");
    if (!r->tokens || !r->targets || !r->pos || !r->idx || !r->reqs) return DT_ERR_NOMEM;
    if (need_train) DT_TRY(open_dataset(c, c->data.train_path, r->tok, &r->train));
    for (; r->n_val < dt_config_val_count(c); r->n_val++)
        DT_TRY(open_dataset(c, dt_config_val_path(c, r->n_val), r->tok, &r->val[r->n_val]));
    return DT_OK;
}

/* The n samples idx of ds into the host batch (r->tokens, r->targets), their rows cut to what
 * their longest needs with data.pad_to longest (dt_model_cut_rows), the model told their length;
 * packed rows also give the model their positions. */
static dt_status fill_batch(run *r, const dt_dataset *ds, const size_t *idx, int n) {
    const int cls = dt_dataset_is_classification(ds), S = r->cfg->data.seq_len;
    const int packed = dt_dataset_packed(ds);
    for (int i = 0; i < n; i++) {
        int *tokens = r->tokens + (size_t)i * S, *targets = r->targets + (cls ? (size_t)i : (size_t)i * S);
        if (packed) dt_dataset_get_pos(ds, idx[i], tokens, targets, r->pos + (size_t)i * S);
        else dt_dataset_get(ds, idx[i], tokens, targets);
    }
    DT_TRY(r->cfg->data.pad_to_longest ? dt_model_cut_rows(r->model, r->tokens, r->targets, packed ? r->pos : NULL, n)
                                       : dt_model_set_length(r->model, S));
    return packed ? dt_model_set_positions(r->model, r->pos, n) : DT_OK;
}

/* ---- pipeline stages: their boundaries ---- */

/* a micro-batch of B rows at a stage boundary */
static size_t boundary_bytes(const run *r, int B) { return dt_model_stage_bytes(r->model, B); }

/* The point-to-point steps between neighbouring stages, each a collective of the two (launch.h
 * pp_prev, pp_next: the stage before is rank 0): a send and its receive are a broadcast from the
 * sender; a send that meets the other's send is one exchange (an all-gather of the two). A step
 * toward a stage that is not there (before the first, after the last) does nothing. */
static dt_status recv_forward(run *r, int B) { /* the stage before's output into this one's input */
    return r->pp_prev ? dt_comm_broadcast(r->pp_prev, dt_model_stage_input(r->model), boundary_bytes(r, B), 0) : DT_OK;
}
static dt_status send_forward(run *r, int B) {
    return r->pp_next ? dt_comm_broadcast(r->pp_next, dt_model_stage_output(r->model), boundary_bytes(r, B), 0) : DT_OK;
}
static dt_status recv_backward(run *r, int B) { /* the stage after's input gradient: where backward starts */
    return r->pp_next ? dt_comm_broadcast(r->pp_next, dt_model_stage_grad(r->model), boundary_bytes(r, B), 1) : DT_OK;
}
static dt_status send_backward(run *r, int B) {
    return r->pp_prev ? dt_comm_broadcast(r->pp_prev, dt_model_stage_grad(r->model), boundary_bytes(r, B), 1) : DT_OK;
}
static dt_status exchange(run *r, dt_comm *pair, const float *mine, float *theirs, int B) {
    if (!pair) return DT_OK;
    const size_t n = boundary_bytes(r, B);
    DT_TRY(dt_comm_allgather(pair, mine, n, r->pp_buf));
    r->be->ops->copy(r->be->ctx, theirs, (const char *)r->pp_buf + (size_t)(1 - dt_comm_rank(pair)) * n, n);
    return DT_OK;
}

#define EVAL_VOTE_MS 50.0 /* about the time between two stop votes of an evaluation */

/* When the ranks of an evaluation vote on stopping next (eval_stop_vote). */
typedef struct eval_votes {
    size_t next, last; /* the batch before which they vote next; the one of the last vote */
    double last_ms;    /* the time of the last vote */
} eval_votes;

/* Whether evaluation stops before batch j: the launcher's flag on any rank. One process looks
 * before every batch. Several vote, all before the same batches, so that all of them leave
 * after the same one and none waits in a collective the others skipped: one all-reduce of
 * this rank's flag and, from rank 0 alone (the others add 0: the sum is exact), the batches
 * to the next vote, about EVAL_VOTE_MS of them at rank 0's pace (an all-reduce every batch
 * would cost small batches a third of their time). */
static dt_status eval_stop_vote(run *r, size_t j, eval_votes *ev, int *stop) {
    const int mine = r->stop && *r->stop;
    *stop = r->world == 1 && mine;
    if (r->world == 1 || j < ev->next) return DT_OK;
    const double now = now_ms();
    float v[2] = {mine ? 1.0f : 0.0f, 0.0f};
    if (r->rank == 0) {
        const double per = j > ev->last ? (now - ev->last_ms) / (double)(j - ev->last) : 0.0; /* ms a batch */
        const double k = per > 0.0 ? floor(EVAL_VOTE_MS / per) : 1.0;
        v[1] = (float)(k < 1.0 ? 1.0 : k > 1024.0 ? 1024.0 : k);
    }
    DT_TRY(dt_comm_allreduce(r->comm, v, 2, DT_REDUCE_SUM));
    *stop = v[0] > 0.0f;
    ev->next = j + (size_t)v[1];
    ev->last = j;
    ev->last_ms = now;
    return DT_OK;
}

/* Every example of validation set `set` once across the ranks; eval.max_batches limits them to
 * the first max_batches x batch_size_per_worker, the same examples for any number of workers.
 * The sums are all-reduced, so every rank returns the global result. A stop request (r->stop)
 * ends it between two batches: *stopped = 1, a line says so, and of *out only eval_ms is set (a
 * partial evaluation is no result); else *stopped = 0. */
static dt_status evaluate(run *r, long step, int set, dt_eval_point *out, int *stopped) {
    const dt_config *c = r->cfg;
    double t0 = now_ms();
    const dt_dataset *val = r->val[set];
    long *confusion = r->confusion[set];
    size_t n = dt_dataset_size(val);
    int b = c->data.batch_size_per_worker;
    if (c->eval.max_batches > 0 && (size_t)c->eval.max_batches <= n / (size_t)b) n = (size_t)c->eval.max_batches * (size_t)b;
    size_t nb = dt_eval_num_batches(n, r->dworld, b);
    double loss = 0;
    long rows = 0, correct = 0, examples = 0;
    const int nl = c->model.shape.num_labels <= DT_MAX_CLASS_METRICS ? c->model.shape.num_labels : 0; /* 0: no matrix */
    memset(confusion, 0, sizeof r->confusion[set]);
    eval_votes ev = {0};
    for (size_t j = 0; j < nb; j++) {
        DT_TRY(eval_stop_vote(r, j, &ev, stopped));
        if (*stopped) {
            char label[64] = ""; /* as the eval lines name a set */
            if (c->data.n_val_sets) snprintf(label, sizeof label, " [%s]", dt_config_val_name(c, set));
            if (r->metrics)
                dt_metrics_info(r->metrics, "evaluation at step %ld%s stopped after %zu of %zu batches (asked to stop): "
                                "not recorded", step, label, j, nb);
            out->eval_ms = now_ms() - t0;
            return DT_OK;
        }
        size_t start;
        int count;
        dt_eval_slice(n, j, r->drank, r->dworld, b, &start, &count);
        if (count == 0) continue;
        for (int i = 0; i < count; i++) r->idx[i] = start + (size_t)i;
        DT_TRY(fill_batch(r, val, r->idx, count));
        dt_fwd_result res;
        dt_model_use_acts(r->model, 0);
        DT_TRY(recv_forward(r, count)); /* pipeline stages: the one before's output (none: nothing) */
        DT_TRY(dt_model_forward(r->model, r->tokens, r->targets, count, &res));
        DT_TRY(send_forward(r, count));
        loss += res.loss_sum;
        rows += res.rows;
        correct += res.correct;
        examples += count;
        for (int i = 0; nl && res.pred && i < count; i++) confusion[r->targets[i] * nl + res.pred[i]]++;
        if (r->metrics) dt_metrics_eval_progress(r->metrics, (long)j + 1, (long)nb, (now_ms() - t0) / 1000.0);
    }
    if (r->world > 1) {
        /* counts stay exact in float up to 2^24 rows; the loss sum is rounded to float; the shares of one
         * replica (tensor parallelism) saw the same rows: one of them counts them, on the stage with the loss */
        const float mine = r->mesh.t == 0 && r->mesh.p == r->mesh.pp - 1 ? 1.0f : 0.0f;
        float sums[4 + DT_MAX_CLASS_METRICS * DT_MAX_CLASS_METRICS] = {mine * (float)loss, mine * (float)rows,
                                                                       mine * (float)correct, mine * (float)examples};
        for (int i = 0; i < nl * nl; i++) sums[4 + i] = mine * (float)confusion[i];
        DT_TRY(dt_comm_allreduce(r->comm, sums, (size_t)(4 + nl * nl), DT_REDUCE_SUM));
        loss = sums[0];
        rows = (long)sums[1];
        correct = (long)sums[2];
        examples = (long)sums[3];
        for (int i = 0; i < nl * nl; i++) confusion[i] = (long)sums[4 + i];
    }
    out->step = step;
    out->loss = rows ? loss / (double)rows : NAN;
    out->accuracy = rows ? (double)correct / (double)rows : NAN;
    out->examples = examples;
    out->eval_ms = now_ms() - t0;
    out->num_labels = nl;
    out->confusion = nl ? confusion : NULL;
    out->set = c->data.n_val_sets ? dt_config_val_name(c, set) : NULL;
    return DT_OK;
}

static dt_status write_resolved_config(const dt_config *c) {
    char path[DT_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.yaml", c->run.dir);
    int fd; /* never through a link planted in the run directory */
    DT_TRY(dt_file_open_write(path, 0, &fd));
    FILE *f = dt_file_stream(fd, "w", path);
    if (!f) return DT_ERR_NOMEM;
    fputs("# resolved configuration of this run\n", f); /* dt_config_print names the file it came from */
    dt_config_print(c, f);
    if (fclose(f) != 0) return dt_error_set(DT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
    return DT_OK;
}

static void human_count(char *buf, size_t n, double v) {
    if (v >= 1e9) snprintf(buf, n, "%.2fG", v / 1e9);
    else if (v >= 1e6) snprintf(buf, n, "%.2fM", v / 1e6);
    else if (v >= 1e3) snprintf(buf, n, "%.1fk", v / 1e3);
    else snprintf(buf, n, "%.0f", v);
}

/* Floats of each AdamW moment on one of `world` workers: all parameters, or with ZeRO-1 at
 * most the largest part of every bucket (n_layer + 2 of them, dt_comm_part's split). */
static size_t moment_floats(const dt_model_cfg *mc, int world, int zero_stage) {
    const size_t n = dt_model_count_trainable(mc); /* model.lora: the adapters' */
    if (zero_stage != 1 || world < 2) return n;
    return n / (size_t)world + (size_t)mc->shape.n_layer + 2;
}

/* The device memory a worker's device collectives allocate for themselves (ops->device_comm_bytes;
 * 0 on a backend without them): the data-parallel group's where it has one (`dp_comm`), with bf16
 * gradients (`bf16_wire`) a buffer of the largest bucket, and one for each model-parallel group
 * of mc's share (launch.c's memberships: its tensor-parallel group, its pairs with the stages
 * before and after, its pipeline's ends). */
static size_t comm_memory_bytes(const dt_ops *ops, const dt_model_cfg *mc, int dp_comm, int bf16_wire) {
    if (!ops->device_comm || !ops->device_comm_bytes) return 0;
    const int P = mc->pp > 1 ? mc->pp : 1, p = P > 1 ? mc->pp_rank : 0;
    const int groups = (mc->tp > 1) + (p > 0) + (p < P - 1) + (P > 1 && (p == 0 || p == P - 1));
    const size_t dp = dp_comm ? ops->device_comm_bytes(bf16_wire ? dt_model_largest_bucket(mc) : 0) : 0;
    return dp + (size_t)groups * ops->device_comm_bytes(0);
}

/* What training `mc` (a worker's share with model parallelism) on `world` workers needs of a
 * backend's memory: the model (parameters, gradients, activations), the AdamW moments, the
 * backend's own scratch, its collectives' buffers (comm_memory_bytes) and a pipeline stage's
 * boundaries (run_setup's pp_buf: dt_model_stage_bytes twice). */
static size_t device_memory_bytes(const dt_ops *ops, const dt_model_cfg *mc, int bf16, int world, int zero_stage,
                                  int dp_comm, int bf16_wire) {
    dt_op_sizes sizes;
    dt_model_op_sizes(mc, &sizes);
    const size_t staging = mc->pp > 1 ? 2 * dt_model_stage_bytes_cfg(mc, ops, bf16, mc->max_batch) : 0;
    return dt_model_memory_bytes(mc, ops, bf16) + 2 * moment_floats(mc, world, zero_stage) * sizeof(float) +
           ops->scratch_bytes(&sizes, bf16) + comm_memory_bytes(ops, mc, dp_comm, bf16_wire) + staging;
}

/* `all` bytes of memory for training `mc` on `world` workers (device_memory_bytes') in parts, into
 * buf: "weights W, gradients G, AdamW state A, activations and scratch R" (the rest: activations,
 * a device's bf16 copies and the backend's workspaces), for a CPU worker's line and a device's */
static void memory_parts(char *buf, size_t n, const dt_model_cfg *mc, double all, int world, int zero_stage) {
    const double w = (double)dt_model_param_bytes(mc), g = (double)dt_model_count_trainable(mc) * sizeof(float),
                 a = 2.0 * (double)moment_floats(mc, world, zero_stage) * sizeof(float);
    char ws[32], gs[32], as[32], rs[32];
    human_count(ws, sizeof ws, w);
    human_count(gs, sizeof gs, g);
    human_count(as, sizeof as, a);
    human_count(rs, sizeof rs, all - w - g - a);
    snprintf(buf, n, "weights %sB, gradients %sB, AdamW state %sB%s, activations and scratch %sB", ws, gs, as,
             zero_stage == 1 && world > 1 ? " (this worker's ZeRO-1 share)" : "", rs);
}

/* --dry-run, pipeline stages: each stage's layers, parameters and memory (its weights, gradients
 * and AdamW state, and the activations of the micro-batches 1F1B keeps in flight there), and the
 * schedule's idle share (the bubble, (P - 1) / (M + P - 1) of a step with M micro-batches). */
static void describe_stages(const dt_config *c, const dt_model_cfg *mc, FILE *out) {
    const int P = c->training.pipeline_parallel, T = c->training.tensor_parallel, M = c->training.grad_accum_steps;
    const int D = c->training.num_workers / (T * P);
    fprintf(out, "# training.pipeline_parallel %d: %d replica%s x %d stages x %d share%s; 1F1B over %d micro-batch%s a "
            "step idles ~%.0f%% of it (the bubble: (P - 1) / (M + P - 1); more training.grad_accum_steps shrink it)\n",
            P, D, D > 1 ? "s" : "", P, T, T > 1 ? "s" : "", M, M > 1 ? "es" : "", 100.0 * dt_mesh_bubble(P, M));
    for (int p = 0; p < P; p++) {
        dt_model_cfg sh = *mc;
        sh.tp = T;
        sh.pp = P;
        sh.pp_rank = p;
        sh.act_sets = dt_mesh_in_flight(P, p, M);
        int lo, hi;
        dt_model_stage_layers(&sh, p, &lo, &hi);
        const size_t n = dt_model_count_params(&sh), nt = dt_model_count_trainable(&sh); /* model.lora: nt < n */
        const double moments = 2.0 * (double)nt * sizeof(float) / (c->training.zero_stage == 1 ? D : 1);
        char held[32], mem[32], layers[32], trained[48] = "";
        human_count(held, sizeof held, (double)n);
        if (nt < n) {
            char k[32];
            human_count(k, sizeof k, (double)nt);
            snprintf(trained, sizeof trained, ", %s of them trainable", k);
        }
        if (hi - lo == 1) snprintf(layers, sizeof layers, "layer %d", lo);
        else snprintf(layers, sizeof layers, "layers %d-%d", lo, hi - 1);
        human_count(mem, sizeof mem, (double)dt_model_memory_bytes(&sh, dt_backend_ops(DT_DEVICE_CPU), 0) + moments);
        fprintf(out, "#   stage %d: %s%s%s; each worker holds %s parameters (%.1f%%%s), ~%sB with the "
                "activations of %d micro-batch%s in flight\n", p, layers, p == 0 ? ", the embeddings" : "",
                p == P - 1 ? (dt_model_tied_head(&sh) && p ? ", the head (and its copy of the tied embedding)"
                                                             : ", the head") : "",
                held, 100.0 * (double)n / (double)dt_model_count_params(mc), trained, mem, sh.act_sets,
                sh.act_sets > 1 ? "es" : "");
    }
}

/* The data as the run would open it: refused here as it would be there. */
static dt_status describe_data(const dt_config *c, FILE *out) {
    dt_tokenizer *tok;
    DT_TRY(dt_infer_tokenizer(c, &tok));
    dt_status st = DT_OK;
    for (int i = -1; i < dt_config_val_count(c) && st == DT_OK; i++) { /* -1: the training data */
        const char *path = i < 0 ? c->data.train_path : dt_config_val_path(c, i);
        char name[64];
        if (i < 0 || !c->data.n_val_sets) snprintf(name, sizeof name, "%s", i < 0 ? "train" : "val");
        else snprintf(name, sizeof name, "val [%s]", dt_config_val_name(c, i));
        dt_dataset *ds = NULL;
        if ((st = open_dataset(c, path, tok, &ds)) != DT_OK) break;
        size_t n = dt_dataset_size(ds), cut = dt_dataset_num_truncated(ds);
        dt_sft_stats ss;
        if (dt_dataset_sft_stats(ds, &ss)) { /* chat, completion: what the loss will count */
            fprintf(out, "# data: %s: %zu %s in %zu file(s), %zu tokens, %zu targets counted in the loss (%s)", name,
                    ss.examples, c->data.format == DT_FORMAT_CHAT ? "conversations" : "prompts and completions",
                    dt_dataset_num_files(ds), ss.tokens, ss.counted, c->data.train_on_all ? "all" : "the answers'");
            if (cut) fprintf(out, ", %zu cut to data.seq_len + 1 = %d tokens", cut, c->data.seq_len + 1);
            if (ss.no_answer) fprintf(out, ", %zu left out (no answer token within them)", ss.no_answer);
            if (c->data.packing)
                fprintf(out, "; packed into %zu rows of %d: padding %.1f%% of their tokens (one example a row: %.1f%%)",
                        ss.rows, c->data.seq_len, 100.0 * ss.padding_packed, 100.0 * ss.padding);
            else fprintf(out, "; padding %.1f%% of the rows' tokens", 100.0 * ss.padding);
            fputc('\n', out);
            dt_dataset_free(ds);
            continue;
        }
        fprintf(out, "# data: %s: %zu %s in %zu file(s)", name, n,
                dt_dataset_is_classification(ds) ? "examples" : "samples", dt_dataset_num_files(ds));
        if (cut && tok) fprintf(out, ", %zu cut to data.seq_len = %d tokens", cut, c->data.seq_len);
        else if (cut) fprintf(out, ", %zu cut to data.seq_len - 1 = %d bytes", cut, c->data.seq_len - 1);
        fputc('\n', out);
        dt_dataset_free(ds);
    }
    dt_tokenizer_free(tok);
    return st;
}

dt_status dt_worker_describe(const dt_config *c, FILE *out) {
    dt_config_print(c, out);
    dt_model_cfg mc = dt_infer_model_cfg(c, c->data.batch_size_per_worker, c->data.seq_len);
    mc.packed = c->data.packing;
    char params[32], flops[32], mem[32];
    human_count(params, sizeof params, (double)dt_model_count_params(&mc));
    human_count(flops, sizeof flops, dt_model_flops_per_token(&mc));
    { /* a CPU worker's: what it allocates for training (a GPU worker's device memory: the "# on cuda" line) */
        const dt_ops *cpu = dt_backend_ops(DT_DEVICE_CPU);
        const int TP = c->training.tensor_parallel * c->training.pipeline_parallel;
        const int D = TP > 1 ? 1 : c->training.num_workers; /* model parallelism: the whole model, unsharded */
        const double all = (double)device_memory_bytes(cpu, &mc, 0, D, c->training.zero_stage, 0, 0);
        char parts[256];
        human_count(mem, sizeof mem, all);
        memory_parts(parts, sizeof parts, &mc, all, D, c->training.zero_stage);
        fprintf(out, "# model: %s parameters (%zu), %s training FLOPs per token, ~%sB of memory per worker (on a CPU: "
                "%s)%s\n", params, dt_model_count_params(&mc), flops, mem, parts,
                TP > 1 ? "; the whole model's: each worker's share below" : "");
    }
    if (mc.lora.rank) {
        const size_t all = dt_model_count_params(&mc), train = dt_model_count_trainable(&mc);
        char tr[32], fr[32], ad[32], names[256];
        human_count(tr, sizeof tr, (double)train);
        human_count(fr, sizeof fr, (double)(all - train));
        human_count(ad, sizeof ad, 2.0 * (double)train * sizeof(float));
        fprintf(out, "# model.lora: rank %d, alpha %g on %s: %s trainable parameters (%zu, %.2f%%), %s frozen%s; "
                "gradients, AdamW state (%sB) and the all-reduce cover the trainable ones only\n", mc.lora.rank,
                mc.lora.alpha, dt_lora_targets_str(mc.lora.targets, names, sizeof names), tr, train,
                100.0 * (double)train / (double)all, fr, mc.lora.base_bf16 ? " (its matrices kept in bf16)" : "", ad);
    }
    if (c->training.tensor_parallel > 1) { /* each worker's share, from the same layout the workers build */
        const int T = c->training.tensor_parallel, D = c->training.num_workers / (T * c->training.pipeline_parallel);
        dt_model_cfg sh = mc;
        sh.tp = T;
        char share[32], smem[32], state[32];
        const size_t n = dt_model_count_params(&sh), nt = dt_model_count_trainable(&sh); /* model.lora: nt < n */
        human_count(share, sizeof share, (double)n);
        const double moments = 2.0 * (double)nt * sizeof(float) / (c->training.zero_stage == 1 ? D : 1); /* ZeRO-1: 1/D */
        human_count(smem, sizeof smem, (double)dt_model_memory_bytes(&sh, dt_backend_ops(DT_DEVICE_CPU), 0) + moments);
        human_count(state, sizeof state, (double)dt_model_param_bytes(&sh) + (double)nt * sizeof(float) + moments);
        fprintf(out, "# training.tensor_parallel %d: %d replica%s x %d shares; each worker holds %s parameters (%zu, "
                "%.1f%% of the model: the products and the vocabulary split, the norms and positions whole): %sB of "
                "weights, gradients and AdamW state, ~%sB with the activations\n", T, D, D > 1 ? "s" : "", T, share, n,
                100.0 * (double)n / (double)dt_model_count_params(&mc), state, smem);
    }
    if (c->training.pipeline_parallel > 1) describe_stages(c, &mc, out);
    if (c->training.tensor_parallel * c->training.pipeline_parallel > 1) { /* gather_whole's staging */
        const int T = c->training.tensor_parallel; /* windows: the all-gather's (T + 1), or the broadcasts' part */
        const double windows = (T > 1 ? T + 1.0 : 1.0) * DT_ST_PART * sizeof(float);
        char staged[32], win[32];
        human_count(staged, sizeof staged, (double)dt_model_count_trainable(&mc) * sizeof(float) + (T > 1 ? windows : 0));
        human_count(win, sizeof win, windows);
        fprintf(out, "# model parallelism: to write a checkpoint, rank 0 gathers the whole model's weights, then each "
                "AdamW moment, on the host, one at a time (~%sB more while it saves, the array%s); the other workers "
                "stage at most %sB, in windows of 4 MiB, and a stage's first share its stage's part of each array too\n",
                staged, T > 1 ? " and windows of at most 4 MiB of what the shares send" : "", win);
    }
    dt_device_kind dev;
    const int resolved = dt_backend_resolve(c, &dev) == DT_OK;
    /* training.device: cuda on a machine without a GPU still gets the estimate, for planning */
    if (!resolved && c->training.device == DT_DEVICE_CUDA) dev = DT_DEVICE_CUDA;
    const dt_ops *ops = resolved || c->training.device == DT_DEVICE_CUDA ? dt_backend_ops(dev) : NULL;
    if (ops && ops->memory) { /* a device with memory of its own */
        const int bf16 = c->training.precision != DT_PREC_FP32;
        const int T = c->training.tensor_parallel, P = c->training.pipeline_parallel, D = c->training.num_workers / (T * P);
        size_t most = 0; /* model parallelism: the share that needs the most (shares of a vocabulary may differ) */
        dt_model_cfg top = mc;
        for (int k = 0; k < P * T; k++) {
            const int p = k / T;
            dt_model_cfg sh = mc;
            if (T * P > 1) {
                sh.tp = T;
                sh.tp_rank = k % T;
                sh.pp = P;
                sh.pp_rank = p;
                sh.act_sets = dt_mesh_in_flight(P, p, c->training.grad_accum_steps);
            }
            const size_t b = device_memory_bytes(ops, &sh, bf16, D, c->training.zero_stage, D > 1,
                                                 c->training.grad_comm_dtype == DT_WIRE_BF16);
            if (b > most) {
                most = b;
                top = sh;
            }
        }
        char parts[256];
        memory_parts(parts, sizeof parts, &top, (double)most, D, c->training.zero_stage);
        fprintf(out, "# on %s (%s): ~%.2f GiB of %s per worker (%s%s)%s\n", ops->name, bf16 ? "bf16 products" : "fp32",
                (double)most / (1u << 30), ops->memory, parts, T * P > 1 ? "; its share of the model, the most a "
                "share needs" : "", resolved ? "" : " (estimated here; this machine has none)");
    }
    fflush(out);
    return describe_data(c, out);
}

static long total_steps(const dt_config *c, size_t steps_per_epoch) {
    return c->training.max_steps > 0 ? c->training.max_steps : (long)c->training.epochs * (long)steps_per_epoch;
}

dt_status dt_worker_prepare_run_dir(const dt_config *c) {
    DT_TRY(mkdir_p(c->run.dir));
    if (c->checkpoint.resume == DT_RESUME_NEVER) {
        char moved[DT_PATH_MAX + 128];
        DT_TRY(dt_ckpt_set_aside(c->run.dir, -1, moved, sizeof moved));
        if (moved[0]) printf("checkpoint.resume is never: moved the earlier checkpoints aside to %s\n", moved);
    }
    return DT_OK; /* config.yaml: rank 0 writes it once the run is accepted (accept_run) */
}

/* Bucket callback of the last micro-batch's backward: start that bucket's all-reduce (with
 * ZeRO-1 its reduce-scatter: only this rank's part of the sum is needed here). */
static void on_bucket_ready(void *user, int bucket) {
    run *r = user;
    if (r->comm_st != DT_OK) return;
    const dt_bucket *bk = dt_model_bucket(r->model, bucket);
    if (!bk->numel) return; /* model.lora: a bucket with nothing trainable; another stage's */
    size_t tied_off, tied_n;
    dt_model_tied_grad(r->model, &tied_off, &tied_n);
    if (bucket == 0 && tied_n && !r->embed_held) { /* after the tied embedding's sum (pipeline_batches) */
        r->embed_held = 1;
        return;
    }
    float *g = dt_model_grads(r->model) + bk->offset;
    const dt_wire wire = r->cfg->training.grad_comm_dtype;
    r->comm_st = r->zero ? dt_comm_reduce_scatter_start(r->gcomm, g, bk->numel, wire, &r->reqs[bucket])
                         : dt_comm_allreduce_start(r->gcomm, g, bk->numel, DT_REDUCE_SUM, wire, &r->reqs[bucket]);
}

/* Waits for every started bucket; returns the first failure. */
static dt_status wait_buckets(run *r) {
    dt_status st = r->comm_st;
    for (int i = 0; i < dt_model_num_buckets(r->model); i++) {
        if (!r->reqs[i]) continue;
        dt_status w = dt_comm_wait(r->gcomm, r->reqs[i]);
        r->reqs[i] = NULL;
        if (st == DT_OK) st = w;
    }
    r->comm_st = DT_OK;
    return st;
}

/* The communication the step waited for in buckets it has just waited for (since w0), as much
 * as was not hidden behind compute: a device collective's own measure, on the device, of the
 * last bucket's time from its input's readiness to its sum (the host's wait also holds the
 * compute still queued before the buckets: the rest of a GPU's backward); else the host's wait
 * (host collectives: backward ran on this thread before it). */
static double exposed_since(run *r, double w0) {
    const double dev = dt_comm_last_exposed_ms(r->gcomm);
    return isfinite(dev) ? dev : now_ms() - w0;
}

/* ZeRO-1: every bucket of buf (the parameters, or a moment placed in the gradients' buffer)
 * all-gathered from its parts' owners, all started at once, then waited for. */
static dt_status gather_buckets(run *r, float *buf) {
    for (int i = 0; i < dt_model_num_buckets(r->model) && r->comm_st == DT_OK; i++) {
        const dt_bucket *bk = dt_model_bucket(r->model, i);
        if (!bk->numel) continue;
        r->comm_st = dt_comm_allgather_parts_start(r->gcomm, buf + bk->offset, bk->numel, &r->reqs[i]);
    }
    return wait_buckets(r);
}

/* Every rank must hold bit-identical parameters: compare CRC32s; name the ranks that differ
 * from the majority (with two ranks, both). With tensor parallelism, the replicas of each share
 * (its data-parallel group) are compared among themselves. */
static dt_status check_replicas(run *r, long step) {
    const size_t n = dt_model_num_params(r->model), part = n < DT_ST_PART ? n : DT_ST_PART; /* 4 MiB */
    float *host = dt_malloc((part ? part : 1) * sizeof(float), "replica check");
    if (!host) return DT_ERR_NOMEM;
    uLong sum = crc32_z(0L, Z_NULL, 0);
    for (size_t first = 0; first < n; first += part) { /* a part at a time: nothing the size of the model staged */
        const size_t k = n - first < part ? n - first : part;
        r->be->ops->download(r->be->ctx, host, dt_model_params(r->model) + first, k * sizeof(float));
        sum = crc32_z(sum, (const Bytef *)host, k * sizeof(float));
    }
    free(host);
    uint32_t crc = (uint32_t)sum;
    DT_TRY(r->be->ops->check(r->be->ctx));
    uint32_t all[DT_MAX_WORLD];
    int who[DT_MAX_WORLD], n_who = 0; /* the ranks of this rank's data-parallel group */
    DT_TRY(dt_comm_allgather(r->comm, &crc, sizeof crc, all));
    for (int i = 0; i < r->world; i++) {
        const dt_mesh m = dt_mesh_of(r->world, r->mesh.tp, r->mesh.pp, i);
        if (dt_mesh_dp_group(&m) == dt_mesh_dp_group(&r->mesh)) who[n_who++] = i;
    }
    int best = 0, best_count = 0;
    for (int i = 0; i < n_who; i++) {
        int cnt = 0;
        for (int j = 0; j < n_who; j++) cnt += all[who[j]] == all[who[i]];
        if (cnt > best_count) { best = who[i]; best_count = cnt; }
    }
    if (best_count == n_who) return DT_OK;
    char list[512];
    size_t k = 0;
    int tie = best_count * 2 <= n_who;
    for (int i = 0; i < n_who && k < sizeof list; i++)
        if (tie || all[who[i]] != all[best])
            k += (size_t)snprintf(list + k, sizeof list - k, "%srank %d (crc32 %08x)", k ? ", " : "", who[i], all[who[i]]);
    if (tie)
        return dt_error_set(DT_ERR_INTERNAL, "step %ld: replica check failed: the ranks' parameters disagree: %s",
                            step, list);
    return dt_error_set(DT_ERR_INTERNAL,
                        "step %ld: replica check failed: the parameters of %s differ from the other %d rank(s) "
                        "(crc32 %08x): silent divergence, stopping (hint: a faulty device or memory; "
                        "training.check_replicas_every sets how often this is checked)",
                        step, list, best_count, all[best]);
}

/* ---- resume ---- */

static void report_skipped(void *user, const char *msg) {
    run *r = user;
    dt_metrics_info(r->metrics, "checkpoint skipped: %s; trying the previous one", msg);
}

/* Picks the checkpoint to resume from (the same on every rank) into dir and *s. *found = 0: a
 * fresh start. After a restart (attempt > 0) this run's own checkpoints come first. */
static dt_status find_resume(run *r, int attempt, char *dir, size_t n, dt_ckpt_state *s, int *found) {
    const dt_config *c = r->cfg;
    *found = 0;
    if (attempt > 0 || c->checkpoint.resume == DT_RESUME_AUTO)
        DT_TRY(dt_ckpt_find_latest(c->run.dir, report_skipped, r, dir, n, s, found));
    if (!*found && c->checkpoint.resume == DT_RESUME_PATH) {
        dt_status st = dt_ckpt_find_latest(c->checkpoint.resume_path, report_skipped, r, dir, n, s, found);
        if (st != DT_OK) {
            dt_error_prefix("checkpoint.resume");
            return st;
        }
        if (!*found)
            return dt_error_set(DT_ERR_CONFIG,
                                "%s: checkpoint.resume: \"%s\": no valid checkpoint there (expected a checkpoint "
                                "directory with manifest.json, or a run directory with checkpoints/)",
                                c->source[0] ? c->source : "config", c->checkpoint.resume_path);
    }
    if (r->world > 1) { /* every rank must resume from the same step */
        long mine = *found ? s->step : -1, all[DT_MAX_WORLD];
        DT_TRY(dt_comm_allgather(r->comm, &mine, sizeof mine, all));
        for (int i = 0; i < r->world; i++)
            if (all[i] != all[0])
                return dt_error_set(DT_ERR_INTERNAL,
                                    "the ranks disagree on the checkpoint to resume: rank 0 found step %ld, rank %d "
                                    "step %ld (-1: none) (hint: every rank must see the same run.dir)",
                                    all[0], i, all[i]);
    }
    return DT_OK;
}

/* One history per run directory: checkpoints newer than the resume point (broken ones the
 * search skipped, or a future the user rolled back from), or all of them when the run
 * resumed from another directory, move aside (nothing is deleted), so that a restart never
 * picks them up and keep_last never counts them. */
static dt_status set_aside_other_history(run *r, const dt_ckpt_state *resumed_from, const char *ckpt_dir) {
    const dt_config *c = r->cfg;
    long after = resumed_from ? resumed_from->step : 0;
    if (resumed_from) {
        char root[DT_PATH_MAX + 32], a[PATH_MAX], b[PATH_MAX];
        snprintf(root, sizeof root, "%s/checkpoints", c->run.dir);
        size_t k = realpath(root, a) ? strlen(a) : 0;
        int inside = k && realpath(ckpt_dir, b) && strncmp(a, b, k) == 0 && b[k] == '/';
        if (!inside) after = -1;
    }
    char moved[DT_PATH_MAX + 128];
    DT_TRY(dt_ckpt_set_aside(c->run.dir, after, moved, sizeof moved));
    if (moved[0])
        dt_metrics_info(r->metrics, "moved checkpoints %s aside to %s (nothing deleted)",
                        after < 0 ? "of this run directory (resuming from another one)" : "newer than the resume point",
                        moved);
    return DT_OK;
}

/* run.dir/best belongs to the history training continues: one written by abandoned steps (a
 * fresh start, a resume from before it, another run's) is moved aside as best.prev-TIME,
 * nothing deleted, so that best/ never holds weights the summary does not name. */
static dt_status set_aside_stale_best(run *r, const dt_ckpt_best *best) {
    char dir[DT_PATH_MAX + 16], to[DT_PATH_MAX + 64], stamp[32];
    snprintf(dir, sizeof dir, "%s/best", r->cfg->run.dir);
    struct stat sb;
    if (lstat(dir, &sb) != 0) return DT_OK;
    dt_ckpt_state s;
    if (S_ISDIR(sb.st_mode) && best->has && dt_ckpt_verify(dir, &s) == DT_OK && s.step == best->step) return DT_OK;
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", &tm);
    snprintf(to, sizeof to, "%s/best.prev-%s", r->cfg->run.dir, stamp);
    if (rename(dir, to) != 0)
        return dt_error_set(DT_ERR_IO, "%s: cannot move it aside to %s: %s", dir, to, strerror(errno));
    dt_metrics_info(r->metrics, "moved %s aside to %s: it is not the best of the steps this run continues from", dir,
                    to);
    return DT_OK;
}

/* What changed between the config checkpoint `dir` saved (read without expanding anything)
 * and `c`, `skip` left out: the keys and values in diff ("config digest X, now Y" when the
 * saved one cannot be read). Returns how many keys differ (0 also when the digests agree). */
static int saved_config_diff(const char *dir, const dt_ckpt_state *s, const dt_config *c, const char *skip,
                             char *diff, size_t n) {
    diff[0] = '\0';
    if (dt_config_digest(c) == s->config_digest) return 0;
    char path[DT_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/config.yaml", dir);
    dt_config *saved = malloc(sizeof *saved);
    int k = saved && dt_config_load_saved(saved, path) == DT_OK ? dt_config_diff_except(saved, c, skip, diff, n) : -1;
    free(saved);
    if (k >= 0) return k; /* 0: only `skip`, or the environment behind a ${NAME}, differs */
    snprintf(diff, n, "config digest %08x, now %08x", s->config_digest, dt_config_digest(c));
    return 1;
}

/* Says what changed since the checkpoint (the config it saved vs now). */
static void report_config_change(run *r, const char *dir, const dt_ckpt_state *s) {
    char diff[1024];
    if (saved_config_diff(dir, s, r->cfg, NULL, diff, sizeof diff) > 0)
        dt_metrics_info(r->metrics, "config changed since the checkpoint: %s", diff);
    else if (dt_config_digest(r->cfg) != s->config_digest)
        dt_metrics_info(r->metrics, "config changed since the checkpoint (digest %08x, now %08x)", s->config_digest,
                        dt_config_digest(r->cfg));
}

/* Where a checkpoint stands and goes: the trainer's position and best evaluation; as_best
 * writes run.dir/best instead of checkpoints/step_N (no pruning, no fault hook). */
typedef struct ckpt_point {
    long step, epoch;
    size_t cursor;
    const dt_ckpt_best *best;
    int as_best;
} ckpt_point;

/* The others wait for rank 0's disk, not for a collective: a barrier with a deadline of its
 * own, and the launcher's idle check is told. */
#define CKPT_WAIT_S 1800.0
static dt_status wait_for_rank0(run *r) {
    if (r->world == 1) return DT_OK;
    if (r->waiting && r->rank != 0) *r->waiting = 1;
    dt_status st = dt_comm_barrier_timeout(r->comm, fmax(r->cfg->training.collective_timeout_s, CKPT_WAIT_S));
    if (r->waiting) *r->waiting = 0;
    return st;
}

/* ZeRO-1: AdamW moment `which` (0: first, 1: second) made whole for rank 0's checkpoint (every
 * rank calls it, for 0 then 1; rank 0 from inside dt_ckpt_save, when the file reaches it, hence
 * the wait for rank 0 first): placed by its owners in the gradients' buffer (free between steps)
 * and all-gathered there; *whole (when not NULL) points to it. */
static dt_status gather_moment(run *r, int which, const float **whole) {
    float *grads = dt_model_grads(r->model);
    DT_TRY(wait_for_rank0(r));
    dt_optim_place_moments(r->optim, which, grads);
    DT_TRY(gather_buckets(r, grads));
    if (whole) *whole = grads;
    return r->be->ops->check(r->be->ctx);
}

/* Pipeline stages: stage p's range of the whole layout from its share 0 of the first replica
 * (rank p * T: w holds just that range) to rank 0 (w whole), a broadcast of the job's collective
 * each; the other ranks receive into scratch. */
static dt_status stages_to_rank0(run *r, float *w, dt_status st) {
    size_t lo[DT_MAX_WORLD], hi[DT_MAX_WORLD], most = 1;
    for (int p = 1; p < r->mesh.pp; p++) {
        dt_model_stage_range(r->model, p, &lo[p], &hi[p]);
        if (hi[p] - lo[p] > most) most = hi[p] - lo[p];
    }
    /* a part at a time: the ranks that do not keep it need a part's scratch, not a stage's */
    if (most > DT_ST_PART) most = DT_ST_PART;
    float *scratch = r->rank != 0 ? dt_malloc(most * sizeof(float), "pipeline checkpoint staging") : NULL;
    if (st == DT_OK && r->rank != 0 && !scratch) st = DT_ERR_NOMEM; /* the others fail at the deadline */
    for (int p = 1; st == DT_OK && p < r->mesh.pp; p++) {
        const int root = p * r->mesh.tp;
        for (size_t e0 = lo[p]; st == DT_OK && e0 < hi[p]; e0 += DT_ST_PART) {
            const size_t k = hi[p] - e0 < DT_ST_PART ? hi[p] - e0 : DT_ST_PART;
            float *buf = r->rank == 0 ? w + e0 : r->rank == root ? w + (e0 - lo[p]) : scratch;
            st = dt_comm_broadcast(r->comm, buf, k * sizeof(float), root);
        }
    }
    free(scratch);
    return st;
}

/* dt_model_read_fn of a moment for dt_model_gather_range: from the gradients' buffer where ZeRO-1
 * gathered it (dev), else from the optimizer */
typedef struct moment_read {
    run *r;
    int which;
    const float *dev;
} moment_read;

static dt_status read_moment(void *user, size_t off, size_t n, float *dst) {
    const moment_read *mr = user;
    if (mr->dev) mr->r->be->ops->download(mr->r->be->ctx, dst, mr->dev + off, n * sizeof(float));
    else dt_optim_get_range(mr->r->optim, mr->which, off, n, dst);
    return DT_OK; /* dt_model_gather_range checks the device before it sends what was read */
}

/* Model parallelism: one of the whole model's arrays (which 0: the weights, 1 and 2: the AdamW
 * moments) for rank 0's checkpoint or final weights; every rank calls it, for a checkpoint 0, 1,
 * 2 in turn (rank 0 from inside dt_ckpt_save, as the files reach them: one array staged at a
 * time), each after a wait for rank 0 (it writes between them). With ZeRO-1 a moment's parts come
 * to the first replica first; the first replica's shares of each stage gather it to their share 0,
 * then (pipeline stages) each stage's range of the whole layout goes from there to rank 0 by a
 * broadcast of the job's collective (every rank takes part; the ranks that do not keep it receive
 * into scratch). Nothing the size of a share is staged: the gather reads each share's array a
 * window at a time (dt_model_gather_range), the broadcasts go a part at a time. *out: on rank 0
 * the array in the whole model's layout (host, dt_model_whole_params floats); on the other
 * stages' shares 0 just their stage's range of it; NULL elsewhere; freed by the caller, also on
 * failure. */
static dt_status gather_whole(run *r, int which, float **out) {
    *out = NULL;
    DT_TRY(wait_for_rank0(r));
    const int first = r->mesh.d == 0, root = first && r->mesh.t == 0; /* the first replica; its stages' shares 0 */
    moment_read mr = {r, which - 1, NULL};
    dt_status st = DT_OK;
    if (which && r->zero) st = gather_moment(r, which - 1, &mr.dev); /* every rank's parts to the first replica */
    /* rank 0 holds the whole layout; another stage's share 0 its stage's range of it */
    size_t lo = 0, hi = dt_model_whole_params(r->model);
    if (r->rank != 0 && r->mesh.pp > 1) dt_model_stage_range(r->model, r->mesh.p, &lo, &hi);
    if (root && (r->rank == 0 || r->mesh.pp > 1)) {
        *out = dt_malloc((hi - lo ? hi - lo : 1) * sizeof(float), "checkpoint staging");
        if (!*out && st == DT_OK) st = DT_ERR_NOMEM; /* the rest send */
    }
    if (st == DT_OK && first) st = dt_model_gather_range(r->model, which ? read_moment : NULL, &mr, *out, lo, hi - lo);
    return r->mesh.pp > 1 ? stages_to_rank0(r, *out, st) : st;
}

/* Array `which` (0: the weights, 1 and 2: the moments) of a checkpoint's gathering, every rank
 * in turn (rank 0 from inside dt_ckpt_save: dt_ckpt_state.gather): model parallelism gathers each
 * to rank 0's host (*held, the one before freed); ZeRO-1 alone the moments into the gradients'
 * buffer (backend memory), and not the weights (*out NULL: rank 0 writes its own). */
static dt_status save_gather(run *r, int which, float **held, const float **out) {
    free(*held);
    *held = NULL;
    *out = NULL;
    if (r->tp_comm || r->mesh.pp > 1) {
        dt_status st = gather_whole(r, which, held);
        *out = *held;
        return st;
    }
    return which ? gather_moment(r, which - 1, out) : DT_OK;
}

typedef struct gather_call {
    run *r;
    float *held;
    int called; /* arrays gathered: what rank 0 still has to join when its save fails first */
    int failed; /* a gather failed: the others stopped there, and so does rank 0 */
} gather_call;

static dt_status gather_cb(void *user, int which, const float **whole) {
    gather_call *gc = user;
    gc->called++;
    dt_status st = save_gather(gc->r, which, &gc->held, whole);
    gc->failed |= st != DT_OK;
    return st;
}

/* Rank 0 writes the checkpoint of `step` and prunes old ones; the others wait for it, so
 * that every rank agrees the checkpoint exists before anyone moves on. */
static dt_status save_checkpoint(run *r, const dt_fault *fault, int attempt, const ckpt_point *cp, char *dir, size_t n) {
    const dt_config *c = r->cfg;
    /* model parallelism, or ZeRO-1's moments: rank 0 gathers them from inside the save, the others with it */
    const int gathered = r->tp_comm || r->mesh.pp > 1 || r->zero;
    if (r->rank == 0) {
        double t0 = now_ms();
        dt_ckpt_state s = {
            .step = cp->step, .epoch = cp->epoch, .cursor = cp->cursor, .seed = c->training.seed,
            .config_digest = dt_config_digest(c), .world = r->world,
            .global_batch = (long)dt_sampler_global_batch(r->sampler), .train_samples = dt_dataset_size(r->train),
            .model = dt_model_config(r->model)->shape, .best = *cp->best,
            .lora = dt_model_config(r->model)->lora, .lora_base_digest = r->lora_base,
        };
        snprintf(s.lora_base, sizeof s.lora_base, "%s", c->model.init_from);
        gather_call gc = {r, NULL, 0, 0};
        if (gathered) {
            s.gather = gather_cb;
            s.whole_on_backend = !r->tp_comm && r->mesh.pp == 1;
            s.user = &gc;
        }
        dt_status st = (cp->as_best ? dt_ckpt_save_best : dt_ckpt_save)(c->run.dir, r->model, r->optim, &s, c, dir, n);
        const float *unused;
        for (int w = gc.called; gathered && !gc.failed && w < 3; w++) /* failed before: still join the others */
            if (save_gather(r, w, &gc.held, &unused) != DT_OK) break;
        free(gc.held);
        DT_TRY(st);
        dt_metrics_info(r->metrics, "%s: %s (%.2f s)", cp->as_best ? "best checkpoint" : "checkpoint", dir,
                        (now_ms() - t0) / 1e3);
        if (cp->as_best) goto wait;
        if (dt_ckpt_prune(c->run.dir, c->checkpoint.keep_last) != DT_OK) /* the new one is safe: go on */
            dt_metrics_info(r->metrics, "warning: could not delete an old checkpoint: %s", dt_error_msg());
        DT_TRY(dt_fault_after_checkpoint(fault, attempt, cp->step, dir));
    } else {
        float *held = NULL;
        const float *unused;
        dt_status g = DT_OK;
        for (int w = 0; gathered && g == DT_OK && w < 3; w++) g = save_gather(r, w, &held, &unused);
        free(held);
        DT_TRY(g);
        if (cp->as_best) snprintf(dir, n, "%s/best (written by rank 0)", c->run.dir);
        else snprintf(dir, n, "%s/checkpoints/step_%08ld (written by rank 0)", c->run.dir, cp->step);
    }
wait:
    return wait_for_rank0(r);
}

/* Every rank's peak memory (exact, from the kernel) into peaks[world], for the summary, and
 * the bytes all ranks sent to other hosts (`remote`: this rank's; *remote_all: the sum); and on
 * rank 0 of forked GPU workers their GPUs' peaks as the launcher sampled them (else gpu NULL). */
static dt_status gather_peak_memory(run *r, const dt_launch_ctx *l, double *peaks, double *gpu_peaks,
                                    const double **gpu, double remote, double *remote_all) {
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    double mine[2] = {(double)ru.ru_maxrss / 1024.0, remote}, all[DT_MAX_WORLD][2];
    peaks[0] = mine[0];
    *remote_all = remote;
    if (r->world > 1) {
        DT_TRY(dt_comm_allgather(r->comm, mine, sizeof mine, all));
        *remote_all = 0;
        for (int i = 0; i < r->world; i++) {
            peaks[i] = all[i][0];
            *remote_all += all[i][1];
        }
    }
    *gpu = NULL;
    for (int i = 0; l && l->stats && i < r->world; i++) {
        dt_worker_sample w = dt_worker_slot_read(&l->stats[i]);
        gpu_peaks[i] = w.has_gpu ? w.gpu_peak_mem_mb : NAN;
        if (w.has_gpu) *gpu = gpu_peaks;
    }
    return DT_OK;
}

/* Rank 0: a "workers" record whenever the launcher has published a new round of samples. */
static void log_worker_samples(run *r, const dt_launch_ctx *l, long step, uint32_t *seen) {
    if (!l || !l->stats) return;
    dt_worker_sample w[DT_MAX_WORLD];
    uint32_t newest;
    for (int i = 0; i < r->world; i++) w[i] = dt_worker_slot_read(&l->stats[i]);
    newest = w[r->world - 1].samples; /* written last: when it has round k, every rank has */
    if (newest < 1 || newest == *seen) return;
    *seen = newest;
    dt_metrics_workers(r->metrics, step, w, r->world);
}

/* Device runs with several workers: gradients and weights stay on the device and travel over
 * the backend's collective (NCCL), bootstrapped over the host one. With model parallelism each
 * group gets its own the same way, every rank making them in one order: its tensor-parallel
 * group, its pairs with the stages before and after, its pipeline's ends, then its data-parallel
 * group (groups of one kind are disjoint and the pairs resolve along each pipeline, so no rank
 * waits in an init that another has not reached). Made once the model and the optimizer have
 * their memory, so that a rank that runs out fails before the others wait in the collective's
 * init. */
static dt_status start_device_collective(run *r) {
    if (r->device_alone && !r->alone_boot) { /* the test switch: a host collective of one to bootstrap it */
        DT_TRY(dt_shm_world_create(&r->alone_world, 1, 0));
        DT_TRY(dt_comm_init_shm(&r->alone_boot, r->alone_world, 0, r->cfg->training.collective_timeout_s));
    }
    const int device = (r->plan && r->plan->device_comm) || r->device_alone;
    dt_comm **group[4] = {&r->tp_comm, &r->pp_prev, &r->pp_next, &r->pp_ends}; /* in the order every rank makes them */
    for (int i = 0; device && i < 4; i++)
        if (*group[i] && !r->group_dcomm[i]) {
            DT_TRY(r->be->ops->device_comm(r->be->ctx, *group[i], r->cfg->training.collective_timeout_s,
                                           &r->group_dcomm[i]));
            *group[i] = r->group_dcomm[i];
        }
    if (r->tp_comm) dt_model_set_tp_comm(r->model, r->tp_comm);
    /* the data-parallel group's host collective (NULL with one replica: nothing to sum) */
    dt_comm *boot = r->device_alone ? r->alone_boot : r->mesh.tp * r->mesh.pp > 1 ? r->gcomm : r->comm;
    if (device && boot && !r->dcomm) {
        DT_TRY(r->be->ops->device_comm(r->be->ctx, boot, r->cfg->training.collective_timeout_s, &r->dcomm));
        r->gcomm = r->dcomm;
        /* bf16 gradients travel through a buffer of the collective's own: sized for the largest
         * bucket now, not grown by the buckets of step 1 while the others are in flight */
        if (r->cfg->training.grad_comm_dtype == DT_WIRE_BF16) {
            size_t most = 0;
            for (int i = 0; i < dt_model_num_buckets(r->model); i++)
                if (dt_model_bucket(r->model, i)->numel > most) most = dt_model_bucket(r->model, i)->numel;
            DT_TRY(dt_comm_reserve(r->dcomm, most));
        }
    }
    return DT_OK;
}

/* ---- the training loop: a state struct and its phases, in the order they run ---- */

typedef struct trainer {
    run r;
    const dt_launch_ctx *launch; /* how this worker was started; NULL: one process */
    int attempt;                 /* 0, or k after the k-th restart */
    dt_fault fault;              /* DTRAIN_FAULT (fault.h) */
    FILE *sample_log;            /* DTRAIN_TEST_SAMPLE_LOG, or NULL */
    int perturb;                 /* DTRAIN_TEST_PERTURB_REPLICA's rank, or -1 */
    int b, T, accum, cls;        /* batch per worker, sequence length, micro-batches, classification */
    long G;                      /* global batch: world x b x accum */
    size_t spe;                  /* steps per epoch */
    float scale;                 /* 1 / rows of the global batch (chat, completion: its counted targets) */
    size_t *gidx;                /* chat, completion: the global batch's samples (G) */
    double text_tokens;          /* chat, completion: the steps' tokens that are not padding (dt_dataset_text_tokens) */
    long check_every;            /* replica check period (0: off) */
    /* where training stands: the same on every rank */
    long step, epoch, step_start, total;
    size_t cursor;               /* sample cursor within the epoch */
    int resumed;                 /* from cs, in ckpt_dir */
    dt_ckpt_state cs;
    char ckpt_dir[DT_PATH_MAX + 64]; /* the checkpoint resumed from, then the newest written */
    /* what this run has done */
    double train_ms, eval_ms, comm_ms;
    double sent_bytes; /* in the collectives of the steps trained */
    double remote_bytes; /* ... of them to other hosts */
    long checkpoints;
    uint32_t samples_seen;       /* rounds of the launcher's worker samples logged */
    dt_eval_point last_eval;
    int have_eval;
    dt_ckpt_best best;           /* checkpoint.best_metric / early stopping (saved in checkpoints) */
    int early_stop;              /* set by the evaluation that ran out of patience */
    int eval_stopped;            /* an evaluation ended early on a stop request: checkpoint, then stop */
    int no_samples;              /* logging.sample_every_steps failed once: no more samples */
    /* CPU threads under contention (adapt_threads): 0 when off */
    int threads_max, threads, threads_next;
    uint32_t foreign_seen;       /* the launcher's last round looked at */
} trainer;

static void trainer_free(trainer *t, dt_status st) {
    if (t->sample_log) fclose(t->sample_log);
    free(t->gidx);
    run_free(&t->r, st);
}

/* logging.sample_prompt must fit the model's positions and be text the tokenizer reads:
 * refused at start (exit 2) rather than at the first sample. */
static dt_status check_sample_prompt(const run *r) {
    const dt_config *c = r->cfg;
    if (c->logging.sample_every_steps <= 0) return DT_OK;
    const char *p = c->logging.sample_prompt;
    size_t n = strlen(p), cap = 0;
    uint32_t *ids = NULL;
    dt_status st = DT_OK;
    if (r->tok) {
        n = 0;
        st = dt_tokenizer_encode(r->tok, p, strlen(p), &ids, &n, &cap);
        n += dt_tokenizer_eot(r->tok) >= 0; /* the end-of-text token before it */
    }
    free(ids);
    char why[512];
    snprintf(why, sizeof why, "%s", st != DT_OK ? dt_error_msg() : n < 1 ? "empty, and the tokenizer has no "
                                                                          "end-of-text token to start from"
                                                                        : "longer than model.n_positions");
    if (st != DT_OK || n < 1 || n > (size_t)c->model.shape.n_positions)
        return dt_error_set(DT_ERR_CONFIG, "%s: logging.sample_prompt: %s (hint: a shorter prompt, or "
                            "logging.sample_every_steps: 0)", c->source[0] ? c->source : "config", why);
    return DT_OK;
}

/* The backend, model, data, sampler and metrics; the test hooks. */
static dt_status train_open(trainer *t, const dt_config *c, const dt_worker_opts *opts, dt_comm *comm) {
    memset(t, 0, sizeof *t);
    t->launch = opts ? opts->launch : NULL;
    t->attempt = t->launch ? t->launch->attempt : 0;
    DT_TRY(dt_fault_from_env(&t->fault));
    run *r = &t->r;
    DT_TRY(run_setup(r, c, comm, 1, t->launch));
    /* hierarchical (not with model parallelism: the gradients are summed over the data-parallel group) */
    if (t->launch && t->launch->grad_comm && r->mesh.tp * r->mesh.pp == 1) r->gcomm = t->launch->grad_comm;
    if (t->launch && t->launch->own_stats) { /* the launcher samples this worker's GPU from now on */
        dt_backend_desc desc;
        r->be->ops->describe(r->be->ctx, &desc);
        if (desc.bus_id[0]) dt_worker_slot_set_gpu(t->launch->own_stats, desc.bus_id);
    }
    r->waiting = t->launch ? t->launch->waiting : NULL;
    r->stop = t->launch ? t->launch->stop : NULL;
    if (c->training.adapt_cpu_threads && c->training.cpu_threads_per_worker == 0 && r->be->ops->set_threads &&
        t->launch && t->launch->foreign_round)
        t->threads = t->threads_max = dt_device_threads_per_worker(c);
    r->plan = t->launch ? t->launch->plan : NULL;
    t->b = c->data.batch_size_per_worker;
    t->T = c->data.seq_len;
    t->accum = c->training.grad_accum_steps;
    t->cls = c->model.shape.num_labels > 0;
    t->G = (long)r->dworld * t->b * t->accum;
    t->scale = 1.0f / (float)(t->G * (t->cls ? 1 : t->T));
    if (c->data.format == DT_FORMAT_CHAT || c->data.format == DT_FORMAT_COMPLETION) /* step_scale */
        t->gidx = dt_malloc((size_t)t->G * sizeof *t->gidx, "global batch indices");
    if ((c->data.format == DT_FORMAT_CHAT || c->data.format == DT_FORMAT_COMPLETION) && !t->gidx) return DT_ERR_NOMEM;
    t->check_every = r->dworld > 1 ? c->training.check_replicas_every : 0;
    t->perturb = dt_fault_perturb_replica_rank();
    t->sample_log = dt_fault_sample_log(r->rank);
    t->last_eval = (dt_eval_point){.loss = NAN, .accuracy = NAN};
    dt_sampler_cfg sc = {
        .num_samples = dt_dataset_size(r->train), .seed = c->training.seed, .shuffle = c->data.shuffle,
        .rank = r->drank, .world = r->dworld, .batch_per_worker = t->b, .accum = t->accum,
    };
    DT_TRY(dt_sampler_init(&r->sampler, &sc));
    dt_sft_stats ss;
    if ((t->spe = dt_sampler_steps_per_epoch(r->sampler)) == 0 && dt_dataset_sft_stats(r->train, &ss) && ss.no_answer)
        return dt_error_set(DT_ERR_DATA, "%s: %zu training examples, fewer than one global batch of %ld: %zu of the %zu "
                            "read were left out, their answer starting past data.seq_len (%d) tokens (hint: a larger "
                            "data.seq_len; dtrain --dry-run counts them)", c->data.train_path, dt_dataset_size(r->train),
                            t->G, ss.no_answer, ss.examples, c->data.seq_len);
    if (t->spe == 0)
        return dt_error_set(DT_ERR_DATA,
                            "%s: %zu training examples, fewer than one global batch of %ld (hint: lower "
                            "data.batch_size_per_worker, training.grad_accum_steps or training.num_workers)",
                            c->data.train_path, dt_dataset_size(r->train), t->G);
    DT_TRY(check_sample_prompt(r));
    dt_metrics_cfg mcfg = {.run_dir = c->run.dir, .rank = r->rank, .total_steps = total_steps(c, t->spe),
                           .log_every = c->logging.every_steps, .progress = opts ? opts->progress : -1,
                           .quiet = opts ? opts->quiet : 0, .tensorboard = c->logging.tensorboard};
    return dt_metrics_open(&r->metrics, &mcfg);
}

/* A finished run given a changed config would only evaluate again and exit 0: a sweep that
 * forgot to change run.dir would silently do nothing. That is refused (exit 2), naming the
 * changed keys (run.dir aside: a moved directory is the same run) and the ways out; the
 * same command unchanged still evaluates again. */
static dt_status refuse_changed_finished(const trainer *t) {
    const run *r = &t->r;
    const dt_config *c = r->cfg;
    char diff[1024];
    if (!t->resumed || t->step < t->total ||
        saved_config_diff(t->ckpt_dir, &t->cs, c, "run.dir", diff, sizeof diff) == 0)
        return DT_OK; /* a moved run directory is the same run */
    return dt_error_set(DT_ERR_CONFIG,
                        "%s: this run is finished (step %ld of %ld, checkpoint %s) and the config changed since: %s "
                        "(hint: a new run needs a new run.dir, e.g. --set run.dir=runs/NAME; to train this one again "
                        "from the start: --set checkpoint.resume=never; the unchanged config only evaluates again)",
                        c->run.dir, t->step, t->total, t->ckpt_dir, diff);
}

/* Where training stands: the newest valid checkpoint (the same on every rank), or the start;
 * and the step it ends at. */
static dt_status resume_point(trainer *t) {
    run *r = &t->r;
    const dt_config *c = r->cfg;
    DT_TRY(find_resume(r, t->attempt, t->ckpt_dir, sizeof t->ckpt_dir, &t->cs, &t->resumed));
    if (t->resumed) {
        DT_TRY(dt_ckpt_check_shape(&t->cs, &dt_model_config(r->model)->shape, t->ckpt_dir));
        DT_TRY(dt_ckpt_check_lora(&t->cs, &dt_model_config(r->model)->lora, t->ckpt_dir));
        DT_TRY(dt_ckpt_check_tokenizer(&t->cs, c, t->ckpt_dir));
    }
    t->step = t->resumed ? t->cs.step : 0;
    t->epoch = t->resumed ? t->cs.epoch : 0;
    t->cursor = t->resumed ? t->cs.cursor : 0;
    if (dt_sampler_steps_from(r->sampler, t->cursor) == 0) { /* the saved epoch has no whole batch left */
        t->epoch++;
        t->cursor = 0;
    }
    t->step_start = t->step;
    if (t->resumed) t->best = t->cs.best;
    t->total = c->training.max_steps > 0 ? c->training.max_steps
               : t->epoch < c->training.epochs
                   ? t->step + (long)dt_sampler_steps_from(r->sampler, t->cursor) +
                         (c->training.epochs - t->epoch - 1) * (long)t->spe
                   : t->step;
    if (t->total < t->step || t->best.stopped_early) t->total = t->step; /* an early stop finished the run */
    DT_TRY(refuse_changed_finished(t));
    dt_metrics_set_total(r->metrics, t->total);
    return DT_OK;
}

/* Once the run is accepted (its resume point, and the weights it starts from: model.lora's base
 * checked against the checkpoint's), rank 0 writes its config into run.dir and sets aside what is
 * not its history: a refused run leaves run.dir as it was, the config of its weights included. */
static dt_status accept_run(trainer *t) {
    run *r = &t->r;
    if (r->rank != 0) return DT_OK;
    DT_TRY(write_resolved_config(r->cfg));
    DT_TRY(set_aside_other_history(r, t->resumed ? &t->cs : NULL, t->ckpt_dir));
    return set_aside_stale_best(r, &t->best);
}

/* Model parallelism: the gradients that this rank's part of the whole model's norm counts, given
 * to the optimizer: of what it updates (with ZeRO-1 its parts), the split tensors, the ones every
 * share holds whole on share 0 only, and not the last stage's copy of a tied embedding (the first
 * stage's counts). Adjacent ranges merged. Without model parallelism the optimizer's own ranges. */
static dt_status count_norm(run *r) {
    if (!r->tp_comm && r->mesh.pp <= 1) return DT_OK;
    const dt_range all = {0, dt_model_num_params(r->model)};
    const dt_range *own = r->zero ? r->own : &all;
    const int n_own = r->zero ? r->n_own : 1, nt = dt_model_num_tensors(r->model);
    size_t toff, tn;
    dt_model_tied_grad(r->model, &toff, &tn);
    dt_range *out = dt_malloc((size_t)(n_own + 1) * (size_t)(nt + 1) * sizeof *out, "gradient norm ranges");
    if (!out) return DT_ERR_NOMEM;
    int n = 0;
    for (int k = 0; k < n_own; k++)
        for (int i = 0; i < nt; i++) {
            const dt_tensor_info *ti = dt_model_tensor(r->model, i);
            if ((ti->split == DT_SPLIT_NONE && r->mesh.t != 0) || (tn && r->mesh.p != 0 && ti->offset == toff)) continue;
            const size_t lo = own[k].offset, hi = lo + own[k].numel;
            const size_t a = ti->offset > lo ? ti->offset : lo, b = ti->offset + ti->numel < hi ? ti->offset + ti->numel : hi;
            if (b <= a) continue;
            if (n && out[n - 1].offset + out[n - 1].numel == a) out[n - 1].numel += b - a;
            else out[n++] = (dt_range){a, b - a};
        }
    dt_status st = dt_optim_count_norm(r->optim, out, n);
    free(out);
    return st;
}

/* AdamW over the model's tensors (decay where the architecture says: its >= 2-D ones), scheduled to the last step. */
static dt_status make_optimizer(trainer *t) {
    run *r = &t->r;
    const dt_config *c = r->cfg;
    const int nt = dt_model_num_tensors(r->model);
    dt_param_seg *segs = dt_malloc((size_t)nt * sizeof *segs, "optimizer segments");
    if (!segs) return DT_ERR_NOMEM;
    for (int i = 0; i < nt; i++) {
        const dt_tensor_info *ti = dt_model_tensor(r->model, i);
        segs[i] = (dt_param_seg){ti->offset, ti->numel, ti->decay};
    }
    dt_optim_cfg oc = {
        .lr = c->optimizer.lr, .weight_decay = c->optimizer.weight_decay, .beta1 = c->optimizer.beta1,
        .beta2 = c->optimizer.beta2, .eps = c->optimizer.eps, .grad_clip = c->optimizer.grad_clip,
        .schedule = c->optimizer.schedule, .warmup_steps = c->optimizer.warmup_steps, .total_steps = t->total,
        .min_lr_ratio = c->optimizer.min_lr_ratio,
    };
    if (!r->zero) {
        dt_status st = dt_optim_init(&r->optim, &oc, r->be, dt_model_num_params(r->model), segs, nt);
        free(segs);
        return st == DT_OK ? count_norm(r) : st;
    }
    /* ZeRO-1: this rank's part of every bucket, in the buckets' (the layout's) order */
    const int nb = dt_model_num_buckets(r->model);
    dt_range *own = dt_malloc((size_t)nb * sizeof *own, "optimizer shard");
    int n_own = 0;
    dt_status st = own ? DT_OK : DT_ERR_NOMEM;
    for (int i = 0; st == DT_OK && i < nb; i++) {
        const dt_bucket *bk = dt_model_bucket(r->model, i);
        size_t lo, hi;
        dt_comm_part(bk->numel, r->dworld, r->drank, &lo, &hi);
        if (hi > lo) own[n_own++] = (dt_range){bk->offset + lo, hi - lo};
    }
    if (st == DT_OK)
        st = dt_optim_init_shard(&r->optim, &oc, r->be, dt_model_num_params(r->model), segs, nt, own, n_own);
    r->own = own; /* kept: the gradient norm's parts (count_norm) */
    r->n_own = n_own;
    free(segs);
    return st == DT_OK ? count_norm(r) : st;
}

/* The weights config key `key` names (model.init_from: the model's, with model.lora its frozen
 * base; model.lora.init_from: adapters, a PEFT directory's or a file), said in the log. */
static dt_status load_weights(trainer *t, const char *key, const char *from, int adapters) {
    run *r = &t->r;
    int score_loaded = 1;
    char path[DT_PATH_MAX + 96];
    dt_status st = DT_OK;
    if (adapters) dt_infer_adapters_path(from, path, sizeof path);
    else st = dt_infer_weights_path(from, r->rank == 0 ? stderr : NULL, path, sizeof path);
    if (st == DT_OK) st = (adapters ? dt_model_load_adapters : dt_model_load)(r->model, path, &score_loaded);
    if (st != DT_OK) {
        dt_error_prefix("%s", key);
        return st;
    }
    const int cls = dt_model_config(r->model)->shape.num_labels > 0;
    dt_metrics_info(r->metrics, "%s %s%s", adapters ? key : "init_from", path,
                    score_loaded || !cls ? ""
                    : adapters       ? " (no score.weight: the classification head stays model.init_from's or the seed's)"
                                     : " (no score.weight in the file: classification head initialised from the seed)");
    return DT_OK;
}

/* The checkpoint's weights and moments, or model.init_from's, or the seed's (init); then
 * rank 0's copy on every rank, over the collective that carries the gradients. With model.lora
 * the frozen base is model.init_from's (or the seed's) on every rank, resumed or not, and must
 * be the one the checkpoint's adapters were trained on; only the adapters come from rank 0. */
static dt_status initial_weights(trainer *t) {
    run *r = &t->r;
    const dt_config *c = r->cfg;
    const int lora = dt_model_config(r->model)->lora.rank > 0;
    if (c->model.init_from[0] && (lora || !t->resumed)) DT_TRY(load_weights(t, "model.init_from", c->model.init_from, 0));
    if (lora) DT_TRY(dt_model_frozen_digest_stages(r->model, r->comm, &r->lora_base)); /* every rank */
    const int was16 = t->cs.lora.base_bf16, is16 = dt_model_config(r->model)->lora.base_bf16;
    if (t->resumed && lora && t->cs.lora_base_digest != r->lora_base)
        return dt_error_set(DT_ERR_CONFIG, "%s: its adapters were trained on the base %s%s (digest %08x), but "
                            "model.init_from %s%s gives digest %08x: refusing to apply them to another model (hint: "
                            "restore model.init_from%s, or start fresh with checkpoint.resume: never)", t->ckpt_dir,
                            t->cs.lora_base[0] ? t->cs.lora_base : "initialised from the seed", was16 ? " in bf16" : "",
                            t->cs.lora_base_digest, c->model.init_from[0] ? c->model.init_from : "(none: the seed's)",
                            is16 ? " in bf16" : "", r->lora_base,
                            was16 != is16 ? (was16 ? " and model.lora.base_dtype: bf16" : " and model.lora.base_dtype: fp32")
                                          : "");
    if (t->resumed) DT_TRY(dt_ckpt_load(t->ckpt_dir, r->model, r->optim));
    else if (lora && c->model.lora_init_from[0])
        DT_TRY(load_weights(t, "model.lora.init_from", c->model.lora_init_from, 1));
    DT_TRY(start_device_collective(r));
    if (r->dworld > 1) /* the replicas of each share */
        DT_TRY(dt_comm_broadcast(r->gcomm, dt_model_params(r->model), dt_model_num_params(r->model) * sizeof(float), 0));
    dt_model_params_changed(r->model);
    return DT_OK;
}

/* The backend, the model and the collectives, for the log. */
static void report_setup(trainer *t) {
    run *r = &t->r;
    const dt_model_cfg *mc = dt_model_config(r->model);
    const dt_ops *ops = r->be->ops;
    char params[32], flops[32], how[96] = "", prec[32] = "";
    dt_model_cfg whole = *mc; /* model parallelism: the model's, not this share's or stage's */
    whole.tp = whole.pp = 1;
    whole.tp_rank = whole.pp_rank = 0;
    const size_t n_whole = dt_model_count_params(&whole), n_train = dt_model_count_trainable(&whole);
    const size_t n_here = dt_model_num_params(r->model) + dt_model_num_frozen(r->model); /* this rank's */
    human_count(params, sizeof params, (double)n_whole);
    human_count(flops, sizeof flops, dt_model_flops_per_token(&whole));
    const char *bf = r->cfg->training.grad_comm_dtype == DT_WIRE_BF16 ? " (bf16 gradients)" : "";
    if (r->zero) snprintf(how, sizeof how, ", %s reduce-scatter + all-gather%s", dt_comm_backend(r->gcomm), bf);
    else if (r->reduces) snprintf(how, sizeof how, ", %s all-reduce%s", dt_comm_backend(r->gcomm), bf);
    dt_backend_desc desc;
    ops->describe(r->be->ctx, &desc);
    const int bf16 = ops->bf16(r->be->ctx);
    if (ops->memory) snprintf(prec, sizeof prec, " (%s)", bf16 ? "bf16 matmuls" : "fp32");
    dt_metrics_info(r->metrics, "dtrain: %s on %s%s, %d worker%s x %s%s | run dir %s",
                    t->cls ? "classification" : "language modelling", ops->name, prec, r->world, r->world > 1 ? "s" : "",
                    desc.per_worker, how, r->cfg->run.dir);
    if (ops->memory) {
        const double all = (double)device_memory_bytes(ops, mc, bf16, r->dworld, r->zero,
                                                       r->dworld > 1 || r->device_alone, /* the test switch's one */
                                                       r->cfg->training.grad_comm_dtype == DT_WIRE_BF16);
        char parts[256];
        memory_parts(parts, sizeof parts, mc, all, r->dworld, r->zero);
        dt_metrics_info(r->metrics, "rank %d: %s; estimated %.2f GiB of %s per worker (%s; batch %d)", r->rank,
                        desc.device, all / (1u << 30), ops->memory, parts, t->b);
    }
    dt_metrics_info(r->metrics, "model: %d layers, %d heads, n_embd %d, seq_len %d, vocab %d | %s params, %s FLOPs/token",
                    mc->shape.n_layer, mc->shape.n_head, mc->shape.n_embd, mc->seq_len, mc->shape.vocab_size, params, flops);
    if (mc->lora.rank) {
        char names[256], fr[32];
        human_count(params, sizeof params, (double)n_train);
        human_count(fr, sizeof fr, (double)(n_whole - n_train));
        dt_metrics_info(r->metrics, "model.lora: rank %d, alpha %g on %s: %s trainable parameters (%.2f%%), %s frozen "
                        "(no gradients, no AdamW state, not all-reduced%s)", mc->lora.rank, mc->lora.alpha,
                        dt_lora_targets_str(mc->lora.targets, names, sizeof names), params,
                        100.0 * (double)n_train / (double)n_whole, fr, mc->lora.base_bf16 ? "; its matrices kept in bf16" : "");
    }
    if (r->tp_comm) {
        char share[32];
        human_count(share, sizeof share, (double)n_here);
        dt_metrics_info(r->metrics, "training.tensor_parallel %d: %d replica%s x %d shares; rank %d is share %d of replica "
                        "%d and holds %s parameters (%.1f%%); each layer sums its activations twice forward and twice "
                        "backward over %s", r->mesh.tp, r->mesh.dp, r->mesh.dp > 1 ? "s" : "", r->mesh.tp, r->rank,
                        r->mesh.t, r->mesh.d, share,
                        100.0 * (double)n_here / (double)n_whole, dt_comm_backend(r->tp_comm));
    }
    if (r->mesh.pp > 1) {
        int lo, hi;
        dt_model_stage_layers(dt_model_config(r->model), r->mesh.p, &lo, &hi);
        dt_metrics_info(r->metrics, "training.pipeline_parallel %d: rank %d is stage %d (layers %d-%d); the stage "
                        "boundaries pass to its neighbours over %s", r->mesh.pp, r->rank, r->mesh.p, lo, hi - 1,
                        dt_comm_backend(r->pp_prev ? r->pp_prev : r->pp_next));
    }
    if (r->zero)
        dt_metrics_info(r->metrics, "training.zero_stage 1: rank %d updates %zu of %zu parameters; its AdamW state is "
                        "%.1f MB, not %.1f MB", r->rank, dt_optim_moment_floats(r->optim), dt_model_num_params(r->model),
                        2.0 * (double)dt_optim_moment_floats(r->optim) * sizeof(float) / 1e6,
                        2.0 * (double)dt_model_num_params(r->model) * sizeof(float) / 1e6);
    else if (r->cfg->training.zero_stage == 1 && r->rank == 0)
        dt_metrics_info(r->metrics, "training.zero_stage 1 with one worker: nothing to shard, its AdamW state is whole");
    if (t->launch && t->launch->launched_by) dt_metrics_info(r->metrics, "%s", t->launch->launched_by);
    char note[320];
    if (r->rank == 0 && t->launch && !t->launch->launched_by && dt_backend_unused_note(r->dev, r->world, note, sizeof note))
        dt_metrics_info(r->metrics, "%s", note);
    if (r->world > 1 && r->plan) {
        char plan[512];
        dt_comm_plan_describe(r->plan, plan, sizeof plan);
        dt_metrics_info(r->metrics, "collectives: %s", plan);
    }
    char advice[512];
    if (dt_device_blas_advice(advice, sizeof advice)) dt_metrics_info(r->metrics, "%s", advice);
}

/* Classification texts longer than the model sees are cut: say how many, so that a seq_len
 * too small for the data is not a silent loss of accuracy. */
static void report_truncated(run *r, const char *which, const dt_dataset *ds) {
    size_t cut = ds ? dt_dataset_num_truncated(ds) : 0;
    if (!cut) return;
    size_t n = dt_dataset_size(ds);
    const int limit = r->tok ? r->cfg->data.seq_len : r->cfg->data.seq_len - 1;
    dt_metrics_info(r->metrics, "data: %zu of %zu %s examples (%.1f%%) are longer than data.seq_len%s = %d %s and "
                    "were cut to it (hint: a larger data.seq_len keeps more of each text)",
                    cut, n, which, 100.0 * (double)cut / (double)(n ? n : 1), r->tok ? "" : " - 1", limit,
                    r->tok ? "tokens" : "bytes");
}

/* The data and where training starts from, for the log. */
static void report_start(trainer *t) {
    run *r = &t->r;
    const dt_ckpt_state *cs = &t->cs;
    const size_t n_train = dt_dataset_size(r->train);
    report_setup(t);
    char sets[64 * DT_MAX_VAL_SETS] = "";
    size_t n_val = r->n_val ? dt_dataset_size(r->val[0]) : 0;
    for (int i = 1; i < r->n_val; i++) n_val += dt_dataset_size(r->val[i]);
    for (int i = 0, k = 0; r->cfg->data.n_val_sets && i < r->n_val && k < (int)sizeof sets; i++)
        k += snprintf(sets + k, sizeof sets - (size_t)k, "%s%s %zu", i ? ", " : " (", dt_config_val_name(r->cfg, i),
                      dt_dataset_size(r->val[i]));
    if (sets[0]) snprintf(sets + strlen(sets), sizeof sets - strlen(sets), ")");
    const int packed = dt_dataset_packed(r->train);
    dt_metrics_info(r->metrics, "data: %zu train %s (%zu steps/epoch at global batch %ld = %d x %d x %d), "
                    "%zu val %s%s | %ld steps", n_train, packed ? "rows" : "examples", t->spe, t->G, r->dworld, t->b,
                    t->accum, n_val, packed ? "rows" : "examples", sets, t->total);
    dt_sft_stats ss;
    if (packed && dt_dataset_sft_stats(r->train, &ss))
        dt_metrics_info(r->metrics, "data.packing: %zu train examples packed into %zu rows of %d: padding %.1f%% of "
                        "their tokens (one example a row: %.1f%%)", ss.examples - ss.no_answer, ss.rows,
                        r->cfg->data.seq_len, 100.0 * ss.padding_packed, 100.0 * ss.padding);
    report_truncated(r, "train", r->train);
    for (int i = 0; i < r->n_val; i++)
        report_truncated(r, r->cfg->data.n_val_sets ? dt_config_val_name(r->cfg, i) : "val", r->val[i]);
    if (r->rank == 0) { /* the settings next to the plots */
        char *text = NULL;
        size_t len = 0;
        FILE *mem = open_memstream(&text, &len);
        if (mem) {
            dt_config_print(r->cfg, mem);
            if (fclose(mem) == 0) dt_metrics_config_text(r->metrics, text);
        }
        free(text);
    }
    if (t->resumed) {
        dt_metrics_resume(r->metrics, cs->step, t->ckpt_dir, t->attempt);
        dt_metrics_info(r->metrics, "resumed from %s: step %ld, epoch %ld, sample %zu of the epoch%s", t->ckpt_dir,
                        cs->step, cs->epoch + 1, cs->cursor, t->attempt > 0 ? " (after a restart)" : "");
        if (cs->global_batch != t->G)
            dt_metrics_info(r->metrics, "elastic resume: global batch %ld (%d worker%s at save) -> %ld (%d now); the "
                            "epoch continues at the saved sample cursor",
                            cs->global_batch, cs->world, cs->world > 1 ? "s" : "", t->G, r->world);
        if (cs->train_samples != n_train)
            dt_metrics_info(r->metrics, "warning: the training set has %zu examples, %zu at save: the sample order "
                            "differs from the interrupted run",
                            n_train, cs->train_samples);
        report_config_change(r, t->ckpt_dir, cs);
    }
    if (t->step >= t->total && t->total > 0)
        dt_metrics_info(r->metrics, "nothing to train: step %ld of %ld is already done", t->step, t->total);
}

/* Chat and completion data: the loss is the mean over the answer's tokens of the whole global
 * batch (every rank's, every micro-batch's), as one worker with the whole batch takes it, so 1
 * and N workers and any accumulation make the same update. Each rank counts them from the
 * sampler's order: no collective. Every example has one at least (sft.h). */
static void step_scale(trainer *t) {
    if (!t->gidx) return;
    dt_sampler_global_at(t->r.sampler, t->epoch, t->cursor, t->gidx);
    long n = 0;
    for (long i = 0; i < t->G; i++) {
        n += dt_dataset_counted(t->r.train, t->gidx[i]);
        t->text_tokens += dt_dataset_text_tokens(t->r.train, t->gidx[i]);
    }
    t->scale = 1.0f / (float)n;
}

/* Micro-batch a of the step into the host batch (logged for DTRAIN_TEST_SAMPLE_LOG). */
static dt_status step_batch(trainer *t, int a) {
    run *r = &t->r;
    dt_sampler_batch_at(r->sampler, t->epoch, t->cursor, a, r->idx);
    if (t->sample_log) {
        for (int i = 0; i < t->b; i++) fprintf(t->sample_log, "%ld %zu\n", t->epoch, r->idx[i]);
        fflush(t->sample_log);
    }
    DT_TRY(fill_batch(r, r->train, r->idx, t->b));
    r->len_sum += (double)dt_model_length(r->model) * t->b;
    r->len_rows += t->b;
    return DT_OK;
}

/* Forward and backward over the step's micro-batches (gradients accumulate); the buckets of
 * the last backward are all-reduced as they finish. Nothing waits for the device: the loss stays
 * there (dt_model_forward_train) until train_step reads it; *rows counts the rows in it. */
static dt_status micro_batches(trainer *t, long *rows, double *comm_ms, double *fwd_ms, double *bwd_ms) {
    run *r = &t->r;
    dt_model_zero_grad(r->model);
    step_scale(t);
    *rows = 0;
    const int phases = r->cfg->logging.phase_times;
    for (int a = 0; a < t->accum; a++) {
        DT_TRY(step_batch(t, a));
        long n;
        double p0 = now_ms();
        DT_TRY(dt_model_forward_train(r->model, r->tokens, r->targets, t->b, t->scale, &n));
        if (phases) DT_TRY(r->be->ops->check(r->be->ctx)); /* the device's time too */
        double p1 = now_ms();
        *fwd_ms += p1 - p0;
        const int sync = r->reduces && a == t->accum - 1; /* reduce during the last backward only */
        dt_status st = dt_model_backward(r->model, t->scale, sync ? on_bucket_ready : NULL, r);
        if (st == DT_OK && phases) st = r->be->ops->check(r->be->ctx);
        *bwd_ms += now_ms() - p1;
        if (sync) {
            const double w0 = now_ms();
            dt_status w = wait_buckets(r);
            *comm_ms += exposed_since(r, w0);
            if (st == DT_OK) st = w;
        }
        DT_TRY(st);
        *rows += n;
    }
    return DT_OK;
}

/* ---- pipeline stages ---- */

/* Micro-batch i's forward into activation set i % K (its input already there on a stage but the
 * first); *rows counts the rows in its loss. */
static dt_status stage_forward(trainer *t, int i, int K, long *rows, double *fwd_ms) {
    run *r = &t->r;
    const double p0 = now_ms();
    dt_model_use_acts(r->model, i % K);
    DT_TRY(step_batch(t, i));
    long n;
    DT_TRY(dt_model_forward_train(r->model, r->tokens, r->targets, t->b, t->scale, &n));
    *rows += n;
    *fwd_ms += now_ms() - p0;
    return DT_OK;
}

/* Micro-batch j's backward from set j % K (from the gradient already in dt_model_stage_grad on a
 * stage but the last); the last one's buckets start their sums as they finish. */
static dt_status stage_backward(trainer *t, int j, int K, double *bwd_ms) {
    run *r = &t->r;
    const double p0 = now_ms();
    dt_model_use_acts(r->model, j % K);
    const int sync = r->reduces && j == t->accum - 1;
    DT_TRY(dt_model_backward(r->model, t->scale, sync ? on_bucket_ready : NULL, r));
    *bwd_ms += now_ms() - p0;
    return DT_OK;
}

/* Pipeline parallelism: the step's micro-batches through the stages in Megatron-LM's 1F1B order.
 * Stage p of P runs min(P - p - 1, M) forwards first, then a forward and a backward in turn, then
 * the backwards left, keeping at most min(P - p, M) micro-batches' activations (sets i % K); the
 * activations go forward and their gradients back between neighbours, and the steps of the two
 * that meet are one exchange (so neither waits for the other's send: the pairs' orders match).
 * Then the tied embedding's two gradients are summed (first and last stage) before its bucket's
 * sum over the replicas starts, and the buckets are waited for. */
static dt_status pipeline_batches(trainer *t, long *rows, double *comm_ms, double *fwd_ms, double *bwd_ms) {
    run *r = &t->r;
    const int P = r->mesh.pp, p = r->mesh.p, M = t->accum, B = t->b;
    const int warm = P - p - 1 < M ? P - p - 1 : M, rest = M - warm, K = dt_mesh_in_flight(P, p, M);
    dt_model_zero_grad(r->model);
    step_scale(t);
    *rows = 0;
    double q0; /* the steps between stages count as the collectives' time (a stage waiting for its neighbour too) */
#define P2P(call) (q0 = now_ms(), st = (call), *comm_ms += now_ms() - q0, st)
    dt_status st;
    for (int i = 0; i < warm; i++) {
        dt_model_use_acts(r->model, i % K);
        DT_TRY(P2P(recv_forward(r, B)));
        DT_TRY(stage_forward(t, i, K, rows, fwd_ms));
        DT_TRY(P2P(send_forward(r, B)));
    }
    if (rest > 0) {
        dt_model_use_acts(r->model, warm % K);
        DT_TRY(P2P(recv_forward(r, B)));
    }
    for (int j = 0; j < rest; j++) {
        const int i = warm + j;
        DT_TRY(stage_forward(t, i, K, rows, fwd_ms));
        DT_TRY(P2P(exchange(r, r->pp_next, dt_model_stage_output(r->model), dt_model_stage_grad(r->model), B)));
        DT_TRY(stage_backward(t, j, K, bwd_ms));
        if (j == rest - 1) {
            DT_TRY(P2P(send_backward(r, B)));
        } else {
            float *grad = dt_model_stage_grad(r->model); /* shared by the sets */
            dt_model_use_acts(r->model, (i + 1) % K);
            DT_TRY(P2P(exchange(r, r->pp_prev, grad, dt_model_stage_input(r->model), B)));
        }
    }
    for (int j = rest; j < M; j++) {
        DT_TRY(P2P(recv_backward(r, B)));
        DT_TRY(stage_backward(t, j, K, bwd_ms));
        DT_TRY(P2P(send_backward(r, B)));
    }
#undef P2P
    size_t off, n;
    dt_model_tied_grad(r->model, &off, &n);
    const double w0 = now_ms();
    st = n ? dt_comm_allreduce(r->pp_ends, dt_model_grads(r->model) + off, n, DT_REDUCE_SUM) : DT_OK;
    if (r->embed_held) {
        if (st == DT_OK) on_bucket_ready(r, 0);
        r->embed_held = 0;
    }
    dt_status w = r->reduces ? wait_buckets(r) : DT_OK;
    *comm_ms += now_ms() - w0;
    return st != DT_OK ? st : w;
}

/* What this worker has sent in collectives (remote: to other hosts only): the gradients' and
 * the host's, when they differ. */
static uint64_t bytes_sent(run *r, int remote) {
    uint64_t (*count)(dt_comm *) = remote ? dt_comm_bytes_remote : dt_comm_bytes_sent;
    uint64_t b = r->gcomm ? count(r->gcomm) : 0;
    if (r->comm && r->comm != r->gcomm) b += count(r->comm);
    if (r->tp_comm) b += count(r->tp_comm); /* the activations' sums */
    dt_comm *pp[] = {r->pp_prev, r->pp_next, r->pp_ends}; /* pipeline stages: activations, gradients, the tied sum */
    for (int i = 0; i < 3; i++)
        if (pp[i]) b += count(pp[i]);
    return b;
}

/* Model parallelism: this rank's part of the whole model's gradients' sum of squares (`mine`,
 * over the ranges count_norm gave the optimizer). With ZeRO-1 or pipeline stages that part
 * travels with the agreement (summed over every rank: without ZeRO-1 the first replica's alone);
 * else the shares' parts are all-gathered (one double each) and summed in share order into *total. */
static dt_status shares_sumsq(run *r, double mine, double *total) {
    if (r->zero || r->mesh.pp > 1) {
        *total = r->zero || r->mesh.d == 0 ? mine : 0.0;
        return DT_OK;
    }
    double all[DT_MAX_WORLD];
    DT_TRY(dt_comm_allgather(r->tp_comm, &mine, sizeof mine, all));
    *total = 0;
    for (int i = 0; i < r->mesh.tp; i++) *total += all[i];
    return DT_OK;
}

/* One optimizer step: the micro-batches, the agreement of every rank (agree.h: loss, stop,
 * device failure), the update, and the sample cursor moved on. *p describes it. */
static dt_status train_step(trainer *t, dt_train_point *p, int *stop) {
    run *r = &t->r;
    const uint64_t sent0 = bytes_sent(r, 0), remote0 = bytes_sent(r, 1);
    dt_fault_before_step(&t->fault, r->rank, t->attempt, t->step + 1);
    const double t0 = now_ms();
    double comm_ms = 0, fwd_ms = 0, bwd_ms = 0;
    const double tp0 = dt_model_tp_ms(r->model);
    dt_agree_vote v = {0};
    DT_TRY((r->mesh.pp > 1 ? pipeline_batches : micro_batches)(t, &v.rows, &comm_ms, &fwd_ms, &bwd_ms));
    comm_ms += dt_model_tp_ms(r->model) - tp0; /* tensor parallelism: the activations' sums, inside forward and backward */
    v.stop = t->launch && t->launch->stop && *t->launch->stop; /* the launcher's flag: SIGINT/SIGTERM */
    float *params = dt_model_params(r->model), *grads = dt_model_grads(r->model);
    /* the step's one wait for the device: the gradients' sum of squares and the loss, queued, then
     * read with the device's failure, if any (llm.c reads its loss once a step too) */
    const double q0 = now_ms();
    dt_optim_norm(r->optim, grads);
    dt_model_loss_fetch(r->model);
    v.device = r->be->ops->check(r->be->ctx);
    v.loss = dt_model_loss_fetched(r->model);
    double sumsq = dt_optim_norm_sumsq(r->optim);
    const int agreed = r->zero || r->mesh.pp > 1; /* the norm is the sum of the ranks' parts: it travels with the agreement */
    if (r->tp_comm || r->mesh.pp > 1) { /* agreed: this rank's part */
        DT_TRY(shares_sumsq(r, sumsq, &sumsq));
        if (r->mesh.t != 0 || r->mesh.p != r->mesh.pp - 1) { /* the shares of one replica saw the same rows: one of */
            v.loss = 0;                                      /* them counts them, on the stage with the loss */
            v.rows = 0;
        }
    }
    v.sumsq = agreed ? sumsq : 0;
    const double sumsq_ms = now_ms() - q0; /* the optimizer's, for logging.phase_times */
    double w0 = now_ms();
    DT_TRY(dt_agree_step(r->comm, t->step + 1, &v));
    if (r->world > 1) comm_ms += now_ms() - w0;
    *stop = v.stop;
    double gnorm, lr;
    const int phases = r->cfg->logging.phase_times;
    const double o0 = now_ms();
    DT_TRY(dt_optim_update(r->optim, params, grads, t->step, agreed ? v.sumsq : sumsq, &gnorm, &lr));
    if (phases) DT_TRY(r->be->ops->check(r->be->ctx)); /* the update done on the device */
    const double opt_ms = sumsq_ms + now_ms() - o0; /* the weights' all-gather below is comm_ms's */
    if (r->zero) {
        w0 = now_ms();
        DT_TRY(gather_buckets(r, params)); /* every rank's updated part to every rank */
        comm_ms += exposed_since(r, w0);
        dt_model_params_changed(r->model);
    }
    const long batch_epoch = t->epoch;
    t->step++;
    t->cursor += (size_t)t->G;
    if (dt_sampler_steps_from(r->sampler, t->cursor) == 0) {
        t->epoch++;
        t->cursor = 0;
    }
    const double ms = now_ms() - t0;
    t->train_ms += ms;
    t->comm_ms += comm_ms;
    const double sent = (double)(bytes_sent(r, 0) - sent0);
    t->sent_bytes += sent;
    t->remote_bytes += (double)(bytes_sent(r, 1) - remote0);
    *p = (dt_train_point){.step = t->step, .epoch = batch_epoch + 1, .loss = v.loss / (double)v.rows, .lr = lr,
                          .grad_norm = gnorm, .step_ms = ms,
                          .tokens_per_s = (double)t->G * t->T / (ms / 1e3), .comm_ms = comm_ms, .sent_bytes = sent,
                          .fwd_ms = phases ? fwd_ms : NAN, .bwd_ms = phases ? bwd_ms : NAN,
                          .opt_ms = phases ? opt_ms : NAN};
    return DT_OK;
}

/* logging.profile_step that this run will not reach, or on a backend without a profiler range:
 * said once at start instead of silently profiling nothing */
static void note_profile_step(const trainer *t) {
    const long want = t->r.cfg->logging.profile_step;
    if (!want || !t->r.metrics) return;
    if (!t->r.be->ops->profile)
        dt_metrics_info(t->r.metrics, "note: logging.profile_step %ld: the %s backend has no profiler range; nothing "
                        "is profiled", want, t->r.be->ops->name);
    else if (want <= t->step || want > t->total)
        dt_metrics_info(t->r.metrics, "note: logging.profile_step %ld is outside the steps this run trains (%ld..%ld): "
                        "nothing is profiled", want, t->step + 1, t->total);
}

/* logging.profile_step: the profiler's range starts and ends with the device idle, so that it
 * holds one step's work and nothing queued before or after it */
static dt_status profile_range(run *r, int on) {
    const dt_ops *o = r->be->ops;
    if (!o->profile) return DT_OK;
    DT_TRY(o->check(r->be->ctx));
    o->profile(r->be->ctx, on);
    return o->check(r->be->ctx);
}

/* CPU workers with automatic threads (training.cpu_threads_per_worker 0, adapt_cpu_threads):
 * when other processes keep cores busy, the threads that oversubscribe the cores wait for
 * each other at every OpenMP barrier (a step on 2 cores with one busy process took 4.3x its
 * time alone, 11x at p90); so each worker takes its share of the cores the others leave,
 * round((cores - busy elsewhere) / workers), between 1 and what it had alone: fewer at the
 * first of the launcher's rounds that asks for it, more again after two rounds in a row;
 * results do not change with it (ops.h set_threads). */
static void adapt_threads(trainer *t) {
    if (!t->threads_max) return;
    const uint32_t round = atomic_load(t->launch->foreign_round);
    if (round == 0 || round == t->foreign_seen) return;
    t->foreign_seen = round;
    const double foreign = atomic_load(t->launch->foreign_mcores) / 1000.0;
    run *r = &t->r;
    long want = lround(((double)dt_device_cpu_cores() - foreign) / r->world);
    want = want < 1 ? 1 : want > t->threads_max ? t->threads_max : want;
    if (want == t->threads) {
        t->threads_next = 0;
        return;
    }
    if (want > t->threads && want != t->threads_next) { /* more threads: once is not yet a trend */
        t->threads_next = (int)want;
        return;
    }
    r->be->ops->set_threads(r->be->ctx, (int)want);
    dt_metrics_info(r->metrics, "note: other processes keep %.1f of the %d cores busy: %ld thread%s per worker from step "
                    "%ld (was %d; training.cpu_threads_per_worker fixes the count)", foreign, dt_device_cpu_cores(),
                    want, want > 1 ? "s" : "", t->step, t->threads);
    t->threads = (int)want;
    t->threads_next = 0;
}

/* The value checkpoint.best_metric names (val_loss when none) in evaluation e, and whether
 * lower is better. */
static double best_value(const dt_config *c, const dt_eval_point *e, int *lower) {
    *lower = c->checkpoint.best_metric == DT_BEST_NONE || c->checkpoint.best_metric == DT_BEST_LOSS;
    if (c->checkpoint.best_metric == DT_BEST_ACCURACY) return e->accuracy;
    if (c->checkpoint.best_metric != DT_BEST_F1) return e->loss;
    if (!e->confusion) return NAN;
    dt_class_score sc[DT_MAX_CLASS_METRICS];
    double macro;
    dt_class_scores(e->confusion, e->num_labels, sc, &macro);
    return macro;
}

static const char *best_name(const dt_config *c) {
    static const char *const names[] = {"val_loss", "val_loss", "val_accuracy", "val_f1"};
    return names[c->checkpoint.best_metric];
}

/* After an evaluation: a new best is kept in run.dir/best (checkpoint.best_metric), and
 * training.early_stopping_patience evaluations in a row without one end training. Every rank
 * sees the same (all-reduced) evaluation, so every rank decides the same. */
static dt_status track_best(trainer *t) {
    const dt_config *c = t->r.cfg;
    if (c->checkpoint.best_metric == DT_BEST_NONE && c->training.early_stopping_patience == 0) return DT_OK;
    int lower;
    const double v = best_value(c, &t->last_eval, &lower);
    const int better = isfinite(v) && (!t->best.has || (lower ? v < t->best.value : v > t->best.value));
    if (!better) {
        t->best.evals_since++;
        if (c->training.early_stopping_patience > 0 && t->best.evals_since >= c->training.early_stopping_patience &&
            t->step < t->total) {
            t->early_stop = t->best.stopped_early = 1;
            dt_metrics_info(t->r.metrics, "early stopping at step %ld: %s has not improved for %d evaluations (best "
                            "%.6g at step %ld; training.early_stopping_patience: %d)", t->step, best_name(c),
                            t->best.evals_since, t->best.value, t->best.step, c->training.early_stopping_patience);
        }
        return DT_OK;
    }
    t->best = (dt_ckpt_best){.has = 1, .value = v, .step = t->step};
    if (c->checkpoint.best_metric == DT_BEST_NONE) return DT_OK;
    char dir[DT_PATH_MAX + 64];
    const ckpt_point cp = {t->step, t->epoch, t->cursor, &t->best, 1};
    dt_metrics_info(t->r.metrics, "new best %s %.6g at step %ld", best_name(c), v, t->step);
    return save_checkpoint(&t->r, &t->fault, t->attempt, &cp, dir, sizeof dir);
}

typedef struct sample_text {
    char buf[4096];
    size_t n;
} sample_text;

/* The bytes of a generated token, made printable on one line: \n, \t and other control bytes
 * escaped (text up to the buffer's end). */
static void sample_emit(void *user, const char *bytes, size_t n) {
    sample_text *s = user;
    for (size_t i = 0; i < n && s->n + 5 < sizeof s->buf; i++) {
        const unsigned char c = (unsigned char)bytes[i];
        if (c == '\n') s->n += (size_t)snprintf(s->buf + s->n, sizeof s->buf - s->n, "\\n");
        else if (c == '\t') s->n += (size_t)snprintf(s->buf + s->n, sizeof s->buf - s->n, "\\t");
        else if (c < 0x20 || c == 0x7f) s->n += (size_t)snprintf(s->buf + s->n, sizeof s->buf - s->n, "\\x%02x", c);
        else s->buf[s->n++] = (char)c;
    }
    s->buf[s->n] = '\0';
}

/* logging.sample_every_steps: rank 0 prints what the language model writes after
 * logging.sample_prompt (sampled at temperature 1 with the seed training.seed + step, so a
 * run's samples repeat; the weights are only read). With model parallelism the shares and
 * stages of the first replica generate it together (each gets the whole row of logits: the
 * same tokens). */
static dt_status print_sample(trainer *t) {
    const dt_config *c = t->r.cfg;
    if (c->logging.sample_every_steps <= 0 || t->step % c->logging.sample_every_steps != 0 || t->r.mesh.d != 0)
        return DT_OK;
    sample_text out = {.n = 0};
    out.buf[0] = '\0';
    dt_gen_opts o = {.prompt = c->logging.sample_prompt, .prompt_len = strlen(c->logging.sample_prompt),
                     .max_new_tokens = c->logging.sample_tokens, .temperature = 1.0, .top_p = 1.0,
                     .seed = c->training.seed + (uint64_t)t->step, .stop_id = -1, .pp_prev = t->r.pp_prev,
                     .pp_next = t->r.pp_next};
    dt_gen_result res;
    if (t->no_samples) return DT_OK;
    dt_status st = dt_generate(t->r.model, t->r.tok, &o, sample_emit, &out, &res);
    if (t->r.rank != 0) { /* a share or stage of rank 0's: its part is done (a failure there is rank 0's too) */
        t->no_samples = st != DT_OK;
        return DT_OK;
    }
    if (st != DT_OK) { /* a sample is worth no training run: say why, and train on without */
        dt_metrics_info(t->r.metrics, "warning: no sample at step %ld, nor later ones: %s", t->step, dt_error_msg());
        t->no_samples = 1;
        return DT_OK;
    }
    sample_text prompt = {.n = 0};
    sample_emit(&prompt, o.prompt, o.prompt_len);
    if (o.prompt_len) dt_metrics_info(t->r.metrics, "sample at step %ld (after \"%s\"): %s", t->step, prompt.buf, out.buf);
    else dt_metrics_info(t->r.metrics, "sample at step %ld (a new document): %s", t->step, out.buf);
    return DT_OK;
}

/* An evaluation at the current step, logged and kept for the summary. One that a stop request
 * ends early sets t->eval_stopped and is neither logged nor kept (a set evaluated whole before
 * it still is). */
static dt_status eval_now(trainer *t) {
    dt_eval_point e;
    DT_TRY(evaluate(&t->r, t->step, 0, &e, &t->eval_stopped));
    t->eval_ms += e.eval_ms;
    if (t->eval_stopped) return DT_OK;
    t->last_eval = e;
    t->have_eval = 1;
    dt_metrics_eval(t->r.metrics, &t->last_eval);
    for (int i = 1; i < t->r.n_val; i++) { /* the other sets: logged under their names, compared by nothing */
        DT_TRY(evaluate(&t->r, t->step, i, &e, &t->eval_stopped));
        t->eval_ms += e.eval_ms;
        if (t->eval_stopped) break;
        dt_metrics_eval(t->r.metrics, &e);
    }
    return track_best(t);
}

/* After a step: metrics, the loss check, the replica check, evaluation and checkpoint when
 * due (a stop request checkpoints at once; evaluation waits for the next run, and one under
 * way when the request comes ends after its current batch). */
static dt_status after_step(trainer *t, const dt_train_point *p, int stop) {
    run *r = &t->r;
    const dt_config *c = r->cfg;
    const long step = t->step;
    dt_metrics_train(r->metrics, p);
    if (r->rank == 0) log_worker_samples(r, t->launch, step, &t->samples_seen);
    adapt_threads(t);
    if (!isfinite(p->loss))
        return dt_error_set(DT_ERR_INTERNAL, "step %ld: loss is %g (hint: lower optimizer.lr)", step, p->loss);
    if (t->check_every > 0 && step % t->check_every == 0) {
        if (t->perturb == r->rank && step == t->check_every) { /* the test hook: this replica must be caught */
            float *last = dt_model_params(r->model) + dt_model_num_params(r->model) - 1, p0; /* in the check's last part */
            r->be->ops->download(r->be->ctx, &p0, last, sizeof p0);
            p0 += 1e-3f;
            r->be->ops->upload(r->be->ctx, last, &p0, sizeof p0);
        }
        DT_TRY(check_replicas(r, step));
    }
    DT_TRY(print_sample(t));
    const int last = step == t->total;
    if (r->n_val && (!stop || last) && (last || (c->eval.every_steps > 0 && step % c->eval.every_steps == 0)))
        DT_TRY(eval_now(t));
    if (last || stop || t->eval_stopped || t->early_stop ||
        (c->checkpoint.every_steps > 0 && step % c->checkpoint.every_steps == 0)) {
        const ckpt_point cp = {step, t->epoch, t->cursor, &t->best, 0};
        DT_TRY(save_checkpoint(r, &t->fault, t->attempt, &cp, t->ckpt_dir, sizeof t->ckpt_dir));
        t->checkpoints++;
    }
    return DT_OK;
}

/* The end: the summary of a stop (a checkpoint was written), or of a finished run (a final
 * evaluation if none ran, then the weights). A stop request during that evaluation makes it a
 * stop: the weights wait for the rerun, which evaluates again. */
static dt_status finish(trainer *t, int stopped) {
    run *r = &t->r;
    if (!stopped && r->n_val && !t->have_eval) { /* nothing was trained: still report where the model stands */
        DT_TRY(eval_now(t));
        stopped = t->eval_stopped;
    }
    const long steps_run = t->step - t->step_start;
    dt_run_summary sum = {
        .verb = stopped ? "stopped" : "done", .steps = steps_run, .first_step = t->step_start, .last_step = t->step,
        .samples = steps_run * t->G, .checkpoints = t->checkpoints, .tokens = (double)t->G * t->T * (double)steps_run,
        .train_s = t->train_ms / 1e3, .eval_s = t->eval_ms / 1e3, .comm_s = t->comm_ms / 1e3,
        .sent_bytes = t->sent_bytes, .workers = r->world,
        .val_loss = NAN, .val_accuracy = NAN, .val_f1_macro = NAN,
        .text_tokens = NAN, .padding = NAN, .padding_unpacked = NAN,
        .seq_len = r->cfg->data.seq_len, /* row_len: only where rows were cut */
        .row_len = r->len_rows > 0 && r->len_sum < r->len_rows * r->cfg->data.seq_len ? r->len_sum / r->len_rows : NAN,
    };
    dt_sft_stats ss;
    if (t->gidx && dt_dataset_sft_stats(r->train, &ss)) {
        sum.text_tokens = t->text_tokens;
        sum.padding = dt_dataset_packed(r->train) ? ss.padding_packed : ss.padding;
        sum.padding_unpacked = ss.padding;
    }
    double peaks[DT_MAX_WORLD], gpu_peaks[DT_MAX_WORLD];
    if (stopped) {
        DT_TRY(gather_peak_memory(r, t->launch, peaks, gpu_peaks, &sum.peak_gpu_mb, t->remote_bytes, &sum.remote_bytes));
        sum.peak_rss_mb = peaks;
        dt_metrics_final(r->metrics, &sum);
        dt_metrics_summary(r->metrics, "stopped at step %ld of %ld (asked to stop); checkpoint %s", t->step, t->total,
                           t->ckpt_dir);
        if (r->rank == 0 && t->launch && t->launch->note)
            snprintf(t->launch->note, t->launch->note_size, "stopped at step %ld of %ld with a checkpoint in %s", t->step,
                     t->total, t->ckpt_dir);
        return DT_OK;
    }
    /* the last collective comes before rank 0's save: nobody waits on its disk */
    DT_TRY(gather_peak_memory(r, t->launch, peaks, gpu_peaks, &sum.peak_gpu_mb, t->remote_bytes, &sum.remote_bytes));
    char weights[DT_PATH_MAX + 32];
    snprintf(weights, sizeof weights, "%s/model.safetensors", r->cfg->run.dir);
    if (r->mesh.pp > 1) { /* every rank helps rank 0 */
        float *w = NULL;
        dt_status st = gather_whole(r, 0, &w);
        if (st == DT_OK && r->rank == 0) st = dt_model_save_whole(r->model, w, weights);
        free(w);
        DT_TRY(st);
    } else if (r->rank < r->mesh.tp) {
        DT_TRY(dt_model_save(r->model, weights)); /* rank 0, with its shares' help */
    }
    sum.peak_rss_mb = peaks;
    if (t->have_eval) {
        sum.val_loss = t->last_eval.loss;
        sum.val_accuracy = t->last_eval.accuracy;
        if (t->last_eval.confusion) {
            dt_class_score sc[DT_MAX_CLASS_METRICS];
            dt_class_scores(t->last_eval.confusion, t->last_eval.num_labels, sc, &sum.val_f1_macro);
        }
    }
    dt_metrics_final(r->metrics, &sum);
    const dt_config *c = r->cfg;
    if (t->best.stopped_early)
        dt_metrics_summary(r->metrics, "stopped early at step %ld of %ld: %s did not improve for %d evaluations in a "
                           "row (training.early_stopping_patience)", t->step, total_steps(c, t->spe), best_name(c),
                           c->training.early_stopping_patience);
    if (c->checkpoint.best_metric != DT_BEST_NONE && t->best.has)
        dt_metrics_summary(r->metrics, "best: %s %.6g at step %ld, weights in %s/best", best_name(c), t->best.value,
                           t->best.step, c->run.dir);
    if (r->rank == 0) dt_metrics_summary(r->metrics, "weights: %s", weights);
    return DT_OK;
}

dt_status dt_worker_train(const dt_config *c, const dt_worker_opts *opts, dt_comm *comm) {
    trainer *t = dt_malloc(sizeof *t, "trainer");
    if (!t) return DT_ERR_NOMEM;
    dt_status st = train_open(t, c, opts, comm);
    if (st == DT_OK) st = resume_point(t);
    if (st == DT_OK) st = make_optimizer(t);
    if (st == DT_OK) st = initial_weights(t);
    if (st == DT_OK) st = accept_run(t);
    if (st == DT_OK) report_start(t);
    if (st == DT_OK) note_profile_step(t);
    int stop = 0;
    while (st == DT_OK && t->step < t->total && !stop && !t->early_stop) {
        dt_train_point p;
        const int profiled = c->logging.profile_step == t->step + 1;
        if (profiled) st = profile_range(&t->r, 1);
        if (st == DT_OK) st = train_step(t, &p, &stop);
        if (st == DT_OK && profiled) st = profile_range(&t->r, 0);
        if (st == DT_OK) st = after_step(t, &p, stop);
        stop |= t->eval_stopped;
    }
    /* a stop at the last step is a finished run, unless it cut the final evaluation short */
    if (st == DT_OK) st = finish(t, stop && (t->step < t->total || t->eval_stopped));
    trainer_free(t, st);
    free(t);
    return st;
}

typedef struct launch_arg {
    const dt_config *cfg;
    dt_worker_opts opts;
} launch_arg;

/* runs in each worker, forked or started by someone else */
static dt_status launched_worker(void *arg, dt_comm *comm, const dt_launch_ctx *ctx) {
    launch_arg *a = arg;
    dt_worker_opts o = a->opts;
    o.launch = ctx;
    return dt_worker_train(a->cfg, &o, comm);
}

/* The collective plan's inputs for this config: the device backend it resolves to, started by
 * `env` (NULL: forked on this host). */
static dt_status plan_in(const dt_config *c, const dt_ext_env *env, dt_device_kind *dev, dt_comm_plan_in *in) {
    DT_TRY(dt_backend_resolve(c, dev));
    const dt_ops *ops = dt_backend_ops(*dev);
    dt_launch_plan_in(c->training.comm, c->source, env, c->training.num_workers, ops->name, ops->collective, in);
    in->hier = c->training.hierarchical_allreduce;
    in->zero_stage = c->training.zero_stage;
    return DT_OK;
}

dt_status dt_worker_launch(const dt_config *c, const dt_worker_opts *opts, dt_launch_result *res) {
    dt_device_kind dev;
    dt_comm_plan_in in;
    dt_comm_plan plan;
    DT_TRY(plan_in(c, NULL, &dev, &in));
    DT_TRY(dt_comm_plan_decide(&in, &plan));
    DT_TRY(dt_backend_check_workers(c, dev, c->training.num_workers));
    DT_TRY(dt_worker_prepare_run_dir(c));
    launch_arg arg = {.cfg = c};
    if (opts) arg.opts = *opts;
    dt_launch_cfg lc = {.world = c->training.num_workers, .plan = &plan, .timeout_s = c->training.collective_timeout_s,
                        .log_dir = c->run.dir, .what = "training", .max_restarts = c->fault_tolerance.max_restarts,
                        .backoff_s = c->fault_tolerance.backoff_s, .clean_stop = 1,
                        .monitor_every_s = c->logging.monitor_every_s, .tp = c->training.tensor_parallel,
                        .pp = c->training.pipeline_parallel};
    return dt_launch_run(&lc, launched_worker, &arg, res);
}

static dt_status prepare_run_dir_cb(void *cfg) { return dt_worker_prepare_run_dir(cfg); }

dt_status dt_worker_launch_external(const dt_config *cfg, const dt_ext_env *e, const dt_worker_opts *opts,
                                    dt_launch_result *res) {
    dt_config *c = dt_malloc(sizeof *c, "config");
    if (!c) return DT_ERR_NOMEM;
    *c = *cfg;
    /* every rank computes the digest of the config as given, before the world size is set */
    const uint32_t digest = dt_config_digest(c);
    char shown[64];
    if (e->world != c->training.num_workers && e->rank == 0)
        printf("note: %s started %d workers; training.num_workers (%s) is ignored\n", e->source, e->world,
               dt_config_shown(c, "training.num_workers", shown, sizeof shown));
    c->training.num_workers = e->world;
    if (c->training.cpu_threads_per_worker == 0) {
        /* the host's cores shared by its workers, unless the launcher pinned this process to
         * its own share already (mpirun and srun --cpus-per-task do) */
        int mine = dt_device_cpu_cores();
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        int t = mine < online ? mine : mine / (e->local_world > 0 ? e->local_world : 1);
        c->training.cpu_threads_per_worker = t > 0 ? t : 1;
    }
    dt_device_kind dev;
    dt_launch_ext_cfg ec = {.env = e, .digest = digest, .timeout_s = c->training.collective_timeout_s,
                            .before_ok = prepare_run_dir_cb, .user = c, .tp = c->training.tensor_parallel,
                            .pp = c->training.pipeline_parallel};
    dt_status st = plan_in(c, e, &dev, &ec.plan);
    launch_arg arg = {.cfg = c};
    if (opts) arg.opts = *opts;
    if (st == DT_OK) st = dt_launch_external(&ec, launched_worker, &arg, res);
    else memset(res, 0, sizeof *res);
    free(c);
    return st;
}

/* dtrain eval's lines for one set: the loss and accuracy, and a classifier's per-class scores. */
static void print_eval(const char *weights, const dt_eval_point *e) {
    char label[48] = "";
    if (e->set) snprintf(label, sizeof label, " [%s]", e->set);
    printf("eval %s%s | val loss %.17g | val accuracy %.6f | %ld examples | %.1f s\n", weights, label, e->loss,
           e->accuracy, e->examples, e->eval_ms / 1e3);
    if (!e->confusion) return;
    dt_class_score sc[DT_MAX_CLASS_METRICS];
    double macro;
    dt_class_scores(e->confusion, e->num_labels, sc, &macro);
    printf("macro-F1 %.6f\n", macro);
    for (int k = 0; k < e->num_labels; k++) {
        printf("  class %d: precision %.6f recall %.6f f1 %.6f support %ld | predicted as 0..%d:", k, sc[k].precision,
               sc[k].recall, sc[k].f1, sc[k].support, e->num_labels - 1);
        for (int j = 0; j < e->num_labels; j++) printf(" %ld", e->confusion[k * e->num_labels + j]);
        putchar('\n');
    }
}

dt_status dt_worker_eval(const dt_config *c, const char *weights, dt_eval_point *out) {
    run r;
    dt_status st = run_setup(&r, c, NULL, 0, NULL);
    if (st != DT_OK) goto done;
    if (!r.n_val) {
        st = dt_error_set(DT_ERR_CONFIG, "%s: data.val_path: required for evaluation (hint: --set data.val_path=FILE)",
                          c->source[0] ? c->source : "config");
        goto done;
    }
    int score_loaded = 1;
    if ((st = dt_infer_load_weights(c, r.model, weights, &score_loaded)) != DT_OK) goto done;
    if (!score_loaded && c->model.shape.num_labels > 0) {
        st = dt_error_set(DT_ERR_DATA, "%s: tensor score.weight is missing: the file has no classification head to evaluate",
                          weights);
        goto done;
    }
    for (int i = 0; i < r.n_val; i++) { /* each set; *out: the first's */
        dt_eval_point e;
        int stopped; /* never: no stop flag */
        if ((st = evaluate(&r, 0, i, &e, &stopped)) != DT_OK) goto done;
        print_eval(weights, &e);
        if (i == 0) *out = e;
    }
    out->confusion = NULL; /* it lives in the run, freed below */
    out->set = NULL;
done:
    run_free(&r, st);
    return st;
}
