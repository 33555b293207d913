"""Data that is not in git, for a run's own tree (docs/architecture.md, "Trees"):

- `files:` laptop paths (files or whole directories) sent to the host by content: each file once per
  host into its content store (`<workdir>/.thrust/store`), only a changed one again, then placed into
  every run's tree at the same path (a hard link: a 10 GB dataset in ten trees is 10 GB on disk). The
  laptop hashes a file again only when its size, mtime or inode changed (`.thrust/files-index.json`).
- `setup:` an argv run in the run's tree before the job, with the job's venv first on PATH; once per
  host for the same inputs (the argv, the content of the files of the commit it names, the `files:`),
  its outputs (every file it made or changed in the tree) kept in the store and placed into later trees
  instead of running it again. Its failure stops the run before it is launched, with its output's end.
- `shared:` paths of the tree that persist across runs on a host: one host-side directory each
  (`<workdir>/.thrust/shared/PATH`), linked in, for what a job downloads or caches itself.

On host `local` the project itself is the tree: `files:` are where they are, `shared:` is moot, and
`setup:` runs in the project once per inputs.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import re
import shlex
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from thrust_remote.core.config import Config, JobConfig
from thrust_remote.core.errors import ConfigError, ExitCode, ThrustError
from thrust_remote.core.hints import command_hint
from thrust_remote.host.runner import FileChangedError
from thrust_remote.host.session import HostSession
from thrust_remote.run.jobs import config_label
from thrust_remote.run.repo import git as _git
from thrust_remote.run.sync import LocalState, SyncResult, Tree, TreeData, TreeRefused, check_room, make_tree

INDEX = Path(".thrust") / "files-index.json"  # the laptop's hashes of `files:`, by path, size, mtime, inode
SETUP_LAYOUT = 1  # what a setup key is made of; bumped when that changes
SETUP_TIMEOUT_S = 6 * 3600.0  # a data download may take long; a hung one should not hold forever


class Steps:
    """What this module tells the user (vocab.Reporter's step and warn)."""

    def step(self, message: str) -> None: ...

    def warn(self, message: str) -> None: ...


@dataclass(frozen=True)
class JobData:
    """A job's `files:`, `setup:` and `shared:`: its own, else the top level's, resolved once from the job
    (job_data) with where each is said in thrust.yaml (`where`, by key: what a message names)."""

    files: tuple[str, ...]
    setup: tuple[str, ...]
    shared: tuple[str, ...]
    where: Mapping[str, str] = field(default_factory=dict)

    @property
    def any(self) -> bool:
        return bool(self.files or self.setup or self.shared)


def job_data(config: Config, job: JobConfig) -> JobData:
    return JobData(config.files if job.files is None else job.files,
                   config.setup if job.setup is None else job.setup,
                   config.shared if job.shared is None else job.shared,
                   {key: _where(config, job, key) for key in ("files", "setup", "shared")})


def _where(config: Config, job: JobConfig, key: str) -> str:
    """`thrust.yaml:LINE: jobs.NAME.KEY` (or the top level's key) for a message."""
    label = config_label(config.path)
    if getattr(job, key) is not None:
        line = job.lines.get(key)
        return f"{label}:{line}: jobs.{job.name}.{key}" if line else f"{label}: jobs.{job.name}.{key}"
    line = config.data_lines.get(key)
    return f"{label}:{line}: {key}" if line else f"{label}: {key}"


# ------------------------------------------------------------------------------------------ files:

@dataclass(frozen=True)
class LocalFile:
    path: Path  # on the laptop: the file itself (a link's target, inside the project), what is sent
    sha256: str
    size: int
    mtime_ns: int
    ident: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of what was hashed: it alone may be sent


def check_local(config: Config, data: JobData) -> None:
    """Every `files:` path is on the laptop, inside the project, and so is every file under a directory
    it names once its links are resolved: 78 naming the line (and the link, and where it leads), before
    any host."""
    where = data.where["files"]
    for rel in data.files:
        if not os.path.lexists(config.root / rel):
            raise ConfigError(f"{where}: {rel} does not exist in {config.root}",
                              "fix the path, or make the file first (files: sends what is on this machine)")
        _files_of(config.root, rel, where)
    _check_setup_script(config, data)


# a setup's word that names a script of the repository: what an interpreter runs, by its suffix
SCRIPT_SUFFIXES = (".py", ".sh", ".bash", ".pl", ".rb", ".R", ".jl", ".js")
INTERPRETER = re.compile(r"^(python[0-9.]*|sh|bash|dash|zsh|perl|ruby|Rscript|julia|node)\Z")
INLINE = ("-c", "-m", "-e", "-E")  # code or a module on the command line: no script file follows


def setup_script(argv: tuple[str, ...]) -> str | None:
    """The repository file a `setup:` runs, when it clearly names one: its program given as a relative
    path (`scripts/prepare.sh`), or an interpreter's first argument with a script's suffix
    (`python data/prepare.py`); None for anything else (a command on PATH, `sh -c '...'`, `python -m`)."""
    if not argv:
        return None
    word = argv[0] if "/" in argv[0] and not argv[0].startswith(("/", "~", "$")) else None
    if word is None and INTERPRETER.match(posixpath.basename(argv[0])):
        for arg in argv[1:]:
            if arg in INLINE:
                return None
            if not arg.startswith("-"):
                word = arg if arg.endswith(SCRIPT_SUFFIXES) else None
                break
    if word is None or word.startswith(("/", "~", "$")) or re.search(r"[*?\[\]$`'\"\\\s]", word):
        return None
    path = posixpath.normpath(word)
    return None if path.startswith("..") or path == "." else path


def _check_setup_script(config: Config, data: JobData) -> None:
    """A `setup:` that runs a script the repository lacks fails on the host after the sync and the venv
    (minutes on a cluster): 78 here, naming the line, as for `script:`. The tree it runs in is the
    repository's root; a file found at neither the root nor beside thrust.yaml is refused."""
    path = setup_script(data.setup)
    if path is None:
        return
    top = _git(config.root, "rev-parse", "--show-toplevel", check=False)
    roots = [config.root, *([Path(top.stdout.decode().strip())] if top.returncode == 0 else [])]
    if not any((root / path).is_file() for root in roots):
        raise ConfigError(f"{data.where['setup']}: {path} does not exist in {roots[-1]}",
                          f"setup: runs in the run's tree, the repository's root: fix the path, or add the script "
                          f"and commit it (git add {path} && git commit)")


def _files_of(root: Path, rel: str, where: str) -> list[tuple[str, Path, os.stat_result]]:
    """(its path in the tree, the file sent, that file's lstat when judged) for each file `rel` names:
    itself, or every regular file under it. A directory is walked through descriptors (os.fwalk), so a
    directory swapped for a link meanwhile is not entered, and a link to a directory is never entered (no
    loop). A link to a file goes as its target's content when that is inside the project, and is refused
    (78) when it leads outside or nowhere: nothing leaves the laptop that is not the project's once its
    links are resolved."""
    top = root / rel
    project = root.resolve()
    real_top = _inside(project, top, rel, where)  # the named path itself (a link too) leads inside
    named = top.relative_to(root)
    if not real_top.is_dir():
        return [(named.as_posix(), real_top, os.stat(real_top, follow_symlinks=False))] if real_top.is_file() else []
    out = []
    for base, dirs, names, dir_fd in os.fwalk(real_top):
        dirs.sort()
        inner = named / Path(base).relative_to(real_top)
        for name in sorted(names):
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            key = (inner / name).as_posix()
            if stat.S_ISLNK(st.st_mode):
                real = _inside(project, Path(base) / name, key, where)
                if real.is_file():
                    out.append((key, real, os.stat(real, follow_symlinks=False)))
            elif stat.S_ISREG(st.st_mode):
                out.append((key, Path(base) / name, st))
    return out


def _inside(project: Path, path: Path, shown: str, where: str) -> Path:
    """`path` with its links resolved; a ConfigError when that is outside `project` or nothing at all."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):  # nothing there, or a loop of links
        target = os.readlink(path) if path.is_symlink() else None
        if target is None:
            raise ConfigError(f"{where}: {shown} does not exist (a directory on its way is a link to nothing)",
                              "fix the path, or make the file first (files: sends what is on this machine)") \
                from None
        raise ConfigError(f"{where}: {shown} is a link to {target}, which does not exist",
                          "make what it points to (files: sends what is on this machine), or remove the link") \
            from None
    if real != project and project not in real.parents:
        raise ConfigError(f"{where}: {shown} is a link that leads outside the project ({real})"
                          if path.is_symlink() else f"{where}: {shown} leads outside the project ({real})",
                          "files: sends files of the project; copy the data in (or link it from a path "
                          "inside the project)")
    return real


def local_files(root: Path, paths: tuple[str, ...], where: str = "files:") -> dict[str, LocalFile]:
    """Each file `paths` names (a directory: every regular file under it, links to files of the project
    followed; `_files_of`), by its path relative to `root`, with its sha256 (from the laptop's index
    while unchanged). A file is read only through a descriptor opened without following a link."""
    index_path = root / INDEX
    try:
        index = json.loads(index_path.read_text())
    except (OSError, ValueError):
        index = {}
    out, fresh = {}, {}
    for rel in paths:
        for key, path, st in _files_of(root, rel, where):
            seen = [st.st_size, st.st_mtime_ns, st.st_ino]
            known = index.get(key)
            if isinstance(known, list) and len(known) == 4 and known[:3] == seen:
                sha = known[3]
            else:
                sha, st = _hash(path, (st.st_dev, st.st_ino))
                seen = [st.st_size, st.st_mtime_ns, st.st_ino]
            fresh[key] = [*seen, sha]
            out[key] = LocalFile(path, sha, st.st_size, st.st_mtime_ns, (st.st_dev, st.st_ino))
    if fresh != {k: index.get(k) for k in fresh}:
        index.update(fresh)
        index_path.parent.mkdir(parents=True, exist_ok=True)
        tmp = index_path.with_name(f".{index_path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(index))
        os.replace(tmp, index_path)
    return out


def _hash(path: Path, ident: tuple[int, int]) -> tuple[str, os.stat_result]:
    """sha256 of the file at `path`, read from a descriptor opened with O_NOFOLLOW and only while it is
    the file that was judged (`ident`: device, inode): one swapped for a link, or reached through a
    directory swapped for one, is refused, never read."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _replaced(path, f"it cannot be opened as a file any more: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        st = os.fstat(fh.fileno())
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != ident:
            raise _replaced(path, "it is another file now")
        digest = hashlib.sha256()
        while block := fh.read(1 << 20):
            digest.update(block)
    return digest.hexdigest(), st


def _replaced(path: Path, why: str) -> ThrustError:
    return ThrustError(f"{path} was replaced while its files: were being read or sent ({why}): nothing of it "
                       "was sent", "train again once it is written", ExitCode.TRANSFER)


def _unchanged(files: list[LocalFile]) -> None:
    """Each file is still the one that was hashed (same device and inode, not a link), checked just
    before the send: a file swapped for a link to ~/.ssh/id_ed25519 since is refused, not read."""
    for f in files:
        try:
            st = os.stat(f.path, follow_symlinks=False)
        except OSError as exc:
            raise _replaced(f.path, f"it is gone: {exc.strerror}") from None
        if stat.S_ISLNK(st.st_mode):
            raise _replaced(f.path, f"it is now a link to {os.readlink(f.path)}")
        if not stat.S_ISREG(st.st_mode) or (st.st_dev, st.st_ino) != f.ident:
            raise _replaced(f.path, "it is another file now")


def send_files(session: HostSession, files: Mapping[str, LocalFile], reporter: Steps,
               only: list[str] | None = None) -> None:
    """The files the host's store lacks (`only`: these shas, which it just said it lacks), verified
    (sha256 on both ends); one `store-missing` question, then one stream of the missing ones."""
    by_sha = {f.sha256: f for f in files.values()}
    if only is None:
        res = session.agent("store-missing", "--workdir", session.paths.workdir,
                            stdin=json.dumps(sorted(by_sha)).encode(), timeout=120)
        try:
            only = list(json.loads(res.stdout.strip().splitlines()[-1])["missing"])
        except (ValueError, IndexError, KeyError, TypeError):
            raise ThrustError(f"cannot ask {session.name} which files: it has: {res.stderr.strip()[-300:]}") from None
    wanted = [by_sha[sha] for sha in only if sha in by_sha]
    if not wanted:
        return
    total = sum(f.size for f in wanted)
    check_room(session, _free(session), total, f"the {len(wanted)} files: it lacks")
    _unchanged(wanted)
    reporter.step(f"sending {len(wanted)} of {len(by_sha)} files: ({total / (1 << 20):.1f} MB)")
    store = f"{session.paths.thrust}/store"
    # each file only while it is the one checked above (and hashed): one swapped for a link since is
    # refused as it is opened, before a byte of it is read or sent
    try:
        sent = session.runner.put_many([(f.path, f"{store}/{f.sha256[:2]}/{f.sha256}", f.ident) for f in wanted])
    except FileChangedError as exc:  # 74, naming the file and what it is now
        exc.hint = "train again once it is written"
        raise
    for f, sha in zip(wanted, sent, strict=True):
        if sha != f.sha256:
            session.runner.run(["rm", "-f", "--", f"{store}/{f.sha256[:2]}/{f.sha256}"])
            raise ThrustError(f"{f.path} changed while it was sent (sha256 {sha[:12]}, expected {f.sha256[:12]})",
                              "train again once it is written", ExitCode.TRANSFER)


def _free(session: HostSession) -> int | None:
    res = session.agent("git-state", "--workdir", session.paths.workdir, "--commit", "HEAD", timeout=60)
    try:
        return json.loads(res.stdout.strip().splitlines()[-1]).get("free_bytes")
    except (ValueError, IndexError, AttributeError):
        return None


# ------------------------------------------------------------------------------------------ the tree

def make_run_tree(config: Config, data: JobData, session: HostSession, local: LocalState, result: SyncResult,
                  name: str, reporter: Steps) -> Tree:
    """The run's tree (`.thrust/trees/NAME`) with its `files:`, kept `setup:` outputs and `shared:` links."""
    files = local_files(config.root, data.files, data.where["files"]) if data.files else {}
    if files:
        send_files(session, files, reporter)
    tree_data = TreeData(files={rel: (f.sha256, f.mtime_ns) for rel, f in files.items()},
                         setup_key=setup_key(local, result, data, files) if data.setup else None,
                         shared=data.shared)
    try:
        return make_tree(session, local, result, session.paths.tree(name), ref=name, data=tree_data,
                         step=reporter.step, send=lambda shas: send_files(session, files, reporter, only=shas))
    except TreeRefused as exc:
        raise _refusal(config, data, exc.answer, session.paths.tree(name)) from None


# what tree-add's `what` names: the thrust.yaml key that asked for the path, or what of the commit it is
REFUSED_KEYS = {"shared": "shared", "files": "files", "setup": "setup"}
REFUSED_KINDS = {"lfs": "a Git LFS file of the commit", "submodule": "a submodule of the commit"}


def _refusal(config: Config, data: JobData, answer: Mapping[str, object], tree: str = "") -> ThrustError:
    if answer.get("error") == "shared-tracked":
        tracked = ", ".join(str(t) for t in answer.get("tracked") or [])  # type: ignore[union-attr]
        return ConfigError(f"{data.where['shared']}: {answer.get('path')} holds files of the commit "
                           f"({tracked}): a shared directory would hide them",
                           "share a directory the code does not have (a subdirectory for the data, say)")
    if answer.get("error") == "outside":
        return _outside(config, data, answer, tree)
    return ThrustError(f"the run's tree could not be made: {answer}")


def _outside(config: Config, data: JobData, answer: Mapping[str, object], tree: str) -> ConfigError:
    """tree-add's "outside": a path that would leave the run's tree, or one behind a symlink (or a file)
    of the commit (`through`, `link`): named at the thrust.yaml line that asked for it, with the link."""
    what, path, through = str(answer.get("what") or ""), answer.get("path"), answer.get("through")
    key = REFUSED_KEYS.get(what)
    where = data.where[key] if key else config_label(config.path)
    if not isinstance(through, str):
        return ConfigError(f"{where}: {path} leads outside the run's tree")
    shown = f"{where}: {path}" if key else f"{where}: {path} ({REFUSED_KINDS.get(what, 'a path of the commit')})"
    link = answer.get("link")
    if not isinstance(link, str):
        return ConfigError(f"{shown} is behind {through} (a file of the commit): no directory can be made there",
                           f"name a path that is a real directory of the commit, not under {through}")
    leaves = ", outside the run's tree" if _leaves(tree, through, link) else ""
    return ConfigError(f"{shown} is behind {through} (a symlink of the commit to {link}{leaves}): thrust-remote "
                       "never writes, replaces or removes anything through a link",
                       f"name a path that is a real directory of the commit, not under {through}")


def _leaves(tree: str, through: str, link: str) -> bool:
    """The link `through` (relative to the tree), whose text is `link`, leads out of the tree."""
    if posixpath.isabs(link):
        return not tree or not (posixpath.normpath(link) + "/").startswith(tree.rstrip("/") + "/")
    target = posixpath.normpath(posixpath.join(posixpath.dirname(through), link))
    return target == ".." or target.startswith("../")


# ------------------------------------------------------------------------------------------ setup:

def setup_key(local: LocalState, result: SyncResult, data: JobData, files: Mapping[str, LocalFile]) -> str:
    """What a setup's outputs depend on: its argv, the content of the commit's files it names (a word
    that is a path of the commit: `data/prepare.py`), the patch when it changes one of them, and the
    `files:` placed beside it. Another commit that leaves these alone reuses the outputs."""
    commit = result.checkout or result.commit
    named = {}
    for word in data.setup:
        blob = _git(local.root, "rev-parse", "-q", "--verify", f"{commit}:{word}", check=False)
        if blob.returncode == 0 and word not in ("", "."):
            named[word] = blob.stdout.decode().strip()
    touched = (_git(local.root, "diff", "HEAD", "--name-only", check=False).stdout.decode().split()
               if local.patch else [])
    patched = sorted(w for w in named if w in touched)
    spec = {"layout": SETUP_LAYOUT, "argv": list(data.setup), "named": named,
            "patch": local.patch_sha256 if patched else None,
            "files": {rel: f.sha256 for rel, f in sorted(files.items())}}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:20]


