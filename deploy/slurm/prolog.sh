#!/bin/bash
# Slurm Prolog for GPU Warden: registers the job (or allocation) and this node's GPUs with the
# central service, so GPU Warden knows whose job holds which GPU from its first second.
#
# slurm.conf on every GPU node (docs/deploy.md, "Slurm"):
#   Prolog=/etc/slurm/gpuwarden-prolog.sh
#   Epilog=/etc/slurm/gpuwarden-epilog.sh
#   PrologFlags=Alloc    # run at allocation: an salloc that holds GPUs and runs nothing is seen
#
# Settings: the environment, then /etc/gpuwarden/agent.env (GPUWARDEN_ENV_FILE), which wins:
#   GPUWARDEN_CENTRAL_URL, GPUWARDEN_AGENT_TOKEN   the node's agent token
#   GPUWARDEN_SLURM_TIMEOUT_SECONDS (default 4)    the most this script adds to a job's start
#                                                  (whole seconds, 1-99)
#   GPUWARDEN_SLURM_ACCOUNTS (/etc/gpuwarden/slurm-accounts)  lines "account team [project]"
#   GPUWARDEN_SLURM_SCONTROL=yes                   ask scontrol for the comment when Slurm does
#                                                  not pass SLURM_JOB_COMMENT (costs one RPC)
#   GPUWARDEN_SLURM_SHARED_GPUS=yes                this node's GPUs are shared by design
#                                                  (OverSubscribe, time slicing): see below
#   GPUWARDEN_SLURM_SCRIPT_HASH=yes                send the sha256 of the batch script
#                                                  (scontrol write batch_script: one RPC), so
#                                                  a run of a changed script is not compared
#                                                  with the last one (docs/savings.md)
# A job that holds its GPUs alone is sent as "exclusive": central ends any earlier Slurm job
# still open on those GPUs (its epilog was lost: central was down, the node crashed, the epilog
# was killed), which would otherwise share this job's time and bill. Not for GPUs shared by
# design: Slurm shards (SLURM_SHARDS_ON_NODE set) or GPUWARDEN_SLURM_SHARED_GPUS=yes.
# GPUs: the UUIDs in CUDA_VISIBLE_DEVICES where Slurm puts them there (25.11 and later), else the
# device minor numbers of SLURM_JOB_GPUS (/dev/nvidiaN), mapped to UUIDs through
# /proc/driver/nvidia/gpus/<bus>/information ("Device Minor") and nvidia-smi's pci.bus_id; a
# minor number need not equal nvidia-smi's index. team: the job comment's team=, else the
# accounts file, else SLURM_JOB_ACCOUNT; project: the comment's project=, else the accounts file.
#
# It never fails the job (a Prolog that exits non-zero drains the node) and logs one line to
# syslog (stderr without syslog) when the job could not be registered. Labels: partition,
# cluster, the job's name and account, and work=<name> from the comment (runs of one work, for
# proven savings) with the script's sha256 where asked for: the job's work key (docs/savings.md). Needs bash 4, curl 7.29+.
set -u
PATH=${PATH:+$PATH:}/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

ENV_FILE="${GPUWARDEN_ENV_FILE:-/etc/gpuwarden/agent.env}"
# shellcheck disable=SC1090
[ -r "$ENV_FILE" ] && . "$ENV_FILE"
URL="${GPUWARDEN_CENTRAL_URL:-http://127.0.0.1:8000}"
TOKEN="${GPUWARDEN_AGENT_TOKEN:-}"
NVIDIA_SMI="${GPUWARDEN_NVIDIA_SMI:-nvidia-smi}"
NVIDIA_PROC="${GPUWARDEN_NVIDIA_PROC:-/proc/driver/nvidia/gpus}"
ACCOUNTS="${GPUWARDEN_SLURM_ACCOUNTS:-/etc/gpuwarden/slurm-accounts}"
BUDGET="${GPUWARDEN_SLURM_TIMEOUT_SECONDS:-4}"
[[ $BUDGET =~ ^[1-9][0-9]?$ ]] || BUDGET=4 # whole seconds, 1-99
JOB="slurm:${SLURM_JOB_ID:-?}"
deadline=$((SECONDS + BUDGET))

