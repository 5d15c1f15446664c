"""The lineage's last node: what `k3 serve --profile P` would load, loaded and served once (issue 44).

    quantized_student ─┐
    draft_model ───────┼─> served_model
    tokenizer ─────────┘

`served_model` (group `<profile>_deployment`) loads the newest quantized_student (the packed MXFP4
export) with the newest draft_model and tokenizer through `k3model.server.load_served` — the loader
`k3 serve` runs at start, so a lineage whose student cannot be served fails here, naming the path —
and records the endpoint: the model id clients name, the files and their hashes, the quantization,
the context, the reasoning efforts and their budgets, the command that serves it. Its card figures
come from `k3model.server.card`: the model behind a real server on 127.0.0.1 (a free port, torn
down after), one greedy request alone (decoded by the draft) and four at once (one batched decode),
tokens/s and latency. A few seconds at smoke and tiny; no Ray task, no checkpoint of its own (its
data version is the hash of what it serves).
"""

import hashlib
import json

import dagster as dg

from assets.display import markdown_table
from assets.lineage import group, key, profile_tags, require_upstreams, run_id, tag_run
from assets.posttrain import POSTTRAIN_CODE_VERSION

UPSTREAMS = ("quantized_student", "draft_model", "tokenizer")
CARD_PROMPT, CARD_NEW, CARD_BATCHES = 16, 16, (1, 4)


def materialize_served_model(context: dg.AssetExecutionContext, profile: str) -> dg.MaterializeResult:
    from k3model.server import EFFORT_SPECS, card, load_served

    tag_run(context, profile)
    ups = require_upstreams(context, list(UPSTREAMS), profile)
    model_up, draft_up, tok_up = (ups[n] for n in UPSTREAMS)
    try:
        served = load_served(model_up.path, tok_up.path, draft_up.path)
    except ValueError as e:
        raise dg.Failure(description=f"{profile}/served_model: `k3 serve --profile {profile}` could not start: {e}",
                         allow_retries=False) from e
    context.log.info(f"{profile}/served_model: {served.model_id} ({served.quantization}) with draft {draft_up.path}; "
                     f"card: {CARD_NEW} tokens at batch {CARD_BATCHES}")
    rows = card(served, list(CARD_BATCHES), CARD_PROMPT, CARD_NEW, log=context.log.info)
    from k3model.engine import context_length
    versions = {n: ups[n].data_version for n in UPSTREAMS}
    version = hashlib.sha256("|".join(f"{n}={versions[n]}" for n in UPSTREAMS).encode()).hexdigest()
    by_batch = {r["batch"]: r for r in rows}
    # The asset's own artifact: a JSON record of what `k3 serve` loads (its "path" is re-hashed by
    # the lineage against "sha256"; the served model itself is quantized_student's checkpoint).
    record = {"model": str(model_up.path), "draft": str(draft_up.path), "tokenizer": str(tok_up.path),
              "model_id": served.model_id, "quantization": served.quantization, "upstreams": versions,
              "command": f"k3 serve --profile {profile}"}
    path = context.resources.store.report_dir(profile, "served_model", run_id(context)) / "served_model.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1, sort_keys=True))
    metadata = {
        "path": dg.MetadataValue.path(str(path)),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "model": dg.MetadataValue.path(str(model_up.path)),
        "model_id": served.model_id,
        "command": f"k3 serve --profile {profile}",
        "endpoints": "GET /v1/models, POST /v1/completions, POST /v1/chat/completions (stream), GET /health",
        "quantization": served.quantization,
        "model_sha256": served.manifest.get("sha256", ""),
        "draft": dg.MetadataValue.path(str(draft_up.path)),
        "tokenizer": dg.MetadataValue.path(str(tok_up.path)),
        "context_length": context_length(served.model),
        "reasoning_efforts": dg.MetadataValue.json({e: {"turn_tokens": s.turn_tokens} for e, s in EFFORT_SPECS.items()}),
        "card/tokens_per_s_batch1_draft": by_batch[1]["tokens_per_s"],
        "card/latency_s_batch1_draft": by_batch[1]["latency_median_s"],
        "card/tokens_per_s_batch4": by_batch[4]["tokens_per_s"],
        "card/latency_median_s_batch4": by_batch[4]["latency_median_s"],
        "card/speculative_requests_batch1": by_batch[1]["speculative_requests"],
        "card/table": dg.MetadataValue.md(markdown_table(rows)),
        "card/note": f"{CARD_NEW} greedy tokens after {CARD_PROMPT}-token random prompts, through HTTP on this "
                     "machine while the run goes on (benchmarks/decode/serve.py gives the full card)",
    }
    return dg.MaterializeResult(metadata=metadata, data_version=dg.DataVersion(version), tags=profile_tags(profile))


def build(profile: str) -> list[dg.AssetsDefinition]:
    @dg.asset(name="served_model", key_prefix=[profile], group_name=group(profile, "deployment"),
              deps=[key(profile, n) for n in UPSTREAMS], kinds={"pytorch"}, tags=profile_tags(profile),
              code_version=POSTTRAIN_CODE_VERSION, required_resource_keys={"store"},
              description="What `k3 serve` loads for this profile (quantized_student's MXFP4 export, draft_model, "
                          "the tokenizer), loaded and served once: the endpoint, its files and a small inference card.")
    def served_model(context: dg.AssetExecutionContext) -> dg.MaterializeResult:
        return materialize_served_model(context, profile)
    return [served_model]
