"""The `k3` command line: argument errors, params/bench (`k3 report`: tests/assets/test_report.py), headless runs (subprocess), and a
rerun that materializes only what is missing or stale (`--force` redoes it)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.cli import main

K3 = str(Path(sys.executable).parent / "k3")


@pytest.fixture
def home(tmp_path, monkeypatch):
    # `k3 run` exports these; monkeypatch restores them after the test.
    for var in ("K3_HOME", "DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("K3_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def _k3(args, home, timeout=600):
    env = {**os.environ, "K3_HOME": str(home)}
    env.pop("DAGSTER_HOME", None)
    return subprocess.run([K3, *args], env=env, capture_output=True, text=True, timeout=timeout)


def test_run_rejects_an_unknown_profile(home, capsys):
    assert main(["run", "--profile", "big"]) == 2
    assert "--profile = 'big' is not a profile: choose one of smoke, tiny, small" in capsys.readouterr().out


def test_run_rejects_an_unknown_asset(home):
    with pytest.raises(SystemExit, match="--select names unknown asset 'tokeniser'; did you mean 'tokenizer'"):
        main(["run", "--profile", "smoke", "--select", "tokeniser"])


def test_params_json(capsys):
    assert main(["params", "--profile", "smoke", "--json"]) == 0
    counts = json.loads(capsys.readouterr().out)
    assert counts["profile"] == "smoke" and 0 < counts["active"] <= counts["total"]


def test_bench_lists_what_exists(capsys):
    assert main(["bench", "no_such_benchmark"]) == 2
    assert "no benchmark 'no_such_benchmark'" in capsys.readouterr().out


def test_bench_runs_a_script_that_imports_benchmarks_common(monkeypatch, tmp_path):
    # benchmarks/ is not an installed package: `k3 bench` must put the checkout on the path.
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    assert main(["bench", "kernels/kda_cpu", "--help"]) == 0
    assert main(["bench", "kda_cpu", "--help"]) == 0  # a bare name finds its group


@pytest.mark.slow
def test_headless_run_prints_progress_and_fails_clearly(tmp_path):
    home = tmp_path / "home"
    # An upstream that was never materialized: exit 1, and the line names what to run first.
    failed = _k3(["run", "--profile", "smoke", "--select", "tokenizer"], home)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "✗ smoke/tokenizer: tokenizer cannot run: corpus has not been materialized for profile 'smoke'" in failed.stdout
    assert "FAILED" in failed.stdout
    # Without --verbose, no Dagster stack traces: the failure is said once, in the progress line.
    assert "Traceback" not in failed.stdout + failed.stderr

    ok = _k3(["run", "--profile", "smoke", "--select", "corpus,tokenizer"], home)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    lines = ok.stdout.splitlines()
    for name in ("corpus", "tokenizer"):
        assert any(line.endswith(f"▶ smoke/{name}") for line in lines)
        assert any(f"✓ smoke/{name} (" in line for line in lines)
    assert any("◆ smoke/tokenizer materialized" in line for line in lines)
    not_yet = next(line for line in lines if "not in the pipeline yet" in line)
    assert "env_task_sets" in not_yet and "pretrain_stage_1" not in not_yet and "mopd_student" not in not_yet
    assert "k3 run: success" in lines[-1]
    # Headless runs land in the project's instance, where the UI will find them, as runs of a job the
    # definitions hold (so the UI can re-execute them), tagged with the profile.
    assert (home / "dagster" / "dagster.yaml").exists() and any((home / "dagster" / "history").iterdir())
    import dagster as dg
    run_id = lines[-1].rsplit("(run ", 1)[1].rstrip(")")
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        run = instance.get_run_by_id(run_id)
    assert run.job_name == "smoke_all_job" and run.tags["k3/profile"] == "smoke"
    assert run.tags["k3/launched_by"] == "k3 run"
    assert {k.to_user_string() for k in run.asset_selection} == {"smoke/corpus", "smoke/tokenizer"}


def test_a_rerun_skips_what_is_done_and_force_redoes_it(home, capsys):
    assert main(["run", "--profile", "smoke", "--select", "corpus"]) == 0
    assert "✓ smoke/corpus" in capsys.readouterr().out
    assert main(["run", "--profile", "smoke", "--select", "corpus,image_data"]) == 0
    out = capsys.readouterr().out
    assert "up to date for profile smoke, skipped: corpus (--force redoes them)" in out
    assert "image_data: never materialized for profile 'smoke'" in out
    assert "✓ smoke/image_data" in out and "▶ smoke/corpus" not in out
    assert main(["run", "--profile", "smoke", "--select", "corpus"]) == 0
    assert "nothing to materialize" in capsys.readouterr().out
    assert main(["run", "--profile", "smoke", "--select", "corpus", "--force"]) == 0
    assert "✓ smoke/corpus" in capsys.readouterr().out


def test_set_overrides_a_config_field_and_names_what_to_change(home, capsys):
    with pytest.raises(SystemExit, match="corpus has no config field 'sed'; its fields are: seed"):
        main(["run", "--profile", "smoke", "--select", "corpus", "--set", "corpus.sed=3"])
    with pytest.raises(SystemExit, match="write ASSET.FIELD=VALUE"):
        main(["run", "--profile", "smoke", "--select", "corpus", "--set", "corpus=3"])
    assert main(["run", "--profile", "smoke", "--select", "corpus", "--set", "corpus.seed=3"]) == 0
    out = capsys.readouterr().out
    assert '"smoke__corpus": {"config": {"seed": 3}}' in out and "✓ smoke/corpus" in out
    import dagster as dg
    run_id = out.strip().splitlines()[-1].rsplit("(run ", 1)[1].rstrip(")")
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        assert instance.get_run_by_id(run_id).run_config["ops"] == {"smoke__corpus": {"config": {"seed": 3}}}
    # An up-to-date asset is not run, so its override would be silently dropped: refused instead.
    with pytest.raises(SystemExit, match="corpus is not materialized by this run .* add --force"):
        main(["run", "--profile", "smoke", "--select", "corpus", "--set", "corpus.seed=4"])


@pytest.mark.parametrize("item, message", [
    ('rl_specialist.steps="many"', r"rl_specialist.steps must be Int, not \"many\" \(str\); e.g. --set rl_specialist.steps=20"),
    ("rl_specialist.lr=fast", r"rl_specialist.lr must be Float, not \"fast\" \(str\)"),
    ("corpus.seed=1.5", r"corpus.seed must be Int, not 1.5 \(float\)"),
    # A list field given a bare word: the hint shows a JSON list, single-quoted for the shell.
    ("mopd_student.domains=general_tasks", r"mopd_student.domains must be Array.String, not \"general_tasks\" "
                                           r"\(str\); e.g. --set mopd_student.domains='\[\"text\"\]'"),
])
def test_a_wrong_type_set_value_names_the_field_and_the_value_before_the_run(home, item, message):
    with pytest.raises(SystemExit, match=message):
        main(["run", "--profile", "smoke", "--select", item.split(".")[0], "--set", item])


def test_a_ray_task_failure_reads_its_whole_message_and_where_it_was_raised():
    """A CUDA error's message spans lines and ends in advice; the run's ✗ line keeps all of it and the frame
    that raised it (the GPU run of session 31 printed only "Compile with `TORCH_USE_CUDA_DSA` …")."""
    from dagster._utils.error import SerializableErrorInfo

    from pipelines.cli import _root_message
    text = ("\x1b[36mray::small/rl_tasks()\x1b[39m (pid=3128, ip=10.0.0.2)\n"
            '  File "/work/k3model/train/ladder.py", line 210, in measure_ladder\n'
            "    episodes = policy.play(jobs)\n"
            '  File "/work/k3model/engine.py", line 162, in sample\n'
            "    drawn_S = torch.multinomial(dist_logp_SV.exp(), 1, generator=generator).squeeze(-1)\n"
            "              ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            "RuntimeError: CUDA error: device-side assert triggered\n"
            "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
            "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.")
    err = SerializableErrorInfo(message=f"ray.exceptions.RayTaskError(RuntimeError): {text}", stack=[],
                                cls_name="RayTaskError(RuntimeError)")
    assert _root_message(err) == (
        "RuntimeError: CUDA error: device-side assert triggered For debugging consider passing "
        "CUDA_LAUNCH_BLOCKING=1 Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions. "
        "(raised at /work/k3model/engine.py:162 in sample)")
    one_line = SerializableErrorInfo(message="ray.exceptions.RayTaskError(ValueError): ray::f()\nValueError: bad",
                                     stack=[], cls_name="RayTaskError(ValueError)")
    assert _root_message(one_line) == "ValueError: bad"
