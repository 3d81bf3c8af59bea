#!/usr/bin/env bash
# Slurm Prolog for GPU Warden: registers the job and this node's GPUs with the central service.
#
# Install on every GPU node (slurm.conf: Prolog=/etc/slurm/prolog.d/gpuwarden-prolog.sh).
# Reads GPUWARDEN_CENTRAL_URL and GPUWARDEN_AGENT_TOKEN (the node's agent token) from
# /etc/gpuwarden/agent.env unless they are already set. It never fails the job: a prolog that
# exits non-zero drains the node, and cost tracking is not worth that.
set -u

ENV_FILE="${GPUWARDEN_ENV_FILE:-/etc/gpuwarden/agent.env}"
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
URL="${GPUWARDEN_CENTRAL_URL:-http://127.0.0.1:8000}"
TOKEN="${GPUWARDEN_AGENT_TOKEN:-}"
NVIDIA_SMI="${GPUWARDEN_NVIDIA_SMI:-nvidia-smi}"

log() { logger -t gpuwarden-prolog -- "$*" 2>/dev/null || echo "gpuwarden-prolog: $*" >&2; }
json_str() { # a JSON string literal of $1
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    s=${s//$'\t'/\\t}
    s=${s//$'\n'/\\n}
    printf '"%s"' "$s"
}

[ -n "$TOKEN" ] || { log "no GPUWARDEN_AGENT_TOKEN; job ${SLURM_JOB_ID:-?} not registered"; exit 0; }
[ -n "${SLURM_JOB_GPUS:-}" ] || exit 0  # a job without GPUs on this node costs nothing here

uuids=$("$NVIDIA_SMI" --query-gpu=uuid --format=csv,noheader -i "$SLURM_JOB_GPUS" 2>/dev/null)
gpus=""
while read -r u; do
    [ -n "$u" ] && gpus="${gpus:+$gpus,}$(json_str "$u")"
done <<< "$uuids"
[ -n "$gpus" ] || { log "could not map GPUs $SLURM_JOB_GPUS to UUIDs"; exit 0; }

started_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
body=$(printf '{"id":%s,"user":%s,"team":%s,"project":%s,"labels":{"partition":%s},"gpus":[%s],"started_at":"%s"}' \
    "$(json_str "slurm:${SLURM_JOB_ID}")" \
    "$(json_str "${SLURM_JOB_USER:-}")" \
    "$(json_str "${SLURM_JOB_ACCOUNT:-}")" \
    "$(json_str "${SLURM_JOB_NAME:-}")" \
    "$(json_str "${SLURM_JOB_PARTITION:-}")" \
    "$gpus" "$started_at")

if ! out=$(curl -sS --fail-with-body --max-time 5 --retry 2 --retry-delay 1 \
        -X POST "$URL/api/v1/jobs" \
        -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
        --data "$body" 2>&1); then
    log "registering job $SLURM_JOB_ID failed: $out"
fi
exit 0
