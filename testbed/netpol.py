"""A TEST-ONLY NetworkPolicy enforcer for the kind clusters (testbed/kind_cluster.py): kube-router's network-policy
firewall, and nothing else of kube-router (no routing, no service proxy, no CNI config), beside kind's CNI (our
kindnetd stand-in, testbed/kindnet.py, which enforces no policy) and kube-proxy. Without an enforcer the
NetworkPolicies the operator renders (spec.networkPolicy) are stored but never applied, so a test cannot tell a
policy that admits the router from one that admits everyone.

Why kube-router: kind's own enforcer, kube-network-policies (sigs.k8s.io/kube-network-policies, served by the module
proxy here), judges packets in user space through nftables' queue (NFQUEUE), and this kernel is built without
CONFIG_NFT_QUEUE; kube-router's firewall needs only iptables and ipset (xt_set, the ip_set hash types, conntrack,
comment, mark, addrtype, multiport, physdev, NFLOG, REJECT), all built in here. v2.1.0 is the only version the module
proxy serves; its reported security flaws concern its BGP, proxy and CNI parts or a production deployment, not a
firewall in a throw-away test cluster.

How it works, from its source (github.com/cloudnativelabs/kube-router/v2@v2.1.0, pkg/controllers/netpol): it jumps
from the filter table's INPUT, FORWARD and OUTPUT (inserted at position 1) to KUBE-ROUTER-* chains, gives every pod
of its node (pod.status.hostIP equal to the node's InternalIP; no podCIDR needed) a KUBE-POD-FW-* chain, and fills
ipsets with the selected pods' addresses. It syncs on every pod, namespace and policy event, asynchronously: a
pod is open until its chain exists, so a test that expects a refusal has to wait for it (eventually), not assume
it at the pod's readiness. A policy's peers are matched by pod address, so traffic between nodes must keep its
source address: kindnetd's CNI config has `"ipMasq": false` and masquerades only outside the cluster's pod CIDR,
whereas ptp's ipMasq (testbed/kindnet.py sets it) masquerades everything leaving the node's own pod CIDR, which
turns a peer pod on another node into its node's address.

The binary comes from scripts/build-tools.sh (`kube-router`), its image from testbed/images.py (build_kube_router:
Debian's iptables, set to the nft backend kind's nodes use here, and ipset).
"""

from __future__ import annotations

from typing import Any

NAME = "kube-router"
NAMESPACE = "kube-system"
LABELS = {"k8s-app": NAME}
# kind's default service subnet (sigs.k8s.io/kind pkg/apis/config/v1alpha4/default.go); kube-router's default is
# 10.96.0.0/12. It only exempts traffic to Service addresses in KUBE-ROUTER-INPUT.
KIND_SERVICE_CIDR = "10.96.0.0/16"
HEALTH_PORT = 20244  # kube-router's default (pkg/options/options.go), served on every address of the node


def args(service_cidr: str = KIND_SERVICE_CIDR, sync_period: str = "1m") -> list[str]:
    """kube-router's flags (pkg/options/options.go) for its firewall alone (router and service proxy default to on).
    In-cluster config: neither --kubeconfig nor --master (pkg/cmd/kube-router.go NewKubeRouterDefault); the node is
    found by NODE_NAME (pkg/utils/node.go GetNodeObject), so no --hostname-override. IPv4 only, the defaults
    (--enable-ipv4, no --enable-ipv6): the kind clusters here are single-stack. Metrics stay off (--metrics-port
    defaults to 0). `sync_period`: the periodic full sync (default 5m) behind the event-driven ones."""
    return [
        "--run-firewall=true",
        "--run-router=false",
        "--run-service-proxy=false",
        "--run-loadbalancer=false",
        f"--service-cluster-ip-range={service_cidr}",
        f"--iptables-sync-period={sync_period}",
        f"--health-port={HEALTH_PORT}",
    ]


