"""Processes and machines: Horovod's initialisation and settings, launching, checks.

    horovod          hvd.init() with the horovod.* settings; the placement and settings lines
    launch           running a command under horovodrun / mpirun (tests, doctor, simulate)
    launcher         hvd-bert launch: a job on N ranks, its exit status, its errors once
    run_script       a user's script as one rank of hvd-bert launch (its lines whole)
    resources        what a launch needs of this machine: room for MPI's files, open-file descriptors
    processes        the MPI world of a preparation; ranks that stop together when one fails
    horovodrun       the ``horovodrun`` wrapper the README's commands use
    doctor           ``hvd-bert doctor``: the installation and the hosts, checked with real runs
    doctor_worker    what each rank of doctor's runs executes
    lock             the lock files: their pins and hashes, which one the set-up installed
    k8s              hvd-bert k8s render: a job as an MPIJob or a Trainer v2 TrainJob and its runtime
    allreduce_probe  the allreduce timings ``hvd-bert simulate --calibrate`` fits
    calibrate        fitting the cost model to allreduces measured here or across hosts
"""
