"""Checkpoints: safetensors weights plus a JSON manifest, written atomically (DESIGN.md §6).

A checkpoint is one directory:

    <dir>/model.safetensors     the weights (a flat name → tensor map, CPU, no pickle)
    <dir>/train_state.safetensors + train_state.json
                                optional: what a training loop needs to resume exactly
                                (step, optimizer state, RNG states, anything else it chooses)
    <dir>/manifest.json         config, code version, library versions, data versions, hardware,
                                and the sha256 of every file above

The directory is first written under a hidden temporary name beside it, every file is fsynced,
and one `os.replace` puts it in place: a reader sees either no checkpoint or a complete one.

The content hash of a checkpoint is the sha256 of `model.safetensors`. It does not depend on when
or where the checkpoint was written (safetensors sorts its keys), so two runs that produce the same
weights produce the same hash; the orchestration layer uses it as the asset's data version.

`load_checkpoint` re-hashes every file listed in the manifest and raises `CheckpointCorrupted`
(a `ValueError`) naming the file, the expected and the actual hash; a manifest that does not list
the weights under the checkpoint's own hash is refused too. Nothing read from disk is trusted: a
manifest entry must name a file inside the checkpoint directory (no absolute path, no `..`, no
symlink leading out) with a 64-hex-digit hash, and a `train_state.json` must be a tree of the shape
`save_checkpoint` writes (at most `MAX_TREE_DEPTH` deep, integers within int64, tensors that exist).
`load_resume_state` sets a damaged or hostile resume checkpoint aside (with a warning naming why)
instead of failing, and `link_checkpoint` publishes an existing checkpoint under a new name through
the same staging-and-rename.

`load_model` is the one way to get a model back: it builds the `K3Model` the manifest's config
describes, loads the verified weights, turns QAT back on when the checkpoint was trained with it
(`config.qat`, so a policy is evaluated and trained further through the quantizer it learned under)
and, for RL and distillation, freezes the router bias. A quantized export (MXFP4 experts, packed)
is refused here: `k3model.quantize.load_quantized` reads it.

Only torch, numpy and safetensors are used here (the library layer never imports dagster, ray or
mlflow).
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import hashlib
import importlib.metadata
import json
import logging
import os
import platform
import random
import re
import shutil
import subprocess
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from safetensors.torch import load_file, save_file

WEIGHTS_FILE = "model.safetensors"
MANIFEST_FILE = "manifest.json"
TRAIN_STATE_TENSORS = "train_state.safetensors"
TRAIN_STATE_TREE = "train_state.json"
FORMAT = "k3-checkpoint/1"
_log = logging.getLogger(__name__)

# Manifest keys this module writes; callers cannot override them through `manifest_extra`.
_RESERVED = ("format", "created_utc", "sha256", "files", "code_version", "library_versions",
             "hardware", "num_parameters", "has_train_state")
_LIBRARIES = ("torch", "numpy", "safetensors", "triton", "tokenizers", "pyarrow")
_SOURCE_PACKAGES = ("k3model", "kernels", "datagen", "envs")
_REPO_ROOT = Path(__file__).resolve().parent.parent
# A train state's JSON tree is a few levels deep (state → param id → moment → tensor tag); anything
# far deeper is hostile, and Python's recursive decoder would overflow the stack on it.
MAX_TREE_DEPTH = 64
_INT64 = 1 << 63
_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


class CheckpointCorrupted(ValueError):
    """A checkpoint directory whose files are missing or do not match the manifest's hashes."""


@dataclass(frozen=True)
class CheckpointInfo:
    path: Path
    sha256: str  # of model.safetensors: the checkpoint's content hash
    manifest: dict[str, Any]
    size_bytes: int  # all files of the checkpoint together


@dataclass
class TrainState:
    """Everything a training loop needs to continue as if it had never stopped.

    `optimizer` is `optimizer.state_dict()`; `rng` comes from `capture_rng_state()`; `extra` holds
    whatever else the loop keeps (LR-scheduler state, data position, tokens seen). Tensors may sit
    anywhere inside these nested dicts and lists.
    """
    step: int
    optimizer: dict[str, Any] = field(default_factory=dict)
    rng: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


