// Work splitting over XLA's intra-op thread pool (the FFI's ThreadPool context): the
// calling thread works too, so a pool that never runs our tasks (busy, or absent) costs
// nothing but the calling thread's time, and XLA's threads are never oversubscribed.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>

#include "xla/ffi/api/ffi.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define LLAMAY_PAUSE() _mm_pause()
#else
#define LLAMAY_PAUSE() std::this_thread::yield()
#endif

namespace llamay {

// f(i) for every i in [0, n), over up to the pool's threads. A task that starts after
// every index is claimed touches only the shared counters (kept alive by shared_ptr),
// and the caller returns only once every claimed index is done, so `f` outlives its uses.
template <class F>
void parallel_for(xla::ffi::ThreadPool& pool, int64_t n, F&& f) {
  const int64_t threads = pool.num_threads();
  if (n <= 1 || threads <= 1) {
    for (int64_t i = 0; i < n; ++i) f(i);
    return;
  }
  struct State {
    std::atomic<int64_t> next{0};
    std::atomic<int64_t> done{0};
  };
  auto state = std::make_shared<State>();
  auto run = [state, n, fp = &f]() {
    for (int64_t i; (i = state->next.fetch_add(1)) < n;) {
      (*fp)(i);
      state->done.fetch_add(1, std::memory_order_release);
    }
  };
  const int64_t helpers = (threads < n ? threads : n) - 1;
  for (int64_t t = 0; t < helpers; ++t) {
    auto task = run;
    pool.Schedule(std::move(task));
  }
  run();
  for (int spins = 0; state->done.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) LLAMAY_PAUSE(); else std::this_thread::yield();
  }
}

// f(part, task) for every row task of several weights' parts (each with `tasks`), in
// one split over the pool: one handoff to the threads for a whole group of matmuls.
template <class P, class F>
void parallel_parts(xla::ffi::ThreadPool& pool, const P* parts, int64_t count, F&& f) {
  int64_t total = 0;
  for (int64_t i = 0; i < count; ++i) total += parts[i].tasks;
  parallel_for(pool, total, [&](int64_t task) {
    const P* part = parts;
    while (task >= part->tasks) task -= (part++)->tasks;
    f(*part, task);
  });
}

}  // namespace llamay
