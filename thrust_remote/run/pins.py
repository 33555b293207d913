"""A job's torch pins, read on the laptop and held against the host's torch before any venv is built
(docs/architecture.md, "The job's venv": torch pins).

The job's venv is made from the host's own torch and pip runs with `torch==<host's>` as a constraint,
so a requirement that pins another torch can only end in pip's resolver error, after pip has asked
every index. Here the requirements file (with its `-r`/`-c` includes, as pip reads them) and the
job's inline `requirements:` are parsed with `packaging`, each torch / torchvision / torchaudio
requirement whose markers hold on the host is compared with what the host has, and a pin it cannot
meet is a config error (78) naming the file and line, before anything is installed.

PEP 440 decides a match: a pin without a local label ignores the host's (`==2.13.0` holds
`2.13.0+cu128`); a pin with one must match it exactly (`==2.13.0+cu126` does not). torchvision and
torchaudio are compared with the host's own when it has them; else an exact pin (`==X`) is compared
with the torch it is built for (torchvision 0.N: torch 2.(N-15), from 0.15; torchaudio A.B: torch
A.B, from 2.0; PyTorch's compatibility tables); anything else is left to pip.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # packaging costs ~20 ms of every command's start; imported where a pin is read
    from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from thrust_remote.core.errors import ConfigError
from thrust_remote.host.session import HostSession, parse_json

TORCH_FAMILY = ("torch", "torchvision", "torchaudio")
_INCLUDES = {"-r": False, "--requirement": False, "-c": True, "--constraint": True}


@dataclass(frozen=True)
class Pin:
    """One requirement of the torch family as the job asks for it."""

    where: str  # `requirements.txt:3`, or `reqs/torch.txt:1 (from requirements.txt:2)`
    requirement: Requirement
    constraint: bool = False  # from a `-c` file

    @property
    def name(self) -> str:
        return canonicalize_name(self.requirement.name)

    @property
    def display(self) -> str:
        """`torch==2.4.0`: the name and the versions asked (no markers, no hashes)."""
        return f"{self.requirement.name}{self.requirement.specifier}"


# ------------------------------------------------------------------------------------------ reading

_COMMENT = re.compile(r"(^|\s+)#.*$")  # pip's own rule: `#` at the start or after whitespace


def _logical_lines(text: str) -> Iterator[tuple[int, str]]:
    """(first line number, line) with `\\` continuations joined and comments dropped, as pip reads them."""
    first, parts = 0, []
    for number, raw in enumerate(text.splitlines(), 1):
        first = first or number
        if raw.endswith("\\"):
            parts.append(raw[:-1])
            continue
        line = _COMMENT.sub("", " ".join([*parts, raw])).strip()
        if line:
            yield first, line
        first, parts = 0, []


def _include(line: str) -> tuple[str, bool] | None:
    """(path, is a constraints file) of a `-r FILE` / `--requirement=FILE` / `-rFILE` / `-c ...` line."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    head = words[0] if words else ""
    for flag, constraint in _INCLUDES.items():
        if head == flag:
            return (words[1], constraint) if len(words) > 1 else None
        if head.startswith(flag + "="):
            return head[len(flag) + 1:], constraint
        if len(flag) == 2 and head.startswith(flag):
            return head[2:], constraint
    return None


def _requirement(line: str) -> Requirement | None:
    """The requirement of a line (its per-requirement options, `--hash=...`, cut off); None for what
    `packaging` cannot name (a path, a URL alone): pip's to judge."""
    from packaging.requirements import InvalidRequirement, Requirement

    cut = next((i for i in range(1, len(line)) if line[i - 1].isspace() and line[i] == "-"
                and line[i + 1:i + 2] == "-"), len(line))
    try:
        return Requirement(line[:cut].strip())
    except InvalidRequirement:
        return None


def read_file(root: Path, name: str) -> list[Pin]:
    """The torch-family requirements of `root/name` and of the files it includes (`-r`/`-c`, each
    relative to the file that names it, as pip takes them)."""
    return _read(root.resolve(), (root / name).resolve(), "", False, frozenset())


def _read(root: Path, path: Path, via: str, constraint: bool, seen: frozenset[Path]) -> list[Pin]:
    if path in seen:
        return []
    label = _label(root, path)
    pins: list[Pin] = []
    for number, line in _logical_lines(path.read_text(errors="replace")):
        where = f"{label}:{number}{via}"
        included = _include(line)
        if included is not None:
            target, is_constraint = included
            if "://" in target:
                continue  # an include by URL: pip's to fetch
            full = (path.parent / target).resolve()
            if not full.is_file():
                raise ConfigError(f"{where}: {line}: {_label(root, full)} does not exist",
                                  "an included file's path is relative to the file that includes it")
            pins += _read(root, full, f" (from {label}:{number})", constraint or is_constraint, seen | {path})
            continue
        if line.startswith("-"):
            continue  # an option (-i, --extra-index-url, -f, --pre, -e ...): not a requirement here
        req = _requirement(line)
        if req is not None and canonicalize_name(req.name) in TORCH_FAMILY:
            pins.append(Pin(where, req, constraint))
    return pins


