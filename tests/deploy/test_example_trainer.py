"""deploy/examples/train.py against the trainer runtime's real API, without importing torch.

The script is compiled, and read as a syntax tree: what it imports from fthsdp, how it builds
the Manager, which Manager and FaultTolerantOptimizer members it uses, the RuntimeSettings
fields its flags set, and every FTHSDP_* name it or the manifests hand a trainer must be one
the runtime defines (fthsdp/settings.py, protos/dial.py, agent/env.py).
"""

from __future__ import annotations

import ast
import dataclasses
import py_compile
import re

import fthsdp
from fthsdp import settings as runtime_settings
from protos import dial

from .test_manifests import OVERLAYS, ROOT, render

SCRIPT = ROOT / "deploy" / "examples" / "train.py"
TREE = ast.parse(SCRIPT.read_text())


def _class(path, name: str) -> ast.ClassDef:
    tree = ast.parse((ROOT / path).read_text())
    return next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == name)


def _members(cls: ast.ClassDef) -> set[str]:
    """Methods, properties and the attributes __init__/start assign on self."""
    out = {n.name for n in cls.body if isinstance(n, ast.FunctionDef)}
    for n in ast.walk(cls):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and \
                isinstance(n.value, ast.Name) and n.value.id == "self":
            out.add(n.attr)
    return {m for m in out if not m.startswith("_")}


def _calls(name: str) -> list[ast.Call]:
    return [n for n in ast.walk(TREE) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
            and n.func.id == name]


def _used_members(variable: str) -> set[str]:
    return {n.attr for n in ast.walk(TREE) if isinstance(n, ast.Attribute)
            and isinstance(n.value, ast.Name) and n.value.id == variable}


def _known_env_names() -> set[str]:
    from agent import env as agent_env

    names = {v for k, v in vars(runtime_settings).items() if k.startswith("ENV_")}
    names |= {v for k, v in vars(dial).items() if k.startswith("ENV_")}
    names |= {v for v in vars(agent_env).values() if isinstance(v, str) and v.startswith("FTHSDP_")}
    return names


def test_train_script_compiles(tmp_path):
    py_compile.compile(str(SCRIPT), cfile=str(tmp_path / "train.pyc"), doraise=True)


def test_train_script_imports_only_what_fthsdp_exports():
    imported = {a.name for n in ast.walk(TREE) if isinstance(n, ast.ImportFrom) and n.module == "fthsdp"
                for a in n.names}
    assert {"Manager", "RuntimeSettings", "FaultTolerantOptimizer"} <= imported
    assert imported <= set(fthsdp.__all__)


def test_train_script_builds_the_manager_as_its_constructor_takes_it():
    init = next(n for n in _class("fthsdp/manager.py", "Manager").body
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    positional = [a.arg for a in init.args.args][1:]  # model, optimizer, settings
    keywords = {a.arg for a in init.args.kwonlyargs}
    (call,) = _calls("Manager")
    assert len(call.args) == len(positional) and {k.arg for k in call.keywords} <= keywords
    assert len([n for n in ast.walk(TREE) if isinstance(n, ast.Call)
                and ast.unparse(n.func) == "RuntimeSettings.from_env"]) == 1
    assert _calls("FaultTolerantOptimizer")


def test_train_script_uses_existing_manager_and_optimizer_members():
    manager = _members(_class("fthsdp/manager.py", "Manager"))
    assert _used_members("manager") <= manager, _used_members("manager") - manager
    wrapper = _members(_class("fthsdp/optimizer_wrapper.py", "FaultTolerantOptimizer"))
    assert _used_members("ft_optimizer") <= wrapper, _used_members("ft_optimizer") - wrapper
    outcome = {n.target.id for n in _class("fthsdp/step/events.py", "StepOutcome").body
               if isinstance(n, ast.AnnAssign)}
    assert _used_members("out") <= outcome
    # start() must exist (it returns the Manager), and so must close() and batches().
    assert "start" in manager and "close" in manager and "batches" in manager


def test_train_script_flags_name_runtime_settings_fields():
    node = next(n for n in TREE.body if isinstance(n, ast.Assign)
                and any(isinstance(t, ast.Name) and t.id == "SETTINGS_FLAGS" for t in n.targets))
    flags = {ast.literal_eval(k): ast.unparse(v) for k, v in zip(node.value.keys, node.value.values)}
    fields = {f.name: f.type for f in dataclasses.fields(runtime_settings.RuntimeSettings)}
    assert set(flags) <= set(fields), set(flags) - set(fields)
    for name, conv in flags.items():
        assert conv == fields[name], f"--{name.replace('_', '-')} parses {conv}, the field is {fields[name]}"


def test_every_fthsdp_name_given_to_a_trainer_exists_in_the_runtime():
    known = _known_env_names()
    in_script = set(re.findall(r"FTHSDP_\w+", SCRIPT.read_text()))
    assert in_script <= known, in_script - known
    for rel in OVERLAYS:
        docs = render(rel)
        trainers = [c for d in docs if d["kind"] == "DaemonSet" for c in d["spec"]["template"]["spec"]["containers"]]
        for c in trainers:
            names = {e["name"] for e in c.get("env", []) if e["name"].startswith("FTHSDP_")}
            assert names <= known, f"{rel}/{c['name']}: {sorted(names - known)} are read by nothing"
