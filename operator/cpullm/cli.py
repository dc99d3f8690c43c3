"""`cpullm`: plan, render and the CRD offline, for people and CI; `run` starts the operator."""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import yaml

from cpullm.api.crd import build_crd
from cpullm.api.plan import Plan
from cpullm.api.spec import CpuLLMServiceSpec, parse_spec
from cpullm.core.manifests import Owner, build_deployment, build_service
from cpullm.core.planner import plan_service
from cpullm.core.sizing import size_model
from cpullm.core.topology import NodeProfile, parse_node
from cpullm.errors import CpuLLMError, InvalidSpec, NodeLabelError
from cpullm.io.hub import DEFAULT_ENDPOINT, HubClient


def _documents(path: str) -> Iterator[dict[str, Any]]:
    """Every object in a YAML/JSON file: several documents, or `kind: List` items (kubectl get -o yaml)."""
    text = sys.stdin.read() if path == "-" else Path(path).read_text()
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        if not isinstance(doc, dict):
            raise InvalidSpec(f"{path}: expected objects, found {type(doc).__name__}")
        if doc.get("kind", "").endswith("List") and "items" in doc:
            yield from doc["items"]
        else:
            yield doc


def load_nodes(path: str) -> list[NodeProfile]:
    profiles = []
    for obj in _documents(path):
        if obj.get("kind") != "Node":
            continue
        try:
            profiles.append(parse_node(obj))
        except NodeLabelError as err:
            print(f"cpullm: warning: {err.message}; node skipped", file=sys.stderr)
    return profiles


def load_service(path: str) -> tuple[Owner, CpuLLMServiceSpec]:
    services = [o for o in _documents(path) if o.get("kind") == "CpuLLMService"]
    if len(services) != 1:
        raise InvalidSpec(f"{path}: expected one CpuLLMService, found {len(services)}")
    meta = services[0].get("metadata") or {}
    owner = Owner(name=meta.get("name", "unnamed"), namespace=meta.get("namespace", "default"), uid=meta.get("uid"))
    return owner, parse_spec(services[0].get("spec"))


def plan_from_files(
    service_path: str, nodes_path: str, model_config: str | None
) -> tuple[Owner, CpuLLMServiceSpec, Plan]:
    owner, spec = load_service(service_path)
    model = spec.model
    total: int | None = None
    if model_config:
        config = json.loads(Path(model_config).read_text())
    elif model.config is not None:
        config = model.config
    else:  # like the operator: the Hub (or $HF_ENDPOINT), with $HF_TOKEN
        hub = HubClient(endpoint=os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT))
        files = hub.fetch(model.name, model.revision, os.environ.get("HF_TOKEN"))
        config, total = files.config, files.checkpoint_total_bytes
    size = size_model(config, model.dtype, weights_bytes=model.weights_bytes, checkpoint_total_bytes=total)
    return owner, spec, plan_service(spec, size, load_nodes(nodes_path))


def _dump(obj: Any, output: str) -> str:
    if output == "json":
        return json.dumps(obj, indent=2) + "\n"
    return yaml.safe_dump(obj, sort_keys=False)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="cpullm", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, help_ in (("plan", "print the plan for a CpuLLMService"), ("render", "print its Deployment and Service")):
        sub = commands.add_parser(name, help=help_)
        sub.add_argument("service", help="CpuLLMService YAML file ('-' for stdin)")
        sub.add_argument("--nodes", required=True, help="nodes YAML, as `kubectl get nodes -o yaml` prints")
        sub.add_argument("--model-config", help="Hugging Face config.json to size the model from")
        sub.add_argument("-o", "--output", choices=("json", "yaml"), default="json" if name == "plan" else "yaml")
    commands.add_parser("crd", help="print the CustomResourceDefinition")
    run = commands.add_parser("run", help="start the operator")
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("-n", "--namespace", action="append", default=[], help="watch only these namespaces")
    scope.add_argument("-A", "--all-namespaces", action="store_true", help="watch every namespace (default)")
    run.add_argument("--peering", help="Kopf peering name (several replicas); default: standalone")
    run.add_argument("--liveness", default=None, help="health endpoint, e.g. http://0.0.0.0:8080/healthz")
    run.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)

    try:
        if args.command == "crd":
            sys.stdout.write(yaml.safe_dump(build_crd(), sort_keys=False))
        elif args.command == "run":
            return _run(args)
        else:
            owner, spec, plan = plan_from_files(args.service, args.nodes, args.model_config)
            if args.command == "plan":
                sys.stdout.write(_dump(plan.model_dump(by_alias=True, mode="json", exclude_none=True), args.output))
            else:
                objects = [build_deployment(owner, spec, plan), build_service(owner, spec)]
                if args.output == "json":
                    sys.stdout.write(
                        json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}, indent=2) + "\n"
                    )
                else:
                    sys.stdout.write(yaml.safe_dump_all(objects, sort_keys=False))
    except CpuLLMError as err:
        print(f"cpullm: {err.reason}: {err.message}", file=sys.stderr)
        return 1
    except (OSError, yaml.YAMLError, json.JSONDecodeError) as err:
        print(f"cpullm: {type(err).__name__}: {err}", file=sys.stderr)
        return 2
    return 0


def _run(args: argparse.Namespace) -> int:
    import logging

    import kopf

    import cpullm.controller.handlers  # noqa: F401  (registers the handlers)

    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if not args.verbose:  # Kopf logs every handler run at INFO; our own lines say what changed
        logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    kopf.run(
        clusterwide=not args.namespace,
        namespaces=args.namespace,
        standalone=args.peering is None,
        peering_name=args.peering,
        liveness_endpoint=args.liveness,
    )
    return 0
