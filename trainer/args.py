"""Every flag of `python -m trainer.train`, in one place: the `TrainArgs` dataclass.

Each field is one flag: its name (`learning_rate` is `--learning-rate`), type, default, choices and
range (the field's metadata), and its help (the one-line docstring under the field, CleanRL style).
From it come the trainer's argparse parser (`build_parser`), the per-env presets (`PRESETS`: overrides
of the defaults for flags left unset), `flag_specs()` and `parse_flag()` for tools that check flags
before anything runs (thrust-remote on the laptop), and `PPOConfig`'s defaults (trainer/ppo.py).

Stdlib only, no torch: the laptop-side tool imports this module (see docs/architecture.md). `--env`
is a built-in name (PRESETS) or a gymnasium id; for the latter, trainer.gym_ids imports gymnasium
(lazily) and checks the id is registered with a discrete action space and a flat Box observation.

Value formats (the contract with `thrust-remote train --set KEY=VALUE` and the optimizer):
- integers also as `2e7` or `20_000_000` (configs and optimizers produce both);
- switches take one optional value: `--resume`, `--resume true`, `--resume 0`;
- every flag takes one value, spelled with hyphens.

Errors: a bad type or a value outside `choices` is an argparse error (exit 2); a value outside a
flag's range is a usage error (`UsageError`, the trainer exits 64). `parse_flag` raises ValueError for
all of these, so a tool rejects exactly what the trainer would.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import pkgutil
import typing
from dataclasses import dataclass, field
from typing import Any

# Per-env overrides of TrainArgs' defaults for flags left unset.
# CartPole: small and fast. Over 20 seeds (greedy eval every 2 iterations) 2 minibatches solved in a
# median 7.9k steps, worst 12.8k: the most robust variant tried (4 minibatches: worst 23.6k; tanh:
# worst 31.7k).
# Snake (10x10): small batches of many cheap updates learned fastest per second on a 2-core CPU (19
# apples for 1024 envs with a 128-wide MLP after 8M steps); a long horizon (the late game needs it:
# 65.9 / 75.8 / 68.7 apples with gamma 0.99 against 0.995); the space features (--space 1), which let a snake
# fill the board at all. --mask 1 (deadly moves never picked while another is open) makes the endgame
# reliable: 10 runs of 12 fill the board in 71-90% of their games, against 2 of 6 without it, at the
# same mean (86.1 over seeds 1-6). What is left is the draw: one run in five or six learns no endgame,
# and late in a run the greedy score moves by several apples between points a few hundred thousand
# steps apart (81-93). So the preset trains runs side by side (--candidates auto: one process each, one
# per usable core, 2 to 3: on as many idle cores the time of one) and keeps the best of their policies
# every 2.5% from 70% of the steps (--snapshots 13: 100 held-out games each, then the best 3 on 500;
# over the same runs seeds 1-6 average 89.6, against 89.0 with 4 points at 70/80/90/100%)
# (trainer/candidates.py; BENCHMARKS.md, issue 54).
# At 60% of the steps a run that learned no endgame already reads far below its sibling (seed 5: 65
# against 84 apples), so --exploit-at 0.6 continues it from the sibling's policy when it is clearly
# behind (trainer/population.py): seeds 1-6 89.9, floor 86.4, against 89.6 / 84.6; at 0.5 or 0.7 seed
# 5 ended lower (84.6, 83.6). A third run, where a third core is free, lifts the floor (seeds 1-6:
# 86.4 -> 88.2, mean 89.9 both ways; seeds 7-9, nothing tuned on them: 85.1 -> 88.5, floor 82.7 ->
# 86.6): a seed whose first two runs both learn no endgame gets a good one.
# What those runs still lost was 5-16% of their games before 60 apples: with one discount a step, a
# shortcut at a small risk pays. --gamma 0.998 --point-gamma 0.97 makes a detour 2.5 times cheaper with
# the horizon in apples kept (an apple discounts what follows too), and --bootstrap-truncated 0 makes the
# hunger limit the clock (without it runs circled at the end of the game: seeds 1-6 92.2, floor 87.5,
# full boards on 3 of 6); together seeds 1-6 94.2, floor 93.1, full boards on 5 of 6 (docs/snake.md;
# BENCHMARKS.md, issue 54).
# On a GPU, pass a larger --num-envs. Tried and not adopted (issues 39 and 54, BENCHMARKS.md): 16M
# steps without space; --anneal-ent 1, --late-starts, --bootstrap-truncated 0 with space (no apple
# discount); a room check
# in the space features (learns fast, then circles until the hunger limit), or beside them as a flag per
# move (the snake then dies as often in traps no count proves; ~30% slower); the average of a run's
# late policies' weights (plays like a typical one, not like the best); --late-starts 0.3 with the
# population (seeds 3 and 6 lower); two runs' policies played as one (their routes conflict: 2.5 apples);
# a run's late policies played as one (a typical policy's score, as the weight average); --gamma 0.998
# alone (learns too slowly for the budget: seed 5 77 held out); a death costing 5 from 60% of the steps
# (--death-cost 5 --death-cost-at 0.6: seeds 1-9 +0.4 apples on average, -2.3 to +3.4 a seed: noise).
# Each env here has a spec in trainer/envs/registry.py (a test keeps the two lists equal). Gymnasium
# ids take GYM_PRESET (see `preset_of`).
PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": {
        "total_steps": 100_000,
        "num_minibatches": 2,
        "target_return": 475.0,
    },
    "snake": {
        "num_envs": 128,
        "total_steps": 13_000_000,
        "learning_rate": 2e-3,
        "ent_coef": 0.01,
        "gamma": 0.998,
        "point_gamma": 0.97,
        "bootstrap_truncated": 0,
        "space": 1,
        "mask": 1,
        "candidates": "auto",
        "snapshots": 13,
        "exploit_at": 0.6,
    },
}


# Any gymnasium id: the cartpole preset (gymnasium's CartPole-v1 is the same env, stepped in Python),
# with the id's own `reward_threshold` as --target-return (gymnasium's "solved"; 0 = off when it has
# none). An env stepped in Python makes a greedy evaluation cost as much as training, hence
# --eval-every 8. Measured on a 2-core CPU (tests/test_gym_envs.py): CartPole-v1 solved in ~7k steps;
# Acrobot-v1's greedy eval past -100 after 20-45k steps, and -82..-89 over 100 episodes after 100k.
GYM_PRESET: dict[str, Any] = {
    "total_steps": 100_000,
    "num_minibatches": 2,
    "eval_every": 8,
}


def check_env(name: str, strict: bool = False) -> str:
    """`name` when it is an env the trainer can train; ValueError saying why not otherwise.

    A gymnasium id that needs a package this machine lacks is accepted unless `strict` (the laptop
    cannot check it, the host will; the trainer itself parses strictly)."""
    if name in PRESETS:
        return name
    from trainer.gym_ids import GymEnvError, NotRegistered, gym_facts

    try:
        facts = gym_facts(name)
    except NotRegistered as e:
        builtin = ", ".join(sorted(PRESETS))
        raise ValueError(f"{name!r} is not one of {builtin}, nor a registered gymnasium id ({e})") from None
    except GymEnvError as e:
        raise ValueError(str(e)) from None
    if facts.missing and strict:
        raise ValueError(f"{name} needs a package this machine lacks: {facts.missing}")
    return name


def preset_of(env: str) -> dict[str, Any]:
    """The overrides of TrainArgs' defaults for `env` (a built-in name or a checked gymnasium id)."""
    if env in PRESETS:
        return PRESETS[env]
    from trainer.gym_ids import gym_facts

    threshold = gym_facts(env).reward_threshold
    return {**GYM_PRESET, "target_return": float(threshold or 0.0)}


