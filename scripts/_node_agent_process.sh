# Sourced by scripts/node-agent-start.sh and scripts/recreate-node-agent.sh for --no-container,
# after _node_agent_compose.sh, never run alone: the agent as a process of this user, for a
# development or bare-metal node, instead of a container.
#
# - find_agent_command: the agent's console script: MODELFORGE_NODE_AGENT_COMMAND from the .env
#   (an absolute path), else the checkout's .venv/bin/modelforge-node-agent, else the one on PATH.
# - run_agent: the agent in the foreground, a child of this script, with the settings of the
#   temporary env file (mode 0600, in the mode-0700 work folder) as its environment. The child
#   reads that file line by line (never sources it), exports each setting with the shell's own
#   `export` (no process is started with a value in its arguments), removes the file and execs the
#   agent; the EXIT trap removes the folder in any case. INT, TERM and HUP stop the agent (TERM)
#   and exit 130/143/129; else the script exits with the agent's own status.
# - stop_agents_on_state_dir: TERM (then waits up to 30 s for) this user's agent processes whose
#   MODELFORGE_AGENT_STATE_VOLUME is this .env's: the one node-agent-start.sh --no-container runs.
# - require_identity_here: the recreation's identity check, run by a Python on this node.

AGENT_COMMAND=""

find_agent_command() {
  local configured=""
  local line
  for line in ${SETTINGS[@]+"${SETTINGS[@]}"}; do
    if [[ $line =~ ^MODELFORGE_NODE_AGENT_COMMAND=(.*)$ ]]; then configured=${BASH_REMATCH[1]}; fi
  done
  if [ -n "$configured" ]; then
    if [[ $configured != /* ]] || [ ! -x "$configured" ]; then
      die 2 "MODELFORGE_NODE_AGENT_COMMAND=$configured is not an executable file given by its absolute path"
    fi
    AGENT_COMMAND=$configured
  elif [ -x "$ROOT/.venv/bin/modelforge-node-agent" ]; then
    AGENT_COMMAND="$ROOT/.venv/bin/modelforge-node-agent"
  elif AGENT_COMMAND=$(command -v modelforge-node-agent); then
    :
  else
    die 2 "modelforge-node-agent is not installed: run scripts/dev-up once in this checkout (it creates .venv), install the agent's wheels (docs/NODE_AGENT.md), or set MODELFORGE_NODE_AGENT_COMMAND in the .env"
  fi
}

run_agent() {
  local status=0
  say "starting $AGENT_COMMAND (no container; Ctrl-C stops it)"
  (
    trap - EXIT INT TERM HUP
    while IFS= read -r line; do
      if [[ $line =~ ^([A-Za-z_][A-Za-z0-9_]*)=(.*)$ ]]; then
        value=${BASH_REMATCH[2]}
        name=${BASH_REMATCH[1]}
        if [[ $value =~ ^\"(.*)\"$ || $value =~ ^\'(.*)\'$ ]]; then value=${BASH_REMATCH[1]}; fi
        export "$name=$value"
      fi
    done <"$ENV_TMP"
    rm -f -- "$ENV_TMP"
    exec "$AGENT_COMMAND"
  ) &
  CHILD=$!
  wait "$CHILD" || status=$?
  CHILD=""
  return "$status"
}

# The PIDs of this user's processes that run the agent with this state directory.
agents_on_state_dir() {
  local entry pid
  for entry in /proc/[0-9]*; do
    pid=${entry#/proc/}
    if [ "$pid" = "$$" ] || [ "$pid" = "$BASHPID" ] || [ ! -O "$entry" ]; then continue; fi
    # the test reads only; grep prints nothing, so no other setting of that process is seen
    if grep -qzxF -- "MODELFORGE_AGENT_STATE_VOLUME=$STATE_DIR" "$entry/environ" 2>/dev/null \
      && tr '\0' ' ' <"$entry/cmdline" 2>/dev/null | grep -q -- "modelforge-node-agent\|modelforge_node_agent"; then
      printf '%s\n' "$pid"
    fi
  done
}

stop_agents_on_state_dir() {
  local pids=() pid waited=0
  mapfile -t pids < <(agents_on_state_dir)
  if [ "${#pids[@]}" -eq 0 ]; then return 0; fi
  say "stopping the agent running on $STATE_DIR (pid ${pids[*]})"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  for pid in "${pids[@]}"; do
    while kill -0 "$pid" 2>/dev/null; do
      if [ "$waited" -ge 300 ]; then die 1 "the agent (pid $pid) did not stop within 30 s: stop it, then rerun"; fi
      sleep 0.1
      waited=$((waited + 1))
    done
  done
}

require_identity_here() {
  local status=0 python file="$STATE_DIR/$IDENTITY_FILE"
  python="$(dirname "$AGENT_COMMAND")/python3"
  if [ ! -x "$python" ]; then python=$(command -v python3) || die 1 "python3 is needed to read $file"; fi
  "$python" -c "$IDENTITY_PROBE" "$file" || status=$?
  case $status in
    0) ;;
    3) die 3 "$STATE_DIR holds no identity ($IDENTITY_FILE) yet: the enrollment has not been consumed. Start the agent with scripts/node-agent-start.sh --no-container, wait for its \"enrolled as node_...\" log line, then rerun this script" ;;
    4) die 3 "$file has no node ID yet: the enrollment has not been consumed, and restarting now would take away the token the agent still needs. Nothing was restarted" ;;
    5) die 3 "$file could not be read (above): fix the state directory's owner and modes (this user, 0700, the file 0600)" ;;
    6) die 3 "$file is not a JSON object (corrupt?): the agent refuses it too. Nothing was restarted" ;;
    *) die 1 "could not look for the identity in $STATE_DIR with $python (exit $status)" ;;
  esac
}
