"""FTAR settings: one frozen dataclass, units in the field names, one `validate()`."""

from __future__ import annotations

from dataclasses import dataclass, field

MIB = 1 << 20
MIN_AUTH_KEY_BYTES = 32


@dataclass(frozen=True)
class FtarSettings:
    """How one FTAR endpoint moves data.

    chunk_bytes: S, the size of one pipelined chunk and of each preallocated staging buffer per
        peer (paper: 8 MiB). A partition of the tensor is at most S * C * world bytes.
    chunks_in_flight: C, the number of staging buffers per peer and the credit window: at most
        S * C bytes are ever in flight between two neighbours (the congestion control).
    timeout_s: the bound on every wait during an all-reduce (one socket read or write, one wait
        for a neighbour's progress). Past it the operation fails with RecoverableError.
    connect_timeout_s: the bound on `configure()`: dialling the right neighbour, its answer, and
        the left neighbour's arrival.
    cpu_fold_bytes: on CPU, a reduce-scatter chunk is received in pieces of at most this size into
        one reused staging buffer, each added into the tensor by the receiving thread at once, so
        the sending thread never stops to fold (2 MiB measured best: fewer calls than smaller
        pieces, and the piece is still in cache; docs/architecture.md, "The data plane").
    cuda_blocks, cuda_threads_per_block: the reduce kernel's grid for CUDA tensors
        (paper: 2 blocks x 512 threads).
    socket_buffer_bytes: SO_SNDBUF / SO_RCVBUF for data connections; 0 (the default) keeps the
        kernel's autotuning, which grows the buffers within its own bounds (net.ipv4.tcp_rmem /
        tcp_wmem) and was faster than a fixed 4 MiB in 13 of 15 alternations (the credit window
        still bounds what is in flight; docs/architecture.md, "The data plane").
    auth_key: the key (at least 32 bytes, the same on every endpoint of the job) that
        authenticates both sides of every hello: the dialler tags the acceptor's fresh challenge,
        the acceptor tags the dialler's. Never shown in a repr.
    allow_unauthenticated: run without `auth_key`: anyone who reaches the port may join a ring.
        Without a key and without this an endpoint refuses to start.
    """

    chunk_bytes: int = 8 * MIB
    chunks_in_flight: int = 2
    timeout_s: float = 30.0
    connect_timeout_s: float = 5.0
    cpu_fold_bytes: int = 2 << 20
    cuda_blocks: int = 2
    cuda_threads_per_block: int = 512
    socket_buffer_bytes: int = 0
    auth_key: bytes = field(default=b"", repr=False)
    allow_unauthenticated: bool = False

    def validate(self) -> "FtarSettings":
        """Raise ValueError with a full sentence naming the bad value; return self when valid."""
        if not isinstance(self.chunk_bytes, int) or self.chunk_bytes < 64 or self.chunk_bytes % 64:
            raise ValueError(
                f"chunk_bytes must be a positive multiple of 64 bytes, got {self.chunk_bytes!r}."
            )
        if not isinstance(self.chunks_in_flight, int) or not 1 <= self.chunks_in_flight <= 64:
            raise ValueError(
                f"chunks_in_flight must be an integer from 1 to 64 (the paper uses 2 to 4), "
                f"got {self.chunks_in_flight!r}."
            )
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {self.timeout_s!r}.")
        if not self.connect_timeout_s > 0:
            raise ValueError(
                f"connect_timeout_s must be a positive number of seconds, got {self.connect_timeout_s!r}."
            )
        if not isinstance(self.cpu_fold_bytes, int) or self.cpu_fold_bytes < 64 or self.cpu_fold_bytes % 64:
            raise ValueError(
                f"cpu_fold_bytes must be a positive multiple of 64 bytes, got {self.cpu_fold_bytes!r}."
            )
        if not isinstance(self.cuda_blocks, int) or not 1 <= self.cuda_blocks <= 1024:
            raise ValueError(f"cuda_blocks must be an integer from 1 to 1024, got {self.cuda_blocks!r}.")
        threads = self.cuda_threads_per_block
        if not isinstance(threads, int) or not 32 <= threads <= 1024 or threads % 32:
            raise ValueError(
                f"cuda_threads_per_block must be a multiple of 32 from 32 to 1024, got {threads!r}."
            )
        if not isinstance(self.socket_buffer_bytes, int) or self.socket_buffer_bytes < 0:
            raise ValueError(
                f"socket_buffer_bytes must be 0 (kernel default) or a positive byte count, "
                f"got {self.socket_buffer_bytes!r}."
            )
        if not isinstance(self.auth_key, bytes):
            raise ValueError(f"auth_key must be bytes, got a {type(self.auth_key).__name__}.")
        if self.auth_key and len(self.auth_key) < MIN_AUTH_KEY_BYTES:
            raise ValueError(f"auth_key must be at least {MIN_AUTH_KEY_BYTES} bytes, got {len(self.auth_key)} bytes.")
        if not self.auth_key and self.allow_unauthenticated is not True:
            raise ValueError(
                "FTAR endpoints authenticate their peers: give auth_key (at least "
                f"{MIN_AUTH_KEY_BYTES} bytes, the same on every endpoint of the job), or set "
                "allow_unauthenticated=True to let anyone who reaches the port join a ring."
            )
        return self
