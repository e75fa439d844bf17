"""Call-heavy workloads for the stack reader tests.

recurse: a loop calling a 20-deep recursion (22 frames with main and the
module). deep N: a recursion N deep that stays there spinning. from_c: a
loop calling `Made.__init__` (which the interpreter calls from C) and
`direct`, each about 5 us of work; the loop itself is a few percent.
chain: a loop calling a -> b -> c, each a microsecond or less of work.
gen: a loop over a generator, `consume` taking each item `produce` yields
(each side well under a microsecond an item).
short: calls of a microsecond or so, most of them entered from C: `Made.__init__`
through `map`, `Key.__hash__` from a dict lookup, the generator `produce`
resumed by `sum`, and `direct` called from Python; `short_loop` itself a few
percent. task_short: the same calls in two asyncio tasks (`short_task`) that
take turns at each round. span_short: the same calls in `span_loop`, 20 rounds
per OpenTelemetry span (the real SDK on PYTHONPATH), the span current
while they run.
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


class Made:
    def __init__(self, n):
        s = 0
        for i in range(n):
            s += i
        self.s = s


def direct(n):
    s = 0
    for i in range(n):
        s += i
    return s


def c(n):
    s = 0
    for i in range(n):
        s += i
    return s


def b(n):
    return c(n) + sum(range(n))


def a(n):
    return b(n) + len(str(n))


def produce(n):
    for i in range(n):
        x = (i * 3 + 1) ^ (i >> 2)
        yield x


def consume(n):
    s = 0
    for x in produce(n):
        s += x & 7
        s ^= x >> 3
    return s


class Key:
    """A dict key whose hash is computed in Python (the same objects are looked
    up, so `__eq__` is never called: identity decides)."""

    def __hash__(self):
        h = id(self) & 0xFFFF
        for i in range(12):
            h = (h * 31 + i) & 0xFFFF
        return h


def short_loop():
    keys = [Key() for _ in range(2)]
    table = {k: i for i, k in enumerate(keys)}
    sizes = [20] * 4
    while True:
        list(map(Made, sizes))
        for k in keys:
            table[k]
        sum(produce(30))
        direct(60)


async def short_task():
    import asyncio

    keys = [Key() for _ in range(2)]
    table = {k: i for i, k in enumerate(keys)}
    sizes = [20] * 4
    while True:
        list(map(Made, sizes))
        for k in keys:
            table[k]
        sum(produce(30))
        direct(60)
        await asyncio.sleep(0)


def span_loop():
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider

    trace.set_tracer_provider(TracerProvider())
    tracer = trace.get_tracer("osprey-accuracy")
    keys = [Key() for _ in range(2)]
    table = {k: i for i, k in enumerate(keys)}
    sizes = [20] * 4
    while True:
        with tracer.start_as_current_span("batch"):
            for _ in range(20):
                list(map(Made, sizes))
                for k in keys:
                    table[k]
                sum(produce(30))
                direct(60)


async def two_tasks():
    import asyncio

    await asyncio.gather(asyncio.create_task(short_task()), asyncio.create_task(short_task()))


def main():
    if sys.argv[1] == "deep":
        sys.setrecursionlimit(int(sys.argv[2]) + 100)
        spin_at(int(sys.argv[2]))
    print("ready", flush=True)
    if sys.argv[1] == "chain":
        while True:
            for i in range(200):
                a(i % 20)
    if sys.argv[1] == "gen":
        while True:
            consume(2000)
    if sys.argv[1] == "short":
        short_loop()
    if sys.argv[1] == "span_short":
        span_loop()
    if sys.argv[1] == "task_short":
        import asyncio

        asyncio.run(two_tasks())
    if sys.argv[1] == "from_c":
        while True:
            Made(300)
            direct(300)
    while True:
        recurse(19)


main()
