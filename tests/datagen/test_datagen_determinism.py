"""Same config → identical bytes for every artifact, also from a fresh process (where Python's string
hashing and the tokenizer's Rust hash maps are seeded differently); another seed → other bytes."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from datagen.build import PRETRAIN_INPUTS, build_all
from datagen.profiles import presets

REPO = Path(__file__).resolve().parents[2]


def _hashes(manifest: dict) -> dict[str, str]:
    return {name: f["sha256"] for name, f in manifest["files"].items()}


@pytest.fixture(scope="module")
def smoke_hashes(tmp_path_factory):
    return _hashes(build_all(presets("smoke"), tmp_path_factory.mktemp("seed0")))


def test_same_bytes_from_a_fresh_process(smoke_hashes, tmp_path):
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    subprocess.run([sys.executable, "-m", "datagen", "--profile", "smoke", "--out", str(tmp_path)],
                   cwd=REPO, env=env, check=True, capture_output=True)
    assert _hashes(json.loads((tmp_path / "manifest.json").read_text())) == smoke_hashes
    assert set(smoke_hashes) == {
        "corpus.parquet", "tokenizer.json", "images.parquet", "clue_eval.parquet", "vqa_eval.parquet",
        "pretrain_stage1_64.parquet", "pretrain_stage2_128.parquet", "pretrain_stage3_256.parquet",
        "pretrain_stage4_512.parquet",
    }


def test_other_seed_changes_every_artifact(smoke_hashes, tmp_path):
    other = _hashes(build_all(presets("smoke", seed=1), tmp_path))
    assert all(other[name] != smoke_hashes[name] for name in smoke_hashes)


def test_pretrain_inputs_only_writes_the_same_four_files(smoke_hashes, tmp_path):
    manifest = build_all(presets("smoke"), tmp_path, pretrain_inputs_only=True)
    assert _hashes(manifest) == {name: smoke_hashes[name] for name in PRETRAIN_INPUTS}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted((*PRETRAIN_INPUTS, "manifest.json"))
