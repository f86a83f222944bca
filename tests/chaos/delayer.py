"""A slow link without netem: hold each packet an NFQUEUE hands us for a delay with jitter.

    python -m tests.chaos.delayer --queue 0 --delay-ms 100 --jitter-ms 20 --seed 7

This machine's kernel has no netem qdisc (CONFIG_NET_SCH_NETEM), but it has NFQUEUE: an
iptables rule in a node's namespace (`-j NFQUEUE --queue-num N --queue-bypass`, see
tests/chaos/net_faults.py `Faults.delay`) queues every packet the node sends to the others, and
this process, started in that namespace, gives each one its verdict (accept) `delay_ms` +-
`jitter_ms` (uniform, seeded) after it was queued, as netem's `delay D J` would; packets may be
reordered by the jitter, as with netem. It speaks nfnetlink_queue over a raw netlink socket
(linux/netfilter/nfnetlink_queue.h) and asks for metadata only (COPY_META): it never reads a
packet's payload. It prints one JSON line once bound; on SIGTERM it accepts every packet it
still holds at once, then exits 0 (the rule is removed first, so nothing new arrives; with
--queue-bypass a queue without a listener passes packets unharmed).
"""

from __future__ import annotations

import argparse
import heapq
import json
import os
import random
import select
import signal
import socket
import struct
import sys
import time

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET, NFQNL_MSG_VERDICT, NFQNL_MSG_CONFIG = 0, 1, 2
NFQA_CFG_CMD, NFQA_CFG_PARAMS, NFQA_CFG_QUEUE_MAXLEN = 1, 2, 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NFQA_PACKET_HDR, NFQA_VERDICT_HDR = 1, 2
NF_ACCEPT = 1
NLM_F_REQUEST, NLM_F_ACK = 1, 4
NLMSG_ERROR = 2
SO_RCVBUFFORCE = 33
QUEUE_MAXLEN = 65536


def _attr(kind: int, payload: bytes) -> bytes:
    raw = struct.pack("=HH", 4 + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(msg: int, queue: int, attrs: bytes, seq: int, flags: int = NLM_F_REQUEST) -> bytes:
    """One nfnetlink_queue message (netlink header, nfgenmsg with the queue number, attributes)."""
    body = struct.pack("=BB", socket.AF_UNSPEC, 0) + struct.pack("!H", queue) + attrs
    return struct.pack("=IHHII", 16 + len(body), (NFNL_SUBSYS_QUEUE << 8) | msg, flags, seq, 0) + body


def verdict(queue: int, packet_id: int, seq: int) -> bytes:
    return message(NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id)), seq)


def packet_ids(data: bytes) -> list[int]:
    """The packet ids of the NFQNL_MSG_PACKET messages in one netlink read; raises OSError for
    a netlink error answer."""
    ids, offset = [], 0
    while offset + 16 <= len(data):
        length, kind = struct.unpack_from("=IH", data, offset)
        if length < 16:
            break
        if kind == NLMSG_ERROR:
            (err,) = struct.unpack_from("=i", data, offset + 16)
            if err:
                raise OSError(-err, f"nfnetlink_queue refused a request: {os.strerror(-err)}")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            at = offset + 20  # netlink header + nfgenmsg
            while at + 4 <= offset + length:
                alen, atype = struct.unpack_from("=HH", data, at)
                if alen < 4:
                    break
                if atype & 0x7FFF == NFQA_PACKET_HDR:
                    ids.append(struct.unpack_from("!I", data, at + 4)[0])
                at += (alen + 3) & ~3
        offset += (length + 3) & ~3
    return ids


def bind(queue: int) -> socket.socket:
    s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 16 << 20)
    s.bind((0, 0))
    config = _attr(NFQA_CFG_CMD, struct.pack("=BBH", NFQNL_CFG_CMD_BIND, 0, 0))
    params = _attr(NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META))
    maxlen = _attr(NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN))
    for seq, attrs in enumerate((config, params, maxlen), 1):
        s.send(message(NFQNL_MSG_CONFIG, queue, attrs, seq, NLM_F_REQUEST | NLM_F_ACK))
        s.settimeout(5.0)
        packet_ids(s.recv(65536))  # the ack (an error raises)
    s.settimeout(None)
    return s


def serve(queue: int, delay_s: float, jitter_s: float, seed: int) -> int:
    rng = random.Random(seed)
    s = bind(queue)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    print(json.dumps({"event": "ready", "queue": queue}), flush=True)
    held: list[tuple[float, int]] = []
    seq = 100
    while True:
        now = time.monotonic()
        while held and (held[0][0] <= now or stopping):
            _, pid = heapq.heappop(held)
            seq += 1
            s.send(verdict(queue, pid, seq))
        if stopping:
            return 0
        wait = held[0][0] - now if held else 0.5
        try:
            ready, _, _ = select.select([s], [], [], max(wait, 0.0))
        except InterruptedError:
            continue
        if ready:
            now = time.monotonic()
            for pid in packet_ids(s.recv(1 << 20)):
                heapq.heappush(held, (now + max(0.0, delay_s + rng.uniform(-jitter_s, jitter_s)), pid))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--queue", type=int, default=0)
    p.add_argument("--delay-ms", type=float, required=True)
    p.add_argument("--jitter-ms", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 0 <= args.queue < 65536:
        p.error(f"--queue must be 0..65535, got {args.queue}")
    if not 0 <= args.jitter_ms <= args.delay_ms:
        p.error(f"--jitter-ms must be from 0 to --delay-ms ({args.delay_ms:g}), got {args.jitter_ms:g}")
    return serve(args.queue, args.delay_ms / 1000, args.jitter_ms / 1000, args.seed)


if __name__ == "__main__":
    sys.exit(main())
