"""Every asset config refuses non-finite and out-of-range values, and sizes that cannot fit the
machine, naming field and value — by `k3 run --set` before the run starts (issue 45 item 1)."""

import math

import pytest
from pydantic import ValidationError

import k3model.limits as limits
from assets.config_bounds import LR_MAX, AssetConfig
from assets.data import DataConfig
from assets.deploy import DraftModelConfig, QuantizedStudentConfig
from assets.distill import CrossHarnessConfig, MOPDStudentConfig
from assets.evaluation import EvalConfig
from assets.posttrain import RLSpecialistConfig, RLTasksConfig, SFTDataAssetConfig, SFTPolicyConfig
from assets.pretrain import PretrainStageConfig
from assets.report import ReportConfig
from pipelines.cli import main

GIB = 1 << 30


@pytest.fixture
def home(tmp_path, monkeypatch):
    for var in ("K3_HOME", "DAGSTER_HOME", "K3_PROFILE"):
        monkeypatch.setenv(var, "")
    monkeypatch.setenv("K3_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


@pytest.fixture
def ram_16gib(monkeypatch):
    # The memory bounds compare with this machine's RAM: fixed, so the numbers are the same anywhere.
    monkeypatch.setattr(limits, "ram_bytes", lambda: 16 * GIB)


def test_every_asset_config_takes_the_one_validation():
    for cls in (DataConfig, DraftModelConfig, QuantizedStudentConfig, CrossHarnessConfig, MOPDStudentConfig,
                EvalConfig, RLSpecialistConfig, RLTasksConfig, SFTDataAssetConfig, SFTPolicyConfig,
                PretrainStageConfig, ReportConfig):
        assert issubclass(cls, AssetConfig), cls


@pytest.mark.parametrize("cls, field, value, message", [
    (SFTPolicyConfig, "lr", math.inf, "lr must be a finite number, got inf"),
    (DraftModelConfig, "lr", math.inf, "lr must be a finite number, got inf"),
    (RLSpecialistConfig, "lr", math.inf, "lr must be a finite number, got inf"),
    (MOPDStudentConfig, "lr", float("1e999"), "lr must be a finite number, got inf"),
    (PretrainStageConfig, "lr", math.inf, "lr must be a finite number, got inf"),
    (MOPDStudentConfig, "outcome_coef", math.inf, "outcome_coef must be a finite number, got inf"),
    (PretrainStageConfig, "qk_clip_tau", math.inf, "qk_clip_tau must be a finite number, got inf"),
    (SFTPolicyConfig, "lr", 3.0, rf"lr must lie in \(0, {LR_MAX}\] .* got 3.0"),
    (SFTPolicyConfig, "lr", math.nan, "greater than 0"),
])
def test_a_non_finite_or_absurd_value_is_refused_naming_field_and_value(cls, field, value, message):
    with pytest.raises(ValidationError, match=message):
        cls(**{field: value})


def test_sound_values_pass():
    assert SFTPolicyConfig(lr=1e-2).lr == 1e-2
    assert RLSpecialistConfig(lr=LR_MAX, group_size=8).group_size == 8
    MOPDStudentConfig(lr=1e-4).check_fits("smoke")


@pytest.mark.parametrize("given, message", [
    ({"domains": ["coding"]}, "unknown domain 'coding': choose one of general_tasks, general_agents, coding_agents"),
    ({"efforts": ["low", "medium"]}, "unknown effort 'medium': choose one of low, high, max"),
    ({"efforts": ["low", "low"]}, "efforts names 'low' twice"),
    ({"domains": []}, "at least 1 item"),
])
def test_mopd_students_routes_name_known_domains_and_efforts_once(given, message):
    with pytest.raises(ValidationError, match=message):
        MOPDStudentConfig.for_profile("small")(**given)


def test_mopd_students_routes_default_to_all_nine():
    assert (MOPDStudentConfig().domains, MOPDStudentConfig().efforts) == (None, None)
    one = MOPDStudentConfig.for_profile("small")(domains=["general_tasks"], efforts=["low"]).filled("small")
    assert (one.domains, one.efforts) == (["general_tasks"], ["low"])


@pytest.mark.parametrize("config, message", [
    (RLSpecialistConfig(group_size=1_000_000),
     r"group_size=1000000 holds 4000000 episodes at once \(group_size 1000000 × groups_per_step 4, .*\), at least "
     r"32 KiB each = 122.1 GiB, more than this machine's 16.0 GiB of RAM: lower group_size \(at most 131072 would"),
    (RLSpecialistConfig(groups_per_step=1_000_000), r"groups_per_step=1000000 holds 8000000 episodes"),
    (MOPDStudentConfig(samples_per_task=1_000_000), r"samples_per_task=1000000 holds 3000000 episodes"),
    (RLTasksConfig(samples=1_000_000), r"samples=1000000 holds 1000000 episodes"),
    (SFTPolicyConfig(batch_size=100_000), r"batch_size=100000 rows of at least 256 tokens need at least 122.1 GiB per step .*at most 13107 would pass"),
])
def test_a_size_that_cannot_fit_the_machine_is_refused_with_the_numbers(ram_16gib, config, message):
    with pytest.raises(ValueError, match=message):
        config.check_fits("smoke")


@pytest.mark.parametrize("item, message", [
    ("sft_policy.lr=Infinity", "sft_policy.lr must be a finite number, got inf"),
    ("draft_model.lr=Infinity", "draft_model.lr must be a finite number, got inf"),
    ("rl_specialist.lr=Infinity", "rl_specialist.lr must be a finite number, got inf"),
    ("mopd_student.lr=1e999", "mopd_student.lr must be a finite number, got inf"),
    ("rl_specialist.group_size=1000000", "rl_specialist: group_size=1000000 holds 4000000 episodes .* 16.0 GiB"),
    # A JSON list through --set, checked against the domains there are.
    ('mopd_student.domains=["general_tasks","coding"]',
     "mopd_student.domains: unknown domain 'coding': choose one of general_tasks, general_agents, coding_agents"),
])
def test_k3_run_refuses_before_the_run_starts(home, ram_16gib, item, message):
    with pytest.raises(SystemExit, match=f"--set refused before the run: {message}"):
        main(["run", "--profile", "smoke", "--set", item])
    # Refused before any step: the run left no materialization behind (no run was even created).
    import dagster as dg
    with dg.DagsterInstance.from_config(str(home / "dagster")) as instance:
        assert instance.get_runs() == []


# Every config whose fields default to a profile's values (issue 46 item 5); the launchpad's side
# is tests/pipelines/test_definitions.py.
PROFILE_CONFIGS = [(cls, {}) for cls in (SFTDataAssetConfig, SFTPolicyConfig, RLTasksConfig, RLSpecialistConfig,
                                         MOPDStudentConfig, CrossHarnessConfig, QuantizedStudentConfig,
                                         DraftModelConfig, ReportConfig)] + [(PretrainStageConfig, {"stage": s})
                                                                             for s in (1, 2, 3, 4)]


@pytest.mark.parametrize("profile", ["smoke", "tiny", "small"])
def test_the_launchpads_defaults_are_what_a_run_that_sets_nothing_used(profile):
    for cls, where in PROFILE_CONFIGS:
        shown = cls.for_profile(profile, **where)()
        assert cls.for_profile(profile, **where) is type(shown) and isinstance(shown, cls)
        # The base class leaves them None: what `k3 run` passed before, filled as the body fills it.
        unset = cls().filled(profile, **where)
        assert shown.model_dump() == unset.model_dump() or cls is ReportConfig, cls
        assert set(cls.profile_values(profile, **where)) <= set(cls.model_fields)
    assert ReportConfig.for_profile(profile)().kernelsuite == ("sample" if profile == "smoke" else "all")


@pytest.mark.parametrize("profile", ["smoke", "tiny", "small"])
def test_a_stage_resolves_its_shown_defaults_as_it_resolved_none(monkeypatch, profile):
    import k3model.train.pretrain as pretrain
    # The machine bound is not what is compared here (small's stages exceed this machine).
    monkeypatch.setattr(pretrain, "check_fits_machine", lambda *a: None)
    for stage in (1, 2, 3, 4):
        shown = PretrainStageConfig.for_profile(profile, stage=stage)()
        fields = ("steps", "batch_size", "lr", "balancing", "eval_examples_per_cell")
        given = pretrain.PretrainConfig(profile=profile, stage=stage, **{f: getattr(shown, f) for f in fields})
        unset = pretrain.PretrainConfig(profile=profile, stage=stage)
        assert given.resolved() == unset.resolved(), (profile, stage)
        assert (given.eval_examples_per_cell or pretrain.eval_sizes(profile)[0]) == pretrain.eval_sizes(profile)[0]


def test_a_field_set_to_null_takes_the_profiles_value_and_a_set_value_wins():
    tiny = SFTPolicyConfig.for_profile("tiny")
    assert (tiny().steps, tiny().batch_size, tiny().lr) == (900, 4, 2e-3)
    assert tiny(steps=None).filled("tiny").steps == 900
    assert tiny(steps=20).filled("tiny").steps == 20
    assert CrossHarnessConfig.for_profile("tiny")().folds == ["openclaw", "hermes"]
    with pytest.raises(ValidationError):
        CrossHarnessConfig(folds=[])  # no fold: nothing to train, not the profile's folds


def test_the_profiles_own_sizes_are_trusted_and_an_override_is_checked(monkeypatch):
    # 1.5 MiB: less than small's own SFT batch and its 64 RL and ladder episodes (32 KiB each) need,
    # more than mopd_student's 36 episodes of one sample (samples_per_task has no profile value: always checked).
    monkeypatch.setattr(limits, "ram_bytes", lambda: 3 << 19)
    for cls, _ in PROFILE_CONFIGS:
        cls.for_profile("small", **_)().check_fits("small")
        cls().check_fits("small")
    for config in (SFTPolicyConfig.for_profile("small")(batch_size=17),
                   RLSpecialistConfig.for_profile("small")(group_size=9), RLTasksConfig.for_profile("small")(samples=9),
                   MOPDStudentConfig.for_profile("small")(episodes_per_step=100)):
        with pytest.raises(ValueError, match="more than this machine's"):
            config.check_fits("small")
