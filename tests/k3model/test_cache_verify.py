"""The fast speculative verify of a KDA layer (one C call, states rebuilt on rollback) against the
simple one (the decode step token by token, every position's state kept)."""

import pytest
import torch

from k3model.config import get_profile
from k3model.kda_layer import KDALayer, KDAState, VerifyPositions
from kernels.kda.cpu import kda_cpu, kda_cpu_backend


def _tensors(state: KDAState) -> list[torch.Tensor]:
    return [state.conv_q, state.conv_k, state.conv_v, state.recurrent]


@torch.no_grad()
def test_verify_positions_rebuild_the_token_by_token_states(monkeypatch):
    torch.manual_seed(3)
    layer = KDALayer(get_profile("smoke").model.kda()).eval()
    x_prev, x_BTD = torch.randn(1, 5, layer.cfg.d_model), torch.randn(1, 6, layer.cfg.d_model)
    if kda_cpu_backend(torch.zeros(1, 1, 1, layer.cfg.head_dim)) != "c":
        pytest.skip("the C recurrence did not build here (kernels/native.py)")
    _, before = layer(x_prev, layer.empty_state(1, "cpu", torch.float32))
    before.keep_positions = True
    y_fast, fast = layer(x_BTD, before)
    assert isinstance(fast.positions, VerifyPositions) and len(fast.positions) == 5
    monkeypatch.setenv("K3_CPU_KERNELS", "torch")  # the token loop: every position's state kept
    y_slow, slow = layer(x_BTD, before)
    assert isinstance(slow.positions, list)
    torch.testing.assert_close(y_fast, y_slow, rtol=1e-5, atol=1e-6)
    for t in range(5):
        rebuilt, kept = fast.positions.state(t), slow.positions[t]
        for a, b in zip(_tensors(rebuilt)[:3], _tensors(kept)[:3]):
            assert torch.equal(a, b)  # conv windows: the same projections, sliced
        torch.testing.assert_close(rebuilt.recurrent, kept.recurrent, rtol=1e-5, atol=1e-6)
        assert not rebuilt.keep_positions and rebuilt.positions is None
    for a, b in zip(_tensors(fast), _tensors(slow)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    # The replay is the forward's own state at t: the recurrence over t + 1 tokens, then the rest
    # from there, ends bitwise where one call over all of them ends.
    monkeypatch.delenv("K3_CPU_KERNELS")
    q, k, v, g, beta = fast.positions.inputs
    _, whole = kda_cpu(q, k, v, g, beta, initial_state=before.recurrent, output_final_state=True)
    rest = [x[:, 3:] for x in (q, k, v, g, beta)]
    _, chained = kda_cpu(*rest, initial_state=fast.positions.state(2).recurrent, output_final_state=True)
    assert torch.equal(whole, chained) and torch.equal(whole, fast.recurrent)
