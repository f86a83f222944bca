"""The report's PNG plots (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _mark(ax, x: float, label: str, color: str) -> None:
    """A failure: a dotted line and its label, inside the axes near the top (never clipped)."""
    ax.axvline(x, color=color, ls=":", lw=1.2)
    ax.text(x, 0.97, f" {label}", transform=ax.get_xaxis_transform(), rotation=90, va="top", ha="right",
            fontsize=8, color=color, clip_on=True, bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none",
                                                         "alpha": 0.7})


def loss_plot(path: Path, losses: dict[int, float], baseline: dict[int, float] | None,
              injections: list[dict]) -> Path:
    return _save(loss_figure(losses, baseline, injections), path)


def healthy_plot(path: Path, samples: list[tuple[float, int]], total: int, injections: list[dict],
                 t0: float) -> Path:
    return _save(healthy_figure(samples, total, injections, t0), path)


def _save(fig, path: Path) -> Path:
    fig.savefig(path)
    _pyplot().close(fig)
    return path


def loss_figure(losses: dict[int, float], baseline: dict[int, float] | None, injections: list[dict]):
    """Training loss against samples seen (`losses` and `baseline` keyed by samples; each
    injection carries the samples seen when it happened)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    ax.plot(list(losses), list(losses.values()), label="with failures", color="tab:blue", lw=1.2)
    if baseline:
        ax.plot(list(baseline), list(baseline.values()), label="baseline (no failures)", color="tab:gray",
                lw=1.0, ls="--")
    for i in injections:
        _mark(ax, i["samples"], f"{i['kind']} {i['replica']}", "tab:red" if i["kind"] == "kill-agent" else "tab:orange")
    ax.set_xlabel("samples seen")
    ax.set_ylabel("training loss (mean over included replicas)")
    ax.set_yscale("log")
    ax.set_title("Loss against samples seen, failures marked")
    ax.legend(loc="lower left")  # the loss falls from the top left: this corner stays free
    fig.tight_layout()
    return fig


def healthy_figure(samples: list[tuple[float, int]], total: int, injections: list[dict], t0: float):
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 3.5), dpi=100)
    ax.step([t - t0 for t, _ in samples], [n for _, n in samples], where="post", color="tab:green")
    for i in injections:
        _mark(ax, i["injected_at"] - t0, f"{i['kind']} {i['replica']}",
              "tab:red" if i["kind"] == "kill-agent" else "tab:orange")
    ax.set_ylim(-0.2, total + 0.5)
    ax.set_yticks(range(total + 1))
    ax.set_xlabel("seconds since the controller started")
    ax.set_ylabel("HEALTHY replicas")
    ax.set_title("Healthy replicas over time")
    fig.tight_layout()
    return fig
