"""The callbacks that turn knobs while training, each fed only by the step stream's steps and windows: GPU
settings held for the run (:mod:`~dtpo.session.tuning.gpu_knobs`), the power and clock tuner on this rank's GPUs
(:mod:`~dtpo.session.tuning.power`), per-window slack of every rank (:mod:`~dtpo.session.tuning.slack`) and
per-rank slowdown of ranks that only wait (:mod:`~dtpo.session.tuning.stragglers`), and the job knobs precision,
accumulation and compression (:mod:`~dtpo.session.tuning.job_knobs`, which also needs the Session's switches).
"""
