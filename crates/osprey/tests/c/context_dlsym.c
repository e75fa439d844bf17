/*
 * context_dlsym.c - a program that labels its CPU work with trace context,
 * for the end-to-end test of osprey's context labels.
 *
 * It never links against osprey: it looks up osprey_set_context and
 * osprey_clear_context (and osprey_set_tag) with dlsym(RTLD_DEFAULT, ...), so
 * the same binary runs unchanged without the agent (the lookups return NULL
 * and the calls are skipped) and, under `osprey exec ./context_dlsym`, every
 * CPU sample taken inside a unit of work is labelled with
 * span id = 1000 + i and local root span id = 42 (tag "phase" = "burn").
 *
 * Build: cc -O1 -fno-omit-frame-pointer -I include \
 *            crates/osprey/tests/c/context_dlsym.c -o context_dlsym (-ldl on glibc < 2.34)
 * Run:   ./context_dlsym [seconds, default 3] [units, default 20]
 * Output (stdout): "osprey: present" or "osprey: absent", then one line per
 * unit "unit I span S" so a test can match spans to wall time.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "osprey.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Pure CPU work the optimizer cannot remove. */
static volatile uint64_t sink;
static void burn(double seconds) {
    double end = now() + seconds;
    uint64_t x = 88172645463325252ull;
    while (now() < end) {
        for (int k = 0; k < 10000; k++) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
        }
        sink = x;
    }
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    int units = argc > 2 ? atoi(argv[2]) : 20;
    if (units < 1) units = 1;

    osprey_set_context_fn set_ctx = (osprey_set_context_fn)dlsym(RTLD_DEFAULT, "osprey_set_context");
    osprey_clear_context_fn clear_ctx = (osprey_clear_context_fn)dlsym(RTLD_DEFAULT, "osprey_clear_context");
    osprey_set_tag_fn set_tag = (osprey_set_tag_fn)dlsym(RTLD_DEFAULT, "osprey_set_tag");
    printf("osprey: %s\n", set_ctx && clear_ctx ? "present" : "absent");

    if (set_tag && set_tag("phase", "burn") != 0) fprintf(stderr, "osprey_set_tag failed\n");
    for (int i = 0; i < units; i++) {
        uint64_t span = 1000 + (uint64_t)i;
        if (set_ctx) set_ctx(span, 42);
        printf("unit %d span %llu\n", i, (unsigned long long)span);
        fflush(stdout);
        burn(seconds / units);
        if (clear_ctx) clear_ctx();
    }
    return 0;
}
