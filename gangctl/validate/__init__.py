"""Checks of the simulator against the real control plane (`gangctl sim-check`).

`gangctl.sim` never imports Kubernetes code; this package is the cluster side: it submits a
scenario slice as TrainJobs (`gangctl.sim.replay`), measures what the real controller and scheduler
did, and sets it beside a simulation of the same slice.
"""