class UsageError(ValueError):
    """A flag value the trainer refuses (out of range, or not a number where one is needed)."""


EXPLOIT_ALONE = "exploit-at compares a run's candidates, and this run trains one"


def exploit_alone(given: dict[str, Any]) -> bool:
    """Whether flags `given` (dashed names, values or their text) ask for an --exploit-at in a run that
    trains one candidate, where it would do nothing. Only a given --exploit-at counts: a preset's (snake's,
    under --candidates 1 for optimize's trials) stays quietly off. The trainer and the laptop's check of
    a train request (before anything is synced) both ask this."""
    if "exploit-at" not in given or float(given["exploit-at"]) <= 0:
        return False
    candidates = str(given.get("candidates", PRESETS.get(str(given.get("env")), {}).get("candidates", 1)))
    return candidates not in _specs(None)["candidates"].words and parse_int(candidates) == 1


def flag(
    default: Any = dataclasses.MISSING,
    *,
    choices: tuple[Any, ...] | None = None,
    min: float | None = None,
    max: float | None = None,
    min_exclusive: bool = False,
    words: tuple[str, ...] = (),
    type: type | None = None,  # when the annotation is wider than the flag's type
    metavar: str | None = None,
) -> Any:
    """A TrainArgs field with its flag facts in the metadata (read by `flag_specs`)."""
    meta = {
        "choices": choices,
        "min": min,
        "max": max,
        "min_exclusive": min_exclusive,
        "words": words,
        "type": type,
        "metavar": metavar,
    }
    return field(default=default, metadata=meta)


