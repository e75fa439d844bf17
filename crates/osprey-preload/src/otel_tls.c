/*
 * The OpenTelemetry thread-context pointer (OTEP 4947): each thread's
 * otel_thread_ctx_v1 points at its osprey context record's OTEP part (or is
 * NULL before the thread used the context API), for profilers outside the
 * process. Exported in .dynsym (exec_shim.map) and accessed through TLSDESC
 * (-mtls-dialect=gnu2), the model OTEP readers resolve first.
 */
__attribute__((visibility("default"))) __thread void *otel_thread_ctx_v1;

/* Sets the calling thread's pointer. Called by the agent, never in a signal handler. */
void osprey_otel_tls_set(void *record) {
    /* The record is complete before readers can find it. */
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    otel_thread_ctx_v1 = record;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}
