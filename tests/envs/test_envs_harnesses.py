"""Harnesses: render -> parse round trips, distinct styles, and hostile text that never raises."""

import json
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import envs
from envs.actions import AppCall, Edit, Finish, Read, Run, Search, Write, from_dict, to_dict
from envs.apps import app_tools
from envs.adversarial import UNCLOSED_UNITS, bad_number_calls, hostile_texts, raw_call
from envs.harnesses import HARNESSES, ToolSet, get_harness
from envs.harnesses.base import MAX_INT
from envs.harnesses.codex import parse_patch

FULL = ToolSet(files=True, run=True, apps=("gmail", "notion", "slack", "canvas", "clock"))
# Text that tries to break every syntax at once: special tokens, closing tags, patch headers, quotes.
NASTY = st.sampled_from([
    "</tool_call>", "<|tool_call_end|>", "<|tool_calls_section_end|>", "</parameter>", "</invoke>",
    "*** End Patch", "*** Begin Patch", "@@", '"', "\\", "{", "}", "\n", "&amp;", "&lt;", "\r\n", "\x00",
    "\u2028", "é", "🙂", "+", "-", " ",
])
TEXT = st.lists(st.one_of(st.text(max_size=12), NASTY), max_size=8).map("".join)
PATH = st.lists(st.from_regex(r"[A-Za-z0-9_.-]{1,8}", fullmatch=True).filter(lambda s: s not in (".", "..")),
                min_size=1, max_size=3).map("/".join)


@st.composite
def app_calls(draw):
    app = draw(st.sampled_from(FULL.apps))
    schema = draw(st.sampled_from(sorted(app_tools(app).values(), key=lambda s: s.name)))
    args = {}
    for p in schema.params:
        if not p.required and draw(st.booleans()):
            continue
        if p.type == "string":
            args[p.name] = draw(TEXT)
        elif p.type == "integer":
            args[p.name] = draw(st.integers(-5, 10**6))
        elif p.type == "boolean":
            args[p.name] = draw(st.booleans())
        else:
            args[p.name] = draw(st.lists(TEXT, min_size=1, max_size=3))
    return AppCall(app, schema.name, args)


ACTIONS = st.one_of(
    st.builds(Read, PATH, st.integers(1, 5000), st.one_of(st.none(), st.integers(1, 5000))),
    st.builds(Write, PATH, TEXT),
    st.builds(Edit, PATH, TEXT.filter(bool), TEXT, st.booleans()),
    st.builds(Run, TEXT, st.one_of(st.none(), st.integers(1, 600))),
    st.builds(Search, TEXT.filter(bool), st.one_of(st.just("."), PATH)),
    app_calls(),
    st.builds(Finish, TEXT),
)


@pytest.mark.parametrize("harness", HARNESSES)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(actions=st.lists(ACTIONS, min_size=1, max_size=4))
def test_render_parse_round_trip(harness, actions):
    h = get_harness(harness)
    text = h.render_calls(actions)
    calls = h.parse(text, FULL)
    assert [c.error for c in calls] == [None] * len(calls)
    assert [c.action for c in calls] == actions


@pytest.mark.parametrize("harness", HARNESSES)
@settings(max_examples=150, deadline=None)
@given(text=st.one_of(st.text(max_size=400), TEXT, st.binary(max_size=200).map(lambda b: b.decode("latin-1"))))
def test_parse_never_raises(harness, text):
    calls = get_harness(harness).parse(text, FULL)
    assert isinstance(calls, list)
    for c in calls:
        assert (c.action is None) != (c.error is None)


