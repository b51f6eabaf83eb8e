"""Errors of `latte deploy`."""


class DeployError(ValueError):
    """An input to a deployment is wrong; the message names it and what was expected."""


class ManifestInvalid(DeployError):
    """A rendered manifest does not match its API schema; the message names file, kind and field."""
