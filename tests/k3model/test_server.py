"""`k3 serve` conformance, vendor-verifier style (k3model/server.py): a random smoke model saved as a
checkpoint, served on 127.0.0.1 from a thread, spoken to over HTTP with urllib (the command itself:
tests/pipelines/test_serve.py).

What a conforming server must do: temperature 0 gives exactly the engine's greedy ids; usage counts
exactly the ids prefilled and sampled; stop strings cut the text; streamed chunks concatenate to the
non-streamed text; reasoning_effort changes the control token and the budget; bad requests get
OpenAI-shaped 4xx errors and the server keeps serving; concurrent clients each get what they would
alone; seeds reproduce; MXFP4 and draft checkpoints serve the same way.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from dataclasses import asdict

import pytest
import torch

from datagen.corpus import build_corpus
from datagen.profiles import presets
from datagen.sft import turn_tokens
from datagen.tokenizer import BOS, END_OF_TURN, EOS, decode, encode, special_token_ids, train_tokenizer
from k3model.checkpoint import save_checkpoint
from k3model.engine import SamplingConfig, context_length, generate
from k3model.fused import fused_modules
from k3model.train.effort import EFFORT_SPECS
from k3model.train.rollout import sft_format
from k3model.server import load_served, start
from tests.k3model.test_model import smoke_model

MODEL = "k3-smoke-test"


@pytest.fixture(scope="module")
def one_thread():
    """Batched equals alone is a one-intra-op-thread property of the CPU kernels (k3model/engine.py)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    cfg = presets("smoke")
    tok = train_tokenizer(cfg.tokenizer, build_corpus(cfg.corpus))
    tok.save(str(root / "tokenizer.json"))
    model = smoke_model()
    with torch.no_grad():
        # A zero output row gives <|end|> the logit 0, below the largest of 512 random logits: greedy
        # replies never end early, so they run to their budget (the effort test needs that).
        model.lm_head.weight[special_token_ids(tok)[END_OF_TURN]] = 0
    save_checkpoint(root / "model", model.state_dict(), {"config": {"model": asdict(model.cfg)}})
    return {"root": root, "tokenizer": root / "tokenizer.json", "model": root / "model", "tok": tok}


class Client:
    def __init__(self, server):
        self.server = server
        self.base = f"http://127.0.0.1:{server.server_address[1]}"

    def raw(self, path: str, data: bytes | None = None) -> tuple[int, bytes]:
        req = urllib.request.Request(self.base + path, data, {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def post(self, path: str, body: dict) -> tuple[int, dict]:
        status, data = self.raw(path, json.dumps(body).encode())
        return status, json.loads(data)

    def ok(self, path: str, body: dict) -> dict:
        status, out = self.post(path, {"model": MODEL, **body})
        assert status == 200, out
        return out

    def stream(self, path: str, body: dict) -> list[dict]:
        status, data = self.raw(path, json.dumps({"model": MODEL, **body, "stream": True}).encode())
        assert status == 200, data
        events = [line[len("data: "):] for line in data.decode().split("\n\n") if line.startswith("data: ")]
        assert events[-1] == "[DONE]"
        return [json.loads(e) for e in events[:-1]]


@pytest.fixture(scope="module")
def served(files, one_thread):
    served = load_served(files["model"], files["tokenizer"], model_id=MODEL)
    server, thread = start(served, max_batch=8)
    yield served, Client(server)
    server.close()
    thread.join(timeout=10)
    assert not thread.is_alive()


def ids_of(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(40, 512, (n,), generator=g).tolist()


def completion_stops(tok) -> tuple[int, ...]:
    special = special_token_ids(tok)
    return special[EOS], special[END_OF_TURN]


def test_models_and_health(served):
    s, client = served
    status, data = client.raw("/v1/models")
    card = json.loads(data)["data"][0]
    assert status == 200 and card["id"] == MODEL and card["quantization"] == "float32"
    assert card["fused_projections"] and fused_modules(s.model)  # frozen weights: served fused
    assert card["context_length"] == context_length(s.model) == 512
    assert json.loads(client.raw("/health")[1])["status"] == "ok"


def test_temperature_0_is_the_engines_greedy_output_with_exact_usage(served, files):
    s, client = served
    prompt = ids_of(9, 0)
    out = client.ok("/v1/completions", {"prompt": prompt, "max_tokens": 12, "temperature": 0, "logprobs": 0})
    want = generate(s.model, [prompt], SamplingConfig(12, stop_ids=completion_stops(files["tok"])))[0]
    choice = out["choices"][0]
    assert choice["token_ids"] == want.token_ids and choice["finish_reason"] == want.finish_reason
    assert choice["logprobs"]["token_logprobs"] == want.model_logprobs
    assert out["usage"] == {"prompt_tokens": 9, "completion_tokens": len(want.token_ids),
                            "total_tokens": 9 + len(want.token_ids)}
    # A chat request: the SFT template's ids, then the engine's greedy reply to them.
    chat = client.ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "add 2 and 3"}],
                                              "temperature": 0, "max_tokens": 10, "reasoning_effort": "low"})
    fmt = sft_format(files["tok"], "low")
    ids = fmt.first_observation("add 2 and 3")
    want = generate(s.model, [ids], SamplingConfig(10, stop_ids=(fmt.stop_id,)))[0]
    assert chat["choices"][0]["token_ids"] == want.token_ids
    assert chat["usage"]["prompt_tokens"] == len(ids) and chat["usage"]["completion_tokens"] == len(want.token_ids)