@dataclass
class TrainArgs:
    """The trainer's flags. Defaults apply when neither the command line nor the env's preset sets one."""

    env: str = flag()
    """which environment: snake, cartpole, or a gymnasium id (CartPole-v1, Acrobot-v1, ...)"""
    vector: str = flag("sync", choices=("sync", "async"))
    """gymnasium ids: step the envs in this process (sync) or one process each (async)"""
    num_envs: int | str = flag(8, min=1, words=("auto",), type=int)
    """total envs over all ranks, or 'auto' (sized from device memory)"""
    total_steps: int = flag(1_000_000, min=1)
    """env steps to train for (all ranks together)"""
    device: str = flag("auto", choices=("auto", "cpu", "cuda"))
    """where to train; auto: CUDA when available"""
    seed: int = flag(1)
    """random seed (each rank and each resume offsets it)"""
    run_dir: str | None = flag(None)
    """default runs/<env>-<UTC timestamp>-<pid>"""
    resume: bool = flag(False)
    """continue from the latest checkpoint in --run-dir, if any"""
    resume_from: str | None = flag(None, metavar="CKPT")
    """continue from this checkpoint file (its step, optimizer and random state); a restart prefers --run-dir's"""
    export: str | None = flag(None, metavar="PATH")
    """write the final policy as ONNX (+ manifest.json)"""
    policy: str = flag("mlp", choices=("mlp", "cnn"))
    """network: mlp, or cnn (reads snake's board planes)"""
    activation: str = flag("relu", choices=("tanh", "relu", "silu"))
    """MLP activation"""
    learning_rate: float = flag(2.5e-3, min=0, min_exclusive=True)
    """Adam step size at the start (annealed linearly to 0 when --anneal-lr 1)"""
    num_steps: int = flag(32, min=1)
    """rollout length per env per iteration"""
    num_minibatches: int = flag(4, min=1)
    """minibatches per epoch"""
    update_epochs: int = flag(2, min=1)
    """passes over each rollout"""
    clip_coef: float = flag(0.2, min=0)
    """policy ratio clip (and value clip)"""
    clip_vloss: int = flag(1, choices=(0, 1))
    """1: clip each value update to --clip-coef around the old value (in return units)"""
    ent_coef: float = flag(0.0, min=0)
    """entropy bonus weight (at the start, annealed linearly to 0 when --anneal-ent 1)"""
    vf_coef: float = flag(0.5, min=0)
    """value loss weight"""
    gamma: float = flag(0.99, min=0, max=1)
    """discount"""
    gae_lambda: float = flag(0.95, min=0, max=1)
    """GAE lambda"""
    hidden: int = flag(64, min=1)
    """network width"""
    grid_size: int = flag(10, min=4)
    """snake board side"""
    action_mode: str = flag("relative", choices=("relative", "absolute"))
    """snake actions"""
    space: int = flag(0, choices=(0, 1))
    """snake: 1 adds three features: how much of the board each move keeps in reach (docs/snake.md)"""
    mask: int = flag(0, choices=(0, 1))
    """snake, relative actions: 1 never picks a move the danger features mark deadly (unless every move
    is); the exported model masks too"""
    late_starts: float = flag(0.0, min=0, max=1)
    """snake, training only: share of new episodes that copy a running game whose snake fills half the board"""
    death_cost: float = flag(1.0, min=0)
    """training only: what losing an episode costs (snake: a death's reward is -C, not -1) from
    --death-cost-at of the steps on; scores and evaluations are unchanged (apples)"""
    death_cost_at: float = flag(0.0, min=0, max=1)
    """the share of the steps after which --death-cost applies (before it a death costs what the env says)"""
    point_gamma: float = flag(1.0, min=0, max=1)
    """envs with a score (snake: apples): each point scored discounts what follows by this too, on top of
    --gamma (1: off), so the horizon counts points as well as steps"""
    bootstrap_truncated: int = flag(1, choices=(0, 1))
    """1: a truncated episode's last step is followed by the value of its final state (a time limit the
    policy cannot see); 0: it ends like a termination (a limit the observation shows, e.g. snake's hunger)"""
    target_kl: float = flag(0.0, min=0)
    """early-stop epochs above this KL; 0 = off"""
    max_grad_norm: float = flag(0.5, min=0, min_exclusive=True)
    """global gradient norm clip"""
    anneal_lr: int = flag(1, choices=(0, 1))
    """1: linear LR decay to 0"""
    anneal_ent: int = flag(0, choices=(0, 1))
    """1: linear entropy-weight decay to 0, on the LR's schedule"""
    target_return: float = flag(0.0)
    """stop when greedy eval reaches this; 0 = off"""
    eval_episodes: int = flag(20, min=1)
    """episodes of each greedy evaluation"""
    eval_every: int = flag(2, min=1)
    """iterations between --target-return checks"""
    log_interval: float = flag(1.0, min=0)
    """seconds between THRUST_METRICS reports"""
    checkpoint_interval: float = flag(120.0, min=0)
    """seconds between checkpoints"""
    candidates: int | str = flag(1, min=1, words=("auto",), type=int)
    """train this many runs at once from different seeds (one process each) and keep the one that plays
    best on held-out games; 'auto': one per usable CPU core, 2 to 3"""
    snapshots: int = flag(1, min=1, max=40)
    """keep the policy at this many points, evenly over the last 30% of --total-steps (the end included),
    and at the end the one that plays best on held-out games (above 3: a first round on a fifth of the
    games picks the 3 that play them all)"""
    exploit_at: float = flag(0.0, min=0, max=1)
    """with --candidates: at this share of the steps the candidates play held-out games, and one clearly
    behind the best continues from the best's policy (0 = off)"""
    exploit_z: float = flag(4.0, min=0)
    """--exploit-at's "clearly": the best's mean ahead by more than this many standard errors"""
    candidate_games: int = flag(500, min=1)
    """greedy games each policy plays for the choice (--candidates or --snapshots above 1)"""
    held_out_seed: int = flag(-1, min=-1)
    """first seed of the choice's held-out games; -1: 1000000 + --seed (a candidate gets its run's)"""
    threads: int = flag(0, min=0)
    """torch CPU threads; 0 = 1 on CPU (see main), torch's default on CUDA"""
    dist_timeout: float = flag(600.0, min=0, min_exclusive=True)
    """process-group timeout, seconds"""
    tensorboard: bool = flag(False)
    """also write TensorBoard event files (needs tensorboard)"""
    # bf16 pays off on GPUs; on a CPU without bf16 instructions it is ~3x slower (trainer/ppo.py `autocast`).
    precision: str = flag("fp32", choices=("fp32", "bf16"))
    """forward passes of the policy in fp32, or under bf16 autocast (weights, losses and the export stay fp32)"""
    compile: bool = flag(False)
    """torch.compile the policy and the env step (slow start; on CPU it needs a C++ compiler)"""