def rbac_rules() -> list[dict[str, Any]]:
    """What it reads. Its informer factory starts the informers of pods, namespaces, nodes, services, endpoints,
    endpointslices and networkpolicies whichever controllers run (pkg/cmd/kube-router.go Run), and waits for every
    one to sync (CacheSyncOrTimeout, --cache-sync-timeout 1m): one it may not list and watch stops it. The firewall
    itself gets its node (pkg/utils/node.go GetNodeObject) and reads pods, namespaces and policies from the caches.
    It writes nothing to the API (no events, no leases: those are the load balancer allocator's)."""
    return [
        {"apiGroups": [""], "resources": ["pods", "namespaces", "services", "endpoints"], "verbs": ["list", "watch"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
        {"apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"], "verbs": ["list", "watch"]},
        {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": ["list", "watch"]},
    ]


def manifests(
    image: str,
    service_cidr: str = KIND_SERVICE_CIDR,
    sync_period: str = "1m",
    requests: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The ServiceAccount, ClusterRole, ClusterRoleBinding and DaemonSet (kube-system) that run kube-router's
    firewall on every real node of a kind cluster, from `image` (testbed/images.py build_kube_router: loaded into
    the nodes or in a registry they pull from). `requests`: its resource requests (default 25m CPU and 50Mi, to fit
    beside a server's whole CPU and kindnet's 100m on a 2-CPU host's worker; {}: none, so a plan made before it
    came does not change)."""
    metadata = {"name": NAME, "namespace": NAMESPACE, "labels": LABELS}
    host_path = {"name": "lib-modules", "hostPath": {"path": "/lib/modules"}}
    xtables_lock = {"name": "xtables-lock", "hostPath": {"path": "/run/xtables.lock", "type": "FileOrCreate"}}
    container = {
        "name": NAME,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "args": args(service_cidr, sync_period),
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        # Not privileged: a privileged container asks for every capability, and this sandbox's bounding set lacks
        # CAP_SYS_RESOURCE (kind's nodes start only through the test-only runc wrapper, testbed/kind_cluster.py).
        # iptables and ipset need NET_ADMIN (netlink), iptables-legacy also NET_RAW; root, because kube-router
        # refuses to start otherwise (cmd/kube-router/kube-router.go). The ip_set and xt modules are built into this
        # kernel: no SYS_MODULE; /lib/modules is mounted for a kernel that would load them.
        "securityContext": {
            "runAsUser": 0,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN", "NET_RAW"]},
        },
        "resources": {"requests": {"cpu": "25m", "memory": "50Mi"} if requests is None else requests},
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": HEALTH_PORT},
            "initialDelaySeconds": 10,
            "periodSeconds": 10,
        },
        "volumeMounts": [
            {"name": "lib-modules", "mountPath": "/lib/modules", "readOnly": True},
            # The lock iptables-legacy and kube-proxy share; the nft backend does not take it, but a node that
            # detected legacy would.
            {"name": "xtables-lock", "mountPath": "/run/xtables.lock"},
        ],
    }
    # Off KWOK's fake nodes (labelled type=kwok, as testbed/kind_up.py keeps kindnet off them): they have no
    # network, and the kwok controller would fake the pod's status.
    off_fake_nodes = {"key": "type", "operator": "NotIn", "values": ["kwok"]}
    pod_spec = {
        "serviceAccountName": NAME,
        "hostNetwork": True,  # its rules go into the node's own network namespace
        "dnsPolicy": "ClusterFirstWithHostNet",
        "priorityClassName": "system-node-critical",
        "containers": [container],
        "volumes": [host_path, xtables_lock],
        "tolerations": [{"operator": "Exists", "effect": "NoSchedule"}, {"operator": "Exists", "effect": "NoExecute"}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [{"matchExpressions": [off_fake_nodes]}]
                }
            }
        },
    }
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": metadata},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": NAME, "labels": LABELS},
            "rules": rbac_rules(),
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": NAME, "labels": LABELS},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
            "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}],
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": metadata,
            "spec": {
                "selector": {"matchLabels": LABELS},
                "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
                "template": {"metadata": {"labels": LABELS}, "spec": pod_spec},
            },
        },
    ]
