#!/usr/bin/env bash
set +x # first of all: the enrollment token passes through this shell; never trace it, even under bash -x
# node-agent-start.sh [--no-container] ENV_FILE: start a node's agent with its one-time enrollment
# token (the seed's start command; run it from the repository, in Bash).
#
# ENV_FILE is the node's .env of non-secret settings (.env.example). The token is read from the
# terminal without echo, or from standard input when that is not a terminal; it is never an
# argument, never in the environment of a process, never in a log. The script:
#   1. checks ENV_FILE, the state directory, the CA file when one is set, and that the image is
#      on this node, capturing its local image ID;
#   2. reads the token, and writes it with the settings to a temporary env file (mode 0600, in a
#      mode-0700 folder) that Compose passes to the container (MODELFORGE_AGENT_ENV_FILE);
#   3. docker compose -f docker-compose.yml -f docker-compose.node-agent.yml
#        [-f docker-compose.node-agent.private-ca.yml] --env-file TMP
#        up -d --no-build --pull never node-agent
#      (the private-CA file when ENV_FILE sets MODELFORGE_AGENT_CA_CERT_PATH);
#   4. checks that the created container runs the captured image ID;
#   and removes the temporary folder on every exit: success, error, INT, TERM or HUP.
# After the agent enrolled, remove the token from the container: scripts/recreate-node-agent.sh.
#
# --no-container (a development or bare-metal node: a checkout, or the agent's wheels): steps 1
# and 2 the same (no image), then the agent process itself runs in the foreground instead of
# Compose, its settings and token handed over through that same temporary file
# (scripts/_node_agent_process.sh), which is removed as soon as the agent has read it and, with
# its folder, on every exit. Once it has enrolled, scripts/recreate-node-agent.sh --no-container
# restarts it without the token.
#
# Exit status: 0 started; 2 bad arguments or settings (nothing started); 1 or docker's own status
# when docker fails; 130/143/129 when interrupted. With --no-container, the agent's own status
# when it exits by itself.
set +a # allexport (set -a, or SHELLOPTS=allexport from the caller) would export the token to docker
set -euo pipefail
PROG=node-agent-start.sh
# The token's variable: a caller's exported TOKEN would keep its export flag through an assignment
# and hand the token to every docker command's environment. Unset, it is a plain shell variable.
unset TOKEN
TOKEN=""
NO_CONTAINER=0
if [ "${1:-}" = --no-container ]; then
  NO_CONTAINER=1
  shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/_node_agent_compose.sh"
source "$(dirname "${BASH_SOURCE[0]}")/_node_agent_process.sh"

#: what an enrollment token looks like (modelforge_protocol.credentials.ENROLLMENT_TOKEN_RE)
TOKEN_SHAPE='^mfe\.enr_[0-9a-f]{32}\.[A-Za-z0-9_-]{43}$'

usage() {
  printf 'usage: scripts/node-agent-start.sh [--no-container] ENV_FILE\n' >&2
  printf '  ENV_FILE: the node'\''s .env of non-secret settings; the enrollment token is read from the\n' >&2
  printf '  terminal (hidden), or from standard input when that is not a terminal\n' >&2
  printf '  --no-container: run the agent process (this checkout'\''s .venv, or the one installed) instead of Compose\n' >&2
  exit 2
}

# Sets TOKEN. Whitespace is dropped (a pasted token may carry a space or a carriage return).
read_token() {
  TOKEN=""
  if [ -t 0 ]; then
    IFS= read -rs -p "Enrollment token (input hidden): " TOKEN || true
    printf '\n' >&2
  else
    IFS= read -r TOKEN || true
  fi
  TOKEN=${TOKEN//[[:space:]]/}
  if [ -z "$TOKEN" ]; then
    die 2 "no enrollment token given: paste it at the prompt, or pipe it on standard input"
  fi
  if ! [[ $TOKEN =~ $TOKEN_SHAPE ]]; then
    TOKEN=""
    die 2 "what was given is not an enrollment token (mfe.enr_<32 hex>.<secret>); nothing was started"
  fi
}

drop_environment_settings

if [ "$#" -ne 1 ] || [ -z "$1" ]; then
  usage
fi
ENV_FILE=$1
read_env_file "$ENV_FILE"
if [ "$TOKEN_LINE" -ne 0 ]; then
  die 2 "$ENV_FILE line $TOKEN_LINE holds MODELFORGE_AGENT_ENROLLMENT_TOKEN: delete that line (the .env holds no secret; this script asks for the token)"
fi
check_settings "$ENV_FILE"
if [ "$NO_CONTAINER" = 1 ]; then
  find_agent_command
  install_traps
  open_work_dir
  read_token
  write_env_file "$TOKEN"
  TOKEN=""
  say "once the agent has enrolled (its \"enrolled as node_...\" line), restart it without the token: bash scripts/recreate-node-agent.sh --no-container $ENV_FILE"
  status=0
  run_agent || status=$?
  exit "$status"
fi
install_traps
open_work_dir
capture_image_id
read_token
write_env_file "$TOKEN"
TOKEN=""
status=0
run_docker "${COMPOSE[@]}" up -d --no-build --pull never node-agent || status=$?
if [ "$status" -ne 0 ]; then
  die "$status" "docker compose up failed (exit $status); the temporary env file is removed"
fi
verify_container
