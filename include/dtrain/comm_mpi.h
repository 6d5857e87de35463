/* comm_mpi.h — the `mpi` collective backend (built when Open MPI's development files are
 * found; DTRAIN_HAVE_MPI). For CPU workers started by mpirun or srun, on one machine or
 * several: the same interface as shm (comm.h), every wait with a deadline. */
#ifndef DTRAIN_COMM_MPI_H
#define DTRAIN_COMM_MPI_H

#include <stddef.h>

#include "dtrain/comm.h"
#include "dtrain/status.h"

/* MPI_Init_thread (MPI_THREAD_SERIALIZED; groups: MPI_THREAD_MULTIPLE, for communicators of
 * model-parallel groups, each with its own thread) unless already done; *rank and *world from
 * MPI_COMM_WORLD. */
dt_status dt_mpi_init(int *rank, int *world, int groups);
/* MPI_Finalize when exit_code is 0, else MPI_Abort with it (the others may be waiting in a
 * collective); nothing when MPI was never initialised. */
void dt_mpi_finalize(int exit_code);
/* The --version line: the MPI library found at run time next to the one built with; returns
 * 1 on a mismatch. Callable before MPI_Init. */
int dt_mpi_version(char *buf, size_t n);
/* A communicator over MPI_COMM_WORLD (after dt_mpi_init). */
dt_status dt_comm_init_mpi(dt_comm **out, double timeout_s);
/* A communicator of the ranks that give the same color (MPI_Comm_split: every rank of the job
 * calls it, in the same order), ranked by key; color < 0: this rank is in none (*out NULL).
 * After dt_mpi_init with groups. */
dt_status dt_comm_init_mpi_split(dt_comm **out, int color, int key, double timeout_s);

#endif
