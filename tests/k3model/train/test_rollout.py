"""The envs policy adapter: episodes kept as the exact sampled ids, one batched decode per turn."""

from dataclasses import replace

import torch

import envs
from k3model.engine import SamplingConfig, score
from k3model.model import K3Model
from k3model.config import get_profile
from k3model.train.rollout import TokenFormat, TokenPolicy

# A byte-level format: ids 0–15 are specials, byte b is id 16 + b. Ids the model samples outside the
# byte range reach the env as "?" — they still stay in the episode exactly as sampled.
USER, END, ASSISTANT = 1, 2, 3
BYTES = TokenFormat(
    encode=lambda text: [16 + b for b in text.encode()],
    decode=lambda ids: bytes(i - 16 if 16 <= i < 272 else ord("?") for i in ids).decode(errors="replace"),
    stop_id=END, observation_start=(USER,), observation_end=(END, ASSISTANT))


def test_episodes_step_together_and_keep_the_sampled_ids_and_logprobs():
    torch.manual_seed(0)
    # The smoke profile's 512-token context would end these ~2,000-byte episodes at once; the same
    # model under another name has no context limit.
    model = K3Model(replace(get_profile("smoke").model, name="smoke-unbounded")).eval()
    names = ["slack_post", "gmail_label", "arith_word"]
    env_list = [envs.make_env(name, seed=0, max_steps=3) for name in names]
    policy = TokenPolicy(model, BYTES, SamplingConfig(max_new_tokens=6, temperature=1.0),
                         generator=torch.Generator().manual_seed(1))
    seeds = {name: s for s, name in enumerate(names)}
    episodes = policy.run(env_list, seeds=[seeds[n] for n in names])

    assert policy.decode_batches == [3, 3, 3]  # one batched decode per turn across the three envs
    for env, ep in zip(env_list, episodes):
        assert ep.truncated and ep.stop_reason == "truncated" and len(ep.turns) == 3
        record = ep.record
        assert [s["action"] for s in record["steps"]] == [t.text for t in ep.turns]
        # The sequence is the observations tokenized once each, and the sampled ids as sampled.
        first = BYTES.observation(envs.make_env(env.name, seed=0).reset(seed=seeds[env.name]))
        assert ep.token_ids[: len(first)] == first and ep.turns[0].start == len(first)
        pos = 0
        for k, turn in enumerate(ep.turns):
            assert ep.token_ids[turn.start: turn.start + len(turn.token_ids)] == turn.token_ids
            assert all(ep.generated[turn.start: turn.start + len(turn.token_ids)])
            assert not any(ep.generated[pos: turn.start])
            pos = turn.start + len(turn.token_ids)
            ids, mask, logps = ep.turn_sample(k)
            assert len(ids) == len(mask) == len(logps) == pos and sum(mask) == len(turn.token_ids)
        for k in range(2):  # each later observation sits, encoded once, right before the next turn
            obs_ids = BYTES.observation(record["steps"][k]["observation"])
            assert ep.token_ids[ep.turns[k + 1].start - len(obs_ids): ep.turns[k + 1].start] == obs_ids
        # The recorded model log-probabilities are the training forward's, on the kept ids.
        gen = [i for i, g in enumerate(ep.generated) if g]
        scored = score(model, [ep.token_ids], [gen[0]])[0]
        offset = [i - gen[0] for i in gen]
        torch.testing.assert_close(torch.tensor([scored[o] for o in offset]),
                                   torch.tensor([ep.model_logprobs[i] for i in gen]), rtol=0, atol=1e-5)
