"""PPO pieces: GAE with truncation bootstraps, episode statistics, both Adams and their checkpoints,
bf16 autocast."""

from __future__ import annotations

import pytest
import torch

from trainer.envs import CartPole, CartPoleParams
from trainer.policy import MLPPolicy, log_prob_entropy, sample_actions
from trainer.ppo import PPO, Adam, FusedAdam, PPOConfig, compute_gae, make_optimizer


def reference_gae(rewards, values, next_values, terminated, dones, gamma, lam):  # noqa: ANN001, ANN202
    """Plain scalar loops, written independently of compute_gae."""
    steps, n = len(rewards), len(rewards[0])
    adv = [[0.0] * n for _ in range(steps)]
    for j in range(n):
        running = 0.0
        for t in reversed(range(steps)):
            g = gamma[t][j] if isinstance(gamma, list) else gamma  # one per step: PPO.discounts
            boot = 0.0 if terminated[t][j] else g * next_values[t][j]
            delta = rewards[t][j] + boot - values[t][j]
            running = delta + (0.0 if dones[t][j] else g * lam * running)
            adv[t][j] = running
    return adv


def test_gae_bootstraps_truncation_from_the_final_value_and_stops_at_termination() -> None:
    rewards = [[1.0, 0.0], [1.0, 1.0], [1.0, -1.0], [0.5, 0.0]]
    values = [[0.5, 0.1], [0.6, 0.2], [0.7, 0.3], [0.8, 0.4]]
    # Env 0 is truncated at t=1 (V(final_obs)=3.0 stands in for the next value); env 1 terminates at t=2.
    next_values = [[0.6, 0.2], [3.0, 0.3], [0.8, 9.9], [0.9, 0.5]]
    terminated = [[False, False], [False, False], [False, True], [False, False]]
    dones = [[False, False], [True, False], [False, True], [False, False]]
    gamma, lam = 0.9, 0.8
    adv, ret = compute_gae(
        torch.tensor(rewards), torch.tensor(values), torch.tensor(next_values),
        torch.tensor(terminated), torch.tensor(dones), gamma, lam,
    )
    expected = torch.tensor(reference_gae(rewards, values, next_values, terminated, dones, gamma, lam))
    torch.testing.assert_close(adv, expected)
    torch.testing.assert_close(ret, expected + torch.tensor(values))
    # The truncated step's advantage uses the bootstrap value: 1 + 0.9 * 3.0 - 0.6.
    assert abs(float(adv[1, 0]) - (1 + 0.9 * 3.0 - 0.6)) < 1e-6
    # The terminated step ignores its next value (9.9): -1 - 0.3.
    assert abs(float(adv[2, 1]) - (-1.3)) < 1e-6



def test_a_point_scored_discounts_what_follows_it_on_top_of_gamma() -> None:
    """--point-gamma G on snake: a step that eats an apple discounts what follows by gamma * G, every
    other step (a death's -1 included) by gamma; the advantages follow those discounts. Off (1), or on an
    env without a score, the discount is gamma itself, the one-number path."""
    from trainer.envs.registry import get_spec
    from trainer.envs.snake import Snake, SnakeParams

    env = Snake(2, SnakeParams(grid_size=5))
    spec = get_spec("snake")
    rewards = [[1.0, 0.0], [0.0, 1.0], [1.0, -1.0], [0.0, 0.0]]
    ppo = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=2, gamma=0.9, point_gamma=0.5), score=spec.score)
    discounts = ppo.discounts(torch.tensor(rewards))
    want = [[0.45, 0.9], [0.9, 0.45], [0.45, 0.9], [0.9, 0.9]]
    torch.testing.assert_close(discounts, torch.tensor(want))
    values = [[0.5, 0.1], [0.6, 0.2], [0.7, 0.3], [0.8, 0.4]]
    next_values = [[0.6, 0.2], [0.7, 0.3], [0.8, 9.9], [0.9, 0.5]]
    terminated = [[False, False], [False, False], [False, True], [False, False]]
    adv, _ = compute_gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(next_values),
                         torch.tensor(terminated), torch.tensor(terminated), discounts, 0.8)
    torch.testing.assert_close(adv, torch.tensor(reference_gae(rewards, values, next_values, terminated, terminated,
                                                               want, 0.8)))
    assert adv[0, 0] != compute_gae(torch.tensor(rewards), torch.tensor(values), torch.tensor(next_values),
                                    torch.tensor(terminated), torch.tensor(terminated), 0.9, 0.8)[0][0, 0]
    off = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=2, gamma=0.9), score=spec.score)
    assert off.discounts(torch.tensor(rewards)) == 0.9
    unscored = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=2, gamma=0.9, point_gamma=0.5))
    assert unscored.discounts(torch.tensor(rewards)) == 0.9


