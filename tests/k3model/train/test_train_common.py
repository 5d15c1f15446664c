"""The shared training pieces: optimizer groups, the clipped step, the metric buffer, exact resume."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from k3model.train.common import (MetricBuffer, build_optimizer, load_weights, optimizer_step,
                                  restore_train_state, resume, resume_point, save_state)


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 1))


def test_matrices_decay_and_vectors_do_not():
    net = _net()
    opt = build_optimizer(net, 1e-3, 0.1)
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.dim() >= 2 for p in decay["params"]) and all(p.dim() == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(net.parameters()))


def test_the_step_clips_to_the_global_norm_and_reports_the_norm_before():
    net = _net()
    opt = build_optimizer(net, 0.0, 0.0)  # lr 0: the weights stay, the gradients remain to inspect
    x = torch.randn(16, 4) * 100
    norm = optimizer_step(net, opt, net(x).pow(2).mean(), grad_clip=0.5)
    after = torch.sqrt(sum(p.grad.pow(2).sum() for p in net.parameters()))
    assert norm > 0.5 and abs(float(after) - 0.5) < 1e-4
    seen = []
    optimizer_step(net, opt, net(x).mean(), 1.0, reduce=lambda m: seen.append(m))
    assert seen == [net]


def test_flushed_metrics_equal_float_of_each_tensor_bit_for_bit():
    buf = MetricBuffer()
    values = [torch.tensor(1 / 3), torch.tensor(2.0, dtype=torch.bfloat16) / 3,
              torch.tensor(7.1, dtype=torch.float64)]
    buf.append({"a": values[0], "b": values[1], "step": 1}, tokens=10)
    buf.append({"a": values[2], "c": 0.25, "step": 2}, tokens=10)
    assert len(buf) == 2
    rows = buf.flush()
    assert len(buf) == 0 and buf.tokens == 20 and buf.seconds > 0
    assert rows[0]["a"] == float(values[0]) and rows[0]["b"] == float(values[1]) and rows[1]["a"] == float(values[2])
    assert rows[1]["c"] == 0.25 and rows[1]["step"] == 2 and isinstance(rows[1]["step"], int)
    assert rows[0]["perf/tokens_per_s"] == rows[1]["perf/tokens_per_s"] > 0
    assert MetricBuffer.read({"x": torch.tensor(0.1)}) == {"x": float(torch.tensor(0.1))}


def test_a_resumed_run_takes_the_steps_an_uninterrupted_one_takes(tmp_path):
    def run(steps, net, opt, start=0):
        losses = []
        for _ in range(start, steps):
            x = torch.randn(8, 4)  # from the global RNG, which the train state carries
            loss = net(x).pow(2).mean()
            optimizer_step(net, opt, loss, 1.0)
            losses.append(float(loss.detach()))
        return losses

    torch.manual_seed(1)
    net = _net()
    opt = build_optimizer(net, 1e-2, 0.1)
    full = run(6, net, opt)

    torch.manual_seed(1)
    net2 = _net()
    opt2 = build_optimizer(net2, 1e-2, 0.1)
    first = run(3, net2, opt2)
    save_state(tmp_path / "last", net2, {"config": {}}, opt2, step=3, extra={"losses": first})
    run(2, net2, opt2)  # work lost when the run is killed

    assert resume_point(tmp_path / "nothing") is None
    state = resume_point(tmp_path / "last")
    net3 = _net()
    load_weights(net3, tmp_path / "last")
    opt3 = build_optimizer(net3, 1e-2, 0.1)
    restore_train_state(state, opt3)
    assert state.step == 3 and state.extra["losses"] == first
    assert first + run(6, net3, opt3, start=state.step) == full


def _hostile_extra(tmp_path, extra, weights=None):
    """A resume checkpoint whose train state parses but whose fields this loop cannot use."""
    net = _net()
    opt = build_optimizer(net, 1e-2, 0.1)
    save_state(tmp_path / "last", weights or net, {"config": {}}, opt, step=3, extra=extra)
    return net


@pytest.mark.parametrize("case", ["history a string", "tokens negative", "tokens missing", "other model"])
def test_resume_sets_aside_a_train_state_whose_fields_it_cannot_use(tmp_path, case, caplog):
    extra = {"history": [{"train/loss": 1.0}], "tokens_seen": 96}
    other = None
    if case == "history a string":
        extra["history"] = "x" * 10
    elif case == "tokens negative":
        extra["tokens_seen"] = -5
    elif case == "tokens missing":
        del extra["tokens_seen"]
    else:
        other = nn.Sequential(nn.Linear(4, 3))
    net = _hostile_extra(tmp_path, extra, other)
    logged = []
    with pytest.warns(RuntimeWarning, match="is damaged"):
        run = resume(net, tmp_path / "last", lambda step, row: logged.append(row))
    assert run.state is None and run.step == 0 and not logged
    assert "is damaged" in caplog.text  # the reason is logged, not only warned
    [aside] = list(tmp_path.iterdir())
    assert aside.name.startswith("last.damaged-")


def test_resume_takes_a_sound_train_state(tmp_path):
    net = _hostile_extra(tmp_path, {"history": [{"train/loss": 1.0}], "tokens_seen": 96})
    run = resume(net, tmp_path / "last", lambda step, row: None)
    assert run.step == 3 and run.tokens_seen == 96 and run.history == [{"train/loss": 1.0}]
