"""The job's virtualenv on the host: made once per set of requirements, python and torch.

    agent venv ensure --dir D --key K [--constraint SPEC]... [--requirements FILE] [--expect PATH]...
                      [--cwd CHECKOUT] [--torch VERSION [--torch-index URL]] [--check] -- [SPEC...]
        {"python": "D/K/bin/python", "venv": "D/K", "created": bool, "installed": [...], "skipped": bool,
         "missing": [each --expect PATH that does not exist]}
        exit 69 with {"error", "exit_code", "tail", "index", "companion"} when the venv cannot be made or
        pip fails (`index`: the package index pip could not connect to, when that is why; pip runs with
        `--retries 1 --timeout 10`, so an unreachable index fails in seconds); exit 78 when a torch
        companion (`companion`: torchvision...) cannot have a build that loads beside the host's torch
        VERSION, though its index answered (see fit_companions). For a `+cpu` torch both come before
        the venv is made, in seconds, for a companion the requirements name (companion_source)
    agent venv probe '[[DIST, MODULE], ...]'   (run by the venv's python)
        {DIST: "Error: message"} for each module that cannot load there
    agent venv source --torch VERSION --torch-index URL NAME...
        companion_source's answer: whether this python's own NAMEs load beside its torch, else whether
        the variant's index can be reached and lists a build of that variant (doctor --job's row; `venv
        ensure` asks the same before pip for a `+cpu` torch, and refuses at once)

The venv is D/K (K: the caller's hash of the requirements and the python/torch versions), made with
`--system-site-packages` by the python that runs the agent (the host's `python:`), so the host's own
torch is the one a job imports and pip never replaces it (`--constraint torch==X`). `python -m venv`
run by a python that is itself a venv (or a conda env) bases the new venv on the interpreter under it,
whose site-packages lack the user's torch; so a `.pth` file in the new venv names every site directory
the host's python has (docs/architecture.md, "The host agent"). A venv ignores PEP 668's
EXTERNALLY-MANAGED marker: that is what makes Debian 12 / Ubuntu 24.04 system pythons work.

Done means D/K/.thrust-venv.json exists: written last, atomically, so a cut build never counts. The
build runs under an flock on D/K.lock (two runs at once build it once); a directory without the
stamp is a cut build, removed and made again. `--check` only answers (`skipped` false: not built).
`--expect` names files the caller needs next (the trainer payload), to save it a round trip.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import urllib.parse
from collections.abc import Iterator, Sequence

from .files import write_atomic
from .netinfo import page, reach

UNAVAILABLE = 69  # docs/architecture.md, "Exit codes": a failed setup
CONFIG = 78  # docs/architecture.md, "Exit codes": a requirement this host's torch cannot have
STAMP = ".thrust-venv.json"
PTH = "_thrust_host_site.pth"
TAIL_LINES = 15
# pip's defaults (5 retries with backoff, 15 s) spend tens of seconds on an index that cannot be
# reached before its resolver speaks; one retry and 10 s a socket wait fail in seconds, naming it
PIP_RETRIES = 1
PIP_TIMEOUT_S = 10
PYPI = "https://pypi.org/simple"  # pip's index when nothing names another (no "Looking in indexes")
# pip's warning when a request to an index fails to connect: "... after connection broken by 'WHY': /PATH"
_RETRY = re.compile(r"Retrying \(.*?\) after connection broken by '(?P<why>.*)': (?P<path>/\S*)\s*$")
_FETCH = re.compile(r"Could not fetch URL (?P<url>\S+?): (?P<why>.*?)(?: - skipping)?\s*$")


class SetupFailed(Exception):
    def __init__(self, message: str, exit_code: int, output: str, index: str | None = None,
                 companion: dict | None = None) -> None:
        super().__init__(message)
        self.companion = companion  # {"name", "version", "torch", "why", "variant"}: a companion that does not fit
        self.exit_code = exit_code
        self.output = output
        self.tail = "\n".join(output.strip().splitlines()[-TAIL_LINES:])
        self.index = index  # the package index pip could not reach, when that is why it failed


def _reason(why: str) -> str:
    """`Connection refused`, `timed out`, `Failed to resolve 'host'`: the words of a connection error."""
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", why) or re.search(r"(Failed to resolve '[^']+')", why)
    if found:
        return found.group(1).strip()
    return "timed out" if "timed out" in why.lower() else why.split("(", 1)[0].strip() or why


def unreachable_index(output: str) -> tuple[str, str] | None:
    """(index URL, why) when pip's output says it could not connect to a package index, else None.
    The URL is the index (from pip's "Looking in indexes:" line, else PyPI) whose path the failed
    request was under; the host named in the error picks between indexes with the same path."""
    indexes = [PYPI]
    for line in output.splitlines():
        if line.startswith("Looking in indexes: "):
            indexes = [u.strip() for u in line[len("Looking in indexes: "):].split(",") if u.strip()]
    for line in output.splitlines():
        fetched = _FETCH.search(line)
        if fetched and "connection" in fetched.group("why").lower():
            return fetched.group("url"), _reason(fetched.group("why"))
        retry = _RETRY.search(line)
        if not retry:
            continue
        path, why = retry.group("path"), retry.group("why")
        under = [u for u in indexes if u.startswith(("http://", "https://"))
                 and path.startswith(urllib.parse.urlsplit(u).path.rstrip("/") + "/")]
        named = [u for u in under if (urllib.parse.urlsplit(u).hostname or "") in why]
        return ", ".join(named or under or [path]), _reason(why)
    return None


@contextlib.contextmanager
def _locked(path: str) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _stamp(venv: str, key: str) -> dict | None:
    try:
        with open(os.path.join(venv, STAMP)) as fh:
            doc = json.load(fh)
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("key") == key else None


def host_site_dirs() -> list[str]:
    """The host python's own site directories (site-packages, user site, .pth additions), in order.

    The agent runs with `python -S`: site is run here, in this short-lived process, to learn them."""
    if sys.flags.no_site:
        import site

        site.main()
    stdlib = [p for p in {sysconfig.get_path("stdlib"), sysconfig.get_path("platstdlib")} if p]
    out: list[str] = []
    for entry in sys.path[1:]:  # [0] is the agent's own code (its unpacked copy, or the zipapp)
        path = os.path.abspath(entry) if entry else ""
        if not path or not os.path.isdir(path) or path in out:
            continue
        if any(path == s or path.startswith(s.rstrip("/") + "/") for s in stdlib):
            continue
        out.append(path)
    return out


def _run(argv: Sequence[str], what: str, timeout: float = 3600, cwd: str | None = None) -> str:
    proc = subprocess.run(list(argv), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout, check=False, cwd=cwd)
    if proc.returncode != 0:
        raise SetupFailed(f"{what} failed (exit {proc.returncode})", proc.returncode, proc.stdout)
    return proc.stdout


def _site_packages(venv: str) -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return os.path.join(venv, "lib", version, "site-packages")


def _make(venv: str) -> str:
    """A venv at `venv` that sees the host python's packages; returns its python. Without pip of its
    own when the host's pip reaches it through the .pth (seconds saved); ensurepip otherwise."""
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], "python -m venv")
    python = os.path.join(venv, "bin", "python")
    site_dir = _site_packages(venv)
    os.makedirs(site_dir, exist_ok=True)
    dirs = [d for d in host_site_dirs() if not d.startswith(venv.rstrip("/") + "/")]
    write_atomic(os.path.join(site_dir, PTH), "".join(f"{d}\n" for d in dirs).encode(), 0o644)
    probe = subprocess.run([python, "-m", "pip", "--version"], capture_output=True, check=False, timeout=120)
    if probe.returncode != 0:
        try:
            _run([python, "-m", "ensurepip", "--default-pip"], "ensurepip")
        except SetupFailed as exc:
            raise SetupFailed(f"the venv has no pip: the host's python has neither pip nor ensurepip "
                              f"(Debian/Ubuntu: apt-get install python3-venv); {exc}", exc.exit_code,
                              exc.tail) from None
    return python