def test_truncated_steps_bootstrap_from_the_value_of_their_final_observation() -> None:
    torch.manual_seed(0)
    env = CartPole(4, CartPoleParams(max_steps=5))  # truncates every 5 steps while the pole is up
    policy = MLPPolicy(4, 2)
    ppo = PPO(env, policy, PPOConfig(num_envs=4, num_steps=12))
    ppo.start(seed=0)
    ppo.collect()
    buf = ppo.buf
    truncated = buf.truncated & ~buf.terminated
    assert truncated.any()
    next_values = ppo._next_values()
    with torch.no_grad():
        expected = policy.value(buf.final_obs[truncated])[:, 0]
    torch.testing.assert_close(next_values[truncated], expected)
    # Elsewhere inside a rollout the next value is the next step's value.
    go_on = ~buf.dones[:-1]
    torch.testing.assert_close(next_values[:-1][go_on], buf.values[1:][go_on])


def test_episode_statistics_match_a_plain_loop_across_rollouts() -> None:
    torch.manual_seed(1)
    env = CartPole(6, CartPoleParams(max_steps=30))
    ppo = PPO(env, MLPPolicy(4, 2), PPOConfig(num_envs=6, num_steps=16))
    ppo.start(seed=1)
    running = [0.0] * 6
    total, count = 0.0, 0
    for _ in range(5):
        ppo.collect()
        for t in range(16):
            for j in range(6):
                running[j] += float(ppo.buf.rewards[t, j])
                if ppo.buf.dones[t, j]:
                    total += running[j]
                    count += 1
                    running[j] = 0.0
    ret_sum, len_sum, score_sum, n = ppo.pop_episode_stats().tolist()
    assert n == count > 0
    assert abs(ret_sum - total) < 1e-3
    assert abs(len_sum - total) < 1e-3  # CartPole: one point per step
    assert abs(score_sum - total) < 1e-3
    assert float(ppo.pop_episode_stats()[3]) == 0


def test_hand_written_adam_matches_torch_optim_adam() -> None:
    torch.manual_seed(2)
    a = torch.nn.Linear(5, 3)
    b = torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    ours = Adam(a.parameters(), lr=0.01, eps=1e-5)
    ref = torch.optim.Adam(b.parameters(), lr=0.01, eps=1e-5)
    for _ in range(10):
        x = torch.randn(8, 5)
        for model, opt in ((a, ours), (b, ref)):
            opt.zero_grad()
            model(x).pow(2).sum().backward()
            opt.step()
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)
    state = ours.state_dict()
    again = Adam(a.parameters(), lr=0.5)
    again.load_state_dict(state)
    assert again.t == 10
    assert again.lr == 0.01


def test_sampling_follows_the_categorical_distribution() -> None:
    torch.manual_seed(3)
    logits = torch.log(torch.tensor([[0.2, 0.3, 0.5]])).repeat(40_000, 1)
    counts = torch.bincount(sample_actions(logits), minlength=3).float() / 40_000
    torch.testing.assert_close(counts, torch.tensor([0.2, 0.3, 0.5]), atol=0.01, rtol=0)
    logp, ent = log_prob_entropy(logits[:2], torch.tensor([0, 2]))
    torch.testing.assert_close(logp, torch.log(torch.tensor([0.2, 0.5])))
    expected_entropy = -(torch.tensor([0.2, 0.3, 0.5]) * torch.log(torch.tensor([0.2, 0.3, 0.5]))).sum()
    torch.testing.assert_close(ent, expected_entropy.repeat(2))


def test_a_rollout_samples_the_actions_a_step_by_step_draw_would() -> None:
    # The rollout draws its sampling noise once; a run must still equal its step-by-step self (the
    # snake preset's recorded seeds depend on it).
    env = CartPole(33)  # 66 values a step: not a multiple of a vector width
    policy = MLPPolicy(4, 2)
    ppo = PPO(env, policy, PPOConfig(num_envs=33, num_steps=12))
    ppo.start(seed=5)
    torch.manual_seed(9)
    ppo.collect()
    env2 = CartPole(33)
    obs = env2.reset(seed=5)
    torch.manual_seed(9)
    with torch.no_grad():
        for t in range(12):
            action = sample_actions(torch.log_softmax(policy(obs)[0], dim=1))
            assert torch.equal(action, ppo.buf.actions[t]), f"step {t}"
            obs = env2.step(action)[0]


