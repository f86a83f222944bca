"""The report's plots: every failure label and axis text lies inside the frame."""

from __future__ import annotations

import pytest

from fthsdp.demo import plots

INJECTIONS = [{"kind": "kill-trainer", "replica": "r1", "injected_step": 50, "samples": 6000, "injected_at": 112.0},
              {"kind": "kill-agent", "replica": "r2", "injected_step": 130, "samples": 15000, "injected_at": 130.0}]


def inside(inner, outer, slack: float = 1.0) -> bool:
    return (inner.x0 >= outer.x0 - slack and inner.x1 <= outer.x1 + slack
            and inner.y0 >= outer.y0 - slack and inner.y1 <= outer.y1 + slack)


@pytest.mark.parametrize("figure", [
    lambda: plots.loss_figure({n * 128: 2.0 / (n + 1) for n in range(200)},
                              {n * 128: 1.9 / (n + 1) for n in range(190)}, INJECTIONS),
    lambda: plots.healthy_figure([(100.0 + t, 4 - (110 < 100 + t < 120)) for t in range(60)], 4, INJECTIONS, 100.0),
])
def test_labels_fit_inside_the_frame(figure):
    fig = figure()
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (ax,) = fig.axes
    labels = [t for t in ax.texts if "kill-" in t.get_text()]
    assert [t.get_text().strip() for t in labels] == ["kill-trainer r1", "kill-agent r2"]
    for t in labels:
        assert inside(t.get_window_extent(renderer), ax.get_window_extent(renderer)), t.get_text()
    for t in (ax.title, ax.xaxis.label, ax.yaxis.label):
        assert inside(t.get_window_extent(renderer), fig.bbox), t.get_text()
    plots._pyplot().close(fig)
