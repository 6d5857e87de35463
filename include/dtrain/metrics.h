/* metrics.h — what a run tells its user: console lines (a progress bar on a terminal,
 * plain parseable lines otherwise), train.log (the console without the bar) and
 * metrics.jsonl (one JSON object per training step and per evaluation) in the run dir —
 * all from rank 0 only — and rank-N.log, the same lines, from every rank.
 *
 * metrics.jsonl fields:
 *   {"type":"train","step":S,"epoch":E,"loss":L,"lr":LR,"grad_norm":G,"step_ms":MS,"tokens_per_s":TPS}
 *   {"type":"eval","step":S,"val_loss":L,"val_accuracy":A,"val_examples":N,"eval_ms":MS}
 *   (classification also "val_f1_macro", "val_classes":[{"label","precision","recall","f1","support"}, ...]
 *   and "val_confusion":[[row of label 0: counts by predicted label], ...])
 *   {"type":"resume","step":S,"checkpoint":DIR,"attempt":K}  (training continues after step S;
 *   train lines after it supersede earlier ones with the same step, e.g. after a restart)
 *   {"type":"workers","step":S,"workers":[{"rank":R,"pid":P,"cpu_pct":C,"rss_mb":M,"peak_rss_mb":PM},...]}
 *   (a GPU worker's record adds "gpu" (NVML index), "gpu_util_pct", "gpu_mem_mb", "gpu_mem_total_mb",
 *   "gpu_temp_c", "gpu_power_w" (null when the GPU does not report them) and "gpu_peak_mem_mb")
 *   {"type":"summary","status":"done"|"stopped","steps":N,"first_step":F,"last_step":L,"train_s":T,
 *    "eval_s":E,"samples":S,"tokens":K,"samples_per_s":..,
 *    "tokens_per_s":..,"workers":W,"comm_s":C,"comm_share":F,"val_loss":L,"val_accuracy":A,
 *    "peak_rss_mb":[per rank],"checkpoints":N,"sent_bytes_per_step":B,"comm_ms_per_step":M
 *    [,"remote_bytes_per_step":R][,"text_tokens_per_s":X,"padding_share":P,"padding_share_unpacked":U]
 *    [,"row_len":N]}
 *   (X, P, U: chat and completion data, dt_run_summary's text_tokens and padding shares;
 *    N: data.pad_to longest, the positions rank 0's training rows ran at, on average;
 *    R: what all ranks together sent to other hosts, when any did; C and M: rank 0's comm_ms,
 *    summed and per step) (GPU workers: also "peak_gpu_mem_mb":[per rank])
 * train lines also carry "comm_ms": the step's exposed communication, the time it waited for
 * collectives that compute did not hide: the gradient buckets still in flight once backward was
 * done (with nccl, measured on the device: dt_comm_last_exposed_ms; with host collectives, the
 * host's wait, as their backward runs on the host), the per-step agreement, and with
 * zero_stage 1 the weights' all-gather (0 with one worker),
 * and "sent_bytes": what the worker sent in the step's collectives (dt_comm_bytes_sent); with
 * logging.phase_times also "fwd_ms", "bwd_ms" and "opt_ms".
 * With tensorboard on, the same numbers go to an events.out.tfevents.* file in the run dir
 * (tags train/..., val/..., worker/rankN/...).
 * (val_accuracy: classification accuracy, or next-token accuracy for language modelling).
 * Every line is flushed when written, so a crash loses nothing already reported. */
#ifndef DTRAIN_METRICS_H
#define DTRAIN_METRICS_H

#include "dtrain/status.h"

typedef struct dt_metrics dt_metrics;

typedef struct dt_metrics_cfg {
    const char *run_dir;  /* NULL: console only (no files) */
    int rank;             /* 0 speaks on the console and writes train.log/metrics.jsonl */
    long total_steps;
    long log_every;       /* a console line every N steps (and the first and last) */
    int progress;         /* -1 auto (bar when stdout is a terminal), 0 never, 1 always */
    int quiet;            /* only errors and the final summary on the console */
    int tensorboard;      /* rank 0 also writes TensorBoard events */
} dt_metrics_cfg;

typedef struct dt_train_point {
    long step;            /* 1-based */
    long epoch;           /* 1-based */
    double loss, lr, grad_norm, step_ms, tokens_per_s;
    double comm_ms;       /* exposed communication in this step (see "comm_ms" above) */
    double sent_bytes;    /* what this worker sent in this step's collectives (dt_comm_bytes_sent) */
    double fwd_ms, bwd_ms, opt_ms; /* logging.phase_times: forward, backward, optimizer (norm, clip,
                                      AdamW; the collectives' waits are comm_ms); NaN otherwise
                                      (left out of the record) */
} dt_train_point;

