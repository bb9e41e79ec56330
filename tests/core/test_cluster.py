"""Launch checks read from the environment."""

import pytest

from hvd_bert.cluster.horovod import LaunchError, check_launch, check_world, slurm_hidden_from_mpi

STEP = {"SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "4"}


def test_plain_srun_with_several_tasks_is_explained():
    with pytest.raises(LaunchError, match=r"4 tasks but no MPI/PMIx wiring .*srun --mpi=pmix"):
        check_launch(STEP)


@pytest.mark.parametrize("wired", ["PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "HOROVOD_RANK"])
def test_wired_launches_pass(wired):
    check_launch({**STEP, wired: "1"})


def test_outside_slurm_or_one_task_passes():
    check_launch({})
    check_launch({**STEP, "SLURM_STEP_NUM_TASKS": "1"})


def test_a_multi_task_step_in_slurms_oci_containers_is_explained():
    """SLURM 22.05's `srun --container`: the step's variables, no SLURM_PROCID, no PMIx."""
    oci = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2", "SLURM_CONTAINER": "/b",
           "SLURM_NODELIST": "n[1-2]"}
    with pytest.raises(LaunchError, match=r"2 tasks in containers .*SLURM_PROCID.*scripts/container.sh exec"):
        check_launch(oci)


def test_a_one_task_job_without_wiring_hides_slurm_from_mpi_init_and_a_wired_one_does_not():
    one = {"SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "1", "SLURM_NODELIST": "n1", "SLURM_JOB_ID": "3",
           "HOME": "/root"}
    assert slurm_hidden_from_mpi(one) == ["SLURM_JOB_ID", "SLURM_NODELIST", "SLURM_STEP_ID",
                                          "SLURM_STEP_NUM_TASKS"]
    assert slurm_hidden_from_mpi({**one, "PMIX_RANK": "0"}) == []  # srun --mpi=pmix
    assert slurm_hidden_from_mpi({**one, "SLURM_STEP_NUM_TASKS": "2"}) == []  # check_launch's case
    assert slurm_hidden_from_mpi({"HOME": "/root"}) == []


def test_world_size_must_match_the_step():
    check_world(4, STEP)
    with pytest.raises(LaunchError, match="Horovod sees 1 rank"):
        check_world(1, STEP)


def test_horovod_env_from_the_config_and_the_users_own_variables_win():
    from hvd_bert.cluster.horovod import horovod_env, horovod_settings_line
    from hvd_bert.config import HorovodConfig

    cfg = HorovodConfig(fusion_threshold_mb=64, cycle_time_ms=0.5)
    assert horovod_env(cfg, env={}) == {"HOROVOD_FUSION_THRESHOLD": str(64 << 20),
                                        "HOROVOD_CYCLE_TIME": "0.5"}
    assert horovod_env(cfg, env={"HOROVOD_CYCLE_TIME": "3"}) == {"HOROVOD_FUSION_THRESHOLD": str(64 << 20)}
    assert horovod_env(HorovodConfig(), env={}) == {}
    assert horovod_settings_line({"HOROVOD_CYCLE_TIME": "3"}) == "horovod: HOROVOD_CYCLE_TIME=3"


def test_every_horovod_knob_is_a_setting(tmp_path):
    from hvd_bert.cluster.horovod import LaunchError, check_cpu_operations, horovod_env
    from hvd_bert.config import HorovodConfig

    tune, tl = str(tmp_path / "tune.csv"), str(tmp_path / "tl.json")
    cfg = HorovodConfig(cpu_operations="mpi", hierarchical_allreduce=True, autotune=True, autotune_log=tune,
                        timeline=tl)
    assert horovod_env(cfg, env={}) == {"HOROVOD_CPU_OPERATIONS": "mpi",
                                        "HOROVOD_HIERARCHICAL_ALLREDUCE": "1", "HOROVOD_AUTOTUNE": "1",
                                        "HOROVOD_AUTOTUNE_LOG": tune, "HOROVOD_TIMELINE": tl}
    off = HorovodConfig(hierarchical_allreduce=False)
    assert horovod_env(off, env={}) == {"HOROVOD_HIERARCHICAL_ALLREDUCE": "0"}
    gloo = {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "127.0.0.1", "HOROVOD_CPU_OPERATIONS": "gloo"}
    with pytest.raises(LaunchError, match="needs an MPI launch, but this job was started by horovodrun"):
        check_cpu_operations(cfg, gloo)
    check_cpu_operations(cfg, {"OMPI_COMM_WORLD_SIZE": "2"})
    with pytest.raises(LaunchError, match="under an MPI launch crashes Horovod 0.28.1"):
        check_cpu_operations(HorovodConfig(cpu_operations="gloo"), {"OMPI_COMM_WORLD_SIZE": "2"})
    check_cpu_operations(HorovodConfig(cpu_operations="gloo"), gloo)
    with pytest.raises(ValueError, match="train.horovod.autotune_log is set but train.horovod.autotune is "
                                         "false"):
        HorovodConfig(autotune_log="x.csv")


def test_the_placement_line_groups_consecutive_ranks_by_host():
    from hvd_bert.cluster.horovod import placement_line

    assert placement_line(["node1", "node1", "node2", "node2"]) == \
        "world: 4 ranks on 2 hosts: node1 ranks 0-1, node2 ranks 2-3"
    assert placement_line(["a"]) == "world: 1 rank on 1 host: a rank 0"
    assert placement_line(["a", "b", "a"]) == "world: 3 ranks on 2 hosts: a rank 0, b rank 1, a rank 2"


def test_the_launchers_cpu_defaults_fill_only_what_nobody_set():
    from hvd_bert.cluster.horovod import launcher_defaults
    from hvd_bert.config import HorovodConfig

    mpi, gloo = {"OMPI_COMM_WORLD_SIZE": "2"}, {"HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1"}
    assert launcher_defaults(None, {}) == launcher_defaults(HorovodConfig(), gloo) == \
        {"HOROVOD_CYCLE_TIME": "5"}
    assert launcher_defaults(None, mpi) == {"HOROVOD_CYCLE_TIME": "5", "HOROVOD_CPU_OPERATIONS": "mpi",
                                            "OMPI_MCA_mpi_yield_when_idle": "1"}
    assert launcher_defaults(None, {"PMIX_RANK": "0"})["HOROVOD_CPU_OPERATIONS"] == "mpi"  # srun --mpi=pmix
    assert launcher_defaults(HorovodConfig(cycle_time_ms=2), mpi) == {"HOROVOD_CPU_OPERATIONS": "mpi",
                                                                      "OMPI_MCA_mpi_yield_when_idle": "1"}
    own = {**mpi, "HOROVOD_CYCLE_TIME": "3", "OMPI_MCA_mpi_yield_when_idle": "0"}
    assert launcher_defaults(None, own) == {"HOROVOD_CPU_OPERATIONS": "mpi"}  # the user's own variables stay
    assert launcher_defaults(HorovodConfig(autotune=True), gloo) == {}  # autotune tunes the cycle
    assert launcher_defaults(None, {**gloo, "HOROVOD_ELASTIC": "1"}) == {}  # (see launcher_defaults)


def test_a_parents_defaults_are_not_taken_for_the_users_own(monkeypatch):
    """A process that initialised Horovod (hvd_bert's defaults in its environment) and then
    starts a job: the job's settings and its own launcher's defaults apply, not the parent's."""
    from hvd_bert.cluster import launch
    from hvd_bert.cluster.horovod import DEFAULTS_MARK, apply_horovod_env, horovod_env
    from hvd_bert.config import HorovodConfig

    parent = {"HOROVOD_CYCLE_TIME": "5", DEFAULTS_MARK: "HOROVOD_CYCLE_TIME=5"}
    assert horovod_env(HorovodConfig(cycle_time_ms=2.5), env=parent) == {"HOROVOD_CYCLE_TIME": "2.5"}
    assert horovod_env(HorovodConfig(cycle_time_ms=2.5), env={"HOROVOD_CYCLE_TIME": "5"}) == {}  # the user's
    env = launch.mpi_env({**parent, "HOROVOD_FUSION_THRESHOLD": "1"})
    assert "HOROVOD_CYCLE_TIME" not in env and DEFAULTS_MARK not in env
    assert env["HOROVOD_FUSION_THRESHOLD"] == "1"
    import os
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HOROVOD_", "OMPI_", "PMI"))}
    monkeypatch.setattr(os, "environ", {**clean, **parent})  # this process's environment, for the test
    assert apply_horovod_env(HorovodConfig(autotune=True)) == {"HOROVOD_AUTOTUNE": "1"}
    assert "HOROVOD_CYCLE_TIME" not in os.environ and DEFAULTS_MARK not in os.environ
    assert apply_horovod_env(None, cpu=True) == {"HOROVOD_CYCLE_TIME": "5"}
    assert os.environ[DEFAULTS_MARK] == "HOROVOD_CYCLE_TIME=5"
