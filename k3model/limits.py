"""What a training run may ask of the machine: lower bounds on the memory of its steps and data.

A config with `batch_size: 10_000_000` or `steps: 10**12` used to be accepted and then exhaust the
machine: it swapped, or the OOM killer ended the run with no message. These are *floors*, counted
from tensors a step cannot do without, so a refusal is certain to be right:

    per step   ≥ B·T·V·4·2    the fp32 logits and their gradient (cross-entropy over the vocabulary)
               + B·T·D·4·L    one fp32 hidden state per layer kept for the backward pass
    packing    ≥ S·B·T·9      the stage's packed rows, held for the whole stage (int64 ids + a bool mask)

(B batch size, T sequence length, V vocabulary, D model width, L layers, S steps.) The step's floor is
compared with the device's memory (the GPU's on CUDA, the RAM otherwise), the packing floor with the
RAM. A config that passes may still be too large: the real peak is several times the floor.
"""

from __future__ import annotations

import os

from k3model.config import ModelConfig

_GIB = 1 << 30


def ram_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def device_bytes(device: str) -> int:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_properties(0).total_memory
    return ram_bytes()


def step_floor_bytes(model: ModelConfig, batch_size: int, seq_len: int) -> int:
    tokens = batch_size * seq_len
    return tokens * model.vocab_size * 4 * 2 + tokens * model.d_model * 4 * model.n_layers


def packing_floor_bytes(steps: int, batch_size: int, seq_len: int) -> int:
    return steps * batch_size * seq_len * 9


def check_fits_machine(model: ModelConfig, steps: int, batch_size: int, seq_len: int, device: str) -> None:
    """ValueError saying what to lower when a stage certainly cannot fit this machine."""
    step, device_mem = step_floor_bytes(model, batch_size, seq_len), device_bytes(device)
    if step > device_mem:
        raise ValueError(
            f"batch_size {batch_size} × seq_len {seq_len} needs at least {step / _GIB:.1f} GiB per step "
            f"(the logits over {model.vocab_size} tokens and their gradient alone), more than this "
            f"machine's {device_mem / _GIB:.1f} GiB of {'GPU' if device.startswith('cuda') else 'RAM'}: "
            f"lower batch_size (at most {max(device_mem * batch_size // step, 1)} would pass this bound)")
    packed, ram = packing_floor_bytes(steps, batch_size, seq_len), ram_bytes()
    if packed > ram:
        raise ValueError(
            f"steps {steps} × batch_size {batch_size} rows of {seq_len} tokens need at least "
            f"{packed / _GIB:.1f} GiB to pack, more than this machine's {ram / _GIB:.1f} GiB of RAM: "
            f"lower steps (at most {max(ram * steps // packed, 1)} would pass this bound) or batch_size")


# An RL or distillation step holds every episode of its first draw until the update. A finished
# episode keeps four Python lists over its whole sequence, prompt included (ids, generated mask and
# two log-prob lists: 32 bytes of list slots a token, more for the int and float objects), plus its
# env's transcript. Measured (tracemalloc, retained after `play_tasks`, smoke tokenizer, a random
# smoke model, hermes): 59 KB for the shortest (echo_word, 642 tokens), 69 KB slack_ping, 120 KB
# write_constant. About half the least of them is the floor; a larger vocabulary tokenizes the
# same prompt into fewer tokens, so on tiny/small it is an estimate rather than a certainty.
EPISODE_FLOOR_BYTES = 32 << 10


def check_episodes_fit(field: str, value: int, episodes: int, what: str) -> None:
    """ValueError naming `field`, its `value` and the numbers when `episodes` held at once (`what`
    says how they follow from the config) certainly exceed this machine's RAM."""
    need, ram = episodes * EPISODE_FLOOR_BYTES, ram_bytes()
    if need > ram:
        per_unit = max(episodes // max(value, 1), 1)
        most = max(ram // (EPISODE_FLOOR_BYTES * per_unit), 1)
        raise ValueError(
            f"{field}={value} holds {episodes} episodes at once ({what}), at least "
            f"{EPISODE_FLOOR_BYTES >> 10} KiB each = {need / _GIB:.1f} GiB, more than this machine's "
            f"{ram / _GIB:.1f} GiB of RAM: lower {field} (at most {most} would pass this bound)")
