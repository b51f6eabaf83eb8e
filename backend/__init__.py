"""The `latte` Triton backend: request parsing, batching, runtimes and responses.

Nothing here imports `triton_python_backend_utils`: the stub injects it at run time
and `model.py` passes it in, so these modules run and are tested outside tritonserver.
"""
