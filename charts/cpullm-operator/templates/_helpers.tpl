{{- define "cpullm.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "cpullm.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "cpullm.labels" -}}
{{ include "cpullm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{/* The operator's image: by digest when image.digest is set (the tag is then ignored), else by tag. The chart's
default repository names an image no registry serves (no release is published), so an install naming it fails here
with the fix, rather than at pull time; a local build loaded into every node says so with pullPolicy Never. */}}
{{- define "cpullm.image" -}}
{{- $repository := .Values.image.repository | trimPrefix "docker.io/" | trimPrefix "library/" -}}
{{- if and (eq $repository "cpullm-operator") (ne .Values.image.pullPolicy "Never") -}}
{{- fail (printf "image.repository is %q, and no image of that name is published (no release exists): build the operator's image (docker build -t REGISTRY/cpullm-operator:%s .), push it where the nodes pull from and set image.repository=REGISTRY/cpullm-operator; or load a local build into every node (kind load docker-image cpullm-operator:%s) and set image.pullPolicy=Never" .Values.image.repository .Chart.AppVersion .Chart.AppVersion) -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "cpullm.serviceAccountName" -}}
{{- default (include "cpullm.fullname" .) .Values.serviceAccount.name -}}
{{- end -}}

{{/* The rules the operator needs in every namespace it serves (see the chart README for why each exists). */}}
{{- define "cpullm.namespacedRules" -}}
- apiGroups: [cpullm.io]
  resources: [cpullmservices]
  verbs: [list, watch]
- apiGroups: [cpullm.io]
  resources: [cpullmservices/status]
  verbs: [patch]
# CpuLLMGateways: watched, their status written (controller/gateway.py).
- apiGroups: [cpullm.io]
  resources: [cpullmgateways]
  verbs: [list, watch]
- apiGroups: [cpullm.io]
  resources: [cpullmgateways/status]
  verbs: [patch]
# Children carry blockOwnerDeletion: where OwnerReferencesPermissionEnforcement runs (OpenShift), setting it needs
# update on the owner's finalizers.
- apiGroups: [cpullm.io]
  resources: [cpullmservices/finalizers, cpullmgateways/finalizers]
  verbs: [update]
# DaemonSets, read only: a whole-node plan leaves their pods' requests free on each node they run on.
- apiGroups: [apps]
  resources: [daemonsets]
  verbs: [list, watch]
# The server pods, read only: a pod the scheduler cannot place puts its message in the Ready condition. Their
# ReplicaSets, read only: a pod counts for a service only where its ReplicaSet is the service's Deployment's.
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch]
- apiGroups: [apps]
  resources: [replicasets]
  verbs: [list, watch]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
- apiGroups: [""]
  resources: [secrets]
  verbs: [get]
# The owned kinds (files/owned-kinds.json: core/children's CHILD_KINDS, by `cpullm chart-kinds`). get: a child is
# read before its first apply and before a delete, so one the service does not control is left untouched; delete:
# what the plan stops asking for (the router's children, an autoscaler); list: every CPULLM_RESYNC_SECONDS (metadata
# only), to re-apply what another writer changed or deleted; watch: the children every service has. A sizing Job is
# made once and removed by Kubernetes: get, create and patch only.
{{- range (.Files.Get "files/owned-kinds.json" | fromJson).kinds }}
- apiGroups: [{{ .group | quote }}]
  resources: [{{ .resource }}]
  verbs: {{ toJson .verbs }}
{{- end }}
{{- end -}}

{{/* The NUMA seccomp profile's path under the kubelet's seccomp root (numaSeccomp): where the DaemonSet writes it,
and what the operator names in its servers' Localhost profile (CPULLM_NUMA_SECCOMP_PROFILE). */}}
{{- define "cpullm.numaSeccompProfile" -}}
cpullm/numa.json
{{- end -}}

{{/* The vLLM version whose published image the operator renders where none is named (core/constants.py,
VLLM_VERSION; tests/unit/test_version.py keeps the two equal). */}}
{{- define "cpullm.vllmVersion" -}}v0.32.0{{- end -}}

