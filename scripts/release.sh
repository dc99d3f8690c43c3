#!/usr/bin/env bash
# Releases cpullm-operator VERSION into REGISTRY: the one release path, run by a maintainer, by the hosted workflow
# (.github/workflows/release.yml, keyless against ghcr.io) and by CI here against a registry on localhost
# (e2e/test_release.py). docs/releasing.md is its guide.
#
#   scripts/release.sh VERSION --registry REGISTRY [--key cosign.key | --keyless | --unsigned] [--base REF]
#                      [--platforms linux/amd64,linux/arm64] [--out DIR] [--plain-http] [--allow-unreleased]
#
# 1. checks that VERSION is the version of pyproject.toml, of the chart (version and appVersion) and the newest
#    heading of CHANGELOG.md (--allow-unreleased: an "Unreleased" heading will do, for a rehearsal);
# 2. builds the operator's image from the Dockerfile for each platform with buildah (its build stage runs natively and
#    installs the target's wheels: nothing is emulated), on BASE (the Dockerfile's default unless --base: a
#    multi-platform image),
#    and pushes the index as REGISTRY/cpullm-operator:VERSION; the index's digest is what everything names;
# 3. writes an SPDX SBOM of each platform's image (syft);
# 4. packages the chart with the image's repository and digest in its values and pushes it as the OCI artifact
#    oci://REGISTRY/charts/cpullm-operator, version VERSION;
# 5. renders install.yaml from that chart (scripts/render-install.sh), so it names the image by digest;
# 6. signs it all by digest with scripts/sign-release.sh (each SBOM as an attestation on its platform's image, the
#    image's index, the chart, install.yaml as a blob): with the key pair's private half (--key, its password in
#    COSIGN_PASSWORD; no transparency log), or keyless (--keyless: the workflow's OIDC identity, recorded in
#    Sigstore's public transparency log); --unsigned leaves that step to a run of sign-release.sh on DIR (the hosted
#    workflow's signing job, the only one its OIDC token is granted to).
# The assets (install.yaml and its bundle, the chart's .tgz, the SBOMs, digests.env, platforms.txt) go to DIR
# (default: dist/VERSION), and the last lines printed are RELEASE_IMAGE=, RELEASE_CHART= and RELEASE_CHART_DIGEST=.
# Needs root or rootless buildah, and Go for cosign, syft and helm (scripts/build-tools.sh builds them once).
# --plain-http: the registry speaks HTTP (a registry on localhost).
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { sed -n '6,7p' "$0" | sed 's/^# *//' >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/release-common.sh"

version=${1:-}; [[ -n $version && $version != -* ]] || usage; shift
registry="" key="" keyless=0 unsigned=0 base="" platforms=linux/amd64,linux/arm64 out="" plain_http=0 allow_unreleased=0
while (($#)); do
  case $1 in
    --registry) registry=$2; shift 2 ;;
    --key) key=$2; shift 2 ;;
    --keyless) keyless=1; shift ;;
    --unsigned) unsigned=1; shift ;;
    --base) base=$2; shift 2 ;;
    --platforms) platforms=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --plain-http) plain_http=1; shift ;;
    --allow-unreleased) allow_unreleased=1; shift ;;
    *) usage ;;
  esac
done
[[ -n $registry ]] || usage
[[ -n $key || $keyless == 1 || $unsigned == 1 ]] ||
  die "sign with --key FILE (a cosign key pair) or --keyless (an OIDC identity), or leave it: --unsigned"
[[ -z $key || -r $key ]] || die "cannot read the signing key $key"
out=${out:-dist/$version}

# 1. One version everywhere.
project=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["project"]["version"])' pyproject.toml)
chart_field() { sed -n "s/^$1: *\"\{0,1\}\([^\"]*\)\"\{0,1\}$/\1/p" charts/cpullm-operator/Chart.yaml; }
[[ $project == "$version" ]] || die "pyproject.toml says $project, not $version"
[[ $(chart_field version) == "$version" && $(chart_field appVersion) == "$version" ]] ||
  die "charts/cpullm-operator/Chart.yaml's version and appVersion must both be $version"
newest=$(sed -n 's/^## \[\{0,1\}\([0-9A-Za-z.+-]*\).*/\1/p' CHANGELOG.md | head -1)
if [[ $newest != "$version" ]] && ! [[ $newest == Unreleased && $allow_unreleased == 1 ]]; then
  die "CHANGELOG.md's newest heading is '$newest': give it '## [$version]' first"
fi

eval "$(scripts/build-tools.sh helm syft | grep _BIN_DIR=)"
helm=$HELM_BIN_DIR/helm syft=$SYFT_BIN_DIR/syft
tls=() helm_http=()
if ((plain_http)); then
  tls=(--tls-verify=false) helm_http=(--plain-http)
  export SYFT_REGISTRY_INSECURE_USE_HTTP=true