def _train_steps(model: torch.nn.Module, opt: Adam | FusedAdam, steps: int, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(8, 5, generator=gen)
        opt.zero_grad()
        model(x).pow(2).sum().backward()
        opt.step()


def test_fused_adam_runs_on_cpu_and_matches_the_hand_written_one() -> None:
    """The optimizer CUDA uses ("auto" there) is exercised here on CPU."""
    torch.manual_seed(4)
    a, b = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    b.load_state_dict(a.state_dict())
    ours, fused = Adam(a.parameters(), lr=0.01), FusedAdam(b.parameters(), lr=0.01)
    assert fused.opt.defaults["fused"] is True
    _train_steps(a, ours, 10, seed=0)
    _train_steps(b, fused, 10, seed=0)
    for pa, pb in zip(a.parameters(), b.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)
    fused.lr = 0.003
    assert fused.opt.param_groups[0]["lr"] == 0.003
    assert isinstance(make_optimizer(a.parameters(), 0.01, "auto", torch.device("cpu")), Adam)
    assert isinstance(make_optimizer(a.parameters(), 0.01, "fused", torch.device("cpu")), FusedAdam)
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer(a.parameters(), 0.01, "sgd", torch.device("cpu"))


@pytest.mark.parametrize(("first", "second"), [(Adam, FusedAdam), (FusedAdam, Adam)])
def test_optimizer_checkpoints_resume_across_the_two_adams(first: type, second: type) -> None:
    """A checkpoint of either Adam resumes with the other exactly where an uninterrupted run goes."""
    torch.manual_seed(5)
    straight, resumed = torch.nn.Linear(5, 3), torch.nn.Linear(5, 3)
    resumed.load_state_dict(straight.state_dict())
    opt = first(straight.parameters(), lr=0.01)
    _train_steps(straight, opt, 6, seed=1)
    resumed.load_state_dict(straight.state_dict())
    state = opt.state_dict()
    assert state["t"] == 6
    again = second(resumed.parameters(), lr=0.5)
    again.load_state_dict(state)
    assert again.lr == 0.01
    _train_steps(straight, opt, 4, seed=2)
    _train_steps(resumed, again, 4, seed=2)
    for pa, pb in zip(straight.parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(pa, pb, atol=1e-6, rtol=1e-5)
    with pytest.raises(ValueError, match="does not match"):
        second(torch.nn.Linear(5, 3, bias=False).parameters(), lr=0.1).load_state_dict(state)


def test_bf16_rollout_and_update_keep_fp32_weights_buffers_and_losses() -> None:
    torch.manual_seed(6)
    env = CartPole(8)
    policy = MLPPolicy(4, 2)
    ppo = PPO(env, policy, PPOConfig(num_envs=8, num_steps=16, precision="bf16"))
    ppo.start(seed=0)
    seen: list[torch.dtype] = []
    policy.register_forward_hook(lambda _m, _i, out: seen.append(out[0].dtype))  # (logits, value)
    ppo.collect()
    losses = ppo.update()
    assert seen and set(seen) == {torch.bfloat16}, "the forward passes ran under bf16 autocast"
    assert all(p.dtype == torch.float32 for p in policy.parameters())
    assert ppo.buf.logprobs.dtype == ppo.buf.values.dtype == torch.float32
    assert losses.dtype == torch.float32
    assert torch.isfinite(losses).all()
    with pytest.raises(ValueError, match="unknown precision"):
        PPO(env, policy, PPOConfig(num_envs=8, num_steps=4, precision="fp16"))


def test_entropy_weight_anneals_on_the_lr_schedule_and_the_update_uses_it() -> None:
    env = CartPole(4)
    cfg = PPOConfig(num_envs=4, num_steps=8, ent_coef=0.02, anneal_ent=True)
    ppo = PPO(env, MLPPolicy(4, 2), cfg)
    assert [ppo.ent_at(i, 4) for i in range(5)] == pytest.approx([0.02, 0.015, 0.01, 0.005, 0.0])
    assert PPO(env, MLPPolicy(4, 2), PPOConfig(num_envs=4, ent_coef=0.02)).ent_at(3, 4) == 0.02

    def weights_after(cfg: PPOConfig, ent_coef: float | None) -> list[torch.Tensor]:
        torch.manual_seed(0)
        ppo = PPO(CartPole(4), MLPPolicy(4, 2), cfg)
        ppo.start(seed=0)
        ppo.collect()
        if ent_coef is not None:
            ppo.ent_coef = ent_coef
        ppo.update()
        return [p.detach().clone() for p in ppo.policy.parameters()]

    # An explicit weight of 0 updates exactly as a config without entropy bonus, and differs from
    # the config's own weight.
    for a, b in zip(weights_after(cfg, 0.0), weights_after(PPOConfig(num_envs=4, num_steps=8), None), strict=True):
        torch.testing.assert_close(a, b)
    own = weights_after(cfg, None)
    assert any(not torch.equal(a, b) for a, b in zip(own, weights_after(cfg, 0.0), strict=True))


@pytest.mark.parametrize("bootstrap", [True, False])
def test_truncation_bootstraps_or_ends_the_returns_as_configured(bootstrap: bool) -> None:
    torch.manual_seed(2)
    env = CartPole(4, CartPoleParams(max_steps=5))  # truncates every 5 steps while the pole is up
    ppo = PPO(env, MLPPolicy(4, 2), PPOConfig(num_envs=4, num_steps=12, gamma=0.9, bootstrap_truncated=bootstrap))
    ppo.start(seed=0)
    ppo.collect()
    buf = ppo.buf
    assert (buf.truncated & ~buf.terminated).any()
    with torch.no_grad():
        last = ppo.policy.value(ppo.obs)[:, 0]
    following = torch.cat((buf.values[1:], last[None]))
    truncated = buf.truncated & ~buf.terminated
    # With bootstrapping a truncated step is followed by its final state's value, else by nothing (and
    # the rollout keeps no final observations).
    if bootstrap:
        with torch.no_grad():
            final = ppo.policy.value(buf.final_obs.reshape(-1, 4))[:, 0].reshape(12, 4)
        next_values = torch.where(truncated, final, following)
    else:
        assert buf.final_obs is None
        next_values = following
    ends = buf.terminated if bootstrap else buf.dones
    want = reference_gae(buf.rewards.tolist(), buf.values.tolist(), next_values.tolist(), ends.tolist(),
                         buf.dones.tolist(), 0.9, ppo.cfg.gae_lambda)
    adv, _ = ppo.advantages()
    torch.testing.assert_close(adv, torch.tensor(want), rtol=1e-5, atol=1e-5)


def test_a_run_without_truncation_bootstrap_trains_alike_whether_the_env_builds_final_observations() -> None:
    # PPO without bootstrap tells snake to skip info["final_obs"] (its space features are a large
    # part of a CPU step); nothing it reads may change: the same weights after two iterations.
    from trainer.envs.snake import Snake, SnakeParams

    def weights(skip: bool) -> list[torch.Tensor]:
        torch.manual_seed(0)
        env = Snake(16, SnakeParams(grid_size=6, space=True))
        ppo = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=16, num_steps=24, bootstrap_truncated=False))
        assert env.final_obs_wanted is False
        env.final_obs_wanted = not skip
        ppo.start(seed=0)
        for _ in range(2):
            ppo.collect()
            ppo.update()
        return [p.detach().clone() for p in ppo.policy.parameters()]

    for a, b in zip(weights(True), weights(False), strict=True):
        assert torch.equal(a, b)


