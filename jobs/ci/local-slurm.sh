#!/usr/bin/env bash
# A throwaway one-node Slurm cluster on this machine, to submit the scripts in jobs/slurm/ for real.
#
#   jobs/ci/local-slurm.sh test    start the cluster; submit test-cpu.sbatch, bench.sbatch and
#                                  multinode.sbatch (squeezed onto the one node, launched by
#                                  `srun --mpi=pmi2`); wait; check their states and outputs; stop
#                                  the daemons, whatever happened (make test-jobs runs this)
#   jobs/ci/local-slurm.sh start   start it and leave it running, for trying jobs by hand:
#                                  eval "$(jobs/ci/local-slurm.sh env)"; sbatch ...; squeue
#   jobs/ci/local-slurm.sh stop    cancel its jobs and stop its daemons (by the pids in their pid files)
#   jobs/ci/local-slurm.sh env     print the line that points sbatch, squeue and scontrol at it
#
# Installs Debian's slurm-wlm first when slurmctld is missing (root and apt-get needed). The
# cluster is auth/none (no munge), proctrack/linuxproc, task/none, no accounting, and one node
# with `nproc` CPUs (at least HPCCOLL_JOB_NP). Configuration, state, daemon logs and job outputs
# live under HPCCOLL_SLURM_DIR. Each start first stops what an earlier run left there and wipes
# its state, so running this again is safe.
#
# Environment:
#   HPCCOLL_SLURM_DIR   the cluster's folder (default: ${TMPDIR:-/tmp}/hpccoll-slurm)
#   HPCCOLL_SLURM_PORT  slurmctld's port; slurmd takes the next one (default: 16817, off Slurm's
#                       own 6817, so a site Slurm on the same machine is not disturbed)
#   HPCCOLL_JOB_NP      MPI ranks of each test job (default: 2)
#   HPCCOLL_JOB_WAIT    seconds to wait for all the test jobs to finish (default: 600)
#   HPCCOLL_VENV        the virtual environment the jobs use (default: .venv in this repository)
#   HPCCOLL_TESTS       what the test jobs' `make test-N` runs (default: a few files that cover the
#                       collectives, shm's node detection, plans and launching; `tests` for the whole
#                       suite, about 4.5 min per job on 2 CPUs, one job after the other)
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
DIR=${HPCCOLL_SLURM_DIR:-${TMPDIR:-/tmp}/hpccoll-slurm}
PORT=${HPCCOLL_SLURM_PORT:-16817}
NP=${HPCCOLL_JOB_NP:-2}
WAIT=${HPCCOLL_JOB_WAIT:-600}
NODE=$(hostname -s)
export SLURM_CONF=$DIR/slurm.conf
export PATH=$PATH:/usr/sbin:/sbin

say() { printf 'local-slurm: %s\n' "$*"; }

install_slurm() {
    local tool missing=0
    for tool in slurmctld slurmd sbatch; do
        command -v "$tool" >/dev/null || missing=1
    done
    [ "$missing" = 1 ] || return 0
    if [ "$(id -u)" != 0 ]; then
        say "slurmctld, slurmd or sbatch is missing; installing Debian's slurm-wlm needs root"
        exit 1
    fi
    say "installing Debian's slurm-wlm"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends slurm-wlm >/dev/null
}

write_config() {
    local cpus
    cpus=$(nproc)
    [ "$cpus" -ge "$NP" ] || cpus=$NP
    cat >"$SLURM_CONF" <<EOF
# Written by jobs/ci/local-slurm.sh: a throwaway one-node test cluster.
ClusterName=hpccoll-local
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$PORT
SlurmdPort=$((PORT + 1))
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$DIR/state
SlurmdSpoolDir=$DIR/spool
SlurmctldPidFile=$DIR/slurmctld.pid
SlurmdPidFile=$DIR/slurmd.pid
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
MinJobAge=3600
MailProg=/bin/true
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=local Nodes=ALL Default=YES MaxTime=60 State=UP
EOF
}

# The pid in $DIR/NAME.pid, when that process is still NAME (a stale file may name another process).
pid_of() {
    local pid
    pid=$(cat "$DIR/$1.pid" 2>/dev/null) || return 1
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$1" ] || return 1
    echo "$pid"
}

