# Sourced by scripts/node-agent-start.sh and scripts/recreate-node-agent.sh, never run alone: what
# both do around `docker compose ... up node-agent`. The caller has turned shell tracing off and
# set PROG (its name, for messages) before sourcing this.
#
# - drop_environment_settings: unsets every exported MODELFORGE_* variable, naming them (never their
#   values) on stderr: Compose would let them override the .env, which is the one source.
# - read_env_file FILE: the node's .env (NAME=value lines, non-secret). Sets SETTINGS (its lines,
#   as written), STATE_DIR, IMAGE, CA_CERT and TOKEN_LINE (the line that holds an enrollment
#   token, 0 when none: that line is never copied anywhere). The file is read, never sourced.
# - check_settings: the control plane's URL (an origin and nothing else), the state directory, the
#   CA file and the image reference, before anything runs; with NO_CONTAINER=1 (set by the caller
#   for --no-container) the URL, the state directory and the CA file only. A .env whose
#   MODELFORGE_AGENT_ACCELERATOR_MODE is cpu is started with docker-compose.node-agent.cpu.yml
#   (no GPU reserved) instead of docker-compose.node-agent.yml.
# - open_work_dir: a private temporary folder (mode 0700) that holds the env file given to Compose
#   (mode 0600) and the output of docker commands; the EXIT trap removes it, and INT, TERM and HUP
#   exit through that trap, after stopping the docker command that runs then.
# - run_docker ARGS...: docker in the background, so a signal is handled at once.
# - capture_image_id, verify_container: the local image ID before Compose starts, and that the
#   created container runs that same ID (the release flow: `docker load` may rewrite IDs, so the
#   check is made on this node, after loading).

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
#: the agent image's user and group (distroless "nonroot"): it must be able to write the state dir
AGENT_UID=65532
#: the file the agent keeps its identity in, inside the state volume (agent/.../identity.py)
IDENTITY_FILE=identity.json
#: how the image reference falls back when the .env names none: the Compose file's own default
IMAGE_DEFAULT_RE='\$\{MODELFORGE_NODE_AGENT_IMAGE:-([^}]+)\}'

SETTINGS=()
STATE_DIR=""
IMAGE=""
IMAGE_ID=""
CA_CERT=""
CONTROL_PLANE_URL=""
ACCELERATOR_MODE=""
TOKEN_LINE=0
COMPOSE=()
WORK=""
ENV_TMP=""
CHILD=""

say() { printf '%s: %s\n' "$PROG" "$*" >&2; }

die() {
  local status=$1
  shift
  say "error: $*"
  exit "$status"
}

cleanup() {
  if [ -n "$CHILD" ]; then
    kill -TERM "$CHILD" 2>/dev/null || true
    wait "$CHILD" 2>/dev/null || true
    CHILD=""
  fi
  if [ -n "$WORK" ]; then
    rm -rf -- "$WORK"
    WORK=""
  fi
}

install_traps() {
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM
  trap 'exit 129' HUP
}

drop_environment_settings() {
  local name dropped=()
  for name in $(compgen -e); do
    case $name in
      MODELFORGE_*)
        unset "$name"
        dropped+=("$name")
        ;;
    esac
  done
  if [ "${#dropped[@]}" -gt 0 ]; then
    say "warning: ignoring ${dropped[*]} from this shell's environment: the container's settings come only from the .env file given (put them there)"
  fi
}

read_env_file() {
  local file=$1 line name value number=0
  if [ ! -f "$file" ] || [ ! -r "$file" ]; then
    die 2 "$file is not a readable file (the node's .env of non-secret settings)"
  fi
  while IFS= read -r line || [ -n "$line" ]; do
    number=$((number + 1))
    line=${line%$'\r'}
    if [[ $line =~ ^[[:space:]]*(#.*)?$ ]]; then
      continue
    fi
    if ! [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
      say "warning: $file line $number is not NAME=value; left out"
      continue
    fi
    name=${BASH_REMATCH[1]}
    value=${BASH_REMATCH[2]}
    if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then
      value=${BASH_REMATCH[1]}
    fi
    case $name in
      MODELFORGE_AGENT_ENROLLMENT_TOKEN)
        if [ -n "$value" ]; then TOKEN_LINE=$number; fi
        continue
        ;;
      MODELFORGE_AGENT_ENV_FILE) continue ;; # set by these scripts
      MODELFORGE_AGENT_STATE_VOLUME) STATE_DIR=$value ;;
      MODELFORGE_NODE_AGENT_IMAGE) IMAGE=$value ;;
      MODELFORGE_AGENT_CA_CERT_PATH) CA_CERT=$value ;;
      MODELFORGE_AGENT_CONTROL_PLANE_URL) CONTROL_PLANE_URL=$value ;;
      MODELFORGE_AGENT_ACCELERATOR_MODE) ACCELERATOR_MODE=$value ;;
    esac
    SETTINGS+=("$line")
  done <"$file"
}