def _mutations(text: str):
    """Truncations and character swaps of a valid call: almost-valid syntax."""
    yield from (text[:k] for k in range(0, len(text), max(1, len(text) // 25)))
    for k in range(0, len(text), max(1, len(text) // 25)):
        yield text[:k] + "}" + text[k + 1:]
        yield text[:k] + "<" + text[k:]


@pytest.mark.parametrize("harness", HARNESSES)
def test_near_miss_syntax_never_raises(harness):
    h = get_harness(harness)
    text = h.render_calls([Edit("a.py", "x = 1", "x = 2"), AppCall("gmail", "send", {"to": ["a@b"], "subject": "s",
                                                                                      "body": "b"})])
    for bad in _mutations(text):
        for c in h.parse(bad, FULL):
            assert (c.action is None) != (c.error is None)


@pytest.mark.parametrize("harness", HARNESSES)
def test_hostile_inputs_give_errors_not_exceptions(harness):
    h = get_harness(harness)
    deep = "[" * 100_000
    read = h.render_calls([Read("a.py")])
    cases = [
        "", "finish", deep, "{" * 50_000, '{"a": "' * 5_000, "x" * 300_000,
        read.replace("a.py", "../../etc/passwd"),
        h.render_calls([AppCall("nosuchapp", "tool", {})]) if harness != "openclaw" else '<invoke name="nosuchapp"></invoke>',
        h.render_calls([Finish()]) * 40,  # more calls than one turn may hold
    ]
    for text in cases:
        calls = h.parse(text, FULL)
        assert all((c.action is None) != (c.error is None) for c in calls)
    over = h.parse(h.render_calls([Finish()]) * 40, FULL)
    assert len(over) == 33 and over[-1].error is not None


@pytest.mark.parametrize("harness", HARNESSES)
def test_wrong_arguments_are_reported(harness):
    h = get_harness(harness)
    name = h.TOOLS["read"].name
    # A read with no path, and a read with an argument the tool does not have.
    for args in ({}, {"nonsense": 1, **({"file_path": "/workspace/a"} if h.absolute_paths else {"path": "a"})}):
        err = None
        if harness == "claude_code":
            err = h.parse(json.dumps({"type": "tool_use", "id": "t", "name": name, "input": args}), FULL)[0].error
        elif harness == "hermes":
            err = h.parse("<tool_call>" + json.dumps({"name": name, "arguments": args}) + "</tool_call>", FULL)[0].error
        elif harness == "codex":
            err = h.parse(json.dumps({"type": "function_call", "name": name, "arguments": json.dumps(args)}), FULL)[0].error
        elif harness == "kimi_code":
            err = h.parse(f"<|tool_call_begin|>functions.{name}:0<|tool_call_argument_begin|>{json.dumps(args)}"
                          "<|tool_call_end|>", FULL)[0].error
        else:
            params = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in args.items())
            err = h.parse(f'<invoke name="{name}">{params}</invoke>', FULL)[0].error
        assert err


@pytest.mark.parametrize("harness", HARNESSES)
def test_tools_outside_the_task_are_refused(harness):
    h = get_harness(harness)
    text = h.render_calls([Run("ls"), AppCall("gmail", "search", {})])
    calls = h.parse(text, ToolSet(files=True))
    assert all(c.action is None and c.error for c in calls)


def test_styles_differ():
    ts = ToolSet(files=True, run=True, apps=("gmail",))
    names = {h: {d.name for d in get_harness(h).tool_defs(ts)} for h in HARNESSES}
    for a in HARNESSES:
        for b in HARNESSES:
            if a < b:
                assert names[a] != names[b], (a, b)
    act = [Read("src/a.py"), AppCall("gmail", "search", {"query": "x"})]
    texts = {h: get_harness(h).render_calls(act) for h in HARNESSES}
    assert len(set(texts.values())) == len(HARNESSES)
    assert "/workspace/src/a.py" in texts["claude_code"] and "/workspace/src/a.py" in texts["kimi_code"]
    assert "<tool_call>" in texts["hermes"] and "<invoke" in texts["openclaw"]
    assert "<|tool_call_begin|>" in texts["kimi_code"] and '"function_call"' in texts["codex"]
    prompts = {h: get_harness(h).render_system_prompt(ts) for h in HARNESSES}
    for h, p in prompts.items():
        for d in get_harness(h).tool_defs(ts):
            assert d.name in p
    assert set(envs.HARNESSES) == set(HARNESSES) and len(HARNESSES) == 5


def test_codex_patch_grammar():
    acts = parse_patch("*** Begin Patch\n*** Add File: n.py\n+a\n+b\n*** Update File: m.py\n@@\n ctx\n-old\n+new\n"
                       "@@ replace_all\n-x\n+y\n*** End Patch\n")
    assert acts == [Write("n.py", "a\nb"), Edit("m.py", "ctx\nold", "ctx\nnew"), Edit("m.py", "x", "y", True)]
    h = get_harness("codex")
    for bad in ["*** Begin Patch\n*** Delete File: a\n*** End Patch", "no patch", "*** Begin Patch\n+x",
                "*** Begin Patch\n*** Update File: a\n*** End Patch"]:
        call = json.dumps({"type": "custom_tool_call", "name": "apply_patch", "input": bad})
        (c,) = h.parse(call, FULL)
        assert c.error and c.action is None


def test_action_dicts_round_trip():
    for a in [Read("a", 2, 3), Write("b", "x"), Edit("c", "o", "n", True), Run("ls", 3), Search("p"),
              AppCall("gmail", "search", {"query": "q"}), Finish("42")]:
        d = to_dict(a)
        assert json.loads(json.dumps(d)) == d and from_dict(d) == a
    with pytest.raises(ValueError):
        from_dict({"kind": "teleport"})


# --- adversarial text: total and linear parsers ------------------------------------------------
UNIT = st.sampled_from(UNCLOSED_UNITS)
HOSTILE = st.lists(st.one_of(UNIT, NASTY, st.text(max_size=6), st.sampled_from(["²", "١", "1" * 30, "e400"])),
                   max_size=40).map("".join)


@pytest.mark.parametrize("harness", HARNESSES)
@settings(max_examples=80, deadline=None)
@given(text=HOSTILE, reps=st.integers(1, 200))
def test_parse_is_total_on_adversarial_text(harness, text, reps):
    h = get_harness(harness)
    for t in (text, text * reps, h.render_calls([Read("a.py")]) + text * reps):
        calls = h.parse(t, FULL)
        assert len(calls) <= 33
        assert all((c.action is None) != (c.error is None) for c in calls)


@pytest.mark.parametrize("harness", HARNESSES)
def test_integers_are_ascii_and_capped(harness):
    h = get_harness(harness)
    for text in bad_number_calls(h):
        for c in h.parse(text, FULL):
            assert (c.action is None) != (c.error is None)
            n = getattr(c.action, "offset", None) or getattr(c.action, "timeout", None)
            assert n is None or (type(n) is int and 1 <= n <= MAX_INT), (text, c)
    # Plain ASCII digits in a string still work, with spaces around them.
    (c,) = h.parse(raw_call(h, *_read_with_offset(h, " 12 ")), FULL)
    assert c.action == Read("a.py", 12)


def _read_with_offset(h, value):
    tool, args = h.encode(Read("a.py", 3))
    return tool, {k: (value if v == 3 else v) for k, v in args.items()}


def _plain_scan(text: str) -> int:
    """One pass of Python over the text: the yardstick of a linear parse on this machine, now."""
    n = 0
    for ch in text:
        n += ch == "<"
    return n


def _best_time(fn, repeats: int = 2) -> float:
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def test_hostile_messages_parse_in_linear_time():
    # The old regex parsers took 23-57 s on one of these (about 10^4 plain scans); a linear parser is
    # about 0.1-10 scans. 150 scans is 0.5 s on an idle machine, and the ratio holds on a loaded one.
    texts = hostile_texts(200_000)
    for harness in HARNESSES:
        h = get_harness(harness)
        for label, text in texts.items():
            scan = _best_time(lambda: _plain_scan(text))
            took = _best_time(lambda: h.parse(text, FULL))
            assert took < 150 * scan, (harness, label, took, scan)
