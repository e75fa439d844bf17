/* Children made every way, each ending with exit(): raw clone(SIGCHLD)
 * (no fork hooks run), fork, vfork + _exit, vfork + exec, and a daemon
 * (double fork + setsid). The parent burns CPU between them and exits 0
 * if every child exited 0; the children are checked to have run. */
#define _GNU_SOURCE
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

__attribute__((noinline)) void parent_work(void) { burn_ms(20); }
__attribute__((noinline)) void child_work(void) { burn_ms(5); }

static int wait_ok(pid_t pid, const char *what) {
    int st;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "%s child: status %#x\n", what, st);
        return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 5, bad = 0;
    for (int r = 0; r < rounds; r++) {
        parent_work();
        /* raw clone, no CLONE_VM: the child inherits the agent without fork hooks */
        pid_t pid = syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0);
        if (pid == 0) {
            child_work();
            exit(0);
        }
        bad += wait_ok(pid, "clone");
        pid = fork();
        if (pid == 0) {
            child_work();
            exit(0);
        }
        bad += wait_ok(pid, "fork");
        pid = vfork();
        if (pid == 0) _exit(0);
        bad += wait_ok(pid, "vfork");
        pid = vfork();
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        bad += wait_ok(pid, "vfork+exec");
        /* daemon: fork, setsid, fork again; the grandchild exits by itself */
        int p[2];
        if (pipe(p) != 0) return 2;
        pid = fork();
        if (pid == 0) {
            setsid();
            if (fork() == 0) {
                child_work();
                close(p[0]);
                if (write(p[1], "d", 1) != 1) _exit(3);
                exit(0);
            }
            exit(0);
        }
        close(p[1]);
        bad += wait_ok(pid, "daemon");
        char c;
        if (read(p[0], &c, 1) != 1) {
            fprintf(stderr, "daemon grandchild did not run\n");
            bad++;
        }
        close(p[0]);
    }
    printf("rounds %d bad %d\n", rounds, bad);
    return bad != 0;
}
