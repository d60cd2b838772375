# Sourced by tp1.sh … tp8.sh and vllm_tp4_pp2.sh, from the repository root after `start="$PWD"`: the folders they
# read and write, and need_workloads, which checks (or regenerates) the paper workloads they predict.
# PIPEWEAVE_WORKLOAD_DIR: another workload folder, e.g. the paper set in vLLM's lm_head layout (README "Workload generator");
# it needs PIPEWEAVE_PRED_DIR too, since e2e/pipeweave_pred holds the predictions of the paper's own files that
# docs/E2E.md reports. Relative paths are taken from the folder the script was started in.
workload_dir=workload
pred_dir=e2e/pipeweave_pred

from_start() { realpath -m -- "$([[ "$1" = /* ]] && echo "$1" || echo "$start/$1")"; }

if [[ -n "${PIPEWEAVE_WORKLOAD_DIR:-}" && "$(from_start "$PIPEWEAVE_WORKLOAD_DIR")" != "$PWD/workload" ]]; then
  workload_dir="$(from_start "$PIPEWEAVE_WORKLOAD_DIR")"
  if [[ -z "${PIPEWEAVE_PRED_DIR:-}" ]]; then
    echo "$0: PIPEWEAVE_WORKLOAD_DIR is not workload/: give PIPEWEAVE_PRED_DIR too ($pred_dir holds the" \
         "predictions of the paper's own files, which docs/E2E.md reports)" >&2
    exit 2
  fi
fi
if [[ -n "${PIPEWEAVE_PRED_DIR:-}" ]]; then pred_dir="$(from_start "$PIPEWEAVE_PRED_DIR")"; fi
if [[ "$workload_dir" == *,* ]]; then  # it goes into the CSV of pairs below
  echo "$0: PIPEWEAVE_WORKLOAD_DIR may not contain a comma: $workload_dir" >&2
  exit 2
fi

need_workloads() {
  local w
  for w in "$@"; do
    if [[ -f "$workload_dir/$w.json" ]]; then continue; fi
    if [[ "$workload_dir" != workload ]]; then
      echo "$0: $workload_dir/$w.json is missing; write the paper set there with" \
           "python3 workload_generator.py --paper_set --lm_head LAYOUT --output_dir '$workload_dir'" >&2
      exit 2
    fi
    python3 workload_generator.py --paper_set
    return
  done
}
