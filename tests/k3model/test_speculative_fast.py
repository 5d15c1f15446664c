"""The speculative loop's shortcuts against the plain computations they replace."""

import torch

from k3model.cache import ModelCache
from k3model.draft import draft_from_mtp

from tests.k3model.test_model import smoke_model


@torch.no_grad()
def test_draft_logits_of_the_last_position_only_are_the_full_forwards_last_row():
    target = smoke_model(11)
    draft = draft_from_mtp(target)
    torch.manual_seed(0)
    f_1TD, ids_1T = torch.randn(1, 9, target.cfg.d_model), torch.randint(0, target.cfg.vocab_size, (1, 9))
    full_cache = ModelCache.empty(draft, 1, capacity=16)
    g_full, logits_full = draft(f_1TD, ids_1T, full_cache)
    last_cache = ModelCache.empty(draft, 1, capacity=16)
    g_last, logits_last = draft(f_1TD, ids_1T, last_cache, last_only=True)
    assert logits_last.shape == (1, 1, target.cfg.vocab_size)
    assert torch.equal(g_full, g_last)
    torch.testing.assert_close(logits_last[:, 0], logits_full[:, -1], rtol=1e-5, atol=1e-6)
    # The caches hold the same entries either way.
    assert last_cache.lengths == full_cache.lengths == [9]
    assert torch.equal(last_cache.layers[0].buffer_BSL, full_cache.layers[0].buffer_BSL)
