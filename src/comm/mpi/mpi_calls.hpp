// SPDX-License-Identifier: BSD-3-Clause
#pragma once
// Blocking MPI calls outside the Communicator class, under the watchdog's
// deadline: the agreements on errors and on each step, the checkpoint's
// phase agreements, the barriers and the reductions of the report. Each is
// entered in the collective ledger (on a communicator named 'mesh' for the
// mesh's Cartesian one, 'world' for the world's ranks, 'mpi' otherwise) with `what`, its purpose, so a hang's
// diagnosis says which of them a rank waits in ("'world' #12 (all_reduce:
// the step agreement, 4 B)"). `what` must be static text.
//
// With a CollectiveWatchdog alive, the call is issued non-blocking and
// waited for under comm.timeout_s (a blocking MPI call cannot be timed out
// from inside); without one, it is the plain MPI call. Calls with no
// non-blocking form (communicator creation) go through mpi_blocking: the
// watchdog's monitor thread keeps their deadline where it runs.
#include <mpi.h>

#include <functional>
#include <string>
#include <vector>

namespace ndmini {

void mpi_all_reduce(const void* send, void* recv, int count, MPI_Datatype type, MPI_Op op, MPI_Comm comm,
                    const char* what);
void mpi_broadcast(void* buf, int count, MPI_Datatype type, int root, MPI_Comm comm, const char* what);
void mpi_barrier(MPI_Comm comm, const char* what);
void mpi_blocking(MPI_Comm comm, const char* what, const std::function<void()>& call);

// The node of each rank of `comm` (MPI_COMM_TYPE_SHARED), named by the lowest
// rank of `comm` on it: entry r is rank r's. Collective over `comm` the first
// time; kept on `comm` after (an MPI attribute), as a node's ranks do not
// change: MPI_Comm_split_type takes 0.1-0.3 s where the ranks outnumber the
// cores (8 on 2), and every mesh and watchdog asked it again.
const std::vector<int>& node_of_ranks(MPI_Comm comm);

// Runs a rank-local step (reading a file, opening one) on every rank of
// `comm` and agrees on the outcome: if it threw on any rank, every rank
// throws Error with the lowest failing rank's message. Collective; without
// it, one rank's error would leave the others waiting in the next collective.
void agree_on_errors(MPI_Comm comm, const std::function<void()>& body);

// The same agreement for an outcome already known: `local_error` is empty
// where this rank succeeded.
void agree(MPI_Comm comm, const std::string& local_error);

// agree, folding one more rank-local value (>= 0) into the same collective:
// returns the largest `local_value` of any rank when no rank failed. The
// training loop agrees on a received stop signal this way at no extra cost.
int agree_max(MPI_Comm comm, const std::string& local_error, int local_value);

}  // namespace ndmini
