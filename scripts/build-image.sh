#!/usr/bin/env bash
# Builds the divvy container image: a release build of the binary, then the
# Containerfile at the repository root (FROM scratch) over a staged root
# filesystem holding only what the binary needs to run.
#
#   scripts/build-image.sh [--save PATH] [TAG]
#
# Tags divvy:<version in Cargo.toml> and divvy:latest. TAG adds one more
# tag: a bare word is a tag of divvy (`ci` -> divvy:ci); a name with a `:`
# or a `/` is used as it is (registry.example.com/team/divvy:0.1.0, ready
# for `podman push`). --save PATH also writes the image to PATH as an OCI
# archive, to load elsewhere with `podman load -i PATH`.
#
# The image holds: /usr/local/bin/divvy (and /bin/ratelimit, a link to it:
# envoyproxy/ratelimit's process); the shared libraries it links (as
# `ldd` lists them, each at its path) and the dynamic loader; the host's CA
# certificates (/etc/ssl/certs/ca-certificates.crt, Debian's ca-certificates);
# /etc/passwd and /etc/group with the user nonroot (65532); /etc/nsswitch.conf;
# and the default policy /etc/divvy/divvy.yaml (config/example.yaml). No
# shell, nothing else. The libraries come from this machine, so build on the
# distribution the image should carry (Debian 12 here).
#
# Environment:
#   CONTAINER_ENGINE  podman or docker (default: podman if installed, else docker)
#   DIVVY_BINARY      an already built release binary to use instead of building one
#   CARGO_TARGET_DIR  where cargo builds (as for any cargo build)
set -euo pipefail

die() {
  printf 'build-image.sh: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed -e '/^set -euo/d' -e 's/^# \{0,1\}//'
}

root=$(cd "$(dirname "$0")/.." && pwd)
save=""
extra_tag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --save)
      [ $# -ge 2 ] || die "--save needs a path"
      save=$2
      shift 2
      ;;
    --save=*)
      save=${1#--save=}
      shift
      ;;
    -h | --help)
      usage
      exit 0
      ;;
    -*) die "unknown option $1 (see --help)" ;;
    *)
      [ -z "$extra_tag" ] || die "one TAG at most (got $extra_tag and $1)"
      extra_tag=$1
      shift
      ;;
  esac
done
if [ -n "$extra_tag" ]; then
  case "$extra_tag" in
    */* | *:*) ;;
    *) extra_tag="divvy:$extra_tag" ;;
  esac
fi

engine=${CONTAINER_ENGINE:-}
if [ -z "$engine" ]; then
  if command -v podman >/dev/null 2>&1; then
    engine=podman
  elif command -v docker >/dev/null 2>&1; then
    engine=docker
  else
    die "neither podman nor docker is installed (on Debian: apt-get install podman)"
  fi
fi
command -v "$engine" >/dev/null 2>&1 || die "CONTAINER_ENGINE=$engine is not installed"
for tool in ldd install; do
  command -v "$tool" >/dev/null 2>&1 || die "$tool is required"
done
certs=/etc/ssl/certs/ca-certificates.crt
[ -f "$certs" ] || die "$certs is missing (on Debian: apt-get install ca-certificates)"

version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/Cargo.toml" | head -n 1)
[ -n "$version" ] || die "no version in $root/Cargo.toml"

# The binary: the one given, or a release build (its path as cargo reports it,
# wherever the target directory is).
if [ -n "${DIVVY_BINARY:-}" ]; then
  binary=$DIVVY_BINARY
  [ -x "$binary" ] || die "DIVVY_BINARY=$binary is not an executable file"
  echo "using the binary $binary"
else
  command -v cargo >/dev/null 2>&1 || die "cargo is required (or set DIVVY_BINARY)"
  echo "cargo build --release --locked --bin divvy"
  binary=$(cd "$root" && cargo build --release --locked --bin divvy \
    --message-format=json-render-diagnostics \
    | sed -n 's/.*"target":{[^}]*"kind":\["bin"\].*"executable":"\([^"]*\)".*/\1/p' | tail -n 1)
  if [ -z "$binary" ] || [ ! -x "$binary" ]; then
    die "cargo did not report the divvy executable"
  fi