def run_setup(config: Config, data: JobData, session: HostSession, local: LocalState | None,
              result: SyncResult | None, *, cwd: str, env: Mapping[str, str], python: str,
              reporter: Steps) -> None:
    """Run the job's `setup:` in its tree, unless the tree got that setup's kept outputs already."""
    if not data.setup:
        return
    if result is not None and result.tree_setup == "placed":
        reporter.step("setup: its outputs for these inputs are kept on the host: placed, not run again")
        return
    key = setup_key(local, result, data,
                    local_files(config.root, data.files, data.where["files"]) if data.files else {}) \
        if local is not None and result is not None else None
    if session.host.is_local and key and (config.root / ".thrust" / "setup" / f"{key}.done").exists():
        reporter.step("setup: ran here already for these inputs")
        return
    argv = _with_venv(list(data.setup), python)
    reporter.step(f"setup: {shlex.join(data.setup)}")
    tail: list[str] = []
    done = session.runner.run(argv, env=dict(env), cwd=cwd, timeout=SETUP_TIMEOUT_S,
                              stream=lambda _name, line: _keep_tail(tail, line))
    if not done.ok:
        shown = "\n".join(tail[-20:]) or (done.stderr or done.stdout).strip()[-2000:]
        raise ThrustError(f"the setup ({data.where['setup']}) failed on {session.name} "
                          f"(exit {done.exit_code}); nothing was launched:\n{shown}".rstrip(),
                          f"fix it and train again; try it there with: "
                          f"{_exec_hint(session, cwd, _as_setup_ran(session, data.setup, python, env))}",
                          ExitCode.FAILED)
    if key:
        _keep_outputs(session, key, cwd, data, reporter, config)


