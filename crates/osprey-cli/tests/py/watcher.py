"""Stands in for `osprey exec` as the watcher CPython's agent wakes: runs
argv[1:] with the agent ($WATCHER_PRELOAD) preloaded and
OSPREY_PYTHON_SAMPLER naming this process, and prints the child's pid, then
the pid of each process that sent this one SIGCHLD by kill."""
import os
import signal
import subprocess
import sys

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
start = open(f"/proc/{os.getpid()}/stat").read().rsplit(")", 1)[1].split()[19]
env = dict(os.environ, LD_PRELOAD=os.environ["WATCHER_PRELOAD"], OSPREY_PYTHON_SAMPLER=f"{os.getpid()}:{start}")
child = subprocess.Popen(sys.argv[1:], env=env)
senders = []
# Until the child ended and no signal is left pending.
while (info := signal.sigtimedwait({signal.SIGCHLD}, 0.05)) is not None or child.poll() is None:
    if info is not None and info.si_code == 0:  # SI_USER: sent by kill
        senders.append(info.si_pid)
print(child.pid, *senders)
