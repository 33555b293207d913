"""SSHRunner against OpenSSH's own tools, side by side, on a private loopback sshd.

    .venv/bin/python bench/bench_ssh.py [--size-mb 100] [--repeat 20] [--transfer-repeat 5]

One run measures, interleaved round by round so that load from other processes hits every method
alike, and reports medians:

- per-command cost of `true`: SSHRunner.run on one reused connection; raw paramiko exec on that
  same connection (the lower bound for anything built on paramiko); `ssh host true` with a fresh
  connection each time; `ssh host true` through a warm OpenSSH ControlMaster. All with the same key
  and known_hosts. Measured for the current user and, when run as root, for a throwaway user whose
  rc files are empty (root's ~/.bashrc may cost ~90 ms per command on every method).
- a verified transfer of SIZE MB each way: SSHRunner.get / SSHRunner.put (.part + sha256 on both
  ends + rename) against `scp` (SFTP protocol in OpenSSH 9) and `rsync -e ssh`, neither of which
  hashes end to end; plus paramiko's plain SFTP get (unverified, what Fabric's get does) for
  reference.

Targets (issue 2): per command no slower than ControlMaster ssh for the same user; verified
transfer >= 0.8x scp.

The transfer table also has SSHRunner on a connection that negotiated GCM_CIPHER instead of
paramiko's first choice (aes128-ctr + hmac-sha2-256): the bench reorders paramiko's cipher list for
that one connection only, to show what preferring it in SSHRunner.connection() would give.
`--prefer-cipher NAME` instead moves NAME to the front for every paramiko connection of the run.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import pwd
import resource
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]

import paramiko  # noqa: E402
import psutil  # noqa: E402
from conftest import SSHServer, _start_sshd  # noqa: E402

from thrust_remote.host.ssh import SSHRunner  # noqa: E402

NO_RC_USER = "thrustbench"
OURS = "SSHRunner get / put (verified)"
GCM_CIPHER = "aes128-gcm@openssh.com"
OURS_GCM = f"SSHRunner, {GCM_CIPHER} (verified)"


def ssh_opts(server: SSHServer) -> list[str]:
    return [
        "-F",
        "/dev/null",
        "-o",
        f"UserKnownHostsFile={server.known_hosts}",
        "-o",
        "StrictHostKeyChecking=yes",
        "-o",
        "BatchMode=yes",
        "-o",
        "IdentitiesOnly=yes",
        "-i",
        str(server.client_key),
    ]


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------- a user without rc files


def make_no_rc_user(server: SSHServer) -> str | None:
    """A throwaway login whose ~/.bashrc is empty; it reads the server's AuthorizedKeysFile."""
    if os.geteuid() != 0 or not shutil.which("useradd"):
        return None
    remove_user()
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", NO_RC_USER], check=True, capture_output=True)
    # useradd leaves the password field as "!", which sshd without PAM treats as a locked account
    subprocess.run(["usermod", "-p", "*", NO_RC_USER], check=True, capture_output=True)
    home = Path(pwd.getpwnam(NO_RC_USER).pw_dir)
    for rc in (".bashrc", ".profile", ".bash_logout"):
        (home / rc).write_text("")
    # sshd reads AuthorizedKeysFile as the target user
    server.root.chmod(0o755)
    (server.root / "authorized_keys").chmod(0o644)
    return NO_RC_USER


def remove_user() -> None:
    with contextlib.suppress(KeyError):
        pwd.getpwnam(NO_RC_USER)
        subprocess.run(["userdel", "-r", "-f", NO_RC_USER], capture_output=True)


# ---------------------------------------------------------------------------- per-command cost


def runner_for(server: SSHServer, user: str) -> SSHRunner:
    return server.runner(address=f"{user}@127.0.0.1:{server.port}")


def raw_exec(runner: SSHRunner) -> None:
    chan = runner.connection().transport.open_session()
    chan.exec_command("true")
    if chan.recv_exit_status() != 0:
        raise RuntimeError("raw exec failed")
    chan.close()