@dataclass(frozen=True)
class FlagSpec:
    """One trainer flag, as a tool outside the trainer needs to know it."""

    name: str  # dashed: "total-steps"
    field: str  # TrainArgs attribute: "total_steps"
    type: type  # int, float, str or bool
    default: Any  # TrainArgs' default, or the preset's when flag_specs(env) was asked
    choices: tuple[Any, ...] | None
    help: str
    min: float | None = None
    max: float | None = None
    min_exclusive: bool = False
    words: tuple[str, ...] = ()  # words accepted besides a value of `type` ("auto")
    required: bool = False
    metavar: str | None = None

    def range_text(self) -> str | None:
        if self.min is None and self.max is None:
            return None
        parts = []
        if self.min is not None:
            parts.append(f"{'>' if self.min_exclusive else '>='} {self.min}")
        if self.max is not None:
            parts.append(f"<= {self.max}")
        return " and ".join(parts)


# ------------------------------------------------------------------------------------ value parsing
def parse_bool(text: str) -> bool:
    value = text.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def parse_int(text: str) -> int:
    """An integer, also written as 2e7 or 20_000_000 (configs and optimizers produce both)."""
    try:
        value = float(text.replace("_", ""))
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None
    if not value.is_integer():
        raise ValueError(f"expected an integer, got {text!r}")
    return int(value)


