#!/bin/bash
# Slurm Epilog for GPU Warden: ends the job's intervals on this node's GPUs.
#
# slurm.conf on every GPU node: Epilog=/etc/slurm/gpuwarden-epilog.sh (beside prolog.sh and
# PrologFlags=Alloc; see docs/deploy.md). The job itself ends once every node has ended its part.
# Settings and time bound as in prolog.sh; never fails, logs one line when the end was not
# recorded.
set -u
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ENV_FILE="${GPUWARDEN_ENV_FILE:-/etc/gpuwarden/agent.env}"
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
URL="${GPUWARDEN_CENTRAL_URL:-http://127.0.0.1:8000}"
TOKEN="${GPUWARDEN_AGENT_TOKEN:-}"
BUDGET="${GPUWARDEN_SLURM_TIMEOUT_SECONDS:-4}"
[[ $BUDGET =~ ^[1-9][0-9]?$ ]] || BUDGET=4 # whole seconds, 1-99
JOB="slurm:${SLURM_JOB_ID:-?}"

log() { # syslog where there is one, else stderr
    { [ -S /dev/log ] && logger -t gpuwarden-epilog -- "$*" 2>/dev/null; } || echo "gpuwarden-epilog: $*" >&2
}
fail() { log "end of job $JOB not recorded: $*"; exit 0; }

[ -n "${SLURM_JOB_GPUS:-}${CUDA_VISIBLE_DEVICES:-}" ] || exit 0 # no GPU of this node
[ -n "$TOKEN" ] || fail "no GPUWARDEN_AGENT_TOKEN (set it in $ENV_FILE)"

# Token through --config on stdin, status through -w: see prolog.sh.
out=$(printf 'header = "Authorization: Bearer %s"\n' "$TOKEN" |
    curl -sS --config - --connect-timeout "$((BUDGET > 2 ? 2 : BUDGET))" --max-time "$BUDGET" \
        -X PATCH "$URL/api/v1/jobs/$JOB" -H "Content-Type: application/json" \
        --data "{\"ended_at\":\"$(date -u +%Y-%m-%dT%H:%M:%SZ)\"}" -w '\n%{http_code}' 2>&1)
code=${out##*$'\n'}
case $code in
    2??) exit 0 ;;
    *) fail "HTTP $code $(tr '\n' ' ' <<< "${out%$'\n'*}" | cut -c1-300)" ;;
esac
