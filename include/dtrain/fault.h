/* fault.h — fault injection and every other test-only hook, in one place: each makes the
 * real binary misbehave (or report) in a chosen way so that tests can prove recovery and
 * detection. All are inert when their environment variable is unset; nothing else in src/
 * reads a DTRAIN_TEST_* variable.
 *
 * Fault injection: makes one worker fail in a chosen way at a chosen step.
 *
 *   DTRAIN_FAULT="rank=R,step=S,kind=K[,attempt=A|any]"
 *
 * kinds: kill                SIGKILL itself
 *        exit                exit with status 3 and no message (an unexplained crash)
 *        hang                SIGSTOP itself (the others reach the collective deadline)
 *        corrupt-checkpoint  flip one byte of model.safetensors in the checkpoint of step S
 * kill/exit/hang fire when rank R is about to start step S (1-based: S-1 steps are done and
 * checkpointed); corrupt-checkpoint right after the checkpoint of step S is written (by
 * rank 0, whatever R says). Only in launch attempt A (default 0, the first), so a restarted
 * run goes on; attempt=any fires in every attempt (to exhaust the restarts). */
#ifndef DTRAIN_FAULT_H
#define DTRAIN_FAULT_H

#include <stdio.h>

#include "dtrain/status.h"

typedef enum {
    DT_FAULT_NONE = 0,
    DT_FAULT_KILL,
    DT_FAULT_EXIT,
    DT_FAULT_HANG,
    DT_FAULT_CORRUPT_CKPT,
} dt_fault_kind;

#define DT_FAULT_ANY_ATTEMPT (-1)

typedef struct dt_fault {
    dt_fault_kind kind;   /* NONE when DTRAIN_FAULT is unset or empty */
    int rank;
    long step;
    int attempt;          /* or DT_FAULT_ANY_ATTEMPT */
} dt_fault;

/* Parses `spec` (NULL or "" -> kind NONE). DT_ERR_USAGE naming the bad field. */
dt_status dt_fault_parse(const char *spec, dt_fault *out);
/* dt_fault_parse(getenv("DTRAIN_FAULT")). */
dt_status dt_fault_from_env(dt_fault *out);

/* Before step `step` (1-based) of `attempt` on `rank`: kills, exits or stops the calling
 * process when a kill/exit/hang fault is due; returns otherwise. */
void dt_fault_before_step(const dt_fault *f, int rank, int attempt, long step);
/* After the checkpoint of `step` was written into `ckpt_dir` (rank 0): flips a byte of its
 * model.safetensors when a corrupt-checkpoint fault is due. */
dt_status dt_fault_after_checkpoint(const dt_fault *f, int attempt, long step, const char *ckpt_dir);

/* ---- the other test-only hooks ----
 * DTRAIN_TEST_BREAK_ALLREDUCE=<rank>: that rank of the shm collective adds 1.0 to element 0
 * of every all-reduce result it copies back (so that the doctor's self-test and the replica
 * check can prove they catch a bad collective). Returns 1 for that rank (and says so on
 * stderr), else 0. */
int dt_fault_break_allreduce(int rank);
/* DTRAIN_TEST_DEVICE_COMM=1: one worker on a device backend still sends its gradients and
 * weights through the backend's collective (NCCL), as with several: the real bucket path
 * runs on a one-GPU machine (gpu-check.sh) and on the mock GPU. Says so on stderr once. */
int dt_fault_device_comm_alone(void);
/* DTRAIN_TEST_PERTURB_REPLICA=<rank>: that rank nudges its last parameter right before the first
 * replica check, which must catch it. Returns the rank, or -1. */
int dt_fault_perturb_replica_rank(void);
/* DTRAIN_TEST_SAMPLE_LOG=<dir>: every rank appends "epoch index" of each training sample it
 * uses to <dir>/samples-rank-N.txt. Returns that file opened for appending, or NULL. */
FILE *dt_fault_sample_log(int rank);

#endif
