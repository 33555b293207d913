"""The package rules of docs/architecture.md ("Packages and what each may import"), checked on the
source: what runs on a host imports only the standard library, the trainer never imports the tool,
the tool takes only the torch-free flag table from the trainer, and no room outgrows one reading."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

from import_graph import ROOT, agent_imports, import_circle, module_imports

STDLIB = set(sys.stdlib_module_names) | {"__future__"}
# envcheck's torch probe: the one module that imports torch on purpose, in a child process with a
# timeout, so a broken torch becomes a fact in the report instead of a crash
PROBES_TORCH = {"envcheck/torch_child.py"}
# run by the job's venv python with site-packages on (tensorboard's reader): tests/test_agent.py checks it
VENV_ONLY = {"thrust_remote/agent/scalars.py"}


def imports(package: str) -> dict[str, set[str]]:
    """module path -> the top-level names it imports (relative imports count as the package)."""
    out: dict[str, set[str]] = {}
    for path in (ROOT / package).rglob("*.py"):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom):
                names.add("." if node.level else node.module or "")
        out[str(path.relative_to(ROOT))] = names
    return out


def test_host_side_packages_import_only_the_standard_library():
    for package in ("thrust_remote/agent", "envcheck"):
        own = package.split("/")[-1]
        for module, names in imports(package).items():
            if module in PROBES_TORCH | VENV_ONLY:
                continue
            foreign = {n for n in names if n != "." and n.split(".")[0] not in STDLIB
                       and not n.startswith(own) and not n.startswith(package.replace("/", "."))}
            assert not foreign, f"{module} imports {foreign}: the host may not have them"


def test_trainer_never_imports_the_tool_and_the_tool_takes_only_trainer_args():
    for module, names in imports("trainer").items():
        assert not {n for n in names if n.startswith("thrust_remote")}, module
    for module, names in imports("thrust_remote").items():
        trainer = {n for n in names if n.split(".")[0] == "trainer"}
        assert trainer <= {"trainer.args"}, f"{module} imports {trainer} (torch) on the laptop"


def test_the_laptop_imports_none_of_the_local_extra():
    """torch, onnxscript and gymnasium are pyproject's `local` extra (a plain install lacks them: a run on
    a remote host never needs them here): no module of thrust_remote/ or envcheck/ imports one, at import
    time or later, but envcheck's torch probe (a child process, on the host). The extra names exactly
    the modules the local host's check asks for, and the base dependencies name none of them."""
    import tomllib

    from thrust_remote.run.preflight import LOCAL_EXTRA_MODULES

    for package in ("thrust_remote", "envcheck"):
        for module, names in imports(package).items():
            if module not in PROBES_TORCH:
                reached = {n for n in names if n.split(".")[0] in LOCAL_EXTRA_MODULES}
                assert not reached, f"{module} imports {reached}: a plain install has none of them"
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extra = [dep.split(">")[0].split("=")[0] for dep in project["optional-dependencies"]["local"]]
    assert sorted(extra) == sorted(LOCAL_EXTRA_MODULES)
    assert not [d for d in project["dependencies"] if d.split(">")[0].split("=")[0] in LOCAL_EXTRA_MODULES]


