"""The setup stage of a python job: its venv under <workdir>/.thrust/venvs/<key> with its requirements
(agent `venv ensure`), and the built-in trainer's payload (docs/architecture.md, "The job's venv")."""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from thrust_remote.agent.venv import COMPANIONS
from thrust_remote.core.config.hosts import torch_index
from thrust_remote.core.errors import ExitCode, ThrustError
from thrust_remote.host import payload
from thrust_remote.host.jobspec import JobSpec
from thrust_remote.host.runner import expand_home
from thrust_remote.host.session import HostSession, parse_json
from thrust_remote.run.sync import LocalState

# What the built-in trainer imports besides torch; torch itself is never installed by us.
TRAINER_REQUIREMENTS = ("numpy", "onnx", "onnxruntime", "onnxscript", "gymnasium")


class Steps(Protocol):
    def step(self, message: str) -> None: ...


@dataclass(frozen=True)
class VenvSetup:
    """What the setup stage made ready: the job's venv and, for the built-in trainer, its payload."""

    python: str  # the venv's python: the interpreter that runs the job
    venv: str
    skipped: bool  # the venv was there already (nothing changed)
    trainer: str | None  # the trainer zipapp on the host (kind: trainer), else None


def is_builtin_trainer(spec: JobSpec) -> bool:
    """`kind: trainer`, or `kind: python` with neither `script:` nor `module:` (that kept
    meaning the built-in trainer when `script:` and `module:` came with the other job kinds). Read from
    the job's spec (jobspec.job_spec), as every stage reads the job."""
    if spec.get("kind") == "trainer":
        return True
    return spec.get("kind") == "python" and not spec.get("script") and not spec.get("module")


def job_requirements(spec: JobSpec) -> tuple[str, ...]:
    """The pip specs of the job's venv: the trainer's own for the built-in trainer, then the job's."""
    return (*(TRAINER_REQUIREMENTS if is_builtin_trainer(spec) else ()), *(spec.get("requirements") or ()))


def venv_key(session: HostSession, facts: Mapping[str, Any], specs: Sequence[str], requirements_file: str | None,
             file_sha256: str | None, code: str | None = None) -> str:
    """The venv's name: a hash of what it is made from (docs/architecture.md, "The job's venv"). `code`:
    the run's code (commit and patch) when the requirements install the project itself (`-e .`,
    `./pkg`): such a venv holds that code, or points into the tree it was built in, so it is that code's."""
    spec = {
        "layout": 2,  # how the venv is made (agent/venv.py); bumped when that changes (2: companions fit torch)
        "python": session.host.python,
        "python_path": facts.get("python_path"),
        "python_version": facts.get("python"),
        "torch": facts.get("torch"),
        "torch_index": torch_index(session.host.torch_index, facts.get("torch")),
        "requirements": list(specs),
        "requirements_file": [requirements_file, file_sha256],
        **({"code": code} if code else {}),
    }
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]


_LOCAL_REF = re.compile(r"^\s*(-e|--editable)\b|^\s*\.{1,2}(/|$)|^\s*file:|@\s*file:|^\s*/")


def installs_local_code(specs: Sequence[str], file_text: str | None) -> bool:
    """Whether the requirements name a path of the project (`-e .`, `./pkg`, `file:...`): what pip
    installs from the tree it runs in, so the venv is that code's (a shared one would run other code)."""
    lines = [*specs, *(file_text or "").splitlines()]
    return any(_LOCAL_REF.search(line.split("#", 1)[0]) for line in lines)


def _file_bytes(local: LocalState | None, name: str | None) -> bytes | None:
    """The requirements file's content as the laptop has it: the run's tree is the same commit plus the
    same patch, so it keys the venv without a look at the host."""
    path = local.root / name if local and name else None
    try:
        return path.read_bytes() if path else None
    except OSError:
        return None


def torch_release(version: object) -> str:
    """The host torch's version as a pip pin can match it: `torch.__version__` carries a local label
    (`2.15.0+cu132`) that a PyPI wheel's own metadata lacks (`2.15.0`), so `==2.15.0+cu132` would
    make pip fail on the torch it already has; `==2.15.0` matches both (PEP 440 ignores the label)."""
    return str(version or "").split("+", 1)[0]


