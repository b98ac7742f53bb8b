"""The consistency engines: one module per objective or problem class, one signature for all.

Each ``solve_*`` takes a scaled :class:`~dpopt.estimate.problem.ConsistencyProblem`, a backend
name, a time limit and options, and returns a certified :class:`~dpopt.estimate.result.Result`.
"""
