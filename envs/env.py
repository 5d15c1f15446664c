"""The environment protocol: reset / step / snapshot / restore over one task family and one harness.

    obs = env.reset(task=None, seed=None)            # str: system prompt, tools and the task
    obs, reward, terminated, truncated, info = env.step(text)
    blob = env.snapshot()                            # bytes: the whole episode
    obs = env.restore(blob)                          # in this or a fresh process; returns the last obs
    record = env.trajectory()                        # JSON-ready record of the episode

Gymnasium's step contract (research/environments.md §5): `terminated` when the policy called the
finish tool (the verifier has run and `reward` is its score, 0 or 1), `truncated` when a budget ran
out (steps, i.e. policy turns, or tokens of policy text; reward 0). Every other step has reward 0.
A step whose text contains no readable call, or calls with bad arguments, gets an error observation
in the harness's format; `step` raises only on misuse of the API (stepping before reset or after
the end).

One turn may hold several calls (up to 32); they run in order and a finish call ends the turn.
Tokens are counted with `count_tokens` (a rough word/punctuation count by default; pass the policy's
tokenizer to count exactly).

Snapshots are a gzip'd tar of `episode.json` (task, app world, counters, trajectory so far, RNG
state) and `workspace.tar` (envs/sandbox.py), written with fixed metadata, so equal states give equal
bytes. Restoring rebuilds the sandbox directory from the bytes; the episode then continues exactly as
if it had never been interrupted. A blob is checked before it is believed: at most
`snapshot_limit()` bytes, compressed and decompressed (decompression stops there, so a gzip bomb costs
that much and no more), exactly the two members, a workspace tar that passes the sandbox's checks,
and a task equal to the one its family generates for its seed — the hidden tests and verifier spec
are never taken from the blob. Anything else is a ValueError that says what was wrong.

Nothing the policy does makes `step`, `snapshot`, `state_digest` or `close` raise: tool errors become
error observations, an exception inside a verifier becomes a failed verification (flag
`verifier_error`), and the sandbox directory is removed on `close` and on the next `reset` whatever the
commands left in it.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import logging
import random
import re
import tarfile
import zlib
from dataclasses import dataclass
from typing import Any, Callable

from envs.actions import AppCall, Edit, Finish, Read, Run, Search, Write, to_dict
from envs.apps import ToolError, World
from envs.harnesses.base import Call, Harness, Outcome
from envs.jail import Limits
from envs.sandbox import ReadResult, Sandbox, SandboxError
from envs.tasks.base import Family, Final, Task, verdict

log = logging.getLogger(__name__)

SNAPSHOT_FORMAT = "k3-envs-snapshot/1"
TRAJECTORY_FORMAT = "k3-envs-trajectory/1"
MAX_EPISODE_JSON_BYTES = 64 << 20
TASK_ID_RE = re.compile(r"\(task id: ([A-Za-z0-9_.-]+)/(\d+)\)")
_TOKEN_RE = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """A tokenizer-free estimate: one token per word or punctuation mark."""
    return len(_TOKEN_RE.findall(text))


@dataclass(frozen=True)
class EnvConfig:
    max_steps: int | None = None  # None: the task's own budget
    max_tokens: int | None = None
    limits: Limits = Limits()
    observation_chars: int = 20_000  # longest tool output shown per call


class Env:
    def __init__(self, family: Family, harness: Harness, seed: int = 0, config: EnvConfig = EnvConfig(),
                 count_tokens: Callable[[str], int] = count_tokens):
        self.family = family
        self.harness = harness
        self.config = config
        self.count_tokens = count_tokens
        self._rng = random.Random(seed)
        self._sandbox: Sandbox | None = None
        self._task: Task | None = None
        self._world: World | None = None
        self._system_prompt = ""
        self._terminated = self._truncated = False

    # --- properties --------------------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.family.name

    @property
    def task(self) -> Task | None:
        return self._task

    @property
    def system_prompt(self) -> str:
        return self._system_prompt

    @property
    def done(self) -> bool:
        return self._task is not None and (self._terminated or self._truncated)

    @property
    def sandbox(self) -> Sandbox | None:
        return self._sandbox

    @property
    def world(self) -> World | None:
        return self._world

    # --- protocol ------------------------------------------------------------------------------
    def reset(self, task: Task | None = None, seed: int | None = None) -> str:
        """Start an episode on `task`, or on this family's task for `seed` (drawn from the env's
        seeded RNG when None). Returns the first observation."""
        if task is None:
            task = self.family.generate(seed if seed is not None else self._rng.randrange(2**31))
        elif not isinstance(task, Task):
            raise ValueError(f"task must be an envs Task or None, got {type(task).__name__}; pass seed=... instead")
        elif task.family != self.family.name:
            raise ValueError(f"this env runs {self.family.name!r} tasks; got a {task.family!r} task: "
                             f"use envs.make_env({task.family!r})")
        self._new_sandbox()
        for path, content in self.family.initial_files(task).items():
            self._sandbox.write(path, content)
        self._task = task
        self._world = self.family.initial_world(task)
        self._steps = self._tokens = self._calls = 0
        self._terminated = self._truncated = False
        self._answer: str | None = None
        self._records: list[dict[str, Any]] = []
        self._verdict: dict[str, Any] | None = None
        self._system_prompt = self.harness.render_system_prompt(task.toolset)
        user = f"{task.instruction}\n\n(task id: {task.id})"
        self._initial_observation = self.harness.render_initial(self._system_prompt, user)
        self._last_observation = self._initial_observation
        return self._initial_observation

    def step(self, text: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None:
            raise RuntimeError("call reset() before step()")
        if self.done:
            raise RuntimeError("the episode is over; call reset() to start another")
        task = self._task
        n_tokens = self.count_tokens(text) if isinstance(text, str) else 0
        self._steps += 1
        self._tokens += n_tokens
        calls: list[Call] = []
        outcomes: list[Outcome] = []
        parse_error = None
        finished = False
        if self._tokens > self.max_tokens:
            parse_error = f"the token budget ({self.max_tokens}) is spent; the action was not run"
            obs = self.harness.render_parse_error(parse_error)
        else:
            calls = self.harness.parse(text if isinstance(text, str) else "", task.toolset, self._calls)
            self._calls += len(calls)
            if not calls:
                finish = self.harness.TOOLS["finish"].name
                parse_error = (f"no tool call found. Call a tool in the format described above, or call "
                               f"{finish} when the task is done.")
                obs = self.harness.render_parse_error(parse_error)
            else:
                for call in calls:
                    outcomes.append(self._execute(call))
                    if isinstance(call.action, Finish) and outcomes[-1].ok:
                        finished = True
                        break
                obs = self.harness.render_results(outcomes)
        reward = 0.0
        if finished:
            self._terminated = True
        elif self._steps >= self.max_steps or self._tokens > self.max_tokens:
            self._truncated = True
        if self.done:
            try:
                v = self.family.verify(task, Final(self._sandbox, self._world, self._answer, finished))
            except Exception as e:  # noqa: BLE001 - whatever the policy left must fail the task, not crash
                log.warning("envs: the %s verifier raised %s", self.family.name, type(e).__name__, exc_info=True)
                v = verdict({}, [], [f"verifier_error:{type(e).__name__}"], finished, {"verifier_error": str(e)[:500]})
            self._verdict = v.to_json()
            reward = v.reward if finished else 0.0
        record = {
            "action": text if isinstance(text, str) else repr(text),
            "calls": [{"id": o.call.call_id, "tool": o.call.tool,
                       "action": to_dict(o.call.action) if o.call.action is not None else None,
                       "ok": o.ok, "error": None if o.ok else o.text} for o in outcomes],
            "observation": obs,
            "reward": reward,
            "tokens": n_tokens,
        }
        if parse_error is not None:
            record["error"] = parse_error
        self._records.append(record)
        self._last_observation = obs
        info = {
            "step": self._steps,
            "calls": record["calls"],
            "error": parse_error,
            "usage": self.usage(),
        }
        if self.done:
            info["verifier"] = self._verdict
        return obs, reward, self._terminated, self._truncated, info

    @property
    def max_steps(self) -> int:
        return self.config.max_steps or self._task.max_steps

    @property
    def max_tokens(self) -> int:
        return self.config.max_tokens or self._task.max_tokens

    def usage(self) -> dict[str, int]:
        return {"steps": self._steps, "tokens": self._tokens, "calls": self._calls,
                "max_steps": self.max_steps, "max_tokens": self.max_tokens}

    # --- executing one call ----------------------------------------------------------------------
    def _execute(self, call: Call) -> Outcome:
        if call.action is None:
            return Outcome(call, False, call.error or "invalid call")
        a = call.action
        if not self._task.toolset.allows(a):
            return Outcome(call, False, f"{call.tool} is not available in this task")
        sb = self._sandbox
        try:
            if isinstance(a, Read):
                return self._cap(Outcome(call, True, "", read=sb.read(a.path, a.offset, a.limit)))
            if isinstance(a, Write):
                n = sb.write(a.path, a.content)
                return Outcome(call, True, f"Wrote {n} bytes to {a.path}")
            if isinstance(a, Edit):
                k = sb.edit(a.path, a.old, a.new, a.replace_all)
                return Outcome(call, True, f"Replaced {k} occurrence{'s' if k > 1 else ''} in {a.path}")
            if isinstance(a, Run):
                if a.timeout is not None and a.timeout < 1:
                    return Outcome(call, False, "timeout must be at least 1 second")
                r = sb.run(a.command, a.timeout)
                return Outcome(call, True, r.output, run=r)
            if isinstance(a, Search):
                hits = sb.search(a.pattern, a.path)
                text = "\n".join(hits) if hits else "No matches."
                return self._cap(Outcome(call, True, text))
            if isinstance(a, AppCall):
                data = self._world.call(a.app, a.tool, a.args)
                return self._cap(Outcome(call, True, json.dumps(data, ensure_ascii=False), data=data))
            if isinstance(a, Finish):
                self._answer = a.answer
                return Outcome(call, True, "Task finished.")
        except (SandboxError, ToolError) as e:
            return Outcome(call, False, str(e))
        except Exception as e:  # noqa: BLE001 - see below
            # Hostile input can still reach the OS layer (odd bytes in a path, a file replaced by a
            # directory mid-episode); it is the policy's error, shown to it, never a crash.
            log.info("envs: %s raised %s: %s", call.tool, type(e).__name__, e)
            return Outcome(call, False, f"{type(e).__name__}: {e}"[:2000])
        raise AssertionError(f"unhandled action {a!r}")

    def _cap(self, o: Outcome) -> Outcome:
        """Keep one call's output under config.observation_chars."""
        cap = self.config.observation_chars
        if o.read is not None:
            lines, size = [], 0
            for ln in o.read.lines:
                size += len(ln) + 8
                if size > cap:
                    break
                lines.append(ln)
            if len(lines) < len(o.read.lines):
                r = o.read
                return Outcome(o.call, True, "", read=ReadResult(lines, r.first_line, r.total_lines, r.is_dir))
            return o
        if len(o.text) > cap:
            return Outcome(o.call, o.ok, o.text[:cap] + f"\n... [output truncated at {cap} characters]")
        return o

    # --- snapshots -------------------------------------------------------------------------------
    def _new_sandbox(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = Sandbox(limits=self.config.limits)

    def snapshot(self) -> bytes:
        if self._task is None:
            raise RuntimeError("call reset() before snapshot()")
        state = {
            "format": SNAPSHOT_FORMAT,
            "family": self.family.name,
            "harness": self.harness.name,
            "task": self._task.to_json(),
            "world": self._world.to_json() if self._world is not None else None,
            "steps": self._steps, "tokens": self._tokens, "calls": self._calls,
            "terminated": self._terminated, "truncated": self._truncated,
            "answer": self._answer,
            "records": self._records,
            "verdict": self._verdict,
            "system_prompt": self._system_prompt,
            "initial_observation": self._initial_observation,
            "last_observation": self._last_observation,
            "rng": self._rng.getstate(),
        }
        members = {"episode.json": json.dumps(state, sort_keys=True).encode(),
                   "workspace.tar": self._sandbox.pack()}
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for name, data in members.items():
                info = tarfile.TarInfo(name)
                info.size, info.mtime, info.mode = len(data), 0, 0o600
                tar.addfile(info, io.BytesIO(data))
        return gzip.compress(buf.getvalue(), mtime=0)

    def snapshot_limit(self) -> int:
        """The largest snapshot (compressed or not) `restore` accepts: the workspace's disk limit plus
        room for the episode record."""
        return self.config.limits.disk_bytes + MAX_EPISODE_JSON_BYTES

    def restore(self, blob: bytes) -> str:
        """Continue the episode saved in `blob`; returns its last observation."""
        state, workspace = self._read_snapshot(blob)
        if state.get("format") != SNAPSHOT_FORMAT:
            raise ValueError(f"snapshot format {state.get('format')!r}; this code reads {SNAPSHOT_FORMAT!r}")
        if state.get("family") != self.family.name or state.get("harness") != self.harness.name:
            raise ValueError(
                f"the snapshot is of {state.get('family')!r} in harness {state.get('harness')!r}; restore it into "
                f"envs.make_env({state.get('family')!r}, harness={state.get('harness')!r})")
        try:
            task = Task.from_json(state["task"])
            generated = self.family.generate(task.seed)
        except Exception as e:  # noqa: BLE001 - any malformed task record is a bad blob
            raise ValueError(f"the snapshot's task cannot be read ({type(e).__name__}: {e})") from None
        if json.loads(json.dumps(generated.to_json())) != state["task"]:
            # The hidden tests and the verifier's spec come from the generator, never from the blob.
            raise ValueError(f"the snapshot's task differs from {self.family.name}'s task for seed {task.seed}; "
                             "snapshots can only restore generated tasks")
        try:
            self._restore_state(state, workspace, generated)
        except (KeyError, TypeError, ValueError, OSError) as e:
            self.close()
            self._task = None
            raise ValueError(f"not a valid envs snapshot ({type(e).__name__}: {e})") from None
        return self._last_observation

    def _read_snapshot(self, blob: bytes) -> tuple[dict, bytes]:
        """(episode state, workspace tar) of a blob, decompressing at most snapshot_limit() bytes."""
        limit = self.snapshot_limit()
        if not isinstance(blob, (bytes, bytearray)):
            raise ValueError("a snapshot is bytes from env.snapshot()")
        if len(blob) > limit:
            raise ValueError(f"the snapshot is {len(blob)} bytes; the limit is {limit}")
        try:
            d = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)
            raw = d.decompress(bytes(blob), limit + 1)
            if len(raw) > limit or d.unconsumed_tail:
                raise ValueError(f"the snapshot decompresses to more than {limit} bytes")
            members = {}
            with tarfile.open(fileobj=io.BytesIO(raw), mode="r") as tar:
                for m in tar:
                    if m.name not in ("episode.json", "workspace.tar") or not m.isfile() or m.name in members:
                        raise ValueError(f"unexpected snapshot member {m.name[:100]!r}")
                    members[m.name] = tar.extractfile(m).read()
            if len(members) != 2:
                raise ValueError("a snapshot holds episode.json and workspace.tar")
            if len(members["episode.json"]) > MAX_EPISODE_JSON_BYTES:
                raise ValueError("episode.json is too large")
            state = json.loads(members["episode.json"])
            if not isinstance(state, dict):
                raise ValueError("episode.json is not an object")
        except (OSError, EOFError, zlib.error, tarfile.TarError, ValueError, RecursionError, UnicodeError) as e:
            raise ValueError(f"not an envs snapshot ({type(e).__name__}: {e})") from None
        return state, members["workspace.tar"]

    def _restore_state(self, state: dict, workspace: bytes, task: Task) -> None:
        self._new_sandbox()
        self._sandbox.unpack(workspace)
        self._task = task
        self._world = World.from_json(state["world"]) if state["world"] is not None else None
        self._steps, self._tokens, self._calls = state["steps"], state["tokens"], state["calls"]
        self._terminated, self._truncated = state["terminated"], state["truncated"]
        self._answer = state["answer"]
        self._records = state["records"]
        self._verdict = state["verdict"]
        self._system_prompt = state["system_prompt"]
        self._initial_observation = state["initial_observation"]
        self._last_observation = state["last_observation"]
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    # --- records -----------------------------------------------------------------------------------
    def state_digest(self) -> str:
        """sha256 of the episode state: workspace tree, app world, counters and answer."""
        state = {"workspace": self._sandbox.digest(),
                 "world": self._world.digest() if self._world is not None else None,
                 "usage": [self._steps, self._tokens, self._calls], "answer": self._answer,
                 "done": [self._terminated, self._truncated]}
        return hashlib.sha256(json.dumps(state, sort_keys=True).encode()).hexdigest()

    def trajectory(self) -> dict[str, Any]:
        """The episode as a JSON-ready record (actions, observations, rewards, verifier result)."""
        if self._task is None:
            raise RuntimeError("call reset() before trajectory()")
        t = self._task
        return {
            "format": TRAJECTORY_FORMAT,
            "env": self.family.name,
            "task_id": t.id,
            "family": t.family,
            "seed": t.seed,
            "domain": t.domain,
            "difficulty": t.difficulty,
            "harness": self.harness.name,
            "instruction": t.instruction,
            "system_prompt": self._system_prompt,
            "initial_observation": self._initial_observation,
            "steps": self._records,
            "reward": sum(r["reward"] for r in self._records),
            "terminated": self._terminated,
            "truncated": self._truncated,
            "answer": self._answer,
            "usage": self.usage(),
            "verifier": self._verdict,
            "final_state_sha256": self.state_digest(),
        }

    def close(self) -> None:
        if self._sandbox is not None:
            self._sandbox.close()
            self._sandbox = None

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
