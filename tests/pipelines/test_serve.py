"""`k3 serve` the command (pipelines/cli.py, pipelines/serve.py): the server in its own process with
the chat client, and where it finds what to load. The server's conformance: tests/k3model/test_server.py,
whose checkpoint and tokenizer (`files`) these tests serve."""

from __future__ import annotations

import urllib.request

import pytest

from pipelines.serve import resolve_paths
from tests.k3model.test_server import MODEL, files  # noqa: F401  (files: the module-scoped fixture)


def test_k3_serve_and_k3_chat_end_to_end(files):
    """`k3 serve --model` in its own process (bound to 127.0.0.1, a free port), then the chat client's
    loop with scripted lines: a streamed reply, /effort, and the server stopped by the test."""
    import io
    import os
    import signal
    import socket
    import subprocess
    import sys
    import time

    from pipelines.chat import main as chat

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", "serve", "--model", str(files["model"]),
                             "--tokenizer", str(files["tokenizer"]), "--port", str(port), "--served-name", MODEL],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(300):  # bounded: 30 s
            try:
                urllib.request.urlopen(url + "/health", timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read()
                time.sleep(0.1)
        out = io.StringIO()
        assert chat(url, "low", 0.0, 6, lines=["hello", "/effort max", "/effort medium", "again", "/quit"], out=out) == 0
        text = out.getvalue()
        assert f"{MODEL} at {url}, effort low" in text and "(effort max)" in text and "choose one of" in text
        assert text.count("completion tokens)") == 2 and "6 completion tokens" in text
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            # A server that does not stop: its threads' stacks (faulthandler on SIGUSR1), then kill it.
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2)
            proc.kill()
            raise AssertionError("k3 serve did not stop within 30 s of SIGINT; its output and threads:\n"
                                 + proc.communicate()[0][-6000:]) from None
    assert proc.returncode in (0, 130)


def test_k3_serve_finds_the_profiles_newest_student_or_says_what_to_run(tmp_path, monkeypatch, files):
    import dagster as dg

    from assets.lineage import PROFILE_TAG, key
    for name in ("K3_HOME", "DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("K3_HOME", str(tmp_path / "home"))
    with pytest.raises(ValueError, match="k3 run --profile smoke --select"):
        resolve_paths("smoke")
    # Explicit paths never open the instance.
    assert resolve_paths("smoke", str(files["model"]), str(files["tokenizer"]))["model"] == files["model"]
    instance = dg.DagsterInstance.get()
    for name, path in (("quantized_student", files["model"]), ("draft_model", tmp_path / "draft"),
                       ("tokenizer", files["tokenizer"])):
        instance.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", name), metadata={"path": dg.MetadataValue.path(str(path))},
            tags={PROFILE_TAG: "smoke"}))
    assert resolve_paths("smoke") == {"model": files["model"], "draft": tmp_path / "draft",
                                      "tokenizer": files["tokenizer"]}