def _install(python: str, venv: str, constraints: Sequence[str], requirements: str | None,
             specs: Sequence[str], cwd: str | None = None) -> list[str]:
    """pip in `cwd` (the job's checkout): a requirement's `-e .` or `./pkg` means the project's, as pip
    reads them where it runs."""
    wanted = ([f"-r {requirements}"] if requirements else []) + list(specs)
    if not wanted:
        return []
    write_atomic(os.path.join(venv, "constraints.txt"), "".join(f"{c}\n" for c in constraints).encode(), 0o644)
    _pip(python, [*(["-r", requirements] if requirements else []), "--", *specs], venv, cwd)
    return wanted


def _pip(python: str, args: Sequence[str], venv: str, cwd: str | None = None) -> None:
    """`pip install ARGS` with the venv's constraints (torch pinned to the host's), failing in seconds
    on an index it cannot reach, which it then names."""
    argv = [python, "-m", "pip", "install", "--disable-pip-version-check", "--no-input", "--retries",
            str(PIP_RETRIES), "--timeout", str(PIP_TIMEOUT_S), "-c", os.path.join(venv, "constraints.txt")]
    try:
        _run([*argv, *args], "pip install", cwd=cwd)  # the caller's `--`: a spec is never an option
    except SetupFailed as exc:
        found = unreachable_index(exc.output)
        if found is None:
            raise
        raise SetupFailed(f"pip could not reach the package index {found[0]} ({found[1]})", exc.exit_code,
                          exc.output, found[0]) from None