compose_default_image() {
  local line
  while IFS= read -r line; do
    if [[ $line =~ $IMAGE_DEFAULT_RE ]]; then
      printf '%s\n' "${BASH_REMATCH[1]}"
      return 0
    fi
  done <"$ROOT/docker-compose.node-agent.yml"
  return 1
}

#: an origin, as modelforge_protocol.addresses.origin_problem accepts one: scheme://host[:port][/],
#: the host a DNS name, an IPv4 address or a bracketed IPv6 address; nothing else (no quote, $(),
#: space, path, user or control character)
DNS_LABEL='[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?'
ORIGIN_RE="^(https?)://(\\[[0-9A-Fa-f:.]{2,45}\\]|${DNS_LABEL}(\\.${DNS_LABEL})*\\.?)(:([0-9]{1,5}))?/?\$"
IPV4_RE='^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$'

# check_origin NAME VALUE: exit 2 unless VALUE is an origin the agent may be given.
check_origin() {
  local name=$1 url=$2 scheme host port octet last
  local shape="scheme://host[:port] only (https, or http for a loopback address; no path, user, quote, space or control character)"
  if ! [[ $url =~ $ORIGIN_RE ]]; then
    die 2 "$name in the .env is not an origin: it must be $shape"
  fi
  scheme=${BASH_REMATCH[1]}
  host=${BASH_REMATCH[2]}
  port=${BASH_REMATCH[7]}
  if [ -n "$port" ] && { [ "$((10#$port))" -lt 1 ] || [ "$((10#$port))" -gt 65535 ]; }; then
    die 2 "$name in the .env has a port outside 1-65535"
  fi
  if [[ $host =~ $IPV4_RE ]]; then
    for octet in "${BASH_REMATCH[@]:1}"; do
      if [ "$((10#$octet))" -gt 255 ]; then die 2 "$name in the .env is not an origin: $host is not an IPv4 address"; fi
    done
  else
    last=${host%.}
    last=${last##*.}
    if [[ $host != \[* && $last =~ ^[0-9]+$ ]]; then
      die 2 "$name in the .env is not an origin: $host is neither an IPv4 address nor a DNS name"
    fi
  fi
  if [ "$scheme" = http ] && ! [[ $host == localhost || $host =~ ^127\.[0-9.]+$ || $host == "[::1]" ]]; then
    die 2 "$name in the .env must use https:// (plain http:// is allowed only for a loopback address)"
  fi
}

check_settings() {
  local env_file=$1 owner last
  if [ -z "$CONTROL_PLANE_URL" ]; then
    die 2 "$env_file does not set MODELFORGE_AGENT_CONTROL_PLANE_URL (the control plane's origin, https://host[:port])"
  fi
  check_origin MODELFORGE_AGENT_CONTROL_PLANE_URL "$CONTROL_PLANE_URL"
  if [ -z "$STATE_DIR" ]; then
    die 2 "$env_file does not set MODELFORGE_AGENT_STATE_VOLUME (the host directory that keeps the node's identity)"
  fi
  if [[ $STATE_DIR != /* ]]; then
    die 2 "MODELFORGE_AGENT_STATE_VOLUME must be an absolute path"
  fi
  if [ "$NO_CONTAINER" = 1 ]; then
    if [ ! -d "$STATE_DIR" ]; then
      die 2 "MODELFORGE_AGENT_STATE_VOLUME: $STATE_DIR is not a directory. Create it on durable storage for the user that runs the agent: install -d -m 0700 '$STATE_DIR'"
    fi
    if [ -n "$CA_CERT" ] && { [ ! -f "$CA_CERT" ] || [ ! -r "$CA_CERT" ]; }; then
      die 2 "MODELFORGE_AGENT_CA_CERT_PATH: $CA_CERT is not a readable file"
    fi
    return 0
  fi
  if [ ! -d "$STATE_DIR" ]; then
    die 2 "MODELFORGE_AGENT_STATE_VOLUME: $STATE_DIR is not a directory. Create it on durable storage for the agent's user: sudo install -d -m 0700 -o $AGENT_UID -g $AGENT_UID '$STATE_DIR'"
  fi
  owner=$(stat -c %u "$STATE_DIR")
  if [ "$owner" != "$AGENT_UID" ]; then
    say "warning: $STATE_DIR is owned by uid $owner; the agent runs as uid $AGENT_UID and must be able to write it (sudo chown $AGENT_UID:$AGENT_UID '$STATE_DIR')"
  fi
  AGENT_FILE=docker-compose.node-agent.yml
  if [ "$ACCELERATOR_MODE" = cpu ]; then
    AGENT_FILE=docker-compose.node-agent.cpu.yml # no GPU reserved
  fi
  COMPOSE=(compose -f "$ROOT/docker-compose.yml" -f "$ROOT/$AGENT_FILE")
  if [ -n "$CA_CERT" ]; then
    if [ ! -f "$CA_CERT" ] || [ ! -r "$CA_CERT" ]; then
      die 2 "MODELFORGE_AGENT_CA_CERT_PATH: $CA_CERT is not a readable file"
    fi
    COMPOSE+=(-f "$ROOT/docker-compose.node-agent.private-ca.yml")
  fi
  if [ -z "$IMAGE" ]; then
    IMAGE=$(compose_default_image) || die 1 "docker-compose.node-agent.yml names no default image"
  fi
  last=${IMAGE##*/}
  if [[ $IMAGE != *@sha256:* ]] && { [[ $last != *:* ]] || [[ ${last##*:} == latest ]]; }; then
    die 2 "MODELFORGE_NODE_AGENT_IMAGE=$IMAGE is a floating tag: name the exact release tag (modelforge-node-agent:X.Y.Z) or a registry digest (@sha256:...)"
  fi
}

open_work_dir() {
  umask 077
  WORK=$(mktemp -d --tmpdir modelforge-node-agent.XXXXXXXXXX)
  ENV_TMP="$WORK/agent.env"
  COMPOSE+=(--env-file "$ENV_TMP")
}

# The settings, then the token when there is one. printf is a shell builtin: no process is
# started with the token in its arguments or environment.
write_env_file() {
  local token=${1:-}
  {
    printf '# written by %s for docker compose; removed when it exits\n' "$PROG"
    if [ "${#SETTINGS[@]}" -gt 0 ]; then printf '%s\n' "${SETTINGS[@]}"; fi
    if [ -n "$token" ]; then printf 'MODELFORGE_AGENT_ENROLLMENT_TOKEN=%s\n' "$token"; fi
  } >"$ENV_TMP"
}

# docker ARGS... with its standard output in $WORK/out. Run in the background and waited for:
# bash runs a trap only between commands, so a hanging foreground docker would hold off the
# cleanup; `wait` returns as soon as a signal arrives. Compose reads the env file Compose is
# given (MODELFORGE_AGENT_ENV_FILE, docker-compose.node-agent.yml) from this environment.
run_docker() {
  local status=0
  MODELFORGE_AGENT_ENV_FILE="$ENV_TMP" docker "$@" >"$WORK/out" &
  CHILD=$!
  wait "$CHILD" || status=$?
  CHILD=""
  return "$status"
}

capture_image_id() {
  local status=0
  run_docker image inspect --format '{{.Id}}' "$IMAGE" || status=$?
  if [ "$status" -ne 0 ]; then
    die 1 "image $IMAGE is not on this node: load the release bundle (docker image load -i <bundle>.tar) or set MODELFORGE_NODE_AGENT_IMAGE"
  fi
  IMAGE_ID=""
  read -r IMAGE_ID <"$WORK/out" || true
  if [[ $IMAGE_ID != sha256:* ]]; then
    die 1 "docker image inspect gave no image ID for $IMAGE"
  fi
}

verify_container() {
  local ids=() id running status=0
  run_docker "${COMPOSE[@]}" ps -q node-agent || status=$?
  if [ "$status" -ne 0 ]; then
    die "$status" "docker compose ps failed after the start: check the container with docker ps -a"
  fi
  mapfile -t ids <"$WORK/out"
  if [ "${#ids[@]}" -eq 0 ]; then
    die 1 "Compose created no node-agent container"
  fi
  for id in "${ids[@]}"; do
    run_docker inspect --format '{{.Image}}' "$id" || die 1 "docker inspect $id failed"
    running=""
    read -r running <"$WORK/out" || true
    if [ "$running" != "$IMAGE_ID" ]; then
      # removed, not only stopped: its configuration (docker inspect) holds the env file's settings,
      # the one-time token included when the start script created it
      run_docker rm -f "$id" || true
      die 1 "container $id runs image ${running:-?}, not $IMAGE_ID ($IMAGE, captured before the start): removed it. Load the release bundle again and rerun"
    fi
  done
  say "node-agent is running $IMAGE ($IMAGE_ID) in container ${ids[0]}; follow it with: docker logs -f ${ids[0]}"
}
