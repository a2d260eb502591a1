# Shared helpers for Cordon's scripts. Source it; do not run it.
log() { printf '[cordon] %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# apt_install PKG...: installs the packages that are not installed yet; runs
# `apt-get update` at most once per setup run, and only when something is missing.
apt_install() {
  local missing=()
  for p in "$@"; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
      missing+=("$p")
    fi
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]}"
  if [ ! -e /tmp/.cordon-apt-updated ]; then
    $SUDO apt-get update -q >/dev/null
    touch /tmp/.cordon-apt-updated
  fi
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
}

# Where Cordon keeps built guest artifacts (wasm components, microVM images).
cordon_data_dir() {
  if [ -n "${CORDON_HOME:-}" ]; then echo "$CORDON_HOME";
  elif [ "$(id -u)" -eq 0 ]; then echo /var/lib/cordon;
  else echo "${XDG_DATA_HOME:-$HOME/.local/share}/cordon"; fi
}