# ------------------------------------------------------------------ torch's companions (issue 56)
# torchvision / torchaudio, and any wheel whose native code links libtorch, are built for one torch
# release AND variant: PyPI's Linux torchvision is a CUDA build, whose _C.so needs libtorch_cuda.so,
# so beside a `+cpu` torch it dies at import ("operator torchvision::nms does not exist"). pip sees
# only versions, so it picks the right release (the companion's `Requires-Dist: torch==X` against the
# venv's torch constraint) and maybe the wrong build. Each one the venv got is imported in it; one
# that fails is replaced by the build of the same release for the host torch's variant, from that
# variant's index (`--torch-index`, as PyTorch's install instructions do), or the setup is refused.
COMPANIONS = ("torchvision", "torchaudio")
_LIBTORCH = re.compile(rb"(?:libtorch|libc10)\w*\.so")


def _metadata(dist_info: str) -> tuple[str, str, list[str]]:
    """(Name, Version, Requires-Dist lines) of a .dist-info directory."""
    name = version = ""
    requires: list[str] = []
    with open(os.path.join(dist_info, "METADATA"), errors="replace") as fh:
        for line in fh:
            if not line.strip():
                break  # the body (the description) follows the headers
            key, _, value = line.partition(":")
            value = value.strip()
            if key == "Name":
                name = value
            elif key == "Version":
                version = value
            elif key == "Requires-Dist":
                requires.append(value)
    return name, version, requires


def _files(site: str, dist_info: str) -> list[str]:
    """The paths (relative to site-packages) a dist installed, from its RECORD."""
    try:
        with open(os.path.join(site, dist_info, "RECORD"), errors="replace") as fh:
            return [line.split(",", 1)[0] for line in fh if line.strip()]
    except OSError:
        return []


def _links_libtorch(site: str, files: Sequence[str]) -> list[str]:
    """The libtorch / libc10 libraries the dist's native code names (what the dynamic linker needs)."""
    found: set[str] = set()
    for rel in files:
        if rel.endswith(".so") or ".so." in os.path.basename(rel):
            try:
                with open(os.path.join(site, rel), "rb") as fh:
                    found.update(m.decode() for m in _LIBTORCH.findall(fh.read()))
            except OSError:
                continue
    return sorted(found)


def companions(venv: str) -> list[dict]:
    """The torch companions the venv itself holds: {"name", "version", "module", "torch" (its torch
    pin), "libs" (the libtorch libraries its native code names)}."""
    site = _site_packages(venv)
    out = []
    for entry in sorted(os.listdir(site)) if os.path.isdir(site) else []:
        if not entry.endswith(".dist-info"):
            continue
        try:
            name, version, requires = _metadata(os.path.join(site, entry))
        except OSError:
            continue
        pin = next((r for r in requires if re.match(r"torch\s*\(?\s*==", r)), None)
        wants_torch = any(re.match(r"torch\b(?![-_.\w])", r) for r in requires)
        if not wants_torch and name.lower() not in COMPANIONS:
            continue
        files = _files(site, entry)
        libs = _links_libtorch(site, files)
        if name.lower() not in COMPANIONS and not libs:
            continue  # pure python on top of torch: nothing built for one torch
        tops = [f.split("/", 1)[0] for f in files if f.count("/") == 1 and f.endswith("/__init__.py")]
        out.append({"name": name, "version": version, "module": tops[0] if tops else name.lower(),
                    "torch": re.sub(r"^torch\s*\(?\s*==\s*([^\s;)]+).*$", r"\1", pin) if pin else None,
                    "libs": libs})
    return out


