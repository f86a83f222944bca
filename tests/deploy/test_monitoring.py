"""The PodMonitor for each overlay scrapes the way that overlay's controller serves /metrics:
plain HTTP without a token (dev: deploy/monitoring), HTTPS checked against the controller
certificate's CA with the read token the controller requires (production:
deploy/monitoring-production), both from the Secrets the controller itself mounts."""

from __future__ import annotations

import subprocess

import pytest
import yaml

from .test_manifests import DEPLOY, KUBECTL, _by, render

PAIRS = [("kustomize/overlays/dev", "monitoring"), ("kustomize/overlays/production", "monitoring-production")]


def _monitor(rel: str) -> dict:
    out = subprocess.run([KUBECTL, "kustomize", str(DEPLOY / rel)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return next(d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PodMonitor")


def _flag(args: list[str], name: str) -> str | None:
    return next((a.split("=", 1)[1] for a in args if a.startswith(f"{name}=")), None)


@pytest.mark.parametrize("overlay, monitoring", PAIRS)
def test_the_podmonitor_scrapes_as_the_controller_serves(overlay, monitoring):
    pod = _by(render(overlay), "StatefulSet", "fthsdp-controller")["spec"]["template"]["spec"]
    [c] = [c for c in pod["containers"] if c["name"] == "controller"]
    secret_at = {m["mountPath"]: next(v["secret"]["secretName"] for v in pod["volumes"] if v["name"] == m["name"])
                 for m in c["volumeMounts"] if any(v["name"] == m["name"] and "secret" in v for v in pod["volumes"])}

    def secret_of(path: str) -> tuple[str, str]:
        folder, key = path.rsplit("/", 1)
        return secret_at[folder], key

    [endpoint] = _monitor(monitoring)["spec"]["podMetricsEndpoints"]
    https, token = _flag(c["args"], "--http-tls-cert-file"), _flag(c["args"], "--read-token-file")
    assert endpoint["scheme"] == ("https" if https else "http")
    if https:
        ca = endpoint["tlsConfig"]["ca"]["secret"]
        assert (ca["name"], ca["key"]) == (secret_of(https)[0], "ca.crt")
        assert endpoint["tlsConfig"]["serverName"] == "fthsdp-controller-http"
    else:
        assert "tlsConfig" not in endpoint
    if token:
        credentials = endpoint["authorization"]["credentials"]
        assert (credentials["name"], credentials["key"]) == secret_of(token)
    else:
        assert "authorization" not in endpoint
    assert (overlay == "kustomize/overlays/production") == bool(https) == bool(token)