def _exec_hint(session: HostSession, cwd: str, argv: tuple[str, ...]) -> str:
    """`thrust-remote exec --host H --cwd TREE -- ARGV...`, each word quoted for a POSIX shell: pasted, it
    runs that argv there (`exec` takes every word after `--` as the command's, so --host goes before)."""
    head = command_hint("exec", "--host", session.name, "--cwd", cwd, config=session.host.config_path)
    return f"{head} -- {shlex.join(argv)}"


def _as_setup_ran(session: HostSession, argv: tuple[str, ...], python: str,
                  env: Mapping[str, str]) -> tuple[str, ...]:
    """The setup's argv with its first word by its path when the setup found it in the job's venv (its
    `python`, `pip`): `exec` runs a command without the venv on PATH, where `python` may be missing (127)
    or another one. Any other word (`bash`, one with a slash, one the host cannot find) stays as written:
    exec finds it as the setup did."""
    if not argv or "/" in argv[0]:
        return argv
    found = session.runner.run(_with_venv(["sh", "-c", 'command -v -- "$1"', "sh", argv[0]], python),
                               env=dict(env), timeout=30)
    where = found.stdout.strip() if found.ok else ""
    return (where, *argv[1:]) if where.startswith(f"{os.path.dirname(python)}/") else argv