cancel_jobs() {
    local ids
    pid_of slurmctld >/dev/null || return 0
    ids=$(squeue -h -o %i 2>/dev/null) || return 0
    [ -n "$ids" ] || return 0
    say "cancelling jobs $(echo "$ids" | tr '\n' ' ')"
    # shellcheck disable=SC2086  # one argument per job id
    scancel $ids || true
    for _ in $(seq 30); do
        [ -z "$(squeue -h -o %i 2>/dev/null)" ] && return 0
        sleep 1
    done
}

# end NAME PID: SIGTERM, then SIGKILL if PID is still there 10 s later.
end() {
    say "stopping $1 (pid $2)"
    kill "$2" 2>/dev/null || true
    for _ in $(seq 20); do
        [ -d "/proc/$2" ] || return 0
        sleep 0.5
    done
    kill -9 "$2" 2>/dev/null || true
}

# slurmstepd processes of this cluster, which outlive slurmd when a job was not cancelled first;
# they carry its SLURM_CONF in their environment.
steps() {
    local proc
    for proc in /proc/[0-9]*; do
        [ "$(cat "$proc/comm" 2>/dev/null)" = slurmstepd ] || continue
        # (the step may exit meanwhile: the redirection's own error is silenced too)
        { tr '\0' '\n' <"$proc/environ"; } 2>/dev/null | grep -qxF "SLURM_CONF=$SLURM_CONF" || continue
        echo "${proc#/proc/}"
    done
}

stop() {
    local name pid
    cancel_jobs
    for name in slurmd slurmctld; do
        if pid=$(pid_of "$name"); then
            end "$name" "$pid"
        fi
        rm -f "$DIR/$name.pid"
    done
    for pid in $(steps); do
        end slurmstepd "$pid"
    done
}

start() {
    local name up
    install_slurm
    stop
    rm -rf "$DIR/state" "$DIR/spool" "$DIR/out"
    mkdir -p "$DIR/state" "$DIR/spool" "$DIR/out"
    write_config
    # Each daemon in a session of its own, so that a signal to this script's process group (Ctrl-C,
    # timeout) reaches only this script, whose trap then cancels the jobs before stopping them.
    # They write their pid files themselves.
    setsid slurmctld -D -c -f "$SLURM_CONF" </dev/null >"$DIR/slurmctld.log" 2>&1 &
    setsid slurmd -D -N "$NODE" -f "$SLURM_CONF" </dev/null >"$DIR/slurmd.log" 2>&1 &
    for _ in $(seq 60); do
        sleep 1
        up=1
        for name in slurmctld slurmd; do
            pid_of "$name" >/dev/null && continue
            up=0
            if [ -s "$DIR/$name.pid" ]; then
                say "$name exited at start; its log, $DIR/$name.log, ends:"
                tail -n 20 "$DIR/$name.log"
                return 1
            fi
        done
        if [ "$up" = 1 ] && [ "$(sinfo -h -o %t 2>/dev/null)" = idle ]; then
            say "up: node $NODE idle, $(sinfo -h -o %c) CPUs, SLURM_CONF=$SLURM_CONF"
            return 0
        fi
    done
    say "the cluster is not up after 60 s: $(sinfo -h -o '%t %E' 2>&1); the ends of its logs:"
    tail -n 20 "$DIR/slurmctld.log" "$DIR/slurmd.log"
    return 1
}

# "STATE EXITCODE RUNTIME" of a job, from scontrol (sacct needs slurmdbd, which this cluster lacks).
job_info() {
    local line
    line=$(scontrol -o show job "$1")
    printf '%s %s %s\n' "$(grep -o 'JobState=[A-Z_]*' <<<"$line" | cut -d= -f2)" \
        "$(grep -o ' ExitCode=[0-9:]*' <<<"$line" | cut -d= -f2)" \
        "$(grep -o 'RunTime=[0-9:-]*' <<<"$line" | cut -d= -f2)"
}

