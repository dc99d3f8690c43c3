#!/usr/bin/env bash
# Signs a release scripts/release.sh published, from the assets it wrote to DIR: the last step of the one release
# path, apart so that only this step holds the signing identity (the hosted workflow grants its OIDC token to the
# job that runs this script alone; building runs pip, Go and syft on third-party code). docs/releasing.md is its guide.
#
#   scripts/sign-release.sh DIR [--key cosign.key | --keyless] [--plain-http]
#
# DIR holds what release.sh wrote: digests.env (the image index and the chart, by digest), platforms.txt (each
# platform's architecture and image digest), the SBOMs (sbom-ARCH.spdx.json) and install.yaml. It
# 1. attaches each platform's SBOM to that platform's image as a signed attestation;
# 2. signs the image's index and the chart by digest;
# 3. signs install.yaml as a blob, its bundle install.yaml.sigstore.json beside it in DIR.
# --key: the key pair's private half (its password in COSIGN_PASSWORD; no transparency log); --keyless: the OIDC
# identity of the environment (recorded in Sigstore's public transparency log). --plain-http: the registry speaks
# HTTP (a registry on localhost). Needs Go for cosign (scripts/build-tools.sh builds it once).

set -euo pipefail
usage() { sed -n '6p' "$0" | sed 's/^# *//' >&2; exit 2; }
source "$(dirname "${BASH_SOURCE[0]}")/release-common.sh"

dir=${1:-}; [[ -n $dir && $dir != -* ]] || usage; shift
key="" keyless=0 plain_http=0
while (($#)); do
  case $1 in
    --key) key=$2; shift 2 ;;
    --keyless) keyless=1; shift ;;
    --plain-http) plain_http=1; shift ;;
    *) usage ;;
  esac
done
[[ -n $key || $keyless == 1 ]] || die "sign with --key FILE (a cosign key pair) or --keyless (an OIDC identity)"
[[ -z $key || -r $key ]] || die "cannot read the signing key $key"
[[ -d $dir ]] || die "no directory $dir"
dir=$(cd "$dir" && pwd) key=${key:+$(realpath "$key")}
cd "$(dirname "$0")/.."
for asset in digests.env platforms.txt install.yaml; do
  [[ -r $dir/$asset ]] || die "$dir/$asset is missing: sign what scripts/release.sh --unsigned wrote"
done
image=$(sed -n 's/^RELEASE_IMAGE=//p' "$dir/digests.env")
chart=$(sed -n 's/^RELEASE_CHART=oci:\/\///p' "$dir/digests.env")
chart_digest=$(sed -n 's/^RELEASE_CHART_DIGEST=//p' "$dir/digests.env")
[[ $image == *@sha256:* && -n $chart && $chart_digest == sha256:* ]] || die "$dir/digests.env names no digests"

eval "$(scripts/build-tools.sh cosign | grep _BIN_DIR=)"
cosign=$COSIGN_BIN_DIR/cosign
args=()
if ((plain_http)); then args+=(--allow-http-registry --allow-insecure-registry); fi
if [[ -n $key ]]; then args+=(--key "$key" --use-signing-config=false --tlog-upload=false); fi

# 1. Each platform's SBOM, attached to its image.
while read -r arch platform_digest; do
  sbom=$dir/sbom-$arch.spdx.json
  [[ -r $sbom ]] || die "no SBOM for linux/$arch: $sbom"
  quiet "$cosign" attest --yes "${args[@]}" --type spdxjson --predicate "$sbom" "${image%@*}@$platform_digest"
  say "attested $sbom to ${image%@*}@$platform_digest"
done <"$dir/platforms.txt"

# 2. The image index and the chart, by digest.
for ref in "$image" "$chart@$chart_digest"; do
  quiet "$cosign" sign --yes "${args[@]}" "$ref"
  say "signed $ref"
done

# 3. install.yaml, as a blob (--allow-http-registry and the like are for registries: not passed).
blob_args=(--bundle "$dir/install.yaml.sigstore.json")
if [[ -n $key ]]; then blob_args+=(--key "$key" --use-signing-config=false --tlog-upload=false); fi
quiet "$cosign" sign-blob --yes "${blob_args[@]}" "$dir/install.yaml"
say "signed $dir/install.yaml: $dir/install.yaml.sigstore.json"
