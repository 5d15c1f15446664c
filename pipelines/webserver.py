"""`k3 ui`'s Dagster: the daemon, and Dagster's own webserver with one addition — links to MLflow.

    python -m pipelines.webserver -w workspace.yaml -h 127.0.0.1 -p 3000

Asset metadata links to MLflow as `/k3/mlflow/runs/<experiment>/<run>` and
`/k3/mlflow/models/<name>/<version>`, paths on the Dagster webserver. This server redirects them to
the MLflow UI at the address `k3 ui` serves now (`K3_MLFLOW_PORT`, on the host the browser used), so
a link written by `k3 run`, or under another `--mlflow-port`, keeps working. `/k3/mlflow/experiment`
opens the `k3` experiment's runs.

`/k3/report/<profile>` serves the newest claims report of a profile as one HTML page (its
`report.html`, figures inline: assets/report.py), `/k3/report/<profile>/<run id>` the one that run
made; the report asset's first metadata row and `k3 report` link there.

MLflow 3.17's UI opens every experiment in its GenAI view unless the page's URL says
`workflowType=machine_learning` (the experiment's `mlflow.experimentKind` tag does not change that;
the choice is otherwise a per-browser setting): the redirects say it. Otherwise it is what
`dagster dev` runs: `dagster-daemon run` as a child (schedules, sensors, the run queue) and
`dagster-webserver` in this process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, RedirectResponse
from starlette.routing import Route

import dagster_webserver.app
from dagster_webserver.webserver import DagsterWebserver

MLFLOW_LINK_PREFIX = "/k3/mlflow"
REPORT_PREFIX = "/k3/report"  # assets.report.PAGE_PREFIX (not imported: it would load the assets here)


TRAINING_VIEW = "workflowType=machine_learning"


def mlflow_target(kind: str, a: str, b: str, base: str) -> str | None:
    """Where `/k3/mlflow/<kind>/<a>/<b>` points in the MLflow UI at `base`, or None."""
    if kind == "runs":
        return f"{base}/#/experiments/{a}/runs/{b}?{TRAINING_VIEW}"
    if kind == "models":
        return f"{base}/#/models/{a}/versions/{b}"
    return None


def _mlflow_base(request: Request) -> str:
    return f"{request.url.scheme}://{request.url.hostname}:{os.environ.get('K3_MLFLOW_PORT', '5000')}"


def report_html(instance, profile: str, run: str | None) -> tuple[Path | None, str]:
    """(report.html of `<profile>/report`'s newest materialization, or of run `run`'s; None and why
    when there is none)."""
    from dagster import AssetKey, DagsterEventType

    asset = AssetKey([profile, "report"])
    make = f"`k3 run --profile {profile} --select report` makes one"
    if run is None:
        event = instance.get_latest_materialization_event(asset)
    else:
        events = [e for e in instance.all_logs(run, of_type=DagsterEventType.ASSET_MATERIALIZATION)
                  if e.asset_materialization is not None and e.asset_materialization.asset_key == asset]
        event = events[-1] if events else None
    if event is None or event.asset_materialization is None:
        return None, f"no report of profile {profile!r}" + (f" in run {run}" if run else "") + f": {make}"
    path = event.asset_materialization.metadata.get("path")
    html = Path(path.value).parent / "report.html" if path is not None else None
    if html is None or not html.is_file():
        return None, (f"the report of profile {profile!r} (run {event.run_id}) has no page at {html}: it was made "
                      f"before reports had one, or its files were removed; {make}")
    return html, ""


class K3Webserver(DagsterWebserver):
    def experiment_redirect(self, request: Request):
        from pipelines.resources import MlflowResource
        mlflow = MlflowResource()
        exp = mlflow.client().get_experiment_by_name(mlflow.experiment)
        where = f"experiments/{exp.experiment_id}/runs" if exp is not None else "experiments"
        return RedirectResponse(f"{_mlflow_base(request)}/#/{where}?{TRAINING_VIEW}", status_code=307)

    def mlflow_redirect(self, request: Request):
        base = _mlflow_base(request)
        p = request.path_params
        target = mlflow_target(p["kind"], p["a"], p["b"], base)
        if target is None:
            return PlainTextResponse(f"no MLflow page for {request.url.path}", status_code=404)
        return RedirectResponse(target, status_code=307)

    def report_page(self, request: Request):
        profile, run = request.path_params["profile"], request.path_params.get("run")
        found, why = report_html(self._process_context.instance, profile, run)
        if found is None:
            return PlainTextResponse(why, status_code=404)
        return HTMLResponse(found.read_text())

    def build_routes(self):
        # Before Dagster's catch-all route, which serves its single-page app for every other path.
        return [Route(MLFLOW_LINK_PREFIX + "/experiment", self.experiment_redirect),
                Route(MLFLOW_LINK_PREFIX + "/{kind}/{a}/{b}", self.mlflow_redirect),
                Route(REPORT_PREFIX + "/{profile}", self.report_page),
                Route(REPORT_PREFIX + "/{profile}/{run}", self.report_page), *super().build_routes()]


def main(argv: list[str]) -> None:
    if "-w" not in argv:
        raise SystemExit("pipelines.webserver: pass the workspace file with -w (k3 ui does)")
    workspace = argv[argv.index("-w") + 1]
    log = Path(os.environ.get("K3_DAEMON_LOG", os.devnull))
    daemon = subprocess.Popen([sys.executable, "-m", "dagster._daemon", "run", "-w", workspace],
                              stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    try:
        # create_app_from_workspace_process_context builds the app from this module-level name.
        dagster_webserver.app.DagsterWebserver = K3Webserver
        from dagster_webserver.cli import cli
        cli.main(args=argv, prog_name="dagster-webserver", standalone_mode=False)
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=20)
        except subprocess.TimeoutExpired:
            daemon.kill()


if __name__ == "__main__":
    main(sys.argv[1:])
