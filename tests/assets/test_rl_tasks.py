"""The rl_tasks asset through Dagster with real Ray and MLflow, on a smoke SFT checkpoint: the
ladder JSON (pass@1, pass@k, greedy, the selection, each cell's RL and held-out tasks, the random and
expert policies' success on every split) and its metadata tables."""

import json
from dataclasses import asdict, replace
from pathlib import Path

import dagster as dg
import pytest
import torch

from assets import posttrain
from assets.lineage import PROFILE_TAG, key
from datagen.corpus import build_corpus
from datagen.profiles import presets
from datagen.sft import SFTDataConfig, build_sft
from datagen.tokenizer import train_tokenizer
from k3model.checkpoint import sha256_file, verify_checkpoint
from k3model.config import get_profile
from k3model.model import K3Model
from k3model.train.common import save_state
from k3model.train.ladder import LadderReport
from k3model.train.recipes import POSTTRAIN_SIZES
from k3model.train.sft import SFTConfig
from k3model.train.sft import train as sft_train

ASSETS = {a.key.path[-1]: a for a in posttrain.build("smoke")}


@pytest.fixture(scope="module")
def instance(tmp_path_factory):
    """An ephemeral instance with a smoke tokenizer and a 2-step smoke SFT checkpoint reported."""
    root = tmp_path_factory.mktemp("rl_tasks")
    cfg = presets("smoke")
    tok = train_tokenizer(cfg.tokenizer, build_corpus(cfg.corpus))
    tok.save(str(root / "tokenizer.json"))
    demos = build_sft(SFTDataConfig(tasks_per_family=1, families=("echo_word",)), tok)
    torch.manual_seed(0)
    base = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded"))
    save_state(root / "base", base, {"config": {"model": asdict(base.cfg)}})
    sft = sft_train(SFTConfig(profile="smoke", steps=2, batch_size=2, qat=False), demos, root / "sft",
                    init_checkpoint=root / "base").checkpoint_dir
    inst = dg.DagsterInstance.ephemeral()
    for name, path in (("tokenizer", root / "tokenizer.json"), ("sft_policy", Path(sft))):
        sha = verify_checkpoint(path).sha256 if path.is_dir() else sha256_file(path)
        inst.report_runless_asset_event(dg.AssetMaterialization(
            asset_key=key("smoke", name), metadata={"path": dg.MetadataValue.path(str(path)), "sha256": sha},
            tags={PROFILE_TAG: "smoke", "dagster/data_version": sha}))
    return inst


def test_rl_tasks_records_the_ladder_and_each_splits_random_and_expert_success(instance, smoke_resources):
    rl_tasks = ASSETS["rl_tasks"]
    result = dg.materialize([rl_tasks], instance=instance, resources=smoke_resources, selection=[rl_tasks.key])
    assert result.success
    md = {k: v.value for k, v in result.asset_materializations_for_node("smoke__rl_tasks")[0].metadata.items()}
    sizes = POSTTRAIN_SIZES["smoke"]
    ladder = json.loads(Path(md["path"]).read_text())
    report = LadderReport.from_json(ladder)
    # Smoke plays 2 samples a task, so the ladder selects on pass@2 (and says so in its config).
    assert report.config.k == 2 and report.config.band == (0.2, 0.6) and report.config.pass_at_k_min == 0.8
    assert md["selection"].startswith("pass@1 (T=1) in [0.2, 0.6] and pass@2 ≥ 0.8")
    assert len(report.cells) == 9
    for c in report.cells:
        assert set(c.pass_at_k) == set(c.greedy) == set(c.families) and c.selected
        tasks = ladder["tasks"][f"{c.domain}/{c.effort}"]
        assert {f for f, _ in tasks["rl"]} == {f for f, _ in tasks["eval"]} == set(c.selected)
        assert len(tasks["rl"]) == sizes.rl_tasks_per_family * len(c.selected)
        # The random policy never passes; the scripted expert passes every task it plays.
        for split in ("rl", "heldout", "hard"):
            (rs, rn), (es, en) = c.baselines[split]["random"], c.baselines[split]["expert"]
            assert rs == 0 and es == en == rn >= 1, (c.domain, c.effort, split)
    assert md["random_passes"] == 0 and md["expert_min"] == 1.0
    # Where the ladder ran (issue 42 item 1: every asset that evaluates a model records its device).
    assert md["device"] == "cpu" and md["gpu"] == "none" and md["ray_resources"].get("CPU", 0) > 0
    assert md["baselines"].startswith("| domain | effort | split | tasks | random | expert |")
    assert md["baselines"].count("\n") == 2 + 9 * 3 - 1
    assert "| domain | effort | family | pass@1 (T=1) | pass@2 | greedy | selected | cell in band |" in md["ladder"]
    # A table too wide for the UI is split by columns, each part under its row label (assets/display.py).
    parts = [t.splitlines() for t in md["chosen"].split("\n\n")]
    assert all(p[0].startswith("| domain | effort |") and len(p) == 2 + 9 for p in parts)
    heads = [c.strip() for p in parts for c in p[0].strip("|").split("|")[2:]]
    assert heads[:4] == ["selected", "pass@1", "pass@2", "greedy"]
