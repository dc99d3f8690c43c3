"""The ConfigMap carrying the in-pod files into the vLLM container: the launcher (cpullm/launcher.py), the fixes
to vLLM (cpullm/vllm_fixes.py, as sitecustomize.py) and the API key guard (cpullm/api_key_guard.py).

The kubelet picks a Guaranteed pod's exclusive CPUs at admission, so only code running inside the container
can bind vLLM's ranks to them; the stock vLLM image has python3, so both ship as stdlib-only files, mounted at
constants.LAUNCHER_MOUNT (the fixes in a directory of their own, which the launcher puts on PYTHONPATH).
"""

from __future__ import annotations

import functools
import hashlib
import re
from importlib import resources
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core import constants as c
from cpullm.core.children.common import Owner, metadata

# The files' sources are part of this package: read once, they are as fixed as any other constant.
# ConfigMap key -> (source file in the package, path under the mount).
IN_POD_FILES = {
    c.LAUNCHER_FILE: (c.LAUNCHER_FILE, c.LAUNCHER_FILE),
    c.SITECUSTOMIZE_FILE: (c.VLLM_FIXES_FILE, f"{c.LAUNCHER_SITE_DIR}/{c.SITECUSTOMIZE_FILE}"),
    c.API_KEY_GUARD_FILE: (c.API_KEY_GUARD_FILE, f"{c.API_KEY_GUARD_DIR}/{c.API_KEY_GUARD_MODULE}.py"),
}
SUPPORT_BLOCK = re.compile(r"# <vllm_support>.*?# </vllm_support>\n", re.DOTALL)


def _source(name: str) -> str:
    """A package file as the pod gets it: the fixes with cpullm/vllm_support.py inline where they import it (the pod
    has no cpullm package)."""
    text = resources.files("cpullm").joinpath(name).read_text()
    if name != c.VLLM_FIXES_FILE:
        return text
    support = resources.files("cpullm").joinpath("vllm_support.py").read_text()
    inlined, count = SUPPORT_BLOCK.subn(lambda _: f"# cpullm/vllm_support.py, inline:\n{support}\n", text)
    if count != 1:
        raise RuntimeError(f"{name} must import cpullm.vllm_support once, between its markers")
    return inlined


SOURCES = {key: _source(source) for key, (source, _) in IN_POD_FILES.items()}
VOLUME_NAME = "launcher"


IN_POD_CODE = "cpullm.io/in-pod-code"


def _mounted(api_key_guard: bool) -> list[str]:
    """The ConfigMap's keys a server's pod mounts: the guard's only where the spec has an API key."""
    return [key for key in IN_POD_FILES if api_key_guard or key != c.API_KEY_GUARD_FILE]


def in_pod_code_digest(api_key_guard: bool) -> str:
    """A digest of the in-pod files a server runs (those launcher_volume mounts), for its pod template: a change of
    them (a fix to the guard, the launcher or the fixes to vLLM) changes the template, so the servers are rolled
    onto it (paced, as any change their user did not ask for), not left on the code they started with."""
    return _digest_of(tuple((key, SOURCES[key]) for key in sorted(_mounted(api_key_guard))))


@functools.lru_cache(maxsize=8)  # asked on every reconcile of the same files: their strings' hashes are kept
def _digest_of(files: tuple[tuple[str, str], ...]) -> str:
    digest = hashlib.sha256()
    for key, source in files:
        digest.update(key.encode() + b"\0" + source.encode() + b"\0")
    return digest.hexdigest()[:16]


def launcher_config_map_name(owner: Owner) -> str:
    return f"{owner.name}-launcher"


def build_launcher_config_map(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    del spec, plan  # the same files serve every plan; the Deployment passes the launcher the plan's ranks
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata(owner), "name": launcher_config_map_name(owner)},
        "data": dict(SOURCES),
    }


def launcher_volume(owner: Owner, api_key_guard: bool) -> dict[str, Any]:
    """The pod's volume of the ConfigMap, each file it uses at its path under the mount: the guard only where the
    spec has an API key, so that the pod template of every other server stays as it was before the guard."""
    items = [{"key": key, "path": IN_POD_FILES[key][1]} for key in _mounted(api_key_guard)]
    return {"name": VOLUME_NAME, "configMap": {"name": launcher_config_map_name(owner), "items": items}}


def launcher_volume_mount() -> dict[str, Any]:
    return {"name": VOLUME_NAME, "mountPath": c.LAUNCHER_MOUNT, "readOnly": True}


def launcher_command(plan: Plan) -> list[str]:
    """The launcher's command line, before `--` and the server's."""
    return [
        "python3",
        f"{c.LAUNCHER_MOUNT}/{c.LAUNCHER_FILE}",
        "--ranks",
        str(plan.tensor_parallel_size),
        "--reserved-cpus-per-rank",
        str(plan.reserved_cpus_per_rank),
        "--python-path",
        f"{c.LAUNCHER_MOUNT}/{c.LAUNCHER_SITE_DIR}",
    ]
