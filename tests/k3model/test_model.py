"""The assembled model: decode equivalence, attention residuals at init, causality, bad input."""

import pytest
import torch

from k3model.attn_res import AttnRes
from k3model.config import get_profile
from k3model.generate import GenerationConfig, generate
from k3model.model import K3Model


def smoke_model(seed=0):
    torch.manual_seed(seed)
    model = K3Model(get_profile("smoke").model).eval()
    # Give the zero-initialized pseudo-queries random values so the test exercises non-uniform mixing.
    for m in model.modules():
        if isinstance(m, AttnRes):
            torch.nn.init.normal_(m.query, std=0.5)
    return model


def test_layer_layout_is_three_kda_to_one_mla_with_first_layer_dense():
    cfg = get_profile("k3").model
    kinds = ["mla" if cfg.is_mla_layer(i) else "kda" for i in range(cfg.n_layers)]
    assert kinds.count("kda") == 69 and kinds.count("mla") == 24
    assert kinds[:4] == ["kda", "kda", "kda", "mla"] and kinds[-1] == "mla"
    assert [cfg.is_dense_layer(i) for i in range(3)] == [True, False, False]


def test_prefill_then_decode_equals_one_full_forward_text():
    model = smoke_model()
    ids = torch.randint(0, model.cfg.vocab_size, (2, 40))
    with torch.no_grad():
        full = model(ids).logits_BTV
        out = model(ids[:, :25], use_cache=True)
        step_logits = [out.logits_BTV]
        cache = out.cache
        for t in range(25, 40):
            out = model(ids[:, t:t + 1], cache=cache)
            cache = out.cache
            step_logits.append(out.logits_BTV)
    stepped = torch.cat(step_logits, dim=1)
    assert cache.length == 40
    torch.testing.assert_close(stepped, full, rtol=1e-4, atol=1e-4)


def test_prefill_then_decode_equals_one_full_forward_with_an_image():
    model = smoke_model(1)
    vcfg = model.cfg.vision
    n_img = vcfg.tokens_per_image
    ids = torch.randint(5, model.cfg.vocab_size, (1, 30))
    mask = torch.zeros(1, 30, dtype=torch.bool)
    mask[0, 3:3 + n_img] = True
    images = torch.randn(1, 3, vcfg.image_size, vcfg.image_size)
    with torch.no_grad():
        full = model(ids, images, mask).logits_BTV
        out = model(ids[:, :20], images, mask[:, :20], use_cache=True)
        pieces, cache = [out.logits_BTV], out.cache
        for t in range(20, 30):
            out = model(ids[:, t:t + 1], cache=cache)
            pieces.append(out.logits_BTV)
            cache = out.cache
    torch.testing.assert_close(torch.cat(pieces, 1), full, rtol=1e-4, atol=1e-4)
    # The image changes what follows it.
    with torch.no_grad():
        other = model(ids, torch.randn_like(images), mask).logits_BTV
    assert not torch.allclose(other[:, -1], full[:, -1])


def test_attention_residuals_average_their_sources_uniformly_at_init():
    torch.manual_seed(0)
    res = AttnRes(16)
    sources = [torch.randn(2, 5, 16) * s for s in (1.0, 3.0, 0.1)]
    alpha = res.weights(sources)
    torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / 3))
    torch.testing.assert_close(res(sources), sum(sources) / 3)
    model = K3Model(get_profile("smoke").model)
    queries = [m.query for m in model.modules() if isinstance(m, AttnRes)]
    # Two per layer, one final, and three per MTP block (two sublayers and its output): all start at zero.
    assert len(queries) == 2 * model.cfg.n_layers + 1 + 3 * model.cfg.mtp_depth
    assert all(bool((q == 0).all()) for q in queries)


def test_model_is_causal_outputs_and_gradients():
    model = smoke_model(2)
    model.train()
    ids = torch.randint(0, model.cfg.vocab_size, (1, 50))
    ids2 = ids.clone()
    ids2[:, 30:] = torch.randint(0, model.cfg.vocab_size, (1, 20))
    def prefix(ids):
        model.zero_grad()
        emb = model.embed(ids).detach().requires_grad_(True)
        # Route the embedding through a hook so we can read its gradient.
        handle = model.embed.register_forward_hook(lambda m, i, o: emb)
        try:
            logits = model(ids).logits_BTV
        finally:
            handle.remove()
        logits[:, :30].sum().backward()
        return logits[:, :30].detach(), emb.grad[:, :30]
    (l1, g1), (l2, g2) = prefix(ids), prefix(ids2)
    torch.testing.assert_close(l1, l2, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(g1, g2, rtol=1e-5, atol=1e-5)


def test_generate_greedy_matches_argmax_of_full_forward():
    model = smoke_model(3)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 12))
    new = generate(model, ids, GenerationConfig(max_new_tokens=6))
    seq = ids
    with torch.no_grad():
        for _ in range(6):
            nxt = model(seq).logits_BTV[:, -1].argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
    assert torch.equal(new, seq[:, 12:])


def test_loss_has_main_and_mtp_terms_and_backpropagates():
    model = K3Model(get_profile("smoke").model)
    ids = torch.randint(0, model.cfg.vocab_size, (2, 33))
    losses = model.compute_loss(ids)
    assert set(losses) == {"loss/main", "loss/mtp_1", "loss/total"}
    losses["loss/total"].backward()
    assert model.mtp[0].merge.weight.grad is not None
    assert model.vision.patch_embed.weight.grad is None  # no image in this batch


def test_bad_inputs_raise_value_errors():
    model = K3Model(get_profile("smoke").model)
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.zeros(3, dtype=torch.long))
    ids = torch.zeros(1, 10, dtype=torch.long)
    mask = torch.zeros(1, 10, dtype=torch.bool)
    mask[0, :2] = True
    img = torch.zeros(1, 3, 32, 32)
    with pytest.raises(ValueError, match="slot tokens"):
        model(ids, img, mask)
    with pytest.raises(ValueError, match="unknown profile"):
        get_profile("huge")


def _saved_bytes_loss_and_grads(model, ids):
    """Bytes autograd keeps for the backward (parameters excluded), the loss, and every gradient."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen, saved = set(params), [0]

    def pack(t):
        ptr = t.untyped_storage().data_ptr()
        if ptr not in seen:
            seen.add(ptr)
            saved[0] += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model.compute_loss(ids)["loss/total"]
    loss.backward()
    return saved[0], loss.detach(), {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def test_activation_checkpointing_keeps_loss_gradients_and_balancing_stats_and_saves_memory():
    from dataclasses import replace

    cfg = replace(get_profile("smoke").model, vision=None)
    ids = torch.randint(0, cfg.vocab_size, (2, 48), generator=torch.Generator().manual_seed(0))
    runs = {}
    for on in (False, True):
        torch.manual_seed(0)
        model = K3Model(replace(cfg, activation_checkpointing=on)).train()
        runs[on] = (*_saved_bytes_loss_and_grads(model, ids), [m._load_acc_E.clone() for m in model.moe_layers()])
    (bytes_off, loss_off, grads_off, load_off), (bytes_on, loss_on, grads_on, load_on) = runs[False], runs[True]
    assert torch.equal(loss_on, loss_off)
    assert grads_on.keys() == grads_off.keys()
    for name in grads_off:
        torch.testing.assert_close(grads_on[name], grads_off[name], rtol=1e-5, atol=1e-7, msg=name)
    # the routing statistics count each token once, not again in the backward's recomputation
    assert load_off and all(torch.equal(a, b) for a, b in zip(load_on, load_off))
    assert bytes_on < 0.5 * bytes_off, (bytes_on, bytes_off)
