"""`k3 ui`: the Dagster web UI (webserver and daemon, pipelines/webserver.py) and the MLflow server on
127.0.0.1, both on the instance under K3_HOME, as child processes of this command.

What it prints first is where a user lands: the default profile's lineage (K3_PROFILE, else tiny),
its groups expanded (`lineage_url`), rather than Dagster's Catalog and Lineage, which open on the
alphabetically first profile (`small`, which a CPU machine never materializes); and, for MLflow, the
k3 experiment's training runs (`/k3/mlflow/experiment`, MLflow's classic view), not MLflow's root,
which opens on its GenAI view.

Each child gets its own process group and default signal handlers, and dies with its parent even
when the parent is killed (`_die_with_parent`), so no server outlives the home lock the command held
while it set the home up. Ctrl-C or SIGTERM stops both (`stop_process_group`); either one exiting
stops the other. Their output goes to `K3_HOME/logs/`.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

from pipelines.console import say, stop_on_signals, under_home_lock
from pipelines.resources import REPO_ROOT, default_profile


def _spawn(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    def child_setup() -> None:
        # A parent started in the background ignores SIGINT, and the child would inherit that
        # (research/orchestration.md §6): give it default handlers and its own process group.
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        _die_with_parent()
    log.parent.mkdir(parents=True, exist_ok=True)
    out = open(log, "ab")
    return subprocess.Popen(cmd, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT,
                            preexec_fn=child_setup)


def _die_with_parent() -> None:
    """Linux: SIGTERM this (forked) child when the `k3 ui` that started it dies, even by SIGKILL,
    so no server outlives the home lock its parent held."""
    import ctypes
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError:
        return
    pr_set_pdeathsig = 1
    libc.prctl(pr_set_pdeathsig, signal.SIGTERM, 0, 0, 0)


def stop_process_group(proc: subprocess.Popen, grace_s: float = 10.0) -> None:
    """SIGTERM the child's process group (twice: dagster dev can swallow the first), then SIGKILL."""
    if proc.poll() is not None:
        return
    for sig in (signal.SIGTERM, signal.SIGTERM):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        break
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _wait_http(url: str, proc: subprocess.Popen, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return False
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.5)
    return False


def lineage_url(dagster_url: str, profile: str, groups: list[str]) -> str:
    """The Dagster UI's global lineage showing only `profile`'s assets (`key:"<profile>/*"`), with
    its `groups` expanded: the path and `expanded` query Dagster 1.13's UI reads
    (ui-core `explorerPathToString`, `AssetGraphExplorer`: group ids `global@global:<group>`)."""
    query = urllib.parse.quote(f'key:"{profile}/*"', safe="")
    expanded = urllib.parse.quote(",".join(f"global@global:{g}" for g in groups), safe="@:,")
    return f"{dagster_url}/asset-groups~{query}/?expanded={expanded}"


def profile_groups(dagster_url: str, profile: str) -> list[str]:
    """The asset groups of `profile`, from the webserver's GraphQL API
    (the definitions are loaded there, not in this process)."""
    query = "{ assetNodes { groupName assetKey { path } } }"
    request = urllib.request.Request(f"{dagster_url}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        nodes = json.loads(r.read())["data"]["assetNodes"]
    return list(dict.fromkeys(n["groupName"] for n in nodes if n["assetKey"]["path"][0] == profile))


def ui_commands(home: Path, dagster_port: int, mlflow_port: int) -> tuple[list[str], list[str]]:
    bin_dir = Path(sys.executable).parent
    # `dagster dev`'s pair (webserver and daemon), with a redirect to MLflow for the metadata links.
    dagster = [sys.executable, "-m", "pipelines.webserver", "-w", str(REPO_ROOT / "workspace.yaml"),
               "-h", "127.0.0.1", "-p", str(dagster_port)]
    mlflow_dir = home / "mlflow"
    (mlflow_dir / "artifacts").mkdir(parents=True, exist_ok=True)
    mlflow = [str(bin_dir / "mlflow"), "server", "--host", "127.0.0.1", "--port", str(mlflow_port),
              "--backend-store-uri", f"sqlite:///{mlflow_dir / 'mlflow.db'}",
              "--default-artifact-root", (mlflow_dir / "artifacts").as_uri(), "--workers", "1"]
    return dagster, mlflow


def cmd_ui(args: argparse.Namespace) -> int:
    busy = [p for p in (args.port, args.mlflow_port) if _port_in_use(p)]
    if busy:
        # Another server there would answer the health checks and pass for ours.
        say(f"k3 ui: port {', '.join(map(str, busy))} on 127.0.0.1 is already in use (another `k3 ui`?): "
            "stop it, or pass --port / --mlflow-port")
        return 1
    # The UI serves every profile's lineage, so it takes no profile.
    return under_home_lock("k3 ui", None, args, _ui)


def _port_in_use(port: int) -> bool:
    import socket
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _ui(args: argparse.Namespace, profile: None, k3env: dict[str, str]) -> int:
    home = Path(k3env["K3_HOME"])
    logs = home / "logs"
    env = {**os.environ, **k3env, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",
           "K3_MLFLOW_PORT": str(args.mlflow_port), "K3_DAEMON_LOG": str(logs / "dagster-daemon.log")}
    dagster_cmd, mlflow_cmd = ui_commands(home, args.port, args.mlflow_port)
    procs: list[subprocess.Popen] = []

    stop_on_signals()
    try:
        procs.append(_spawn(mlflow_cmd, env, logs / "mlflow.log"))
        procs.append(_spawn(dagster_cmd, env, logs / "dagster.log"))
        dagster_url = f"http://127.0.0.1:{args.port}"
        mlflow_url = f"http://127.0.0.1:{args.mlflow_port}"
        ok_mlflow = _wait_http(f"{mlflow_url}/health", procs[0], 90)
        ok_dagster = _wait_http(f"{dagster_url}/server_info", procs[1], 120)
        if not (ok_mlflow and ok_dagster):
            which = [n for n, ok in (("MLflow", ok_mlflow), ("Dagster", ok_dagster)) if not ok]
            say(f"k3 ui: {' and '.join(which)} did not start; see {logs}/")
            return 1
        profile = default_profile()
        try:
            groups = profile_groups(dagster_url, profile)
        except (OSError, KeyError, ValueError) as e:
            say(f"k3 ui: could not list the {profile} groups ({e}); the lineage link opens them collapsed")
            groups = []
        say(f"k3 ui: Dagster  {lineage_url(dagster_url, profile, groups)}")
        say(f"k3 ui:          (the {profile} lineage; Catalog {dagster_url}/assets/{profile}, "
            f"all profiles {dagster_url}/asset-groups)")
        say(f"k3 ui: MLflow   {dagster_url}/k3/mlflow/experiment   (the k3 training runs; the server: {mlflow_url})")
        say(f"k3 ui: every profile's assets under its prefix (smoke/, tiny/, small/); instance "
            f"{k3env['DAGSTER_HOME']}; logs {logs}/; Ctrl-C stops both")
        while all(p.poll() is None for p in procs):
            time.sleep(1)
        dead = [cmd for p, cmd in zip(procs, ("MLflow", "Dagster")) if p.poll() is not None]
        say(f"k3 ui: {', '.join(dead)} exited; see {logs}/; stopping")
        return 1
    except KeyboardInterrupt:
        say("k3 ui: stopping")
        return 0
    finally:
        for p in reversed(procs):
            stop_process_group(p)
