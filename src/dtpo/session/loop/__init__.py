"""The parts of one optimizer step inside :class:`~dtpo.session.session.Session`: the marks that cut it
(:mod:`~dtpo.session.loop.timer` on a host or CUDA clock, :mod:`~dtpo.session.loop.clock`), the settings that can
change between steps (:class:`~dtpo.session.loop.switches.Switches`: precision, accumulation, compression) and the
probe passes that judge a new setting on a kept batch (:class:`~dtpo.session.loop.probe_steps.ProbeSteps`), the
accumulation re-cut of loader batches (:mod:`~dtpo.session.loop.rebatch`), the no-sync and FLOP-counting contexts of
a micro-step (:mod:`~dtpo.session.loop.micro_step`), a step's end handed over at once or with its window
(:mod:`~dtpo.session.loop.step_ends`), the divergence check and the peak FLOP/s that MFU is measured against
(:mod:`~dtpo.session.loop.mfu`).
"""
