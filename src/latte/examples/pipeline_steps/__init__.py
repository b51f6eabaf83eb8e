"""Python-backend steps of the example text pipeline (each file is a Triton model.py)."""