def test_stop_strings_cut_the_text_and_end_generation(served, files):
    s, client = served
    prompt = ids_of(6, 1)
    full = client.ok("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0})["choices"][0]
    text, ids = full["text"], full["token_ids"]
    stop = next(text[i: i + 2] for i in range(4, len(text) - 2) if text[i: i + 2].strip() and "\ufffd" not in text[i: i + 2])
    cut = client.ok("/v1/completions", {"prompt": prompt, "max_tokens": 24, "temperature": 0, "stop": [stop, "never seen"]})
    choice = cut["choices"][0]
    assert choice["text"] == text[: text.index(stop)] and choice["finish_reason"] == "stop"
    # Generation ended at the first id whose text completes the stop string; usage counts up to it.
    first = next(k for k in range(1, len(ids) + 1) if stop in decode(files["tok"], ids[:k]))
    assert choice["token_ids"] == ids[:first] and cut["usage"]["completion_tokens"] == first


@pytest.mark.parametrize("path,extra", [
    ("/v1/completions", {"prompt": "The river", "max_tokens": 20}),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "be brief"},
                                           {"role": "user", "content": "name a river"}], "max_tokens": 20}),
])
def test_streamed_chunks_concatenate_to_the_unstreamed_text(served, path, extra):
    s, client = served
    for sampling in ({"temperature": 0}, {"temperature": 1.0, "top_p": 0.9, "seed": 7}):
        body = {**extra, **sampling, "stop": ["zz"]}
        whole = client.ok(path, body)
        chunks = client.stream(path, {**body, "stream_options": {"include_usage": True}})
        assert chunks[-1]["usage"] == whole["usage"] and chunks[-1]["choices"] == []
        choices = [c["choices"][0] for c in chunks[:-1]]
        if path == "/v1/chat/completions":
            got = "".join(c["delta"].get("content", "") for c in choices)
            assert got == whole["choices"][0]["message"]["content"]
            assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
            assert "".join(c["delta"].get("reasoning_content", "") for c in choices) == \
                whole["choices"][0]["message"].get("reasoning_content", "")
        else:
            assert "".join(c["text"] for c in choices) == whole["choices"][0]["text"]
        assert choices[-1]["finish_reason"] == whole["choices"][0]["finish_reason"]
        assert len(chunks) > 3  # streamed as it went, not in one piece


