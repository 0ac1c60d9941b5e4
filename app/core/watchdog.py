"""Child servers that die with the process that started them, however it dies.

`guarded_popen(args, ...)` is `subprocess.Popen(args, ...)` for a long-lived child (SeaweedFS, `kvgraft serve`
in test fixtures, llama-server in benchmarks): when the process that called it ends in any way (a normal exit,
an exception, SIGKILL, a segfault), the child gets SIGTERM, then SIGKILL after `grace` seconds; when it was
started in a session or process group of its own (`start_new_session=True`, `process_group=0`), its whole
process group does, and the group is watched until it is empty.

How (no `preexec_fn`, no parent-death signal: both are unsafe once threads exist, and PR_SET_PDEATHSIG
fires when the forking *thread* exits): Popen starts this file as a small launcher under the same Python
(`-I -S`: the standard library only, nothing from the environment). The launcher opens pidfds of the
starting process and of itself (a pidfd names one process, never a later one that reuses its number), forks
a watchdog and then `exec`s the real command in place, with SIGPIPE and SIGXFSZ back at their defaults as
Popen leaves them, so `Popen.pid`, signals, pipes and the return code are the child's own. The watchdog
(double-forked, so init reaps it, in a process group of its own so that a group kill of the child does not
end it first) waits on the two pidfds: when the starting process is gone it ends the child; when the child
is gone (and its group is empty) it exits. tests/test_watchdog.py SIGKILLs, segfaults and exits a parent
and finds no child left.

A frozen bundle has no Python to run this file with: there `guarded_popen` is plain Popen (the bundle starts
no child servers; tests, scripts and `python -m kvgraft.app.lab.local_s3` do).
"""

from __future__ import annotations

import contextlib
import os
import select
import shutil
import signal
import subprocess
import sys
import time

GRACE_S = 5.0
POLL_S = 0.5  # how often a group whose leader has ended is looked at, and the fallback without pidfds


def guarded_popen(args: list[str], *, grace: float = GRACE_S, **popen_kwargs) -> subprocess.Popen:
    """`subprocess.Popen(args, **popen_kwargs)`, ended when this process ends (see the module doc).
    `args` is a list (no shell); a command that cannot be found raises FileNotFoundError, as Popen does."""
    if isinstance(args, (str, bytes)) or popen_kwargs.get("shell") or "executable" in popen_kwargs:
        raise TypeError("guarded_popen takes an argument list: no shell, no executable=")
    args = [os.fspath(a) for a in args]
    if not args:
        raise ValueError("guarded_popen needs a command")
    if getattr(sys, "frozen", False):
        return subprocess.Popen(args, **popen_kwargs)  # noqa: S603 (the caller's own command)
    env_path = (popen_kwargs.get("env") or os.environ).get("PATH")
    if os.sep not in args[0] and shutil.which(args[0], path=env_path) is None:
        raise FileNotFoundError(2, "No such file or directory", args[0])
    if os.sep in args[0] and not os.access(os.path.join(popen_kwargs.get("cwd") or "", args[0]), os.X_OK):
        raise FileNotFoundError(2, "No such file or directory (or not executable)", args[0])
    group = bool(popen_kwargs.get("start_new_session")) or popen_kwargs.get("process_group") == 0
    launcher = [sys.executable, "-I", "-S", os.path.abspath(__file__)]
    launcher += [str(os.getpid()), "group" if group else "pid", repr(float(grace)), "--", *args]
    return subprocess.Popen(launcher, **popen_kwargs)  # noqa: S603


# -- the launcher and the watchdog (run as a script: standard library only) ----------------------------------


