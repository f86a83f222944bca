"""Every command in README.md, deploy/README.md and docs/operations.md is exercised, and every
repository path the docs mention exists.

Commands that can run here run for real: `fthsdp controller`, `fthsdp agent` and
`fthsdp status` (against a live controller; addresses rewritten to its ports), `fthsdp timeouts`
(which must find every rule kept), `curl` against
the same controller, `kubectl kustomize` for `kubectl apply -k`, and `kubectl create ...
--dry-run=client`. The others get the nearest real check: `make -n TARGET`, a benchmark's
`--help` naming every flag used, `kubectl VERB --help`, and a Dockerfile and build context
that exist.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from controller.launch import read_json_line
from protos import job_secret
from tests.waiting import wait_for_blocking

ROOT = Path(__file__).resolve().parents[2]
SHELL_DOCS = ["README.md", "deploy/README.md", "docs/operations.md"]
ALL_DOCS = SHELL_DOCS + ["docs/architecture.md"]
BIN = Path(sys.executable).parent
ADMIN_TOKEN = "docs-test-token"
#: the job secret file the docs' controller and agent commands name (in the test's directory)
JOB_SECRET = "job-secret"
#: top-level names a repository path in the docs may start with
TOP = ("protos", "controller", "agent", "fthsdp", "ftar_kernels", "deploy", "bench", "tests", "docs", ".ci")
TOP_FILES = ("Makefile", "pyproject.toml", "requirements-test.txt", "README.md")
#: commands that only make sense on a cluster or a workstation: their verb must exist
KUBECTL_HELP_ONLY = {"label", "port-forward", "rollout", "delete", "get", "patch", "drain"}


def shell_commands(doc: str) -> list[list[str]]:
    """The commands of every ```sh block: continuation lines joined, comments dropped."""
    text = (ROOT / doc).read_text()
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", text, re.S | re.M):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv:
                commands.append(argv)
    return commands


def all_commands() -> list[tuple[str, list[str]]]:
    return [(doc, argv) for doc in SHELL_DOCS for argv in shell_commands(doc)]


#: README's torchrun line (FTHSDP_CONTROLLER=... torchrun ...) runs as written, ports and steps
#: made small, in tests/runtime/test_torchrun.py (it starts torch trainers)
TORCHRUN_LINE = "FTHSDP_CONTROLLER"


def test_the_docs_hold_commands_of_every_kind():
    programs = {argv[0].split("=")[0] for _, argv in all_commands()}
    kinds = {"make", "fthsdp", ".venv/bin/python", "kubectl", "docker", "curl", "TOKEN", TORCHRUN_LINE}
    assert kinds <= programs, programs
    unknown = programs - kinds
    assert not unknown, f"commands no test exercises: {unknown}"


# -- paths -----------------------------------------------------------------------------------

def mentioned_paths(doc: str) -> set[str]:
    text = (ROOT / doc).read_text()
    found = set()
    quoted = [t for t in re.findall(r"`([^`\s]+)`", text) if not t.startswith("../")]  # kustomize-relative
    for token in quoted + re.findall(r"\]\(([^)\s]+)\)", text):
        token = token.split("#")[0].rstrip(".,:;")
        if "://" in token or "{" in token or "*" in token or "…" in token or "..." in token:
            continue
        first = token.split("/")[0]
        if first in TOP and "/" in token or token in TOP_FILES or token.startswith("../") \
                or re.fullmatch(r"[\w.-]+/[\w./-]*", token) and (ROOT / Path(doc).parent / first).exists():
            found.add(token)
    return found


@pytest.mark.parametrize("doc", ALL_DOCS)
def test_every_path_the_docs_mention_exists(doc):
    paths = mentioned_paths(doc)
    assert paths, f"{doc} mentions no path?"
    missing = [p for p in sorted(paths) if not ((ROOT / p).exists() or (ROOT / Path(doc).parent / p).exists())]
    assert not missing, f"{doc} mentions paths that do not exist: {missing}"
    outside = [p for p in paths if not (ROOT / Path(doc).parent / p).resolve().is_relative_to(ROOT)]
    assert not outside, f"{doc} links outside the repository: {outside}"


# -- commands that run without a controller --------------------------------------------------

def run(argv: list[str], cwd: Path = ROOT, timeout_s: float = 60, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def check_offline(argv: list[str], workdir: Path) -> None:
    program = argv[0]
    if program == "make":
        proc = run(["make", "-n", *argv[1:]])
        assert proc.returncode == 0, f"make -n {argv[1:]}: {proc.stderr}"
    elif program == ".venv/bin/python":
        assert argv[1] == "-m" and argv[2].startswith("bench."), argv
        proc = run([sys.executable, "-m", argv[2], "--help"])
        assert proc.returncode == 0, proc.stderr
        flags = [a.split("=")[0] for a in argv[3:] if a.startswith("--")]
        assert all(f in proc.stdout for f in flags), (argv, proc.stdout)
    elif program == "docker":
        assert argv[1] == "build", argv
        dockerfile = argv[argv.index("-f") + 1]
        assert (ROOT / dockerfile).is_file() and (ROOT / argv[-1]).is_dir(), argv
    elif program == "kubectl":
        check_kubectl(argv, workdir)
    elif program.startswith("TOKEN="):  # TOKEN=$(kubectl ... get secret ...): the verb exists
        assert "kubectl" in argv[0] and run(["kubectl", "get", "--help"]).returncode == 0
    elif argv[:2] == ["fthsdp", "demo"]:  # tests/demo runs the demo itself
        assert run([str(BIN / "fthsdp"), "demo", "--help"]).returncode == 0
    elif argv[:2] == ["fthsdp", "timeouts"]:  # the configurations the docs show keep every rule
        proc = run([str(BIN / "fthsdp"), *argv[1:]])
        assert proc.returncode == 0 and "rules hold" in proc.stdout, (argv, proc.stdout[-2000:], proc.stderr)
    elif argv[:2] == ["fthsdp", "bench"]:  # tests/bench/test_suite.py runs it itself: the flags exist
        proc = run([str(BIN / "fthsdp"), "bench", "--help"])
        assert proc.returncode == 0 and all(f in proc.stdout for f in argv[2:] if f.startswith("--")), proc.stdout
    elif program.startswith(f"{TORCHRUN_LINE}="):  # run for real by tests/runtime/test_torchrun.py
        assert "torchrun" in argv and any(a.startswith("FTHSDP_JOB_SECRET") for a in argv), argv


def check_kubectl(argv: list[str], workdir: Path) -> None:
    args = argv[1:]
    if args[0] == "-n":
        args = args[2:]
    verb = args[0]
    if "-k" in args:  # apply -k DIR: render it
        target = args[args.index("-k") + 1]
        proc = run(["kubectl", "kustomize", str(ROOT / target)])
    elif verb == "create":
        for arg in argv:  # every file a `--from-file=KEY=FILE` names, as a placeholder
            if arg.startswith("--from-file="):
                (workdir / arg.rsplit("=", 1)[1]).write_text("placeholder\n")
        proc = run(["kubectl", *argv[1:], "--dry-run=client", "-o", "yaml"], cwd=workdir)
        assert "kind:" in proc.stdout, proc.stderr
    else:
        assert verb in KUBECTL_HELP_ONLY, f"no check for kubectl {verb}"
        proc = run(["kubectl", verb, "--help"])
    assert proc.returncode == 0, f"{shlex.join(argv)}: {proc.stderr}"


@pytest.mark.parametrize("doc", SHELL_DOCS)
def test_commands_that_need_no_controller(doc, tmp_path):
    assert shutil.which("kubectl"), "kubectl is needed to render the kustomizations the docs apply"
    checked = 0
    for argv in shell_commands(doc):
        if argv[0] in ("fthsdp", "curl") and argv[:2] not in (["fthsdp", "demo"], ["fthsdp", "timeouts"], ["fthsdp", "bench"]):
            continue  # run against a live controller below
        check_offline(argv, tmp_path)
        checked += 1
    assert checked or doc == "docs/operations.md"


# -- commands that run against a live controller ---------------------------------------------

class Live:
    """One controller for the docs' agents, status and curl commands."""

    def __init__(self, workdir: Path) -> None:
        token = workdir / "admin-token"
        token.write_text(ADMIN_TOKEN)
        write_job_secret(workdir)
        self.proc = subprocess.Popen(
            [str(BIN / "fthsdp"), "controller", "--grpc-port", "0", "--http-port", "0", "--replicas", "4",
             "--admin-token-file", str(token), "--event-log", "off", "--job-secret-file", str(workdir / JOB_SECRET)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
        info = read_json_line(self.proc, 60, "the docs' controller")
        self.grpc, self.http = info["grpc"], info["http"]

    def rewrite(self, argv: list[str]) -> list[str]:
        """README addresses (ports 50051 and 8080) point at this controller."""
        port = self.http.rsplit(":", 1)[1]
        out = []
        for a in argv:
            a = re.sub(r"(127\.0\.0\.1|localhost):50051", self.grpc, a)
            a = re.sub(r"(127\.0\.0\.1|localhost):8080", f"127.0.0.1:{port}", a)
            out.append(a)
        return out

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def write_job_secret(workdir: Path) -> None:
    """The `job-secret` file the docs' commands name, made as the docs say (openssl rand -hex 32)."""
    (workdir / JOB_SECRET).write_text(job_secret.generate() + "\n")


def run_controller_command(argv: list[str], workdir: Path) -> None:
    """The docs' own controller command, on free ports (later flags win), until it serves."""
    proc = subprocess.Popen([str(BIN / "fthsdp"), *argv[1:], "--grpc-port", "0", "--http-port", "0",
                             "--event-log", "off"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdin=subprocess.DEVNULL, text=True, cwd=workdir)
    try:
        info = read_json_line(proc, 60, shlex.join(argv))
        assert httpx.get(f"{info['http']}/healthz", timeout=5).json()["ok"]
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0, proc.stderr.read()


async def run_agent_command(argv: list[str], live: Live, workdir: Path) -> None:
    argv = live.rewrite(argv)
    host = argv[argv.index("--host-id") + 1]
    proc = subprocess.Popen([str(BIN / "fthsdp"), *argv[1:]], cwd=workdir, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    try:
        line = read_json_line(proc, 60, shlex.join(argv))
        assert line["event"] == "registered" and line["host_id"] == host

        def registered():
            hosts = httpx.get(f"{live.http}/api/v1/hosts", timeout=5).json()
            return next((h for h in hosts if h["host_id"] == host), None)

        h = await wait_for_blocking(registered, 10, f"host {host} in /api/v1/hosts")
        if "--spare" in argv and not h["spare"]:
            # A spare takes the work of a host the docs ran before: that agent stopped, so it left.
            events = httpx.get(f"{live.http}/api/v1/events", timeout=5).json()
            assert h["assignment"] and any(e["kind"] == "host_left" for e in events), h
        else:
            assert h["spare"] == ("--spare" in argv)
    finally:
        proc.terminate()
        proc.wait(15)


@pytest.mark.parametrize("doc", SHELL_DOCS)
async def test_commands_against_a_live_controller(doc, tmp_path):
    live = Live(tmp_path)
    ran = []
    try:
        for argv in shell_commands(doc):
            if argv[:2] == ["fthsdp", "controller"]:
                run_controller_command(argv, tmp_path)
            elif argv[:2] == ["fthsdp", "agent"]:
                await run_agent_command(argv, live, tmp_path)
            elif argv[:2] == ["fthsdp", "status"]:
                proc = run([str(BIN / "fthsdp"), *live.rewrite(argv)[1:]])
                assert proc.returncode == 0 and "REPLICA" in proc.stdout, proc.stderr
            elif argv[0] == "curl":
                if "HOST" in " ".join(argv):  # the admin example acts on a host that exists
                    await run_agent_command(["fthsdp", "agent", "--controller", live.grpc, "--host-id", "HOST",
                                             "--spare", "--job-secret-file", JOB_SECRET, "--", "true"], live, tmp_path)
                argv = [a.replace("$TOKEN", ADMIN_TOKEN) for a in live.rewrite(argv)]  # as the shell would
                proc = run([*argv, "-w", "\n%{http_code}"])
                assert proc.returncode == 0 and proc.stdout.rsplit("\n", 1)[1] == "200", (argv, proc.stdout[-500:])
            else:
                continue
            ran.append(tuple(argv[:2]))
        if ("curl", "-s") in ran:
            hosts = {h["host_id"]: h for h in httpx.get(f"{live.http}/api/v1/hosts", timeout=5).json()}
            assert hosts["HOST"]["cordoned"] and hosts["HOST"]["cordon_reason"] == "maintenance"
    finally:
        live.stop()
    expected = {"README.md": {("fthsdp", "controller"), ("fthsdp", "agent"), ("fthsdp", "status")},
                "deploy/README.md": {("fthsdp", "status"), ("curl", "-s")},
                "docs/operations.md": {("fthsdp", "controller"), ("fthsdp", "agent")}}
    assert set(ran) >= expected[doc], ran
