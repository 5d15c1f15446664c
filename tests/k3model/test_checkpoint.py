"""k3model.checkpoint: round trip, manifest provenance, corruption refused, atomic writes, exact resume."""

import importlib.metadata
import json
import os
import random
import re

import numpy as np
import pytest
import torch

from k3model.checkpoint import (
    MANIFEST_FILE, WEIGHTS_FILE, CheckpointCorrupted, TrainState, capture_rng_state, load_checkpoint,
    load_train_state, restore_rng_state, save_checkpoint, sha256_file, verify_checkpoint,
)


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 4))


def test_round_trip_and_manifest(tmp_path):
    model = _model()
    info = save_checkpoint(tmp_path / "ckpt", model.state_dict(),
                           {"config": {"profile": "smoke", "stage": 1}, "data_versions": {"corpus": "ab12"}})
    sd, manifest = load_checkpoint(tmp_path / "ckpt")
    assert sd.keys() == model.state_dict().keys()
    for k, v in model.state_dict().items():
        assert torch.equal(sd[k], v)
    assert manifest["sha256"] == info.sha256 == sha256_file(tmp_path / "ckpt" / WEIGHTS_FILE)
    assert manifest["config"] == {"profile": "smoke", "stage": 1}
    assert manifest["data_versions"] == {"corpus": "ab12"}
    assert manifest["library_versions"]["torch"] == importlib.metadata.version("torch")
    assert len(manifest["code_version"]["source_sha256"]) == 64
    assert manifest["code_version"]["git_commit"] is None or len(manifest["code_version"]["git_commit"]) == 40
    assert manifest["num_parameters"] == sum(p.numel() for p in model.parameters())
    assert manifest["hardware"]["cpu_count"] == os.cpu_count()
    # Nothing but the checkpoint is left in the parent directory.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_same_weights_same_content_hash(tmp_path):
    a = save_checkpoint(tmp_path / "a", _model(0).state_dict(), {"config": {"run": 1}})
    b = save_checkpoint(tmp_path / "b", _model(0).state_dict(), {"config": {"run": 2}})
    c = save_checkpoint(tmp_path / "c", _model(1).state_dict())
    assert a.sha256 == b.sha256 != c.sha256


def test_corrupted_weights_refused_with_hashes_in_message(tmp_path):
    info = save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    weights = tmp_path / "ckpt" / WEIGHTS_FILE
    raw = bytearray(weights.read_bytes())
    raw[-3] ^= 0xFF  # flip bits in the last tensor's data, keeping the file parseable
    weights.write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupted) as err:
        load_checkpoint(tmp_path / "ckpt")
    msg = str(err.value)
    assert str(weights) in msg and info.sha256 in msg and sha256_file(weights) in msg
    with pytest.raises(ValueError):  # CheckpointCorrupted is a ValueError
        verify_checkpoint(tmp_path / "ckpt")
    # verify=False skips the check and reads the damaged weights.
    sd, _ = load_checkpoint(tmp_path / "ckpt", verify=False)
    assert not all(torch.equal(sd[k], v) for k, v in _model().state_dict().items())


def test_missing_or_broken_manifest(tmp_path):
    save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    (tmp_path / "ckpt" / MANIFEST_FILE).write_text("{not json")
    with pytest.raises(CheckpointCorrupted, match="not valid JSON"):
        verify_checkpoint(tmp_path / "ckpt")
    (tmp_path / "ckpt" / MANIFEST_FILE).unlink()
    with pytest.raises(CheckpointCorrupted, match="no manifest.json"):
        load_checkpoint(tmp_path / "ckpt")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_file_listed_in_manifest(tmp_path):
    save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    (tmp_path / "ckpt" / WEIGHTS_FILE).unlink()
    with pytest.raises(CheckpointCorrupted, match="missing model.safetensors"):
        verify_checkpoint(tmp_path / "ckpt")


def test_existing_directory_and_overwrite(tmp_path):
    first = save_checkpoint(tmp_path / "ckpt", _model(0).state_dict())
    with pytest.raises(FileExistsError):
        save_checkpoint(tmp_path / "ckpt", _model(1).state_dict())
    assert verify_checkpoint(tmp_path / "ckpt").sha256 == first.sha256
    second = save_checkpoint(tmp_path / "ckpt", _model(1).state_dict(), overwrite=True)
    assert verify_checkpoint(tmp_path / "ckpt").sha256 == second.sha256 != first.sha256
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_failed_write_leaves_nothing(tmp_path):
    bad = {"w": torch.zeros(2), "step": 3}
    with pytest.raises(TypeError, match="not a tensor"):
        save_checkpoint(tmp_path / "ckpt", bad)
    assert list(tmp_path.iterdir()) == []


def test_reserved_manifest_keys_rejected(tmp_path):
    with pytest.raises(ValueError, match="sha256"):
        save_checkpoint(tmp_path / "ckpt", _model().state_dict(), {"sha256": "x"})


