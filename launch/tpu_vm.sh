#!/usr/bin/env bash
# Launch rljax on a Cloud TPU VM slice: every worker runs the same `rljax train` (SPMD),
# jax.distributed discovers the slice from the TPU metadata (RLJAX_DISTRIBUTED=1).
#
#   launch/tpu_vm.sh [options] COMMAND [args]
#
# Commands
#   create                    create the slice, or reuse it if it exists (--queued: through a
#                             queued resource, waiting until it is ACTIVE)
#   setup                     copy this checkout (or --git URL[@REF]) to every worker, install
#                             jax[tpu] and rljax there
#   train CONFIG [k=v ...]    create + setup + (--pre) + start `rljax train` on every worker, then
#                             stream worker 0's log; Ctrl-C kills the remote processes. A worker
#                             restarts its `rljax train` (which resumes) when it exits 75, a stop
#                             at a saved step after a SIGTERM to the trainer, unless the worker's
#                             launcher was signalled too (`stop`, the VM shutting down); this
#                             command exits 75 when worker 0's run ended that way: run it again
#                             to resume (after `delete` if the slice itself was preempted)
#   run CMD...                run a shell command on every worker
#   logs                      stream the training log of --worker (default 0)
#   stop                      kill the training processes on every worker
#   delete                    delete the slice (and its queued resource)
#
# Options (defaults from the environment variable in brackets)
#   --name NAME               TPU name                      [TPU_NAME]
#   --zone ZONE               zone                          [ZONE]
#   --project PROJECT         project (default: gcloud's)   [PROJECT]
#   --accelerator-type TYPE   e.g. v5litepod-16, v4-32       [ACCELERATOR_TYPE, v5litepod-16]
#   --version VERSION         TPU runtime                   [RUNTIME_VERSION, v2-alpha-tpuv5-lite]
#   --queued                  create through a queued resource named NAME-qr  [QUEUED=1]
#   --spot                    Spot capacity                 [SPOT=1]
#   --git URL[@REF]           clone on the workers instead of copying this checkout  [RLJAX_GIT]
#   --remote-dir DIR          code directory on the workers (default: rljax, under $HOME)
#   --pre CMD                 run CMD on every worker before training (repeatable)
#   --env KEY=VALUE           exported for the training processes (repeatable)
#   --no-setup                train without copying / installing again
#   --detach                  start training and return without streaming
#   --worker N                worker for `logs` (default 0)
#   --dry-run                 print every command instead of running it
set -euo pipefail

NAME="${TPU_NAME:-}"
ZONE="${ZONE:-}"
PROJECT="${PROJECT:-}"
ACCELERATOR_TYPE="${ACCELERATOR_TYPE:-v5litepod-16}"
RUNTIME_VERSION="${RUNTIME_VERSION:-v2-alpha-tpuv5-lite}"
QUEUED="${QUEUED:-0}"
SPOT="${SPOT:-0}"
GIT_SOURCE="${RLJAX_GIT:-}"
REMOTE_DIR="rljax"
DRY_RUN=0
SETUP=1
DETACH=0
WORKER=0
PRE=()
ENVS=()

usage() { sed -n '2,39p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "tpu_vm.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --accelerator-type) ACCELERATOR_TYPE="$2"; shift 2 ;;
    --version) RUNTIME_VERSION="$2"; shift 2 ;;
    --queued) QUEUED=1; shift ;;
    --spot) SPOT=1; shift ;;
    --git) GIT_SOURCE="$2"; shift 2 ;;
    --remote-dir) REMOTE_DIR="$2"; shift 2 ;;
    --pre) PRE+=("$2"); shift 2 ;;
    --env) ENVS+=("$2"); shift 2 ;;
    --no-setup) SETUP=0; shift ;;
    --detach) DETACH=1; shift ;;
    --worker) WORKER="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || { usage; exit 2; }
COMMAND="$1"; shift
[[ -n "$NAME" ]] || die "--name (or TPU_NAME) is required"
[[ -n "$ZONE" ]] || die "--zone (or ZONE) is required"

