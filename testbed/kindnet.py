"""A stand-in for kind's kindnetd, built here because its source (github.com/aojea/kindnet) is refused by the Go
module proxy on our machines (403). It runs in kind's own default CNI manifest (the kindnet DaemonSet, hostNetwork,
NET_ADMIN), under the image reference kind's node-image builder expects (testbed/kind_images.py), and does the part of
kindnetd a kind cluster needs: this node's CNI config (ptp + host-local for its pod CIDRs, portmap), a route to every
other node's pod CIDRs via that node's address, and kindnetd's masquerade of what pods send out of the cluster's pod
network (POD_SUBNET), never of what they send each other: a NetworkPolicy sees a pod on another node by its own
address (testbed/netpol.py enforces them). Not kindnetd's network policies, NAT64, DNS
cache or NRI plugin. TEST-ONLY: real clusters use kindnetd or their own CNI.

It polls the API server for nodes (stdlib only: it runs with the kind base image's Debian python3), so a node
that joins later is routed to within POLL_SECONDS.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CNI_CONFIG = Path("/etc/cni/net.d/10-kindnet.conflist")
SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
POLL_SECONDS = 5
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class NodeNetwork:
    """What this node needs: its CNI config and a route (destination CIDR -> next hop) per other node's pod CIDR."""

    cni_config: str
    routes: dict[str, str]


def _addresses(node: dict[str, Any]) -> list[str]:
    return [a["address"] for a in node.get("status", {}).get("addresses", []) if a["type"] == "InternalIP"]


def _pod_cidrs(node: dict[str, Any]) -> list[str]:
    spec = node.get("spec", {})
    return list(spec.get("podCIDRs") or ([spec["podCIDR"]] if spec.get("podCIDR") else []))


def _family(address: str) -> int:
    return 6 if ":" in address else 4


def cni_config(pod_cidrs: list[str]) -> str:
    """ptp + host-local over this node's pod CIDRs (one range per family), then portmap, as kindnetd writes."""
    ranges = [[{"subnet": cidr}] for cidr in pod_cidrs]
    defaults = sorted({"::/0" if _family(cidr) == 6 else "0.0.0.0/0" for cidr in pod_cidrs})
    plugins = [
        {
            "type": "ptp",
            "ipMasq": False,  # ptp's would hide a pod behind its node from pods on other nodes: masquerade_rule
            "ipam": {"type": "host-local", "ranges": ranges, "routes": [{"dst": d} for d in defaults]},
        },
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ]
    return json.dumps({"cniVersion": "0.4.0", "name": "kindnet", "plugins": plugins}, indent=1)


def masquerade_rule(pod_subnet: str) -> list[str]:
    """The nat POSTROUTING rule (iptables arguments after the chain) kindnetd's masquerade agent keeps: a pod's
    packet to outside the cluster's pod network and not to this node leaves with the node's address."""
    return [
        *("-s", pod_subnet, "!", "-d", pod_subnet, "-m", "addrtype", "!", "--dst-type", "LOCAL"),
        *("-m", "comment", "--comment", "kindnet stand-in: pods to outside the pod network", "-j", "MASQUERADE"),
    ]


def ensure_masquerade(pod_subnets: str) -> None:
    """The masquerade rule of each IPv4 pod subnet (kind's POD_SUBNET: comma-separated), added once."""
    for subnet in (s for s in pod_subnets.split(",") if s and _family(s) == 4):
        rule = ["POSTROUTING", *masquerade_rule(subnet)]
        if subprocess.run(["iptables", "-t", "nat", "-C", *rule], capture_output=True).returncode != 0:
            subprocess.run(["iptables", "-t", "nat", "-A", *rule], check=True)


def on_link_networks(ip_addr: str) -> list[IPNetwork]:
    """The networks this host's interfaces are on, from `ip -o addr show` (a route's next hop must be on one)."""
    found = []
    for line in ip_addr.splitlines():
        words = line.split()
        for family in ("inet", "inet6"):
            if family in words[:-1]:
                found.append(ipaddress.ip_interface(words[words.index(family) + 1]).network)
    return found


