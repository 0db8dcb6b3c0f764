#!/usr/bin/env bash
# gpu-check.sh: prove the node agent's NVIDIA path on a machine that really has an NVIDIA GPU.
#
# Unit tests cover the preflight with a fake probe, and on a machine without a GPU they can only show
# that NVML is refused. This script exercises the real driver, end to end:
#
#   1. the bounded preflight, `python -m modelforge_node_agent.main --preflight --json`, in nvidia
#      mode: it must exit 0 and list every GPU with telemetry (exit 3 = preflight failed);
#   1b. every per-GPU health signal (telemetry, the field-values batch: ECC, row remapping, the
#      recovery action; clock-event reasons, NVLink, MIG) with the latency of each NVML call, the grade
#      they give, and the Xid event set's registration and a timed wait
#      (`python -m modelforge_node_agent.gpu_report`);
#   2. when the runtime worker is installed: the worker with MODELFORGE_WORKER_DEVICE=cuda on a unix
#      socket in a temporary folder, one `ocr` job of a rendered PNG through its API; it must report
#      device "cuda" and read the text (GPU_CHECK_WORKER_DEVICE=auto accepts the CPU, to see why not);
#      then, on every GPU at once, GPU_CHECK_IMAGES (default 10) `ocr` jobs each in that GPU's own
#      slot (`gpu_uuid`), printing images/s per GPU;
#   3. when the `modelforge` command line is installed: a local control plane on 127.0.0.1 (a free
#      port chosen here), a one-time enrollment token minted with the admin token, the agent in
#      nvidia mode enrolling with a fresh state volume and heartbeating every 2 s for ~10 s, and
#      GET /api/v1/admin/nodes, which must show one online node whose inventory and telemetry cover
#      the same GPUs the preflight found.
#
# It stops everything it started, by PID, and removes its temporary folder (the agent's credential
# lives there). Exit status: 0 when every step passed, 1 otherwise. Secrets are never printed.
#
# Usage: scripts/gpu-check.sh            (PYTHON=... to choose the interpreter; default .venv's)
#        GPU_CHECK_AGENT_SECONDS=20 scripts/gpu-check.sh
set -euo pipefail
set +x # the admin and enrollment tokens pass through this shell's variables

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$ROOT/.venv/bin/python" ]; then PYTHON="$ROOT/.venv/bin/python"; else PYTHON=python3; fi
fi
AGENT_SECONDS="${GPU_CHECK_AGENT_SECONDS:-10}"
IMAGES="${GPU_CHECK_IMAGES:-10}"
WORKER_DEVICE="${GPU_CHECK_WORKER_DEVICE:-cuda}"
WORK="$(mktemp -d)"
CP_PID=""
AGENT_PID=""
WORKER_PID=""

say() { echo "gpu-check: $*"; }
die() {
  echo "gpu-check: FAILED: $*" >&2
  exit 1
}

# Stop one process we started: SIGTERM, up to 10 s to exit, then SIGKILL. Sets STOPPED_RC to its
# exit status (not printed: `wait` only works in this shell, not in a $(...) subshell).
STOPPED_RC=0
stop_pid() {
  local pid="$1"
  STOPPED_RC=0
  [ -n "$pid" ] || return 0
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then kill -KILL "$pid" 2>/dev/null || true; fi
  fi
  wait "$pid" 2>/dev/null || STOPPED_RC=$?
}

