"""The served student behind an OpenAI-compatible HTTP API (issue 44; DESIGN.md §1's "one model that
exposes different reasoning-effort settings"): what `k3 serve` runs (pipelines/cli.py; which
checkpoint it loads: pipelines/serve.py) and what the served_model asset measures (assets/serve.py).

    load_served(model_path, tokenizer_path, draft_path) → Served      the checkpoint, tokenizer and draft,
                                                                     input projections fused (k3model/fused.py)
    start(served, host, port) → (K3Server, thread)                   the server on a background thread
    card(served, batches, prompt, new) → rows                        tokens/s and latency through HTTP

Endpoints (JSON in and out, errors shaped as OpenAI's `{"error": {"message", "type", "param", "code"}}`;
request fields the engine has no counterpart for — penalties, logit_bias, best_of, echo, tools —
are refused with a 400 unless they hold their no-op value, never silently ignored):

    GET  /health                 {"status": "ok", "model", "running", "pending"}
    GET  /v1/models              the one served model
    POST /v1/completions         prompt (text, or a list of token ids, used as they are)
    POST /v1/chat/completions    messages, rendered with the SFT template; stream → server-sent events

Chat formatting is the SFT conversation format, built from `datagen.sft.turn_tokens` through
`k3model.train.rollout.sft_format` (the renderer SFT, RL and evaluation share): the first message (a
system message's text joined to the first user message) behind <|bos|><|system|><|effort_E|>, ended by
<|end|><|effort_E|><|assistant|>; later user messages as <|tool_result|>…<|tool_result_end|><|effort_E|>
<|assistant|>; earlier assistant messages as their text and <|end|>. `reasoning_effort` ∈ {low, high,
max} (default high) picks the control token E and the turn budget the model was trained with
(`EFFORT_SPECS[E].turn_tokens`: 256 / 384 / 512), which is `max_tokens` unless the request gives one.
The reply's `content` is the turn after its scratchpad (`datagen.sft.action_ids`), the scratchpad
itself `reasoning_content`.

Continuous batching: one scheduler thread owns the model. Between decode steps it admits pending
rows (prefilled with `engine.prefill`, their caches stacked onto the running batch with
`ModelCache.cat`), samples one token for every running row, and drops finished rows
(`ModelCache.select`), so a request joins and leaves the batch without waiting for the others. The
batch is padded to `engine.MIN_ROWS` rows as `engine.decode` does, which keeps each row bitwise what
it gets alone (greedy, CPU, one intra-op thread; k3model/engine.py). Greedy rows take the argmax;
a sampled row draws from its own generator (seeded by `seed` + choice index), so a seeded request gives
the same output however it is batched. `usage.prompt_tokens` is the length of the ids prefilled,
`completion_tokens` the number of ids sampled (a stop id and the tokens completing a stop string
included). `logprobs` are log_softmax(logits) of the sampled ids (the untempered model, as OpenAI's
are), `top_logprobs` the largest of them.

Speculative decoding (`--draft auto` and a draft present): a request of one choice with neither
stop strings nor logprobs that arrives while nothing else runs is decoded by
`k3model.speculative.speculative_generate` (batch 1, lossless: greedy output is the target's greedy
output up to near-ties of the verify's GEMM rounding; sampled output follows the target's
distribution); its tokens are streamed when it ends. Everything else goes through the batched loop.

Standard library HTTP only (ThreadingHTTPServer, one thread per connection, chunked transfer for
streams): no Dagster, Ray or MLflow, so the served_model asset and benchmarks/decode/serve.py run the
server `k3 serve` runs. Finding the profile's newest checkpoint in the Dagster instance or the MLflow
registry is the command's (pipelines/serve.py).
"""

from __future__ import annotations

import json
import os
import queue
import statistics
import threading
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Callable

import torch

from k3model.cache import ModelCache
from k3model.engine import MIN_ROWS, SamplingConfig, context_length, prefill, sample
from k3model.checkpoint import load_model as load_float_checkpoint
# The efforts and their budgets as RL trained them.
from k3model.train.effort import EFFORT_SPECS, EFFORTS


DEFAULT_EFFORT = "high"
MAX_TOP_LOGPROBS = 20
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for /v1/completions
# OpenAI request fields the engine has no counterpart for, with the value that asks for nothing.
UNSUPPORTED = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "logit_bias": {},
               "best_of": 1, "echo": False, "suffix": None, "tools": [], "response_format": {"type": "text"}}


# ----------------------------------------------------------------------------------------------
# Loading what is served

