"""`fthsdp status` against a real controller process."""

import subprocess
import sys


from fthsdp.status import table


def test_status_prints_tables(controller_process):
    ctl = controller_process("--replicas", "2", "--job-id", "demo")
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert 'job "demo" RUNNING' in out.stdout and "no quorum yet" in out.stdout and "REPLICA" in out.stdout
    assert "round: no replica has joined this round" in out.stdout
    assert "committed step none yet  effective training time 0.0% over 0s" in out.stdout


def test_status_reports_unreachable_controller():
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", "http://127.0.0.1:9",
                          "--timeout-s", "2"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 1 and "cannot reach http://127.0.0.1:9" in out.stderr


def test_controller_refuses_bad_settings():
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "controller", "--replicas", "2", "--min-replicas", "5",
                          "--grpc-port", "0", "--http-port", "0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and "min_replicas must be between 1 and replicas (2), got 5" in out.stderr


def test_table_aligns_columns():
    assert table(["A", "BB"], [[1, None], ["long", 2]]).splitlines() == ["A     BB", "----  --", "1     -", "long  2"]


def test_status_shows_finished_replicas_and_a_completed_job(controller_process):
    import grpc

    from protos import controller_pb2 as pb
    from protos import controller_pb2_grpc as pbg

    ctl = controller_process("--replicas", "2", "--min-replicas", "1", "--job-id", "demo")
    with grpc.insecure_channel(ctl.grpc) as channel:
        stub = pbg.ControllerStub(channel)
        joins = [stub.Quorum.future(pb.QuorumRequest(job_id="demo", replica_id=rid, step=0, world_size=1), timeout=30)
                 for rid in ("r0", "r1")]
        assert {len(j.result().members) for j in joins} == {2}
        stub.ReportStep(pb.ReportStepRequest(job_id="demo", replica_id="r0", step=0, digest="00ff" * 8,
                                             quorum_id=joins[0].result().quorum_id), timeout=10)
        assert stub.ReportFinished(pb.ReportFinishedRequest(job_id="demo", replica_id="r0", step=0),
                                   timeout=10).job_state == pb.RUNNING
        assert stub.ReportFinished(pb.ReportFinishedRequest(job_id="demo", replica_id="r1", step=-1, reason="done"),
                                   timeout=10).job_state == pb.COMPLETED
    out = subprocess.run([sys.executable, "-m", "fthsdp.cli", "status", "--url", ctl.http],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert 'job "demo" COMPLETED' in out.stdout and "2 finished" in out.stdout
    rows = {line.split()[0]: line for line in out.stdout.splitlines() if line.startswith("r")}
    assert "FINISHED" in rows["r0"] and "00ff00ff00ff@0" in rows["r0"]
    assert "FINISHED" in rows["r1"] and "finished after step -1: done" in rows["r1"]
    assert 'job "demo" COMPLETED: 2 replica(s) finished, 0 dead' in out.stdout
    assert "replica commits 1" in out.stdout  # r0's one commit report; the job's newest step is 0