/* The end of a run, for the console summary and the "summary" line. */
typedef struct dt_run_summary {
    const char *verb;               /* "done" or "stopped" */
    long steps, samples, checkpoints; /* in this run (after a resume: since the checkpoint) */
    long first_step, last_step;     /* steps first_step+1 .. last_step were trained here */
    double tokens, train_s, eval_s, comm_s;
    double sent_bytes;              /* rank 0's collectives in the steps trained (dt_comm_bytes_sent) */
    double remote_bytes;            /* every rank's to other hosts, together (dt_comm_bytes_remote) */
    int workers;
    double val_loss, val_accuracy;  /* NaN: no evaluation */
    double val_f1_macro;            /* NaN: no evaluation, or not classification */
    const double *peak_rss_mb;      /* (workers) */
    /* chat and completion data (else NaN or 0: no such line): the steps' tokens of text (not padding), and the share
     * of the training rows' tokens that are padding, as trained and with one example a row */
    double text_tokens, padding, padding_unpacked;
    int seq_len;                    /* data.seq_len */
    double row_len;                 /* data.pad_to longest: rank 0's training rows' length on average, where some
                                       were cut (else NaN or 0: no such line) */
    const double *peak_gpu_mb;      /* (workers) the most device memory in use at the launcher's NVML
                                       samples of each worker's GPU, NaN: none; NULL: no GPU workers */
} dt_run_summary;

/* Classification metrics are kept for at most this many labels (the confusion matrix). */
#define DT_MAX_CLASS_METRICS 64

typedef struct dt_eval_point {
    long step;
    double loss, accuracy;
    long examples;
    double eval_ms;
    int num_labels;          /* > 0: classification with `confusion` */
    const long *confusion;   /* (num_labels x num_labels): [label][predicted] counts; NULL: none */
    const char *set;         /* the validation set's name when data.val_path names several (its
                                record gets "set", its TensorBoard tags val/NAME/..., its console
                                line [NAME]); NULL: the one set, logged as val/... */
} dt_eval_point;

typedef struct dt_class_score {
    double precision, recall, f1; /* 0 where undefined (nothing predicted, or no examples), as scikit-learn */
    long support;                 /* examples with this label */
} dt_class_score;

/* Per-class precision, recall and F1 from a confusion matrix ([label][predicted], nl x nl), and
 * their unweighted mean (macro-F1) in *macro_f1. */
void dt_class_scores(const long *confusion, int nl, dt_class_score *out, double *macro_f1);

/* Opens run_dir/rank-N.log and, on rank 0, run_dir/metrics.jsonl and run_dir/train.log for
 * appending (the directory must exist). dt_metrics_close accepts NULL. */
dt_status dt_metrics_open(dt_metrics **out, const dt_metrics_cfg *cfg);
void dt_metrics_close(dt_metrics *m);
/* Changes the step count the bar and the lines show (known only after a resume). */
void dt_metrics_set_total(dt_metrics *m, long total_steps);

/* A line for the console (unless quiet) and train.log. */
void dt_metrics_info(dt_metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Like info but printed even when quiet. */
void dt_metrics_summary(dt_metrics *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dt_metrics_train(dt_metrics *m, const dt_train_point *p);
void dt_metrics_eval(dt_metrics *m, const dt_eval_point *p);
/* One round of worker samples (monitor.h): a "workers" line, TensorBoard scalars, and a
 * console line at most every 30 s. */
struct dt_worker_sample;
void dt_metrics_workers(dt_metrics *m, long step, const struct dt_worker_sample *w, int n);

/* Evaluation's progress on the bar (a terminal only; at most 10 redraws a second): `done` of
 * `total` batches after `elapsed_s` seconds. The eval line that follows replaces it. */
void dt_metrics_eval_progress(dt_metrics *m, long done, long total, double elapsed_s);

/* The run's resolved config (dt_config_print's text) into TensorBoard's Text tab, tag
 * "config" (rank 0, when TensorBoard is on), so that a run's settings are seen next to its plots. */
void dt_metrics_config_text(dt_metrics *m, const char *config_text);
/* The final summary: console lines (also when quiet) and the "summary" line. */
void dt_metrics_final(dt_metrics *m, const dt_run_summary *s);
/* A resume from a checkpoint (attempt: 0, or k after the k-th restart). */
void dt_metrics_resume(dt_metrics *m, long step, const char *checkpoint, int attempt);

#endif
