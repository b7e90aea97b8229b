#!/usr/bin/env bash
# Installs the Debian packages listed in deps/debian-packages.txt that are not installed yet.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
# `install-deps.sh` installs the packages above the file's `# [fuzz]` line; `install-deps.sh fuzz`
# (make fuzz) all of them.
list="$here/deps/debian-packages.txt"
if [ "${1:-}" = "fuzz" ]; then
  mapfile -t wanted < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$list" | grep -v '^$')
else
  mapfile -t wanted < <(sed -e '/^# \[fuzz\]/,$d' "$list" | sed -e 's/#.*//' -e 's/[[:space:]]//g' | grep -v '^$')
fi
missing=()
for p in "${wanted[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "installing Debian packages: ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -ne 0 ] && sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
