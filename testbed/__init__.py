"""The test bed: what the e2e suites, the real-vLLM tests and the benchmarks run on, built here from the Go module
proxy, PyPI and Debian's packages (no registry, no internet): a local control plane (cluster.py), container images
(images.py), a real kubelet node (realnode.py), kind's images and clusters (kind_images.py, kind_cluster.py,
kind_up.py, kindnet.py), a local registry (registry.py), this machine as a Node (machine.py), a cuttable TCP relay
(proxy.py), and the tools they share (tools.py). It imports nothing of the tests that use it."""