def test_tied_weights(tmp_path):
    emb = torch.nn.Embedding(10, 4)
    head = torch.nn.Linear(4, 10, bias=False)
    head.weight = emb.weight
    sd = {"emb.weight": emb.weight, "head.weight": head.weight}
    save_checkpoint(tmp_path / "ckpt", sd)
    loaded, _ = load_checkpoint(tmp_path / "ckpt")
    assert torch.equal(loaded["emb.weight"], loaded["head.weight"])


def _steps(model, opt, n):
    for _ in range(n):
        x = torch.randn(5, 8) * float(np.random.rand()) + random.random()
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_exact_resume_from_train_state(tmp_path):
    # Reference: 6 uninterrupted steps (dropout and data draw from torch, numpy and Python RNGs).
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95))
    model.train()
    _steps(model, opt, 3)
    save_checkpoint(tmp_path / "ckpt", model.state_dict(),
                    train_state=TrainState(step=3, optimizer=opt.state_dict(), rng=capture_rng_state(),
                                           extra={"tokens_seen": 120}))
    _steps(model, opt, 3)
    reference = {k: v.clone() for k, v in model.state_dict().items()}

    # Resume: a fresh model and optimizer, then disturb every RNG before restoring.
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    resumed = _model(seed=7)
    opt2 = torch.optim.AdamW(resumed.parameters(), lr=1e-2, betas=(0.9, 0.95))
    sd, _ = load_checkpoint(tmp_path / "ckpt")
    resumed.load_state_dict(sd)
    state = load_train_state(tmp_path / "ckpt")
    assert state.step == 3 and state.extra == {"tokens_seen": 120}
    opt2.load_state_dict(state.optimizer)
    assert opt2.param_groups[0]["betas"] == (0.9, 0.95)
    restore_rng_state(state.rng)
    resumed.train()
    _steps(resumed, opt2, 3)
    for k, v in resumed.state_dict().items():
        assert torch.equal(v, reference[k]), k


def test_train_state_is_hashed(tmp_path):
    save_checkpoint(tmp_path / "ckpt", _model().state_dict(), train_state=TrainState(step=1, rng=capture_rng_state()))
    manifest = json.loads((tmp_path / "ckpt" / MANIFEST_FILE).read_text())
    assert set(manifest["files"]) == {"model.safetensors", "train_state.safetensors", "train_state.json"}
    (tmp_path / "ckpt" / "train_state.json").write_text('{"__dict__": []}')
    with pytest.raises(CheckpointCorrupted, match="train_state.json"):
        load_train_state(tmp_path / "ckpt")


def test_no_train_state_gives_none(tmp_path):
    save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    assert load_train_state(tmp_path / "ckpt") is None


def test_a_manifest_must_list_the_weights_under_the_checkpoints_hash(tmp_path):
    """An empty `files` map used to verify: nothing was re-hashed."""
    from k3model.checkpoint import TRAIN_STATE_TENSORS
    save_checkpoint(tmp_path / "ckpt", _model().state_dict(), train_state=TrainState(step=1))
    path = tmp_path / "ckpt" / MANIFEST_FILE
    original = json.loads(path.read_text())
    for change, expected in [({"files": {}}, "does not list model.safetensors"),
                             ({"sha256": "0" * 64}, "is inconsistent"),
                             ({"files": {k: v for k, v in original["files"].items() if k != TRAIN_STATE_TENSORS}},
                              "records a train state but does not list train_state.safetensors")]:
        path.write_text(json.dumps({**original, **change}))
        with pytest.raises(CheckpointCorrupted, match=expected):
            verify_checkpoint(tmp_path / "ckpt")


def test_link_checkpoint_stages_then_renames(tmp_path):
    from k3model.checkpoint import link_checkpoint
    src = save_checkpoint(tmp_path / "src", _model().state_dict())
    info = link_checkpoint(src.path, tmp_path / "out" / "base")
    assert info.sha256 == src.sha256
    assert os.stat(info.path / WEIGHTS_FILE).st_ino == os.stat(src.path / WEIGHTS_FILE).st_ino  # stored once
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["base"]  # no staging left
    raw = bytearray((src.path / WEIGHTS_FILE).read_bytes())
    raw[-1] ^= 0xFF
    (src.path / WEIGHTS_FILE).write_bytes(bytes(raw))
    with pytest.raises(CheckpointCorrupted):
        link_checkpoint(src.path, tmp_path / "out" / "again")
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["base"]


