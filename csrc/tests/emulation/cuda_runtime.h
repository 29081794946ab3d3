// A CPU emulation of the CUDA execution model, just enough to run csrc/cuda/*.cu unchanged on the
// host for csrc/tests/test_cuda_emulated.cpp (never part of the extension; this directory comes
// first on that test's include path, so `#include <cuda_runtime.h>` finds this file).
//
// A launch runs its blocks one after another; a block's threads are user-level contexts
// (ucontext) on one OS thread, switched only at __syncthreads() and at warp shuffles. So a run is
// deterministic, `__shared__` can be a function-local static (one block at a time), and a barrier
// that not every thread of the block (or lane of the warp) reaches is reported as a deadlock
// instead of hanging: the emulation also checks the kernels' synchronisation structure.
#pragma once

#include <ucontext.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <tuple>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

struct dim3 {
  unsigned int x, y, z;
  constexpr dim3(unsigned int x_ = 1, unsigned int y_ = 1, unsigned int z_ = 1) : x(x_), y(y_), z(z_) {}
};

using cudaStream_t = struct CUstream_st*;
enum cudaError_t { cudaSuccess = 0 };
inline cudaError_t cudaGetLastError() { return cudaSuccess; }

namespace eo_emulation {

constexpr std::size_t kStackBytes = 256 * 1024;

struct Thread {
  dim3 idx;
  ucontext_t context;
  int waiting = -1;  // barrier this thread waits at (-1: runnable)
  bool done = false;
  double lane_value = 0.0;
};

struct State {
  dim3 grid, block, block_idx;
  std::vector<Thread> threads;
  std::vector<std::unique_ptr<char[]>> stacks;  // one per thread, reused by every block
  ucontext_t scheduler;
  Thread* current = nullptr;
  // Barrier 0 is the block's; barrier 1 + w is warp w's.
  std::vector<int> arrived;
};

inline State& state() {
  static State s;
  return s;
}

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "cuda emulation: %s\n", what);
  std::abort();
}

inline int barrier_size(int barrier) {
  const int threads = static_cast<int>(state().block.x);
  if (barrier == 0) return threads;
  const int warp = barrier - 1;
  return threads - 32 * warp < 32 ? threads - 32 * warp : 32;
}

// Wait at a barrier: back to the scheduler until every participant has arrived.
inline void wait_at(int barrier) {
  State& s = state();
  Thread* self = s.current;
  self->waiting = barrier;
  if (++s.arrived[barrier] == barrier_size(barrier)) {
    s.arrived[barrier] = 0;
    for (Thread& t : s.threads) {
      if (t.waiting == barrier) t.waiting = -1;
    }
  }
  if (self->waiting != -1) swapcontext(&self->context, &s.scheduler);
}

template <typename Kernel, typename Tuple>
struct Entry {
  static Kernel kernel;
  static const Tuple* args;
  static void run() {
    std::apply(kernel, *args);
    state().current->done = true;
  }
};
template <typename Kernel, typename Tuple>
Kernel Entry<Kernel, Tuple>::kernel;
template <typename Kernel, typename Tuple>
const Tuple* Entry<Kernel, Tuple>::args;

template <typename... Params>
struct Launch {
  dim3 grid, block;
  void (*kernel)(Params...);

  template <typename... Args>
  void operator()(Args&&... arguments) const {
    using Tuple = std::tuple<Params...>;
    const Tuple args(std::forward<Args>(arguments)...);
    using E = Entry<void (*)(Params...), Tuple>;
    E::kernel = kernel;
    E::args = &args;
    State& s = state();
    s.grid = grid;
    s.block = block;
    if (block.y != 1 || block.z != 1 || block.x == 0 || block.x > 1024) fail("only 1-D blocks of 1..1024 threads");
    for (unsigned int bz = 0; bz < grid.z; ++bz) {
      for (unsigned int by = 0; by < grid.y; ++by) {
        for (unsigned int bx = 0; bx < grid.x; ++bx) {
          s.block_idx = dim3(bx, by, bz);
          s.threads.clear();
          s.threads.resize(block.x);
          s.arrived.assign(1 + (block.x + 31) / 32, 0);
          while (s.stacks.size() < block.x) s.stacks.emplace_back(new char[kStackBytes]);
          for (unsigned int t = 0; t < block.x; ++t) {
            Thread& th = s.threads[t];
            th.idx = dim3(t);
            getcontext(&th.context);
            th.context.uc_stack.ss_sp = s.stacks[t].get();
            th.context.uc_stack.ss_size = kStackBytes;
            th.context.uc_link = &s.scheduler;
            makecontext(&th.context, &E::run, 0);
          }
          // Round-robin over runnable threads until all are done.
          for (;;) {
            bool progress = false, all_done = true;
            for (Thread& th : s.threads) {
              if (th.done) continue;
              all_done = false;
              if (th.waiting != -1) continue;
              s.current = &th;
              swapcontext(&s.scheduler, &th.context);
              progress = true;
            }
            if (all_done) break;
            if (!progress) fail("deadlock: a barrier that not every thread of the block (or warp) reaches");
          }
          s.current = nullptr;
        }
      }
    }
  }
};

template <typename... Params>
Launch<Params...> launcher(dim3 grid, dim3 block, void (*kernel)(Params...)) {
  return Launch<Params...>{grid, block, kernel};
}

}  // namespace eo_emulation

#define threadIdx (::eo_emulation::state().current->idx)
#define blockIdx (::eo_emulation::state().block_idx)
#define gridDim (::eo_emulation::state().grid)
#define blockDim (::eo_emulation::state().block)
#define EO_LAUNCH(grid, block, stream, ...) ::eo_emulation::launcher(dim3(grid), dim3(block), __VA_ARGS__)

inline void __syncthreads() { eo_emulation::wait_at(0); }

// The calling thread's warp: every lane waits for the others (a full-warp mask only).
inline void __syncwarp(unsigned int mask = 0xffffffffu) {
  if (mask != 0xffffffffu) eo_emulation::fail("__syncwarp with a partial mask");
  eo_emulation::wait_at(1 + static_cast<int>(eo_emulation::state().current->idx.x / 32));
}

// Every lane publishes its value, waits for the warp, reads its partner's, waits again.
template <typename T>
T __shfl_xor_sync(unsigned int, T value, int lane_mask) {
  auto& s = eo_emulation::state();
  const unsigned int self = s.current->idx.x;
  const int warp_barrier = 1 + static_cast<int>(self / 32);
  s.current->lane_value = static_cast<double>(value);
  eo_emulation::wait_at(warp_barrier);
  const unsigned int partner = (self & ~31u) | ((self & 31u) ^ static_cast<unsigned int>(lane_mask));
  if (partner >= s.threads.size()) eo_emulation::fail("shuffle with a lane outside the block");
  const T out = static_cast<T>(s.threads[partner].lane_value);
  eo_emulation::wait_at(warp_barrier);
  return out;
}

inline unsigned int atomicMax(unsigned int* address, unsigned int value) {
  const unsigned int old = *address;
  if (value > old) *address = value;
  return old;
}

inline float __uint_as_float(unsigned int u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline unsigned int __float_as_uint(float f) {
  unsigned int u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline double __longlong_as_double(long long u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}
