/* Built by tests/frameless.rs with -O2 -fomit-frame-pointer: stacks that
 * only call frame information can walk. Fixed amounts of work (CPU time,
 * not wall time). `./frameless MODE [N]`:
 *   split    main -> walk (recursion) -> hot_a/hot_b/hot_c (50/30/20), and a
 *            thread in the system zlib's compress2() called by zlib_caller
 *   deep     a 10,000-frame recursion that burns CPU at the bottom
 *   tiny     threads on 16 KiB stacks
 *   altstack the program's own signal handler, on a sigaltstack, burns CPU
 *   coro     two swapcontext coroutines burning CPU on their own stacks
 *   longjmp  a recursion left by longjmp, again and again
 *   dlopen   dlopen/dlsym/ZSTD_compress/dlclose of libzstd, in a loop, then
 *            libzstd loaded until exit */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>
#include <zlib.h>

volatile unsigned long sink;

__attribute__((noinline)) unsigned long burn(unsigned long x, int n) {
    for (int i = 0; i < n; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
    return x;
}

/* Each with its own loop (a call to burn would be a tail call: no frame), one
   dependent multiply per step with the same multiplier, so that time follows
   the iteration counts on any CPU (31, 37 and 41 compiled to shifts and leas of
   different latencies: 61/23/16 where 50/30/20 was meant). */
__attribute__((noinline)) unsigned long hot_a(unsigned long x) { for (int i = 0; i < 5000; i++) x = x * 6364136223846793005ul + 7; return x; }
__attribute__((noinline)) unsigned long hot_b(unsigned long x) { for (int i = 0; i < 3000; i++) x = x * 6364136223846793005ul + 5; return x; }
__attribute__((noinline)) unsigned long hot_c(unsigned long x) { for (int i = 0; i < 2000; i++) x = x * 6364136223846793005ul + 3; return x; }

__attribute__((noinline)) unsigned long walk(int depth, unsigned long x) {
    volatile unsigned long pad[2] = {x, x};
    if (depth <= 0) return hot_a(x) + hot_b(x + pad[0]) + hot_c(x + pad[1]);
    unsigned long r = walk(depth - 1, x + 1);
    sink += r;
    return r + 1;
}

static unsigned char src[256 * 1024], dst[300 * 1024];

__attribute__((noinline)) void zlib_caller(int rounds) {
    unsigned long seed = 1;
    for (size_t i = 0; i < sizeof src; i++) {
        seed = seed * 1103515245 + 12345;
        src[i] = (unsigned char)((seed >> 16) % 17);
    }
    for (int r = 0; r < rounds; r++) {
        uLongf n = sizeof dst;
        compress2(dst, &n, src, sizeof src, 6);
        sink += n;
    }
}

static void *zlib_thread(void *arg) {
    zlib_caller((int)(long)arg);
    return 0;
}

__attribute__((noinline)) unsigned long deep(int depth, unsigned long x) {
    volatile unsigned long pad[2] = {x, x};
    if (depth <= 0) return burn(x, 200 * 1000 * 1000);
    unsigned long r = deep(depth - 1, x + pad[0]);
    sink += r;
    return r + pad[1];
}

static void *tiny_thread(void *arg) {
    sink += walk(8, (unsigned long)arg);
    for (int i = 0; i < 2000; i++) sink += walk(4, (unsigned long)i);
    return 0;
}

static void on_usr1(int sig) {
    (void)sig;
    sink += burn(sink, 2 * 1000 * 1000);
}

static ucontext_t main_ctx, coro_ctx[2];
static int coro_rounds;

static void coro_body(int which) {
    for (;;) {
        sink += burn(sink + (unsigned long)which, 200 * 1000);
        swapcontext(&coro_ctx[which], which == 0 ? &coro_ctx[1] : &main_ctx);
    }
}

static jmp_buf jb;

__attribute__((noinline)) void jump_from(int depth) {
    volatile unsigned long pad[2] = {sink, sink};
    if (depth <= 0) {
        sink += burn(pad[0], 100 * 1000);
        longjmp(jb, 1);
    }
    jump_from(depth - 1);
    sink += pad[1];
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "split";
    long n = argc > 2 ? atol(argv[2]) : 1;
    if (!strcmp(mode, "split")) {
        pthread_t t;
        pthread_create(&t, 0, zlib_thread, (void *)(n * 30));
        for (long i = 0; i < n * 20000; i++) sink += walk(8, (unsigned long)i);
        pthread_join(t, 0);
    } else if (!strcmp(mode, "deep")) {
        sink += deep(10000, 1);
    } else if (!strcmp(mode, "tiny")) {
        for (long k = 0; k < n; k++) {
            pthread_t t[4];
            pthread_attr_t a;
            pthread_attr_init(&a);
            pthread_attr_setstacksize(&a, 16 * 1024);
            for (long i = 0; i < 4; i++)
                if (pthread_create(&t[i], &a, tiny_thread, (void *)i)) return 3;
            for (long i = 0; i < 4; i++) pthread_join(t[i], 0);
        }
    } else if (!strcmp(mode, "altstack")) {
        stack_t ss = {.ss_sp = malloc(64 * 1024), .ss_size = 64 * 1024};
        sigaltstack(&ss, 0);
        struct sigaction sa = {.sa_handler = on_usr1, .sa_flags = SA_ONSTACK};
        sigaction(SIGUSR1, &sa, 0);
        for (long i = 0; i < n * 300; i++) raise(SIGUSR1);
    } else if (!strcmp(mode, "coro")) {
        for (int i = 0; i < 2; i++) {
            getcontext(&coro_ctx[i]);
            coro_ctx[i].uc_stack.ss_sp = malloc(256 * 1024);
            coro_ctx[i].uc_stack.ss_size = 256 * 1024;
            coro_ctx[i].uc_link = &main_ctx;
            makecontext(&coro_ctx[i], (void (*)(void))coro_body, 1, i);
        }
        for (coro_rounds = 0; coro_rounds < n * 3000; coro_rounds++) swapcontext(&main_ctx, &coro_ctx[0]);
    } else if (!strcmp(mode, "longjmp")) {
        for (long i = 0; i < n * 6000; i++)
            if (!setjmp(jb)) jump_from(50);
    } else if (!strcmp(mode, "dlopen")) {
        unsigned long seed = 1;
        for (size_t i = 0; i < sizeof src; i++) {
            seed = seed * 1103515245 + 12345;
            src[i] = (unsigned char)((seed >> 16) % 17);
        }
        for (long i = 0; i < n * 400; i++) {
            void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
            if (!h) return 4;
            size_t (*zc)(void *, size_t, const void *, size_t, int) = dlsym(h, "ZSTD_compress");
            if (!zc) return 5;
            sink += zc(dst, sizeof dst, src, sizeof src, 3);
            dlclose(h);
        }
        /* Then loaded until exit: its frames are named at the final flush. */
        void *h = dlopen("libzstd.so.1", RTLD_NOW | RTLD_LOCAL);
        size_t (*zc)(void *, size_t, const void *, size_t, int) = h ? dlsym(h, "ZSTD_compress") : 0;
        if (!zc) return 6;
        for (long i = 0; i < n * 200; i++) sink += zc(dst, sizeof dst, src, sizeof src, 3);
    } else {
        return 2;
    }
    printf("ok %lu\n", sink & 1);
    return 0;
}
