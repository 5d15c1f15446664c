"""The suite on two workers (`make test`: pytest-xdist, `-n 2 --dist loadgroup`).

Tests that start services — `k3` and Dagster runs in subprocesses, an MLflow or `k3 serve` server, a
browser, a Ray cluster of several processes, kills and signals — share one xdist group, so one worker
runs them one after another: their deadlines (a server's start, a SIGTERM's effect, a kill -9 at a
step) assume a machine not shared with another service test. The other worker takes the library's
tests (models, kernels, environments, data), which need nothing outside their process, and the
modules whose only service is a local Ray cluster of their own process (RAY_BESIDE), each a group of
its own, and the two long lineage modules (LINEAGE), one group beside the service group; the worker
of the service group joins in when the group is done. Each Triton-interpreter module (INTERPRETER) is
one unit too, so its one interpreter subprocess runs once. Units go out longest first.

The group is made here, by the scheduler (`pytest_xdist_make_scheduler`), from each test's path:
xdist 3.8 groups `xdist_group`-marked tests by appending "@group" to their node ids, which pytest
9.2's node ids (`Node._id`) no longer take, so under pytest 9.2 the mark alone groups nothing and
the service tests were spread over both workers (their module fixtures built on each).

Waiting OpenMP threads sleep (`OMP_WAIT_POLICY=PASSIVE`, set here before anything imports torch, so
the workers, their subprocesses and the Ray workers they start inherit it). Under `-n 2` on 2 cores
every process's torch runs a thread per core (Ray tasks too: `RayResource.map`), so the two workers
keep four or more threads on two cores; libgomp's default is to spin at every barrier, and a thread
spinning for a peer that is descheduled burns the core the peer needs. Measured on the smoke model
(docs/log/hardening.md, 2026-12-06 session 26): two 2-thread training processes at once ran 0.08
steps/s each spinning, 17–18 passive. It changes no thread count, so no result.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402

TESTS = Path(__file__).resolve().parent
SERVICES = ("assets", "pipelines", "k3model/parallel")  # folders under tests/ whose tests start services
# Modules of those folders that start none: no Ray cluster (in this process or a child), no server or
# port, no subprocess, no timing. Their Dagster runs are in-process, on assets that use no Ray (data,
# sft_data, served_model, hand-made ones) or refused before any asset body runs; they run beside the
# service group on the other worker, like the library's tests. `_no_ray_outside_the_group` fails
# such a test if it starts a local Ray cluster after all: move its module back into the group then.
OUTSIDE = ("assets/test_checkpoint_checks.py", "assets/test_claims.py", "assets/test_config_bounds.py",
           "assets/test_data.py", "assets/test_placement.py", "assets/test_posttrain.py",
           "assets/test_pretrain.py", "assets/test_serve_asset.py", "pipelines/test_automation.py",
           "pipelines/test_definitions.py", "pipelines/test_integrity.py", "pipelines/test_lineage_diagram.py")
# Modules of those folders whose one service is a local Ray cluster started in the test process itself
# (`RayResource` in an in-process Dagster run, or the module's own `ray.init`): no server, no subprocess of
# their own, no timing. Each is a group of its own (its module fixtures built once, on one worker) that
# runs beside the service group. Two processes' local clusters never join: `ray.init()` without an
# address joins only RAY_ADDRESS or the cluster of the last `ray start` (/tmp/ray/ray_current_cluster),
# and the suite's one `ray start` (test_cluster.py) uses its own --temp-dir and hands RAY_ADDRESS to its
# subprocesses only.
RAY_BESIDE = ("assets/test_deploy.py", "assets/test_distill.py", "assets/test_rl_tasks.py",
              "assets/test_training.py")
# Modules of those folders whose services are all their own and whose waits are state-based, not timed,
# so they need no machine free of other service tests: test_e2e (a Ray cluster started in this process,
# an `mlflow server` on a free port, `dagster`/`k3 run` subprocesses handed both addresses; time limits
# of 90 s for the server and 1,500 s for each run) and test_rl_resume (a one-CPU Ray cluster of this
# process, a driver subprocess joining it by address and killed once the files show one specialist
# promoted and the other at its resume point; a slower machine only widens that window). One group, one
# after the other (both train), beside the service group: in the service group they were ~370 of its
# ~840 s (serial, quiet) while the library's worker finished ~300 s before it (2026-12-07 fresh clone:
# 988 s). They carry the one-worker module fixtures (the e2e `pretrained` home) with them.
LINEAGE = ("pipelines/test_e2e.py", "assets/test_rl_resume.py")
# Modules whose module fixture runs every Triton kernel case in one interpreter subprocess
# (tests/kernels/interp_script.py, 10–20 s each): a module fixture is built once per worker, so split
# over both workers the cases ran twice (2026-12-07: ~60 s of the suite's ~1,800 worker-seconds). Each is
# one unit, like RAY_BESIDE.
INTERPRETER = tuple(f"kernels/{k}_triton_interp.py" for k in
                    ("attn_res/test_attn_res", "kda/test_chunk", "moe_rows/test_moe_rows", "short_conv/test_short_conv"))
# Longest first (the scheduler below): rough seconds of a module's slowest unit under `make test`: the
# fresh clone's 15 slowest items where listed (2026-12-06, docs/log/hardening.md: rl_tasks, deploy,
# distill, the interpreter's gemv_grouped), else session 25's serial library run scaled to them; the
# lineage group's is its two modules' (2026-12-07; the interpreter's since trimmed). A unit of a module
# not named here counts 0 and keeps its place; the service group always goes first.
COST_S = {"lineage": 400, "assets/test_rl_tasks.py": 112, "assets/test_deploy.py": 90, "assets/test_distill.py": 60,
          "kernels/mx/test_triton_interpret.py": 36, "k3model/test_pretrain_loop.py": 40,
          "k3model/train/test_grpo_loop.py": 35, "assets/test_training.py": 25,
          "k3model/test_speculative_static.py": 25, "k3model/test_speculative_fast.py": 25,
          "kernels/attn_res/test_attn_res_triton_interp.py": 25, "kernels/moe_rows/test_moe_rows_triton_interp.py": 25,
          "kernels/kda/test_chunk_triton_interp.py": 20, "kernels/short_conv/test_short_conv_triton_interp.py": 15,
          "k3model/test_speculative.py": 20,
          "assets/test_config_bounds.py": 15, "assets/test_claims.py": 15}


def _relative(path: str) -> str | None:
    """`path` (absolute, or relative to the working directory) relative to tests/, None outside it."""
    try:
        return Path(path).resolve().relative_to(TESTS).as_posix()
    except ValueError:
        return None


def service_group(path: str) -> str | None:
    """The xdist group of the test file at `path`: "services" for the folders above (but OUTSIDE,
    RAY_BESIDE and LINEAGE), the module's own path for RAY_BESIDE and INTERPRETER, "lineage" for
    LINEAGE, None for the rest."""
    rel = _relative(path)
    if rel is None or rel in OUTSIDE:
        return None
    if rel in RAY_BESIDE or rel in INTERPRETER:
        return rel
    if rel in LINEAGE:
        return "lineage"
    return "services" if rel.startswith(tuple(f"{s}/" for s in SERVICES)) else None


def unit_cost(scope: str) -> float:
    """The scheduler's estimate of a work unit (a group, or one test's node id), for longest first."""
    if scope == "services":
        return float("inf")
    module = scope.split("::", 1)[0].removeprefix("tests/")
    return COST_S.get(module, 0.0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # The mark shows the group on the test (`-m xdist_group` selects them); the scheduler below
    # groups by path, as the mark no longer does (module docstring).
    if not config.pluginmanager.hasplugin("xdist"):  # `-p no:xdist`: no such mark registered
        return
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
        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            # Node ids are relative to the rootdir (the repository, where pyproject.toml is).
            group = service_group(str(config.rootpath / nodeid.split("::", 1)[0]))
            return group or super()._split_scope(nodeid)

        def _assign_work_unit(self, node) -> None:
            # Longest processing time first: the service group, then the slow modules' units (COST_S),
            # then the rest in xdist's order (most tests first). Each worker takes the next unit when it
            # runs low, so a slow test left for last would hold one worker while the other idles.
            if not self.ordered:
                self.ordered = True
                units = sorted(self.workqueue.items(), key=lambda unit: -unit_cost(unit[0]))  # stable
                self.workqueue.clear()
                self.workqueue.update(units)
            super()._assign_work_unit(node)

    return ServiceGroups(config, log)


@pytest.fixture(autouse=True)
def _no_ray_outside_the_group(request):
    """A test of a module in OUTSIDE must not start a local Ray cluster, as OUTSIDE says (a module
    that does belongs in RAY_BESIDE or the service group). `RayResource` marks the process that
    started one (K3_RAY_DRIVER); the mark outlives the run's `ray.shutdown`."""
    rel = _relative(str(request.path))
    if rel not in OUTSIDE:
        yield
        return
    def initialized() -> bool:
        ray = sys.modules.get("ray")
        return ray is not None and ray.is_initialized()

    before, was_initialized = os.environ.pop("K3_RAY_DRIVER", None), initialized()
    try:
        yield
        started = "K3_RAY_DRIVER" in os.environ or (initialized() and not was_initialized)
        assert not started, (f"{request.node.nodeid} started a Ray cluster, but {rel} runs outside the "
                             "xdist service group: remove it from OUTSIDE in tests/conftest.py")
    finally:
        if before is not None:
            os.environ["K3_RAY_DRIVER"] = before


@pytest.fixture
def one_thread():
    """Torch on one intra-op thread for the test: batch invariance (a row's bits independent of the
    rows beside it) is a single-thread property of the CPU kernels (k3model/engine.py), and so are the
    bitwise resume and rollout tests built on it."""
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
