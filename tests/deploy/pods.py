"""A rendered pod template started as local processes, the way kubelet would start its container.

Only what a cluster provides is substituted: the downward API's values (given per pod), the
ConfigMap and Secret keys (given), `$(VAR)` references expanded from the container's own
environment, the volumes (each mount a folder of the test's: an emptyDir empty, a Secret or
ConfigMap one file per key, with `subPath` the one file; a PersistentVolumeClaim one folder that
every pod mounting the claim shares), and names the test maps to where they are here (Service
and pod DNS names, the image's paths). `python` is this interpreter, `fthsdp` this virtualenv's.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

BIN = Path(sys.executable).parent


def environment(container: dict, downward: dict[str, str], configmaps: dict[str, dict]) -> dict[str, str]:
    """The container's env list, resolved (literal values, fieldRefs, configMapKeyRefs)."""
    env: dict[str, str] = {}
    for e in container.get("env", []):
        source = e.get("valueFrom", {})
        if "value" in e:
            env[e["name"]] = e["value"]
        elif "fieldRef" in source:
            env[e["name"]] = downward[source["fieldRef"]["fieldPath"]]
        else:
            ref = source["configMapKeyRef"]
            env[e["name"]] = configmaps[ref["name"]][ref["key"]]
    return env


def volumes(spec: dict, container: dict, pod_dir: Path, secrets: dict[str, dict],
            configmaps: dict[str, dict] | None = None) -> dict[str, str]:
    """The container's mounts made under `pod_dir`; returns mount path -> local path."""
    out = {}
    for mount in container.get("volumeMounts", []):
        volume = next(v for v in spec["volumes"] if v["name"] == mount["name"])
        folder = pod_dir / mount["name"]
        if "persistentVolumeClaim" in volume:
            folder = pod_dir.parent / f"pvc-{volume['persistentVolumeClaim']['claimName']}"
            folder.mkdir(exist_ok=True)
            out[mount["mountPath"]] = str(folder)
            continue
        folder.mkdir(parents=True)
        if "secret" in volume:
            for key, value in secrets[volume["secret"]["secretName"]].items():
                (folder / key).write_text(value)
                (folder / key).chmod(volume["secret"].get("defaultMode", 0o644))
        elif "configMap" in volume:
            for key, value in (configmaps or {})[volume["configMap"]["name"]].items():
                (folder / key).write_text(value)
        else:
            assert "emptyDir" in volume, volume
        out[mount["mountPath"]] = str(folder / mount["subPath"]) if mount.get("subPath") else str(folder)
    return out


def command_line(container: dict, env: dict[str, str], here: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """argv and env with $(VAR) expanded and every name in `here` (whole names: a mount at /tmp
    does not rewrite /tmpfoo) replaced in one pass."""
    args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in container.get("args", [])]
    names = re.compile("|".join(re.escape(n) + r"(?=/|$|:|,)" for n in sorted(here, key=len, reverse=True)))
    args = [names.sub(lambda m: here[m.group(0)], a) for a in args]
    env = {k: names.sub(lambda m: here[m.group(0)], v) for k, v in env.items()}
    command = list(container["command"])
    assert command[0] == "fthsdp", command
    if "--" in args:
        cut = args.index("--")
        assert args[cut + 1] == "python", args
        args[cut + 1] = sys.executable
    return [str(BIN / "fthsdp"), *command[1:], *args], env