def _label(root: Path, path: Path) -> str:
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def inline_pins(specs: Sequence[str], where: str) -> list[Pin]:
    """The torch-family specs of a job's inline `requirements:` list."""
    out = []
    for spec in specs:
        req = _requirement(spec)
        if req is not None and canonicalize_name(req.name) in TORCH_FAMILY:
            out.append(Pin(where, req))
    return out


# ------------------------------------------------------------------------------------------ judging

def host_markers(facts: Mapping[str, Any]) -> dict[str, str]:
    """PEP 508 marker values of the host, from its facts (the laptop's own where the host's are unknown)."""
    from packaging.markers import default_environment

    env: dict[str, str] = dict(default_environment())  # type: ignore[arg-type]
    python = str(facts.get("python") or "")
    if python:
        env["python_full_version"] = python
        env["python_version"] = ".".join(python.split(".")[:2])
    if facts.get("machine"):
        env["platform_machine"] = str(facts["machine"])
    system = str(facts.get("platform") or "").split("-")[0]
    if system:
        env["platform_system"] = system
        env["sys_platform"] = {"Linux": "linux", "Darwin": "darwin", "Windows": "win32"}.get(system, system.lower())
        env["os_name"] = "nt" if system == "Windows" else "posix"
    return env


def applies(pin: Pin, markers: Mapping[str, str]) -> bool:
    """Whether the pin's markers hold on the host (one that cannot be evaluated is left to pip)."""
    if pin.requirement.marker is None:
        return True
    try:
        return pin.requirement.marker.evaluate({**markers, "extra": ""})
    except Exception:  # noqa: BLE001 - packaging raises several kinds for a marker it cannot evaluate
        return False


def torch_for(name: str, pin: Requirement) -> tuple[int, int] | None:
    """The torch (major, minor) an exact torchvision / torchaudio pin is built for, when known."""
    specs = list(pin.specifier)
    if len(specs) != 1 or specs[0].operator not in ("==", "===") or "*" in specs[0].version:
        return None
    try:
        v = Version(specs[0].version)
    except InvalidVersion:
        return None
    if name == "torchvision" and v.major == 0 and v.minor >= 15:
        return 2, v.minor - 15
    if name == "torchaudio" and v.major >= 2:
        return v.major, v.minor
    return None


def conflict(pin: Pin, versions: Mapping[str, str | None]) -> str | None:
    """Why the host cannot meet `pin` (versions: torch and what else of the family it has), or None."""
    spec = pin.requirement.specifier
    if not spec:
        return None
    have = versions.get(pin.name)
    if have:
        try:
            if spec.contains(Version(have), prereleases=True):
                return None
        except InvalidVersion:
            return None
        return f"pins another {pin.name} than the host has ({have})"
    torch = versions.get("torch")
    need = torch_for(pin.name, pin.requirement)
    if need is None or not torch:
        return None
    try:
        ours = Version(torch)
    except InvalidVersion:
        return None
    if (ours.major, ours.minor) == need:
        return None
    return f"is built for torch {need[0]}.{need[1]}, and the host's torch is {torch}"


def check(pins: Sequence[Pin], versions: Mapping[str, str | None], facts: Mapping[str, Any], host: str,
          config_label: str) -> None:
    """Raise the config error (78) of the first pin the host cannot meet."""
    markers = host_markers(facts)
    for pin in pins:
        if not applies(pin, markers):
            continue
        why = conflict(pin, versions)
        if why is None:
            continue
        why = why.replace("the host", host)
        kind = "constraint" if pin.constraint else "requirement"
        then = ("the job runs on the host's torch" if pin.name == "torch"
                else f"pip picks the {pin.name} built for the host's torch")
        raise ConfigError(
            f"{pin.where}: {kind} {pin.display} {why}; the job's venv is built on {host}'s own torch "
            "and never replaces it",
            f"drop that pin ({then}), or point `python:` under hosts.{host} in {config_label} at an "
            f"interpreter on {host} that has {pin.display}")


def check_job(session: HostSession, specs: Sequence[str], requirements_file: str | None, root: Path,
              facts: Mapping[str, Any], where_inline: str, config_label: str) -> None:
    """The job's pins against the host's torch: its requirements file (read here, as the host's
    checkout has it: the same commit and patch) and its inline specs."""
    pins = inline_pins(specs, where_inline)
    if requirements_file and (root / requirements_file).is_file():
        pins += read_file(root, requirements_file)
    markers = host_markers(facts)
    pins = [p for p in pins if applies(p, markers)]
    if not pins:
        return
    versions: dict[str, str | None] = {"torch": facts.get("torch")}
    others = sorted({p.name for p in pins} - {"torch"})
    if others:
        answer = session.agent("dist-versions", *others, timeout=60)
        if answer.ok:
            versions.update(parse_json(answer, "dist-versions"))
    check(pins, versions, facts, session.name, config_label)
