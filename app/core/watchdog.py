"""Child servers that die with the process that started them, however it dies.

`guarded_popen(args, ...)` is `subprocess.Popen(args, ...)` for a long-lived child (SeaweedFS, `kvgraft serve`
in test fixtures, llama-server in benchmarks): when the process that called it ends in any way (a normal exit,
an exception, SIGKILL, a segfault), the child and, when it was started with `start_new_session=True`, its
whole process group get SIGTERM, then SIGKILL after `grace` seconds.

How (no `preexec_fn`, no parent-death signal: both are unsafe once threads exist, and PR_SET_PDEATHSIG
fires when the forking *thread* exits): Popen starts this file as a small launcher under the same Python
(`-I -S`: the standard library only, nothing from the environment). The launcher forks a watchdog and then
`exec`s the real command in place, so `Popen.pid`, signals and the return code are the child's own. The
watchdog (double-forked, so init reaps it, in a process group of its own so that a group kill of the child
does not end it first) waits on pidfds of the starting process and of the child: when the starting process
is gone it ends the child; when the child is gone it exits. tests/test_watchdog.py SIGKILLs and segfaults a
parent and finds no child left.

A frozen bundle has no Python to run this file with: there `guarded_popen` is plain Popen (the bundle starts
no child servers; tests, scripts and `python -m kvgraft.app.lab.local_s3` do).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys

GRACE_S = 5.0


def guarded_popen(args: list[str], *, grace: float = GRACE_S, **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(args, **popen_kwargs)`, ended when this process ends (see the module doc)."""
    if getattr(sys, "frozen", False):
        return subprocess.Popen(args, **popen_kwargs)  # noqa: S603 (the caller's own command)
    group = bool(popen_kwargs.get("start_new_session"))
    launcher = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
    launcher += [str(os.getpid()), "group" if group else "pid", repr(float(grace)), "--", *map(str, args)]
    return subprocess.Popen(launcher, **popen_kwargs)  # noqa: S603


# -- the launcher and the watchdog (run as a script: standard library only) ----------------------------------


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid`, or None when that process is already gone."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def _wait_either(parent: int, child: int) -> str:
    """'parent' when the starting process ended first, 'child' when the child did."""
    pfd, cfd = _open_pidfd(parent), _open_pidfd(child)
    if pfd is None:
        return "parent"
    if cfd is None:
        return "child"
    if _gone(parent):  # gone between the fork and pidfd_open (the pidfd of a zombie is readable anyway)
        return "parent"
    poller = select.poll()
    poller.register(pfd, select.POLLIN)
    poller.register(cfd, select.POLLIN)
    while True:
        ready = {fd for fd, _ in poller.poll()}
        if cfd in ready:
            return "child"
        if pfd in ready:
            return "parent"


def _end(child: int, group: bool, grace: float) -> None:
    kill = os.killpg if group else os.kill
    try:
        kill(child, signal.SIGTERM)
    except ProcessLookupError:
        return
    cfd = _open_pidfd(child)
    if cfd is not None and select.select([cfd], [], [], grace)[0]:
        return
    with contextlib.suppress(ProcessLookupError):
        kill(child, signal.SIGKILL)


def _watch(parent: int, child: int, group: bool, grace: float) -> None:
    os.setpgid(0, 0)  # out of the child's group: its group kill must not end us first
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl+C goes to the parent, which decides
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):  # hold none of the child's pipes open: its reader must see EOF when it exits
        os.dup2(devnull, fd)
    os.closerange(3, 65536)
    if _wait_either(parent, child) == "parent":
        _end(child, group, grace)


def _launch(argv: list[str]) -> None:
    parent, mode, grace = int(argv[0]), argv[1], float(argv[2])
    cmd = argv[4:]
    child = os.getpid()  # after exec, this process is the command
    first = os.fork()
    if first == 0:
        if os.fork() == 0:  # the grandchild is the watchdog; init reaps it
            try:
                _watch(parent, child, mode == "group", grace)
            finally:
                os._exit(0)
        os._exit(0)
    os.waitpid(first, 0)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cannot run {cmd[0]}: {exc}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    _launch(sys.argv[1:])
