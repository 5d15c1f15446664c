"""The Definitions load and hold what docs/design.md §1 and the issues ask for: one lineage per
profile under its key prefix, per-profile jobs, schedules and automation sensors tagged with it."""

import dagster as dg

from assets.lineage import PROFILES, key
from pipelines.definitions import defs
from pipelines.resources import default_profile

DATA = {"corpus", "tokenizer", "clue_data", "image_data"}
PRETRAIN = {"pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3", "pretrain_stage_4", "base_model",
            "balancing_ablation"}
POSTTRAIN = {"sft_data", "sft_policy", "rl_tasks", "rl_specialist"}
DISTILL = {"mopd_student", "cross_harness"}
DEPLOY = {"quantized_student", "draft_model", "served_model"}


def _graph():
    return defs.resolve_asset_graph()


def test_every_asset_once_per_profile_in_its_groups():
    graph = _graph()
    keys = graph.get_all_asset_keys()
    assert {k.path[0] for k in keys} == set(PROFILES) and all(len(k.path) == 2 for k in keys)
    for p in PROFILES:
        mine = {k.path[-1]: graph.get(k) for k in keys if k.path[0] == p}
        assert set(mine) == DATA | PRETRAIN | POSTTRAIN | DISTILL | DEPLOY | {"checkpoint_evals", "report"}
        assert {n for n, a in mine.items() if a.group_name == f"{p}_data"} == DATA
        assert {n for n, a in mine.items() if a.group_name == f"{p}_pretraining"} == PRETRAIN
        assert {n for n, a in mine.items() if a.group_name == f"{p}_posttraining"} == POSTTRAIN
        assert {n for n, a in mine.items() if a.group_name == f"{p}_distillation"} == DISTILL
        assert {n for n, a in mine.items() if a.group_name == f"{p}_deployment"} == DEPLOY
        assert all(a.tags.get("k3/profile") == p for a in mine.values())


def test_lineage_stays_within_a_profile_and_draws_no_implied_edge():
    graph = _graph()

    def parents(p, name):
        parent_keys = graph.get(key(p, name)).parent_keys
        assert {k.path[0] for k in parent_keys} <= {p}
        return {k.path[-1] for k in parent_keys}
    # One chain, left to right: an edge a longer path implies (corpus → pretrain_stage_2, through
    # stage 1) is left out (assets/lineage.py, without_implied_deps).
    chain = ["corpus", "tokenizer", "clue_data", "pretrain_stage_1", "pretrain_stage_2", "pretrain_stage_3",
             "pretrain_stage_4", "base_model", "sft_policy", "rl_tasks", "rl_specialist", "mopd_student",
             "quantized_student", "draft_model"]
    side = {"image_data": set(), "sft_data": {"tokenizer"}, "cross_harness": {"sft_policy"},
            "served_model": {"draft_model"}, "balancing_ablation": {"clue_data", "image_data"}}
    for p in PROFILES:
        for up, down in zip(chain, chain[1:]):
            assert up in parents(p, down), (up, down)
        assert parents(p, "pretrain_stage_1") == {"clue_data", "image_data"}
        assert parents(p, "sft_policy") == {"base_model", "sft_data"}
        assert all(len(parents(p, down)) == 1 for down in chain[1:] if down not in ("pretrain_stage_1", "sft_policy"))
        assert all(parents(p, n) == want for n, want in side.items())
        # balancing_ablation (claim 2's arms) sits beside stage 1 and feeds only the report.
        assert parents(p, "report") == {"draft_model", "cross_harness", "balancing_ablation"}
        # checkpoint_evals keeps every stage: the report reads the stage versions it recorded.
        assert parents(p, "checkpoint_evals") == {f"pretrain_stage_{s}" for s in range(1, 5)}


def test_implied_deps_is_the_transitive_reduction():
    from assets.lineage import implied_deps
    a, b, c, d = (key("x", n) for n in "abcd")
    # a → b → c, a → c, a → d, d → c: a → c is implied twice over, d → c is not.
    assert implied_deps({a: set(), b: {a}, c: {a, b, d}, d: {a}}) == {c: {a}}
    assert implied_deps({a: set(), b: {a}}) == {}
    evals, s1, s2 = key("x", "checkpoint_evals"), key("x", "pretrain_stage_1"), key("x", "pretrain_stage_2")
    assert implied_deps({s1: set(), s2: {s1}, evals: {s1, s2}}) == {}


