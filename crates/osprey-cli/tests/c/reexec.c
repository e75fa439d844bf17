/* Re-execs itself while sampled: the exec'ing process is large (MB of
 * touched memory) and has busy threads, so osprey's CPU clocks fire during
 * execve. A program killed by a signal after exec is a death.
 *
 *   reexec drive TOTAL CHAIN MB   forks chains of CHAIN execs until TOTAL
 *                                 execs are done; prints "execs N deaths D"
 *   reexec chain K MB FD          (internal) one link: writes a byte to FD,
 *                                 then execs `chain K-1` (K == 0: exit 0)
 *
 * The exec function used rotates through the exec family. */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

extern char **environ;
static volatile int stop_threads;

static void burn_ms(double ms) {
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    volatile unsigned long x = 0;
    for (;;) {
        for (int i = 0; i < 10000; i++) x += i * x + 1;
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
        if ((b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6 >= ms) return;
    }
}

static void *busy(void *arg) {
    (void)arg;
    volatile unsigned long x = 0;
    while (!stop_threads) x = x * 3 + 1;
    return NULL;
}

static int chain(int k, long mb, int fd, const char *self) {
    char one = 1;
    if (write(fd, &one, 1) != 1) return 3;
    if (k == 0) return 0;
    size_t len = (size_t)mb << 20;
    char *mem = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
    if (mem == MAP_FAILED) return 4;
    mem[len - 1] = 1;
    pthread_t t[2];
    for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, busy, NULL);
    burn_ms(3);
    char ks[16], mbs[16], fds[16];
    snprintf(ks, sizeof ks, "%d", k - 1);
    snprintf(mbs, sizeof mbs, "%ld", mb);
    snprintf(fds, sizeof fds, "%d", fd);
    char *argv[] = {(char *)self, "chain", ks, mbs, fds, NULL};
    switch (k % 6) {
    case 0: execve(self, argv, environ); break;
    case 1: execv(self, argv); break;
    case 2: execvp(self, argv); break;
    case 3: execl(self, self, "chain", ks, mbs, fds, (char *)NULL); break;
    case 4: execle(self, self, "chain", ks, mbs, fds, (char *)NULL, environ); break;
    default: {
        int efd = open(self, O_RDONLY | O_CLOEXEC);
        if (efd >= 0) {
            /* fexecve of a CLOEXEC fd fails for scripts only; this is an ELF. */
            fexecve(efd, argv, environ);
        }
        break;
    }
    }
    perror("exec");
    return 5;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "chain") == 0)
        return chain(atoi(argv[2]), atol(argv[3]), atoi(argv[4]), argv[0]);
    if (argc != 5 || strcmp(argv[1], "drive") != 0 || atol(argv[3]) < 1) {
        fprintf(stderr, "usage: reexec drive TOTAL CHAIN MB\n");
        return 2;
    }
    long total = atol(argv[2]), len = atol(argv[3]);
    const char *mb = argv[4];
    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 2;
    self[n] = 0;
    long execs = 0, deaths = 0, failures = 0;
    while (execs < total) {
        int p[2];
        if (pipe(p) != 0) return 2;
        pid_t pid = fork();
        if (pid == 0) {
            close(p[0]);
            char ks[16], fds[16];
            snprintf(ks, sizeof ks, "%ld", len);
            snprintf(fds, sizeof fds, "%d", p[1]);
            execl(self, self, "chain", ks, mb, fds, (char *)NULL);
            _exit(127);
        }
        close(p[1]);
        char buf[256];
        long links = 0;
        ssize_t r;
        while ((r = read(p[0], buf, sizeof buf)) > 0) links += r;
        close(p[0]);
        int st;
        waitpid(pid, &st, 0);
        /* one byte per program started: the first is the driver's child's exec */
        execs += links;
        if (WIFSIGNALED(st)) {
            execs++; /* the exec whose program was killed */
            deaths++;
            fprintf(stderr, "death: signal %d after %ld links\n", WTERMSIG(st), links);
        } else if (WEXITSTATUS(st) != 0) {
            failures++;
            fprintf(stderr, "failure: exit %d after %ld links\n", WEXITSTATUS(st), links);
            if (links == 0) break;
        }
    }
    printf("execs %ld deaths %ld failures %ld\n", execs, deaths, failures);
    return 0;
}