fi
work=$(mktemp -d /tmp/cpullm-release-XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
# A store of the release's own (vfs: any filesystem, inside containers too), gone with it: nothing cached between
# releases, nothing left in the maintainer's store.
bah() { buildah --root "$work/store" --runroot "$work/run" --storage-driver vfs "$@"; }

# 2. The image, every platform, one index, on its base pinned by digest: the tag (--base, else the Dockerfile's
# default) is read once, as its index's digest, and every platform builds FROM that digest, which digests.env records
# (RELEASE_BASE): a base retagged during the release, or after it, changes nothing the release names.
image=$registry/cpullm-operator
base=${base:-$(sed -n 's/^ARG BASE=//p' Dockerfile)}
if [[ $base != *@sha256:* ]]; then
  first=${platforms%%,*}
  bah pull --quiet --platform "$first" "${tls[@]}" "docker://$base" >/dev/null
  base_digest=$(bah images --digests --format '{{.Digest}}' "$base" | head -n1)
  [[ $base_digest == sha256:* ]] || die "no digest for the base image $base"
  name=${base##*/}
  [[ $name == *:* ]] && base=${base%:*}  # the tag, not a registry's port
  [[ $base == */* ]] || base=docker.io/library/$base  # a bare Docker Hub name
  base=$base@$base_digest
fi
say "building $image:$version for $platforms on $base"
# One build a platform, each added to the manifest list; the Dockerfile's build stage runs on this machine's platform
# for every target (buildah 1.28 is told both platforms: the Dockerfile's header says why).
build_platform=linux/$(case $(uname -m) in x86_64) echo amd64 ;; aarch64) echo arm64 ;; *) uname -m ;; esac)
for platform in ${platforms//,/ }; do
  bah build --quiet --isolation chroot --network host --layers=false --format oci --platform "$platform" \
    --build-arg "BUILDPLATFORM=$build_platform" --build-arg "TARGETPLATFORM=$platform" \
    --manifest "cpullm-operator:$version" --build-arg "BASE=$base" "${tls[@]}" --file Dockerfile . >/dev/null
done
bah manifest push --quiet --all --format oci "${tls[@]}" --digestfile "$work/image.digest" \
  "cpullm-operator:$version" "docker://$image:$version"
digest=$(cat "$work/image.digest")
say "pushed $image:$version as $digest"

# 3. An SBOM of each platform's image (attached to it when signed: step 6).
# Each platform's manifest as the registry holds it (the push compressed the layers: new digests), read back.
bah manifest create published >/dev/null
bah manifest add --all "${tls[@]}" published "docker://$image@$digest" >/dev/null
index=$(bah manifest inspect published)
python3 -c 'import json, sys
for m in json.load(sys.stdin)["manifests"]:
    print(m["platform"]["architecture"], m["digest"])' <<<"$index" >"$out/platforms.txt"
while read -r arch platform_digest; do
  sbom=$out/sbom-$arch.spdx.json
  quiet "$syft" scan "registry:$image@$platform_digest" -o "spdx-json=$sbom"
  say "SBOM of linux/$arch ($platform_digest): $sbom"
done <"$out/platforms.txt"

# 4. The chart, naming the image by digest.
chart=$work/chart/cpullm-operator
mkdir -p "$work/chart" && cp -r charts/cpullm-operator "$chart"
python3 - "$chart/values.yaml" "$image" "$digest" <<'EOF'
import re, sys
path, repository, digest = sys.argv[1:]
text = open(path).read()
for field, value in (("repository", repository), ("digest", f'"{digest}"')):
    text, count = re.subn(rf"^(image:\n(?:  .*\n|#.*\n)*?  {field}:) .*$", rf"\g<1> {value}", text, count=1, flags=re.M)
    assert count == 1, f"no image.{field} in {path}"
open(path, "w").write(text)
EOF
"$helm" package "$chart" --destination "$out" >/dev/null
package=$out/cpullm-operator-$version.tgz
chart_digest=$("$helm" push "$package" "oci://$registry/charts" "${helm_http[@]}" 2>&1 | sed -n 's/^Digest: //p')
[[ $chart_digest == sha256:* ]] || die "helm push of $package printed no digest"
say "pushed oci://$registry/charts/cpullm-operator:$version as $chart_digest"

# 5. install.yaml from that chart.
scripts/render-install.sh "$chart" "$out/install.yaml"

printf 'RELEASE_IMAGE=%s\nRELEASE_CHART=%s\nRELEASE_CHART_DIGEST=%s\nRELEASE_BASE=%s\n' \
  "$image@$digest" "oci://$registry/charts/cpullm-operator" "$chart_digest" "$base" >"$out/digests.env"

# 6. Signatures by digest.
if ((unsigned)); then
  say "not signed (--unsigned): scripts/sign-release.sh $out signs it"
else
  signing=()
  if [[ -n $key ]]; then signing+=(--key "$key"); else signing+=(--keyless); fi
  if ((plain_http)); then signing+=(--plain-http); fi
  scripts/sign-release.sh "$out" "${signing[@]}"
fi
cat "$out/digests.env"
