/*
 * A program that publishes OTEP 4947 thread contexts itself (not osprey's
 * agent): the executable exports the TLS pointer otel_thread_ctx_v1
 * (-rdynamic), each worker thread points it at its own record and rewrites
 * it in place (valid = 0, fields, valid = 1) to switch spans.
 *
 *   otel_spans hold THREADS
 *     each worker publishes one span and the attribute #0 = "/thread/<i>",
 *     prints "ctx <tid> <trace hex> <span hex>", then sleeps; "ready" once
 *     all have; exits 0 when stdin closes.
 *   otel_spans switch THREADS SPANS MS
 *     each worker runs SPANS spans of MS ms of wall time each, burning CPU,
 *     and logs "span <tid> <span hex> <start ns> <end ns>" (CLOCK_REALTIME)
 *     to stderr; stdout gets only "done <n>" (the same on every run); exits 3.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "otel_thread_ctx.h"

static int spans, span_ms;
static volatile int published;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

static uint64_t now_ns(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static const uint64_t TRACE_HI = 0x4bf92f3577b34da6ull;

/* Switches r to span `span` of trace (TRACE_HI, lo), as the OTEP's writers do. */
static void set_span(struct record *r, uint64_t lo, uint64_t span) {
    r->valid = 0;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    put_be(r->trace_id, TRACE_HI);
    put_be(r->trace_id + 8, lo);
    put_be(r->span_id, span);
    r->trace_flags = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    r->valid = 1;
}

static void *hold(void *arg) {
    int i = (int)(intptr_t)arg;
    static __thread struct record r;
    uint64_t lo = 0xa3ce929d0e0e4700ull + (uint64_t)i, span = 0x00f067aa0ba90200ull + (uint64_t)i;
    set_span(&r, lo, span);
    int n = snprintf((char *)r.attrs_data + 2, sizeof r.attrs_data - 2, "/thread/%d", i);
    r.attrs_data[0] = 0;
    r.attrs_data[1] = (uint8_t)n;
    r.attrs_data_size = (uint16_t)(2 + n);
    otel_thread_ctx_v1 = &r;
    pthread_mutex_lock(&log_lock);
    printf("ctx %ld %016llx%016llx %016llx\n", (long)syscall(SYS_gettid), (unsigned long long)TRACE_HI,
           (unsigned long long)lo, (unsigned long long)span);
    fflush(stdout);
    pthread_mutex_unlock(&log_lock);
    __atomic_fetch_add(&published, 1, __ATOMIC_SEQ_CST);
    for (;;) pause();
    return NULL;
}

static void *switcher(void *arg) {
    int i = (int)(intptr_t)arg;
    static __thread struct record r;
    long tid = (long)syscall(SYS_gettid);
    otel_thread_ctx_v1 = &r;
    volatile uint64_t x = (uint64_t)i;
    for (int k = 0; k < spans; k++) {
        uint64_t span = 0x5a00000000000000ull | (uint64_t)i << 16 | (uint64_t)k;
        set_span(&r, 0x1000 + (uint64_t)i, span);
        uint64_t start = now_ns(CLOCK_REALTIME), until = now_ns(CLOCK_MONOTONIC) + (uint64_t)span_ms * 1000000;
        while (now_ns(CLOCK_MONOTONIC) < until) {
            for (int j = 0; j < 10000; j++) x = x * 6364136223846793005ull + 1;
        }
        uint64_t end = now_ns(CLOCK_REALTIME);
        pthread_mutex_lock(&log_lock);
        fprintf(stderr, "span %ld %016llx %llu %llu\n", tid, (unsigned long long)span, (unsigned long long)start,
                (unsigned long long)end);
        pthread_mutex_unlock(&log_lock);
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    int threads = atoi(argv[2]);
    pthread_t t[64];
    if (threads < 1 || threads > 64) return 2;
    if (strcmp(argv[1], "hold") == 0) {
        for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, hold, (void *)(intptr_t)(i + 1));
        while (published < threads) usleep(1000);
        printf("ready\n");
        fflush(stdout);
        char buf[64];
        while (read(0, buf, sizeof buf) > 0) {
        }
        return 0;
    }
    if (argc < 5) return 2;
    spans = atoi(argv[3]);
    span_ms = atoi(argv[4]);
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, switcher, (void *)(intptr_t)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("done %d\n", threads * spans);
    return 3;
}
