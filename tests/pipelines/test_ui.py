"""The web UI in a real browser: `k3 ui` starts Dagster and MLflow, Playwright (Debian's chromium)
opens the lineage, sees the pretraining assets, launches a smoke materialization from an asset's
page and waits for the run to succeed. Screenshots go to test-artifacts/."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
K3 = str(Path(sys.executable).parent / "k3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ui(tmp_path):
    """`k3 ui --profile smoke` on free ports with a temporary home; stopped (and checked) after."""
    dagster_port, mlflow_port = _free_port(), _free_port()
    log = open(tmp_path / "k3-ui.log", "w")
    env = {**os.environ, "K3_HOME": str(tmp_path / "home")}
    proc = subprocess.Popen([K3, "ui", "--profile", "smoke", "--port", str(dagster_port),
                             "--mlflow-port", str(mlflow_port)], env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while "Ctrl-C stops both" not in (tmp_path / "k3-ui.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"k3 ui did not start:\n{(tmp_path / 'k3-ui.log').read_text()}")
        time.sleep(1)
    yield {"dagster": f"http://127.0.0.1:{dagster_port}", "mlflow": f"http://127.0.0.1:{mlflow_port}",
           "home": tmp_path / "home"}
    # k3 ui turns SIGTERM into its Ctrl-C path, which stops both servers.
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("k3 ui did not stop within 60 s of SIGTERM")
    log.close()
    assert "k3 ui: stopping" in (tmp_path / "k3-ui.log").read_text()
    for port in (dagster_port, mlflow_port):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, f"port {port} still served after k3 ui stopped"


def _wait_for_run_to_end(dagster_url: str, timeout_s: float) -> str:
    """Poll the webserver's GraphQL endpoint until its one run has ended; returns its status."""
    query = json.dumps({"query": "{ runsOrError { ... on Runs { results { runId status } } } }"}).encode()
    deadline = time.monotonic() + timeout_s
    status = "NO RUN"
    while time.monotonic() < deadline:
        request = urllib.request.Request(f"{dagster_url}/graphql", data=query,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as r:
            runs = json.loads(r.read())["data"]["runsOrError"]["results"]
        if runs:
            status = runs[0]["status"]
            if status in ("SUCCESS", "FAILURE", "CANCELED"):
                return status
        time.sleep(3)
    return f"still {status} after {timeout_s:.0f} s"


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is missing: `make setup` installs it")
def test_lineage_and_a_materialization_launched_from_the_ui(ui):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        # Skip the "Join the Dagster community" modal that covers the first page load.
        context.add_init_script("localStorage.setItem('communityNux', '1')")
        page = context.new_page()
        try:
            page.goto(f"{ui['dagster']}/asset-groups", wait_until="load")
            group = page.get_by_text("pretraining", exact=True).last
            group.wait_for(timeout=60_000)
            # Groups start collapsed; a double click on the group node expands it.
            group.dblclick()
            for s in range(1, 5):
                page.get_by_text(f"pretrain_stage_{s}", exact=True).first.wait_for(timeout=30_000)
            page.get_by_text("base_model", exact=True).first.wait_for(timeout=30_000)
            page.screenshot(path=str(ARTIFACTS / "ui_lineage.png"))

            page.goto(f"{ui['dagster']}/assets/image_data", wait_until="load")
            button = page.locator("button", has_text="Materialize").first
            button.wait_for(timeout=60_000)
            button.click()
            page.get_by_text("Launched run").first.wait_for(timeout=60_000)

            # Wait on Dagster's own GraphQL API, not by reloading the page: on a slow 2-core machine a
            # reload every few seconds can keep the runs table at "Loading runs…" for ever.
            status = _wait_for_run_to_end(ui["dagster"], timeout_s=400)
            assert status == "SUCCESS", f"the run launched from the UI ended {status}"
            page.goto(f"{ui['dagster']}/runs", wait_until="load")
            page.get_by_text("Success").first.wait_for(timeout=120_000)
            page.screenshot(path=str(ARTIFACTS / "ui_run.png"))

            page.goto(f"{ui['dagster']}/assets/image_data", wait_until="load")
            page.get_by_text("mlflow_run").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "ui_asset.png"), full_page=True)
        finally:
            browser.close()

    # The run launched from the UI logged to the MLflow store the UI's MLflow server reads.
    request = urllib.request.Request(f"{ui['mlflow']}/api/2.0/mlflow/runs/search",
                                     data=json.dumps({"experiment_ids": ["1"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        runs = json.loads(r.read())["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"]["tags"]} for run in runs]
    assert [t["asset"] for t in tags] == ["image_data"] and tags[0]["k3/profile"] == "smoke"