_CONVERT: dict[type, Any] = {int: parse_int, float: float, str: str, bool: parse_bool}


def convert(spec: FlagSpec, text: str, strict: bool = False) -> Any:
    """`text` as a value of the flag's type (or one of its words); ValueError if it is not one.

    `--env` is checked here (`check_env`, with `strict`), as a choice would be."""
    if spec.field == "env":
        return check_env(text, strict)
    if text in spec.words:
        return text
    try:
        return _CONVERT[spec.type](text)
    except ValueError as e:
        if spec.words:
            raise ValueError(f"{e} (or {' or '.join(repr(w) for w in spec.words)})") from None
        if spec.type is float:
            raise ValueError(f"expected a number, got {text!r}") from None
        raise


def check_range(spec: FlagSpec, value: Any) -> None:
    """UsageError when a number is outside the flag's range (written so NaN is outside too)."""
    if value in spec.words or isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    low_ok = spec.min is None or (value > spec.min if spec.min_exclusive else value >= spec.min)
    high_ok = spec.max is None or value <= spec.max
    if not (low_ok and high_ok):
        raise UsageError(f"--{spec.name} must be {spec.range_text()}")


def parse_flag(name: str, text: str) -> Any:
    """The value `--name text` gives the trainer; ValueError (with the reason) where it refuses it."""
    specs = flag_specs()
    spec = specs.get(name)
    if spec is None:
        if name.replace("_", "-") in specs:  # the field's name (thrust.yaml keys and Python both use them)
            raise ValueError(f"--{name}: not a trainer flag; it is spelled --{name.replace('_', '-')}")
        raise ValueError(f"--{name}: not a trainer flag (known: {', '.join(sorted(specs))})")
    try:
        value = convert(spec, text)
    except ValueError as e:
        raise ValueError(f"--{name}: {e}") from None
    if spec.choices is not None and value not in spec.choices:
        raise ValueError(f"--{name}: {value!r} is not one of {', '.join(map(str, spec.choices))}")
    check_range(spec, value)
    return value