fi

# The root filesystem, staged in a temporary build context.
context=$(mktemp -d "${TMPDIR:-/tmp}/divvy-image.XXXXXX")
trap 'rm -rf "$context"' EXIT
rootfs=$context/rootfs
install -d -m 0755 "$rootfs"
install -D -m 0755 "$binary" "$rootfs/usr/local/bin/divvy"
# envoyproxy/ratelimit's path: started as `ratelimit`, divvy runs from that
# project's environment (Envoy Gateway starts /bin/ratelimit).
install -d -m 0755 "$rootfs/bin"
ln -s /usr/local/bin/divvy "$rootfs/bin/ratelimit"

# Every library ldd resolves, and the loader (the line with a path and no
# `=>`), copied as files at the paths the binary asks for. linux-vdso has no
# file; a library that is "not found" is an error.
ldd_out=$(ldd "$binary") || die "ldd $binary failed (is it a dynamically linked executable for this machine?)"
if grep -q 'not found' <<<"$ldd_out"; then
  die "libraries of $binary are missing on this machine: $(grep 'not found' <<<"$ldd_out" | tr -s ' \t' ' ')"
fi
libs=$(awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }' <<<"$ldd_out" | sort -u)
[ -n "$libs" ] || die "ldd listed no libraries for $binary; expected at least libc and the loader"
for lib in $libs; do
  install -D -m 0755 "$lib" "$rootfs$lib"
done

install -D -m 0644 "$certs" "$rootfs$certs"
install -D -m 0644 "$root/config/example.yaml" "$rootfs/etc/divvy/divvy.yaml"
install -d -m 0755 "$rootfs/etc"
printf '%s\n' 'root:x:0:0:root:/root:/sbin/nologin' \
  'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' >"$rootfs/etc/passwd"
printf '%s\n' 'root:x:0:' 'nonroot:x:65532:' >"$rootfs/etc/group"
# Host names from /etc/hosts (which the runtime mounts), then DNS.
printf '%s\n' 'passwd: files' 'group: files' 'hosts: files dns' >"$rootfs/etc/nsswitch.conf"
chmod 0644 "$rootfs/etc/passwd" "$rootfs/etc/group" "$rootfs/etc/nsswitch.conf"
find "$rootfs" -type d -exec chmod 0755 {} +
cp "$root/Containerfile" "$context/Containerfile"

image="divvy:$version"
tags=("$image" divvy:latest)
if [ -n "$extra_tag" ]; then tags+=("$extra_tag"); fi
tag_args=()
for tag in "${tags[@]}"; do tag_args+=(--tag "$tag"); done
previous=$("$engine" image inspect --format '{{.Id}}' divvy:latest 2>/dev/null || true)
build_args=(--file "$context/Containerfile" --build-arg "VERSION=$version" "${tag_args[@]}")
# podman keeps an image per step as a cache; nothing here is worth caching.
if [ "$engine" = podman ]; then build_args+=(--layers=false); fi
echo "$engine build ${build_args[*]} $context"
"$engine" build "${build_args[@]}" "$context"
id=$("$engine" image inspect --format '{{.Id}}' "$image")
# The image the tags pointed at before, if nothing else names it now.
if [ -n "$previous" ] && [ "$previous" != "$id" ]; then
  "$engine" rmi "$previous" >/dev/null 2>&1 || true
fi

size=$("$engine" image inspect --format '{{.Size}}' "$image")
echo "built ${tags[*]}: $size bytes"

if [ -n "$save" ]; then
  rm -f "$save"
  if [ "$engine" = podman ]; then
    podman save --format oci-archive --output "$save" "$image"
  else
    # Docker 25 and later write an OCI image layout (index.json) here too.
    docker save --output "$save" "$image"
  fi
  echo "saved $image to $save (load it with: $engine load -i $save)"
fi