def setup_python(session: HostSession, spec: JobSpec, facts: Mapping[str, Any], local: LocalState | None,
                 reporter: Steps, *, checkout: str, code: str | None = None) -> VenvSetup:
    """The job's venv under <workdir>/.thrust/venvs/<key> (agent `venv ensure`), with its requirements
    installed: one cheap check when nothing changed. pip runs in `checkout` (the run's tree): `-e .` and
    `./pkg` are the project's, and then `code` (the run's commit and patch) keys the venv too. The host's
    torch is used as it is: the venv sees the host python's packages, and pip runs with `torch==<host
    version>` as a constraint, so it fails rather than replace it. torch's companions the venv got
    (torchvision...) must load beside it: one that does not is replaced by the build for its variant
    from `torch_index(...)`, or the setup is refused (companion_error). The built-in trainer's payload is
    uploaded when the host lacks it. `spec`: the job as the stages see it (jobspec.job_spec)."""
    runner, paths = session.runner, session.paths
    specs = job_requirements(spec)
    requirements_file: str | None = spec.get("requirements_file")
    requirements = os.path.join(checkout, requirements_file) if requirements_file else None
    data = _file_bytes(local, requirements_file)
    sha = hashlib.sha256(data).hexdigest() if data is not None else None
    own_code = code if installs_local_code(specs, data.decode(errors="replace") if data else None) else None
    key = venv_key(session, facts, specs, requirements_file, sha, own_code)
    trainer = expand_home(payload.trainer().remote, runner.home()) if is_builtin_trainer(spec) else None
    torch_version = torch_release(facts.get("torch"))
    argv = ["venv", "ensure", "--dir", paths.venvs, "--key", key, "--cwd", checkout]
    argv += ["--constraint", f"torch=={torch_version}"] if torch_version else []
    argv += ["--torch", str(facts["torch"])] if facts.get("torch") else []
    index = torch_index(session.host.torch_index, facts.get("torch"))
    argv += ["--torch-index", index] if index else []
    argv += ["--requirements", requirements] if requirements else []
    argv += ["--expect", trainer] if trainer else []
    answer = _ensure(session, spec, [*argv, "--check", "--", *specs])
    if trainer and trainer in answer.get("missing", ()):
        reporter.step(f"uploading the built-in trainer ({payload.trainer().sha256[:12]})")
        payload.upload(runner, payload.trainer())
    if answer["skipped"]:
        reporter.step(f"setup skipped: the job's venv is up to date ({answer['venv']})")
        return VenvSetup(answer["python"], answer["venv"], True, trainer)
    reporter.step(f"setting up the host's python: a venv at {answer['venv']} "
                  "(first run, or its requirements, python or torch changed)")
    wanted = [*(["-r " + requirements_file] if requirements_file else []), *specs]
    if wanted:
        pinned = f" (torch pinned to {torch_version})" if torch_version else ""
        reporter.step(f"installing {', '.join(wanted)} into it{pinned}")
    answer = _ensure(session, spec, [*argv, "--", *specs])
    for change in answer.get("replaced") or ():
        reporter.step(f"{change} from {index}: the build for {session.name}'s torch {facts.get('torch')}")
    return VenvSetup(answer["python"], answer["venv"], False, trainer)


def _ensure(session: HostSession, spec: JobSpec, argv: Sequence[str]) -> dict[str, Any]:
    """Agent `venv ensure`; a failure (exit 69) shows pip's last lines: nothing is launched."""
    result = session.agent(*argv, timeout=3600)
    if result.exit_code in (ExitCode.UNAVAILABLE, ExitCode.CONFIG):
        doc = parse_json(result, "venv ensure", check=False)
        if doc.get("companion"):
            raise companion_error(session.name, spec, doc, result.exit_code)
        named = spec.get("requirements_file")
        where = f"jobs.{spec.get('name')}.requirements" + (f" ({named})" if named else "")
        fix = (f"check that URL (the requirements' -i / --extra-index-url, or pip's own config on {session.name}: "
               f"`pip config list`) and that {session.name} reaches it" if doc.get("index")
               else f"fix the requirements ({where}) or the host's python (hosts.{session.name}.python)")
        raise ThrustError(
            f"setting up the job's venv on {session.name} failed: {doc.get('error')}\n{doc.get('tail') or ''}".rstrip(),
            f"nothing was launched; {fix} and run again: the venv is made afresh",
            ExitCode.UNAVAILABLE,
        )
    return parse_json(result, "venv ensure")


