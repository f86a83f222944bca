"""The per-job secret that authenticates every trainer port: where it comes from, what it must be.

One secret per job, shared by every trainer of the job and by nobody else. It authenticates the
replica coordinator's hello, the FTAR hello and every state-server request (each with its own
key, derived here). The agent reads it once and hands it to the trainers it starts; a trainer
started without an agent reads it itself. Both do it the same way, and neither may import the
other, so this small module sits beside the wire contract (like `protos.dial`).

Where it comes from, first match wins:

1. a file named by a flag (`fthsdp agent --job-secret-file PATH`), or a keyword in code;
2. FTHSDP_JOB_SECRET_FILE: the path of a file holding it (a mounted Kubernetes Secret);
3. FTHSDP_JOB_SECRET: the secret itself (how the agent passes it to its trainers: the
   environment, never the command line).

The secret is at least 64 hexadecimal digits (32 random bytes), surrounding whitespace ignored:
`openssl rand -hex 32` makes one, as does `generate()`. With no secret anywhere the trainer
ports refuse to start, unless FTHSDP_INSECURE_TRAINER_PORTS=1 says they may run without
authentication (a secret, when there is one, is used all the same). The secret's value never
appears in an error, a log line or a repr.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import string
from pathlib import Path
from typing import Mapping

ENV_JOB_SECRET = "FTHSDP_JOB_SECRET"
ENV_JOB_SECRET_FILE = "FTHSDP_JOB_SECRET_FILE"
ENV_INSECURE_TRAINER_PORTS = "FTHSDP_INSECURE_TRAINER_PORTS"
MIN_SECRET_BYTES = 32
MAX_SECRET_BYTES = 512
#: the most a secret file may hold (hex digits and whitespace)
MAX_FILE_BYTES = 4 * MAX_SECRET_BYTES

# One key per port, so a tag made for one port never passes at another.
PURPOSE_COORDINATOR = "coordinator hello"
PURPOSE_FTAR = "ftar hello"
PURPOSE_STATE = "state server request"
#: not a port: the HMAC of a durable checkpoint's completion marker (fthsdp/state/checkpoint.py)
PURPOSE_CHECKPOINT = "checkpoint marker"

HOW_TO_PROVIDE = (f"give every trainer of the job the same secret of at least {2 * MIN_SECRET_BYTES} hex digits: "
                  f"{ENV_JOB_SECRET_FILE}=PATH (a file, e.g. a mounted Kubernetes Secret) or {ENV_JOB_SECRET}=HEX "
                  f"(`openssl rand -hex 32` makes one; `fthsdp agent --job-secret-file PATH` passes it to the "
                  f"trainers it starts), or set {ENV_INSECURE_TRAINER_PORTS}=1 to run the trainer ports without "
                  f"authentication (tests on one machine only)")


class JobSecret:
    """The secret's bytes, with where they came from; never shown (repr names only the source)."""

    __slots__ = ("_raw", "source")

    def __init__(self, raw: bytes, source: str) -> None:
        if not MIN_SECRET_BYTES <= len(raw) <= MAX_SECRET_BYTES:
            raise ValueError(f"the job secret from {source} is {len(raw)} bytes; it must be {MIN_SECRET_BYTES} to "
                             f"{MAX_SECRET_BYTES} bytes ({2 * MIN_SECRET_BYTES} to {2 * MAX_SECRET_BYTES} hex digits)")
        self._raw, self.source = bytes(raw), source

    def key(self, purpose: str) -> bytes:
        """The key of one port (PURPOSE_*): an HMAC of the purpose under the secret."""
        return hmac.new(self._raw, b"fthsdp job secret v1: " + purpose.encode(), hashlib.sha256).digest()

    def hex(self) -> str:
        """The secret as text, to hand to a trainer's environment (and nowhere else)."""
        return self._raw.hex()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, JobSecret) and hmac.compare_digest(self._raw, other._raw)

    def __hash__(self) -> int:
        return hash(self.key("hash"))

    def __repr__(self) -> str:
        return f"JobSecret(from {self.source}, {len(self._raw)} bytes)"


def generate() -> str:
    """A fresh secret as hex text (32 random bytes)."""
    return secrets.token_hex(MIN_SECRET_BYTES)


def parse(text: str, source: str) -> JobSecret:
    """The secret in `text` (hex digits, whitespace around them ignored); ValueError says what is
    wrong with it (its length, which character is not hex), never what it is."""
    digits = text.strip()
    bad = next((i for i, c in enumerate(digits) if c not in string.hexdigits), None)
    if bad is not None:
        raise ValueError(f"the job secret from {source} must be hex digits only; character {bad + 1} of "
                         f"{len(digits)} is not one")
    if len(digits) % 2:
        raise ValueError(f"the job secret from {source} has an odd number of hex digits ({len(digits)})")
    return JobSecret(bytes.fromhex(digits), source)


def read_file(path: str | os.PathLike) -> JobSecret:
    source = f"file {path}"
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ValueError(f"cannot read the job secret from {source}: {exc.strerror or exc}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"the job secret {source} is larger than {MAX_FILE_BYTES} bytes; it should hold only "
                         f"the secret's hex digits")
    try:
        return parse(data.decode("ascii"), source)
    except UnicodeDecodeError:
        raise ValueError(f"the job secret {source} is not text: it must hold hex digits") from None


def from_env(environ: Mapping[str, str] | None = None, file: str | Path | None = None) -> JobSecret | None:
    """The secret from `file` (a flag), else FTHSDP_JOB_SECRET_FILE, else FTHSDP_JOB_SECRET;
    None when none of them is set."""
    env = os.environ if environ is None else environ
    if file:
        return read_file(file)
    if env.get(ENV_JOB_SECRET_FILE, ""):
        return read_file(env[ENV_JOB_SECRET_FILE])
    if env.get(ENV_JOB_SECRET, ""):
        return parse(env[ENV_JOB_SECRET], f"${ENV_JOB_SECRET}")
    return None


def insecure_from_env(environ: Mapping[str, str] | None = None) -> bool:
    """Whether FTHSDP_INSECURE_TRAINER_PORTS allows ports without authentication ("1"; "" or "0": no)."""
    env = os.environ if environ is None else environ
    value = env.get(ENV_INSECURE_TRAINER_PORTS, "").strip()
    if value not in ("", "0", "1"):
        raise ValueError(f"{ENV_INSECURE_TRAINER_PORTS} must be 1 (ports without authentication) or 0, got {value!r}")
    return value == "1"
