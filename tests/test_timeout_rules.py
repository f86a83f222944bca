"""The timeout hierarchy (protos/timeout_rules.py) as tables: every rule holds at the defaults,
each rule is refused with both of its values named, and each process refuses its own rules
where it reads its settings (controller, agent, runtime)."""

from __future__ import annotations

import dataclasses

import pytest

from agent.settings import AgentSettings
from controller.core.diagnosis.settings import DiagnosisSettings
from controller.settings import ControllerSettings
from fthsdp.settings import TIMEOUT_ENV, RuntimeSettings, timeouts_from_env
from protos import timeout_rules as tr
from tests.trainer_secret import SECRET

AGENT = dict(controller_addresses=("127.0.0.1:1",), host_id="h", command=("true",))
RUNTIME = dict(controller_address="127.0.0.1:1", job_secret=SECRET)


def defaults() -> dict[str, float]:
    """Every process's default timeouts, qualified: one whole configuration."""
    return {**tr.qualified(tr.CONTROLLER, ControllerSettings().timeout_values()),
            **tr.qualified(tr.AGENT, AgentSettings(**AGENT).timeout_values()),
            **tr.qualified(tr.RUNTIME, RuntimeSettings(**RUNTIME).timeout_values())}


def breaking(rule: tr.Rule, values: dict[str, float]) -> dict[str, float]:
    """`values` with the rule's larger side set just below what the rule asks."""
    smaller = rule.factor * sum(values[n] for n in rule.smaller)
    return {**values, rule.larger: smaller * 0.9}


def test_the_catalogue_names_every_timeout_of_every_settings_class_and_nothing_else():
    assert set(defaults()) == set(tr.WAITS)
    for rule in tr.RULES:
        assert set(rule.names) <= set(tr.WAITS), rule
        assert rule.factor >= 1 and rule.why, rule


#: Settings in seconds that bound no wait: windows and spans that statistics are taken over.
NOT_WAITS = {"controller.restart_window_s", "agent.restart_window_s", "controller.diagnosis.straggler_min_span_s",
             "controller.diagnosis.straggler_min_excess_s", "controller.diagnosis.sdc_window_s",
             "controller.diagnosis.hold_s"}


def test_every_setting_in_seconds_is_in_the_catalogue_or_named_as_no_wait():
    """A new timeout fails here until protos/timeout_rules.py (and docs/operations.md) have it."""
    classes = ((tr.CONTROLLER, ControllerSettings), (tr.CONTROLLER + ".diagnosis", DiagnosisSettings),
               (tr.AGENT, AgentSettings), (tr.RUNTIME, RuntimeSettings))
    seconds = {f"{prefix}.{f.name}" for prefix, cls in classes for f in dataclasses.fields(cls)
               if f.name.endswith("_s") or "_s_" in f.name}
    assert seconds - NOT_WAITS == set(tr.WAITS) and NOT_WAITS <= seconds


def test_the_defaults_break_no_rule():
    assert tr.check(defaults()) == []


@pytest.mark.parametrize("rule", tr.RULES, ids=lambda r: r.text())
def test_each_rule_is_refused_naming_both_values(rule):
    values = breaking(rule, defaults())
    broken = {v.rule: v for v in tr.check(values)}
    assert rule in broken and all(r.larger == rule.larger for r in broken), broken  # only rules of that value
    message = broken[rule].message()
    assert f"{rule.larger} ({values[rule.larger]:g} s) must be at least" in message
    for name in rule.smaller:
        assert f"{name} ({values[name]:g} s)" in message
    assert rule.why in message
    # exactly at the bound it holds
    at_bound = {**values, rule.larger: rule.factor * sum(values[n] for n in rule.smaller)}
    assert rule not in [v.rule for v in tr.check(at_bound)]


def test_a_rule_with_a_value_missing_is_not_judged():
    values = {"runtime.gather_timeout_s": 1.0, "runtime.allreduce_timeout_s": 5.0}
    assert [v.rule.larger for v in tr.check(values)] == ["runtime.gather_timeout_s"]
    assert tr.check({"runtime.gather_timeout_s": 1.0}) == []
    assert tr.check({"runtime.gather_timeout_s": float("nan"), "runtime.allreduce_timeout_s": 5.0}) == []


def test_a_local_message_leaves_out_its_own_process_but_names_the_others():
    rule = next(r for r in tr.RULES if r.larger == "runtime.quorum_timeout_s")
    values = {"runtime.quorum_timeout_s": 10.0, "controller.join_timeout_s": 30.0, "controller.rollback_wait_s": 20.0}
    (v,) = tr.check(values, [rule])
    assert v.message("runtime").startswith(
        "quorum_timeout_s (10 s) must be at least controller.join_timeout_s (30 s) + controller.rollback_wait_s "
        "(20 s) = 50 s: ")
    assert rule.text("runtime") == "quorum_timeout_s >= controller.join_timeout_s + controller.rollback_wait_s"


