"""The planner: how a data-parallel job scales to many GPUs and nodes before anyone rents them. A scenario
(:mod:`~dtpo.plan.scenario`, read by :mod:`~dtpo.plan.scenario_reader`) names the hardware and the job; the link
catalogue, alpha-beta collectives and DDP bucket overlap give communication; calibration from measured runs gives
compute; power at scale gives energy and cost; :mod:`~dtpo.plan.predict` predicts each GPU count and picks the
cheapest configuration.
"""
