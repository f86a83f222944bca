"""The PNG plots of a `fthsdp bench` report (matplotlib, no display): FTAR's bus bandwidth per
message size beside Gloo's and the TCP ceiling, quorum latency per replica count beside
torchft's lighthouse (when it was measured), and a timeline per recovery case.
"""

from __future__ import annotations

from pathlib import Path

from bench.common import size_text


def write_all(results: dict[str, list[dict]], out: Path) -> list[Path]:
    """The plots the results allow, written to `out`; their paths."""
    import matplotlib

    matplotlib.use("Agg")
    written = []
    for bench, plot in (("ftar", ftar_busbw), ("quorum", quorum_latency), ("recovery", recovery_timeline)):
        if results.get(bench):
            written.append(plot(results[bench], out))
    return written


def ftar_busbw(results: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for world in sorted({r["world"] for r in results}):
        points = sorted((r for r in results if r["world"] == world), key=lambda r: r["bytes"])
        sizes = [r["bytes"] for r in points]
        ax.plot(sizes, [r["ftar_busbw_gbs"] for r in points], "o-", label=f"FTAR, {world} ranks")
        ax.plot(sizes, [r["gloo_busbw_gbs"] for r in points], "s--", label=f"Gloo, {world} ranks")
        ax.plot(sizes, [r["tcp_busbw_gbs"] for r in points], ":", color="grey", label=f"TCP ring (ceiling), {world}")
    ax.set_xscale("log", base=2)
    sizes = sorted({r["bytes"] for r in results})
    ax.set_xticks(sizes, [size_text(s) for s in sizes])
    ax.set(xlabel="message size", ylabel="bus bandwidth, GB/s", title="All-reduce bus bandwidth")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "ftar_busbw.png")


def quorum_latency(results: list[dict], out: Path) -> Path:
    import matplotlib.pyplot as plt

    points = sorted(results, key=lambda r: r["replicas"])
    n = [r["replicas"] for r in points]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(n, [r["p50_ms"] for r in points], "o-", label="fthsdp p50 (quorum port)")
    ax.plot(n, [r["p99_ms"] for r in points], "o:", label="fthsdp p99")
    if all("torchft_lighthouse_p50_ms" in r for r in points):
        ax.plot(n, [r["torchft_lighthouse_p50_ms"] for r in points], "s-", label="torchft lighthouse p50")
        ax.plot(n, [r["torchft_lighthouse_p99_ms"] for r in points], "s:", label="torchft lighthouse p99")
    else:
        ax.set_title("(torchft not installed: pip install 'fthsdp[bench]')", fontsize=8, loc="right")
    ax.set(xlabel="replicas", ylabel="round latency, ms", xticks=n)
    ax.set_ylim(bottom=0)
    ax.set_title("Quorum latency", loc="left")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, out / "quorum_latency.png")


def recovery_timeline(results: list[dict], out: Path) -> Path:
    """Per case, from the failure (0 s): until detection, until the survivors committed again,
    until the failed replica trained again."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 1 + 0.8 * len(results)))
    spans = (("detection_s", "detected", "tab:red"), ("survivor_stall_s", "survivors commit again", "tab:orange"),
             ("replica_down_s", "replica trains again", "tab:blue"))
    for y, r in enumerate(results):
        for k, (field, label, color) in enumerate(spans):
            if r.get(field) is not None:
                ax.broken_barh([(0, r[field])], (y - 0.35 + 0.25 * k, 0.2), color=color, label=label if y == 0 else None)
    ax.set_yticks(range(len(results)), [r["case"] for r in results])
    ax.set(xlabel="seconds after the failure", title="Recovery timeline")
    ax.grid(axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, out / "recovery_timeline.png")


def _save(fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