def companion_error(host: str, spec: JobSpec, doc: Mapping[str, Any], code: int) -> ThrustError:
    """A torch companion the venv could not have in the build for the host's torch (agent/venv.py
    fit_companions): the package, its build and the host's torch, and what makes it fit."""
    comp = doc["companion"]
    name, variant, index = comp["name"], comp.get("variant"), comp.get("index")
    if comp.get("version"):
        built = f"{name} {comp['version']}" + (f" (built for torch {comp['torch']})" if comp.get("torch") else "")
    else:  # refused before pip (agent/venv.py companion_source): PyPI's build is the one pip would take
        built = f"{name} from PyPI"
    needs = [lib for lib in comp.get("libs") or () if "cuda" in lib]
    if needs and variant and not variant.startswith("cu"):
        built += f", a CUDA build (its native code needs {', '.join(needs)})"
    where = f"jobs.{spec.get('name')}.requirements"
    wanted = comp.get("wanted") or f"{name} built for torch {comp.get('host_torch')}"
    if name.lower() not in COMPANIONS:
        why = f"{name} is not one of PyTorch's own packages, which its index builds per variant"
        fix = f"pin a release of {name} built for torch {comp.get('host_torch')} (its install notes say which)"
    elif doc.get("index"):
        why = f"{wanted} comes from {index}, which {host} cannot reach" + (
            f" ({comp['unreachable']})" if comp.get("unreachable") else "")
        fix = (f"let {host} reach {index}, or set `torch_index:` under hosts.{host} to a mirror of it "
               f"(`{{variant}}` stands for {variant})")
    elif index and comp.get("replaced"):
        why = f"neither does the build {index} served"
        fix = f"set `torch_index:` under hosts.{host} to the index {host}'s torch came from"
    elif index:
        why = _not_served(index, wanted, str(doc.get("tail") or ""), comp.get("sought"), comp.get("listed") or [])
        fix = f"set `torch_index:` under hosts.{host} to an index that has it"
    else:
        why = f"{host}'s torch {comp.get('host_torch')} has no variant label, so no index of builds for it is known"
        fix = f"set `torch_index:` under hosts.{host} to the index {host}'s torch came from"
    return ThrustError(
        f"{built} does not fit {host}'s torch {comp.get('host_torch')}: {comp.get('why')}; {why}",
        f"nothing was launched; {fix}, or drop {name} from {where} (or what pulls it in); "
        "the venv is made afresh on the next run",
        code,
    )


# pip's words for "the index has no such build": with --no-deps and one pinned spec, its resolver's
# "conflicting dependencies" (a constraint in pip's own config is enough) means no more than that, and
# misleads (issue 56)
_NOT_LISTED = ("Could not find a version that satisfies", "No matching distribution", "conflicting dependencies",
               "ResolutionImpossible")


def _not_served(index: str, wanted: str, tail: str, sought: str | None, listed: Sequence[str]) -> str:
    """Why `index` could not serve `wanted`: plainly that it lists no such build (with those it does list,
    read from its page by the agent), else pip's own first error."""
    errors = [line for line in tail.splitlines() if line.startswith("ERROR:")]
    if sought or listed or any(words in tail for words in _NOT_LISTED) or not errors:
        return f"{index} lists no {wanted}" + (f" ({sought})" if sought else "") + (
            f" (it lists {', '.join(listed)})" if listed else "")
    return f"{index} could not serve {wanted} ({errors[0]})"
