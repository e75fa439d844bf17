"""A prefork server: the master listens, forks 2 workers (os.fork) that
accept and answer requests by running `handle`, sends them 40 requests,
then stops them and reaps them with os.wait()."""
import os
import signal
import socket
import time


def handle(n):
    s = 0
    for i in range(n):
        s += i * i
    return s


def worker(sock):
    while True:
        conn, _ = sock.accept()
        n = int(conn.recv(64))
        conn.sendall(str(handle(n)).encode())
        conn.close()


def main():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    port = sock.getsockname()[1]
    pids = []
    for _ in range(2):
        pid = os.fork()
        if pid == 0:
            worker(sock)
            os._exit(0)
        pids.append(pid)
    for _ in range(40):
        c = socket.create_connection(("127.0.0.1", port))
        c.sendall(b"400000")
        c.recv(128)
        c.close()
    for pid in pids:
        os.kill(pid, signal.SIGTERM)
    reaped = sorted(os.wait()[0] for _ in pids)
    print("workers", pids, "reaped", reaped, flush=True)
    assert reaped == sorted(pids)


if __name__ == "__main__":
    main()