def test_specialists_are_one_asset_with_nine_browsable_partitions():
    graph = _graph()
    for p in PROFILES:
        node = graph.get(key(p, "rl_specialist"))
        assert isinstance(node.partitions_def, dg.MultiPartitionsDefinition)
        assert {d.name for d in node.partitions_def.partitions_defs} == {"domain", "effort"}
        assert len(node.partitions_def.get_partition_keys()) == 9
        assert "coding_agents|max" in node.partitions_def.get_partition_keys()
        assert node.backfill_policy == dg.BackfillPolicy.single_run()
        # Only the specialists are partitioned: the profile's job holds them with the rest.
        assert [k.path[-1] for k in graph.get_all_asset_keys()
                if k.path[0] == p and graph.get(k).partitions_def is not None] == ["rl_specialist"]


def test_checks_attached():
    checks = {(k.asset_key.to_user_string(), k.name) for k in _graph().asset_check_keys}
    from assets.checkpoint_checks import CHECKPOINT_ASSETS
    for p in PROFILES:
        for s in range(1, 5):
            assert (f"{p}/pretrain_stage_{s}", "loss_fell") in checks
        # Every checkpoint asset: re-hashed and finite, each check once.
        for name in CHECKPOINT_ASSETS:
            assert {(f"{p}/{name}", "checkpoint_intact"), (f"{p}/{name}", "checkpoint_sound")} <= checks
        assert {(f"{p}/report", f"claim_{n}") for n in range(1, 9)} <= checks


def test_jobs_are_per_profile_and_tag_their_runs():
    jobs = {j.name: j for j in defs.resolve_all_job_defs()}

    def selected(name):
        return {k.to_user_string() for k in jobs[name].asset_layer.executable_asset_keys}
    for p in PROFILES:
        assert selected(f"{p}_all_job") == {f"{p}/{n}" for n in DATA | PRETRAIN | POSTTRAIN | DISTILL | DEPLOY | {"checkpoint_evals", "report"}}
        # A run of the job trains all nine specialists: the range from the first to the last of each dimension.
        assert jobs[f"{p}_all_job"].tags["dagster/asset_partition_range_start"] == "general_tasks|low"
        assert jobs[f"{p}_all_job"].tags["dagster/asset_partition_range_end"] == "coding_agents|max"
        assert selected(f"{p}_eval_job") == {f"{p}/checkpoint_evals"}
        assert jobs[f"{p}_all_job"].tags["k3/profile"] == p == jobs[f"{p}_eval_job"].tags["k3/profile"]
    # One process per run: one Ray cluster per run, not per step.
    assert all(j.executor_def.name == "in_process" for j in jobs.values())


def test_schedules_and_sensors():
    for p in PROFILES:
        nightly = defs.resolve_schedule_def(f"{p}_nightly_checkpoint_eval")
        # On for the machine's profile (K3_PROFILE, else tiny) only: the others' previews would only skip.
        on = dg.DefaultScheduleStatus.RUNNING if p == default_profile() else dg.DefaultScheduleStatus.STOPPED
        assert nightly.default_status == on and nightly.job_name == f"{p}_eval_job"
        weekly = defs.resolve_schedule_def(f"{p}_weekly_full_rerun")
        assert weekly.default_status == dg.DefaultScheduleStatus.STOPPED and weekly.job_name == f"{p}_all_job"
        sensor = defs.resolve_sensor_def(f"{p}_automation")
        assert sensor.default_status == dg.DefaultSensorStatus.RUNNING and sensor.run_tags == {"k3/profile": p}
        # The UI shows the target as its selection string, not a Python repr.
        assert str(sensor.asset_selection) == f'key:"{p}/*"'
        assert sensor.asset_selection.resolve(_graph()) == dg.AssetSelection.key_prefixes([p]).resolve(_graph())
        assert _graph().get(key(p, "base_model")).automation_condition is not None


def test_resources():
    # The profile is no resource: it is the assets' key prefix.
    assert set(defs.resources) == {"ray", "mlflow", "store"}


def test_definitions_module_only_assembles():
    import inspect

    import pipelines.definitions as module
    source = inspect.getsource(module)
    assert len(source.splitlines()) <= 25
    assert "@dg.asset" not in source and "def " not in source


