"""The engine's CUDA path: the decode loop over a captured step (engine.GraphStep) gives the eager
loop's tokens, at every budget, and fp32 models (whose grouped expert GEMM cannot be captured)
decode eagerly. Runs on a machine with a GPU only."""

import pytest
import torch

from k3model.config import get_profile
from k3model.engine import SamplingConfig, decode, generate, prefill
from k3model.model import K3Model

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


def _model(dtype):
    torch.manual_seed(0)
    return K3Model(get_profile("smoke").model).cuda().to(dtype).eval()


def _prompts(model):
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, model.cfg.vocab_size, (n,), generator=g).tolist() for n in (5, 12, 7)]


@pytest.mark.parametrize("new", [1, 2, 3, 9])
def test_the_captured_decode_gives_the_eager_tokens_at_every_budget(new):
    # Budgets below the warm-up's three steps once overran the static cache (a device-side assert).
    model = _model(torch.bfloat16)
    prompts = _prompts(model)
    cfg = SamplingConfig(max_new_tokens=new)
    graphed = generate(model, prompts, cfg)
    cache, logits_BV = prefill(model, prompts, capacity=max(map(len, prompts)) + new)
    # keep_caches takes the eager loop (it pads to MIN_ROWS rows: GEMM rounding may differ in bf16).
    eager, _ = decode(model, cache, logits_BV, [cfg] * len(prompts), [new] * len(prompts), keep_caches=True)
    for g, e in zip(graphed, eager):
        assert g.token_ids == e.token_ids and len(g.token_ids) == new
        torch.testing.assert_close(torch.tensor(g.model_logprobs), torch.tensor(e.model_logprobs), atol=3e-2, rtol=0)


def test_an_fp32_model_decodes_on_cuda():
    model = _model(torch.float32)
    out = generate(model, _prompts(model), SamplingConfig(max_new_tokens=4))
    assert [len(c.token_ids) for c in out] == [4, 4, 4]
