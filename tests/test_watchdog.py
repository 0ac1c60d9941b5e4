"""No orphans: a server started through app/core/watchdog.py ends when the process that started it dies,
by SIGKILL or a segfault included, and is otherwise the plain child Popen gives (its own pid, return code
and pipes). Parents here are real Python processes; the "servers" are real processes (sh, sleep, SeaweedFS).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from kvgraft.app.core.watchdog import guarded_popen

REPO = Path(__file__).resolve().parents[1]


def alive(pid: int) -> bool:
    """Running (a zombie waiting for its reaper has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout: float = 15.0) -> list[int]:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.1)
    return [p for p in pids if alive(p)]


def watchdogs_for(parent: int, command_part: bytes = b"") -> list[int]:
    """Running watchdog processes that guard a child of `parent` (their command names it), whose guarded
    command holds `command_part`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        script = next((i for i, c in enumerate(cmd) if c.endswith(b"watchdog.py")), None)
        watching = script is not None and cmd[script + 1 : script + 2] == [str(parent).encode()]
        watching = watching and any(command_part in c for c in cmd[script + 1 :])
        if watching and alive(int(proc.name)):
            found.append(int(proc.name))
    return found


PARENT = textwrap.dedent(
    """
    import json, subprocess, sys, time
    from kvgraft.app.core.watchdog import guarded_popen
    server = guarded_popen(["sh", "-c", {server!r}], stdout=subprocess.PIPE, grace=1.0, {kwargs})
    grandchild = int(server.stdout.readline())
    print(json.dumps({{"server": server.pid, "grandchild": grandchild}}), flush=True)
    {then}
    """
)
# group mode: a "server" in its own session with a child of its own, both must go; pid mode: the server itself
MODES = {
    "group": ("sleep 300 & echo $!; wait", "start_new_session=True"),
    "pid": ("echo $$; exec sleep 300", ""),
}


def start_parent(
    server_script: str, then: str, kwargs: str = "start_new_session=True"
) -> tuple[subprocess.Popen, dict]:
    code = PARENT.format(server=server_script, then=then, kwargs=kwargs)
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = parent.stdout.readline()
    assert line, "the parent did not start its server"
    return parent, json.loads(line)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize(
    "death, then",
    [
        ("SIGKILL", "time.sleep(300)"),
        ("segfault", "time.sleep(0.5); import ctypes; ctypes.string_at(0)"),
        ("exit", "time.sleep(0.5); sys.exit(0)"),
    ],
)
def test_a_server_dies_with_the_process_that_started_it(death, then, mode):
    parent, pids = start_parent(*MODES[mode][:1], then, MODES[mode][1])
    assert alive(pids["server"]) and alive(pids["grandchild"])
    assert watchdogs_for(parent.pid), "no watchdog guards the server"
    if death == "SIGKILL":
        parent.kill()
    rc = parent.wait(30)
    assert rc == {"SIGKILL": -signal.SIGKILL, "segfault": -signal.SIGSEGV, "exit": 0}[death]
    assert wait_gone([pids["server"], pids["grandchild"]]) == [], "the server outlived its parent"
    assert wait_gone(watchdogs_for(parent.pid)) == []


def test_a_server_that_ignores_sigterm_is_killed_after_the_grace():
    parent, pids = start_parent("trap '' TERM; sleep 300 & echo $!; wait", "time.sleep(300)")
    t0 = time.monotonic()
    parent.kill()
    parent.wait(30)
    assert wait_gone([pids["server"], pids["grandchild"]]) == []
    assert time.monotonic() - t0 >= 0.9  # SIGTERM was ignored: SIGKILL came after the 1 s grace


def test_a_group_member_left_after_its_leader_ended_is_still_guarded():
    """The leader exits by itself and leaves a child in its group: that child still dies with the parent."""
    parent, pids = start_parent("sleep 300 > /dev/null & echo $!", "time.sleep(300)")
    assert wait_gone([pids["server"]]) == [] and alive(pids["grandchild"])
    assert watchdogs_for(parent.pid), "the watchdog left while the group had a member"
    parent.kill()
    parent.wait(30)
    assert wait_gone([pids["grandchild"]]) == [], "a group member outlived the parent"


def sig_ignored(pid: int) -> str:
    status = Path(f"/proc/{pid}/status").read_text()
    return next(line for line in status.splitlines() if line.startswith("SigIgn:"))


def test_the_guarded_child_is_the_plain_child(tmp_path):
    """Its pid, return code, pipes and ignored signals are the plain Popen child's, and its watchdog leaves
    with it; a command that cannot be found raises as Popen does."""
    cmd = ["sh", "-c", "echo $$; read line; echo got $line; exit 3", "plain-child"]
    proc = guarded_popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    plain = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert int(proc.stdout.readline()) == proc.pid and int(plain.stdout.readline()) == plain.pid
    assert Path(f"/proc/{proc.pid}/cmdline").read_bytes().split(b"\0")[0] == b"sh"
    assert sig_ignored(proc.pid) == sig_ignored(plain.pid)  # SIGPIPE and SIGXFSZ at their defaults
    assert watchdogs_for(os.getpid(), b"plain-child"), "no watchdog guards the child"
    out, _ = proc.communicate("hello\n", timeout=30)  # EOF arrives: the watchdog holds no end of the pipe
    assert plain.communicate("hello\n", timeout=30)[0] == out == "got hello\n"
    assert proc.returncode == plain.returncode == 3
    assert wait_gone(watchdogs_for(os.getpid(), b"plain-child")) == []

    for missing in (["/nonexistent/kvgraft-server"], ["kvgraft-no-such-command"]):
        with pytest.raises(FileNotFoundError):
            guarded_popen(missing)
    with pytest.raises(TypeError):
        guarded_popen("sleep 1", shell=True)


def test_a_sigkilled_parent_leaves_no_seaweedfs_running(tmp_path):
    """The server the remote tests use (app/lab/local_s3.py), started by a parent that is then SIGKILLed."""
    code = textwrap.dedent(
        f"""
        import json, time
        from kvgraft.app.lab.local_s3 import LocalS3
        s3 = LocalS3(root={str(tmp_path)!r}).start()
        print(json.dumps({{"pid": s3.proc.pid}}), flush=True)
        time.sleep(300)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    line = parent.stdout.readline()
    assert line, "SeaweedFS did not start"
    weed = json.loads(line)["pid"]
    assert alive(weed) and b"weed" in Path(f"/proc/{weed}/cmdline").read_bytes()
    parent.kill()
    parent.wait(30)
    assert wait_gone([weed], timeout=30) == [], "SeaweedFS outlived its SIGKILLed parent"