# What each asset runs with when its config leaves a field alone, read off the profile's recipe
# rows (a second reading of them, apart from the config classes' `profile_values`): asset → field → value.
def _recipe(p: str) -> dict[str, dict]:
    from k3model.config import get_profile
    from k3model.train.pretrain import BALANCING_ARM_STEPS, eval_sizes
    from k3model.train.recipes import DEPLOY_SIZES, DISTILL_SIZES, POSTTRAIN_SIZES
    post, dist, dep, prof = POSTTRAIN_SIZES[p], DISTILL_SIZES[p], DEPLOY_SIZES[p], get_profile(p)
    stages = {f"pretrain_stage_{i + 1}": {"steps": row.steps, "batch_size": row.batch_size, "lr": row.lr,
                                          "balancing": prof.model.balancing, "eval_examples_per_cell": eval_sizes(p)[0],
                                          "quantile_window_tokens": (prof.model.quantile_window_tokens
                                                                     if row.quantile_window_tokens is None
                                                                     else row.quantile_window_tokens),
                                          "optimizer": prof.optimizer}
              for i, row in enumerate(prof.stages)}
    return {**stages,
            "sft_data": {"tasks_per_family": post.sft_tasks_per_family, "family_weights": dict(post.sft_family_weights)},
            "sft_policy": {"steps": post.sft_steps, "batch_size": post.sft_batch_size, "lr": post.sft_lr,
                           "eval_tasks_per_family": post.eval_tasks_per_family},
            "rl_tasks": {"tasks_per_family": post.ladder_tasks_per_family, "samples": post.ladder_samples},
            "rl_specialist": {"steps": post.rl_steps, "group_size": post.rl_group_size,
                              "groups_per_step": post.rl_groups_per_step, "lr": post.rl_lr},
            "mopd_student": {"steps": dist.mopd_steps, "episodes_per_step": dist.mopd_episodes_per_step,
                             "lr": dist.mopd_lr},
            "cross_harness": {"folds": list(dist.folds), "steps": dist.transfer_steps},
            "quantized_student": {"compare_steps": dep.compare_steps, "compare_lr": dep.compare_lr,
                                  "compare_scope": dep.compare_scope},
            "draft_model": {"steps": dep.draft_steps, "ttt_steps": dep.draft_ttt_steps},
            "report": {"kernelsuite": "sample" if p == "smoke" else "all"},
            "balancing_ablation": {"steps": BALANCING_ARM_STEPS.get(p, prof.stages[0].steps),
                                   "balanced": prof.model.balancing}}


# Fields whose value is "none" on some profile, which Dagster's launchpad leaves out of its YAML:
# no QK-Clip, every clue-eval length, tiny's whole clue-eval grid, every domain and effort mopd_student
# distils (the nine routes).
NONE_IS_THE_VALUE = {"qk_clip_tau", "eval_max_length", "eval_examples_per_cell", "domains", "efforts"}


def _launchpad_yaml(job: dg.JobDefinition) -> dict:
    """The config the Dagster UI's launchpad opens on for `job`: GraphQL's `rootDefaultYaml`
    (dagster_graphql/schema/run_config.py) is this function of the job's config schema snapshot."""
    import yaml
    from dagster._core.snap.snap_to_yaml import default_values_yaml_from_type_snap
    snap = job.get_job_snapshot()
    schema = snap.config_schema_snapshot
    root = schema.get_config_snap(snap.mode_def_snaps[0].root_config_key)
    return yaml.safe_load(default_values_yaml_from_type_snap(schema, root))


def test_the_launchpad_opens_on_each_profiles_values():
    ops = _launchpad_yaml(defs.resolve_implicit_global_asset_job_def())["ops"]
    for p in PROFILES:
        recipe = _recipe(p)
        for name in sorted(DATA | PRETRAIN | POSTTRAIN | DISTILL | DEPLOY | {"checkpoint_evals", "report"}):
            assets_def = defs.resolve_assets_def(key(p, name))
            if not assets_def.op.compute_fn.has_config_arg():
                assert name not in recipe, name
                continue
            shown = ops[assets_def.op.name]["config"]
            cls = assets_def.op.compute_fn.get_config_arg().annotation
            where = {"stage": int(name.rsplit("_", 1)[1])} if name.startswith("pretrain_stage_") else {}
            assert set(cls.profile_values(p, **where)) == set(recipe.get(name, {})), (p, name)
            # Every field the profile decides shows the profile's value, every other its one default;
            # none is left None unless none is its value.
            for field, info in cls.model_fields.items():
                value = recipe.get(name, {}).get(field, info.default)
                if value is None:
                    assert field in NONE_IS_THE_VALUE and field not in shown, (
                        f"{p}/{name}.{field} defaults to None: give it the profile's value (profile_values) or "
                        "say in NONE_IS_THE_VALUE why none is its value")
                else:
                    assert shown[field] == value, (p, name, field, shown[field], value)
    # The launchpad of one asset, as `Materialize…` opens it: tiny's SFT sizes.
    one = _launchpad_yaml(defs.resolve_implicit_global_asset_job_def().get_subset(
        asset_selection={key("tiny", "sft_policy")}))["ops"]["tiny__sft_policy"]["config"]
    assert {k: one[k] for k in ("steps", "batch_size", "lr")} == {"steps": 900, "batch_size": 4, "lr": 2e-3}
