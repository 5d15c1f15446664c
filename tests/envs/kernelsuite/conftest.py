"""Shared settings for the kernel-suite tests."""

import pytest
import torch

from envs.kernelsuite import EvalConfig


@pytest.fixture(scope="session", autouse=True)
def single_threaded_parent():
    # On the shared 2-core machine torch's thread pool in this (parent) process waits more than it
    # works; the workers set their own thread count.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def fast_config() -> EvalConfig:
    """Forked workers and a shorter timing phase: the detector's rules are unchanged."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    return EvalConfig(device=device, isolation="zygote", n_timed=5, n_repeat=2, timeout_s=90)
