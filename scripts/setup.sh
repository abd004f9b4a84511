#!/usr/bin/env bash
# Install everything Loom needs on a fresh Debian 12 machine (run as root, Python 3.11):
# the Debian packages below, then Loom itself with its dev extras (tests, browser driver).
# Idempotent and fast when nothing is missing: the Debian packages are checked with
# dpkg-query first, and apt-get (update or install) runs only for missing ones.
#
#   ./scripts/setup.sh          # what .ci/run and the README's first command run
set -euo pipefail
cd "$(dirname "$0")/.."

# Debian packages the project needs, one per line with what needs it. Add new ones here
# (e.g. postgresql, slurm-wlm, munge); the rest of the script needs no change.
DEBIAN_PACKAGES=(
    chromium         # headless browser: tests/test_report_browser.py opens report.html in it
    chromium-driver  # /usr/bin/chromedriver, driven by selenium (no driver downloads)
    postgresql       # initdb/pg_ctl: tests/pg.py starts a throwaway server for the store's postgres tier
    slurm-wlm        # Slurm metapackage (22.05 on Debian 12): loom/service/backends/slurmtest.py's test cluster
    slurmctld        # the Slurm controller the slurm test tier starts in a network namespace
    slurmd           # the node daemon: 16 of them (slurmd -N nodename, one port each) in the slurm tier
    slurm-client     # sinfo/squeue/sbatch/scontrol, run by the Slurm backend and its tests
    munge            # munged: Slurm's authentication, started by the slurm tier with a throwaway key
    iproute2         # `ip netns`: the slurm tier's loopback-only network namespace (nsenter is util-linux)
)

log() { printf 'setup: %s\n' "$*"; }

missing=()
for pkg in "${DEBIAN_PACKAGES[@]}"; do
    status=$(dpkg-query -W -f='${db:Status-Status}' "$pkg" 2>/dev/null || true)
    if [[ "$status" == "installed" ]]; then
        log "debian package $pkg: installed"
    else
        missing+=("$pkg")
    fi
done

if ((${#missing[@]})); then
    if [[ $(id -u) -ne 0 ]]; then
        log "missing Debian packages: ${missing[*]}; run this script as root (or apt-get install them)" >&2
        exit 1
    fi
    export DEBIAN_FRONTEND=noninteractive
    log "missing Debian packages: ${missing[*]}"
    apt_opts=(-q -o DPkg::Lock::Timeout=300)  # wait for another apt-get rather than fail
    log "apt-get update"
    apt-get "${apt_opts[@]}" update
    log "apt-get install --no-install-recommends ${missing[*]}"
    apt-get "${apt_opts[@]}" install -y --no-install-recommends "${missing[@]}"
else
    log "all Debian packages installed; skipping apt-get"
fi

log "python3 -m pip install -e .[dev]"
python3 -m pip install --progress-bar off -e ".[dev]"
# Byte-compile Loom's sources once: with PYTHONDONTWRITEBYTECODE set (as on some machines) Python
# never caches them and every `loom` command would compile ~440 KB of source again (~0.15 s).
log "python3 -m compileall loom"
python3 -m compileall -q loom
log "done"
