#!/usr/bin/env bash
# Run `rljax train` on a multi-host TPU slice in GKE with launch/gke/jobset.yaml.
#
#   launch/gke/submit.sh [options] train CONFIG [k=v ...]   submit, then stream host 0's log;
#                                                           Ctrl-C deletes the JobSet
#   launch/gke/submit.sh [options] logs | stop | render CONFIG [k=v ...]
#
# Options (defaults from the environment variable in brackets)
#   --name NAME             JobSet name                            [JOB_NAME, rljax-train]
#   --image IMAGE           image built from launch/gke/Dockerfile [IMAGE]  (required)
#   --bucket BUCKET         GCS bucket mounted at /runs            [GCS_BUCKET] (required)
#   --accelerator ACC       node selector gke-tpu-accelerator      [TPU_ACCELERATOR, tpu-v5-lite-podslice]
#   --topology TOPO         node selector gke-tpu-topology         [TPU_TOPOLOGY, 4x4]
#   --hosts N               pods (TPU hosts) in the slice          [NUM_HOSTS, 4]
#   --chips N               TPU chips per host                     [CHIPS_PER_HOST, 4]
#   --service-account KSA   Kubernetes service account with bucket access [SERVICE_ACCOUNT, default]
#   --max-restarts N        JobSet restarts before giving up        [MAX_RESTARTS, 3]
#   --dry-run               print the manifest and the kubectl commands, run nothing
# The run directory is /runs (trainer.default_local_dir=/runs is added to the overrides).
set -euo pipefail

export JOB_NAME="${JOB_NAME:-rljax-train}" IMAGE="${IMAGE:-}" GCS_BUCKET="${GCS_BUCKET:-}"
export TPU_ACCELERATOR="${TPU_ACCELERATOR:-tpu-v5-lite-podslice}" TPU_TOPOLOGY="${TPU_TOPOLOGY:-4x4}"
export NUM_HOSTS="${NUM_HOSTS:-4}" CHIPS_PER_HOST="${CHIPS_PER_HOST:-4}"
export SERVICE_ACCOUNT="${SERVICE_ACCOUNT:-default}" MAX_RESTARTS="${MAX_RESTARTS:-3}"
DRY_RUN=0
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

usage() { sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; }
die() { echo "submit.sh: $*" >&2; exit 2; }

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) JOB_NAME="$2"; shift 2 ;;
    --image) IMAGE="$2"; shift 2 ;;
    --bucket) GCS_BUCKET="$2"; shift 2 ;;
    --accelerator) TPU_ACCELERATOR="$2"; shift 2 ;;
    --topology) TPU_TOPOLOGY="$2"; shift 2 ;;
    --hosts) NUM_HOSTS="$2"; shift 2 ;;
    --chips) CHIPS_PER_HOST="$2"; shift 2 ;;
    --service-account) SERVICE_ACCOUNT="$2"; shift 2 ;;
    --max-restarts) MAX_RESTARTS="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) break ;;
  esac
done
[[ $# -ge 1 ]] || { usage; exit 2; }
COMMAND="$1"; shift
SELECTOR="jobset.sigs.k8s.io/jobset-name=$JOB_NAME,batch.kubernetes.io/job-completion-index=0"

run() {
  if [[ "$DRY_RUN" == 1 ]]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

render() {
  [[ $# -ge 1 ]] || die "a CONFIG is required"
  [[ -n "$IMAGE" ]] || die "--image (or IMAGE) is required"
  [[ -n "$GCS_BUCKET" ]] || die "--bucket (or GCS_BUCKET) is required: all hosts write one checkpoint"
  local cmd
  cmd="$(printf '%q ' python3 -m rljax.cli train "$@" trainer.default_local_dir=/runs)"
  # a YAML single-quoted scalar: double any single quote
  TRAIN_COMMAND="'${cmd//\'/\'\'}'" python3 -c '
import os, string, sys
print(string.Template(open(sys.argv[1]).read()).substitute(os.environ), end="")' "$HERE/jobset.yaml"
}

stop() { run kubectl delete jobset "$JOB_NAME" --ignore-not-found; }

logs() {
  run kubectl wait --for=condition=Ready pod -l "$SELECTOR" --timeout=60m
  run kubectl logs -f -l "$SELECTOR" --tail=-1
}

case "$COMMAND" in
  render) render "$@" ;;
  train)
    manifest="$(render "$@")"
    if [[ "$DRY_RUN" == 1 ]]; then
      echo "$manifest"; echo "---"; echo "+ kubectl apply -f - <<< (the manifest above)"
    else
      kubectl apply -f - <<< "$manifest"
    fi
    trap 'echo; echo "interrupted: deleting JobSet $JOB_NAME"; stop; exit 130' INT TERM
    logs
    ;;
  logs) logs ;;
  stop) stop ;;
  *) die "unknown command $COMMAND (see --help)" ;;
esac
