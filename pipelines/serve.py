"""What `k3 serve` loads (pipelines/cli.py runs the server of k3model/server.py on it): the profile's
newest quantized_student (else mopd_student) and draft_model from the Dagster instance under
K3_HOME, or a checkpoint directory, or a registered MLflow model version (pipelines.registry).

    k3 serve --profile tiny            the profile's newest quantized_student (+ draft_model)
    k3 serve --model PATH|NAME@ALIAS [--tokenizer PATH] [--draft-model PATH] [--draft off]
"""

from __future__ import annotations

from pathlib import Path


def resolve_paths(profile: str, model: str | None = None, tokenizer: str | None = None,
                  draft: str | None = None) -> dict[str, Path | None]:
    """What `k3 serve` loads. No `model`: the profile's newest quantized_student (else mopd_student)
    and its newest draft_model, from the Dagster instance under K3_HOME. `model` is a checkpoint
    directory or a registered MLflow model version (`name@alias`, `name/version`:
    pipelines.registry). The tokenizer, unless given, is the profile's newest."""
    def latest(name: str):
        # The Dagster instance is opened only when something is looked up there.
        from pipelines.instance import apply_k3_environ
        apply_k3_environ()
        import dagster as dg

        from assets.lineage import latest as newest
        return newest(dg.DagsterInstance.get(), profile, name)

    found: dict[str, Path | None] = {"model": None, "draft": None, "tokenizer": None}
    if model is None:
        student = latest("quantized_student") or latest("mopd_student")
        if student is None:
            raise ValueError(f"profile {profile!r} has no quantized_student (nor mopd_student) yet: `k3 run "
                             f"--profile {profile} --select '*quantized_student'` makes one, or pass --model PATH")
        found["model"] = student.path
        draft_up = latest("draft_model")
        found["draft"] = draft_up.path if draft_up is not None else None
    elif Path(model).exists():
        found["model"] = Path(model)
    elif "@" in model or "/" in model:
        from pipelines.registry import checkpoint_path
        found["model"] = checkpoint_path(model)
    else:
        raise ValueError(f"--model {model!r} is neither a checkpoint directory nor a registered model "
                         "('name@alias' or 'name/version', e.g. k3-tiny-base@champion)")
    if draft is not None:
        found["draft"] = Path(draft)
    if tokenizer is not None:
        found["tokenizer"] = Path(tokenizer)
    else:
        tok = latest("tokenizer")
        if tok is None:
            raise ValueError(f"profile {profile!r} has no tokenizer materialized; pass --tokenizer PATH")
        found["tokenizer"] = tok.path
    return found
