/*
 * An OTEP 4947 thread-context writer that is not osprey: the executable
 * exports the TLS pointer otel_thread_ctx_v1 (-rdynamic) and each thread
 * points it at its own record.
 *
 * Threads 1..3 publish fixed ids (trace ...0<i>, span ...<i>) and one
 * attribute "route" = "/thread/<i>"; thread 4 keeps rewriting its record in
 * place (valid = 0, fields, valid = 1) with trace low half == span id, so a
 * reader that stops it mid-update must skip the record; the main thread
 * publishes nothing. Prints "ready" when every thread has published, then
 * waits for stdin to close.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "otel_thread_ctx.h"

static struct record records[5];
static volatile int published;
static volatile int stop;

static void *fixed(void *arg) {
    int i = (int)(intptr_t)arg;
    struct record *r = &records[i];
    put_be(r->trace_id, 0x0af7651916cd43ddULL);
    put_be(r->trace_id + 8, 0x8448eb211c803100ULL + (uint64_t)i);
    put_be(r->span_id, 0xb7ad6b7169203300ULL + (uint64_t)i);
    r->trace_flags = 1;
    char value[16];
    int n = snprintf(value, sizeof value, "/thread/%d", i);
    r->attrs_data[0] = 0; /* key index 0 */
    r->attrs_data[1] = (uint8_t)n;
    memcpy(r->attrs_data + 2, value, (size_t)n);
    r->attrs_data_size = (uint16_t)(2 + n);
    r->valid = 1;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    otel_thread_ctx_v1 = r;
    __atomic_fetch_add(&published, 1, __ATOMIC_SEQ_CST);
    while (!stop) usleep(10000);
    return NULL;
}

static void *churn(void *arg) {
    (void)arg;
    struct record *r = &records[4];
    otel_thread_ctx_v1 = r;
    __atomic_fetch_add(&published, 1, __ATOMIC_SEQ_CST);
    for (uint64_t k = 1; !stop; k++) {
        r->valid = 0;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        put_be(r->trace_id, k * 3);
        put_be(r->trace_id + 8, k);
        put_be(r->span_id, k);
        r->trace_flags = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        r->valid = 1;
        __atomic_signal_fence(__ATOMIC_SEQ_CST);
        /* Valid most of the time, so readers see both states. */
        for (volatile int spin = 0; spin < 64; spin++) {
        }
    }
    return NULL;
}

int main(void) {
    pthread_t t[4];
    for (int i = 1; i <= 3; i++) pthread_create(&t[i - 1], NULL, fixed, (void *)(intptr_t)i);
    pthread_create(&t[3], NULL, churn, NULL);
    while (published < 4) usleep(1000);
    printf("ready\n");
    fflush(stdout);
    char buf[64];
    while (read(0, buf, sizeof buf) > 0) {
    }
    stop = 1;
    for (int i = 0; i < 4; i++) pthread_join(t[i], NULL);
    return 0;
}
