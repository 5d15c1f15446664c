"""The MLflow pyfunc model of a k3 checkpoint (MLflow "models from code": this file is the model).

    import mlflow
    m = mlflow.pyfunc.load_model("models:/k3-smoke-base@champion")
    m.predict({"prompt_ids": [[1, 2, 3]]}, params={"max_new_tokens": 8})     # generate
    m.predict({"token_ids": [[1, 2, 3, 4]]}, params={"task": "score"})       # score
    m.unwrap_python_model().score([[1, 2, 3, 4]])                             # the same, as a method

`pipelines.resources.log_checkpoint_model` writes it for every registered checkpoint with the library
packages (k3model, kernels, datagen, envs) as `code_paths`, so a fresh process needs only torch,
numpy, safetensors, pyarrow, tokenizers and mlflow. The checkpoint travels as one of two artifacts:
  checkpoint  the checkpoint directory itself, copied into the artifact store (any MLflow server);
  pointer     a JSON file {"path": <relative to the home>, "home": <absolute>, "sha256": ...}: the
              checkpoint stays in the home's store, found under $K3_HOME (else the recorded home),
              and is loaded only if its weights' sha256 equals the recorded one.
A draft (draft_model) also carries its target ("target" / "target_pointer") and generates
speculatively (k3model.speculative); a quantized export loads through k3model.quantize.

Generation is `k3model.engine.generate` (greedy by default): the output is one row per prompt,
{"token_ids", "finish_reason", "logprobs"}. Scoring is the log-likelihood of each sequence's tokens
after its first, sum_t log p(x_t | x_<t), with the per-token terms and their count.

This file imports mlflow, so it lives in pipelines/; the library it loads stays free of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import mlflow.pyfunc
from mlflow.models import set_model

SAMPLING_PARAMS = {"max_new_tokens": 32, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "seed": 0,
                   "draft_len": 3, "task": "generate"}


def resolve_pointer(pointer_file: str | Path) -> Path:
    """The checkpoint a pointer names, its weights' sha256 checked against the pointer's."""
    from k3model.checkpoint import WEIGHTS_FILE, sha256_file
    pointer = json.loads(Path(pointer_file).read_text())
    home = Path(os.environ.get("K3_HOME") or pointer["home"])
    path = home / pointer["path"]
    if not (path / WEIGHTS_FILE).is_file():
        raise FileNotFoundError(f"the registered checkpoint {pointer['path']} is not under {home}: set K3_HOME "
                                "to the home that holds it, or register with copies (MlflowResource"
                                "(checkpoint_artifacts='copy'))")
    got = sha256_file(path / WEIGHTS_FILE)
    if got != pointer["sha256"]:
        raise ValueError(f"{path}: weights sha256 {got} but the registry recorded {pointer['sha256']}: the "
                         "checkpoint changed after registration; re-materialize the asset")
    return path


def _checkpoint(artifacts: dict[str, str], name: str) -> Path | None:
    if name in artifacts:
        return Path(artifacts[name])
    if f"{name}_pointer" in artifacts:
        return resolve_pointer(artifacts[f"{name}_pointer"])
    return None


def load_checkpoint_model(path: Path, device: str):
    """(model, manifest) of any float, QAT or MXFP4-exported k3 checkpoint, in eval mode."""
    from k3model.checkpoint import read_manifest
    manifest = read_manifest(path)
    if "quantization" in manifest:
        from k3model.quantize import load_quantized
        model, manifest = load_quantized(path, device)
    else:
        # The one loader; a policy that trained through the quantizer is evaluated through it too.
        from k3model.checkpoint import load_model
        model, manifest = load_model(path, device)
    return model.eval(), manifest


class K3Checkpoint(mlflow.pyfunc.PythonModel):
    """A k3 checkpoint behind MLflow's pyfunc interface: generate, or score (`params["task"]`)."""

    def load_context(self, context) -> None:
        import torch
        self.device = os.environ.get("K3_DEVICE") or ("cuda" if torch.cuda.is_available() else "cpu")
        path = _checkpoint(context.artifacts, "checkpoint")
        if path is None:
            raise ValueError(f"the model carries neither a checkpoint nor a pointer (artifacts: "
                             f"{sorted(context.artifacts)}): register it with pipelines.registry")
        target = _checkpoint(context.artifacts, "target")
        self.draft = None
        if target is not None:
            from k3model.draft import load_draft
            self.model, _ = load_checkpoint_model(target, self.device)
            self.draft, self.manifest = load_draft(path, self.model)
            self.draft.eval()
        else:
            self.model, self.manifest = load_checkpoint_model(path, self.device)

    def predict(self, context, model_input, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        p = {**SAMPLING_PARAMS, **(params or {})}
        if p["task"] == "score":
            return [{"logprob": sum(t), "n_tokens": len(t), "token_logprobs": t}
                    for t in self.score(_rows(model_input, "token_ids"))]
        if p["task"] != "generate":
            raise ValueError(f"params task = {p['task']!r}: use 'generate' or 'score'")
        return self.generate(_rows(model_input, "prompt_ids"), p)

    def generate(self, prompts: list[list[int]], p: dict[str, Any]) -> list[dict[str, Any]]:
        import torch

        from k3model.engine import SamplingConfig, generate
        cfg = SamplingConfig(max_new_tokens=int(p["max_new_tokens"]), temperature=float(p["temperature"]),
                             top_k=int(p["top_k"]) or None, top_p=float(p["top_p"]))
        if self.draft is not None:
            from k3model.speculative import speculative_generate
            out = []
            for prompt in prompts:
                ids, stats = speculative_generate(self.model, self.draft, prompt, cfg, int(p["draft_len"]))
                out.append({"token_ids": list(ids), "finish_reason": None, "logprobs": None})
            return out
        gen = torch.Generator(device=self.device).manual_seed(int(p["seed"]))
        return [{"token_ids": c.token_ids, "finish_reason": c.finish_reason, "logprobs": c.logprobs}
                for c in generate(self.model, prompts, cfg, generator=gen)]

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """log p(x_t | x_<t) of every token after the first, per sequence (one forward each)."""
        import torch
        out = []
        with torch.no_grad():
            for seq in sequences:
                if len(seq) < 2:
                    raise ValueError(f"a scored sequence needs at least 2 tokens, got {len(seq)}")
                ids_1T = torch.tensor([list(seq)], device=self.device)
                logp_TV = self.model(ids_1T).logits_BTV[0, :-1].float().log_softmax(-1)
                out.append(logp_TV.gather(-1, ids_1T[0, 1:, None])[:, 0].tolist())
        return out


def _rows(model_input, column: str) -> list[list[int]]:
    """Token-id lists from a DataFrame / dict column `column`, or a plain list of lists."""
    if hasattr(model_input, "columns"):  # pandas
        if column not in model_input.columns:
            raise ValueError(f"the input needs a {column!r} column of token-id lists, got {list(model_input.columns)}")
        values = model_input[column].tolist()
    elif isinstance(model_input, dict):
        if column not in model_input:
            raise ValueError(f"the input needs a {column!r} key of token-id lists, got {sorted(model_input)}")
        values = model_input[column]
    else:
        values = model_input
    return [[int(t) for t in row] for row in values]


set_model(K3Checkpoint())
