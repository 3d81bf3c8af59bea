#!/bin/bash
# Slurm Epilog for GPU Warden: ends the job's intervals on this node's GPUs.
#
# slurm.conf on every GPU node: Epilog=/etc/slurm/gpuwarden-epilog.sh (beside prolog.sh and
# PrologFlags=Alloc; see docs/deploy.md). The job itself ends once every node has ended its part.
# Settings and time bound as in prolog.sh, and:
#   GPUWARDEN_JOB_END_DIR (/var/lib/gpuwarden-agent/job-ends)  the node agent's job-end folder
#   GPUWARDEN_SLURM_ADMIN_COMMENT=yes   write the job's verdict (cost, waste, top cause, fix,
#                                       link) into its AdminComment, where sacct shows it
#                                       (needs slurmdbd; off by default: see below)
#
# The end goes through the node agent's spool, so a central outage, a killed epilog or a slow
# answer does not lose it: the end is first written to the agent's job-end folder (one small
# file, written whole then renamed), then sent; a file that central took is removed, and the
# agent ships whatever is left from its spool, retrying until central takes it. Never fails the
# job; logs one line when the end is left to the agent, or could not be recorded at all.
#
# AdminComment: once central took the end, the epilog asks it for the job's verdict as of then
# (GET /api/v1/verdicts/<id>: one line of printable ASCII, no quotes or '|') and stores it with
# `sacctmgr -i modify job where jobid=<id> set AdminComment=<verdict>` (the database's copy,
# which sacct reads). Not scontrol: Slurm 22.05 refuses `scontrol update AdminComment=` for a
# job whose epilog runs (COMPLETING) or that ended ("Job has already finished"). The verdict is
# passed as one argument, never through a shell; the GET and sacctmgr share the epilog's one
# time bound with the end, and either failing leaves AdminComment as it was.
set -u
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ENV_FILE="${GPUWARDEN_ENV_FILE:-/etc/gpuwarden/agent.env}"
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
URL="${GPUWARDEN_CENTRAL_URL:-http://127.0.0.1:8000}"
TOKEN="${GPUWARDEN_AGENT_TOKEN:-}"
BUDGET="${GPUWARDEN_SLURM_TIMEOUT_SECONDS:-4}"
[[ $BUDGET =~ ^[1-9][0-9]?$ ]] || BUDGET=4 # whole seconds, 1-99
END_DIR="${GPUWARDEN_JOB_END_DIR:-/var/lib/gpuwarden-agent/job-ends}"
JOB="slurm:${SLURM_JOB_ID:-?}"
deadline=$((SECONDS + BUDGET))

log() { # syslog where there is one, else stderr
    { [ -S /dev/log ] && logger -t gpuwarden-epilog -- "$*" 2>/dev/null; } || echo "gpuwarden-epilog: $*" >&2
}
json_str() { # a JSON string literal of $1
    local s=${1//\\/\\\\}
    s=${s//\"/\\\"}
    printf '"%s"' "$s"
}

[ -n "${SLURM_JOB_GPUS:-}${CUDA_VISIBLE_DEVICES:-}" ] || exit 0 # no GPU of this node
ended_at=$(date -u +%Y-%m-%dT%H:%M:%SZ)

# 1. Hand the end to the agent: it survives whatever happens to the request below.
file="$END_DIR/${JOB//[^A-Za-z0-9_.-]/_}.json"
tmp="$END_DIR/.${JOB//[^A-Za-z0-9_.-]/_}.$$"
spooled=no
if mkdir -p "$END_DIR" 2>/dev/null &&
    printf '{"job_id":%s,"ended_at":"%s"}\n' "$(json_str "$JOB")" "$ended_at" > "$tmp" 2>/dev/null &&
    mv -f "$tmp" "$file" 2>/dev/null; then
    spooled=yes
else
    rm -f "$tmp" 2>/dev/null
fi
left() { # what happens when central did not take the end now
    if [ $spooled = yes ]; then
        log "end of job $JOB left to the agent ($file): $*"
    else
        log "end of job $JOB not recorded: $* (and $END_DIR is not writable)"
    fi
    exit 0
}

left_s() { # whole seconds left of the budget, the partial second under way not counted
    echo $((deadline - SECONDS - 1))
}
admin_comment() { # 3. the verdict into the job's AdminComment, where asked for and time allows
    [ "${GPUWARDEN_SLURM_ADMIN_COMMENT:-no}" = yes ] || return 0
    [[ ${SLURM_JOB_ID:-} =~ ^[0-9]+$ ]] || return 0 # sacctmgr selects a job by its number
    local t verdict out try
    t=$(left_s)
    [ "$t" -ge 1 ] || { log "job $JOB: no time left for its AdminComment"; return 0; }
    verdict=$(printf 'header = "Authorization: Bearer %s"\n' "$TOKEN" |
        curl -sS --fail --config - --connect-timeout 1 --max-time "$t" \
            "$URL/api/v1/verdicts/$JOB" 2>&1) ||
        { log "job $JOB: no verdict for its AdminComment: $(tr '\n' ' ' <<< "$verdict" | cut -c1-200)"; return 0; }
    # Central's promise, checked all the same: one line of printable ASCII, no quote or '|'.
    [[ $verdict =~ ^gpuwarden:\ [\ -~]{1,300}$ && $verdict != *[\"\'\|\\]* ]] ||
        { log "job $JOB: unexpected verdict, AdminComment left as it was"; return 0; }
    for try in 1 2; do # a second try where slurmdbd has not got the job's record yet
        t=$(left_s)
        [ "$t" -ge 1 ] || { log "job $JOB: no time left for its AdminComment"; return 0; }
        out=$(timeout "$t" sacctmgr -i modify job where "jobid=$SLURM_JOB_ID" set "AdminComment=$verdict" 2>&1)
        [[ $out == *"Modified jobs"* ]] && return 0
        [ "$try" = 1 ] && [[ $out == *"Nothing modified"* ]] && sleep 1
    done
    log "job $JOB: AdminComment not written: $(tr '\n' ' ' <<< "$out" | cut -c1-200)"
    return 0
}

# 2. Send it now, so the job's end shows at once when central is up.
[ -n "$TOKEN" ] || left "no GPUWARDEN_AGENT_TOKEN (set it in $ENV_FILE)"
# Token through --config on stdin, status through -w: see prolog.sh.
out=$(printf 'header = "Authorization: Bearer %s"\n' "$TOKEN" |
    curl -sS --config - --connect-timeout "$((BUDGET > 2 ? 2 : BUDGET))" --max-time "$BUDGET" \
        -X PATCH "$URL/api/v1/jobs/$JOB" -H "Content-Type: application/json" \
        --data "{\"ended_at\":\"$ended_at\"}" -w '\n%{http_code}' 2>&1)
code=${out##*$'\n'}
case $code in
    2?? | 404) # taken, or a job central never registered: nothing for the agent to send
        rm -f "$file"
        [ "$code" = 404 ] && log "end of job $JOB: central does not know the job (its prolog failed?)"
        [ "$code" = 404 ] || admin_comment
        exit 0
        ;;
    *) left "HTTP $code $(tr '\n' ' ' <<< "${out%$'\n'*}" | cut -c1-300)" ;;
esac