# ----------------------------------------------------------------------------------------------
# Provenance

def sha256_file(path: Path, chunk_bytes: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(chunk_bytes):
            h.update(chunk)
    return h.hexdigest()


def source_tree_sha256(root: Path = _REPO_ROOT, packages: tuple[str, ...] = _SOURCE_PACKAGES) -> str:
    """sha256 over the relative paths and bytes of every .py file in the library packages."""
    h = hashlib.sha256()
    for pkg in packages:
        for path in sorted((root / pkg).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(b"\0")
            h.update(path.read_bytes())
            h.update(b"\0")
    return h.hexdigest()


def code_version(root: Path = _REPO_ROOT) -> dict[str, Any]:
    """The git commit and dirty flag when `root` is a git checkout, and always the source hash.

    The source hash is what identifies the code when the tree is dirty or git is absent (the GPU
    machine may run from a copied tree).
    """
    version: dict[str, Any] = {"source_sha256": source_tree_sha256(root)}
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout
        version.update(git_commit=commit, git_dirty=bool(status.strip()))
    except (OSError, subprocess.SubprocessError):
        version.update(git_commit=None, git_dirty=None)
    return version


def library_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    versions["cuda"] = torch.version.cuda
    return versions


def hardware() -> dict[str, Any]:
    info: dict[str, Any] = {"machine": platform.machine(), "system": platform.system(),
                            "processor": platform.processor() or None, "cpu_count": os.cpu_count()}
    if torch.cuda.is_available():
        info["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    else:
        info["gpus"] = []
    return info


# ----------------------------------------------------------------------------------------------
# RNG state

def capture_rng_state() -> dict[str, Any]:
    """The Python, numpy, torch CPU and (when present) CUDA generator states."""
    py_version, py_state, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "python": [py_version, list(py_state), py_gauss],
        "numpy": [np_name, torch.from_numpy(np.asarray(np_keys, dtype=np.uint32).astype(np.int64)),
                  int(np_pos), int(np_has_gauss), float(np_gauss)],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = list(torch.cuda.get_rng_state_all())
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    py_version, py_state, py_gauss = state["python"]
    random.setstate((py_version, tuple(py_state), py_gauss))
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = state["numpy"]
    np.random.set_state((np_name, np_keys.numpy().astype(np.uint32), np_pos, np_has_gauss, np_gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state:
        if not torch.cuda.is_available():
            raise ValueError("the checkpoint holds CUDA RNG states but this machine has no CUDA "
                             "device: drop state['cuda'] to resume on the CPU")
        torch.cuda.set_rng_state_all(state["cuda"])


# ----------------------------------------------------------------------------------------------
# Nested state ↔ (flat tensors, JSON tree). Optimizer state dicts have int keys and tuples; JSON
# has neither, so both are tagged. Tensors go to safetensors: nothing is unpickled on load.

def _encode(obj: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().to("cpu").contiguous().clone()
        return {"__tensor__": key}
    if isinstance(obj, dict):
        return {"__dict__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    if isinstance(obj, tuple):
        return {"__tuple__": [_encode(v, tensors) for v in obj]}
    if isinstance(obj, list):
        return [_encode(v, tensors) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise TypeError(f"cannot store a {type(obj).__name__} in a train state: use tensors, numbers, "
                    "strings, lists, tuples and dicts")


def _decode(obj: Any, tensors: dict[str, torch.Tensor], depth: int = 0) -> Any:
    """The nested state `_encode` wrote, each node checked: a ValueError names the first node that
    `_encode` could not have written (too deep, an unknown tag, a missing tensor, an int beyond int64)."""
    if depth > MAX_TREE_DEPTH:
        raise ValueError(f"the train-state tree nests deeper than {MAX_TREE_DEPTH} levels")
    if isinstance(obj, list):
        return [_decode(v, tensors, depth + 1) for v in obj]
    if isinstance(obj, dict):
        if len(obj) != 1:
            raise ValueError(f"a train-state node has keys {sorted(obj)[:5]}, not one of __tensor__, "
                             "__tuple__, __dict__")
        (tag, value), = obj.items()
        if tag == "__tensor__":
            if not isinstance(value, str) or value not in tensors:
                raise ValueError(f"the train-state tree names tensor {str(value)[:40]!r}, which "
                                 f"{TRAIN_STATE_TENSORS} does not hold")
            return tensors[value]
        if tag == "__tuple__" and isinstance(value, list):
            return tuple(_decode(v, tensors, depth + 1) for v in value)
        if tag == "__dict__" and isinstance(value, list):
            if not all(isinstance(kv, list) and len(kv) == 2 for kv in value):
                raise ValueError("a train-state __dict__ node holds something other than [key, value] pairs")
            out = {}
            for k, v in value:
                k = _decode(k, tensors, depth + 1)
                if not isinstance(k, (str, int, float, bool, tuple)) and k is not None:
                    raise ValueError(f"a train-state dict key is a {type(k).__name__}")
                out[k] = _decode(v, tensors, depth + 1)
            return out
        raise ValueError(f"a train-state node is tagged {str(tag)[:40]!r} with a {type(value).__name__}")
    if isinstance(obj, int) and not isinstance(obj, bool) and not -_INT64 <= obj < _INT64:
        raise ValueError(f"a train-state integer has {len(str(abs(obj)))} digits, beyond int64")
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    raise ValueError(f"a train-state node is a {type(obj).__name__}")


def _check_train_state_fields(tree: Any) -> None:
    """The top of a decoded train state: exactly TrainState's fields, each of its type."""
    if not isinstance(tree, dict):
        raise ValueError(f"{TRAIN_STATE_TREE} holds a {type(tree).__name__}, not a TrainState")
    want = {f.name for f in dataclasses.fields(TrainState)}
    if set(tree) != want:
        raise ValueError(f"{TRAIN_STATE_TREE} has fields {sorted(map(str, tree))[:8]}, not {sorted(want)}")
    step = tree["step"]
    if not isinstance(step, int) or isinstance(step, bool) or not 0 <= step < _INT64:
        raise ValueError(f"{TRAIN_STATE_TREE} gives step {str(step)[:40]!r}: not an integer in [0, 2**63)")
    for name in ("optimizer", "rng", "extra"):
        if not isinstance(tree[name], dict):
            raise ValueError(f"{TRAIN_STATE_TREE} gives {name} as a {type(tree[name]).__name__}, not a dict")


def _json_default(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if isinstance(obj, Path):
        return str(obj)
    if isinstance(obj, (np.integer, np.floating)):
        return obj.item()
    if isinstance(obj, torch.dtype):
        return str(obj)
    raise TypeError(f"manifest value of type {type(obj).__name__} is not JSON-serializable")


# ----------------------------------------------------------------------------------------------
# Save / load / verify

def _weights_for_safetensors(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    # safetensors refuses tensors that share storage (tied embeddings): give later ones a copy.
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in state_dict.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"state_dict[{name!r}] is a {type(t).__name__}, not a tensor; put "
                            "non-tensor state in manifest_extra or the train state")
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return out


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(directory: str | os.PathLike, state_dict: dict[str, torch.Tensor],
                    manifest_extra: dict[str, Any] | None = None, *,
                    train_state: TrainState | None = None, overwrite: bool = False) -> CheckpointInfo:
    """Write `state_dict` (and optionally `train_state`) to `directory`, atomically.

    `manifest_extra` goes into the manifest as top-level keys; by convention `config` (a dict or a
    dataclass), `data_versions` (name → content hash of each input) and `metrics`. An existing
    `directory` raises FileExistsError unless `overwrite` is set.
    """
    directory = Path(directory)
    extra = dict(manifest_extra or {})
    clash = sorted(set(extra) & set(_RESERVED))
    if clash:
        raise ValueError(f"manifest_extra may not set {clash}: save_checkpoint writes those itself")
    if directory.exists() and not overwrite:
        raise FileExistsError(f"checkpoint directory {directory} already exists: pass overwrite=True "
                              "or choose a new directory")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        weights = _weights_for_safetensors(state_dict)
        save_file(weights, str(tmp / WEIGHTS_FILE))
        files = [WEIGHTS_FILE]
        if train_state is not None:
            tensors: dict[str, torch.Tensor] = {}
            tree = _encode(dataclasses.asdict(train_state), tensors)
            save_file(tensors, str(tmp / TRAIN_STATE_TENSORS))
            (tmp / TRAIN_STATE_TREE).write_text(json.dumps(tree))
            files += [TRAIN_STATE_TENSORS, TRAIN_STATE_TREE]
        hashes = {name: sha256_file(tmp / name) for name in files}
        manifest = {
            "format": FORMAT,
            "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "sha256": hashes[WEIGHTS_FILE],
            "files": hashes,
            "num_parameters": int(sum(t.numel() for t in weights.values())),
            "has_train_state": train_state is not None,
            "code_version": code_version(),
            "library_versions": library_versions(),
            "hardware": hardware(),
            **extra,
        }
        (tmp / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2, default=_json_default) + "\n")
        for name in [*files, MANIFEST_FILE]:
            _fsync(tmp / name)
        _fsync(tmp)
        if directory.exists():
            # os.replace cannot swap a non-empty directory: move the old one aside first.
            old = directory.parent / f".{directory.name}.old-{uuid.uuid4().hex[:12]}"
            os.replace(directory, old)
            os.replace(tmp, directory)
            shutil.rmtree(old)
        else:
            os.replace(tmp, directory)
        _fsync(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return CheckpointInfo(path=directory, sha256=manifest["sha256"], manifest=manifest,
                          size_bytes=sum((directory / n).stat().st_size for n in [*files, MANIFEST_FILE]))


def read_manifest(directory: str | os.PathLike) -> dict[str, Any]:
    directory = Path(directory)
    path = directory / MANIFEST_FILE
    if not path.is_file():
        if not directory.is_dir():
            raise FileNotFoundError(f"no checkpoint at {directory}: the directory does not exist")
        raise CheckpointCorrupted(f"checkpoint {directory} has no {MANIFEST_FILE}: it is not a "
                                  "checkpoint or its write was interrupted; delete it and write it again")
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise CheckpointCorrupted(f"checkpoint manifest {path} is not valid JSON ({e}); delete the "
                                  "checkpoint and write it again") from e
    except RecursionError as e:
        raise CheckpointCorrupted(f"checkpoint manifest {path} nests too deeply to parse; delete the "
                                  "checkpoint and write it again") from e
    if not isinstance(manifest, dict):
        raise CheckpointCorrupted(f"{path} holds a JSON {type(manifest).__name__}, not a {FORMAT} manifest")
    if manifest.get("format") != FORMAT or "files" not in manifest:
        raise CheckpointCorrupted(f"{path} is not a {FORMAT} manifest (format={manifest.get('format')!r})")
    return manifest


def _check_entry(directory: Path, name: str, digest: Any) -> None:
    """A manifest entry must name a file inside `directory` and give a sha256 hex digest: a manifest
    listing `../x` or `/etc/hostname` would otherwise have files outside the checkpoint hashed and
    "verified" as its own."""
    where = f"checkpoint manifest {directory / MANIFEST_FILE}"
    parts = Path(name).parts
    if (not name or os.path.isabs(name) or ".." in parts or "\0" in name or "\\" in name
            or any(p.startswith(".") for p in parts)):
        raise CheckpointCorrupted(f"{where} lists {name[:200]!r}, which is not a plain relative path inside the "
                                  "checkpoint directory; delete the checkpoint and write it again")
    root = directory.resolve()
    if not (directory / name).resolve().is_relative_to(root):
        raise CheckpointCorrupted(f"{where} lists {name[:200]!r}, which leads outside the checkpoint directory "
                                  f"(to {(directory / name).resolve()}); delete the checkpoint and write it again")
    if not isinstance(digest, str) or not _SHA256_HEX.fullmatch(digest):
        raise CheckpointCorrupted(f"{where} gives {name!r} the hash {str(digest)[:80]!r}, not a sha256 hex "
                                  "digest; delete the checkpoint and write it again")


def _check_listing(directory: Path, manifest: dict[str, Any]) -> None:
    """The manifest must list the weights (under the hash it gives as the checkpoint's) and, when it
    says there is a train state, both train-state files: a manifest listing nothing verified before."""
    files = manifest["files"]
    if isinstance(files, dict):
        for name, digest in files.items():
            _check_entry(directory, name, digest)
    if not isinstance(files, dict) or WEIGHTS_FILE not in files:
        raise CheckpointCorrupted(f"checkpoint manifest {directory / MANIFEST_FILE} does not list "
                                  f"{WEIGHTS_FILE}, so the weights cannot be verified; delete the "
                                  "checkpoint and write it again")
    if files[WEIGHTS_FILE] != manifest.get("sha256"):
        raise CheckpointCorrupted(f"checkpoint manifest {directory / MANIFEST_FILE} is inconsistent: it "
                                  f"lists {WEIGHTS_FILE} with sha256 {files[WEIGHTS_FILE]} but gives "
                                  f"{manifest.get('sha256')} as the checkpoint's; delete the checkpoint and "
                                  "write it again")
    if manifest.get("has_train_state"):
        unlisted = [n for n in (TRAIN_STATE_TENSORS, TRAIN_STATE_TREE) if n not in files]
        if unlisted:
            raise CheckpointCorrupted(f"checkpoint manifest {directory / MANIFEST_FILE} records a train "
                                      f"state but does not list {', '.join(unlisted)}; delete the "
                                      "checkpoint and write it again")


def verify_checkpoint(directory: str | os.PathLike) -> CheckpointInfo:
    """Re-hash every file the manifest lists; raise CheckpointCorrupted on the first mismatch, or
    when the manifest does not list the weights under the checkpoint's own hash."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    _check_listing(directory, manifest)
    size = (directory / MANIFEST_FILE).stat().st_size
    for name, expected in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            raise CheckpointCorrupted(f"checkpoint {directory} is missing {name}, which its manifest "
                                      "lists; delete the checkpoint and write it again")
        actual = sha256_file(path)
        if actual != expected:
            raise CheckpointCorrupted(
                f"checkpoint file {path} is corrupted: its sha256 is {actual} but the manifest "
                f"records {expected}; delete the checkpoint and write it again")
        size += path.stat().st_size
    return CheckpointInfo(path=directory, sha256=manifest["sha256"], manifest=manifest, size_bytes=size)


def load_checkpoint(directory: str | os.PathLike, verify: bool = True,
                    device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(state_dict, manifest) from `directory`; with `verify`, hashes are checked first."""
    directory = Path(directory)
    manifest = verify_checkpoint(directory).manifest if verify else read_manifest(directory)
    return load_file(str(directory / WEIGHTS_FILE), device=str(device)), manifest


def load_model(directory: str | os.PathLike, device: str | torch.device = "cpu", *, qat: str | bool = "auto",
               frozen_router: bool = False):
    """(K3Model, manifest) of a checkpoint, hashes verified, built from the config its manifest
    records and moved to `device`. `qat="auto"`: QAT on when the manifest says the model trained
    with it (`config.qat`); `qat=False`: the float model whatever it trained with (the QAT/PTQ
    comparison, the export, the draft's target). `frozen_router`: the router bias stops updating
    (RL and on-policy distillation, DESIGN.md §4)."""
    # The model, its kernels and QAT (3-4 s of imports, triton among them) load only here: the
    # Dagster driver reads manifests and hashes from this module without building a model.
    from k3model.config import ModelConfig, VisionConfig
    from k3model.model import K3Model
    from k3model.moe import freeze_router_bias
    from k3model.train.qat import prepare_qat

    if qat not in ("auto", False):
        raise ValueError(f"qat must be 'auto' (as the checkpoint trained) or False (the float model), got {qat!r}")
    weights, manifest = load_checkpoint(directory)
    if "quantization" in manifest:
        raise ValueError(f"{directory} is a quantized export ({manifest['quantization'].get('format')}): its "
                         "routed experts are packed MXFP4, not float weights; load it with "
                         "k3model.quantize.load_quantized")
    recorded = dict(manifest["config"]["model"])
    if recorded.get("vision") is not None:
        recorded["vision"] = VisionConfig(**recorded["vision"])
    model = K3Model(ModelConfig(**recorded))
    model.load_state_dict(weights)
    model = model.to(device)
    if qat == "auto" and (manifest.get("config") or {}).get("qat"):
        prepare_qat(model)
    if frozen_router:
        freeze_router_bias(model)
    return model, manifest


def load_train_state(directory: str | os.PathLike, verify: bool = True,
                     device: str | torch.device = "cpu") -> TrainState | None:
    """The TrainState saved beside the weights, or None when the checkpoint has none."""
    directory = Path(directory)
    manifest = verify_checkpoint(directory).manifest if verify else read_manifest(directory)
    if not manifest.get("has_train_state"):
        return None
    tensors = load_file(str(directory / TRAIN_STATE_TENSORS), device=str(device))
    path = directory / TRAIN_STATE_TREE
    try:
        tree = _decode(json.loads(path.read_text()), tensors)
        _check_train_state_fields(tree)
    except RecursionError as e:
        raise CheckpointCorrupted(f"{path} nests too deeply to parse; delete the checkpoint") from e
    except ValueError as e:  # json's errors and _decode's
        raise CheckpointCorrupted(f"{path} is not a train state save_checkpoint wrote: {e}") from e
    return TrainState(**tree)


def load_resume_state(directory: str | os.PathLike, device: str | torch.device = "cpu",
                      check: Callable[[dict[str, torch.Tensor], TrainState], None] | None = None
                      ) -> tuple[dict[str, torch.Tensor], TrainState] | None:
    """(weights, train state) of a resumable checkpoint, verified; None when there is none.

    A damaged one (a file that does not match its hash, a missing or broken manifest, no train
    state, a train state of the wrong shape, or one that `check(weights, state)` rejects with a
    ValueError, TypeError or KeyError) is renamed to `<directory>.damaged-<UTC time>` with a warning, and None is returned: the
    loop then starts the stage from its beginning instead of failing every rerun until someone
    deletes the directory by hand. The damaged files stay on disk for inspection.
    """
    import warnings
    directory = Path(directory)
    if not directory.exists():
        return None
    try:
        state = load_train_state(directory, device=device)
        if state is None:
            raise CheckpointCorrupted(f"checkpoint {directory} has no train state to resume from")
        weights = load_file(str(directory / WEIGHTS_FILE), device=str(device))
        if check is not None:
            check(weights, state)
    except (CheckpointCorrupted, OSError, ValueError, TypeError, KeyError, RecursionError) as e:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
        aside = directory.with_name(f"{directory.name}.damaged-{stamp}-{uuid.uuid4().hex[:6]}")
        os.replace(directory, aside)
        message = (f"the resume checkpoint {directory} is damaged ({str(e)[:500]}); moved it to {aside} and "
                   "starting the stage from its beginning")
        _log.warning(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)
        return None
    return weights, state


def link_checkpoint(source: str | os.PathLike, directory: str | os.PathLike) -> CheckpointInfo:
    """A verified copy of checkpoint `source` at `directory`, made of hard links (the same bytes
    stored once; copies across filesystems), assembled in a staging directory and renamed into
    place like `save_checkpoint`: a reader never sees a half-built checkpoint."""
    source, directory = Path(source), Path(directory)
    verify_checkpoint(source)
    if directory.exists():
        raise FileExistsError(f"checkpoint directory {directory} already exists: choose a new directory")
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = directory.parent / f".{directory.name}.tmp-{uuid.uuid4().hex[:12]}"
    tmp.mkdir()
    try:
        for f in source.iterdir():
            try:
                os.link(f, tmp / f.name)
            except OSError:
                shutil.copy2(f, tmp / f.name)
        _fsync(tmp)
        os.replace(tmp, directory)
        _fsync(directory.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return verify_checkpoint(directory)


def content_hash(directory: str | os.PathLike) -> str:
    """The checkpoint's content hash (sha256 of its weights) as its manifest records it."""
    return read_manifest(directory)["sha256"]


__all__ = [
    "CheckpointCorrupted", "CheckpointInfo", "TrainState", "save_checkpoint", "load_checkpoint",
    "load_train_state", "load_resume_state", "link_checkpoint", "verify_checkpoint", "read_manifest",
    "content_hash", "capture_rng_state",
    "restore_rng_state", "code_version", "library_versions", "hardware", "sha256_file",
]

