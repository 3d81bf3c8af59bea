#!/usr/bin/env bash
# Slurm Epilog for GPU Warden: ends the job's intervals on this node's GPUs.
#
# Install on every GPU node (slurm.conf: Epilog=/etc/slurm/epilog.d/gpuwarden-epilog.sh).
# The job itself ends once every node has ended its part. Never fails: see prolog.sh.
set -u

ENV_FILE="${GPUWARDEN_ENV_FILE:-/etc/gpuwarden/agent.env}"
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
URL="${GPUWARDEN_CENTRAL_URL:-http://127.0.0.1:8000}"
TOKEN="${GPUWARDEN_AGENT_TOKEN:-}"

log() { logger -t gpuwarden-epilog -- "$*" 2>/dev/null || echo "gpuwarden-epilog: $*" >&2; }

[ -n "$TOKEN" ] || exit 0
[ -n "${SLURM_JOB_GPUS:-}" ] || exit 0

ended_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if ! out=$(curl -sS --fail-with-body --max-time 5 --retry 2 --retry-delay 1 \
        -X PATCH "$URL/api/v1/jobs/slurm:${SLURM_JOB_ID}" \
        -H "Authorization: Bearer $TOKEN" -H "Content-Type: application/json" \
        --data "{\"ended_at\":\"$ended_at\"}" 2>&1); then
    log "ending job $SLURM_JOB_ID failed: $out"
fi
exit 0
