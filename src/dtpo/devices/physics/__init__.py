"""GPU physics below the device layer: the datasheet catalogue, power specs, measured traces, GPU models.

Pure data and arithmetic (no devices, no knobs): the simulated GPU (:mod:`dtpo.devices.simulated`), the
simulated job (:mod:`dtpo.simulation`) and MFU (:mod:`dtpo.session.loop.mfu`) all read it.
"""