class _Process:
    """One process, named by a pidfd where the kernel has them (else by its number, polled)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        try:
            self.fd: int | None = os.pidfd_open(pid)
        except ProcessLookupError:
            self.fd, self.gone_at_start = None, True
            return
        except OSError:  # no pidfds here (an old kernel, a seccomp filter): fall back to the number
            self.fd = None
        self.gone_at_start = False

    def ended(self, timeout: float = 0.0) -> bool:
        """Whether the process has ended, waiting up to `timeout` seconds for it."""
        if self.gone_at_start:
            return True
        if self.fd is not None:
            return bool(select.select([self.fd], [], [], timeout)[0])
        end = time.monotonic() + timeout
        while True:
            if not _exists(os.kill, self.pid):
                return True
            if time.monotonic() >= end:
                return False
            time.sleep(min(POLL_S, max(0.0, end - time.monotonic())))

    def signal(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            if self.fd is not None:
                signal.pidfd_send_signal(self.fd, sig)
            elif not self.gone_at_start:
                os.kill(self.pid, sig)


def _exists(kill, target: int) -> bool:
    """Whether a process (`os.kill`) or a process group (`os.killpg`) exists (a zombie counts)."""
    try:
        kill(target, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _group_alive(pgid: int) -> bool:
    return _exists(os.killpg, pgid)


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


def _end(child: _Process, group: bool, grace: float) -> None:
    """SIGTERM, then SIGKILL after `grace` seconds to what is left (the whole group in group mode)."""
    if group:
        _signal_group(child.pid, signal.SIGTERM)  # the group's id is the leader's pid: not reused while it has members
        end = time.monotonic() + grace
        while _group_alive(child.pid) and time.monotonic() < end:
            time.sleep(0.05)
        _signal_group(child.pid, signal.SIGKILL)
        return
    child.signal(signal.SIGTERM)
    if not child.ended(grace):
        child.signal(signal.SIGKILL)


def _watch(parent: _Process, child: _Process, group: bool, grace: float) -> None:
    """Until the starting process ends (then end the child) or the child, and in group mode its group, ends."""
    fds = [p.fd for p in (parent, child) if p.fd is not None]
    while True:
        if parent.ended():
            _end(child, group, grace)
            return
        if child.ended():
            if not group or not _group_alive(child.pid):
                return
            parent.ended(POLL_S)  # the leader has ended but its group lives on: keep guarding it
            continue
        if len(fds) == 2:
            select.select(fds, [], [])
        else:
            time.sleep(POLL_S)


def _launch(argv: list[str]) -> None:
    parent_pid, mode, grace = int(argv[0]), argv[1], float(argv[2])
    cmd = argv[4:]
    parent, child = _Process(parent_pid), _Process(os.getpid())  # after exec, this process is the command
    if os.getppid() != parent_pid:  # the starter ended before its pidfd was opened: do not start at all
        os._exit(128 + signal.SIGTERM)
    first = os.fork()
    if first == 0:
        if os.fork() == 0:  # the grandchild is the watchdog; init reaps it
            try:
                os.setpgid(0, 0)  # out of the child's group: its group kill must not end us first
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's Ctrl+C goes to the parent
                devnull = os.open(os.devnull, os.O_RDWR)
                for fd in (0, 1, 2):  # hold none of the child's pipes open: its reader must see EOF
                    os.dup2(devnull, fd)
                keep = sorted({p.fd for p in (parent, child) if p.fd is not None} | {0, 1, 2})
                for lo, hi in zip(keep, [*keep[1:], os.sysconf("SC_OPEN_MAX")], strict=True):
                    os.closerange(lo + 1, hi)
                _watch(parent, child, mode == "group", grace)
            finally:
                os._exit(0)
        os._exit(0)
    _, status = os.waitpid(first, 0)
    if status != 0:
        print("kvgraft watchdog: could not start the watchdog; not starting the command", file=sys.stderr)
        os._exit(126)
    for sig in (signal.SIGPIPE, signal.SIGXFSZ):  # what Popen's restore_signals gives a child
        signal.signal(sig, signal.SIG_DFL)
    try:
        os.execvp(cmd[0], cmd)
    except OSError as exc:
        print(f"cannot run {cmd[0]}: {exc}", file=sys.stderr)
        os._exit(127)


if __name__ == "__main__":
    _launch(sys.argv[1:])
