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

# debian_mirror_uri: the archive URI this machine's own bookworm entry names (deb822 sources,
# else the one-line sources.list), or nothing; so no host is hard-coded anywhere.
debian_mirror_uri() {
  local uri
  # awk reads its input whole (no `exit`): a reader that stops early fails the pipe.
  uri=$({ cat /etc/apt/sources.list.d/*.sources 2>/dev/null || true; } | awk '
    /^[[:space:]]*$/ { uris = "" }
    /^URIs:/ { uris = $2 }
    /^Suites:/ && found == "" { for (i = 2; i <= NF; i++) if ($i == "bookworm" && uris != "") found = uris }
    END { print found }')
  if [ -z "$uri" ] && [ -r /etc/apt/sources.list ]; then
    uri=$(awk '$1 == "deb" && $3 == "bookworm" && found == "" { found = $2 } END { print found }' /etc/apt/sources.list)
  fi
  echo "$uri"
}

# add_bookworm_backports: on bookworm, adds the bookworm-backports suite (QEMU 10, runsc 2024,
# wasi-libc 2024) with the mirror URI the host's Debian sources already use
# (debian_mirror_uri); once. The next apt update (apt_install's, or apt_update_once) reads it.
add_bookworm_backports() {
  local bpo_list=/etc/apt/sources.list.d/cordon-backports.sources uri=""
  if [ -r /etc/os-release ] && grep -q 'VERSION_CODENAME=bookworm' /etc/os-release &&
     [ ! -e "$bpo_list" ] && ! grep -rqs 'bookworm-backports' /etc/apt/sources.list /etc/apt/sources.list.d/; then
    uri=$(debian_mirror_uri)
    if [ -n "$uri" ]; then
      log "adding bookworm-backports from $uri"
      printf 'Types: deb\nURIs: %s\nSuites: bookworm-backports\nComponents: main\nSigned-By: /usr/share/keyrings/debian-archive-keyring.gpg\n' \
        "$uri" | $SUDO tee "$bpo_list" >/dev/null
      rm -f /tmp/.cordon-apt-updated
    else
      log "no Debian mirror URI found in the apt sources: staying on bookworm's packages"
    fi
  fi
}

# apt_update_once: `apt-get update`, at most once per setup run (again after a suite was added).
apt_update_once() {
  if [ ! -e /tmp/.cordon-apt-updated ]; then
    $SUDO apt-get update -q >/dev/null
    touch /tmp/.cordon-apt-updated
  fi
}

# rustup_target_add TARGET...: adds the rust targets that are not installed yet. These
# machines set RUSTUP_AUTO_INSTALL=0, so a target a build names is never fetched on its own:
# every target any build uses is added here, by a setup step (scripts/check-setup.py checks
# that no build names one that no step adds).
rustup_target_add() {
  local t installed
  installed=$(rustup target list --installed 2>/dev/null || true)
  for t in "$@"; do
    if ! grep -qx "$t" <<<"$installed"; then
      log "adding the rust target $t"
      rustup target add "$t" >/dev/null
    fi
  done
}

# pip_install SPEC...: installs the Python packages (requirement specifiers) the host's
# python3 does not have yet, for the tests that run on it.
pip_install() {
  local spec name missing=()
  for spec in "$@"; do
    name=${spec%%[<>=!~;[ ]*}
    python3 -m pip show -q "$name" >/dev/null 2>&1 || missing+=("$spec")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  log "installing ${missing[*]} (pip)"
  python3 -m pip install --quiet --disable-pip-version-check "${missing[@]}"
}

# Where Cordon keeps built guest artifacts (wasm components, microVM images).
cordon_data_dir() {
  if [ -n "${CORDON_HOME:-}" ]; then echo "$CORDON_HOME";
  elif [ "$(id -u)" -eq 0 ]; then echo /var/lib/cordon;
  else echo "${XDG_DATA_HOME:-$HOME/.local/share}/cordon"; fi
}

# Where setup puts the programs it builds from Go modules (scripts/k8s/modules): links to
# builds cached by version under the data dir (go_build). scripts/k8s.sh runs them from here.
go_bin_dir() { echo "$(cordon_data_dir)/k8s/bin"; }

# go_build MODULE VERSION NAME=PACKAGE...: builds each PACKAGE of the pinned module
# scripts/k8s/modules/MODULE (a wrapper whose go.mod and go.sum pin VERSION and all it needs)
# once, into $(cordon_data_dir)/k8s/build/MODULE-VERSION-HASH (HASH of the go.mod, go.sum,
# sources, Go version and flags), and links it as $(go_bin_dir)/NAME. Each build is nice'd,
# -trimpath and stripped, reuses Go's build cache, and prints its time (a row of the phase table
# too, under setup's). $GO_BUILD_LDFLAGS adds linker flags (a version stamp). A second run
# builds nothing. scripts/check-setup.py reads these lines: each NAME is a program setup provides.
go_build() {
  local module=$1 version=$2 src hash out spec name pkg start secs ldflags
  shift 2
  src="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)/k8s/modules/$module"
  if ! grep -qw -- "$version" "$src/go.mod"; then
    log "go_build: $src/go.mod does not pin $version; fix: update the wrapper module and the ADR together"
    return 1
  fi
  ldflags="-s -w ${GO_BUILD_LDFLAGS:-}"
  hash=$({ cat "$src/go.mod" "$src/go.sum" "$src"/*.go 2>/dev/null || true; go version; echo "$ldflags"; } |
    sha256sum | cut -c1-12)
  out="$(cordon_data_dir)/k8s/build/$module-$version-$hash"
  mkdir -p "$out" "$(go_bin_dir)"
  for spec in "$@"; do
    name=${spec%%=*}
    pkg=${spec#*=}
    if [ ! -x "$out/$name" ]; then
      log "building $name ($pkg, $module $version) from its Go modules"
      start=$(date +%s)
      (cd "$src" && GOTOOLCHAIN=local GOFLAGS=-mod=readonly CGO_ENABLED=0 nice -n 10 \
        go build -trimpath -buildvcs=false -ldflags "$ldflags" -o "$out/$name.part" "$pkg")
      mv "$out/$name.part" "$out/$name"
      secs=$(( $(date +%s) - start ))
      log "built $name in ${secs}s"
      if [ -n "${CORDON_PHASE_LOG:-}" ]; then
        printf '  go %s\t%s\tok (in setup)\tpart\n' "$name" "$secs" >> "$CORDON_PHASE_LOG"
      fi
    fi
    ln -sfn "$out/$name" "$(go_bin_dir)/$name"
  done
}

# Where cargo puts its builds: $CARGO_TARGET_DIR, else the repository's target/.
cargo_target_dir() {
  if [ -n "${CARGO_TARGET_DIR:-}" ]; then echo "$CARGO_TARGET_DIR";
  else echo "$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/target"; fi
}

# The static executables, built for this target (the front, the sandbox init, the microVM
# guest agent).
MUSL=x86_64-unknown-linux-musl

# The cargo profile of the static front and init: release, except in `make test`, which sets
# CORDON_MUSL_PROFILE=dev: the tests check that they build for musl and run, and an
# unoptimised build takes less than half the time of the release one. The guest agent is
# always a release build: every exec in a test microVM runs through it, emulated under TCG
# (ADR 0016).
MUSL_PROFILE=${CORDON_MUSL_PROFILE:-release}

# build_musl_set: the three static executables for $MUSL. In release they are one build,
# so their shared dependencies compile once with one feature set; every caller (the guest
# image, scripts/build-static.sh, scripts/static-smoke.sh) asks for exactly this set, so
# after the first the others find it built.
build_musl_set() {
  if [ "$MUSL_PROFILE" = release ]; then
    # They abort on a panic (one process per sandbox or run; unwinding would only add size
    # and start-up work), unlike the workspace's release profile (ADR 0046).
    cargo_progress "static front, init and guest agent" build --release --target "$MUSL" \
      --config 'profile.release.panic="abort"' \
      -p cordon-guest --bin cordon-guest \
      -p cordon --bin cordon \
      -p cordon-sandbox-init --bin cordon-sandbox-init
  else
    cargo_progress "static guest agent" build --release --target "$MUSL" \
      --config 'profile.release.panic="abort"' \
      -p cordon-guest --bin cordon-guest
    cargo_progress "static front and init" build --profile "$MUSL_PROFILE" --target "$MUSL" \
      -p cordon --bin cordon \
      -p cordon-sandbox-init --bin cordon-sandbox-init
  fi
}

# cargo_progress LABEL ARGS...: `cargo ARGS...` under the cargo lock, saying how far it is:
# every 15 s, and at its end, how many crates it has compiled of about how many it builds
# (`cargo tree` of the same packages), and the time. Cargo's warnings and errors pass through;
# its per-crate lines do not. Exits with cargo's status.
cargo_progress() {
  local - label=$1 total=0 n=0 last=$SECONDS start=$SECONDS line rc=0 a prev="" tree=()
  shift
  for a in "$@"; do
    case "$prev" in -p|--package|--target|--features) tree+=("$prev" "$a") ;; esac
    case "$a" in --workspace|--all-features) tree+=("$a") ;; esac
    prev=$a
  done
  total=$(cargo tree -q --prefix none -e normal,build -f '{p}' "${tree[@]}" 2>/dev/null | sort -u | wc -l || echo 0)
  log "$label: cargo $1 (about $total crates)"
  set +e
  { flock /tmp/cordon-cargo.lock cargo "$@" --color never 2>&1 1>&3 3>&- | {
      while IFS= read -r line; do
        case "$line" in
          *"Compiling "*) n=$(( n + 1 )) ;;
          *"Blocking waiting"*) log "$label: waiting for another cargo build to finish" ;;
          *"Finished "*|*"Fresh "*|*"Download"*|*"Updating "*|*"Locking "*|*"Adding "*) ;;
          *) printf '%s\n' "$line" >&2 ;;
        esac
        if [ $(( SECONDS - last )) -ge 15 ]; then
          last=$SECONDS
          log "$label: $n of about $total crates compiled, $((SECONDS - start))s"
        fi
      done
      log "$label: $n crates compiled (the rest were built already), $((SECONDS - start))s"
    }
    rc=${PIPESTATUS[0]}; } 3>&1
  return "$rc"
}

# Where build_musl_set puts the front and the init (cargo names the dev profile's
# directory `debug`); the agent is always under `$MUSL/release`.
musl_dir() {
  local p=$MUSL_PROFILE
  [ "$p" = dev ] && p=debug
  echo "$(cargo_target_dir)/$MUSL/$p"
}

# run_steps_side_by_side DIR LABEL: runs every DIR/NN-name.sh at once (steps that do not
# depend on each other: the guests), each one's output kept and printed whole when it ends;
# fails when any step failed. Their cargo builds still take turns (each takes
# /tmp/cordon-cargo.lock), so one step's downloads and unpacking (debootstrap, pip) overlap
# another's compiling.
run_steps_side_by_side() {
  local step name dir pids=() names=() logs=() starts=() i rc failed=0
  dir=$(mktemp -d)
  for step in "$1"/*.sh; do
    [ -e "$step" ] || continue
    name=$(basename "$step" .sh)
    bash "$step" > "$dir/$name.log" 2>&1 &
    pids+=("$!"); names+=("$name"); logs+=("$dir/$name.log"); starts+=("$(date +%s)")
  done
  for i in "${!pids[@]}"; do
    rc=0
    wait "${pids[$i]}" || rc=$?
    cat "${logs[$i]}" >&2
    if [ "$rc" -ne 0 ]; then
      log "$2: ${names[$i]} FAILED (exit $rc)"
      failed=1
    else
      log "$2: ${names[$i]} done in $(( $(date +%s) - starts[i] ))s (side by side)"
    fi
  done
  rm -rf "$dir"
  return "$failed"
}

# step_part STEP: the part a setup step belongs to, from its `# part: NAME` line (base, wasm,
# gvisor, microvm, oci, test); a step without one is part of `test`.
step_part() {
  local p
  p=$(sed -n 's/^# part: *\([a-z0-9-]*\).*/\1/p' "$1" | head -n 1)
  echo "${p:-test}"
}

# select_steps DIR [PART...]: the paths of DIR/NN-name.sh in order; with PARTs, only the steps
# of those parts and of `base`.
select_steps() {
  local dir=$1 step part p want
  shift
  for step in "$dir"/*.sh; do
    [ -e "$step" ] || continue
    if [ $# -gt 0 ]; then
      part=$(step_part "$step")
      want=0
      for p in base "$@"; do [ "$p" = "$part" ] && want=1; done
      [ "$want" = 1 ] || continue
    fi
    echo "$step"
  done
}

# run_steps DIR LABEL [PART...]: runs the steps select_steps picks, in order, logging each
# one's place (i of n) and time.
run_steps() {
  local dir=$1 label=$2 step name start i=0 n steps=()
  shift 2
  mapfile -t steps < <(select_steps "$dir" "$@")
  n=${#steps[@]}
  for step in "${steps[@]}"; do
    i=$(( i + 1 ))
    name=$(basename "$step" .sh)
    start=$(date +%s)
    log "$label: $name ($i of $n)"
    bash "$step"
    log "$label: $name done in $(( $(date +%s) - start ))s"
  done
}
