/* EINTR census: one thread per call (nanosleep, epoll_wait, poll, select,
 * FUTEX_WAIT with a timeout), each making CALLS calls of 1 ms, plus a busy
 * thread so CPU sampling runs. Prints the EINTR count of each, in that
 * order. Usage: wall_eintr CALLS */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/futex.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

enum { NANOSLEEP, EPOLL_WAIT, POLL, SELECT, FUTEX, KINDS };
static int calls;
static int eintr[KINDS];
static int futex_word;
static volatile int done;
static volatile unsigned long sink;

static void *sleeper(void *arg) {
    int kind = (int)(long)arg, ep = epoll_create1(EPOLL_CLOEXEC);
    struct epoll_event ev;
    for (int i = 0; i < calls; i++) {
        long r;
        if (kind == NANOSLEEP) {
            struct timespec ts = {0, 1000000};
            r = nanosleep(&ts, 0);
        } else if (kind == EPOLL_WAIT) {
            r = epoll_wait(ep, &ev, 1, 1);
        } else if (kind == POLL) {
            r = poll(0, 0, 1);
        } else if (kind == SELECT) {
            struct timeval tv = {0, 1000};
            r = select(0, 0, 0, 0, &tv);
        } else {
            struct timespec ts = {0, 1000000};
            r = syscall(SYS_futex, &futex_word, FUTEX_WAIT_PRIVATE, 0, &ts, 0, 0);
            if (r < 0 && errno == ETIMEDOUT) r = 0;
        }
        if (r < 0 && errno == EINTR) __atomic_add_fetch(&eintr[kind], 1, __ATOMIC_RELAXED);
    }
    close(ep);
    return 0;
}

static void *busy(void *arg) {
    (void)arg;
    while (!done) sink++;
    return 0;
}

int main(int argc, char **argv) {
    calls = argc > 1 ? atoi(argv[1]) : 1000;
    pthread_t t[KINDS], b;
    pthread_create(&b, 0, busy, 0);
    for (long k = 0; k < KINDS; k++) pthread_create(&t[k], 0, sleeper, (void *)k);
    for (int k = 0; k < KINDS; k++) pthread_join(t[k], 0);
    done = 1;
    pthread_join(b, 0);
    printf("%d %d %d %d %d\n", eintr[0], eintr[1], eintr[2], eintr[3], eintr[4]);
    return 0;
}