{{/* The vLLM image of a probe's node (root: the chart's context, node: a probe.nodes entry): its own image, else the
chart's vllm.images for its arch, else vLLM's published image of the operator's vLLM version, as the servers run. */}}
{{- define "cpullm.probeImage" -}}
{{- $arch := .node.arch | default "amd64" -}}
{{- $published := printf "docker.io/vllm/vllm-openai-cpu:%s-%s" (include "cpullm.vllmVersion" .root) (get (dict "amd64" "x86_64" "arm64" "arm64") $arch) -}}
{{- .node.image | default (get .root.Values.vllm.images $arch) | default $published -}}
{{- end -}}

{{/* A container securityContext that Pod Security's restricted level admits. */}}
{{- define "cpullm.restrictedContainer" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities: {drop: [ALL]}
{{- end -}}

{{/* The router's image where a spec names none: the chart's router.image, else the operator's default
(core/constants.py, DEFAULT_ROUTER_IMAGE; tests/unit/test_version.py keeps the two equal). */}}
{{- define "cpullm.routerImage" -}}
{{- .Values.router.image | default "docker.io/library/haproxy:3.2" -}}
{{- end -}}

{{/* CEL: an image reference (the CEL expression given) as Docker reads it, so a short name and its full spelling
compare alike: a first component that is no registry host (no '.' or ':', not localhost) is Docker Hub's
(vllm/cpu:1 is docker.io/vllm/cpu:1), a name of one component is in its library (haproxy is
docker.io/library/haproxy), and index.docker.io is docker.io. */}}
{{- define "cpullm.cel.normalImage" -}}
{{- $x := printf "(%s)" . -}}
{{- $first := printf "%s.split('/')[0]" $x -}}
{{- $hub := printf "'docker.io/' + (%s.split('/').size() == 2 && %s.split('/')[1] != '' ? 'library/' : '') + %s.substring(%s.indexOf('/') + 1)" $x $x $x $x -}}
(!{{ $x }}.contains('/') ? 'docker.io/library/' + {{ $x }}
  : {{ $first }} in ['docker.io', 'index.docker.io'] ? {{ $hub }}
  : {{ $first }}.contains('.') || {{ $first }}.contains(':') || {{ $first }} == 'localhost' ? {{ $x }}
  : 'docker.io/' + {{ $x }})
{{- end -}}

{{/* CEL: an allowlist prefix as Docker reads a reference, where one without '/' that names a registry host (a '.'
or ':' in it, or localhost or docker.io) is that whole registry: registry.corp stays, haproxy is
docker.io/library/haproxy, vllm/ is docker.io/vllm/. */}}
{{- define "cpullm.cel.normalPrefix" -}}
{{- $x := printf "(%s)" . -}}
(!{{ $x }}.contains('/') && ({{ $x }}.contains('.') || {{ $x }}.contains(':') || {{ $x }} in ['localhost', 'docker.io'])
  ? {{ $x }} : {{ $x }} == 'index.docker.io' ? 'docker.io' : {{ include "cpullm.cel.normalImage" . }})
{{- end -}}

{{/* CEL: whether image `i` (normalised) is prefix `p` (normalised) or continues it at a boundary: the prefix ends in
'/', ':' or '@', or the image goes on with '/' or '@', or with ':' (a tag) after a prefix that names a repository. */}}
{{- define "cpullm.cel.underPrefix" -}}
{{- $i := index . 0 -}}{{- $p := index . 1 -}}
({{ $i }} == {{ $p }}
  || ({{ $i }}.startsWith({{ $p }}) && ({{ $p }}.endsWith('/') || {{ $p }}.endsWith(':') || {{ $p }}.endsWith('@')))
  || ['/', '@'].exists(d, {{ $i }}.startsWith({{ $p }} + d))
  || ({{ $p }}.contains('/') && {{ $i }}.startsWith({{ $p }} + ':')))
{{- end -}}
