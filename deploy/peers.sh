#!/bin/sh
# Builds the peers egress-proxies meets in the field, at pinned versions, for tests against the
# real thing:
#   kube-apiserver, kubectl   k8s.io/kubernetes            (deploy/peers/kube/go.mod)
#   etcd                      go.etcd.io/etcd/server/v3    (deploy/peers/etcd, an embed launcher)
#   nats                      github.com/nats-io/natscli   (deploy/peers/nats/go.mod)
#   helm                      helm.sh/helm/v3              (deploy/peers/helm/go.mod)
# The versions are the go.mod files' requirements, checked against their go.sum. The binaries go
# to a cache outside the work tree, one directory per set of pinned inputs:
#   ${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies/peers/<key>/bin
# (EGRESS_PEERS_DIR overrides that directory). A binary already built from the same inputs is
# kept, so a second run builds nothing. The directory is printed on stdout at the end, progress
# goes to stderr:  bin=$(sh deploy/peers.sh)
# A binary that fails to build is reported and the others are still built; the exit status is
# then 1. Needs the go command (Go 1.26 or later) and the Go module proxy; CGO is off.
set -eu

peers=$(cd "$(dirname "$0")/peers" && pwd)
say() { echo "peers: $*" >&2; }
# The official Go archive installs to /usr/local/go, which a non-login shell may not have on PATH.
command -v go >/dev/null 2>&1 || PATH="$PATH:/usr/local/go/bin"
command -v go >/dev/null 2>&1 || {
  say "needs the go command (Go 1.26 or later)"
  exit 1
}

cache_root=${XDG_CACHE_HOME:-${HOME:?HOME or XDG_CACHE_HOME must be set}/.cache}/egress-proxies
# Builds of Kubernetes fill a Go build cache of their own; rm -rf the cache root drops it all.
GOCACHE=${GOCACHE:-$cache_root/go-build}
# readonly: go.mod and go.sum are the pins; a build never rewrites them. No VCS stamping, so the
# work tree's state does not enter the binaries.
GOFLAGS="-mod=readonly -buildvcs=false"
CGO_ENABLED=0
export GOCACHE GOFLAGS CGO_ENABLED