log() { # syslog where there is one, else stderr
    { [ -S /dev/log ] && logger -t gpuwarden-prolog -- "$*" 2>/dev/null; } || echo "gpuwarden-prolog: $*" >&2
}
fail() { log "job $JOB not registered: $*"; exit 0; }
left() { # seconds left of the budget, at least 1
    local l=$((deadline - SECONDS))
    echo $((l < 1 ? 1 : l))
}
json_str() { # a JSON string literal of $1 (every control character escaped: raw, JSON refuses it)
    local s=${1//\\/\\\\} out="" c i
    s=${s//\"/\\\"}
    s=${s//$'\t'/\\t}
    s=${s//$'\r'/\\r}
    s=${s//$'\n'/\\n}
    if [[ $s == *[[:cntrl:]]* ]]; then
        for ((i = 0; i < ${#s}; i++)); do
            c=${s:i:1}
            [[ $c == [[:cntrl:]] ]] && printf -v c '\\u%04x' "'$c"
            out+=$c
        done
        s=$out
    fi
    printf '"%s"' "$s"
}
bus_key() { # a PCI bus id as both nvidia-smi (00000000:18:00.0) and /proc (0000:18:00.0) spell it
    local b=${1,,}
    echo "${b: -12}"
}
expand() { # "0,2-3" -> "0 2 3"
    local part out=""
    for part in ${1//,/ }; do
        if [[ $part =~ ^([0-9]+)-([0-9]+)$ ]]; then
            out+=" $(seq -s ' ' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}")"
        else
            out+=" $part"
        fi
    done
    echo "$out"
}

# The UUIDs of this node's GPUs of the job, one per line.
job_gpu_uuids() {
    local visible="${CUDA_VISIBLE_DEVICES:-}" minors="${SLURM_JOB_GPUS:-}"
    if [[ ",$visible" == *,GPU-* || ",$visible" == *,MIG-* ]]; then
        tr ',' '\n' <<< "$visible"
        return 0
    fi
    [ -n "$minors" ] || minors=$visible
    local smi limit=$(($(left) > 2 ? 2 : $(left)))
    smi=$(timeout -k 1 "$limit" "$NVIDIA_SMI" --query-gpu=index,uuid,pci.bus_id \
        --format=csv,noheader 2>/dev/null) || return 1
    local -A bus_of_minor=() uuid_of_bus=() uuid_of_index=()
    local f minor index uuid bus m
    for f in "$NVIDIA_PROC"/*/information; do
        [ -r "$f" ] || continue
        minor=$(sed -n 's/^Device Minor:[[:space:]]*\([0-9]*\).*/\1/p' "$f")
        [ -n "$minor" ] && bus_of_minor[$minor]=$(bus_key "$(basename "$(dirname "$f")")")
    done
    while IFS=', ' read -r index uuid bus; do
        [ -n "$uuid" ] || continue
        uuid_of_bus[$(bus_key "$bus")]=$uuid
        uuid_of_index[$index]=$uuid
    done <<< "$smi"
    for m in $(expand "$minors"); do
        if [ ${#bus_of_minor[@]} -gt 0 ]; then
            uuid=${uuid_of_bus[${bus_of_minor[$m]:-none}]:-}
        else # no driver /proc (a container): nvidia-smi's index is the best guess left
            uuid=${uuid_of_index[$m]:-}
        fi
        [ -n "$uuid" ] || return 1
        echo "$uuid"
    done
}

# team and project: the job comment's team= / project=, the accounts file, the account.
comment=${SLURM_JOB_COMMENT-}
job_name=${SLURM_JOB_NAME:-}
if { [ -z "${SLURM_JOB_COMMENT+set}" ] || [ -z "$job_name" ]; } &&
    [ "${GPUWARDEN_SLURM_SCONTROL:-no}" = yes ]; then
    # One RPC for both: the comment and the job's name (a Prolog is given neither).
    shown=$(timeout -k 1 1 scontrol show job -o "${SLURM_JOB_ID:-}" 2>/dev/null)
    [ -z "${SLURM_JOB_COMMENT+set}" ] &&
        comment=$(sed -n 's/.* Comment=\(.*\)/\1/p' <<< "$shown" | sed 's/ [A-Z][A-Za-z]*=.*//')
    [ -z "$job_name" ] &&
        job_name=$(sed -n 's/.*JobName=\(.*\)/\1/p' <<< "$shown" | sed 's/ [A-Z][A-Za-z]*=.*//')
fi
account=${SLURM_JOB_ACCOUNT:-}
team=$account project=""
if [ -n "$account" ] && [ -r "$ACCOUNTS" ]; then
    while read -r acc t p _; do
        [ "$acc" = "$account" ] && { team=$t; project=${p:-}; break; }
    done < <(sed 's/#.*//' "$ACCOUNTS")
fi
# A control character in the comment (an escape, a ^A pasted from a terminal) separates words
# like a space does: it is never part of a team or project name.
comment=${comment//[[:cntrl:]]/ }
work=""
for word in ${comment//[,;]/ }; do
    case $word in
        project=*) project=${word#project=} ;;
        team=*) team=${word#team=} ;;
        work=*) work=${word#work=} ;;
    esac
done

[ -n "${SLURM_JOB_GPUS:-}${CUDA_VISIBLE_DEVICES:-}" ] || exit 0 # no GPU of this node: no cost
[ -n "$TOKEN" ] || fail "no GPUWARDEN_AGENT_TOKEN (set it in $ENV_FILE)"

uuids=$(job_gpu_uuids) ||
    fail "could not map GPUs ${SLURM_JOB_GPUS:-$CUDA_VISIBLE_DEVICES} to UUIDs with $NVIDIA_SMI"
gpus=""
while read -r u; do
    [ -n "$u" ] && gpus="${gpus:+$gpus,}$(json_str "$u")"
done <<< "$uuids"

exclusive=true
[ -n "${SLURM_SHARDS_ON_NODE:-}" ] && exclusive=false
[ "${GPUWARDEN_SLURM_SHARED_GPUS:-no}" = yes ] && exclusive=false

labels="\"partition\":$(json_str "${SLURM_JOB_PARTITION:-}")"
[ -n "${SLURM_CLUSTER_NAME:-}" ] && labels+=",\"cluster\":$(json_str "$SLURM_CLUSTER_NAME")"
[ -n "$job_name" ] && labels+=",\"name\":$(json_str "$job_name")"
[ -n "$account" ] && labels+=",\"account\":$(json_str "$account")"
[ -n "$work" ] && labels+=",\"work\":$(json_str "$work")"
if [ "${GPUWARDEN_SLURM_SCRIPT_HASH:-no}" = yes ] && [ -n "${SLURM_JOB_ID:-}" ]; then
    # An salloc has no batch script: no hash, and its runs compare by name and shape alone.
    sha=$(timeout -k 1 1 scontrol write batch_script "$SLURM_JOB_ID" - 2>/dev/null | sha256sum)
    sha=${sha%% *}
    # sha256 of nothing: no script was written (an allocation, or scontrol failed).
    [ "$sha" != e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 ] &&
        [ -n "$sha" ] && labels+=",\"script_sha256\":\"$sha\""
fi
body=$(printf '{"id":%s,"user":%s,"team":%s,"project":%s,"labels":{%s},"gpus":[%s],"started_at":"%s","exclusive":%s}' \
    "$(json_str "$JOB")" "$(json_str "${SLURM_JOB_USER:-}")" "$(json_str "$team")" \
    "$(json_str "$project")" "$labels" "$gpus" "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$exclusive")

# The token goes in through --config on stdin, never on the command line (ps shows that).
# No --fail-with-body (curl 7.76+; RHEL 8 ships 7.61): the status code is read with -w.
out=$(printf 'header = "Authorization: Bearer %s"\n' "$TOKEN" |
    curl -sS --config - --connect-timeout "$(($(left) > 2 ? 2 : $(left)))" --max-time "$(left)" \
        -X POST "$URL/api/v1/jobs" -H "Content-Type: application/json" --data "$body" \
        -w '\n%{http_code}' 2>&1)
code=${out##*$'\n'}
case $code in
    2??) exit 0 ;;
    *) fail "HTTP $code $(tr '\n' ' ' <<< "${out%$'\n'*}" | cut -c1-300)" ;;
esac
