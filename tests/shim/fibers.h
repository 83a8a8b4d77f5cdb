// fibers.h: the threads of one GPU thread block (a Metal threadgroup, a CUDA
// block) run as fibers on the calling OS thread, for the executors that run
// the escha GPU kernels on the CPU (metal/shim/executor.cpp,
// hip/shim/cuda-executor.cpp).
//
// Each thread is a fiber with its own stack; they take turns and switch only
// where a kernel waits for others. A barrier is passed once every thread it
// covers (the 32 lanes of a warp / simdgroup, or the whole group) has
// arrived, so lock-step operations see exactly what each lane contributed.
// A group in which nobody can move on is reported as a deadlock (abort).
#ifndef ESCHA_SHIM_FIBERS_H
#define ESCHA_SHIM_FIBERS_H

namespace escha_fibers {

// Bytes per lane of a warp's exchange area.
constexpr int kSlotBytes = 32;

typedef void (*thread_fn)(void * ctx, int thread);

// Runs threads 0..n-1 of one group to completion, warps of 32 consecutive
// threads. `what` names the group in a deadlock report.
void run_group(int n, thread_fn body, void * ctx, const char * what);

// For the calling fiber: its thread index in the group, lane and warp.
int thread_index();
int lane();
int warp();

// The calling warp's exchange area: 32 slots of kSlotBytes.
unsigned char * warp_slots();

// Every lane of the calling warp reaches this point before any leaves.
void warp_sync();

// Every thread of the group reaches this point before any leaves.
void group_sync();

} // namespace escha_fibers

#endif // ESCHA_SHIM_FIBERS_H