def _unfit(python: str, found: Sequence[dict]) -> dict[str, str]:
    """{name: why} of each companion that cannot load beside the host's torch: `venv probe`, run by the
    venv's python (this agent's own code on its path, wherever it lies: the zipapp, or a checkout)."""
    root = os.path.abspath(__file__)
    for _ in range(len(__package__.split(".")) + 1):
        root = os.path.dirname(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])}
    pairs = json.dumps([[c["name"], c["module"]] for c in found])
    proc = subprocess.run([python, "-m", __package__, "venv", "probe", pairs], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600, check=False, env=env)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines or not lines[-1].startswith("{"):
        raise SetupFailed(f"the companions' import check failed (exit {proc.returncode})", proc.returncode,
                          proc.stdout)
    return json.loads(lines[-1])


def probe(pairs: Sequence[Sequence[str]]) -> dict[str, str]:
    """{dist: "Error: message"} of each (dist, module) that cannot load here, torch imported once. A
    torchvision built for another torch may even import; one of its C++ ops on a tiny tensor cannot run."""
    import importlib

    bad = {}
    for dist, module in pairs:
        try:
            loaded = importlib.import_module(module)
            if module == "torchvision":
                torch = sys.modules["torch"]  # torchvision imported it: only the venv's python has torch
                loaded.ops.nms(torch.zeros(1, 4), torch.zeros(1), 0.5)
        except BaseException as exc:  # noqa: BLE001 - whatever a broken native module raises is the answer
            bad[dist] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    return bad


def fit_companions(python: str, venv: str, torch: str | None, index: str | None) -> list[str]:
    """Each companion in the venv loads beside the host's torch, or is replaced by the build for its
    variant from `index` (returned: `torchvision 0.28.0 -> torchvision==0.28.0+cpu`); else SetupFailed
    with `companion` (the package, its build, the host's torch)."""
    found = companions(venv)
    bad = _unfit(python, found) if found else {}
    if not bad:
        return []
    replaced = []
    variant = (torch or "").partition("+")[2]
    for comp in found:
        why = bad.get(comp["name"])
        if why is None:
            continue
        doc = {**comp, "why": why, "host_torch": torch, "variant": variant, "index": index}
        if not (variant and index) or comp["name"].lower() not in COMPANIONS:  # only PyTorch's own have variants
            raise SetupFailed(f"{comp['name']} {comp['version']} does not load beside the host's torch {torch}: "
                              f"{why}", CONFIG, "", companion=doc)
        public = comp["version"].partition("+")[0]
        want = f"{comp['name']}=={public}+{variant}"
        try:  # --no-deps: its dependencies are in already, and torch is never to be pulled in
            _pip(python, ["--no-deps", "--force-reinstall", "--index-url", index, "--", want], venv)
        except SetupFailed as exc:
            listed = [] if exc.index else _listed(index, comp["name"], variant)
            raise SetupFailed(f"{comp['name']} {comp['version']} does not load beside the host's torch {torch} "
                              f"({why}), and {want} could not be installed from {index}: {exc}", exc.exit_code,
                              exc.output, exc.index, {**doc, "wanted": want, "listed": listed}) from None
        replaced.append(f"{comp['name']} {comp['version']} -> {want}")
    still = _unfit(python, found)
    if still:
        name, why = next(iter(still.items()))
        comp = next(c for c in found if c["name"] == name)
        raise SetupFailed(f"{name} from {index} still does not load beside the host's torch {torch}: {why}",
                          CONFIG, "", companion={**comp, "why": why, "host_torch": torch, "variant": variant,
                                                 "index": index, "replaced": True})
    return replaced


# a requirement line naming one of PyTorch's companions (what pip reads: the name first)
_NAMED = re.compile(r"^\s*(torchvision|torchaudio)(?![\w.-])", re.IGNORECASE | re.MULTILINE)
REACH_S = 5  # an index that does not answer a TCP connect in this long is unreachable


