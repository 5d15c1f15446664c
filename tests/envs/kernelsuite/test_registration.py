"""The kernel suite is reachable through the public envs entry points."""

import envs


def test_make_env_returns_the_kernel_suite():
    assert envs.KERNEL_SUITE not in envs.list_envs()  # a suite of its own, not a task family
    env = envs.make_env(envs.KERNEL_SUITE, seed=0)
    prompt = env.reset(seed=1)
    assert "ModelNew" in prompt
    assert callable(env.snapshot) and callable(env.restore)