@dataclass
class Served:
    """A loaded model with what the server needs around it."""
    model: Any
    manifest: dict
    model_id: str
    path: Path
    quantization: str  # "mxfp4" or the float dtype
    tokenizer: Any = None
    draft: Any = None
    draft_path: Path | None = None
    fused: bool = False  # input projections fused (k3model/fused.py)


def load_served(model_path: str | os.PathLike, tokenizer_path: str | os.PathLike | None = None,
                draft_path: str | os.PathLike | None = None, model_id: str | None = None,
                device: str = "cpu", fuse: bool = True) -> Served:
    """The checkpoint at `model_path` (an MXFP4 export of k3model.quantize or a float checkpoint),
    its tokenizer and optionally a draft (k3model.train.draft). Fails here, naming the path, when
    something cannot be loaded, so a server never starts half-working. With `fuse` (default) the
    model's and the draft's input projections run fused (k3model/fused.py: the weights are frozen
    here, one GEMM per layer module where they share an input), after quantization and the draft's
    load, which would otherwise change what the fused copies hold."""
    from k3model.checkpoint import read_manifest
    from k3model.quantize import is_quantized_manifest, load_quantized

    path = Path(model_path)
    try:
        manifest = read_manifest(path)
        if is_quantized_manifest(manifest):
            model, manifest = load_quantized(path, device)
            quantization = "mxfp4"
        else:
            model, manifest = load_float_checkpoint(path, device)
            quantization = str(next(model.parameters()).dtype).removeprefix("torch.")
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"cannot load the model at {path}: {e}") from e
    model.eval()
    tokenizer = None
    if tokenizer_path is not None:
        from datagen.tokenizer import load_tokenizer
        try:
            tokenizer = load_tokenizer(tokenizer_path)
        except Exception as e:  # noqa: BLE001 - tokenizers raises its own exception types
            raise ValueError(f"cannot load the tokenizer at {tokenizer_path}: {e}") from e
        if tokenizer.get_vocab_size() > model.cfg.vocab_size:
            raise ValueError(f"the tokenizer at {tokenizer_path} has {tokenizer.get_vocab_size()} ids but the model at "
                             f"{path} only {model.cfg.vocab_size}: they come from different lineages")
    draft = None
    if draft_path is not None:
        from k3model.draft import load_draft
        try:
            draft, _ = load_draft(draft_path, model)
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"cannot load the draft at {draft_path}: {e}") from e
        draft.eval()
    if fuse:
        from k3model.fused import fuse_projections

        for m in (model, draft):
            if m is not None:
                fuse_projections(m)
    name = model_id or f"k3-{model.cfg.name}-{manifest.get('sha256', 'model')[:12]}"
    return Served(model, manifest, name, path, quantization, tokenizer, draft,
                  None if draft_path is None else Path(draft_path), fuse)


# ----------------------------------------------------------------------------------------------
# The scheduler: continuous batching over the engine's prefill and decode step

@dataclass
class Row:
    """One choice of one request, as the scheduler runs it. Events go to `events` (one queue for all
    choices of a request), each led by the choice's `index`: ("token", id, model_logprob, top
    [(id, logprob)]) per sampled id, then ("done", finish_reason) or ("error", message). A row whose
    client has gone (`cancelled`) leaves the batch at the next step."""
    prompt: list[int]
    cfg: SamplingConfig
    generator: torch.Generator | None
    top_logprobs: int = 0
    stop_check: Callable[[list[int]], bool] | None = None  # True: a stop string has appeared
    speculative_ok: bool = False
    events: queue.Queue = field(default_factory=queue.Queue)
    index: int = 0
    token_ids: list[int] = field(default_factory=list)
    budget: int = 0
    cancelled: bool = False

    def emit(self, *event) -> None:
        self.events.put((self.index, *event))