def _with_venv(argv: list[str], python: str) -> list[str]:
    """The argv with the job's venv first on PATH, as a job's own command gets it: `python` and `pip`
    are the venv's. The directory goes as an argument, never into the shell's text."""
    venv_bin = os.path.dirname(python)
    return ["sh", "-c", 'p=$1; shift; PATH="$p:$PATH" exec "$@"', "sh", venv_bin, *argv]


def _keep_tail(tail: list[str], line: str) -> None:
    tail.append(line.rstrip("\n"))
    del tail[:-200]


def _keep_outputs(session: HostSession, key: str, cwd: str, data: JobData, reporter: Steps,
                  config: Config) -> None:
    if session.host.is_local:
        marker = config.root / ".thrust" / "setup" / f"{key}.done"
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("")
        return
    res = session.agent("setup-keep", "--workdir", session.paths.workdir, "--tree", cwd, "--key", key,
                        stdin=json.dumps({"exclude": [*data.files, *data.shared]}).encode(), timeout=3600)
    try:
        kept = json.loads(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        kept = None
    if not res.ok or not isinstance(kept, dict):
        reporter.warn(f"setup: its outputs could not be kept on {session.name} ({res.stderr.strip()[-200:]}): "
                      "the next run runs it again")
        return
    reporter.step(f"setup: {kept.get('outputs')} output file(s) kept for later runs "
                  f"({(kept.get('bytes') or 0) / (1 << 20):.1f} MB)")