def test_episodes_the_env_does_not_count_stay_out_of_the_statistics() -> None:
    # Snake with late starts: some episodes begin as copies of running long games (info["counted"]
    # is False when they end). The statistics count exactly the other episodes.
    from trainer.envs.snake import Snake, SnakeParams

    torch.manual_seed(0)
    env = Snake(32, SnakeParams(grid_size=6), late_starts=1.0)
    ppo = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=32, num_steps=40))
    ppo.start(seed=0)
    body = [[r, c] for r in range(6) for c in (range(6) if r % 2 == 0 else range(5, -1, -1))][:20][::-1]
    for i in range(0, 32, 2):
        env.set_board(i, body=body, direction=3, apple=[5, 5])
    ppo.obs = env.observe().clone()
    ppo.collect()
    buf = ppo.buf
    assert (buf.dones & ~buf.counted).any() and (buf.dones & buf.counted).any()
    count = float(ppo.pop_episode_stats()[3])
    assert count == float((buf.dones & buf.counted).sum())


def test_a_death_costs_more_from_death_cost_at_and_the_score_stays_apples() -> None:
    """--death-cost 5 --death-cost-at 0.5: the rollouts of the first half see a death's -1, the later
    ones -5 on exactly the steps that die (not a win, not a hunger truncation); apples are counted the
    same either way."""
    from trainer.envs.registry import get_spec
    from trainer.envs.snake import Snake, SnakeParams

    spec = get_spec("snake")
    env = Snake(64, SnakeParams(grid_size=5))
    ppo = PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=64, num_steps=64, death_cost=5.0,
                                                        death_cost_at=0.5), score=spec.score, lost=spec.lost)
    assert [ppo.death_at(i, 10) for i in (0, 4, 5, 9)] == [0.0, 0.0, 4.0, 4.0]
    ppo.start(seed=0)
    for extra, death in ((0.0, -1.0), (4.0, -5.0)):
        ppo.death_extra = extra
        ppo.collect()
        buf = ppo.buf
        died = buf.terminated & (buf.rewards < 0)
        assert died.any()  # a random policy on a 5x5 board dies within 64 steps
        assert set(buf.rewards[died].tolist()) == {death}
        assert set(buf.rewards[~died].tolist()) <= {0.0, 1.0}
        assert torch.equal(spec.score(buf.rewards), (buf.rewards > 0).float())
    assert PPO(env, MLPPolicy(env.obs_dim, 3), PPOConfig(num_envs=64)).death_at(9, 10) == 0.0  # the default