class Scheduler:
    """Owns the model: a thread that batches every submitted row (see the module docstring)."""

    def __init__(self, model, draft=None, max_batch: int = 16, draft_len: int = 4):
        self.model, self.draft, self.max_batch, self.draft_len = model, draft, max_batch, draft_len
        self.limit = context_length(model)
        self.pending: queue.Queue[Row] = queue.Queue()
        self.running: list[Row] = []
        self.steps = 0
        self.batch_sizes: list[int] = []  # rows of each decode step (the benchmark reads it)
        self.speculative_requests = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="k3-serve-scheduler", daemon=True)
        self._thread.start()

    def submit(self, rows: list[Row]) -> None:
        if self._stop.is_set():
            raise RuntimeError("the scheduler has stopped")
        for row in rows:
            self.pending.put(row)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def alive(self) -> bool:
        return self._thread.is_alive()

    # --- the loop ------------------------------------------------------------------------------
    def _loop(self) -> None:
        cache, logits_BV = None, None
        while not self._stop.is_set():
            try:
                if not self.running:
                    try:
                        first = self.pending.get(timeout=0.05)
                    except queue.Empty:
                        continue
                    if self._speculative(first):
                        continue
                    admitted = [first]
                else:
                    admitted = []
                while len(self.running) + len(admitted) < self.max_batch:
                    try:
                        admitted.append(self.pending.get_nowait())
                    except queue.Empty:
                        break
                if admitted:
                    cache, logits_BV = self._admit(admitted, cache, logits_BV)
                if self.running:
                    cache, logits_BV = self._step(cache, logits_BV)
            except Exception as e:  # noqa: BLE001 - the server must outlive a failed step
                for row in self.running:
                    row.emit("error", f"{type(e).__name__}: {e}")
                self.running, cache, logits_BV = [], None, None
        for row in self.running:
            row.emit("error", "the server is shutting down")

    def _budget(self, row: Row) -> int:
        n = row.cfg.max_new_tokens
        return n if self.limit is None else min(n, self.limit - len(row.prompt))

    def _admit(self, rows: list[Row], cache, logits_BV):
        live = []
        for row in rows:
            row.budget = self._budget(row)
            if row.cancelled:
                continue
            if row.budget <= 0:
                row.emit("done", "length")
            else:
                live.append(row)
        if not live:
            return cache, logits_BV
        new_cache, new_logits = prefill(self.model, [r.prompt for r in live], max(r.budget for r in live))
        if cache is None:
            cache, logits_BV = new_cache, new_logits
        else:
            # The running cache may carry padding rows past len(self.running): keep the real ones.
            n = len(self.running)
            cache = ModelCache.cat([cache.select(list(range(n))), new_cache])
            logits_BV = torch.cat([logits_BV[:n], new_logits])
        self.running += live
        return cache, logits_BV

    def _step(self, cache, logits_BV):
        rows = self.running
        B = len(rows)
        greedy = [SamplingConfig(max_new_tokens=0)] * logits_BV.shape[0]
        tokens_B, _, model_logp_B = sample(logits_BV, greedy)
        tokens, model_logps = tokens_B.tolist(), model_logp_B.tolist()
        for b, row in enumerate(rows):
            if row.cfg.temperature > 0:
                t, _, m = sample(logits_BV[b: b + 1], [row.cfg], row.generator)
                tokens[b], model_logps[b] = int(t[0]), float(m[0])
        want_top = max((r.top_logprobs for r in rows), default=0)
        top = None
        if want_top:
            top_lp, top_id = logits_BV[:B].float().log_softmax(-1).topk(want_top, dim=-1)
            top = list(zip(top_id.tolist(), top_lp.tolist()))
        keep = []
        for b, row in enumerate(rows):
            tok = tokens[b]
            row.token_ids.append(tok)
            tops = [] if not row.top_logprobs else list(zip(top[b][0][: row.top_logprobs], top[b][1][: row.top_logprobs]))
            row.emit("token", tok, model_logps[b], tops)
            if row.cancelled:
                continue
            if tok in row.cfg.stop_ids or (row.stop_check is not None and row.stop_check(row.token_ids)):
                row.emit("done", "stop")
            elif len(row.token_ids) >= row.budget:
                row.emit("done", "length")
            else:
                keep.append(b)
        self.running = [rows[b] for b in keep]
        if not keep:
            return None, None
        # Pad to MIN_ROWS with copies of a kept row (their outputs are ignored), as engine.decode does.
        order = keep + [keep[0]] * max(0, MIN_ROWS - len(keep))
        if order != list(range(cache.batch)):
            cache = cache.select(order)
        tokens_B = torch.tensor([tokens[b] for b in order], device=logits_BV.device)
        self.batch_sizes.append(len(keep))
        self.steps += 1
        with torch.no_grad():
            logits_BV = self.model(tokens_B.unsqueeze(1), cache=cache).logits_BTV[:, 0]
        return cache, logits_BV

    def _speculative(self, row: Row) -> bool:
        """Decode `row` alone with the draft when it qualifies (see the module docstring)."""
        if self.draft is None or not row.speculative_ok or not self.pending.empty():
            return False
        from k3model.speculative import speculative_generate
        row.budget = self._budget(row)
        if row.budget <= 0:
            row.emit("done", "length")
            return True
        cfg = SamplingConfig(row.budget, row.cfg.temperature, row.cfg.top_k, row.cfg.top_p, row.cfg.stop_ids)
        ids, _ = speculative_generate(self.model, self.draft, row.prompt, cfg, self.draft_len, generator=row.generator)
        self.speculative_requests += 1
        for tok in ids:
            row.token_ids.append(tok)
            row.emit("token", tok, None, [])
        row.emit("done", "stop" if ids and ids[-1] in cfg.stop_ids else "length")
        return True


