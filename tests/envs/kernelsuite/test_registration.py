"""The kernel suite is reachable through the public envs entry points."""

import envs


def test_make_env_returns_the_kernel_suite_and_list_envs_names_it():
    assert envs.KERNEL_SUITE in envs.list_envs()
    assert envs.KERNEL_SUITE in envs.list_envs(domain="coding_agents")
    assert envs.KERNEL_SUITE not in envs.list_envs(domain="general_tasks")
    env = envs.make_env(envs.KERNEL_SUITE, seed=0)
    prompt = env.reset(seed=1)
    assert "ModelNew" in prompt
    assert callable(env.snapshot) and callable(env.restore)
