"""The Grafana dashboard and PodMonitor in deploy/monitoring: every PromQL expression names
only series that a live controller process (scraped over HTTP, after a job with a failure
and a recovery) really exports, and the PodMonitor finds the controller pods' port."""

from __future__ import annotations

import asyncio
import json
import re
import subprocess
from pathlib import Path

import grpc
import httpx
import kubernetes_validate
import promql_parser
import yaml
from prometheus_client.parser import text_string_to_metric_families

from protos import controller_pb2 as pb
from tests.deploy.test_manifests import K8S_VERSION
from protos import controller_pb2_grpc as pbg
from tests.ha.cluster import LeaderLog, train
from tests.waiting import wait_for, wait_for_blocking

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "deploy" / "monitoring"
JOB = "dash"
#: Grafana's own variables, replaced by what Grafana would put there before parsing
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$job_id": ".*"}
REQUIRED_PANELS = ("goodput", "healthy replicas", "quorum latency", "step time", "failures by cause",
                   "time to recover", "spares")


def panels(dashboard: dict) -> list[dict]:
    out = []
    for p in dashboard["panels"]:
        out.append(p)
        out.extend(p.get("panels", []))
    return out


def expressions(dashboard: dict) -> list[str]:
    exprs = [t["expr"] for p in panels(dashboard) for t in p.get("targets", [])]
    for var in dashboard["templating"]["list"]:
        query = var.get("query")
        if isinstance(query, dict):  # label_values(METRIC, LABEL) is Grafana's, not PromQL
            metric, _ = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", query["query"]).groups()
            exprs.append(metric)
    return exprs


def selectors(expr: str) -> list[tuple[str, list]]:
    for name, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(name, value)
    found = []

    def visit(node):
        if isinstance(node, promql_parser.VectorSelector):
            found.append((node.name, [(m.name, m.op, m.value) for m in node.matchers.matchers]))
        return True

    promql_parser.walk(promql_parser.parse(expr), visit)
    return found


async def run_job_with_a_failure(address: str, http: str) -> None:
    """Three simulated leaders train; r2 is reported dead, comes back behind and catches up."""
    logs = {r: LeaderLog(r) for r in ("r0", "r1", "r2")}
    stops = {r: asyncio.Event() for r in logs}
    tasks = {r: asyncio.ensure_future(train([address], r, logs[r], stops[r], step_s=0.03, job_id=JOB)) for r in logs}
    try:
        await wait_for(lambda: all(len(log.acked_steps) >= 3 for log in logs.values()), 30, "3 steps each")
        tasks["r2"].cancel()
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pbg.ControllerStub(channel)
            await stub.ReportFailure(pb.ReportFailureRequest(job_id=JOB, replica_id="r2", reason="Xid 79",
                                                             kind=pb.ReportFailureRequest.REPLICA_DEAD))
            for host, spare in (("h0", False), ("s0", True)):
                await stub.RegisterAgent(pb.RegisterAgentRequest(host_id=host, incarnation="1", spare=spare))
        logs["r2"] = LeaderLog("r2")  # a new incarnation starts from step 0: it joins behind
        tasks["r2"] = asyncio.ensure_future(train([address], "r2", logs["r2"], stops["r2"], step_s=0.03, job_id=JOB))

        def r2_healthy():
            reps = httpx.get(f"{http}/api/v1/replicas", timeout=5).json()
            return any(r["replica_id"] == "r2" and r["state"] == "HEALTHY" for r in reps)

        await wait_for_blocking(r2_healthy, 30, "r2 to catch up and be HEALTHY again")
    finally:
        for r in logs:
            stops[r].set()
            tasks[r].cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


async def test_every_dashboard_expression_names_exported_series(controller_process):
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    titles = " | ".join(p["title"].lower() for p in panels(dashboard))
    assert all(required in titles for required in REQUIRED_PANELS), titles
    ctl = controller_process("--job-id", JOB, "--replicas", "3", "--min-replicas", "1", "--join-timeout-s", "1",
                             "--heartbeat-timeout-s", "5", "--event-log", "off")
    await run_job_with_a_failure(ctl.grpc, ctl.http)
    exported: dict[str, list[dict]] = {}
    for family in text_string_to_metric_families(httpx.get(f"{ctl.http}/metrics", timeout=5).text):
        for s in family.samples:
            exported.setdefault(s.name, []).append(s.labels)
    assert exported["fthsdp_failure_recovery_seconds_count"] and exported["fthsdp_step_seconds_count"]
    checked = set()
    for expr in expressions(dashboard):
        found = selectors(expr)
        assert found, f"no metric in {expr!r}"
        for name, matchers in found:
            assert name in exported, f"{expr!r} names {name}, which the controller does not export"
            for label, op, value in matchers:  # a fixed label value must exist too
                if op == promql_parser.MatchOp.Equal:
                    assert any(labels.get(label) == value for labels in exported[name]), (expr, label, value)
            checked.add(name)
    assert len(checked) >= 15, sorted(checked)


def test_monitoring_kustomization_renders_the_dashboard_configmap():
    out = subprocess.run(["kubectl", "kustomize", str(MONITORING)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    docs = {d["kind"]: d for d in yaml.safe_load_all(out.stdout) if d}
    assert set(docs) == {"ConfigMap", "PodMonitor"}
    kubernetes_validate.validate(docs["ConfigMap"], K8S_VERSION, strict=True)
    assert docs["ConfigMap"]["metadata"]["labels"] == {"grafana_dashboard": "1"}
    assert json.loads(docs["ConfigMap"]["data"]["fthsdp.json"])["uid"] == "fthsdp-job"
    monitor = docs["PodMonitor"]
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert set(monitor["spec"]) == {"selector", "podMetricsEndpoints"}
    for endpoint in monitor["spec"]["podMetricsEndpoints"]:
        assert set(endpoint) <= {"port", "path", "interval", "scrapeTimeout", "authorization", "scheme", "tlsConfig"}
        if "authorization" in endpoint:  # the read token (--read-token-file), from its Secret
            assert endpoint["authorization"] == {"type": "Bearer",
                                                 "credentials": {"name": "fthsdp-read-token", "key": "token"}}


def test_podmonitor_selects_the_controller_pods_port():
    monitor = yaml.safe_load((MONITORING / "podmonitor.yaml").read_text())
    docs = [d for d in yaml.safe_load_all((ROOT / "deploy/kustomize/base/controller.yaml").read_text()) if d]
    deployment = next(d for d in docs if d["kind"] == "StatefulSet")
    pod = deployment["spec"]["template"]
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    ports = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
    assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= ports
    assert all(e["path"] == "/metrics" for e in monitor["spec"]["podMetricsEndpoints"])
    kustomization = yaml.safe_load((MONITORING / "kustomization.yaml").read_text())
    files = [f.split("=", 1)[1] for g in kustomization["configMapGenerator"] for f in g["files"]]
    assert all((MONITORING / f).is_file() for f in files) and kustomization["resources"] == ["podmonitor.yaml"]
