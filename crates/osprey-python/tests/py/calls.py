"""Call-heavy workloads for the stack reader tests.

recurse: a loop calling a 20-deep recursion (22 frames with main and the
module). deep N: a recursion N deep that stays there spinning.
Prints "ready" once running; runs until killed."""
import sys


def recurse(n):
    if n == 0:
        return 0
    return recurse(n - 1) + 1


def spin_at(n):
    if n == 0:
        print("ready", flush=True)
        x = 0
        while True:
            x += 1
    return spin_at(n - 1)


def main():
    if sys.argv[1] == "deep":
        sys.setrecursionlimit(int(sys.argv[2]) + 100)
        spin_at(int(sys.argv[2]))
    print("ready", flush=True)
    while True:
        recurse(19)


main()
