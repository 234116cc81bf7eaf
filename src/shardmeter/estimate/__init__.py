"""The analytical core: formulas from specs and plans to times, bytes and costs.

One island: `compute`, `memory`, `comm` -> `step` (scalars or `PlanArrays`). Many islands:
`outer`, `wan`, `schedule`, `payload`, `churn` -> `islands`, whose `predict_topology` also
resolves a topology's preset names. Results are `result`'s dataclasses.
"""
