"""Planning: the hardware catalogue (and, later, calibrated compute, communication and power models)."""
