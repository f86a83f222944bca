"""Diagnosis that acts: hangs, stragglers and silent data corruption found and evicted.

    telemetry.py  what agents report per rank (bounded), anchored at the receive time
    hang.py       the wait-for graph over stuck collectives: leaves, not-joined vs no-progress
    straggler.py  windows of own time per group, median/MAD flags, persistence over windows
    sdc.py        digest mismatches attributed to hosts by rank digests; incidents per host
    findings.py   a finding (kind, candidate hosts, confidence, evidence) and the bounded log
    policy.py     finding -> action (evict, dry-run, hold, report), limits first, with a reason
    engine.py     the diagnosis' bounded memory, tying the analyzers together
    acting.py     the Diagnostician component: ingest, analyze on the tick, findings into intents
    settings.py   DiagnosisSettings

All of it is pure: time is an argument, nothing here reads a clock or does I/O.
"""
