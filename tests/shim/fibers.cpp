// fibers.cpp: see fibers.h.

#undef _FORTIFY_SOURCE // __longjmp_chk refuses jumps between fiber stacks
#include <setjmp.h>
#include <ucontext.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fibers.h"

namespace escha_fibers {

namespace {

const size_t kStack = 256 * 1024;

struct Barrier {
    int count = 0;
    unsigned gen = 0;
};

struct Fiber {
    ucontext_t uc;
    jmp_buf jb;
    int index = 0;
    bool started = false;
    bool done = false;
};

struct Group {
    std::vector<Fiber> fibers;
    std::vector<std::vector<unsigned char>> stacks;
    std::vector<Barrier> warp_bar;
    std::vector<int> warp_lanes;
    Barrier group_bar;
    std::vector<unsigned char> slots;
    thread_fn body = nullptr;
    void * ctx = nullptr;
    unsigned long progress = 0;
};

thread_local Group * g_group = nullptr;
thread_local Fiber * g_cur = nullptr;
thread_local jmp_buf g_sched;

void yield_to_scheduler() {
    if (!_setjmp(g_cur->jb)) {
        _longjmp(g_sched, 1);
    }
}

void wait_all(Barrier & b, int n) {
    g_group->progress++;
    const unsigned gen = b.gen;
    if (++b.count == n) {
        b.count = 0;
        b.gen++;
        return;
    }
    while (b.gen == gen) {
        yield_to_scheduler();
    }
}

void fiber_main() {
    Fiber * f = g_cur;
    g_group->body(g_group->ctx, f->index);
    f->done = true;
    g_group->progress++;
    _longjmp(g_sched, 1);
}

} // namespace

void run_group(int n, thread_fn body, void * ctx, const char * what) {
    static thread_local Group g; // keeps its fiber stacks from one group to the next
    const int n_warps = (n + 31) / 32;
    g.fibers.assign(n, Fiber());
    if ((int) g.stacks.size() < n) {
        g.stacks.resize(n);
    }
    g.warp_bar.assign(n_warps, Barrier());
    g.warp_lanes.assign(n_warps, 32);
    if (n % 32) {
        g.warp_lanes[n_warps - 1] = n % 32;
    }
    g.group_bar = Barrier();
    g.slots.assign((size_t) n_warps * 32 * kSlotBytes, 0);
    g.body = body;
    g.ctx = ctx;
    for (int i = 0; i < n; i++) {
        Fiber & f = g.fibers[i];
        f.index = i;
        if (g.stacks[i].size() < kStack) {
            g.stacks[i].resize(kStack);
        }
        getcontext(&f.uc);
        f.uc.uc_stack.ss_sp = g.stacks[i].data();
        f.uc.uc_stack.ss_size = kStack;
        f.uc.uc_link = nullptr;
        makecontext(&f.uc, fiber_main, 0);
    }
    g_group = &g;
    // volatile: live across _setjmp/_longjmp
    volatile int remaining = n;
    while (remaining > 0) {
        const unsigned long before = g.progress;
        for (volatile int i = 0; i < n; i++) {
            Fiber & f = g.fibers[i];
            if (f.done) {
                continue;
            }
            g_cur = &f;
            if (!_setjmp(g_sched)) {
                if (!f.started) {
                    f.started = true;
                    setcontext(&f.uc);
                } else {
                    _longjmp(f.jb, 1);
                }
            }
            if (f.done) {
                remaining--;
            }
        }
        if (remaining > 0 && g.progress == before) {
            fprintf(stderr, "escha shim: deadlock in %s: threads wait at barriers that not all of their warp/group reach\n", what);
            abort();
        }
    }
    g_group = nullptr;
    g_cur = nullptr;
}

int thread_index() {
    return g_cur->index;
}

int lane() {
    return g_cur->index % 32;
}

int warp() {
    return g_cur->index / 32;
}

unsigned char * warp_slots() {
    return g_group->slots.data() + (size_t) warp() * 32 * kSlotBytes;
}

void warp_sync() {
    wait_all(g_group->warp_bar[warp()], g_group->warp_lanes[warp()]);
}

void group_sync() {
    wait_all(g_group->group_bar, (int) g_group->fibers.size());
}

} // namespace escha_fibers