def named_companions(specs: Sequence[str], file_text: str = "") -> list[str]:
    """The companions (torchvision...) a job's requirements name directly, sorted."""
    return sorted({m.lower() for m in _NAMED.findall("\n".join([*specs, file_text]))})


def _index_page(index: str, name: str) -> tuple[str | None, str]:
    """(the text of the companion's page in the index, where it is), or (None, where and why not): a
    file:// index is a PEP 503 layout on this host's disk (INDEX/NAME/index.html, what pip reads there)."""
    url = urllib.parse.urlsplit(index)
    if url.scheme == "file":
        where = f"{urllib.parse.unquote(url.path).rstrip('/')}/{name}/index.html"
        try:
            with open(where, errors="replace") as fh:
                return fh.read(), where
        except OSError as exc:
            return None, f"{where}: {exc.strerror}"
    where = f"{index.rstrip('/')}/{name}/"
    answer = page(where, REACH_S)
    return (answer["text"], where) if answer["ok"] else (None, f"{where}: {answer['error']}")


def _listed(index: str, name: str, variant: str) -> list[str]:
    """The versions of `name` built for `variant` that the index's page lists (its wheels' names): what
    to say when pip, asked for one it lacks, speaks of "conflicting dependencies" instead."""
    text, _ = _index_page(index, name)
    found = re.findall(rf"{re.escape(name)}-([\w.!]+\+{re.escape(variant)})-", urllib.parse.unquote(text or ""))
    return sorted(set(found))


def companion_source(named: Sequence[str], torch: str, index: str) -> dict:
    """Where the job's venv would get each named companion built for this python's `torch`: the one this
    python already has when it loads beside that torch (`loaded`: pip keeps it), else the variant's
    `index`: `error` when it cannot be reached, `missing` the companions whose page lists no build of
    the variant (`sought`: where each was looked for). doctor --job's row and `venv ensure`'s refusal
    before pip read this one answer."""
    variant = torch.partition("+")[2]
    try:
        bad = _unfit(sys.executable, [{"name": n, "module": n} for n in named])
    except SetupFailed:
        bad = {n: "the import check failed" for n in named}
    need = [n for n in named if n in bad]
    answer: dict = {"named": list(named), "torch": torch, "index": index, "variant": variant,
                    "loaded": [n for n in named if n not in bad], "error": None, "missing": [], "sought": {}}
    url = urllib.parse.urlsplit(index)
    if not need or url.scheme not in ("file", "http", "https") or (url.scheme != "file" and not url.hostname):
        return answer
    if url.scheme != "file":
        port = url.port or (443 if url.scheme == "https" else 80)
        reached = reach(url.hostname or "", port, REACH_S)
        if not reached["ok"]:
            return {**answer, "error": reached["error"], "address": f"{url.hostname}:{port}"}
    for name in need:
        text, where = _index_page(index, name)
        if f"+{variant}-" not in urllib.parse.unquote(text or ""):
            answer["missing"].append(name)
            answer["sought"][name] = where if text is None else f"{where} lists none"
    return answer


def _refuse_early(named: Sequence[str], torch: str, index: str) -> None:
    """Before pip (seconds, not the install's minute): a `+cpu` torch can load no companion PyPI has
    (its Linux builds are CUDA ones), so one the host's python lacks must come from the variant's index;
    when that cannot be reached (69) or lists no such build (78), the setup is refused now."""
    answer = companion_source(named, torch, index)
    name = next(iter(answer["sought"]), None) if not answer["error"] else next(
        (n for n in named if n not in answer["loaded"]), None)
    if name is None:
        return
    doc = {"name": name, "version": None, "torch": None, "libs": [], "host_torch": torch, "variant": "cpu",
           "index": index, "wanted": f"{name} built for torch {torch}", "early": True,
           "why": "PyPI's Linux builds of it are CUDA ones, whose native code needs libtorch_cuda.so, "
                  "which a +cpu torch lacks", "sought": answer["sought"].get(name), "unreachable": answer["error"]}
    if answer["error"]:
        raise SetupFailed(f"{index} cannot be reached ({answer['error']}) for {name}", UNAVAILABLE, "", index, doc)
    raise SetupFailed(f"{index} lists no +cpu build of {name} ({doc['sought']})", CONFIG, "", companion=doc)