required() { awk -v m="$2" '$1 == m { print $2; exit }' "$peers/$1/go.mod"; }
kube_version=$(required kube k8s.io/kubernetes)
etcd_version=$(required etcd go.etcd.io/etcd/server/v3)
nats_version=$(required nats github.com/nats-io/natscli)
helm_version=$(required helm helm.sh/helm/v3)
# k8s.io/kubernetes v1.N.P builds with the staging modules of the same release, v0.N.P.
staging=v0.${kube_version#v*.}
if grep -E '=> k8s\.io/' "$peers/kube/go.mod" | grep -vq " $staging\$"; then
  say "deploy/peers/kube/go.mod: each k8s.io/* replace must be $staging, for k8s.io/kubernetes $kube_version"
  exit 1
fi
go_version=$(cd "$peers/kube" && go env GOVERSION)
platform=$(go env GOOS)-$(go env GOARCH)

# What `hack/lib/version.sh` stamps into a Kubernetes release. The build date is the release's
# own (the module's timestamp) so that a rebuild gives the same binary; the module proxy does not
# say which commit the tag is, so gitCommit stays empty.
kube_date=$(cd "$peers/kube" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' k8s.io/kubernetes)
kube_minor=${kube_version#v*.}
kube_minor=${kube_minor%%.*}
kube_major=${kube_version#v}
kube_major=${kube_major%%.*}
kube_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  kube_ldflags="$kube_ldflags -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=$kube_major"
  kube_ldflags="$kube_ldflags -X $pkg.gitMinor=$kube_minor -X $pkg.gitTreeState=archive"
  kube_ldflags="$kube_ldflags -X $pkg.buildDate=$kube_date -X $pkg.gitCommit="
done
nats_ldflags="-s -w -X main.version=$nats_version"
etcd_ldflags="-s -w"
# What helm's Makefile stamps: its release, and the Kubernetes minor of the client-go it is built
# with (v0.N.P -> 1.N), which `helm template` and `helm lint` assume when no cluster is asked.
helm_kube_minor=$(required helm k8s.io/client-go)
helm_kube_minor=${helm_kube_minor#v*.}
helm_kube_minor=${helm_kube_minor%%.*}
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  helm_ldflags="$helm_ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_kube_minor"
done

# The key names the versions and hashes every input of the builds, so that changing a pin, a
# flag or the launcher's code builds into a fresh directory.
inputs_hash=$(
  {
    echo "$go_version $platform $GOFLAGS CGO_ENABLED=$CGO_ENABLED -trimpath"
    echo "$kube_ldflags"
    echo "$nats_ldflags"
    echo "$etcd_ldflags"
    echo "$helm_ldflags"
    for f in "$peers"/*/go.mod "$peers"/*/go.sum "$peers"/*/*.go; do
      if [ -f "$f" ]; then echo "${f#"$peers"/}" && cat "$f"; fi
    done
  } | sha256sum | cut -c1-12
)
key="k8s-$kube_version.etcd-$etcd_version.natscli-$nats_version.helm-$helm_version.$go_version.$platform.$inputs_hash"
bin=${EGRESS_PEERS_DIR:-$cache_root/peers/$key/bin}
mkdir -p "$bin"
bin=$(cd "$bin" && pwd)

# Two runs at once (parallel test sessions) would build the same thing twice: the second waits.
if command -v flock >/dev/null 2>&1; then
  exec 9>"$bin/.lock"
  flock 9
fi

failed=""
# build NAME MODULE_DIR PACKAGE VERSION LDFLAGS
build() {
  stamp="$bin/.$1.built"
  if [ -x "$bin/$1" ] && [ -f "$stamp" ] && [ "$(sed -n 1p "$stamp")" = "$key" ]; then
    say "$1 $4: built already"
    return 0
  fi
  say "building $1 $4 (GOCACHE=$GOCACHE)"
  start=$(date +%s)
  tmp="$bin/.$1.tmp.$$"
  if (cd "$peers/$2" && nice -n 19 go build -trimpath -ldflags "$5" -o "$tmp" "$3"); then
    seconds=$(($(date +%s) - start))
    mv -f "$tmp" "$bin/$1"
    printf '%s\n%s\t%s\t%s\t%s\t%s\n' "$key" "$1" "$4" "$seconds" "$(wc -c <"$bin/$1" | tr -d ' ')" \
      "$(date -u +%Y-%m-%dT%H:%M:%SZ)" >"$stamp"
    say "$1 $4: built in ${seconds}s"
  else
    rm -f "$tmp"
    say "$1 $4: the build FAILED (the go command's error is above)"
    failed="$failed $1"
  fi
}

build etcd etcd . "$etcd_version" "$etcd_ldflags"
build nats nats github.com/nats-io/natscli/nats "$nats_version" "$nats_ldflags"
build kube-apiserver kube k8s.io/kubernetes/cmd/kube-apiserver "$kube_version" "$kube_ldflags"
build kubectl kube k8s.io/kubernetes/cmd/kubectl "$kube_version" "$kube_ldflags"
build helm helm helm.sh/helm/v3/cmd/helm "$helm_version" "$helm_ldflags"

{
  echo "# Built by deploy/peers.sh. build_seconds: that binary's go build on the machine that built"
  echo "# it (a warm Go build cache makes it far shorter); bytes: its size."
  echo "key $key"
  echo "go $go_version $platform"
  printf 'binary\tversion\tbuild_seconds\tbytes\tbuilt_at\n'
  for name in etcd nats kube-apiserver kubectl helm; do
    if [ -f "$bin/.$name.built" ] && [ "$(sed -n 1p "$bin/.$name.built")" = "$key" ]; then
      sed -n 2p "$bin/.$name.built"
    fi
  done
} >"$bin/MANIFEST"

echo "$bin"
if [ -n "$failed" ]; then
  say "not built:$failed"
  exit 1
fi
