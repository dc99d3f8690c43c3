"""The kind path's kindnetd stand-in (testbed/kindnet.py): which CNI config and routes a node gets from the nodes."""

import json
from typing import Any

import pytest
from testbed.kindnet import NodeNetwork, masquerade_rule, network_for, on_link_networks, route_changes


def node(name: str, addresses: list[str], cidrs: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {"podCIDRs": cidrs, "podCIDR": cidrs[0]} if cidrs else {}
    statuses = [{"type": "Hostname", "address": name}] + [{"type": "InternalIP", "address": a} for a in addresses]
    return {"metadata": {"name": name}, "spec": spec, "status": {"addresses": statuses}}


CONTROL_PLANE = node("cp", ["172.18.0.2"], ["10.244.0.0/24"])
WORKER = node("w1", ["172.18.0.3"], ["10.244.1.0/24"])
DUAL = node("w2", ["172.18.0.4", "fc00:f853:ccd:e793::4"], ["10.244.2.0/24", "fd00:10:244:2::/64"])
NO_CIDR_YET = node("w3", ["172.18.0.5"], [])
KWOK = node("fake-1", ["10.244.1.7"], ["10.244.9.0/24"])  # KWOK's fake node: its address is on no host network
IP_ADDR = """\
1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever
1: lo    inet6 ::1/128 scope host \\       valid_lft forever preferred_lft forever
12: eth0    inet 172.18.0.3/16 brd 172.18.255.255 scope global eth0\\       valid_lft forever preferred_lft forever
12: eth0    inet6 fc00:f853:ccd:e793::3/64 scope global nodad \\       valid_lft forever preferred_lft forever
12: eth0    inet6 fe80::42:acff:fe12:3/64 scope link \\       valid_lft forever preferred_lft forever
"""
ON_LINK = on_link_networks(IP_ADDR)


def test_the_hosts_networks_are_read_from_ip_addr():
    assert [str(n) for n in ON_LINK] == [
        "127.0.0.0/8",
        "::1/128",
        "172.18.0.0/16",
        "fc00:f853:ccd:e793::/64",
        "fe80::/64",
    ]


@pytest.mark.parametrize(
    ("name", "nodes", "subnets", "routes"),
    [
        ("w1", [CONTROL_PLANE, WORKER], ["10.244.1.0/24"], {"10.244.0.0/24": "172.18.0.2"}),
        (
            "cp",
            [CONTROL_PLANE, WORKER, DUAL],
            ["10.244.0.0/24"],
            {
                "10.244.1.0/24": "172.18.0.3",
                "10.244.2.0/24": "172.18.0.4",
                "fd00:10:244:2::/64": "fc00:f853:ccd:e793::4",
            },
        ),
        ("w2", [CONTROL_PLANE, DUAL], ["10.244.2.0/24", "fd00:10:244:2::/64"], {"10.244.0.0/24": "172.18.0.2"}),
        # a node with no pod CIDR yet gets no route; it is routed to once it has one
        ("w1", [WORKER, NO_CIDR_YET], ["10.244.1.0/24"], {}),
        ("w1", [CONTROL_PLANE, WORKER, KWOK], ["10.244.1.0/24"], {"10.244.0.0/24": "172.18.0.2"}),
    ],
    ids=["worker", "dual-stack peer", "dual-stack self", "peer without a CIDR", "KWOK node"],
)
def test_a_node_gets_ptp_over_its_pod_cidrs_and_a_route_to_each_peers_cidr_via_its_address(
    name: str, nodes: list[dict[str, Any]], subnets: list[str], routes: dict[str, str]
):
    network = network_for(name, nodes, ON_LINK)
    assert network is not None
    assert network.routes == routes
    ptp, portmap = json.loads(network.cni_config)["plugins"]
    assert (ptp["type"], ptp["ipMasq"], portmap["type"]) == ("ptp", False, "portmap")  # masquerade_rule instead
    assert [r[0]["subnet"] for r in ptp["ipam"]["ranges"]] == subnets
    families = {"0.0.0.0/0" if "." in s else "::/0" for s in subnets}
    assert {r["dst"] for r in ptp["ipam"]["routes"]} == families


@pytest.mark.parametrize(
    "nodes", [[CONTROL_PLANE], [CONTROL_PLANE, NO_CIDR_YET]], ids=["node not listed yet", "no pod CIDR yet"]
)
def test_nothing_is_written_until_this_node_has_a_pod_cidr(nodes: list[dict[str, Any]]):
    assert network_for("w3", nodes, ON_LINK) is None


@pytest.mark.parametrize(
    ("before", "after", "replaced", "dropped"),
    [
        (None, {"a": "1", "b": "2"}, {"a": "1", "b": "2"}, []),
        ({"a": "1", "b": "2"}, {"a": "1", "b": "2"}, {}, []),
        ({"a": "1"}, {"a": "3", "b": "2"}, {"a": "3", "b": "2"}, []),
        ({"a": "1", "b": "2", "c": "4"}, {"a": "1"}, {}, ["b", "c"]),
    ],
    ids=["first", "unchanged", "moved and added", "nodes gone"],
)
def test_only_changed_routes_are_replaced_and_gone_ones_dropped(before, after, replaced, dropped):
    applied = None if before is None else NodeNetwork("{}", before)
    assert route_changes(NodeNetwork("{}", after), applied) == (replaced, dropped)


def test_pods_are_masqueraded_only_out_of_the_pod_network():
    """Between pods (another node's included) addresses are kept, so NetworkPolicies see the real source."""
    rule = masquerade_rule("10.244.0.0/16")
    assert rule[:4] == ["-s", "10.244.0.0/16", "!", "-d"] and rule[4] == "10.244.0.0/16"
    assert rule[-2:] == ["-j", "MASQUERADE"] and rule[7:10] == ["!", "--dst-type", "LOCAL"]
