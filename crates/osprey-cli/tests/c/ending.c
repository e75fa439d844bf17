/* Ends the ways programs end abruptly, after burning CPU in spin_work:
 *   ending spin     prints "ready", spins until killed
 *   ending own      like spin, with its own SIGTERM handler: prints
 *                   "handled" and exits 0 (its handler, not osprey's, runs)
 *   ending abort    burns 300 ms of CPU, then abort()
 *   ending _exit    burns 300 ms of CPU, then _exit(3)
 *   ending sigio    burns 300 ms of CPU, then raise(SIGIO) (SIG_DFL: it dies)
 *   ending query    prints how many of SIGINT, SIGTERM, SIGHUP it sees at
 *                   SIG_DFL through sigaction, then through signal() */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t got;
static void on_term(int s) { got = s; }

__attribute__((noinline)) void spin_work(double ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    volatile unsigned long x = 0;
    for (;;) {
        for (int i = 0; i < 10000; i++) x += i * x + 1;
        if (got) return;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        if (ms > 0 && (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6 >= ms) return;
    }
}

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "spin";
    if (strcmp(mode, "query") == 0) {
        int sigs[] = {SIGINT, SIGTERM, SIGHUP}, by_sigaction = 0, by_signal = 0;
        for (int i = 0; i < 3; i++) {
            struct sigaction o;
            if (sigaction(sigs[i], NULL, &o) == 0 && o.sa_handler == SIG_DFL) by_sigaction++;
            if (signal(sigs[i], SIG_DFL) == SIG_DFL) by_signal++;
        }
        printf("sigaction %d signal %d\n", by_sigaction, by_signal);
        return 0;
    }
    if (strcmp(mode, "own") == 0) signal(SIGTERM, on_term);
    if (strcmp(mode, "spin") == 0 || strcmp(mode, "own") == 0) {
        printf("ready\n");
        fflush(stdout);
        spin_work(0);
        printf("handled %d\n", (int)got);
        return 0;
    }
    spin_work(300);
    if (strcmp(mode, "abort") == 0) abort();
    if (strcmp(mode, "_exit") == 0) _exit(3);
    if (strcmp(mode, "sigio") == 0) raise(SIGIO);
    return 2;
}