QR_NAME="${NAME}-qr"
PREEMPTED=75  # rljax's exit status after a SIGTERM stop at a saved step (rljax.cli.PREEMPTED_EXIT_CODE)
TMPFILES=()
cleanup() { [[ ${#TMPFILES[@]} -gt 0 ]] && rm -f "${TMPFILES[@]}"; true; }
trap cleanup EXIT
GFLAGS=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && GFLAGS+=(--project="$PROJECT")
REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# Paths on the workers (single-quoted where used locally, so $HOME expands remotely).
R_DIR="\$HOME/$REMOTE_DIR"
R_LOGS="\$HOME/rljax-logs"

# Print a command (shell-quoted) or run it.
run() {
  if [[ "$DRY_RUN" == 1 ]]; then
    printf '+'; printf ' %q' "$@"; printf '\n'
  else
    "$@"
  fi
}

ssh_all() { run gcloud compute tpus tpu-vm ssh "$NAME" "${GFLAGS[@]}" --worker=all --command "$1"; }
ssh_one() { run gcloud compute tpus tpu-vm ssh "$NAME" "${GFLAGS[@]}" --worker="$1" --command "$2"; }
scp_all() { run gcloud compute tpus tpu-vm scp "$1" "$NAME:$2" "${GFLAGS[@]}" --worker=all; }

cmd_create() {
  local spot=()
  [[ "$SPOT" == 1 ]] && spot=(--spot)
  if [[ "$QUEUED" == 1 ]]; then
    if [[ "$DRY_RUN" == 0 ]] && gcloud compute tpus queued-resources describe "$QR_NAME" "${GFLAGS[@]}" >/dev/null 2>&1; then
      echo "reusing queued resource $QR_NAME"
    else
      run gcloud compute tpus queued-resources create "$QR_NAME" "${GFLAGS[@]}" --node-id="$NAME" \
        --accelerator-type="$ACCELERATOR_TYPE" --runtime-version="$RUNTIME_VERSION" ${spot[@]+"${spot[@]}"}
    fi
    local state=""
    while [[ "$DRY_RUN" == 0 && "$state" != ACTIVE ]]; do
      state="$(gcloud compute tpus queued-resources describe "$QR_NAME" "${GFLAGS[@]}" --format='value(state.state)')"
      case "$state" in
        ACTIVE) ;;
        FAILED|SUSPENDED) die "queued resource $QR_NAME is $state" ;;
        *) echo "queued resource $QR_NAME: $state; waiting"; sleep 30 ;;
      esac
    done
  else
    if [[ "$DRY_RUN" == 0 ]] && gcloud compute tpus tpu-vm describe "$NAME" "${GFLAGS[@]}" >/dev/null 2>&1; then
      echo "reusing TPU VM $NAME"
    else
      run gcloud compute tpus tpu-vm create "$NAME" "${GFLAGS[@]}" \
        --accelerator-type="$ACCELERATOR_TYPE" --version="$RUNTIME_VERSION" ${spot[@]+"${spot[@]}"}
    fi
  fi
}

cmd_setup() {
  if [[ -n "$GIT_SOURCE" ]]; then
    local url="${GIT_SOURCE%@*}" ref=""
    [[ "$GIT_SOURCE" == *@* ]] && ref="${GIT_SOURCE##*@}"
    ssh_all "if [ -d $R_DIR/.git ]; then git -C $R_DIR fetch --all --tags; else git clone $(printf %q "$url") $R_DIR; fi${ref:+ && git -C $R_DIR checkout $(printf %q "$ref")}"
  else
    # This checkout's tracked and untracked-but-not-ignored files (no .venv, no runs).
    local tarball
    tarball="$(mktemp -t rljax-code.XXXXXX)"; TMPFILES+=("$tarball")
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "+ (cd $REPO_ROOT && git ls-files -co --exclude-standard | tar czf $tarball -T -)"
    elif git -C "$REPO_ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
      (cd "$REPO_ROOT" && git ls-files -co --exclude-standard | tar czf "$tarball" -T -)
    else
      tar czf "$tarball" -C "$REPO_ROOT" --exclude=.venv --exclude=.git --exclude=runs --exclude=__pycache__ .
    fi
    scp_all "$tarball" "rljax-code.tgz"
    ssh_all "rm -rf $R_DIR && mkdir -p $R_DIR && tar xzf \$HOME/rljax-code.tgz -C $R_DIR"
  fi
  ssh_all "python3 -m pip install --user --upgrade pip && python3 -m pip install --user -e \"$R_DIR[tpu]\""
}

cmd_stop() {
  # The training runs as its own process group (setsid); its leader's pid is in train.pid.
  ssh_all "if [ -f $R_LOGS/train.pid ]; then pg=\$(cat $R_LOGS/train.pid); kill -TERM -- -\$pg 2>/dev/null; for i in 1 2 3 4 5 6 7 8 9 10; do kill -0 -- -\$pg 2>/dev/null || break; sleep 1; done; kill -KILL -- -\$pg 2>/dev/null; rm -f $R_LOGS/train.pid; fi; true"
}

cmd_train() {
  [[ $# -ge 1 ]] || die "train needs a CONFIG (a path inside the repository)"
  cmd_create
  [[ "$SETUP" == 1 ]] && cmd_setup
  local pre
  for pre in "${PRE[@]+"${PRE[@]}"}"; do ssh_all "$pre"; done
  cmd_stop  # a previous run still holding the TPU would make this one fail

  # The per-worker launcher: environment + the exact rljax command, quoted once here.
  local script env_line
  script="$(mktemp -t rljax-run.XXXXXX)"; TMPFILES+=("$script")
  {
    echo '#!/usr/bin/env bash'
    echo "cd \"$R_DIR\""
    echo 'export RLJAX_DISTRIBUTED=1 PATH="$HOME/.local/bin:$PATH"'
    for env_line in "${ENVS[@]+"${ENVS[@]}"}"; do printf 'export %q\n' "$env_line"; done
    # exit 75: the run saved the step its processes agreed on after a SIGTERM; run it again (it resumes),
    # unless this shell was signalled too (a stop, the machine shutting down)
    echo "stopping=0; trap 'stopping=1' TERM INT HUP"
    echo 'while :; do'
    printf 'python3 -m rljax.cli train'; printf ' %q' "$@"; printf '\n'
    echo 'rc=$?'
    echo "[[ \$rc == $PREEMPTED && \$stopping == 0 ]] || break"
    echo "echo \"rljax train stopped at a saved step (exit $PREEMPTED): resuming\""
    echo 'done'
    echo "echo \$rc > \"$R_LOGS/train.rc\""
  } > "$script"
  if [[ "$DRY_RUN" == 1 ]]; then echo "# $script:"; sed 's/^/#   /' "$script"; fi
  ssh_all "mkdir -p $R_LOGS"
  scp_all "$script" "rljax-logs/run.sh"
  ssh_all "rm -f $R_LOGS/train.rc; nohup setsid bash -c 'echo \$\$ > $R_LOGS/train.pid; exec bash $R_LOGS/run.sh' > $R_LOGS/train.log 2>&1 < /dev/null &"
  [[ "$DETACH" == 1 ]] && { echo "started; stream with: $0 --name $NAME --zone $ZONE logs"; return 0; }

  trap 'echo; echo "interrupted: stopping the training on every worker"; cmd_stop; exit 130' INT TERM
  cmd_logs
  trap - INT TERM
  ssh_all "echo \"worker \$(hostname): exit status \$(cat $R_LOGS/train.rc 2>/dev/null || echo unknown)\""
  [[ "$DRY_RUN" == 1 ]] && return 0
  local rc
  rc="$(gcloud compute tpus tpu-vm ssh "$NAME" "${GFLAGS[@]}" --worker=0 --command "cat $R_LOGS/train.rc" 2>/dev/null || true)"
  if [[ "$rc" == "$PREEMPTED" ]]; then
    echo "tpu_vm.sh: the run stopped at a saved step after a SIGTERM (exit $PREEMPTED): the same command resumes it" >&2
    exit "$PREEMPTED"
  fi
}

cmd_logs() {
  # Follow the log until the training process group on that worker is gone.
  ssh_one "$WORKER" "while [ ! -f $R_LOGS/train.pid ]; do sleep 1; done; tail -n +1 --pid=\$(cat $R_LOGS/train.pid) -F $R_LOGS/train.log"
}

cmd_delete() {
  if [[ "$QUEUED" == 1 ]]; then
    run gcloud compute tpus queued-resources delete "$QR_NAME" "${GFLAGS[@]}" --force --quiet
  else
    run gcloud compute tpus tpu-vm delete "$NAME" "${GFLAGS[@]}" --quiet
  fi
}

case "$COMMAND" in
  create) cmd_create ;;
  setup) cmd_setup ;;
  train) cmd_train "$@" ;;
  run) [[ $# -ge 1 ]] || die "run needs a command"; ssh_all "$*" ;;
  logs) cmd_logs ;;
  stop) cmd_stop ;;
  delete) cmd_delete ;;
  *) die "unknown command $COMMAND (see --help)" ;;
esac
