"""The report's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def loss_plot(path: Path, losses: dict[int, float], baseline: dict[int, float] | None,
              injections: list[dict]) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(list(losses), list(losses.values()), label="with failures", color="tab:blue", lw=1.2)
    if baseline:
        ax.plot(list(baseline), list(baseline.values()), label="baseline (no failures)", color="tab:gray",
                lw=1.0, ls="--")
    for i in injections:
        color = "tab:red" if i["kind"] == "kill-agent" else "tab:orange"
        ax.axvline(i["injected_step"], color=color, ls=":", lw=1.2)
        ax.annotate(f"{i['kind']} {i['replica']}", (i["injected_step"], 1), xycoords=("data", "axes fraction"),
                    rotation=90, va="top", ha="right", fontsize=8, color=color)
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (mean over included replicas)")
    ax.set_yscale("log")
    ax.set_title("Loss against step, failures marked")
    ax.legend(loc="upper right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path


def healthy_plot(path: Path, samples: list[tuple[float, int]], total: int, injections: list[dict],
                 t0: float) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    ax.step([t - t0 for t, _ in samples], [n for _, n in samples], where="post", color="tab:green")
    for i in injections:
        color = "tab:red" if i["kind"] == "kill-agent" else "tab:orange"
        x = i["injected_at"] - t0
        ax.axvline(x, color=color, ls=":", lw=1.2)
        ax.annotate(f"{i['kind']} {i['replica']}", (x, 0.02), xycoords=("data", "axes fraction"),
                    rotation=90, va="bottom", ha="right", fontsize=8, color=color)
    ax.set_ylim(-0.2, total + 0.5)
    ax.set_yticks(range(total + 1))
    ax.set_xlabel("seconds since the controller started")
    ax.set_ylabel("HEALTHY replicas")
    ax.set_title("Healthy replicas over time")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
