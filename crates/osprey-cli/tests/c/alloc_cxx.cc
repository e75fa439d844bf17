// C++ allocation fixture: `operator new`/`delete` in their plain, array and
// aligned forms. new_plain keeps 16 MiB of `new char[4096]`, new_aligned
// keeps 16 MiB of 64-byte-aligned 4 KiB objects, churn_d news and deletes
// 256 MiB of aligned objects (sized and aligned deletes) and keeps nothing.
// Every pointer escapes to a global, so no new/delete pair is elided.
#include <unistd.h>
#include <cstdio>
#include <new>

struct alignas(64) Block {
    char bytes[4096];
};

static void *kept[8192];
static int nkept;
static void *volatile escape;

// About 1 GiB/s: a pause every 4 MiB keeps the samples within the ring.
static void pace(int i) {
    if (i % 1024 == 1023) usleep(4000);
}

__attribute__((noinline)) void new_plain() {
    for (int i = 0; i < 4096; i++) {
        char *p = new char[4096];
        p[0] = 1;
        kept[nkept++] = p;
        pace(i);
    }
}

__attribute__((noinline)) void new_aligned() {
    for (int i = 0; i < 4096; i++) {
        Block *b = new Block;
        b->bytes[0] = 1;
        kept[nkept++] = b;
        pace(i);
    }
}

__attribute__((noinline)) void churn_d() {
    for (int i = 0; i < 65536; i++) {
        Block *b = new Block;
        b->bytes[0] = 1;
        escape = b;
        delete b;
        pace(i);
    }
}

int main() {
    new_plain();
    churn_d();
    new_aligned();
    std::printf("kept %d\n", nkept);
    return 0;
}
