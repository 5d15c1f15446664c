"""Sandbox confinement, jailed commands (limits, empty environment, no network), snapshots."""

import os
import socket
import time

import pytest

from envs import jail
from envs.jail import JailUnavailable, Limits, run_command
from envs.sandbox import Sandbox, SandboxError


@pytest.fixture
def sb():
    s = Sandbox()
    yield s
    s.close()


def test_file_tools_stay_inside_the_root(sb, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("top secret")
    sb.write("ok/a.txt", "hello\n")
    assert sb.read("ok/a.txt").lines == ["hello"]
    # Links planted by a command: to a file outside, to a directory outside, to a file inside.
    sb.run(f"ln -s {secret} out_file; ln -s {tmp_path} out_dir; ln -s ok/a.txt in_link")
    bad = ["../x", "ok/../../x", "/etc/passwd", str(secret), "out_file", "out_dir/secret.txt", "in_link",
           "ok/\x00x", "a/" * 3000]
    for path in bad:
        with pytest.raises(SandboxError):
            sb.read(path)
        with pytest.raises(SandboxError):
            sb.write(path, "pwned")
    with pytest.raises(SandboxError):
        sb.edit("out_file", "top", "pwned")
    with pytest.raises(SandboxError):
        sb.search("secret", "out_dir")
    assert secret.read_text() == "top secret"
    # A search of the whole tree does not follow the links either.
    assert sb.search("secret") == []


def test_write_breaks_hard_links(sb, tmp_path):
    outside = tmp_path / "victim.txt"
    outside.write_text("original")
    if sb.own_filesystem:
        # The workspace is its own tmpfs: no link can join it to a file outside; try one inside.
        with pytest.raises(OSError):
            os.link(outside, sb.workspace / "hard.txt")
        sb.write("victim.txt", "original")
        outside = sb.workspace / "victim.txt"
    os.link(outside, sb.workspace / "hard.txt")
    sb.write("hard.txt", "changed")
    assert outside.read_text() == "original"


def test_edit_rules(sb):
    sb.write("f.py", "a = 1\na = 1\n")
    with pytest.raises(SandboxError, match="2 times"):
        sb.edit("f.py", "a = 1", "a = 2")
    assert sb.edit("f.py", "a = 1", "a = 2", replace_all=True) == 2
    with pytest.raises(SandboxError, match="not found"):
        sb.edit("f.py", "zzz", "y")
    assert sb.read("f.py", offset=2, limit=1).lines == ["a = 2"]


def test_command_gets_an_empty_environment(sb, monkeypatch):
    monkeypatch.setenv("K3_SECRET_TOKEN", "hunter2")
    r = sb.run("env")
    assert r.exit_code == 0
    assert "hunter2" not in r.output and "K3_SECRET_TOKEN" not in r.output
    names = {line.split("=", 1)[0] for line in r.output.splitlines() if "=" in line}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD", "SHLVL", "_"}


def test_command_limits(sb):
    ws = sb.workspace
    cpu = run_command("python -c 'while True: pass'", ws, Limits(cpu_seconds=1, wall_seconds=20))
    assert cpu.status == "cpu_limit"
    wall = run_command("sleep 30", ws, Limits(wall_seconds=1))
    assert wall.status == "wall_limit" and wall.wall_seconds < 10
    mem = run_command("python -c 'x = bytearray(1 << 30)'", ws, Limits(memory_bytes=300 << 20))
    assert mem.exit_code != 0 and "MemoryError" in mem.output
    big = run_command("yes | head -c 100000000", ws, Limits(output_chars=1000))
    assert len(big.output) < 1100
    # Background jobs die with the command, setsid or not.
    run_command("(sleep 0.3; touch late.txt) & setsid sh -c 'sleep 0.3; touch late2.txt' &", ws, Limits())
    time.sleep(1.0)
    assert not (ws / "late.txt").exists() and not (ws / "late2.txt").exists()


def test_no_network(sb):
    tmp_path = sb.workspace
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    # A listening socket completes the TCP handshake from its backlog: a reachable port connects.
    try:
        for flag in ("", "-I "):
            code = f"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port})); print('CONNECTED')"
            r = run_command(f'python {flag}-c "{code}"', tmp_path, Limits(wall_seconds=10))
            assert "CONNECTED" not in r.output
    finally:
        server.close()


def test_pack_unpack_is_exact_and_deterministic(sb):
    sb.write("a/b/c.txt", "x\n")
    sb.write("d.sh", "#!/bin/sh\necho hi\n")
    sb.run("chmod +x d.sh; mkdir -p empty/dir; ln -s /etc/passwd link")
    blob = sb.pack()
    assert sb.pack() == blob
    other = Sandbox()
    try:
        other.unpack(blob)
        assert other.manifest() == sb.manifest()
        assert other.digest() == sb.digest()
        assert other.run("./d.sh").output == "hi\n"
        assert os.path.islink(other.workspace / "link")
    finally:
        other.close()


def test_search_is_sorted_and_handles_bad_patterns(sb):
    for name in ("b.txt", "a.txt", "sub/c.txt"):
        sb.write(name, "alpha\nbeta\nalphabet\n")
    hits = sb.search("^alpha")
    assert hits == ["a.txt:1:alpha", "a.txt:3:alphabet", "b.txt:1:alpha", "b.txt:3:alphabet",
                    "sub/c.txt:1:alpha", "sub/c.txt:3:alphabet"]
    with pytest.raises(SandboxError):
        sb.search("(unclosed")
    # A pattern that backtracks for ages in a backtracking engine returns at once from grep -E.
    sb.write("slow.txt", "a" * 5000 + "\n")
    assert sb.search("(a+)+b$") == []


def test_commands_see_the_workspace_as_slash_workspace(sb):
    sb.write("notes.txt", "hi\n")
    r = sb.run("pwd; cat /workspace/notes.txt; python -c 'import os; print(os.getcwd())'")
    assert r.output == "/workspace\nhi\n/workspace\n"
    assert str(sb.workspace) not in sb.run("echo $HOME; ls -d $PWD").output


def test_no_bwrap_means_no_sandbox(monkeypatch):
    """Where bubblewrap is missing, making an env fails with what to do; nothing runs unjailed."""
    monkeypatch.setenv("PATH", "/nonexistent")
    jail.check_bwrap.cache_clear()
    try:
        with pytest.raises(JailUnavailable, match="apt-get install -y bubblewrap"):
            Sandbox()
    finally:
        jail.check_bwrap.cache_clear()
