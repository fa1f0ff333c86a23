"""Training jobs on simulated GPUs, in simulated time: one job description, three simulations of it.

A :class:`~dtpo.simulation.job.JobConfig` describes the job: GPU model (or a measured trace), workload, GPUs,
steps, noise, seed and stragglers. :mod:`~dtpo.simulation.data_parallel` runs it at one knob setting or over a
sweep (:class:`~dtpo.simulation.data_parallel.SimulatedJob`); :mod:`~dtpo.simulation.tuning` feeds the same
steps to dtpo's power tuner and judges its choice against a noise-free oracle;
:mod:`~dtpo.simulation.stragglers` lets per-rank slowdown pick a clock per rank while its stragglers come and go.
Every figure they return is simulated, never measured. The GPUs are :mod:`dtpo.devices.simulated`'s, set through
the same knob controller and journal as real ones.
"""