finished() {
    case $1 in
        PENDING | CONFIGURING | RUNNING | COMPLETING | SUSPENDED | REQUEUED | RESIZING | STAGE_OUT) return 1 ;;
        *) return 0 ;;
    esac
}

# check ID NAME WANT [AVOID [FILE]]: the job completed with exit code 0, a line of its log matches
# the regex WANT, none matches AVOID, and FILE (a result it writes) is not empty.
check() {
    local id=$1 name=$2 want=$3 avoid=${4:-} file=${5:-} state code runtime out ok=1
    read -r state code runtime < <(job_info "$id")
    out=$DIR/out/$name-$id.out
    say "job $id $name: $state, exit code $code, ran $runtime, log $out"
    [ "$state" = COMPLETED ] && [ "$code" = 0:0 ] || ok=0
    if ! grep -Eq -- "$want" "$out" 2>/dev/null; then
        say "job $id: no line of its log matches '$want'"
        ok=0
    fi
    if [ -n "$avoid" ] && grep -Eq -- "$avoid" "$out" 2>/dev/null; then
        say "job $id: its log has '$(grep -Em1 -- "$avoid" "$out")'"
        ok=0
    fi
    if [ -n "$file" ] && [ ! -s "$file" ]; then
        say "job $id: $file is missing or empty"
        ok=0
    elif [ -n "$file" ]; then
        say "job $id: wrote $file ($(wc -c <"$file") bytes)"
    fi
    if [ "$ok" = 1 ]; then
        PASSED=$((PASSED + 1))
    else
        FAILED=$((FAILED + 1))
        say "the end of $out:"
        tail -n 30 "$out" 2>/dev/null || true
    fi
}

run_test() {
    local test_id bench_id multi_id id state deadline all_done
    start
    trap stop EXIT
    trap 'exit 130' INT
    trap 'exit 143' TERM
    cd "$REPO"
    export HPCCOLL_VENV=${HPCCOLL_VENV:-$REPO/.venv} HPCCOLL_RESULTS=$DIR/out
    export HPCCOLL_TESTS=${HPCCOLL_TESTS:-tests/test_reductions.py tests/test_all_gather.py tests/test_shm.py tests/test_plan.py tests/test_launch.py}
    local sub=(sbatch --parsable --chdir="$REPO" --output="$DIR/out/%x-%j.out")
    test_id=$("${sub[@]}" --ntasks="$NP" jobs/slurm/test-cpu.sbatch)
    bench_id=$("${sub[@]}" --ntasks="$NP" jobs/slurm/bench.sbatch)
    multi_id=$("${sub[@]}" --nodes=1 --ntasks-per-node="$NP" \
        "--export=ALL,HPCCOLL_LAUNCHER=srun --mpi=pmi2" jobs/slurm/multinode.sbatch)
    say "submitted test-cpu.sbatch as job $test_id, bench.sbatch as $bench_id, multinode.sbatch as $multi_id"
    deadline=$((SECONDS + WAIT))
    while :; do
        all_done=1
        for id in "$test_id" "$bench_id" "$multi_id"; do
            read -r state _ < <(job_info "$id")
            finished "$state" || all_done=0
        done
        [ "$all_done" = 1 ] && break
        if [ "$SECONDS" -ge "$deadline" ]; then
            say "the jobs have not all finished after $WAIT s:"
            squeue
            say "0 passed, 3 failed"
            exit 1
        fi
        sleep 2
    done
    PASSED=0 FAILED=0
    check "$test_id" hpccoll-test '[0-9]+ passed' '[0-9]+ (failed|errors?)'
    check "$bench_id" hpccoll-bench '[^[:space:]]' '' "$DIR/out/bench-quick-$bench_id.json"
    check "$multi_id" hpccoll-multinode '[0-9]+ passed' '[0-9]+ (failed|errors?)'
    trap - EXIT
    stop
    say "$PASSED passed, $FAILED failed"
    [ "$FAILED" = 0 ]
}

case ${1:-} in
    test) run_test ;;
    start) start ;;
    stop) stop ;;
    env) echo "export SLURM_CONF=$SLURM_CONF" ;;
    *)
        echo "usage: $0 test|start|stop|env" >&2
        exit 2
        ;;
esac
