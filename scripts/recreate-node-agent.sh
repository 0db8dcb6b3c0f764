#!/usr/bin/env bash
set +x # no secret is read here, but the .env may still hold a token line: never trace it
# recreate-node-agent.sh [--no-container] [ENV_FILE]: after the agent enrolled, recreate its container without the
# one-time enrollment token, keeping the state volume (the node's identity and credential). The
# seed's "container recreation command"; run it from the repository, in Bash. ENV_FILE defaults
# to .env.
#
# It refuses (exit 3) unless the state volume holds an enrolled identity: an identity file whose
# node_id is a non-empty string. The agent writes identity.json with "node_id": null *before* it
# calls enroll (so that a retry is the same enrollment) and fills the node ID in once the control
# plane answered; recreating in between would drop the token the agent still needs. The file is
# read with the agent's own image and user (read-only, no network), because the state directory
# is mode 0700 for uid 65532 and the operator's shell may not be able to look inside.
# Then, with the same checks and clean-up as scripts/node-agent-start.sh:
#   docker compose -f docker-compose.yml -f docker-compose.node-agent.yml
#     [-f docker-compose.node-agent.private-ca.yml] --env-file TMP
#     up -d --force-recreate --no-build --pull never node-agent
# where TMP is a temporary mode-0600 copy of ENV_FILE's settings without any token line.
#
# --no-container: the same for the agent process that scripts/node-agent-start.sh --no-container
# runs. The identity is checked by a Python on this node (the state directory is this user's); then
# the agent running on this state directory (this user's process with that .env's
# MODELFORGE_AGENT_STATE_VOLUME) is stopped, and the agent runs again in the foreground without the
# token (scripts/_node_agent_process.sh). This is also the command for every later start.
#
# Exit status: 0 recreated; 2 bad arguments or settings; 3 no enrolled identity (none yet, not
# enrolled yet, unreadable or not JSON); 1 or docker's own status when docker fails; 130/143/129
# when interrupted.
set -euo pipefail
PROG=recreate-node-agent.sh
NO_CONTAINER=0
if [ "${1:-}" = --no-container ]; then
  NO_CONTAINER=1
  shift
fi
source "$(dirname "${BASH_SOURCE[0]}")/_node_agent_compose.sh"
source "$(dirname "${BASH_SOURCE[0]}")/_node_agent_process.sh"

# The identity check, run by the image's python3 (distroless: no shell) on the file given as its
# argument. Exit 0: enrolled (node_id a non-empty string); 3: no identity file; 4: an identity
# without a node ID (enrollment not finished); 5: unreadable (the reason on stderr); 6: not a JSON
# object. tests/support/fake_docker.py runs this very code on the test's state directory.
IDENTITY_PROBE="import json, os, sys
path = sys.argv[1]
try:
    descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
except FileNotFoundError:
    sys.exit(3)
except OSError as error:
    print('cannot open', path, 'as the agent user:', error.strerror or error, file=sys.stderr)
    sys.exit(5)
try:
    with os.fdopen(descriptor, 'rb') as file:
        raw = file.read(65537)
except OSError as error:
    print('cannot read', path, 'as the agent user:', error.strerror or error, file=sys.stderr)
    sys.exit(5)
try:
    identity = json.loads(raw)
except ValueError:
    sys.exit(6)
if not isinstance(identity, dict):
    sys.exit(6)
node_id = identity.get('node_id')
sys.exit(0 if isinstance(node_id, str) and node_id.strip() else 4)
"

usage() {
  printf 'usage: scripts/recreate-node-agent.sh [--no-container] [ENV_FILE]   (default: .env)\n' >&2
  exit 2
}

require_identity() {
  local status=0 file="$STATE_DIR/$IDENTITY_FILE" wait_for
  run_docker run --rm --network none --read-only --pull never \
    --mount "type=bind,\"source=$STATE_DIR\",target=/state,readonly" \
    "$IMAGE" python3 -c "$IDENTITY_PROBE" "/state/$IDENTITY_FILE" || status=$?
  wait_for="wait for the agent's \"enrolled as node_...\" log line (docker compose -f docker-compose.yml -f docker-compose.node-agent.yml logs node-agent) or for modelforge nodes readiness to show the node, then rerun this script"
  case $status in
    0) ;;
    3) die 3 "$STATE_DIR holds no identity ($IDENTITY_FILE) yet: the enrollment has not been consumed. Start the agent with scripts/node-agent-start.sh, $wait_for" ;;
    4) die 3 "$file has no node ID yet: the enrollment has not been consumed (the agent writes that file before it enrolls), and recreating now would take away the token it still needs. Nothing was recreated; $wait_for" ;;
    5) die 3 "$file could not be read by the agent's user (above): the agent could not use it either. Nothing was recreated; fix the state directory's owner and modes (uid $AGENT_UID, 0700, the file 0600)" ;;
    6) die 3 "$file is not a JSON object (corrupt?): the agent refuses it too. Nothing was recreated; see the agent's logs (docker compose ... logs node-agent) and restore the file from backup" ;;
    *) die 1 "could not look for the identity in $STATE_DIR with $IMAGE (exit $status)" ;;
  esac
}

drop_environment_settings

if [ "$#" -gt 1 ]; then
  usage
fi
ENV_FILE=${1:-.env}
read_env_file "$ENV_FILE"
if [ "$TOKEN_LINE" -ne 0 ]; then
  say "warning: $ENV_FILE line $TOKEN_LINE holds MODELFORGE_AGENT_ENROLLMENT_TOKEN: left out of the new container; delete that line"
fi
check_settings "$ENV_FILE"
if [ "$NO_CONTAINER" = 1 ]; then
  find_agent_command
  require_identity_here
  install_traps
  open_work_dir
  write_env_file
  stop_agents_on_state_dir
  status=0
  run_agent || status=$?
  exit "$status"
fi
install_traps
open_work_dir
capture_image_id
require_identity
write_env_file
status=0
run_docker "${COMPOSE[@]}" up -d --force-recreate --no-build --pull never node-agent || status=$?
if [ "$status" -ne 0 ]; then
  die "$status" "docker compose up failed (exit $status)"
fi
verify_container
