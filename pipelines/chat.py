"""`k3 chat`: a terminal client for `k3 serve` (standard library only: urllib, server-sent events).

    k3 chat [--url http://127.0.0.1:8000] [--effort low|high|max] [--temperature T] [--max-tokens N]

Each line typed is a user message; the reply streams as it is generated (the scratchpad, when the
model writes one, dimmed in brackets). Commands: `/effort low|high|max`, `/reset` (forget the
conversation), `/quit`. The conversation is kept and sent whole each turn, as the chat API expects.
"""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

from k3model.train.effort import EFFORTS  # the one vocabulary (datagen.sft defines it)


def _request(url: str, body: dict | None = None, timeout: float = 600) -> urllib.request.Request:
    data = None if body is None else json.dumps(body).encode()
    return urllib.request.Request(url, data, {"Content-Type": "application/json"})


def served_model(base: str) -> str:
    """The id of the model the server at `base` serves."""
    with urllib.request.urlopen(_request(f"{base}/v1/models"), timeout=10) as r:
        return json.loads(r.read())["data"][0]["id"]


def stream_chat(base: str, body: dict) -> Iterator[dict]:
    """The chunks of a streamed chat completion (each a parsed `data:` event), [DONE] excluded."""
    with urllib.request.urlopen(_request(f"{base}/v1/chat/completions", {**body, "stream": True}), timeout=600) as r:
        for raw in r:
            line = raw.decode("utf-8").rstrip("\r\n")
            if not line.startswith("data: "):
                continue
            payload = line[len("data: "):]
            if payload == "[DONE]":
                return
            chunk = json.loads(payload)
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            yield chunk


def reply(base: str, model: str, messages: list[dict], effort: str, temperature: float, max_tokens: int | None,
          out=sys.stdout) -> tuple[str, dict | None]:
    """Stream one reply to `out`; returns (its content, the usage)."""
    body = {"model": model, "messages": messages, "reasoning_effort": effort, "temperature": temperature,
            "stream_options": {"include_usage": True}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    content, usage, thinking = [], None, False
    for chunk in stream_chat(base, body):
        usage = chunk.get("usage") or usage
        for choice in chunk["choices"]:
            delta = choice["delta"]
            if delta.get("reasoning_content"):
                if not thinking:
                    out.write("\033[2m[")
                    thinking = True
                out.write(delta["reasoning_content"])
            if delta.get("content"):
                if thinking:
                    out.write("]\033[0m ")
                    thinking = False
                out.write(delta["content"])
                content.append(delta["content"])
            out.flush()
    if thinking:
        out.write("]\033[0m")
    out.write("\n")
    return "".join(content), usage


def main(url: str, effort: str = "high", temperature: float = 0.7, max_tokens: int | None = None,
         lines=None, out=sys.stdout) -> int:
    base = url.rstrip("/")
    try:
        model = served_model(base)
    except (OSError, ValueError, KeyError) as e:
        out.write(f"k3 chat: no k3 server answers at {base} ({e}); start one with `k3 serve`\n")
        return 1
    out.write(f"k3 chat: {model} at {base}, effort {effort}; /effort low|high|max, /reset, /quit\n")
    messages: list[dict] = []
    lines = iter(lines) if lines is not None else None
    while True:
        try:
            if lines is None:
                text = input("> ")
            else:
                text = next(lines)
        except (EOFError, StopIteration):
            return 0
        text = text.strip()
        if not text:
            continue
        if text in ("/quit", "/exit"):
            return 0
        if text == "/reset":
            messages = []
            out.write("(conversation cleared)\n")
            continue
        if text.startswith("/effort"):
            choice = text.split()[1:] or [""]
            if choice[0] not in EFFORTS:
                out.write(f"(effort is {effort}; choose one of {', '.join(EFFORTS)})\n")
            else:
                effort = choice[0]
                out.write(f"(effort {effort})\n")
            continue
        messages.append({"role": "user", "content": text})
        try:
            content, usage = reply(base, model, messages, effort, temperature, max_tokens, out)
        except urllib.error.HTTPError as e:
            out.write(f"(error {e.code}: {json.loads(e.read()).get('error', {}).get('message')})\n")
            messages.pop()
            continue
        except (OSError, RuntimeError) as e:
            out.write(f"(error: {e})\n")
            messages.pop()
            continue
        messages.append({"role": "assistant", "content": content})
        if usage:
            out.write(f"\033[2m({usage['prompt_tokens']} prompt + {usage['completion_tokens']} completion tokens)\033[0m\n")
