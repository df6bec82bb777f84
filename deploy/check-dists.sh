#!/usr/bin/env bash
# Builds the two distributions a user installs, egress-proxies and egress-proxies-client, as a
# release would (sdist, then the wheel built from that sdist: `python -m build`), checks their
# metadata (`twine check --strict`), installs both wheels into a clean venv with their
# dependencies from the package registry, and runs them from there: `--version`, the CRD, the
# console's templates and static files, the client and its Scrapy middleware. Any miss fails.
#
#   bash deploy/check-dists.sh      (or `make dists`; needs the dev extras: build, twine)
#
# Nothing is written to the work tree but setuptools' *.egg-info (ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."
# The dev venv has build and twine; the clean venv is made from the interpreter that made it.
# Both are used from this directory only (the checks at the end run elsewhere).
TOOLS=${TOOLS_PYTHON:-.venv/bin/python}
PYTHON=${PYTHON:-python3}
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore PIP_NO_INPUT=1
# The checks below must import the installed wheels, never this source tree.
unset PYTHONPATH
start=$SECONDS

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

say() { echo "check-dists: $*"; }
fail() {
  echo "check-dists: FAILED: $*" >&2
  exit 1
}
# Runs a step quietly; on failure shows its whole output, then fails.
quiet() {
  local what=$1
  shift
  if ! "$@" >"$work/step.log" 2>&1; then
    cat "$work/step.log" >&2
    fail "$what"
  fi
}

"$TOOLS" -c "import build, twine" 2>/dev/null ||
  fail "build and twine are missing from $TOOLS: install the dev extras (make lint does)"

version=$("$PYTHON" -c "import tomllib; print(tomllib.load(open('pyproject.toml', 'rb'))['project']['version'])")
client_version=$("$PYTHON" -c "import tomllib; print(tomllib.load(open('clients/python/pyproject.toml', 'rb'))['project']['version'])")
[ "$version" = "$client_version" ] ||
  fail "the product is $version but the client library $client_version: release them with one number"

say "building egress-proxies $version and egress-proxies-client $version (sdist, then wheel from it)"
quiet "python -m build of the product" "$TOOLS" -m build --outdir "$work/dist" .
quiet "python -m build of the client library" "$TOOLS" -m build --outdir "$work/dist" clients/python
product_whl="$work/dist/egress_proxies-$version-py3-none-any.whl"
client_whl="$work/dist/egress_proxies_client-$version-py3-none-any.whl"
for dist in "$product_whl" "$client_whl" "$work/dist/egress_proxies-$version.tar.gz" \
  "$work/dist/egress_proxies_client-$version.tar.gz"; do
  [ -f "$dist" ] || fail "the build made no $(basename "$dist"); it made: $(ls "$work/dist")"
done

say "twine check --strict"
quiet "twine check (fix the metadata or README it names)" "$TOOLS" -m twine check --strict "$work"/dist/*

# Every file of the packages' source goes into its wheel (modules, py.typed, templates, static
# files): a file left out works in an editable install and breaks every user's.
say "comparing the wheels' files with the source"
"$PYTHON" - "$product_whl" "$client_whl" <<'EOF' || fail "a wheel does not hold its package's files"
import pathlib, subprocess, sys, zipfile

def source(root: str, *packages: str) -> set[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "--", *packages],
        cwd=root, capture_output=True, text=True,
    )
    if listed.returncode == 0:
        names = listed.stdout.split()
    else:  # not a git checkout: what is on disk
        names = [str(p.relative_to(root)) for pkg in packages for p in pathlib.Path(root, pkg).rglob("*")
                 if p.is_file()]
    return {n for n in names if "__pycache__" not in n and pathlib.Path(root, n).is_file()}

bad = False
for wheel, root, packages in (
    (sys.argv[1], ".", ("events", "projections", "commands", "services")),
    (sys.argv[2], "clients/python", ("egress_proxies_client",)),
):
    held = {n for n in zipfile.ZipFile(wheel).namelist() if ".dist-info/" not in n}
    wanted = source(root, *packages)
    for name in sorted(wanted - held):
        print(f"  {pathlib.Path(wheel).name} lacks {name} (package-data in pyproject.toml?)", file=sys.stderr)
        bad = True
    for name in sorted(held - wanted):
        print(f"  {pathlib.Path(wheel).name} holds {name}, which is not in the source", file=sys.stderr)
        bad = True
    if not any(n.endswith("py.typed") for n in held):
        print(f"  {pathlib.Path(wheel).name} has no py.typed", file=sys.stderr)
        bad = True
sys.exit(1 if bad else 0)
EOF

say "installing both wheels into a clean venv (dependencies from the registry)"
quiet "python -m venv" "$PYTHON" -m venv "$work/venv"
# --no-compile: byte-compiling every dependency would double the install's time, for nothing here.
quiet "pip install of the wheels" \
  "$work/venv/bin/python" -m pip install --no-compile "$product_whl" "$client_whl[scrapy]"

# From the temporary directory, so that `import services` cannot find this checkout.
cd "$work"
say "running them from the venv"
shown=$("$work/venv/bin/egress-proxies" --version) || fail "egress-proxies --version exited non-zero"
[ "$shown" = "egress-proxies, version $version" ] ||
  fail "egress-proxies --version says '$shown', not version $version"
"$work/venv/bin/egress-proxies" crd >"$work/crd.yaml" || fail "egress-proxies crd exited non-zero"
grep -q "^kind: CustomResourceDefinition" "$work/crd.yaml" ||
  fail "egress-proxies crd printed no CustomResourceDefinition"
"$work/venv/bin/python" - "$work/venv" "$version" <<'EOF' || fail "the installed packages are incomplete"
import importlib.resources, pathlib, sys
from importlib.metadata import version

import egress_proxies_client, egress_proxies_client.scrapy
import commands, events, projections, services
from services.discovery.console import routes  # reads the static files as it is imported
from services.discovery.console.render import ENV
from services.runtime.version import VERSION

venv, expected = pathlib.Path(sys.argv[1]).resolve(), sys.argv[2]
for module in (events, projections, commands, services, egress_proxies_client):
    where = pathlib.Path(module.__file__).resolve()
    assert venv in where.parents, f"{module.__name__} was imported from {where}, not the venv"
    assert importlib.resources.files(module.__name__).joinpath("py.typed").is_file(), module
templates = ENV.list_templates()
assert "base.html" in templates and "fleet.html" in templates, templates
for name in templates:
    ENV.get_template(name)  # compiles it: a template that is missing or broken raises
assert all(routes.FILES.values()), "an empty static file"
assert VERSION == expected == version("egress-proxies-client"), (VERSION, expected)
EOF

say "ok: both distributions build, pass twine check, install and run ($((SECONDS - start)) s)"
