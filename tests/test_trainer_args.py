"""trainer.args (the one table of trainer flags) and trainer.envs.registry (the one place an env is known)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainer.args import PRESETS, TrainArgs, UsageError, build_parser, flag_specs, parse_args, parse_flag
from trainer.envs.registry import SPECS, get_spec, spec_for_dims
from trainer.ppo import PPOConfig

REPO = Path(__file__).resolve().parents[1]

# The per-env values every flag left unset took before presets became overrides of TrainArgs.
RESOLVED_PRESETS = {
    "cartpole": {
        "num_envs": 8, "num_steps": 32, "total_steps": 100_000, "learning_rate": 2.5e-3, "num_minibatches": 2,
        "update_epochs": 2, "clip_coef": 0.2, "ent_coef": 0.0, "vf_coef": 0.5, "gamma": 0.99, "gae_lambda": 0.95,
        "hidden": 64, "target_kl": 0.0, "max_grad_norm": 0.5, "policy": "mlp", "activation": "relu",
        "target_return": 475.0,
    },
    "snake": {
        "num_envs": 128, "num_steps": 32, "total_steps": 13_000_000, "learning_rate": 2e-3, "num_minibatches": 4,
        "update_epochs": 2, "clip_coef": 0.2, "ent_coef": 0.01, "vf_coef": 0.5, "gamma": 0.998, "gae_lambda": 0.95,
        "hidden": 64, "target_kl": 0.0, "max_grad_norm": 0.5, "policy": "mlp", "activation": "relu",
        "target_return": 0.0, "space": 1, "mask": 1, "candidates": "auto", "snapshots": 13, "point_gamma": 0.97,
        "bootstrap_truncated": 0,
    },
}


def test_trainer_args_imports_without_torch() -> None:
    code = "import sys, trainer.args; trainer.args.flag_specs(); assert 'torch' not in sys.modules"
    res = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr


@pytest.mark.parametrize("env", sorted(RESOLVED_PRESETS))
def test_presets_resolve_to_the_same_values_as_before(env: str) -> None:
    args = parse_args(["--env", env])
    assert {k: getattr(args, k) for k in RESOLVED_PRESETS[env]} == RESOLVED_PRESETS[env]
    assert {k: flag_specs(env)[k.replace("_", "-")].default for k in RESOLVED_PRESETS[env]} == RESOLVED_PRESETS[env]
    # A flag given on the command line beats the preset.
    assert parse_args(["--env", env, "--num-minibatches", "8"]).num_minibatches == 8


def test_every_field_is_a_flag_with_help_and_the_parser_has_exactly_them() -> None:
    specs = flag_specs()
    assert [s.field for s in specs.values()] == [f.name for f in dataclasses.fields(TrainArgs)]
    assert all(s.help for s in specs.values())
    assert all(s.type in (int, float, str, bool) for s in specs.values())
    parser_flags = {o[2:] for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}
    assert parser_flags - {"help"} == set(specs)


def test_value_formats_and_errors() -> None:
    assert parse_flag("total-steps", "2e7") == 20_000_000
    assert parse_flag("total-steps", "20_000_000") == 20_000_000
    assert parse_flag("resume", "true") is True
    assert parse_flag("tensorboard", "0") is False
    assert parse_flag("num-envs", "auto") == "auto"
    assert parse_flag("anneal-lr", "1") == 1
    for name, text, why in [
        ("total-steps", "1.5", "expected an integer"),
        ("total-steps", "0", "must be >= 1"),
        ("learning-rate", "0", "must be > 0"),
        ("learning-rate", "nan", "must be > 0"),
        ("gamma", "1.5", "<= 1"),
        ("env", "pong", "not one of"),
        ("anneal-lr", "2", "not one of"),
        ("no-such-flag", "1", "not a trainer flag"),
        ("total_steps", "1", "not a trainer flag; it is spelled --total-steps"),
        ("num-envs", "many", "auto"),
        ("resume", "maybe", "true or false"),
    ]:
        with pytest.raises(ValueError, match=why):
            parse_flag(name, text)
    with pytest.raises(UsageError, match="--grid-size must be >= 4"):
        parse_args(["--env", "snake", "--grid-size", "3"])


def test_ppo_config_defaults_come_from_train_args() -> None:
    cfg = PPOConfig()
    specs = flag_specs()
    for f in dataclasses.fields(cfg):
        if f.name.replace("_", "-") in specs and f.name not in ("anneal_lr", "target_kl"):
            assert getattr(cfg, f.name) == specs[f.name.replace("_", "-")].default, f.name
    cfg = PPOConfig.from_args(parse_args(["--env", "snake", "--target-kl", "0.03"]), num_envs=64)
    assert (cfg.num_envs, cfg.learning_rate, cfg.ent_coef, cfg.target_kl, cfg.anneal_lr) == (64, 2e-3, 0.01, 0.03, True)
    assert PPOConfig.from_args(parse_args(["--env", "cartpole"]), num_envs=8).target_kl is None  # 0 = off
    # the 0/1 switches arrive as booleans
    flags = ["--env", "snake", "--clip-vloss", "0", "--anneal-ent", "1", "--bootstrap-truncated", "0"]
    cfg = PPOConfig.from_args(parse_args(flags), num_envs=8)
    assert (cfg.clip_vloss, cfg.anneal_ent, cfg.bootstrap_truncated) == (False, True, False)


def test_every_env_with_a_preset_has_a_spec() -> None:
    assert set(SPECS) == set(PRESETS)
    with pytest.raises(ValueError, match="unknown env"):
        get_spec("pong")


def test_env_specs_know_sizes_scores_and_settings() -> None:
    snake, cartpole = get_spec("snake"), get_spec("cartpole")
    params = snake.params({"grid_size": 6, "action_mode": None, "hidden": 64})  # None and foreign keys ignored
    assert snake.settings_of(params) == {"grid_size": 6, "action_mode": "relative", "space": False}
    assert (snake.obs_dim(params), snake.n_actions(params)) == (3 * 36 + 8, 3)
    assert (cartpole.obs_dim(cartpole.params()), cartpole.n_actions(cartpole.params())) == (4, 2)
    rewards = torch.tensor([1.0, -1.0, 0.0])
    assert snake.episode_score(rewards).tolist() == [1.0, 0.0, 0.0]
    assert cartpole.score is None
    assert cartpole.episode_score(rewards) is rewards
    assert spec_for_dims(4, 2) == (cartpole, {})
    assert spec_for_dims(3 * 36 + 8, 4) == (snake, {"grid_size": 6, "action_mode": "absolute", "space": False})
    assert spec_for_dims(3 * 36 + 11, 3) == (snake, {"grid_size": 6, "action_mode": "relative", "space": True})
    with pytest.raises(ValueError, match="cannot tell"):
        spec_for_dims(20, 3)
    env = snake.make(5, grid_size=6)
    assert env.reset(seed=0).shape == (5, 3 * 36 + 8)
    assert snake.make(5, grid_size=6, space=1).reset(seed=0).shape == (5, 3 * 36 + 11)


def test_gym_ids_get_a_spec_and_the_gym_preset() -> None:
    spec = get_spec("Acrobot-v1")
    params = spec.params({"grid_size": 6})  # settings of other envs are ignored
    assert (spec.name, spec.obs_dim(params), spec.n_actions(params), spec.settings_of(params)) == (
        "Acrobot-v1", 6, 3, {})
    assert get_spec("Acrobot-v1") is spec
    args = parse_args(["--env", "CartPole-v1"])
    assert (args.total_steps, args.num_minibatches, args.eval_every, args.target_return, args.vector) == (
        100_000, 2, 8, 475.0, "sync")
    with pytest.raises(ValueError, match="or a gymnasium id"):
        get_spec("pong")
    with pytest.raises(ValueError, match="unknown env: .*discrete"):
        flag_specs("Pendulum-v1")


def test_help_lists_every_flag_even_with_a_percent_sign_in_its_text() -> None:
    """`python -m trainer.train --help` is what a refused flag's hint names: it prints every flag (argparse
    %-formats help, so a plain "30% of" in --snapshots' text once made --help itself fail)."""
    shown = subprocess.run([sys.executable, "-m", "trainer.train", "--help"], cwd=REPO, capture_output=True,
                           text=True, env={**os.environ, "COLUMNS": "400"}, check=False)
    assert shown.returncode == 0, shown.stderr
    assert any("%" in spec.help for spec in flag_specs().values())
    for spec in flag_specs().values():
        assert f"--{spec.name}" in shown.stdout
        assert " ".join(spec.help.split()[:6]) in " ".join(shown.stdout.split()), spec.name
