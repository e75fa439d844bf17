/* A service loop for `osprey report --span/--trace` and `--timeline`:
 * request i (i = 0..N-1) sets the trace context (span id 0x5e770000 + i,
 * local root span id = the low 64 bits of its trace id, high bit set),
 * burns ~2 ms of its thread's CPU in handle_fast, and every 10th request
 * (i % 10 == 9) also ~40 ms in slow_path. Burns are measured on the
 * thread's CPU clock, so a busy machine does not change them. The context
 * functions are looked up with dlsym (the agent is preloaded by osprey exec).
 * Usage: requests [N]   prints each slow request's span id. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include "osprey.h"

static volatile uint64_t sink;

static int64_t cpu_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static void burn(int64_t ns) {
    int64_t end = cpu_ns() + ns;
    while (cpu_ns() < end)
        for (int i = 0; i < 1000; i++) sink = sink * 31 + (uint64_t)i;
}

__attribute__((noinline)) void slow_path(void) { burn(40 * 1000000); }
__attribute__((noinline)) void handle_fast(void) { burn(2 * 1000000); }

__attribute__((noinline)) void handle_request(int i) {
    handle_fast();
    if (i % 10 == 9) slow_path();
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 50;
    osprey_set_context_fn set_ctx = (osprey_set_context_fn)dlsym(RTLD_DEFAULT, "osprey_set_context");
    osprey_clear_context_fn clear_ctx = (osprey_clear_context_fn)dlsym(RTLD_DEFAULT, "osprey_clear_context");
    if (!set_ctx || !clear_ctx) {
        fprintf(stderr, "osprey context functions absent\n");
        return 3;
    }
    for (int i = 0; i < n; i++) {
        uint64_t span = 0x5e770000u + (uint64_t)i;
        uint64_t root = 0xa3ce929d0e0e0000ull + (uint64_t)i;
        set_ctx(span, root);
        handle_request(i);
        clear_ctx();
        if (i % 10 == 9) printf("slow %llu %llu\n", (unsigned long long)span, (unsigned long long)root);
    }
    return 0;
}
