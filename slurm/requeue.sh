# Sourced by the job scripts. A job exits with status 3 when a signal (SLURM's SIGTERM before the
# time limit, --signal=TERM@120) stopped it after it saved a checkpoint. Then the batch job
# requeues itself: the same job id and run folder, so the next start resumes from that
# checkpoint, and a dependent job (afterok, e.g. phase 2) waits until the run has really ended.
# HVD_BERT_NO_REQUEUE=1 turns this off (the job then just fails with status 3).
requeue_if_stopped() {
    if [[ $1 == 3 && -n ${SLURM_JOB_ID:-} && ${HVD_BERT_NO_REQUEUE:-0} != 1 ]]; then
        echo "job $SLURM_JOB_ID: stopped before the end with a checkpoint; requeueing to resume"
        scontrol requeue "$SLURM_JOB_ID"
    fi
    if [[ $1 != 0 ]]; then exit "$1"; fi
}
