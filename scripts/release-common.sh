# Sourced by scripts/release.sh and scripts/sign-release.sh: how they report and fail, named after the script run.
die() { echo "${0##*/}: $*" >&2; exit 1; }
say() { echo "${0##*/} [$((SECONDS / 60))m$((SECONDS % 60))s] $*" >&2; }
quiet() { # CMD...: runs it with its output kept, shown only if it fails
  local output
  output=$("$@" 2>&1) || { echo "$output" >&2; die "failed: ${*:1:2} ..."; }
}