def command_methods(server: SSHServer, user: str, root: Path) -> tuple[dict[str, Callable[[], None]], list]:
    target = f"{user}@127.0.0.1"
    base = ["ssh", *ssh_opts(server), "-p", str(server.port)]
    control = root / f"cm-{user}"
    cm = [*base, "-o", "ControlMaster=auto", "-o", f"ControlPath={control}", "-o", "ControlPersist=60"]
    runner = runner_for(server, user)

    def run_ours() -> None:
        if runner.run(["true"]).exit_code != 0:
            raise RuntimeError("SSHRunner.run(['true']) failed")

    methods = {
        "SSHRunner.run (reused connection)": run_ours,
        "raw paramiko exec (same connection)": lambda: raw_exec(runner),
        "ssh, fresh connection": lambda: subprocess.run([*base, target, "true"], check=True),
        "ssh, ControlMaster (warm)": lambda: subprocess.run([*cm, target, "true"], check=True),
    }
    # warm up: open the connection, start the master, fill caches
    for _ in range(2):
        for fn in methods.values():
            fn()

    def first_command() -> float:
        fresh = runner_for(server, user)
        t0 = time.perf_counter()
        fresh.run(["true"])
        dt = time.perf_counter() - t0
        fresh.close()
        return dt

    cleanups = [runner.close, lambda: subprocess.run([*cm, "-O", "exit", target], capture_output=True)]
    methods_timed: dict[str, Callable[[], None]] = dict(methods)
    methods_timed["SSHRunner new connection + first command"] = first_command  # returns its own time
    return methods_timed, cleanups


def time_commands(methods: dict[tuple[str, str], Callable], repeat: int) -> dict[tuple[str, str], list[float]]:
    out: dict[tuple[str, str], list[float]] = {name: [] for name in methods}
    for _ in range(repeat):
        for name, fn in methods.items():
            t0 = time.perf_counter()
            own = fn()
            out[name].append(own if isinstance(own, float) else time.perf_counter() - t0)
    return out


# ---------------------------------------------------------------------------- transfers


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def transfer_methods(
    server: SSHServer, root: Path, src_remote: Path, src_local: Path
) -> tuple[dict[tuple[str, str], Callable], list[SSHRunner]]:
    user = server.user
    target = f"{user}@127.0.0.1"
    scp = ["scp", "-q", *ssh_opts(server), "-P", str(server.port)]
    rsync_e = shlex.join(["ssh", *ssh_opts(server), "-p", str(server.port)])
    rsync = ["rsync", "-q", "-e", rsync_e]
    got = root / "local" / "got.bin"
    put_dir = root / "remote-home" / "put"
    put_dir.mkdir(parents=True, exist_ok=True)
    runner = server.runner()
    runner.run(["true"])
    gcm = server.runner()
    default = paramiko.Transport._preferred_ciphers
    paramiko.Transport._preferred_ciphers = (GCM_CIPHER, *(c for c in default if c != GCM_CIPHER))
    try:
        transport = gcm.connection().transport
    finally:
        paramiko.Transport._preferred_ciphers = default
    transport._preferred_ciphers = (GCM_CIPHER,)  # rekeys (every 512 MB) keep it too
    if transport.remote_cipher != GCM_CIPHER:
        raise RuntimeError(f"sshd did not take {GCM_CIPHER}")

    def fresh(path: Path) -> Path:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return path

    def sftp_get() -> None:
        runner.sftp().get(str(src_remote), str(fresh(got)))

    methods = {
        ("get", OURS): lambda: runner.get(str(src_remote), fresh(got)),
        ("get", "scp"): lambda: subprocess.run([*scp, f"{target}:{src_remote}", str(fresh(got))], check=True),
        ("get", "rsync -e ssh"): lambda: subprocess.run(
            [*rsync, f"{target}:{src_remote}", str(fresh(got))], check=True
        ),
        ("get", "paramiko SFTP get (unverified)"): sftp_get,
        ("get", OURS_GCM): lambda: gcm.get(str(src_remote), fresh(got)),
        ("put", OURS_GCM): lambda: gcm.put(src_local, str(fresh(put_dir / "gcm.bin"))),
        ("put", OURS): lambda: runner.put(src_local, str(fresh(put_dir / "ours.bin"))),
        ("put", "scp"): lambda: subprocess.run(
            [*scp, str(src_local), f"{target}:{fresh(put_dir / 'scp.bin')}"], check=True
        ),
        ("put", "rsync -e ssh"): lambda: subprocess.run(
            [*rsync, str(src_local), f"{target}:{fresh(put_dir / 'rsync.bin')}"], check=True
        ),
    }
    return methods, [runner, gcm]


