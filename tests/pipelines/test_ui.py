"""The web UI in a real browser: `k3 run` materializes smoke image data and the claims report
headless, then `k3 ui` starts Dagster and MLflow on the same home and Playwright (Debian's chromium)
checks what a user sees: the lineage link `k3 ui` prints first (the default profile's, tiny's, every
group expanded, its main chain left to right by the nodes' on-page positions), the launchpad of
tiny's sft_policy opening on tiny's SFT sizes, a picture shown inline on the asset's page, the
report's page with its figures reached from the asset's first metadata row, the `k3 run` run
re-executed from the UI (tagged as a re-execution, its 8 claims judged), an asset materialized from its page carrying its profile as a run tag, and
an MLflow link that reaches MLflow's own port, and MLflow opening the experiment on its runs.
Screenshots go to test-artifacts/."""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from k3model.train.recipes import POSTTRAIN_SIZES

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
K3 = str(Path(sys.executable).parent / "k3")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ui(tmp_path):
    """`k3 run --profile smoke --select image_data,report`, then `k3 ui` on free ports with that
    temporary home; stopped (and checked) after."""
    # The default profile, whose lineage `k3 ui` opens, is tiny (never materialized here: its graph
    # is drawn all the same).
    env = {**os.environ, "K3_HOME": str(tmp_path / "home"), "K3_PROFILE": "tiny"}
    env.pop("DAGSTER_HOME", None)
    cli = subprocess.run([K3, "run", "--profile", "smoke", "--select", "image_data,report"], env=env,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stdout + cli.stderr
    # The summary line; failing claims add warning lines after it.
    cli_run_id = re.findall(r"\(run ([0-9a-f-]{36})\)", cli.stdout)[-1]

    dagster_port, mlflow_port = _free_port(), _free_port()
    log = open(tmp_path / "k3-ui.log", "w")
    proc = subprocess.Popen([K3, "ui", "--port", str(dagster_port), "--mlflow-port", str(mlflow_port)],
                            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 240
    while "Ctrl-C stops both" not in (tmp_path / "k3-ui.log").read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            pytest.fail(f"k3 ui did not start:\n{(tmp_path / 'k3-ui.log').read_text()}")
        time.sleep(1)
    printed = (tmp_path / "k3-ui.log").read_text()
    yield {"dagster": f"http://127.0.0.1:{dagster_port}", "mlflow": f"http://127.0.0.1:{mlflow_port}",
           "mlflow_port": mlflow_port, "home": tmp_path / "home", "cli_run_id": cli_run_id,
           "lineage": re.search(r"k3 ui: Dagster +(\S+)", printed).group(1),
           "mlflow_printed": re.search(r"k3 ui: MLflow +(\S+)", printed).group(1)}
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


def _graphql(dagster_url: str, query: str) -> dict:
    request = urllib.request.Request(f"{dagster_url}/graphql", data=json.dumps({"query": query}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as r:
        return json.loads(r.read())["data"]


RUNS = "{ runsOrError { ... on Runs { results { runId status jobName parentRunId tags { key value } } } } }"


def _wait_for_run(dagster_url: str, match, timeout_s: float) -> dict:
    """Poll Dagster's GraphQL API until a run for which `match(run)` holds has ended."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while time.monotonic() < deadline:
        runs = _graphql(dagster_url, RUNS)["runsOrError"]["results"]
        seen = next((r for r in runs if match(r)), None)
        if seen is not None and seen["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return seen
        time.sleep(1)  # a run is seen at most 1 s after it ends
    pytest.fail(f"no matching run ended within {timeout_s:.0f} s; last seen {seen}")


def _tags(run: dict) -> dict:
    return {t["key"]: t["value"] for t in run["tags"]}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is missing: `make setup` installs it")
def test_what_a_user_sees_in_the_ui(ui):
    from playwright.sync_api import sync_playwright

    ARTIFACTS.mkdir(exist_ok=True)
    dagster = ui["dagster"]
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), headless=True,
                                     args=["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"])
        context = browser.new_context(viewport={"width": 1400, "height": 900})
        # Skip the "Join the Dagster community" modal that covers the first page load.
        context.add_init_script("localStorage.setItem('communityNux', '1')")
        page = context.new_page()
        try:
            # `k3 ui` opens on the default profile's lineage, its groups expanded, and the main chain
            # reads left to right. 1920 px wide: at 1400 with the asset sidebar open, Dagster's fit
            # zoom (about 0.14) is below the scale at which it draws nodes (0.15), leaving outlines.
            assert ui["lineage"].startswith(f"{dagster}/asset-groups~") and "expanded=" in ui["lineage"]
            page.set_viewport_size({"width": 1920, "height": 1000})
            page.goto(ui["lineage"], wait_until="load")
            page.get_by_text("tiny_report", exact=True).last.wait_for(timeout=60_000)

            def node_x(name: str) -> float:
                node = page.locator("foreignObject", has=page.get_by_text(name, exact=True))
                node.first.wait_for(timeout=30_000)
                assert node.count() == 1, f"{node.count()} nodes named {name}"
                return node.first.bounding_box()["x"]
            chain = ["corpus", "tokenizer", "clue_data", "pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3",
                     "pretrain_stage_4", "base_model", "sft_policy", "rl_tasks", "rl_specialist", "mopd_student",
                     "quantized_student", "draft_model", "report"]
            xs = [node_x(n) for n in chain]
            assert xs == sorted(xs) and len(set(xs)) == len(xs), dict(zip(chain, xs))
            assert node_x("served_model") > node_x("draft_model")
            # Only the default profile's assets are drawn.
            assert page.get_by_text("smoke_pretraining", exact=True).count() == 0
            page.screenshot(path=str(ARTIFACTS / "ui_lineage_tiny.png"))
            page.set_viewport_size({"width": 1400, "height": 900})

            # The launchpad (shift-click on Materialize) opens on the profile's values: tiny's SFT sizes.
            page.goto(f"{dagster}/assets/tiny/sft_policy", wait_until="load")
            button = page.locator("button", has_text="Materialize").first
            button.wait_for(timeout=60_000)
            button.click(modifiers=["Shift"])
            # tiny's upstream is not materialized here: Dagster asks first.
            page.get_by_role("button", name="Confirm").click(timeout=30_000)
            editor = page.locator(".CodeMirror-code").first
            editor.wait_for(timeout=60_000)
            deadline = time.monotonic() + 60
            while "tiny__sft_policy" not in editor.inner_text() and time.monotonic() < deadline:
                time.sleep(0.5)
            shown = dict(re.findall(r"^\s*(steps|batch_size|lr): (\S+)$", editor.inner_text(), re.M))
            tiny = POSTTRAIN_SIZES["tiny"]
            assert {k: float(v) for k, v in shown.items()} == {"steps": tiny.sft_steps, "batch_size": tiny.sft_batch_size,
                                                              "lr": tiny.sft_lr}, editor.inner_text()
            page.screenshot(path=str(ARTIFACTS / "ui_launchpad_tiny_sft_policy.png"))

            # A picture in the asset's metadata table itself, not a file path.
            page.goto(f"{dagster}/assets/smoke/image_data", wait_until="load")
            row = page.locator("tr", has_text="first_images").first
            row.wait_for(timeout=60_000)
            picture = row.locator("img[src^='data:image/png;base64,']")
            picture.wait_for(timeout=30_000)
            assert picture.evaluate("img => img.naturalWidth") > 0
            row.scroll_into_view_if_needed()
            page.screenshot(path=str(ARTIFACTS / "ui_asset_inline_picture.png"))

            # The report is a page: the asset's first metadata row links it, every figure inline.
            page.goto(f"{dagster}/assets/smoke/report", wait_until="load")
            link = page.locator("tr", has_text="report_page").first.locator("a[href^='/k3/report/smoke/']").first
            link.wait_for(timeout=60_000)
            page.goto(f"{dagster}{link.get_attribute('href')}", wait_until="load")
            page.get_by_text("K3 recipe claims report").first.wait_for(timeout=30_000)
            # Every plot has its place (this lineage has no stage yet: each says "not measured"), and
            # every picture the page holds loads.
            assert page.locator("[id^='claim-']").count() == 8 and page.locator("figure[id^='plot-']").count() == 8
            widths = page.locator("img").evaluate_all("imgs => imgs.map(i => i.naturalWidth)")
            assert all(w > 0 for w in widths), widths
            page.screenshot(path=str(ARTIFACTS / "ui_report_page.png"), full_page=True)

            # The `k3 run` run belongs to a job of the definitions: Re-execute works.
            page.goto(f"{dagster}/runs/{ui['cli_run_id']}", wait_until="load")
            page.get_by_text("smoke_all_job").first.wait_for(timeout=60_000)
            reexecute = page.locator("button", has_text="Re-execute").first
            reexecute.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "ui_cli_run.png"))
            reexecute.click()
            all_steps = page.get_by_text("All steps in root run", exact=False)
            if all_steps.count():
                all_steps.first.click()
            child = _wait_for_run(dagster, lambda r: r["parentRunId"] == ui["cli_run_id"], timeout_s=300)
            assert child["status"] == "SUCCESS" and child["jobName"] == "smoke_all_job", child
            assert _tags(child)["k3/profile"] == "smoke"
            # The parent came from `k3 run`; the re-execution says what it is, not "k3 run".
            assert _tags(child)["k3/launched_by"] == f"re-execution of {ui['cli_run_id'][:8]}"
            # Claims survive the rerun: the report's Checks tab shows all 8 judged on its new
            # materialization, none "Not evaluated".
            page.goto(f"{dagster}/assets/smoke/report?view=checks", wait_until="load")
            page.get_by_text("claim_8", exact=True).first.wait_for(timeout=60_000)
            assert all(page.get_by_text(f"claim_{n}", exact=True).count() for n in range(1, 9))
            assert page.get_by_text("Not evaluated").count() == 0
            page.screenshot(path=str(ARTIFACTS / "ui_claims_after_rerun.png"))

            # Materialize from the asset's page (Dagster's implicit asset job): the run gets its profile.
            page.goto(f"{dagster}/assets/smoke/corpus", wait_until="load")
            button = page.locator("button", has_text="Materialize").first
            button.wait_for(timeout=60_000)
            button.click()
            page.get_by_text("Launched run").first.wait_for(timeout=60_000)
            launched = _wait_for_run(dagster, lambda r: r["jobName"] == "__ASSET_JOB", timeout_s=300)
            assert launched["status"] == "SUCCESS" and _tags(launched)["k3/profile"] == "smoke", launched
            page.goto(f"{dagster}/runs", wait_until="load")
            page.get_by_text("k3/profile: smoke").first.wait_for(timeout=60_000)
            page.screenshot(path=str(ARTIFACTS / "ui_runs_with_profile.png"))

            # The MLflow link a `k3 run` wrote reaches MLflow on the port `k3 ui` serves now.
            page.goto(f"{dagster}/assets/smoke/image_data", wait_until="load")
            link = page.locator("tr", has_text="mlflow_run").first.locator("a[href^='/k3/mlflow/runs/']").first
            link.wait_for(timeout=60_000)
            href = link.get_attribute("href")

            # The MLflow link `k3 ui` prints opens MLflow on the training runs (MLflow 3.17 would
            # otherwise show its GenAI traces view).
            assert ui["mlflow_printed"] == f"{dagster}/k3/mlflow/experiment"
            page.goto(ui["mlflow_printed"], wait_until="load")
            page.get_by_text("smoke/corpus-", exact=False).first.wait_for(timeout=90_000)
            assert page.url.startswith(f"{ui['mlflow']}/#/experiments/1/runs?workflowType=machine_learning")
            page.screenshot(path=str(ARTIFACTS / "ui_mlflow_experiment.png"))
        finally:
            browser.close()

    with urllib.request.urlopen(f"{dagster}{href}", timeout=30) as r:
        assert r.geturl().startswith(f"{ui['mlflow']}/#/experiments/")
    # Runs launched from the UI log to the MLflow store the UI's MLflow server reads.
    request = urllib.request.Request(f"{ui['mlflow']}/api/2.0/mlflow/runs/search",
                                     data=json.dumps({"experiment_ids": ["1"]}).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as r:
        runs = json.loads(r.read())["runs"]
    tags = [{t["key"]: t["value"] for t in run["data"]["tags"]} for run in runs]
    # image_data and the report by `k3 run` and again by the re-execution, corpus from its page.
    assert sorted(t["asset"] for t in tags) == ["smoke/corpus", "smoke/image_data", "smoke/image_data",
                                                "smoke/report", "smoke/report"]
    assert all(t["k3/profile"] == "smoke" for t in tags)
