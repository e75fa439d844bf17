"""Workload of tests/native.rs: Python functions that spend their time in a
C extension (`ospreyspin.spin`, from the directory given as argv[1]) and in
the system zlib (`zlib.compress`), until killed."""
import os
import sys
import zlib

sys.path.insert(0, sys.argv[1])
import ospreyspin  # noqa: E402

DATA = os.urandom(1 << 15) + bytes(1 << 15)


def compress_it():
    zlib.compress(DATA, 9)


def spin_it():
    ospreyspin.spin(1_000_000)


print("ready", flush=True)
while True:
    compress_it()
    spin_it()
