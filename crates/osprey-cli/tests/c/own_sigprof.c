/* A program with its own SIGPROF profiler (setitimer(ITIMER_PROF)): it must
 * keep receiving its ticks under osprey. Prints "ticks N" and exits 0 if it
 * got at least a few, 3 otherwise. Threads burn CPU via pthread_create, so
 * the interposed thread-start path is exercised too. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>

static volatile sig_atomic_t ticks;
static void on_prof(int sig) { (void)sig; ticks++; }

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static volatile unsigned long sink;
__attribute__((noinline)) static void burn_in_thread(double s) {
    double end = now() + s;
    unsigned long x = 1;
    while (now() < end)
        for (int i = 0; i < 10000; i++) x = x * 6364136223846793005ul + i;
    sink = x;
}

static void *worker(void *arg) { (void)arg; burn_in_thread(1.0); return NULL; }

int main(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_prof;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGPROF, &sa, NULL);
    struct itimerval it = {{0, 10000}, {0, 10000}};
    setitimer(ITIMER_PROF, &it, NULL);
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, worker, NULL);
    burn_in_thread(1.0);
    for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
    printf("ticks %d\n", (int)ticks);
    return ticks >= 10 ? 0 : 3;
}
