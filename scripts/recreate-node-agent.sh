#!/usr/bin/env bash
set +x # no secret is read here, but the .env may still hold a token line: never trace it
# recreate-node-agent.sh [ENV_FILE]: after the agent enrolled, recreate its container without the
# one-time enrollment token, keeping the state volume (the node's identity and credential). The
# seed's "container recreation command"; run it from the repository, in Bash. ENV_FILE defaults
# to .env.
#
# It refuses (exit 3) while the state volume holds no identity yet: enrollment has not been
# consumed, and an agent without token or identity could not start. The identity is looked for
# with the agent's own image and user (read-only, no network), because the state directory is
# mode 0700 for uid 65532 and the operator's shell may not be able to look inside.
# Then, with the same checks and clean-up as scripts/node-agent-start.sh:
#   docker compose -f docker-compose.yml -f docker-compose.node-agent.yml
#     [-f docker-compose.node-agent.private-ca.yml] --env-file TMP
#     up -d --force-recreate --no-build --pull never node-agent
# where TMP is a temporary mode-0600 copy of ENV_FILE's settings without any token line.
#
# Exit status: 0 recreated; 2 bad arguments or settings; 3 no identity yet; 1 or docker's own
# status when docker fails; 130/143/129 when interrupted.
set -euo pipefail
PROG=recreate-node-agent.sh
source "$(dirname "${BASH_SOURCE[0]}")/_node_agent_compose.sh"

# Exit 0: an identity file is there; 3: none; anything else: the volume could not be read.
IDENTITY_PROBE="import os, sys
try:
    os.lstat('/state/$IDENTITY_FILE')
except FileNotFoundError:
    sys.exit(3)
except OSError as error:
    sys.exit('cannot read the state volume as the agent user: ' + (error.strerror or str(error)))
"

usage() {
  printf 'usage: scripts/recreate-node-agent.sh [ENV_FILE]   (default: .env)\n' >&2
  exit 2
}

require_identity() {
  local status=0
  run_docker run --rm --network none --read-only --pull never \
    --mount "type=bind,\"source=$STATE_DIR\",target=/state,readonly" \
    "$IMAGE" python3 -c "$IDENTITY_PROBE" || status=$?
  case $status in
    0) ;;
    3) die 3 "$STATE_DIR holds no identity ($IDENTITY_FILE) yet: the enrollment has not been consumed. Start the agent with scripts/node-agent-start.sh and recreate it once it has enrolled" ;;
    *) die 1 "could not look for the identity in $STATE_DIR with $IMAGE (exit $status)" ;;
  esac
}

for _name in $(compgen -e); do
  case $_name in MODELFORGE_*) unset "$_name" ;; esac
done
unset _name

if [ "$#" -gt 1 ]; then
  usage
fi
ENV_FILE=${1:-.env}
read_env_file "$ENV_FILE"
if [ "$TOKEN_LINE" -ne 0 ]; then
  say "warning: $ENV_FILE line $TOKEN_LINE holds MODELFORGE_AGENT_ENROLLMENT_TOKEN: left out of the new container; delete that line"
fi
check_settings "$ENV_FILE"
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