def test_an_unknown_process_is_refused_by_name():
    with pytest.raises(ValueError, match="'trainer.x_s' does not start with one of controller, agent, runtime"):
        tr.process_of("trainer.x_s")


# -- each process refuses the rules among its own values, where it reads them ------------------

def _own(process: str) -> list[tr.Rule]:
    return [r for r in tr.RULES if r.processes == {process}]


def _field(name: str) -> str:
    return name.split(".", 1)[1]


def test_every_process_has_rules_of_its_own():
    assert all(_own(p) for p in tr.PROCESSES)


def _message(rule: tr.Rule, values: dict[str, float], process: str) -> str:
    return next(v for v in tr.check(values) if v.rule == rule).message(process)


@pytest.mark.parametrize("rule", _own(tr.CONTROLLER), ids=lambda r: r.text())
def test_the_controller_refuses_its_rules(rule):
    bad = breaking(rule, tr.qualified(tr.CONTROLLER, ControllerSettings().timeout_values()))
    top = {_field(n): v for n, v in bad.items() if n.count(".") == 1}
    diagnosis = {n.rsplit(".", 1)[1]: v for n, v in bad.items() if n.count(".") == 2}
    with pytest.raises(ValueError) as err:
        ControllerSettings(**top, diagnosis=DiagnosisSettings(**diagnosis)).validate()
    assert _message(rule, bad, tr.CONTROLLER) in str(err.value)


BUILD = {tr.AGENT: lambda **kw: AgentSettings(**AGENT, **kw), tr.RUNTIME: lambda **kw: RuntimeSettings(**RUNTIME, **kw)}


@pytest.mark.parametrize(("process", "rule"), [(p, r) for p in BUILD for r in _own(p)],
                         ids=lambda x: x.text() if isinstance(x, tr.Rule) else x)
def test_the_agent_and_the_runtime_refuse_their_rules(process, rule):
    bad = breaking(rule, tr.qualified(process, BUILD[process]().timeout_values()))
    with pytest.raises(ValueError) as err:
        BUILD[process](**{_field(n): v for n, v in bad.items()}).validate()
    assert _message(rule, bad, process) in str(err.value)


def test_the_runtime_refuses_the_issues_examples_naming_both_values():
    with pytest.raises(ValueError) as err:
        RuntimeSettings(**RUNTIME, heartbeat_interval_s=500).validate()
    assert "controller_heartbeat_timeout_s (10 s) must be at least 3 × heartbeat_interval_s (500 s)" in str(err.value)
    with pytest.raises(ValueError) as err:
        RuntimeSettings(**RUNTIME, allreduce_timeout_s=1000, gather_timeout_s=0.05).validate()
    assert "gather_timeout_s (0.05 s) must be at least allreduce_timeout_s (1000 s)" in str(err.value)
    # a controller with a longer heartbeat timeout, told to the runtime, allows a slower beat
    RuntimeSettings(**RUNTIME, heartbeat_interval_s=20, controller_heartbeat_timeout_s=60).validate()


def test_every_runtime_timeout_comes_from_the_environment_and_a_keyword_wins():
    env = {var: str(10.0 + i) for i, var in enumerate(TIMEOUT_ENV.values())}
    # the values must satisfy the rules: gather above allreduce, the heartbeat well inside the timeout
    env[TIMEOUT_ENV["allreduce_timeout_s"]], env[TIMEOUT_ENV["heartbeat_interval_s"]] = "5", "1"
    read = RuntimeSettings.from_env({**env, "FTHSDP_CONTROLLER": "127.0.0.1:1"}, job_secret=SECRET,
                                    fetch_timeout_s=99.0)
    for name, var in TIMEOUT_ENV.items():
        assert getattr(read, name) == (99.0 if name == "fetch_timeout_s" else float(env[var])), name
    assert timeouts_from_env(env) == {name: float(env[var]) for name, var in TIMEOUT_ENV.items()}
    assert set(TIMEOUT_ENV) == {_field(n) for n in tr.WAITS if n.startswith("runtime.")}


def test_a_runtime_timeout_variable_that_is_no_number_is_refused_by_name():
    with pytest.raises(ValueError, match="FTHSDP_GATHER_TIMEOUT_S='soon' is not a number of seconds"):
        timeouts_from_env({"FTHSDP_GATHER_TIMEOUT_S": "soon"})
    with pytest.raises(ValueError, match="gather_timeout_s.*allreduce_timeout_s"):
        RuntimeSettings.from_env({"FTHSDP_CONTROLLER": "127.0.0.1:1", "FTHSDP_GATHER_TIMEOUT_S": "0.05"},
                                 job_secret=SECRET)


def test_settings_that_break_a_rule_are_refused_unchanged():
    """A refusal changes nothing: the frozen settings are as given, and valid ones still pass."""
    good = RuntimeSettings(**RUNTIME)
    bad = dataclasses.replace(good, gather_timeout_s=1.0)
    with pytest.raises(ValueError):
        bad.validate()
    assert bad.gather_timeout_s == 1.0 and good.validate() is good
