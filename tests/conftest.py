"""The suite on two workers (`make test`: pytest-xdist, `-n 2 --dist loadgroup`).

Tests that start services — a local Ray cluster, Dagster runs on a K3 home, an MLflow or `k3 serve`
server, a browser — share one xdist group, so one worker runs them one after another: two local Ray
clusters started at once can join each other (`ray.init` finds a running one), and their timeouts
assume a machine not shared with another service test. The other worker takes the library's tests
(models, kernels, environments, data), which need nothing outside their process.

The group is made here, by the scheduler (`pytest_xdist_make_scheduler`), from each test's path:
xdist 3.8 groups `xdist_group`-marked tests by appending "@group" to their node ids, which pytest
9.2's node ids (`Node._id`) no longer take, so under pytest 9.2 the mark alone groups nothing and
the service tests were spread over both workers (their module fixtures built on each).
"""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SERVICES = ("assets", "pipelines", "k3model/parallel")  # folders under tests/ whose tests start services


def service_group(path: str) -> str | None:
    """The xdist group of the test file at `path` (relative to the repository root or absolute):
    "services" for the folders above, None for a library test."""
    try:
        rel = Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None
    return "services" if rel.startswith(tuple(f"{s}/" for s in SERVICES)) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The mark says it on the test too (`-m "xdist_group"` selects them); the scheduler below
    # groups by path.
    for item in items:
        if group := service_group(str(item.path)):
            item.add_marker(pytest.mark.xdist_group(group))


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`--dist loadgroup` with the service group taken from the path (module docstring)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ServiceGroups(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            # Node ids are relative to the rootdir (the repository, where pyproject.toml is).
            group = service_group(str(config.rootpath / nodeid.split("::", 1)[0]))
            return group or super()._split_scope(nodeid)

    return ServiceGroups(config, log)
