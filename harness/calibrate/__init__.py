"""The simulator's calibration stage: fit it to real runs, check it against held-out runs, ask it what-ifs.

It sits above :mod:`harness.runs` because it needs both ends: the fit reads stored run directories
(:mod:`harness.store`, :mod:`harness.results`) and validation re-runs a scenario on the simulator
(:mod:`harness.runs`). What the simulator applies at run time -- the calibration file and the time
model -- stays in :mod:`harness.sim`.

Modules, by job:

* :mod:`.fit` -- ``kvbench sim calibrate``: run directories in, a calibration file out, step by step; its
  inputs come from :mod:`.samples` (what a run directory holds) and its predictions and solver from :mod:`.model`.
* :mod:`.engine_steps` -- the engine's steps rebuilt from a sweep's token arrival times (used by the fit).
* :mod:`.holdout` -- the held-out error of every shipped calibration, refitted with this checkout's code.
* :mod:`.validate` -- ``kvbench sim validate``: a run's scenario re-run on the calibrated simulator, cell by cell.
* :mod:`.predict` -- the calibrated time model's TTFT per cell of a probe run, stored for reports.
* :mod:`.whatif` -- ``kvbench sim whatif``: turn-2 TTFT against tier read bandwidth.
* :mod:`.fleet_whatif` -- ``kvbench sim fleet-whatif``: routing policies over simulated replicas.
"""
