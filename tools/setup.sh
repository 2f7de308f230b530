#!/usr/bin/env bash
# setup.sh — installs the Debian packages k3c needs (when root) or prints the exact apt command (otherwise).
set -u
pkgs=(build-essential libopenblas-dev libopenblas-openmp-dev libmicrohttpd-dev wrk libpng-dev libjpeg62-turbo-dev libseccomp-dev python3 libopenmpi-dev openmpi-bin gnuplot-nox unicode-data python3.11-doc jargon-text nodejs npm python3-numpy dataset-fashion-mnist)
missing=()
for p in "${pkgs[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# nodejs/npm may come from outside Debian on some images: accept any working node + npm.
if command -v node >/dev/null && command -v npm >/dev/null; then
    tmp=(); for p in "${missing[@]}"; do [[ $p == nodejs || $p == npm ]] || tmp+=("$p"); done; missing=("${tmp[@]}")
fi
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    (apt-get update -qq && apt-get install -y -qq --no-install-recommends "${missing[@]}") >/tmp/k3c-setup.log 2>&1 ||
        { echo "setup: apt-get failed; see /tmp/k3c-setup.log"; tail -n 20 /tmp/k3c-setup.log; exit 1; }
else
    echo "setup: missing packages; run:"
    echo "  sudo apt-get update && sudo apt-get install -y ${missing[*]}"
    exit 1
fi
