// Writes the seccomp profile of cpullm-operator's vLLM servers where Pod Security refuses SYS_NICE (baseline,
// restricted): containerd's default profile for a container with every capability dropped, plus vLLM's NUMA calls
// (get_mempolicy, set_mempolicy, mbind, migrate_pages, move_pages), which that profile allows only with SYS_NICE or
// never, and which the kernel allows on the caller's own memory without it. The profile is containerd's own (its
// contrib/seccomp package, the version in go.mod), for the architecture this program is built for: the file is the
// OCI runtime spec's LinuxSeccomp, what containerd reads for a Localhost profile. scripts/numa-seccomp.sh runs it.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/containerd/containerd/v2/contrib/seccomp"
	"github.com/opencontainers/runtime-spec/specs-go"
)

// numaCalls are the system calls vLLM's CPU worker and its NUMA binding make (libnuma: numa_set_membind,
// numa_alloc_onnode, numa_migrate_pages, numa_move_pages).
var numaCalls = []string{"get_mempolicy", "mbind", "migrate_pages", "move_pages", "set_mempolicy"}

func main() {
	noCapabilities := &specs.Spec{Process: &specs.Process{Capabilities: &specs.LinuxCapabilities{}}}
	profile := seccomp.DefaultProfile(noCapabilities)
	profile.Syscalls = append(profile.Syscalls, specs.LinuxSyscall{Names: numaCalls, Action: specs.ActAllow})
	out := json.NewEncoder(os.Stdout)
	out.SetIndent("", " ")
	if err := out.Encode(profile); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
