"""The torch CartPole follows gymnasium's CartPole-v1 step for step."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch

from trainer.envs import CartPole


def test_single_steps_match_gymnasium_for_the_same_states_and_actions() -> None:
    rng = np.random.default_rng(0)
    n = 256
    states = rng.uniform(-0.2, 0.2, size=(n, 4)).astype(np.float32)
    states[:, 1] *= 10  # velocities span a wider range
    states[:, 3] *= 10
    actions = rng.integers(0, 2, size=n)
    env = CartPole(n)
    env.reset(seed=0)
    env.set_state(torch.from_numpy(states))
    _, reward, terminated, _, info = env.step(torch.from_numpy(actions))

    ref = gym.make("CartPole-v1").unwrapped
    ref.reset(seed=0)
    for i in range(n):
        ref.state = states[i].astype(np.float64)
        ref.steps_beyond_terminated = None
        obs, r, term, _, _ = ref.step(int(actions[i]))
        np.testing.assert_allclose(info["final_obs"][i].numpy(), obs, atol=1e-5)
        assert bool(terminated[i]) == term
        assert float(reward[i]) == r


def test_trajectories_match_gymnasium_until_termination() -> None:
    rng = np.random.default_rng(1)
    env = CartPole(8)
    obs = env.reset(seed=3)
    refs = []
    for i in range(8):
        ref = gym.make("CartPole-v1")
        ref.reset(seed=i)
        ref.unwrapped.state = obs[i].numpy().astype(np.float64)
        refs.append(ref)
    alive = [True] * 8
    for _ in range(200):
        actions = rng.integers(0, 2, size=8)
        _, _, terminated, truncated, info = env.step(torch.from_numpy(actions))
        for i, ref in enumerate(refs):
            if not alive[i]:
                continue
            ref_obs, _, term, trunc, _ = ref.step(int(actions[i]))
            np.testing.assert_allclose(info["final_obs"][i].numpy(), ref_obs, atol=1e-5)
            assert bool(terminated[i]) == term
            assert bool(truncated[i]) == trunc
            if term or trunc:
                alive[i] = False
    assert not any(alive), "a random policy should have dropped every pole in 200 steps"


def test_truncation_after_500_steps_with_final_obs_and_auto_reset() -> None:
    env = CartPole(2)
    env.reset(seed=0)
    # Hold the poles still by putting the state back to upright each step: only the clock runs.
    for step in range(1, 501):
        env.set_state(torch.zeros(2, 4), steps=env.steps.clone())
        obs, _, terminated, truncated, info = env.step(torch.tensor([0, 1]))
        assert not terminated.any()
        assert bool(truncated.all()) == (step == 500)
    assert torch.equal(env.steps, torch.zeros(2, dtype=torch.int32))
    assert (obs.abs() <= 0.05).all(), "auto-reset draws gymnasium's start distribution"
    assert not torch.equal(info["final_obs"], obs)


def test_reset_is_seeded_and_in_gymnasium_start_range() -> None:
    a, b = CartPole(1000), CartPole(1000)
    oa, ob = a.reset(seed=5), b.reset(seed=5)
    assert torch.equal(oa, ob)
    assert oa.abs().max() <= 0.05
    assert oa.shape == (1000, 4)
    assert oa.dtype == torch.float32


def test_the_cpu_step_through_numpy_equals_the_torch_ops_that_run_on_cuda() -> None:
    """On a CPU the step runs in numpy (CartPole._NumpyStep), on a GPU through torch ops: both must be
    the same env. Here the torch path is forced on a CPU twin, and each step starts both from one state."""
    rng = np.random.default_rng(2)
    n = 512
    fast, ref = CartPole(n), CartPole(n)
    ref._np = None  # the torch ops, as on CUDA
    fast.reset(seed=4)
    ref.reset(seed=4)
    ends = 0
    for _ in range(300):
        ref.set_state(fast.state.t(), steps=fast.steps.clone())
        actions = torch.from_numpy(rng.integers(0, 2, size=n))
        obs_a, _, term_a, trunc_a, info_a = fast.step(actions)
        obs_b, _, term_b, trunc_b, info_b = ref.step(actions)
        torch.testing.assert_close(info_a["final_obs"], info_b["final_obs"], atol=1e-6, rtol=1e-5)
        assert torch.equal(term_a, term_b) and torch.equal(trunc_a, trunc_b)
        assert torch.equal(fast.steps, ref.steps)
        ended = term_a | trunc_a
        # an ended env takes its start state from the pool (seeded alike); the others go on from final_obs
        torch.testing.assert_close(obs_a[~ended], obs_b[~ended], atol=1e-6, rtol=1e-5)
        assert (obs_a[ended].abs() <= 0.05).all()
        ends += int(ended.sum())
    assert ends > n, "random actions end many episodes: the reset path ran"
