/* Takes over the real-time signal osprey samples with (the first one from
 * SIGRTMIN+6 that has a handler when main starts), while its CPU is being
 * sampled, then burns CPU. Its handler counts signals the kernel generated
 * (si_code > 0: osprey's CPU clock) as foreign, and the one it raises
 * itself as own. Prints "signal S foreign F own O". */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static volatile sig_atomic_t foreign, own;

static void on_rt(int s, siginfo_t *si, void *uc) {
    (void)s; (void)uc;
    if (si->si_code > 0) foreign++;
    else own++;
}

__attribute__((noinline)) static void burn_ms(double ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    volatile unsigned long x = 0;
    for (;;) {
        for (int i = 0; i < 10000; i++) x += i * x + 1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        if ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6 >= ms) return;
    }
}

int main(int argc, char **argv) {
    (void)argv;
    int sig = 0;
    for (int s = SIGRTMIN + 6; s <= SIGRTMAX && !sig; s++) {
        struct sigaction cur;
        if (sigaction(s, NULL, &cur) == 0 && cur.sa_handler != SIG_DFL) sig = s;
    }
    if (!sig) sig = SIGRTMIN + 6; /* not profiled: nothing to take over */
    burn_ms(200);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_rt;
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (argc > 1) signal(sig, (void (*)(int))on_rt); /* the signal() path */
    else sigaction(sig, &sa, NULL);
    if (argc > 1) sigaction(sig, &sa, NULL);
    burn_ms(500);
    raise(sig);
    printf("signal %d foreign %d own %d\n", sig, (int)foreign, (int)own);
    return 0;
}
