"""The draft targets what is served (k3model/train/draft.py): trained against the packed MXFP4 export
that `k3 serve` loads, its teacher is that forward's own distribution, not the float student's;
held-out prompts are the first turns of envs tasks in the conversation format policies read."""

import pytest
import torch

from datagen.sft import EFFORTS
from k3model.draft import draft_from_mtp, load_draft
from k3model.engine import SamplingConfig, generate
from k3model.quantize import export_quantized, load_quantized
from k3model.speculative import speculative_generate
from k3model.train.draft import (DraftTrainConfig, chat_prompts, own_generations, prompts_from_demonstrations,
                                 target_next, train)

from tests.k3model.test_model import smoke_model


@pytest.fixture(scope="module")
def float_and_served(tmp_path_factory):
    """A smoke student and its MXFP4 export (the rest bf16) loaded as serving loads it."""
    student = smoke_model(4)
    out = tmp_path_factory.mktemp("served") / "mxfp4"
    export_quantized(student, out, other_dtype=torch.bfloat16)
    served, manifest = load_quantized(out)
    return student, served, manifest


@torch.no_grad()
def test_the_drafts_teacher_is_the_served_quantized_forward(float_and_served):
    student, served, _ = float_and_served
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (5, 9, 12)]
    cfg = DraftTrainConfig(gen_tokens=8)
    data = own_generations(served, draft_from_mtp(served), prompts, cfg)
    # The generations are the served model's greedy output (here they differ from the float student's).
    plain = SamplingConfig(max_new_tokens=8)
    served_out = [c.token_ids for c in generate(served, prompts, plain)]
    assert [x[len(p):].tolist() for x, p in zip(data.ids, prompts)] == served_out
    assert served_out != [c.token_ids for c in generate(student, prompts, plain)]
    for ids, features in zip(data.ids, data.features):
        teacher_TV = target_next(served, features.unsqueeze(0))[0]
        served_TV = served(ids.unsqueeze(0)).logits_BTV[0].float().log_softmax(-1)
        float_TV = student(ids.unsqueeze(0)).logits_BTV[0].float().log_softmax(-1)
        torch.testing.assert_close(teacher_TV, served_TV, rtol=0, atol=1e-5)
        assert (teacher_TV - float_TV).abs().max() > 0.1


def test_a_draft_trained_on_the_served_model_is_lossless_on_it(float_and_served, tmp_path):
    _, served, manifest = float_and_served
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 512, (n,), generator=g).tolist() for n in (4, 6, 7, 9, 5, 8)]
    cfg = DraftTrainConfig(steps=2, batch_size=2, ttt_steps=2, gen_tokens=6, eval_every=2)
    result = train(cfg, served, prompts[:4], tmp_path / "draft", eval_prompts=prompts[4:], target_manifest=manifest)
    draft, draft_manifest = load_draft(result.checkpoint_dir, served)
    assert draft_manifest["target"] == {"sha256": manifest["sha256"], "quantization": "k3-mxfp4-experts-v1"}
    assert draft_manifest["draft"]["target_sha256"] == manifest["sha256"]
    sampling = SamplingConfig(max_new_tokens=8)
    for prompt in prompts[4:]:
        expected = generate(served, [prompt], sampling)[0].token_ids
        for k in (1, 3, 5):
            assert speculative_generate(served, draft.eval(), prompt, sampling, k)[0] == expected


def test_chat_prompts_are_the_first_turn_a_demonstration_of_the_task_starts_with(smoke_tok, demos):
    row = demos.slice(0, 1).to_pylist()[0]
    first_turn = prompts_from_demonstrations([row["input_ids"]], [row["loss_mask"]])[0]
    (prompt,) = chat_prompts(smoke_tok, (row["family"],), (row["effort"],), (row["harness"],), 1,
                             row["task_seed"], 10_000)
    assert prompt.ids == first_turn
    assert (prompt.family, prompt.seed, prompt.effort, prompt.harness) == (row["family"], row["task_seed"],
                                                                            row["effort"], row["harness"])


def test_chat_prompts_cover_every_family_effort_and_harness_and_skip_what_does_not_fit(smoke_tok):
    families, harnesses = ("echo_word", "slack_ping"), ("hermes", "codex")
    prompts = chat_prompts(smoke_tok, families, EFFORTS, harnesses, 12, 500_000, 10_000)
    assert len({(p.family, p.effort, p.harness) for p in prompts}) == 12
    assert {p.seed for p in prompts} == set(range(500_000, 500_006))
    cap = min(len(p.ids) for p in prompts if p.family == "slack_ping") - 1
    short = chat_prompts(smoke_tok, families, EFFORTS, harnesses, 3, 500_000, cap)
    assert all(len(p.ids) <= cap for p in short) and all(p.family == "echo_word" for p in short)
    with pytest.raises(ValueError, match="fit in 10 tokens"):
        chat_prompts(smoke_tok, families, EFFORTS, harnesses, 1, 500_000, 10)
