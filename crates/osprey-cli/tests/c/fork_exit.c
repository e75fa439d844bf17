/* Forks N children that exit at once (running osprey's exit path) while
 * one thread walks the loaded objects without end (as C++ exception
 * unwinding does: the loader's lock is often held at a fork) and another
 * burns CPU (samples to drain). Without osprey every child exits at once.
 * A child that has not ended after 20 s is reported and killed.
 * Prints "forked N hung H bad B". */
#define _GNU_SOURCE
#include <link.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile int stop;

static int count(struct dl_phdr_info *info, size_t size, void *data) {
    (void)info, (void)size;
    ++*(long *)data;
    return 0;
}

static void *walker(void *arg) {
    (void)arg;
    long n = 0;
    while (!stop) dl_iterate_phdr(count, &n);
    return NULL;
}

static void *busy(void *arg) {
    (void)arg;
    volatile unsigned long x = 0;
    while (!stop) x = x * 3 + 1;
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 1000;
    pthread_t t[2];
    pthread_create(&t[0], NULL, walker, NULL);
    pthread_create(&t[1], NULL, busy, NULL);
    int forked = 0, hung = 0, bad = 0;
    for (int i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) exit(i % 5);
        if (p < 0) { bad++; continue; }
        forked++;
        int st = 0;
        double until = now() + 20;
        while (waitpid(p, &st, WNOHANG) == 0) {
            if (now() > until) {
                printf("child %d (pid %d) still running after 20 s\n", i, p);
                fflush(stdout);
                kill(p, SIGKILL);
                waitpid(p, &st, 0);
                hung++;
                break;
            }
            usleep(200);
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != i % 5) bad++;
    }
    stop = 1;
    pthread_join(t[0], NULL);
    pthread_join(t[1], NULL);
    printf("forked %d hung %d bad %d\n", forked, hung, bad);
    return 0;
}