def test_a_damaged_resume_checkpoint_is_set_aside_with_a_warning(tmp_path):
    from k3model.checkpoint import load_resume_state
    assert load_resume_state(tmp_path / "last") is None
    save_checkpoint(tmp_path / "last", _model().state_dict(), train_state=TrainState(step=7))
    weights, state = load_resume_state(tmp_path / "last")
    assert state.step == 7 and set(weights) == set(_model().state_dict())
    raw = bytearray((tmp_path / "last" / WEIGHTS_FILE).read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    (tmp_path / "last" / WEIGHTS_FILE).write_bytes(bytes(raw))
    with pytest.warns(RuntimeWarning, match="is damaged .* starting the stage from its beginning"):
        assert load_resume_state(tmp_path / "last") is None
    [aside] = list(tmp_path.iterdir())
    assert aside.name.startswith("last.damaged-") and (aside / WEIGHTS_FILE).exists()  # kept to inspect


# ----------------------------------------------------------------------------------------------
# Hostile files on disk: nothing outside the checkpoint directory is hashed, no tree is trusted.

def _rewrite_manifest(directory, edit):
    manifest = json.loads((directory / MANIFEST_FILE).read_text())
    edit(manifest)
    (directory / MANIFEST_FILE).write_text(json.dumps(manifest))


@pytest.mark.parametrize("entry", ["../outside.bin", "/etc/hostname", "sub/../../outside.bin", "link.bin"])
def test_a_manifest_entry_outside_the_directory_fails_verification_naming_it(tmp_path, entry):
    info = save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    (tmp_path / "outside.bin").write_bytes(b"not the checkpoint's")
    (tmp_path / "ckpt" / "link.bin").symlink_to(tmp_path / "outside.bin")
    target = "/etc/hostname" if entry == "/etc/hostname" else str(tmp_path / "outside.bin")
    digest = sha256_file(target)  # a hostile manifest gives the right hash of the outside file
    _rewrite_manifest(info.path, lambda m: m["files"].update({entry: digest}))
    with pytest.raises(CheckpointCorrupted, match=re.escape(repr(entry))):
        verify_checkpoint(info.path)
    with pytest.raises(CheckpointCorrupted, match=re.escape(repr(entry))):
        load_checkpoint(info.path)


def test_a_manifest_hash_that_is_not_a_digest_or_a_manifest_that_is_no_object_fails(tmp_path):
    info = save_checkpoint(tmp_path / "ckpt", _model().state_dict())
    _rewrite_manifest(info.path, lambda m: m["files"].update({"x.bin": {"nested": 1}}))
    with pytest.raises(CheckpointCorrupted, match="'x.bin' the hash .* not a sha256 hex digest"):
        verify_checkpoint(info.path)
    (info.path / MANIFEST_FILE).write_text("[1, 2]")
    with pytest.raises(CheckpointCorrupted, match="holds a JSON list"):
        verify_checkpoint(info.path)
    (info.path / MANIFEST_FILE).write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(CheckpointCorrupted):
        verify_checkpoint(info.path)


def _plant_tree(directory, text):
    """Replace train_state.json by `text` and re-hash it in the manifest (as a hostile writer would)."""
    (directory / "train_state.json").write_text(text)
    _rewrite_manifest(directory, lambda m: m["files"].update({"train_state.json": sha256_file(directory / "train_state.json")}))


_HOSTILE_TREES = {
    "deep nesting": "[" * 200_000 + "]" * 200_000,
    "nesting past the bound": ('{"__dict__": [["step", 1], ["optimizer", {"__dict__": []}], ["rng", {"__dict__": []}], '
                               '["extra", {"__dict__": [["h", ' + "[" * 100 + "]" * 100 + ']]}]]}'),
    "a list": "[1, 2, 3]",
    "wrong field types": json.dumps({"__dict__": [["step", "seven"], ["optimizer", []], ["rng", 3], ["extra", None]]}),
    "missing fields": json.dumps({"__dict__": [["step", 1]]}),
    "a huge number": json.dumps({"__dict__": [["step", 10 ** 30], ["optimizer", {"__dict__": []}],
                                              ["rng", {"__dict__": []}], ["extra", {"__dict__": []}]]}),
    "an infinite step": '{"__dict__": [["step", 1e999], ["optimizer", {"__dict__": []}], ["rng", {"__dict__": []}], ["extra", {"__dict__": []}]]}',
    "a tensor that is not there": json.dumps({"__tensor__": "t999"}),
    "an unknown tag": json.dumps({"__pickle__": "cos\nsystem"}),
    "a 5000-digit integer": '{"__dict__": [["step", ' + "9" * 5000 + ']]}',
}


@pytest.mark.parametrize("kind", sorted(_HOSTILE_TREES))
def test_a_hostile_train_state_is_refused_and_a_resume_sets_it_aside(tmp_path, kind):
    from k3model.checkpoint import load_resume_state
    save_checkpoint(tmp_path / "last", _model().state_dict(), train_state=TrainState(step=7))
    _plant_tree(tmp_path / "last", _HOSTILE_TREES[kind])
    with pytest.raises(CheckpointCorrupted, match="train_state.json"):
        load_train_state(tmp_path / "last")
    with pytest.warns(RuntimeWarning, match="is damaged .* starting the stage from its beginning"):
        assert load_resume_state(tmp_path / "last") is None
    [aside] = list(tmp_path.iterdir())
    assert aside.name.startswith("last.damaged-")
