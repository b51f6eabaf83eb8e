"""Self-healing: `latte serve` supervises every model it serves.

- `state`: the folder `latte serve` keeps outside the models' processes, and where each fact lives in it.
- `flight`: what an instance is running now (written by the model, read by the supervisor).
- `poison`: inputs that were in flight when a model crashed, counted across crashes.
- `checkpoint`: sessions' committed state, so a restarted model resumes them.
- `processes`, `policy`, `supervisor`, `health`: the supervisor itself and its endpoint.
"""