def test_reasoning_effort_picks_the_control_token_and_the_budget(served, files):
    s, client = served
    special = special_token_ids(files["tok"])
    messages = [{"role": "user", "content": "sum 1 2"}]
    outs: dict[str, dict] = {}

    def ask(effort: str) -> None:  # the three at once: they share decode steps
        outs[effort] = client.ok("/v1/chat/completions", {"messages": messages, "temperature": 0,
                                                          "reasoning_effort": effort})

    threads = [threading.Thread(target=ask, args=(e,)) for e in ("low", "high", "max")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for effort in ("low", "high", "max"):
        out = outs[effort]
        ids = sft_format(files["tok"], effort).first_observation("sum 1 2")
        turn = turn_tokens(files["tok"], effort)
        assert ids[2] == special[f"<|effort_{effort}|>"] == turn.first_start[2]
        budget = min(EFFORT_SPECS[effort].turn_tokens, context_length(s.model) - len(ids))
        choice = out["choices"][0]
        assert out["usage"]["prompt_tokens"] == len(ids) and out["reasoning_effort"] == effort
        # The test model's greedy replies never end with <|end|> (`files`): each runs to its effort's budget.
        assert choice["finish_reason"] == "length" and out["usage"]["completion_tokens"] == budget
    # max_tokens, when given, is honoured as given.
    out = client.ok("/v1/chat/completions", {"messages": messages, "temperature": 0, "reasoning_effort": "max",
                                             "max_tokens": 5})
    assert out["usage"]["completion_tokens"] == 5


def test_bad_requests_get_openai_errors_and_the_server_keeps_serving(served):
    s, client = served
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    cases = [
        ({**chat, "model": "gpt-4"}, 404, "model"),
        ({**chat, "reasoning_effort": "medium"}, 400, "reasoning_effort"),
        ({**chat, "max_tokens": -1}, 400, "max_tokens"),
        ({**chat, "temperature": -0.5}, 400, "temperature"),
        ({**chat, "top_p": 1.5}, 400, "top_p"),
        ({**chat, "n": 0}, 400, "n"),
        ({**chat, "frequency_penalty": 0.5}, 400, "frequency_penalty"),  # refused, not silently ignored
        ({**chat, "top_k": 0}, 400, "top_k"),
        ({**chat, "seed": 1 << 70}, 400, "seed"),
        ({**chat, "messages": []}, 400, "messages"),
        ({**chat, "messages": [{"role": "user", "content": "x " * 2000}]}, 400, "messages"),
        ({"model": MODEL, "prompt": [1] * 513}, 400, "prompt"),
        ({"model": MODEL, "prompt": [1, 99999]}, 400, "prompt"),
    ]
    for body, status, param in cases:
        path = "/v1/completions" if "prompt" in body else "/v1/chat/completions"
        got, out = client.post(path, body)
        assert got == status, (body, out)
        assert set(out["error"]) == {"message", "type", "param", "code"} and out["error"]["param"] == param
        assert out["error"]["message"]
    status, data = client.raw("/v1/chat/completions", b'{"model": "k3", "messages": [')
    assert status == 400 and "JSON" in json.loads(data)["error"]["message"]
    assert client.raw("/v1/nothing", b"{}")[0] == 404
    assert client.raw("/nothing")[0] == 404
    # Still serving.
    assert client.ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                                              "temperature": 0})["usage"]["completion_tokens"] == 2


def test_a_client_that_leaves_mid_stream_frees_its_rows(served):
    import http.client
    import time
    s, client = served
    scheduler = client.server.scheduler
    before = scheduler.steps
    conn = http.client.HTTPConnection("127.0.0.1", client.server.server_address[1], timeout=30)
    conn.request("POST", "/v1/completions", json.dumps({"model": MODEL, "prompt": ids_of(5, 2), "max_tokens": 400,
                                                        "temperature": 0, "stream": True}),
                 {"Content-Type": "application/json"})
    response = conn.getresponse()
    assert response.status == 200 and response.read1(64)  # the stream has started
    conn.sock.shutdown(2)
    conn.close()
    for _ in range(200):  # bounded: 20 s
        if not scheduler.running:
            break
        time.sleep(0.1)
    assert not scheduler.running and scheduler.pending.empty()
    assert scheduler.steps - before < 200  # of the 400 asked for: the row left when its client did
    assert client.ok("/v1/completions", {"prompt": [5, 6, 7], "max_tokens": 2})["usage"]["completion_tokens"] == 2


def test_concurrent_clients_each_get_what_they_get_alone(served, files):
    s, client = served
    prompts = [ids_of(n, 10 + n) for n in (3, 5, 8, 8, 13, 21)]
    lengths = [30, 14, 25, 9, 30, 18]
    results: dict[int, dict] = {}
    barrier = threading.Barrier(len(prompts))

    def ask(i: int) -> None:
        barrier.wait()
        results[i] = client.ok("/v1/completions", {"prompt": prompts[i], "max_tokens": lengths[i], "temperature": 0})

    before = len(s_batches := client.server.scheduler.batch_sizes)
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    stops = completion_stops(files["tok"])
    for i, prompt in enumerate(prompts):
        alone = generate(s.model, [prompt], SamplingConfig(lengths[i], stop_ids=stops))[0]
        assert results[i]["choices"][0]["token_ids"] == alone.token_ids
        assert results[i]["usage"]["prompt_tokens"] == len(prompt)
    assert max(s_batches[before:]) > 1  # the requests did share decode steps


