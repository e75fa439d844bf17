/* Frameless test program: built with -O2 -fomit-frame-pointer.
 * As a shared library (tests): fl_run() recurses to a leaf that calls back
 * into the test; fl_zlib_worker() spends its time in the system compress2().
 * As a program (-DFL_MAIN, for perf): main() recurses to three hot leaves
 * (50/30/20 of the work) while a thread runs compress2(). */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

typedef void (*fl_cb)(void *);
volatile unsigned long fl_sink;
volatile int fl_stop;

__attribute__((noinline)) unsigned long fl_leaf(unsigned long x, fl_cb cb, void *arg) {
    for (int i = 0; i < 64; i++) x = x * 6364136223846793005ul + 1442695040888963407ul;
    if (cb) cb(arg);
    return x;
}

__attribute__((noinline)) unsigned long fl_recurse(int depth, unsigned long x, fl_cb cb, void *arg) {
    volatile unsigned long pad[3] = {x, x + 1, x + 2};
    if (depth <= 0) return fl_leaf(x + pad[1], cb, arg);
    unsigned long r = fl_recurse(depth - 1, x * 3 + pad[2], cb, arg);
    fl_sink += r;
    return r ^ (unsigned long)depth;
}

unsigned long fl_run(int depth, fl_cb cb, void *arg) {
    unsigned long r = fl_recurse(depth, 7, cb, arg);
    fl_sink += r;
    return r;
}

/* A leaf with no frame at all (no push, no stack adjustment), and a thread
 * spending its time in it. */
__attribute__((noinline)) unsigned long fl_spin_leaf(unsigned long x) {
    for (int i = 0; i < 4096; i++) x = x * 2862933555777941757ul + 3037000493ul;
    return x;
}

void *fl_spin_worker(void *unused) {
    (void)unused;
    while (!fl_stop) fl_sink += fl_spin_leaf(fl_sink);
    return 0;
}

/* Compresses until fl_stop; calls cb (if any) between rounds. */
void *fl_zlib_worker(void *unused) {
    (void)unused;
    static unsigned char src[256 * 1024], dst[300 * 1024];
    unsigned long seed = 1;
    for (size_t i = 0; i < sizeof src; i++) {
        seed = seed * 1103515245 + 12345;
        src[i] = (unsigned char)((seed >> 16) % 17);
    }
    while (!fl_stop) {
        uLongf n = sizeof dst;
        compress2(dst, &n, src, sizeof src, 6);
        fl_sink += n;
    }
    return 0;
}

#ifdef FL_MAIN
__attribute__((noinline)) unsigned long hot_a(unsigned long x) { for (int i = 0; i < 5000; i++) x = x * 6364136223846793005ul + 7; return x; }
__attribute__((noinline)) unsigned long hot_b(unsigned long x) { for (int i = 0; i < 3000; i++) x = x * 6364136223846793005ul + 5; return x; }
__attribute__((noinline)) unsigned long hot_c(unsigned long x) { for (int i = 0; i < 2000; i++) x = x * 6364136223846793005ul + 3; return x; }

__attribute__((noinline)) unsigned long walk(int depth, unsigned long x) {
    volatile unsigned long pad[2] = {x, x};
    if (depth <= 0) return hot_a(x) + hot_b(x + pad[0]) + hot_c(x + pad[1]);
    unsigned long r = walk(depth - 1, x + 1);
    fl_sink += r;
    return r + 1;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 3.0;
    pthread_t t;
    pthread_create(&t, 0, fl_zlib_worker, 0);
    unsigned long rounds = (unsigned long)(seconds * 40000.0);
    for (unsigned long i = 0; i < rounds; i++) fl_sink += walk(8, i);
    fl_stop = 1;
    pthread_join(t, 0);
    return 0;
}
#endif
