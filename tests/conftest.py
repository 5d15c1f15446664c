"""The suite on two workers (`make test`: pytest-xdist, `-n 2 --dist loadgroup`).

Tests that start services — a local Ray cluster, Dagster runs on a K3 home, an MLflow or `k3 serve`
server, a browser — share one xdist group, so one worker runs them one after another: two local Ray
clusters started at once can join each other (`ray.init` finds a running one), and their timeouts
assume a machine not shared with another service test. The other worker takes the library's tests
(models, kernels, environments, data), which need nothing outside their process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SERVICES = ("assets", "pipelines", "k3model/parallel")  # folders under tests/ whose tests start services


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        try:
            rel = Path(item.path).resolve().relative_to(TESTS).as_posix()
        except ValueError:
            continue
        if rel.startswith(tuple(f"{s}/" for s in SERVICES)):
            item.add_marker(pytest.mark.xdist_group("services"))