def test_no_room_over_the_size_limits_and_no_host_program_in_a_string():
    result = subprocess.run([sys.executable, "tools/room_sizes.py"], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_every_package_directory_is_in_the_wheel():
    """A subpackage missing from pyproject's list works in the editable install and is absent from a
    wheel: the agent, say, would never reach a host."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {str(p.parent.relative_to(ROOT)).replace("/", ".")
             for top in ("thrust_remote", "envcheck", "trainer") for p in (ROOT / top).rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"


def _string_constants(path: Path) -> list[tuple[int, str]]:
    return [(node.lineno, node.value) for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Constant) and isinstance(node.value, str)]


def test_the_host_protocol_is_spelled_once():
    """A run's states, the run directory's file names and the agent's exit codes live in
    thrust_remote/agent/protocol.py, which both sides import; no other module spells a state or one of
    those file names (`exit_code`, a file too, is also a JSON key everywhere). RUNNING is also an
    Optuna trial state: optimize/ may spell that one word."""
    from thrust_remote.agent import protocol

    states = {s.value for s in protocol.RunState}
    files = {protocol.RUN_JSON, protocol.PEER_FAILED, protocol.MODEL, protocol.MANIFEST,
             protocol.METRICS, protocol.PATCH, f"{protocol.RUN_DIR_PREFIX}"}
    found = []
    for path in sorted((ROOT / "thrust_remote").rglob("*.py")):
        rel = str(path.relative_to(ROOT))
        if rel == "thrust_remote/agent/protocol.py":
            continue
        in_optimize = rel.startswith(("thrust_remote/optimize/", "thrust_remote/cli/optimize"))
        trial_words = {"RUNNING"} if in_optimize else set()
        found += [f"{rel}:{line}: {value!r}" for line, value in _string_constants(path)
                  if (value in states - trial_words) or value in files]
    assert not found, "spelled outside agent/protocol.py:\n" + "\n".join(found)


# thrust_remote's folders and what each may import of the others (docs/architecture.md, "Packages and
# what each may import"): the lower rooms never reach up; only cli/ (the edge) sees every room.
FOLDER_RULES = {
    "core": set(),
    "agent": set(),  # stdlib only, checked above
    "host": {"core", "agent"},
    "fetch": {"core", "host", "agent"},
    "runs": {"core", "host", "agent", "fetch"},
    # envcheck's report and the rendezvous facts: host/report.py, netinfo.py; the host's kind adds rows
    # (backend.doctor_checks), and a cluster's backend gives them from doctor/cluster.py
    "doctor": {"core", "host", "agent", "backends"},
    # how a run is launched on each kind of host: it plans with run's stages (the GPU choice, the job's
    # argv, launch_prepared) and the agent's wire (runs/control.py); run's lifecycle, handle, following
    # and multinode ask it. Both ways, one module direction each: test_backends_and_the_modules_they_use_
    # _import_no_circle
    "backends": {"core", "host", "agent", "fetch", "runs", "run", "doctor"},
    "run": {"core", "host", "agent", "fetch", "runs", "backends"},
    "optimize": {"core", "host", "agent", "run", "runs", "backends"},
    "play": {"core", "fetch"},
    "cli": {"core", "host", "agent", "fetch", "runs", "doctor", "run", "optimize", "play", "backends"},
}
# single modules a folder may import outside its rule, each named whole (never its folder), and why
MODULES_ALLOWED = {
    # the host protocol: stdlib only and imported by both sides, so config checks thrust.yaml against
    # the words the agent acts on (a `resume:` template's "{checkpoint}", retry's `max-duration`)
    # instead of keeping copies of them that could drift
    "core": {"thrust_remote.agent.protocol"},
}


def _imported_modules(node: ast.ImportFrom) -> list[str]:
    """The thrust_remote modules (or folders) an absolute import names: `from thrust_remote.agent import
    protocol` names thrust_remote.agent.protocol, `from thrust_remote.agent.protocol import X` the same."""
    module = node.module or ""
    if len(module.split(".")) > 2:
        return [module]
    return [f"{module}.{a.name}" for a in node.names]


def test_each_folder_imports_only_the_folders_its_rule_names():
    broken = []
    for path in sorted((ROOT / "thrust_remote").rglob("*.py")):
        parts = path.relative_to(ROOT / "thrust_remote").parts
        if len(parts) == 1:
            continue
        folder = parts[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("thrust_remote"):
                for module in _imported_modules(node):
                    reached = module.split(".")[1]
                    if reached != folder and reached not in FOLDER_RULES[folder] \
                            and module not in MODULES_ALLOWED.get(folder, set()):
                        broken.append(f"{path.relative_to(ROOT)}:{node.lineno}: {folder}/ imports {module}")
    assert not broken, "\n".join(broken)


def test_core_takes_the_protocol_words_it_checks_from_the_protocol():
    """core/ may import one module outside itself, the host protocol (MODULES_ALLOWED), so it keeps no
    copy of a word the agent acts on (a copy of "{checkpoint}" once lived in core/config with a test that
    it equals the protocol's): a `resume:` template's field and retry's `max-duration` are imported. The
    allowance is that module by name, never the agent's folder."""
    from thrust_remote.agent import protocol

    words = {protocol.CHECKPOINT_FIELD, protocol.MAX_DURATION}
    found = [f"{path.relative_to(ROOT)}:{line}: {value!r}"
             for path in sorted((ROOT / "thrust_remote/core").rglob("*.py"))
             for line, value in _string_constants(path) if value in words]
    assert not found, "spelled in core/ rather than imported from agent/protocol.py:\n" + "\n".join(found)
    allowed = MODULES_ALLOWED["core"]
    for text, ok in (("from thrust_remote.agent.protocol import RUN_JSON", True),
                     ("from thrust_remote.agent import protocol", True),
                     ("from thrust_remote.agent import protocol, runjson", False),
                     ("from thrust_remote.agent.runjson import load", False),
                     ("from thrust_remote import agent", False)):
        node = ast.parse(text).body[0]
        assert isinstance(node, ast.ImportFrom)
        assert all(m in allowed for m in _imported_modules(node)) is ok, text


def test_every_module_lives_in_a_folder_named_for_what_it_does():
    loose = sorted(p.name for p in (ROOT / "thrust_remote").glob("*.py"))
    assert set(FOLDER_RULES) == {p.name for p in (ROOT / "thrust_remote").iterdir()
                                 if p.is_dir() and (p / "__init__.py").exists()}
    assert len(loose) <= 6, loose


def test_the_agent_has_no_import_circle():
    """Each agent module imports only modules below it (docs/architecture.md, "The host agent"): a circle,
    even through imports inside functions, is two modules that cannot be read, tested or changed apart
    (agent/slurm.py had grown a reader of run.json of its own, without RUN_JSON_MAX, to avoid one)."""
    graph = agent_imports()
    assert graph["runs"] >= {"supervisor"} and "protocol" in graph["supervisor"]  # the graph sees imports
    circle = import_circle(sorted(graph), graph.__getitem__)
    assert circle is None, "agent import circle: " + " -> ".join(circle or ())


def test_a_status_imports_none_of_what_tree_add_needs(tmp_path):
    """Each agent subcommand imports its own modules only (agent/__main__.py's COMMANDS): a `status`, every
    2 s of a follow and compiled afresh in a zipapp, reads a run's tree size (agent/treesize.py) without
    the tree-add's module and the transfer helper it brings."""
    code = ("import contextlib, io, json, sys\n"
            "from thrust_remote.agent.__main__ import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            f"    main(['status', '--run-dir', {str(tmp_path / 'r1')!r}])\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('thrust_remote.agent.'))))\n")
    done = subprocess.run([sys.executable, "-S", "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(ROOT)})
    loaded = set(json.loads(done.stdout))
    assert "thrust_remote.agent.runs" in loaded and "thrust_remote.agent.treesize" in loaded
    assert not loaded & {"thrust_remote.agent.trees", "thrust_remote.agent.xfer", "thrust_remote.agent.launcher",
                         "thrust_remote.agent.listing"}, sorted(loaded)


def test_backends_and_the_modules_they_use_import_no_circle():
    """backends/ and run/ (and doctor/) import each other as folders, never as modules: what a backend
    takes from run/ (stages, jobs, gpus, vocab) and doctor/ (cluster) never reaches backends back, so
    each can be read and changed without the other's caller (docs/architecture.md, "Backends")."""
    def followed(module: str) -> set[str]:
        return {m for m in module_imports(module)
                if m.startswith(("thrust_remote.backends", "thrust_remote.run", "thrust_remote.doctor"))}

    backends = [f"thrust_remote.backends.{p.stem}".removesuffix(".__init__")
                for p in sorted((ROOT / "thrust_remote" / "backends").glob("*.py"))]
    circle = import_circle(backends, followed)
    assert circle is None, "import circle: " + " -> ".join(circle or ())