# ----------------------------------------------------------------------------------------------
# Requests: validation and rendering

class RequestError(ValueError):
    """A bad request: answered with an OpenAI-shaped error and this status."""

    def __init__(self, message: str, param: str | None = None, status: int = 400,
                 code: str | None = None, kind: str = "invalid_request_error"):
        super().__init__(message)
        self.message, self.param, self.status, self.code, self.kind = message, param, status, code, kind

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def _number(body: dict, name: str, default, lo=None, hi=None, integer=False):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise RequestError(f"{name} must be {'an integer' if integer else 'a number'}, got {value!r}", name)
    if lo is not None and value < lo or hi is not None and value > hi:
        raise RequestError(f"{name} must lie in [{lo}, {hi if hi is not None else '∞'}], got {value}", name)
    return value


@dataclass
class Request:
    kind: str  # "chat" or "completion"
    prompt: list[int]
    n: int
    cfg: SamplingConfig
    seed: int | None
    stop: list[str]
    stream: bool
    logprobs: bool
    top_logprobs: int
    effort: str | None
    include_usage: bool = False


class Api:
    """Turns request bodies into rows and rows' events into OpenAI responses."""

    def __init__(self, served: Served, scheduler: Scheduler, efforts: dict | None = None):
        self.served, self.scheduler = served, scheduler
        self.efforts = dict(EFFORT_SPECS if efforts is None else efforts)
        self.limit = context_length(served.model)
        tok = served.tokenizer
        if tok is not None:
            from datagen.sft import turn_tokens
            from datagen.tokenizer import BOS, END_OF_TURN, EOS, special_token_ids
            special = special_token_ids(tok)
            self.bos, self.stop_ids = special[BOS], (special[EOS], special[END_OF_TURN])
            self.turn = turn_tokens(tok, DEFAULT_EFFORT)

    # --- text ----------------------------------------------------------------------------------
    def _need_tokenizer(self, what: str) -> None:
        if self.served.tokenizer is None:
            raise RequestError(f"{what} needs text, but this server was started without a tokenizer "
                               "(k3 serve --tokenizer PATH); send prompts as token-id lists", status=400)

    def encode(self, text: str) -> list[int]:
        from datagen.tokenizer import encode
        return encode(self.served.tokenizer, text)

    def decode(self, ids: list[int]) -> str:
        if self.served.tokenizer is None:
            return ""
        from datagen.tokenizer import decode
        return decode(self.served.tokenizer, ids)

    def chat_ids(self, messages: list[dict], effort: str) -> list[int]:
        """The SFT template (k3model.train.rollout.sft_format) over an OpenAI message list."""
        from k3model.train.rollout import sft_format
        fmt = sft_format(self.served.tokenizer, effort)
        system = [m["content"] for m in messages if m["role"] in ("system", "developer")]
        turns = [m for m in messages if m["role"] not in ("system", "developer")]
        if not turns or turns[0]["role"] != "user":
            raise RequestError("messages must hold a user message before any assistant message", "messages")
        if turns[-1]["role"] != "user":
            raise RequestError("the last message must be the user's: the model answers it", "messages")
        ids = fmt.first_observation("\n\n".join([*system, turns[0]["content"]]))
        for m in turns[1:]:
            if m["role"] == "assistant":
                ids += self.encode(m["content"]) + [fmt.stop_id]
            elif m["role"] in ("user", "tool"):
                ids += fmt.observation(m["content"])
            else:
                raise RequestError(f"unknown message role {m['role']!r}: use system, user, assistant or tool",
                                   "messages")
        return ids

    def split_chat(self, ids: list[int]) -> tuple[str, str]:
        """(reasoning_content, content) of an assistant turn's ids: the ids inside <|think|> …
        <|think_end|> are the reasoning, the rest (the stop id left out) the content. For a turn as
        SFT writes it (one scratchpad, then the action) the content is `datagen.sft.action_ids`'s;
        each id lands in one of the two, so a longer turn only ever extends both (streaming)."""
        turn = self.turn
        thinking, reasoning_ids, content_ids = False, [], []
        for i in ids:
            if i == turn.think_id:
                thinking = True
            elif i == turn.think_end_id:
                thinking = False
            elif i != turn.stop_id:
                (reasoning_ids if thinking else content_ids).append(i)
        return self.decode(reasoning_ids), self.decode(content_ids)

    def visible(self, kind: str, ids: list[int]) -> tuple[str, str]:
        """(reasoning, text) as the client sees them: completions show every id but a final stop id."""
        if kind == "chat":
            return self.split_chat(ids)
        if ids and ids[-1] in self.stop_ids_of(kind):
            ids = ids[:-1]
        return "", self.decode(ids)

    def stop_ids_of(self, kind: str) -> tuple[int, ...]:
        if self.served.tokenizer is None:
            return ()
        return (self.turn.stop_id,) if kind == "chat" else self.stop_ids

    # --- parsing -------------------------------------------------------------------------------
    def parse(self, body: Any, kind: str) -> Request:
        if not isinstance(body, dict):
            raise RequestError("the request body must be a JSON object")
        model = body.get("model")
        if model is None:
            raise RequestError("model is required: GET /v1/models lists the one this server serves", "model")
        if model != self.served.model_id:
            raise RequestError(f"the model {model!r} does not exist here; this server serves "
                               f"{self.served.model_id!r}", "model", status=404, code="model_not_found")
        effort = body.get("reasoning_effort")
        if effort is not None and effort not in self.efforts:
            raise RequestError(f"unknown reasoning_effort {effort!r}: choose from {', '.join(self.efforts)}",
                               "reasoning_effort")
        if kind == "chat":
            effort = effort or DEFAULT_EFFORT
            messages = body.get("messages")
            if (not isinstance(messages, list) or not messages or
                    not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                            for m in messages)):
                raise RequestError("messages must be a non-empty list of {role, content} objects with text content",
                                   "messages")
            self._need_tokenizer("a chat request")
            prompt = self.chat_ids(messages, effort)
            default_max = self.efforts[effort].turn_tokens
        else:
            raw = body.get("prompt")
            if isinstance(raw, list) and len(raw) == 1 and isinstance(raw[0], (str, list)):
                raw = raw[0]  # a batch of one prompt
            if isinstance(raw, str):
                self._need_tokenizer("a text prompt")
                prompt = [self.bos] + self.encode(raw)
            elif isinstance(raw, list) and raw and all(isinstance(t, int) and not isinstance(t, bool) for t in raw):
                prompt = list(raw)
            else:
                raise RequestError("prompt must be a string or a non-empty list of token ids (one prompt a request)",
                                   "prompt")
            default_max = self.efforts[effort].turn_tokens if effort else COMPLETIONS_DEFAULT_MAX_TOKENS
        V = self.served.model.cfg.vocab_size
        if min(prompt) < 0 or max(prompt) >= V:
            raise RequestError(f"prompt holds token ids outside [0, {V})", "prompt")
        if self.limit is not None and len(prompt) > self.limit:
            raise RequestError(f"the prompt has {len(prompt)} tokens, more than the model's context of {self.limit}; "
                               "shorten it", "messages" if kind == "chat" else "prompt",
                               code="context_length_exceeded")
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
        max_tokens = _number({"max_tokens": max_tokens}, "max_tokens", default_max, lo=0, integer=True)
        temperature = _number(body, "temperature", 1.0, lo=0, hi=2)
        top_p = _number(body, "top_p", 1.0, lo=0, hi=1)
        if top_p == 0:
            raise RequestError("top_p must be > 0 (use temperature 0 for greedy)", "top_p")
        n = _number(body, "n", 1, lo=1, hi=16, integer=True)
        seed = _number(body, "seed", None, lo=-(1 << 63), hi=(1 << 63) - 1 - 16, integer=True)
        top_k = _number(body, "top_k", None, lo=-1, integer=True)
        if top_k == 0:
            raise RequestError("top_k must be ≥ 1, or -1 / absent for no top-k filter", "top_k")
        # Parameters the engine cannot honour are refused rather than ignored when they ask for
        # something other than their no-op default.
        for name, noop in UNSUPPORTED.items():
            if body.get(name) not in (None, noop):
                raise RequestError(f"{name} is not supported by this server; leave it out (or at {noop!r})", name)
        stop = body.get("stop")
        stop = [] if stop is None else [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or len(stop) > 4 or not all(isinstance(s, str) and s for s in stop):
            raise RequestError("stop must be a non-empty string or a list of at most 4 of them", "stop")
        if stop:
            self._need_tokenizer("stop strings")
        stream = body.get("stream", False)
        if not isinstance(stream, bool):
            raise RequestError("stream must be true or false", "stream")
        options = body.get("stream_options") or {}
        if kind == "chat":
            logprobs = body.get("logprobs", False)
            if not isinstance(logprobs, bool):
                raise RequestError("logprobs must be true or false in a chat request", "logprobs")
            top = _number(body, "top_logprobs", 0, lo=0, hi=MAX_TOP_LOGPROBS, integer=True)
            if top and not logprobs:
                raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
        else:
            top = _number(body, "logprobs", None, lo=0, hi=MAX_TOP_LOGPROBS, integer=True)
            logprobs, top = top is not None, top or 0
        cfg = SamplingConfig(max_new_tokens=max_tokens, temperature=float(temperature),
                             top_k=None if top_k in (None, -1) else top_k,
                             top_p=None if top_p == 1 else float(top_p), stop_ids=self.stop_ids_of(kind))
        return Request(kind, prompt, n, cfg, seed, stop, stream, logprobs, top, effort,
                       include_usage=bool(isinstance(options, dict) and options.get("include_usage")))

    def rows(self, req: Request) -> list[Row]:
        rows, events = [], queue.Queue()
        for i in range(req.n):
            generator = None
            if req.cfg.temperature > 0:
                seed = req.seed + i if req.seed is not None else int.from_bytes(os.urandom(8), "little") >> 1
                generator = torch.Generator().manual_seed(seed)
            check = None
            if req.stop:
                def check(ids, kind=req.kind, stops=tuple(req.stop)):
                    return any(s in self.visible(kind, ids)[1] for s in stops)
            rows.append(Row(list(req.prompt), req.cfg, generator, req.top_logprobs, check,
                            speculative_ok=req.n == 1 and not req.stop and not req.logprobs, events=events, index=i))
        return rows

    # --- running -------------------------------------------------------------------------------
    def run(self, req: Request, emit: Callable[[dict], None] | None = None) -> dict:
        """Run a request; with `emit`, stream chunks through it as tokens arrive. Returns the full
        (non-streamed) response body."""
        rows = self.rows(req)
        self.scheduler.submit(rows)
        rid = ("chatcmpl-" if req.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]
        created = int(time.time())
        obj = "chat.completion" if req.kind == "chat" else "text_completion"
        shown = [("", "") for _ in rows]  # what each choice has streamed so far (reasoning, text)
        finish = [None] * len(rows)
        logps: list[list[tuple]] = [[] for _ in rows]
        hold = max((len(s) for s in req.stop), default=1) - 1

        def chunk(choices: list[dict], usage: dict | None = None) -> dict:
            out = {"id": rid, "object": obj + (".chunk" if req.kind == "chat" else ""), "created": created,
                   "model": self.served.model_id, "choices": choices}
            if usage is not None:
                out["usage"] = usage
            return out

        if emit is not None and req.kind == "chat":
            emit(chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                         "finish_reason": None} for i in range(len(rows))]))
        open_rows = set(range(len(rows)))
        try:
            while open_rows:
                try:
                    i, *event = rows[0].events.get(timeout=1.0)
                except queue.Empty:
                    if not self.scheduler.alive():
                        raise RuntimeError("the scheduler thread has stopped") from None
                    continue
                row = rows[i]
                if event[0] == "error":
                    raise RuntimeError(event[1])
                if event[0] == "token":
                    logps[i].append(tuple(event[1:]))
                    if emit is not None:
                        delta = self._delta(req, row.token_ids[: len(logps[i])], shown[i], hold, final=False)
                        if delta is not None:
                            shown[i] = delta[0]
                            emit(chunk([self._stream_choice(req, i, delta[1], [logps[i][-1]] if req.logprobs else None,
                                                            None)]))
                    continue
                finish[i] = event[1]
                open_rows.discard(i)
                if emit is not None:
                    delta = self._delta(req, row.token_ids, shown[i], 0, final=True, finish=finish[i])
                    shown[i] = delta[0] if delta else shown[i]
                    emit(chunk([self._stream_choice(req, i, delta[1] if delta else ("", ""), None, finish[i])]))
        except BaseException:
            for row in rows:  # the client left or the request failed: free the batch rows
                row.cancelled = True
            raise
        usage = {"prompt_tokens": len(req.prompt), "completion_tokens": sum(len(r.token_ids) for r in rows),
                 "total_tokens": len(req.prompt) + sum(len(r.token_ids) for r in rows)}
        if emit is not None and req.include_usage:
            emit(chunk([], usage))
        choices = [self._choice(req, i, rows[i].token_ids, finish[i], logps[i]) for i in range(len(rows))]
        return {"id": rid, "object": obj, "created": created, "model": self.served.model_id,
                "choices": choices, "usage": usage,
                **({"reasoning_effort": req.effort} if req.effort else {})}

    def _final_text(self, req: Request, ids: list[int], finish: str) -> tuple[str, str]:
        reasoning, text = self.visible(req.kind, ids)
        if finish == "stop" and req.stop:
            cut = min((text.find(s) for s in req.stop if s in text), default=-1)
            if cut >= 0:
                text = text[:cut]
        return reasoning, text

    def _delta(self, req, ids, shown, hold, final, finish=None):
        """What to stream next: ((reasoning, text) shown after it, (reasoning delta, text delta)),
        or None. While running, text that may still turn out to be part of a stop string (the last
        `hold` characters) or an incomplete UTF-8 character (U+FFFD at the end) is held back."""
        if final:
            now = self._final_text(req, ids, finish)
        else:
            reasoning, text = self.visible(req.kind, ids)
            if req.stop and any(s in text for s in req.stop):
                return None
            text = text.rstrip("\ufffd")
            text = text[: max(len(text) - hold, 0)]
            now = (reasoning.rstrip("\ufffd"), text)
        out = []
        for old, new in zip(shown, now):
            out.append(new[len(old):] if new.startswith(old) else "")
        if not any(out) and not final:
            return None
        return (tuple(n if n.startswith(o) else o for o, n in zip(shown, now)), tuple(out))

    def _token_logprobs(self, entries) -> list[dict]:
        out = []
        for tok, lp, top in entries:
            text = self.decode([tok])
            out.append({"token": text, "logprob": lp, "bytes": list(text.encode()),
                        "top_logprobs": [{"token": self.decode([t]), "logprob": v, "bytes": list(self.decode([t]).encode())}
                                         for t, v in top]})
        return out

    def _stream_choice(self, req, i, delta, entries, finish):
        reasoning, text = delta
        if req.kind == "chat":
            d: dict[str, Any] = {}
            if text or finish is None:
                d["content"] = text
            if reasoning:
                d["reasoning_content"] = reasoning
            lp = {"content": self._token_logprobs(entries)} if entries else None
            return {"index": i, "delta": d, "logprobs": lp, "finish_reason": finish}
        lp = self._completion_logprobs(entries) if entries else None
        return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}

    def _completion_logprobs(self, entries) -> dict:
        tokens = [self.decode([t]) for t, _, _ in entries]
        offsets, at = [], 0
        for t in tokens:
            offsets.append(at)
            at += len(t)
        return {"tokens": tokens, "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [{self.decode([t]): v for t, v in top} for _, _, top in entries],
                "text_offset": offsets}

    def _choice(self, req, i, ids, finish, entries) -> dict:
        reasoning, text = self._final_text(req, ids, finish)
        if req.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": text}
            if reasoning:
                message["reasoning_content"] = reasoning
            lp = {"content": self._token_logprobs(entries)} if req.logprobs else None
            return {"index": i, "message": message, "logprobs": lp, "finish_reason": finish,
                    "token_ids": list(ids)}
        lp = self._completion_logprobs(entries) if req.logprobs else None
        return {"index": i, "text": text, "logprobs": lp, "finish_reason": finish, "token_ids": list(ids)}