def test_seed_reproduces_and_sampling_parameters_are_honoured(served):
    s, client = served
    body = {"prompt": ids_of(7, 3), "max_tokens": 16, "temperature": 1.0}
    a = client.ok("/v1/completions", {**body, "seed": 11})["choices"][0]["token_ids"]
    b = client.ok("/v1/completions", {**body, "seed": 11})["choices"][0]["token_ids"]
    c = client.ok("/v1/completions", {**body, "seed": 12})["choices"][0]["token_ids"]
    assert a == b != c
    # n choices: choice i is seeded seed + i, so it is what a request with that seed gets.
    two = client.ok("/v1/completions", {**body, "seed": 11, "n": 2})
    assert [ch["token_ids"] for ch in two["choices"]] == [a, c]
    assert two["usage"]["completion_tokens"] == len(a) + len(c) and two["usage"]["prompt_tokens"] == 7
    # A nucleus this small keeps only the top token: the output is the greedy output.
    greedy = client.ok("/v1/completions", {**body, "temperature": 0})["choices"][0]["token_ids"]
    nucleus = client.ok("/v1/completions", {**body, "top_p": 1e-6, "seed": 5})["choices"][0]["token_ids"]
    assert nucleus == greedy != a
    assert client.ok("/v1/completions", {**body, "top_k": 1, "seed": 5})["choices"][0]["token_ids"] == greedy
    # No-op values of parameters the engine lacks are accepted.
    assert client.ok("/v1/completions", {**body, "seed": 11, "frequency_penalty": 0, "logit_bias": {}})[
        "choices"][0]["token_ids"] == a
    # top_logprobs: the k largest log-probabilities, the sampled greedy id first.
    out = client.ok("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
                                             "temperature": 0, "logprobs": True, "top_logprobs": 3})
    for entry in out["choices"][0]["logprobs"]["content"]:
        tops = [t["logprob"] for t in entry["top_logprobs"]]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True) and tops[0] == entry["logprob"]


def test_mxfp4_export_and_draft_serve_the_engines_output(files, one_thread):
    from k3model.draft import draft_from_mtp, draft_manifest
    from k3model.quantize import export_quantized, load_quantized

    model = smoke_model()
    export_quantized(model, files["root"] / "mxfp4", other_dtype=torch.bfloat16)
    draft = draft_from_mtp(load_quantized(files["root"] / "mxfp4")[0])
    save_checkpoint(files["root"] / "draft", draft.state_dict(), draft_manifest(draft))
    served = load_served(files["root"] / "mxfp4", files["tokenizer"], files["root"] / "draft", model_id=MODEL)
    server, thread = start(served)
    try:
        client = Client(server)
        card = json.loads(client.raw("/v1/models")[1])["data"][0]
        assert card["quantization"] == "mxfp4" and card["draft"].endswith("draft")
        assert fused_modules(served.model) and fused_modules(served.draft)
        prompt = ids_of(8, 4)
        out = client.ok("/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0})
        want = generate(served.model, [prompt], SamplingConfig(10, stop_ids=completion_stops(files["tok"])))[0]
        assert out["choices"][0]["token_ids"] == want.token_ids
        assert server.scheduler.speculative_requests == 1  # decoded with the draft
        # With logprobs asked for, the batched loop serves it (the draft path records none).
        out = client.ok("/v1/completions", {"prompt": prompt, "max_tokens": 10, "temperature": 0, "logprobs": 0})
        assert out["choices"][0]["token_ids"] == want.token_ids and server.scheduler.speculative_requests == 1
    finally:
        server.close()
        thread.join(timeout=10)


def test_a_model_that_cannot_load_fails_at_start_naming_the_path(tmp_path, files):
    with pytest.raises(ValueError, match=str(tmp_path / "missing")):
        load_served(tmp_path / "missing", files["tokenizer"])
    with pytest.raises(ValueError, match="draft"):
        load_served(files["model"], files["tokenizer"], files["model"])  # a model is no draft
