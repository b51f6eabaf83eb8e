"""Latte's generator: render Triton model repositories from templates and check them."""
