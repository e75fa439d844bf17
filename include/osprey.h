/*
 * osprey.h - C interface of the osprey profiler agent.
 *
 * Trace context: tell the profiler which request (span) the calling thread is
 * working on, so every CPU sample taken on that thread is labelled with it
 * and a slow request's trace leads to its profile.
 *
 * The context is per thread. Setting it costs a few nanoseconds (no lock, no
 * system call after the first call on a thread), so it may be called on every
 * span switch. None of these functions may be called from a signal handler.
 *
 * Finding the functions at run time
 * ---------------------------------
 * Under `osprey exec PROGRAM`, the agent is preloaded into PROGRAM, so these
 * symbols exist in the process without linking against anything. A program
 * that should also run without osprey looks them up instead of linking them:
 *
 *     #define _GNU_SOURCE
 *     #include <dlfcn.h>
 *     #include "osprey.h"
 *
 *     static osprey_set_context_fn set_ctx;
 *     ...
 *     set_ctx = (osprey_set_context_fn)dlsym(RTLD_DEFAULT, "osprey_set_context");
 *     ...
 *     if (set_ctx) set_ctx(span_id, root_span_id);
 *
 * dlsym returns NULL when the agent is absent, and the program runs
 * unchanged. (Link with -ldl on glibc older than 2.34.)
 *
 * Tags
 * ----
 * Up to OSPREY_TAG_SLOTS distinct tag keys per process (the first ones used
 * win; a key keeps its slot forever). Values are interned strings: keep their
 * number bounded (an endpoint name, not a user id); past 65536 distinct values
 * new ones are exported as "osprey:overflow".
 */
#ifndef OSPREY_H
#define OSPREY_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Maximum number of distinct tag keys. */
#define OSPREY_TAG_SLOTS 10

/*
 * Sets the calling thread's trace context: the active span and the local root
 * span (the outermost span of this trace in this process), without a trace
 * id. Tags are kept.
 * 0 means "none"; (0, 0) with no tags is the same as no context.
 */
void osprey_set_context(uint64_t span_id, uint64_t local_root_span_id);

/*
 * Sets the calling thread's OpenTelemetry context: the W3C trace id
 * (trace_id_high = its first 8 bytes read big-endian, i.e. the first 16 of
 * its 32 hex digits; trace_id_low the last 8 bytes), span id, W3C trace
 * flags and local root span id. Tags are kept. Samples get "trace id" (32
 * hex digits) and "span id" labels, and profilers outside the process read
 * the same ids through the OTEP 4947 TLS symbol otel_thread_ctx_v1.
 */
void osprey_set_trace_context(uint64_t trace_id_high, uint64_t trace_id_low, uint64_t span_id,
                              uint8_t trace_flags, uint64_t local_root_span_id);

/* Clears the calling thread's trace and span ids; tags are kept. */
void osprey_clear_context(void);

/*
 * Sets tag `key` to `value` on the calling thread (both NUL-terminated, UTF-8;
 * copied). A NULL value clears the tag.
 * Returns 0 on success, -1 if `key` is NULL, empty, not UTF-8, longer than
 * 128 bytes, or new while OSPREY_TAG_SLOTS keys are already in use.
 */
int osprey_set_tag(const char *key, const char *value);

/* Clears tag `key` on the calling thread. Returns 0, or -1 for a bad key. */
int osprey_clear_tag(const char *key);

/* Function pointer types for dlsym(RTLD_DEFAULT, "osprey_...") lookups. */
typedef void (*osprey_set_context_fn)(uint64_t span_id, uint64_t local_root_span_id);
typedef void (*osprey_set_trace_context_fn)(uint64_t trace_id_high, uint64_t trace_id_low, uint64_t span_id,
                                            uint8_t trace_flags, uint64_t local_root_span_id);
typedef void (*osprey_clear_context_fn)(void);
typedef int (*osprey_set_tag_fn)(const char *key, const char *value);
typedef int (*osprey_clear_tag_fn)(const char *key);

#ifdef __cplusplus
}
#endif

#endif /* OSPREY_H */
