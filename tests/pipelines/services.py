"""Real services the pipeline tests start on loopback and end themselves: an `mlflow server` holding
the tracking store and the model registry (`mlflow_server_at`). Every process carries its home in
K3_HOME, so a leftover one can be found and ended by it."""

import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(home: Path) -> dict:
    """The environment of a started service: no PYTHONPATH (the code must come through the
    runtime_env or the model's own code paths, not the test's checkout), one OpenMP thread, the home
    as the processes' marker."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "RAY_ADDRESS", "MLFLOW_TRACKING_URI")}
    return {**env, "K3_HOME": str(home), "RAY_AUTH_MODE": "disabled", "OMP_NUM_THREADS": "1"}


@contextmanager
def mlflow_server_at(store: Path):
    """(uri, seconds to listen) of an `mlflow server` on a free loopback port, its sqlite store and its
    artifact store (clients upload through the server: `mlflow-artifacts:/`) under `store`."""
    port = free_port()
    store.mkdir(parents=True)
    # The server's log goes to a file: an unread pipe fills up and then blocks the server.
    log = open(store / "server.log", "wb")
    proc = subprocess.Popen([str(BIN / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(port),
                             "--backend-store-uri", f"sqlite:///{store / 'mlflow.db'}",
                             "--artifacts-destination", str(store / "artifacts"), "--workers", "1"],
                            cwd=store, env=clean_env(store), stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    t0 = time.perf_counter()
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, (store / "server.log").read_text()[-3000:]
                assert time.perf_counter() - t0 < 90, "mlflow server did not listen within 90 s"
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}", time.perf_counter() - t0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()
