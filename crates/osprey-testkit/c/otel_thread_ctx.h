/*
 * The OTEP 4947 thread-context record as the test fixtures write it, for
 * programs that publish contexts without osprey: the layout is the OTEP's
 * (ids big-endian at 0 and 16, valid at 24, flags at 25, attribute bytes
 * from 28), and the executable exports the TLS pointer (link with
 * -rdynamic).
 */
#ifndef OSPREY_TESTKIT_OTEL_THREAD_CTX_H
#define OSPREY_TESTKIT_OTEL_THREAD_CTX_H
#include <stdint.h>

struct __attribute__((packed, aligned(8))) record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[64];
};

__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;

/* Writes v's 8 bytes big-endian at out (W3C order). */
static inline void put_be(uint8_t *out, uint64_t v) {
    for (int i = 7; i >= 0; i--, v >>= 8) out[i] = (uint8_t)v;
}
#endif