# ----------------------------------------------------------------------------------- the flag table
@functools.lru_cache(maxsize=1)
def _field_docs() -> dict[str, str]:
    """The docstring under each TrainArgs field (the way CleanRL/tyro read them: from the source)."""
    # through the module's loader, not the file system: on a host the trainer runs from a zipapp
    source = pkgutil.get_data(__package__ or "trainer", "args.py") or b""
    tree = ast.parse(source.decode("utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "TrainArgs")
    docs = {}
    for node, after in zip(cls.body, cls.body[1:], strict=False):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            docs[node.target.id] = after.value.value.strip()
    return docs


def _flag_type(f: dataclasses.Field[Any], hint: Any) -> type:
    if f.metadata.get("type") is not None:
        return f.metadata["type"]
    members = [t for t in typing.get_args(hint) if t is not type(None)] or [hint]
    return members[0]


@functools.cache
def _specs(env: str | None) -> dict[str, FlagSpec]:
    hints = typing.get_type_hints(TrainArgs)
    docs = _field_docs()
    preset = preset_of(env) if env else {}
    out = {}
    for f in dataclasses.fields(TrainArgs):
        name = f.name.replace("_", "-")
        required = f.default is dataclasses.MISSING
        m = f.metadata
        out[name] = FlagSpec(
            name=name,
            field=f.name,
            type=_flag_type(f, hints[f.name]),
            default=preset.get(f.name, None if required else f.default),
            choices=m.get("choices"),
            help=docs[f.name],
            min=m.get("min"),
            max=m.get("max"),
            min_exclusive=m.get("min_exclusive", False),
            words=m.get("words", ()),
            required=required,
            metavar=m.get("metavar"),
        )
    return out


def flag_specs(env: str | None = None) -> dict[str, FlagSpec]:
    """Every trainer flag by dashed name; with `env`, the defaults are that env's preset values."""
    if env is not None:
        try:
            check_env(env)
        except ValueError as e:
            raise ValueError(f"unknown env: {e}") from None
    return dict(_specs(env))


def default_of(field_name: str) -> Any:
    """TrainArgs' default for one field (PPOConfig takes its defaults from here)."""
    return _specs(None)[field_name.replace("_", "-")].default


# --------------------------------------------------------------------------------------- argparse
def _argparse_type(spec: FlagSpec) -> Any:
    def parse(text: str) -> Any:
        try:
            return convert(spec, text, strict=True)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return parse


def build_parser() -> argparse.ArgumentParser:
    """The trainer's parser, generated from TrainArgs. Every default is None: "not given", so the
    env's preset (or TrainArgs' default) can fill it in (`parse_args`)."""
    p = argparse.ArgumentParser(prog="python -m trainer.train", description="Train a PPO policy on a batched env.")
    for spec in flag_specs().values():
        help_text = spec.help + (f" (must be {spec.range_text()})" if spec.range_text() else "")
        # argparse %-formats help ("%(default)s"): a plain "30% of" would make --help itself fail
        kw: dict[str, Any] = {"help": help_text.replace("%", "%%"), "default": None, "dest": spec.field}
        if spec.type is bool:
            # Switches also take one value (`--resume true`), since `thrust-remote train --set
            # resume=true` passes every job arg as `--key value`.
            kw.update(nargs="?", const=True, metavar="BOOL")
        if spec.words:
            # Today's contract: a bad --num-envs is a usage error (exit 64), checked in parse_args.
            kw["metavar"] = spec.field.upper()
        else:
            kw["type"] = _argparse_type(spec)
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if spec.required:
            kw["required"] = True
        if spec.metavar:
            kw["metavar"] = spec.metavar
        p.add_argument(f"--{spec.name}", **kw)
    return p


def resolve(given: dict[str, Any]) -> TrainArgs:
    """TrainArgs from flag values (None = not given): the value, else the env's preset, else the default.

    Raises UsageError where a value is out of its flag's range (or a worded flag's text is neither)."""
    specs = _specs(given["env"])
    values = {}
    for spec in specs.values():
        value = given.get(spec.field)
        if value is None:
            value = spec.default
        elif isinstance(value, str) and spec.type is not str:
            try:
                value = convert(spec, value)
            except ValueError as e:
                raise UsageError(f"--{spec.name}: {e}") from None
        check_range(spec, value)
        values[spec.field] = value
    return TrainArgs(**values)


def to_argv(args: TrainArgs) -> list[str]:
    """The command line that parses back to `args` (every flag spelled out, so no preset fills in)."""
    argv = []
    for spec in flag_specs().values():
        value = getattr(args, spec.field)
        if value is None:
            continue
        argv += [f"--{spec.name}", str(value).lower() if isinstance(value, bool) else str(value)]
    return argv


def parse_args(argv: list[str] | None = None) -> TrainArgs:
    """Parse the trainer's command line. argparse exits 2 on a bad type or choice; a value out of
    range raises UsageError (exit 64 in trainer.train)."""
    return resolve(vars(build_parser().parse_args(argv)))
