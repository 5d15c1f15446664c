"""The adversarial battery: attacks through the public API earn nothing, reach nothing outside the
sandbox and stay within its limits; hostile snapshot blobs and workspaces never crash the host."""

import gzip
import io
import json
import os
import stat
import tarfile
import threading
import zlib

import pytest

import envs
from envs.actions import Finish, Run, Write
from envs.adversarial import ATTACKS, check_host, host, run_attack
from envs.jail import Limits
from envs.sandbox import Sandbox


@pytest.fixture(scope="module")
def h():
    with host() as hst:
        yield hst


@pytest.mark.parametrize("attack", ATTACKS, ids=[a.name for a in ATTACKS])
def test_attack_earns_nothing_and_stays_inside(attack, h):
    r = run_attack(attack, h)
    assert r.reward == 0.0
    assert r.escapes == [], r.outputs


def test_the_host_checks_see_an_escape(h):
    # The battery would pass trivially if check_host could not see anything.
    assert check_host(h, [f"... {h.secret} ..."]) == ["the host secret appeared in an observation"]
    (h.canary_dir / "pwned").write_text("x")
    try:
        assert any("pwned" in e for e in check_host(h, []))
    finally:
        (h.canary_dir / "pwned").unlink()


def _blob(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return gzip.compress(buf.getvalue())


def _workspace_tar(entries) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for info in entries:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return buf.getvalue()


def test_hostile_snapshot_blobs_are_refused_cheaply():
    limits = Limits(disk_bytes=1 << 20)
    with envs.make_env("write_function", limits=limits) as env:
        env.reset(seed=4)
        good = env.snapshot()
        state = json.loads(tarfile.open(fileobj=io.BytesIO(gzip.decompress(good))).extractfile("episode.json").read())
        ws = tarfile.open(fileobj=io.BytesIO(gzip.decompress(good))).extractfile("workspace.tar").read()
        # A task whose hidden cases were rewritten to pass anything, hash recomputed to match.
        from envs.tasks.coding import cases_digest
        spec = state["task"]["spec"]
        spec["hidden_cases"] = [{**c, "setup": "", "expr": "1", "expected": ["int", 1]} for c in spec["hidden_cases"]]
        spec["hidden_sha256"] = cases_digest(spec["hidden_cases"])
        forged = _blob({"episode.json": json.dumps(state).encode(), "workspace.tar": ws})
        # A gzip bomb: 100 MB of zeros, far beyond this env's snapshot limit.
        z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        bomb = b"".join(z.compress(bytes(1 << 20)) for _ in range(100)) + z.flush()
        escape = tarfile.TarInfo("../escape")
        escape.size = 1
        fifo = tarfile.TarInfo("fifo")
        fifo.type = tarfile.FIFOTYPE
        orphan = tarfile.TarInfo("nodir/file")
        orphan.size = 1
        bad_trees = [_workspace_tar([escape]), _workspace_tar([fifo]), _workspace_tar([orphan])]
        blobs = [forged, bomb, b"not gzip", good[: len(good) // 2], gzip.compress(b"x" * 1000),
                 _blob({"episode.json": b"[]", "workspace.tar": ws}),
                 _blob({"episode.json": json.dumps(state).encode(), "workspace.tar": ws, "extra": b""})]
        blobs += [_blob({"episode.json": good_state, "workspace.tar": t})
                  for t in bad_trees for good_state in [json.dumps(json.loads(
                      tarfile.open(fileobj=io.BytesIO(gzip.decompress(good))).extractfile("episode.json").read())).encode()]]
        for blob in blobs:
            with pytest.raises(ValueError):
                env.restore(blob)
        assert env.restore(good) == env.reset(seed=4)


def test_the_workspace_never_crashes_the_host_copy(tmp_path):
    with envs.make_env("write_function") as env:
        env.reset(seed=1)
        sb = env.sandbox
        ws = sb.workspace
        os.mkfifo(ws / "fifo.py")
        if os.geteuid() == 0:
            os.mknod(ws / "null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
        # A host thread keeps creating and deleting files while the env copies and hashes the tree.
        stop = threading.Event()

        def churn():
            i = 0
            while not stop.is_set():
                p = ws / f"churn{i % 7}"
                try:
                    p.write_text("x" * (i % 5000))
                    if i % 3 == 0:
                        p.unlink()
                except OSError:
                    pass
                i += 1

        t = threading.Thread(target=churn)
        t.start()
        try:
            for _ in range(20):
                env.state_digest()
                env.snapshot()
        finally:
            stop.set()
            t.join()
        name = env.task.spec["snippet"]
        env.step(env.harness.render_calls([Write("solution.py", f"def {name}(*a):\n    return None\n")]))
        env.step(env.harness.render_calls([Run("ln -s fifo.py solution2.py; mkfifo tests.py")], start_index=1))
        _, reward, term, _, info = env.step(env.harness.render_calls([Finish()], start_index=2))
        assert term and reward == 0.0
        root = sb.root
    assert not root.exists()


def test_a_deep_tree_is_removed_on_close():
    sb = Sandbox()
    r = sb.run("python -c \"import os\nfor i in range(3000):\n    os.mkdir('d'); os.chdir('d')\"")
    assert r.exit_code == 0, r.output
    sb.digest()
    root = sb.root
    sb.close()
    assert not root.exists()
