"""The ConfigMap carrying the in-pod launcher (cpullm/launcher.py) into the vLLM container.

The kubelet picks a Guaranteed pod's exclusive CPUs at admission, so only code running inside the container
can bind vLLM's ranks to them; the stock vLLM image has python3, so the launcher ships as one stdlib-only
file, mounted at constants.LAUNCHER_MOUNT.
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec
from cpullm.core import constants as c
from cpullm.core.children.common import Owner, metadata

# The launcher's source is part of this package: read once, it is as fixed as any other constant.
LAUNCHER_SOURCE = resources.files("cpullm").joinpath(c.LAUNCHER_FILE).read_text()


def launcher_config_map_name(owner: Owner) -> str:
    return f"{owner.name}-launcher"


def build_launcher_config_map(owner: Owner, spec: CpuLLMServiceSpec, plan: Plan) -> dict[str, Any]:
    del spec, plan  # the same launcher serves every plan; the Deployment passes it the plan's ranks
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {**metadata(owner), "name": launcher_config_map_name(owner)},
        "data": {c.LAUNCHER_FILE: LAUNCHER_SOURCE},
    }