cleanup() {
  local rc=$?
  stop_pid "$AGENT_PID"
  stop_pid "$WORKER_PID"
  stop_pid "$CP_PID"
  if [ "$rc" -ne 0 ]; then
    for log in "$WORK/agent.log" "$WORK/worker.log" "$WORK/local-up.log"; do
      if [ -s "$log" ]; then
        echo "--- last lines of $(basename "$log")" >&2
        tail -n 30 "$log" >&2
      fi
    done
  fi
  rm -rf "$WORK"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A small JSON query: python3 -c CODE FILE, where CODE reads `doc` and prints its answer.
json_query() {
  "$PYTHON" -c "import json, sys; doc = json.load(open(sys.argv[1])); $1" "$2"
}

# --- 1. the preflight ----------------------------------------------------------------------------

say "preflight (nvidia mode) with $PYTHON"
set +e
MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia \
  "$PYTHON" -m modelforge_node_agent.main --preflight --json >"$WORK/preflight.json" 2>"$WORK/preflight.err"
PREFLIGHT_RC=$?
set -e
cat "$WORK/preflight.json"
cat "$WORK/preflight.err" >&2
[ "$PREFLIGHT_RC" -eq 0 ] || die "preflight exited $PREFLIGHT_RC (3 = preflight failed; the code above says why)"
json_query 'assert doc.get("ok", True) is True and doc["gpus"] and len(doc["telemetry"]) == len(doc["gpus"]), "no GPUs or missing telemetry"' \
  "$WORK/preflight.json" || die "the preflight JSON does not list GPUs with telemetry for each"
say "preflight passed"

say "every health signal per GPU, with each NVML call's latency"
"$PYTHON" -m modelforge_node_agent.gpu_report || die "the GPU health report failed (exit 3: NVML did not answer)"

# --- 2. one OCR job on the runtime worker, on CUDA -------------------------------------------------

if "$PYTHON" -c "import modelforge_runtime_worker" 2>/dev/null; then
  say "runtime worker: one ocr job with MODELFORGE_WORKER_DEVICE=$WORKER_DEVICE"
  MODELFORGE_WORKER_LISTEN="unix://$WORK/worker.sock" \
    MODELFORGE_WORKER_ARTIFACT_ROOT="$WORK/artifacts" \
    MODELFORGE_WORKER_QUARANTINE_ROOT="$WORK/quarantine" \
    MODELFORGE_WORKER_DEVICE="$WORKER_DEVICE" PYTHONUNBUFFERED=1 \
    "$PYTHON" -m modelforge_runtime_worker.main >"$WORK/worker.log" 2>&1 </dev/null &
  WORKER_PID=$!
  for _ in $(seq 600); do # up to 60 s
    [ -S "$WORK/worker.sock" ] && break
    kill -0 "$WORKER_PID" 2>/dev/null || die "the runtime worker exited before it listened (see its log)"
    sleep 0.1
  done
  [ -S "$WORK/worker.sock" ] || die "the runtime worker did not listen within 60 s"
  "$PYTHON" - "$WORK/worker.sock" "$WORKER_DEVICE" "$WORK/preflight.json" "$IMAGES" <<'PY' || die "the ocr job did not run as expected on the worker"
import base64, io, json, re, sys, threading, time
from PIL import Image, ImageDraw, ImageFont
from modelforge_runtime_worker.client import WorkerClient

socket_path, wanted = sys.argv[1], sys.argv[2]
client = WorkerClient(f"unix://{socket_path}", timeout=300)
status = client.status().body
print(json.dumps({"healthy": status["healthy"], "capabilities": status["capabilities"]}, indent=2))
image = Image.new("RGB", (900, 120), "white")
ImageDraw.Draw(image).text((20, 30), "MODELFORGE 2026", fill="black", font=ImageFont.load_default(size=56))
png = io.BytesIO()
image.save(png, "PNG")
answer = client.run("ocr", {"image_base64": base64.b64encode(png.getvalue()).decode()})
assert answer.status == 200, f"HTTP {answer.status}: {answer.body}"
result = answer.body["result"]
text = " ".join(line["text"] for line in result["lines"])
print(f"device: {result['device']}  duration_ms: {result['duration_ms']}  text: {text!r}")
assert "MODELFORGE2026" in re.sub(r"\s+", "", text).upper(), "the text was not read"
assert wanted != "cuda" or result["device"] == "cuda", "the job ran on the CPU (install onnxruntime-gpu in this venv)"

# one slot per GPU, all at once: each GPU's jobs run in its own slot process (CUDA_VISIBLE_DEVICES=<uuid>)
uuids = [gpu["uuid"] for gpu in json.load(open(sys.argv[3]))["gpus"]]
images = int(sys.argv[4])
if "gpu_slots" not in status.get("features", []):
    print("the worker does not list gpu_slots: no per-GPU run")
    sys.exit(0)
payload = {"image_base64": base64.b64encode(png.getvalue()).decode()}
figures, failures = {}, []

def per_gpu(uuid):
    own = WorkerClient(f"unix://{socket_path}", timeout=300)
    first = own.run("ocr", payload, gpu_uuid=uuid)  # the slot's first job loads the models
    if first.status != 200:
        failures.append(f"{uuid}: HTTP {first.status}: {first.body}")
        return
    started = time.perf_counter()
    for _ in range(images):
        answer = own.run("ocr", payload, gpu_uuid=uuid)
        if answer.status != 200 or (wanted == "cuda" and answer.body["result"]["device"] != "cuda"):
            failures.append(f"{uuid}: HTTP {answer.status}: {answer.body}")
            return
    figures[uuid] = images / (time.perf_counter() - started)

threads = [threading.Thread(target=per_gpu, args=(uuid,)) for uuid in uuids]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
for uuid in uuids:
    if uuid in figures:
        print(f"{uuid}: {figures[uuid]:.2f} images/s ({images} images, its own slot, all GPUs at once)")
assert not failures, failures
PY
  stop_pid "$WORKER_PID"
  WORKER_PID=""
  say "runtime worker passed"
else
  say "the runtime worker is not installed; skipping the ocr check"
fi

# --- 3. enrollment and heartbeats against a local control plane ----------------------------------

MODELFORGE="$(command -v modelforge || true)"
if [ -z "$MODELFORGE" ] && [ -x "$ROOT/.venv/bin/modelforge" ]; then MODELFORGE="$ROOT/.venv/bin/modelforge"; fi
if [ -z "$MODELFORGE" ]; then
  say "the modelforge command line is not installed; skipping the enrollment check"
  exit 0
fi

PORT="$("$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
API="http://127.0.0.1:$PORT"
ADMIN_TOKEN="$("$PYTHON" -c 'import secrets; print(secrets.token_urlsafe(32))')"

say "starting the control plane on $API"
MODELFORGE_ADMIN_TOKEN="$ADMIN_TOKEN" PYTHONUNBUFFERED=1 \
  MODELFORGE_NODE_STALE_AFTER_SECONDS=60 MODELFORGE_NODE_OFFLINE_AFTER_SECONDS=300 \
  "$MODELFORGE" local up --host 127.0.0.1 --port "$PORT" >"$WORK/local-up.log" 2>&1 </dev/null &
CP_PID=$!
for _ in $(seq 600); do # up to 60 s
  grep -q "ready at" "$WORK/local-up.log" && break
  kill -0 "$CP_PID" 2>/dev/null || die "the control plane exited before it was ready"
  sleep 0.1
done
grep -q "ready at" "$WORK/local-up.log" || die "the control plane was not ready within 60 s"

say "minting an enrollment token"
STATUS="$(curl -sS -o "$WORK/enrollment.json" -w '%{http_code}' -X POST \
  -H "X-ModelForge-Admin-Token: $ADMIN_TOKEN" -H "Content-Type: application/json" \
  -d '{"display_name":"gpu-check","expires_in_seconds":300}' \
  "$API/api/v1/admin/node-enrollments")" || die "curl could not reach $API"
[ "$STATUS" = "201" ] || die "minting a token answered HTTP $STATUS"
ENROLLMENT_TOKEN="$(json_query 'print(doc["token"])' "$WORK/enrollment.json")"
rm -f "$WORK/enrollment.json" # it holds the token

say "running the agent in nvidia mode for ${AGENT_SECONDS} s"
STATE_VOLUME="$(mktemp -d "$WORK/state.XXXXXX")"
MODELFORGE_AGENT_CONTROL_PLANE_URL="$API" \
  MODELFORGE_AGENT_ENROLLMENT_TOKEN="$ENROLLMENT_TOKEN" \
  MODELFORGE_AGENT_ACCELERATOR_MODE=nvidia \
  MODELFORGE_AGENT_STATE_VOLUME="$STATE_VOLUME" \
  MODELFORGE_AGENT_HEARTBEAT_INTERVAL_SECONDS=2 \
  PYTHONUNBUFFERED=1 \
  "$PYTHON" -m modelforge_node_agent.main >"$WORK/agent.log" 2>&1 </dev/null &
AGENT_PID=$!
unset ENROLLMENT_TOKEN
for _ in $(seq $((AGENT_SECONDS * 10))); do
  kill -0 "$AGENT_PID" 2>/dev/null || die "the agent exited early (see its log)"
  sleep 0.1
done

say "reading GET /api/v1/admin/nodes"
STATUS="$(curl -sS -o "$WORK/nodes.json" -w '%{http_code}' \
  -H "X-ModelForge-Admin-Token: $ADMIN_TOKEN" "$API/api/v1/admin/nodes")" || die "curl could not reach $API"
[ "$STATUS" = "200" ] || die "listing nodes answered HTTP $STATUS"
json_query '
nodes = doc["nodes"]
assert len(nodes) == 1, f"expected one node, found {len(nodes)}"
node = nodes[0]
print(json.dumps({key: node.get(key) for key in ("node_id", "status", "accelerator_mode", "last_heartbeat_at")}, indent=2))
print(json.dumps(node["telemetry"], indent=2))
status = node["status"]
assert status == "online", f"node status is {status}, not online"
inventory = sorted(gpu["index"] for gpu in node["inventory"]["gpus"])
telemetry = sorted(gpu["index"] for gpu in (node["telemetry"] or {}).get("gpus") or [])
assert inventory, "the node reported no GPUs in its inventory"
assert telemetry == inventory, f"telemetry covers GPUs {telemetry}, inventory lists {inventory}"
' "$WORK/nodes.json" || die "the node does not show the expected inventory and telemetry"
"$PYTHON" -c '
import json, sys
preflight = {gpu["uuid"] for gpu in json.load(open(sys.argv[1]))["gpus"]}
enrolled = {gpu["uuid"] for gpu in json.load(open(sys.argv[2]))["nodes"][0]["inventory"]["gpus"]}
sys.exit(0 if preflight == enrolled else f"preflight found {sorted(preflight)}, the node reported {sorted(enrolled)}")
' "$WORK/preflight.json" "$WORK/nodes.json" || die "the enrolled inventory differs from the preflight's GPUs"

stop_pid "$AGENT_PID"
AGENT_PID=""
[ "$STOPPED_RC" -eq 0 ] || die "the agent exited $STOPPED_RC on SIGTERM (0 = clean stop)"
say "passed: preflight, enrollment, inventory and telemetry for every GPU, clean stop"