def network_for(node_name: str, nodes: list[dict[str, Any]], on_link: list[IPNetwork]) -> NodeNetwork | None:
    """This node's network, from the API's nodes; None until this node has a pod CIDR. A peer is routed to via its
    first address on one of this host's networks; one with none (KWOK's fake nodes) is left out."""
    mine = next((n for n in nodes if n["metadata"]["name"] == node_name), None)
    if mine is None or not _pod_cidrs(mine):
        return None
    routes = {}
    for node in nodes:
        if node is mine:
            continue
        for cidr in _pod_cidrs(node):
            hops = [a for a in _addresses(node) if any(ipaddress.ip_address(a) in net for net in on_link)]
            hops = [a for a in hops if _family(a) == _family(cidr)]
            if hops:
                routes[cidr] = hops[0]
    return NodeNetwork(cni_config(_pod_cidrs(mine)), routes)


def list_nodes(endpoint: str) -> list[dict[str, Any]]:
    token = (SERVICE_ACCOUNT / "token").read_text().strip()
    request = urllib.request.Request(f"https://{endpoint}/api/v1/nodes", headers={"Authorization": f"Bearer {token}"})
    context = ssl.create_default_context(cafile=str(SERVICE_ACCOUNT / "ca.crt"))
    with urllib.request.urlopen(request, context=context, timeout=10) as response:
        items: list[dict[str, Any]] = json.load(response)["items"]
        return items


def route_changes(network: NodeNetwork, applied: NodeNetwork | None) -> tuple[dict[str, str], list[str]]:
    """The routes to (re)place and the destinations to drop, to go from `applied` (None: unknown) to `network`."""
    before = applied.routes if applied else {}
    replaced = {cidr: hop for cidr, hop in network.routes.items() if before.get(cidr) != hop}
    return replaced, sorted(set(before) - set(network.routes))


def apply(network: NodeNetwork, applied: NodeNetwork | None) -> None:
    """Writes the CNI config (atomically: the kubelet may read it at any time) and the routes that changed."""
    if applied is None or applied.cni_config != network.cni_config:
        staged = CNI_CONFIG.with_suffix(".tmp")
        staged.write_text(network.cni_config)
        staged.replace(CNI_CONFIG)
    replaced, dropped = route_changes(network, applied)
    for cidr, hop in replaced.items():
        subprocess.run(["ip", "route", "replace", cidr, "via", hop], check=True)
    for cidr in dropped:  # already gone is fine
        subprocess.run(["ip", "route", "del", cidr], check=False)


def main() -> int:
    """kind's manifest gives CONTROL_PLANE_ENDPOINT (patched in by `kind create cluster`); a hostNetwork pod's
    hostname is its node's name, which kind's nodes are named after."""
    node_name = socket.gethostname()
    ip_addr = subprocess.run(["ip", "-o", "addr", "show"], check=True, capture_output=True, text=True).stdout
    on_link = on_link_networks(ip_addr)
    default_endpoint = f"{os.environ.get('KUBERNETES_SERVICE_HOST')}:{os.environ.get('KUBERNETES_SERVICE_PORT')}"
    endpoint = os.environ.get("CONTROL_PLANE_ENDPOINT", default_endpoint)
    applied: NodeNetwork | None = None
    ensure_masquerade(os.environ.get("POD_SUBNET", ""))
    while True:
        try:
            network = network_for(node_name, list_nodes(endpoint), on_link)
            if network is not None and network != applied:
                apply(network, applied)
                print(f"kindnet: {node_name}: routes {network.routes}", flush=True)
                applied = network
        except (OSError, subprocess.CalledProcessError, ValueError, KeyError) as error:
            print(f"kindnet: {error!r}", file=sys.stderr, flush=True)
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(main())
