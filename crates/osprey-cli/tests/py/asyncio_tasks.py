"""Two event loops, each running a named task that is blocked inside its
coroutine (a synchronous sleep), so that task is the one its thread is
running whenever the process is looked at. Prints "ready" once both run."""

import asyncio
import sys
import threading
import time

side_running = threading.Event()


async def side_blocker():
    side_running.set()
    time.sleep(600)


async def main_blocker():
    side_running.wait()
    print("ready", flush=True)
    time.sleep(600)


async def main():
    await asyncio.create_task(main_blocker(), name="main-blocker")


def side_loop():
    async def run():
        await asyncio.create_task(side_blocker(), name="side-blocker")

    asyncio.run(run())


threading.Thread(target=side_loop, name="loop-thread", daemon=True).start()
asyncio.run(main())
sys.exit(0)