# ----------------------------------------------------------------------------------------------
# HTTP

MAX_BODY_BYTES = 8 << 20


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "K3Server"

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - the base class's signature
        if self.server.verbose:
            super().log_message(format, *args)

    def _send_json(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _error(self, err: RequestError) -> None:
        self._send_json(err.status, err.body())

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        api = self.server.api
        if self.path == "/health":
            self._send_json(200, {"status": "ok", "model": api.served.model_id,
                                  "running": len(api.scheduler.running), "pending": api.scheduler.pending.qsize()})
        elif self.path == "/v1/models":
            self._send_json(200, {"object": "list", "data": [self.server.model_card()]})
        elif self.path == f"/v1/models/{api.served.model_id}":
            self._send_json(200, self.server.model_card())
        else:
            self._error(RequestError(f"no route GET {self.path}", status=404, code="not_found"))

    def do_POST(self) -> None:  # noqa: N802
        kinds = {"/v1/completions": "completion", "/v1/chat/completions": "chat"}
        kind = kinds.get(self.path)
        try:
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.close_connection = True
                raise RequestError(f"the body has {length} bytes, more than {MAX_BODY_BYTES}", status=413)
            raw = self.rfile.read(length)
            if kind is None:
                raise RequestError(f"no route POST {self.path}", status=404, code="not_found")
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(f"the body is not valid JSON: {e}") from e
            req = self.server.api.parse(body, kind)
        except RequestError as e:
            self._error(e)
            return
        try:
            if not req.stream:
                self._send_json(200, self.server.api.run(req))
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def write(data: bytes) -> None:
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            try:
                self.server.api.run(req, emit=lambda c: write(f"data: {json.dumps(c)}\n\n".encode()))
            except RuntimeError as e:
                write(f"data: {json.dumps(RequestError(str(e), status=500, kind='server_error').body())}\n\n".encode())
            write(b"data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
        except RuntimeError as e:
            self._send_json(500, RequestError(str(e), status=500, kind="server_error").body())
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True  # the client left; its rows finish and are dropped


class K3Server(ThreadingHTTPServer):
    daemon_threads = True
    # The listen backlog: socketserver's default of 5 resets the 6th client that connects at once.
    request_queue_size = 128

    def __init__(self, served: Served, host: str = "127.0.0.1", port: int = 8000, max_batch: int = 16,
                 efforts: dict | None = None, verbose: bool = False):
        self.served, self.verbose = served, verbose
        self.scheduler = Scheduler(served.model, served.draft, max_batch=max_batch)
        self.api = Api(served, self.scheduler, efforts)
        super().__init__((host, port), Handler)

    def model_card(self) -> dict:
        s = self.served
        return {"id": s.model_id, "object": "model", "created": int(s.path.stat().st_mtime), "owned_by": "k3",
                "path": str(s.path), "quantization": s.quantization, "fused_projections": s.fused,
                "draft": None if s.draft_path is None else str(s.draft_path),
                "context_length": context_length(s.model), "reasoning_efforts": list(self.api.efforts)}

    def close(self) -> None:
        self.shutdown()
        self.server_close()
        self.scheduler.close()


def start(served: Served, host: str = "127.0.0.1", port: int = 0, **kwargs) -> tuple[K3Server, threading.Thread]:
    """A server on a background thread (port 0: a free one, `server.server_address[1]`)."""
    server = K3Server(served, host, port, **kwargs)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)
    thread.start()
    return server, thread


def _post(base: str, body: dict) -> dict:
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def card(served: Served, batches: list[int], prompt: int, new: int, log: Callable[[str], None] | None = None,
         reps: int = 1) -> list[dict]:
    """The inference card's serving rows: `served` behind a server on 127.0.0.1 (a free port), and for
    each B in `batches`, B clients sending one greedy completion each at once (distinct random
    prompts of `prompt` ids, `new` tokens): aggregate tokens/s = B · new / wall, latency per request
    (median, max), the decode steps the scheduler ran and how many requests the draft decoded. With
    `reps` > 1 each B runs that many times (fresh prompts) and the run of median wall time is kept
    (a shared machine's load comes and goes); `walls_s` lists them all."""
    server, thread = start(served, max_batch=max(batches))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    g = torch.Generator().manual_seed(0)
    V = served.model.cfg.vocab_size
    rows = []
    try:
        _post(base, {"model": served.model_id, "prompt": [1] * prompt, "max_tokens": 4, "temperature": 0})  # warm-up
        for B in [b for b in batches for _ in range(reps)]:
            prompts = [torch.randint(40, V, (prompt,), generator=g).tolist() for _ in range(B)]
            latency, tokens, failed = [0.0] * B, [0] * B, []
            barrier = threading.Barrier(B + 1)

            def ask(i: int) -> None:
                barrier.wait()
                t0 = time.perf_counter()
                try:
                    out = _post(base, {"model": served.model_id, "prompt": prompts[i], "max_tokens": new,
                                       "temperature": 0})
                except OSError as e:
                    failed.append(f"client {i} of {B}: {e}")
                    return
                latency[i] = time.perf_counter() - t0
                tokens[i] = out["usage"]["completion_tokens"]

            threads = [threading.Thread(target=ask, args=(i,)) for i in range(B)]
            for t in threads:
                t.start()
            steps_before = server.scheduler.steps
            spec_before = server.scheduler.speculative_requests
            barrier.wait()
            t0 = time.perf_counter()
            for t in threads:
                t.join()
            wall = time.perf_counter() - t0
            if failed:
                raise RuntimeError(f"the card's requests failed: {'; '.join(failed)}")
            row = {"batch": B, "tokens": sum(tokens), "wall_s": round(wall, 4), "tokens_per_s": round(sum(tokens) / wall, 1),
                   "latency_median_s": round(statistics.median(latency), 4), "latency_max_s": round(max(latency), 4),
                   "decode_steps": server.scheduler.steps - steps_before,
                   "speculative_requests": server.scheduler.speculative_requests - spec_before}
            if log is not None:
                log(json.dumps(row))
            rows.append(row)
        if reps > 1:
            kept = []
            for at in range(0, len(rows), reps):
                runs = sorted(rows[at: at + reps], key=lambda r: r["wall_s"])
                kept.append({**runs[len(runs) // 2], "walls_s": [r["wall_s"] for r in rows[at: at + reps]]})
            rows = kept
    finally:
        server.close()
        thread.join(timeout=10)
    return rows