def ensure(root: str, key: str, constraints: Sequence[str], requirements: str | None, specs: Sequence[str],
           check: bool = False, cwd: str | None = None, torch: str | None = None,
           torch_index: str | None = None) -> dict:
    venv = os.path.join(root, key)
    answer = {"python": os.path.join(venv, "bin", "python"), "venv": venv, "created": False, "installed": [],
              "skipped": True}
    if _stamp(venv, key) is not None:
        return answer
    answer["skipped"] = False
    if check:
        return answer
    os.makedirs(root, mode=0o700, exist_ok=True)
    with _locked(f"{venv}.lock"):
        if _stamp(venv, key) is not None:  # another run built it while we waited
            return {**answer, "skipped": True}
        if os.path.lexists(venv):  # a cut build: never half-trusted
            shutil.rmtree(venv)
        named = named_companions(specs, _read(requirements))
        if named and torch and torch.endswith("+cpu") and torch_index:
            _refuse_early(named, torch, torch_index)
        python = _make(venv)
        installed = _install(python, venv, constraints, requirements, specs, cwd)
        replaced = fit_companions(python, venv, torch, torch_index)
        stamp = {"key": key, "constraints": list(constraints), "requirements": requirements, "specs": list(specs),
                 "base": sys.executable}
        write_atomic(os.path.join(venv, STAMP), json.dumps(stamp).encode(), 0o644)
    return {**answer, "python": python, "created": True, "installed": installed, "replaced": replaced}


def _read(path: str | None) -> str:
    try:
        with open(path or "", errors="replace") as fh:
            return fh.read()
    except OSError:  # no file named, or one pip will name in its own error
        return ""


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="agent venv")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("ensure")
    p.add_argument("--dir", required=True, help="where the venvs live (<workdir>/.thrust/venvs)")
    p.add_argument("--key", required=True)
    p.add_argument("--constraint", action="append", default=[], help="a pip constraint, e.g. torch==2.13.0")
    p.add_argument("--requirements", help="a requirements file (absolute)")
    p.add_argument("--cwd", help="where pip runs: the job's checkout (relative paths in requirements)")
    p.add_argument("--expect", action="append", default=[], help="a path to report in `missing` when absent")
    p.add_argument("--check", action="store_true", help="only say whether the venv is ready")
    p.add_argument("--torch", help="the host torch's version as it says (2.13.0+cpu): its companions must fit it")
    p.add_argument("--torch-index", help="the index of the companions built for that torch's variant")
    p.add_argument("specs", nargs="*")
    q = sub.add_parser("probe", help="(run by a job's venv python) which of these companions cannot load")
    q.add_argument("pairs", help='JSON [[dist, module], ...]')
    r = sub.add_parser("source", help="where the named companions built for TORCH would come from")
    r.add_argument("--torch", required=True)
    r.add_argument("--torch-index", required=True)
    r.add_argument("names", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "source":
        print(json.dumps(companion_source(args.names, args.torch, args.torch_index)))
        return 0
    if args.cmd == "probe":
        print(json.dumps(probe(json.loads(args.pairs))))
        return 0
    if "/" in args.key or args.key in ("", ".", ".."):
        parser.error(f"--key {args.key!r}: expected a plain name")
    missing = [path for path in args.expect if not os.path.exists(path)]
    try:
        answer = ensure(args.dir, args.key, args.constraint, args.requirements, args.specs, check=args.check,
                        cwd=args.cwd, torch=args.torch, torch_index=args.torch_index)
    except (SetupFailed, OSError, subprocess.TimeoutExpired) as exc:
        tail = exc.tail if isinstance(exc, SetupFailed) else ""
        companion = getattr(exc, "companion", None)
        print(json.dumps({"error": str(exc), "exit_code": getattr(exc, "exit_code", None), "tail": tail,
                          "index": getattr(exc, "index", None), "missing": missing, "companion": companion}))
        sys.stderr.write(f"venv ensure: {exc}\n{tail}\n")
        # a companion the index cannot serve for this torch is the requirement's to change (78); an
        # index that cannot be reached, like every other failed setup, is 69
        return CONFIG if companion and not getattr(exc, "index", None) else UNAVAILABLE
    print(json.dumps({**answer, "missing": missing}))
    return 0
