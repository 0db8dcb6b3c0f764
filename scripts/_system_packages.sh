# Sourced by scripts/test: the Debian packages the test suite drives as real tools.
#   docker-compose  Compose (the Python implementation Debian ships) resolves and validates the
#                   compose files offline: `docker-compose config` needs no Docker engine
#   chromium        the headless browser the console's end-to-end tests drive (Playwright)
#   skopeo, umoci   build and read real OCI / docker-save images for the release bundle's tests
#   fonts-dejavu-core  the TrueType font the OCR page tests render their pages in
# As root (CI, a fresh container) the missing ones are installed with apt; otherwise the command
# to install them is printed and the script stops, because their tests would fail without them.
set -euo pipefail
SYSTEM_PACKAGES=(docker-compose chromium skopeo umoci fonts-dejavu-core)

missing_system_packages() {
  local package
  for package in "${SYSTEM_PACKAGES[@]}"; do
    if ! dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q 'install ok installed'; then
      printf '%s\n' "$package"
    fi
  done
}

mapfile -t _missing < <(missing_system_packages)
if [ "${#_missing[@]}" -gt 0 ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null; then
    echo "installing Debian packages the tests need: ${_missing[*]}" >&2
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${_missing[@]}" >/dev/null
  elif [ "${MODELFORGE_SKIP_SYSTEM_PACKAGES:-}" != "1" ]; then
    echo "error: the tests need these Debian packages: ${_missing[*]}" >&2
    echo "  install them:  sudo apt-get install -y --no-install-recommends ${_missing[*]}" >&2
    exit 2
  fi
fi
unset _missing