def client_cpu() -> float:
    """CPU seconds of this process (all threads) and of its reaped children (scp, rsync, ssh)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def server_cpu(server: SSHServer) -> float:
    """CPU seconds spent under the sshd wrapper: live processes plus everything they reaped."""
    total = 0.0
    procs = [psutil.Process(server.wrapper.pid)]
    with contextlib.suppress(psutil.Error):
        procs += procs[0].children(recursive=True)
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            t = proc.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
    return total


def time_transfers(
    methods: dict[tuple[str, str], Callable],
    size: int,
    repeat: int,
    expected: str,
    root: Path,
    server: SSHServer,
) -> tuple[dict[tuple[str, str], list[float]], dict[tuple[str, str], list[tuple[float, float]]]]:
    """MB/s per method, and (client, server) CPU seconds per run: the cost that load cannot blur."""
    out: dict[tuple[str, str], list[float]] = {key: [] for key in methods}
    cpu: dict[tuple[str, str], list[tuple[float, float]]] = {key: [] for key in methods}
    for rnd in range(repeat):
        for key, fn in methods.items():
            c0, s0 = client_cpu(), server_cpu(server)
            t0 = time.perf_counter()
            fn()
            out[key].append(size / 1e6 / (time.perf_counter() - t0))
            cpu[key].append((client_cpu() - c0, server_cpu(server) - s0))
            if rnd == 0 and key[0] == "get" and sha256(root / "local" / "got.bin") != expected:
                raise RuntimeError(f"{key}: the received file differs")  # every method moved the right bytes
    for name in ("ours", "gcm", "scp", "rsync"):
        if sha256(root / "remote-home" / "put" / f"{name}.bin") != expected:
            raise RuntimeError(f"put {name}: the uploaded file differs")
    return out, cpu


# ---------------------------------------------------------------------------- report


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}x"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size-mb", type=int, default=100)
    ap.add_argument("--repeat", type=int, default=20, help="rounds of per-command timings")
    ap.add_argument("--transfer-repeat", type=int, default=5, help="rounds of transfers")
    ap.add_argument("--prefer-cipher", help="experiment: put this cipher first in paramiko's list")
    ap.add_argument("--no-extra-user", action="store_true", help="skip the no-rc user even as root")
    args = ap.parse_args()

    if args.prefer_cipher:
        ciphers = list(paramiko.Transport._preferred_ciphers)
        if args.prefer_cipher not in ciphers:
            ap.error(f"paramiko does not know {args.prefer_cipher}; it has {', '.join(ciphers)}")
        ciphers.remove(args.prefer_cipher)
        paramiko.Transport._preferred_ciphers = (args.prefer_cipher, *ciphers)

    root = Path(tempfile.mkdtemp(prefix="thrust-bench-"))
    server = _start_sshd(root)
    cleanups: list[Callable] = []
    extra_user = None
    load_before = os.getloadavg()
    try:
        if not args.no_extra_user:
            extra_user = make_no_rc_user(server)
        users = [server.user] + ([extra_user] if extra_user else [])
        probe = server.runner()
        transport = probe.connection().transport
        negotiated = f"{transport.remote_cipher} / {transport.remote_mac}"
        probe.close()

        # -- per-command
        all_methods: dict[tuple[str, str], Callable] = {}
        for user in users:
            methods, more = command_methods(server, user, root)
            cleanups += more
            all_methods.update({(user, name): fn for name, fn in methods.items()})
        cmd_times = time_commands(all_methods, args.repeat)

        # -- transfers
        size = args.size_mb * 1_000_000
        (root / "local").mkdir()
        src_remote = root / "remote-home" / "src.bin"
        src_local = root / "local" / "src.bin"
        with open(src_remote, "wb") as fh:
            for _ in range(args.size_mb):
                fh.write(os.urandom(1_000_000))
        shutil.copyfile(src_remote, src_local)
        expected = sha256(src_local)
        tmethods, trunners = transfer_methods(server, root, src_remote, src_local)
        cleanups += [r.close for r in trunners]
        xfer, xcpu = time_transfers(tmethods, size, args.transfer_repeat, expected, root, server)
    finally:
        for fn in cleanups:
            with contextlib.suppress(Exception):
                fn()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.wrapper.pid, signal.SIGKILL)
        server.wrapper.wait(timeout=10)
        if extra_user:
            remove_user()
        shutil.rmtree(root, ignore_errors=True)
    load_after = os.getloadavg()

    # -- print
    cpu = next(
        (
            ln.split(":", 1)[1].strip()
            for ln in Path("/proc/cpuinfo").read_text().splitlines()
            if ln.startswith("model name")
        ),
        "?",
    )
    print(f"# bench_ssh  {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}  {os.cpu_count()} cores  {cpu}")
    openssh = subprocess.run(["ssh", "-V"], capture_output=True, text=True).stderr.strip()
    print(f"paramiko {paramiko.__version__}, {openssh}")
    print(f"SSHRunner cipher/MAC: {negotiated}; load average before {load_before[0]:.1f}, after {load_after[0]:.1f}")
    print(f"per command: median of {args.repeat}; transfers: {args.size_mb} MB, median of {args.transfer_repeat}\n")

    names = list(dict.fromkeys(k[1] for k in cmd_times))
    header = "| per command (`true`) | " + " | ".join(f"{u} ms" for u in users) + " |"
    print(header)
    print("|" + "---|" * (len(users) + 1))
    for name in names:
        cells = [f"{median(cmd_times[(u, name)]) * 1000:.1f}" for u in users]
        print(f"| {name} | " + " | ".join(cells) + " |")
    print()
    verdicts = []
    for u in users:
        ours = median(cmd_times[(u, "SSHRunner.run (reused connection)")])
        cm = median(cmd_times[(u, "ssh, ControlMaster (warm)")])
        freshc = median(cmd_times[(u, "ssh, fresh connection")])
        ok = ours <= cm
        verdicts.append(ok)
        print(
            f"- {u}: SSHRunner.run / ControlMaster = {fmt_ratio(ours / cm)} (target <= 1.00x: "
            f"{'met' if ok else 'MISSED'}); / fresh ssh = {fmt_ratio(ours / freshc)}"
        )
    print()

    print("| transfer | get MB/s | put MB/s | get CPU s client+server | put CPU s client+server |")
    print("|---|---|---|---|---|")
    labels = list(dict.fromkeys(k[1] for k in xfer))
    for label in labels:
        g = xfer.get(("get", label))
        p = xfer.get(("put", label))
        cells = [f"{median(g):.0f}" if g else "–", f"{median(p):.0f}" if p else "–"]
        for way in ("get", "put"):
            runs = xcpu.get((way, label))
            cells.append(f"{median([c for c, _ in runs]):.2f} + {median([s for _, s in runs]):.2f}" if runs else "–")
        print(f"| {label} | " + " | ".join(cells) + " |")
    print()
    for way in ("get", "put"):
        ours = median(xfer[(way, OURS)])
        scp = median(xfer[(way, "scp")])
        rs = median(xfer[(way, "rsync -e ssh")])
        ok = ours >= 0.8 * scp
        verdicts.append(ok)
        print(
            f"- {way}: SSHRunner / scp = {fmt_ratio(ours / scp)} (target >= 0.80x: {'met' if ok else 'MISSED'}); "
            f"/ rsync = {fmt_ratio(ours / rs)}; with {GCM_CIPHER}: "
            f"{fmt_ratio(median(xfer[(way, OURS_GCM)]) / scp)} of scp"
        )
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
