/* Two functions with set costs, for `osprey diff`: steady() spins STEADY
 * and varying() VARYING million iterations of the same loop, each in its
 * own body (self time, not a shared callee), interleaved in 20 rounds so
 * both see the same machine. Usage: shares STEADY VARYING */
#include <stdint.h>
#include <stdlib.h>

static volatile uint64_t sink;

#define SPIN(n)                                                     \
    for (int64_t i_ = 0; i_ < (n); i_++) sink = sink * 31 + (uint64_t)i_

__attribute__((noinline)) void steady(int64_t n) { SPIN(n); }
__attribute__((noinline)) void varying(int64_t n) { SPIN(n); }

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int64_t s = atoll(argv[1]) * 1000000 / 20, v = atoll(argv[2]) * 1000000 / 20;
    for (int r = 0; r < 20; r++) {
        steady(s);
        varying(v);
    }
    return 0;
}
