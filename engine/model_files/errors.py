"""The one error of model files: what cannot be used, with a message naming the file and the problem."""
from __future__ import annotations


class ModelFileError(ValueError):
    """A model file or directory that cannot be used; the message names the problem."""
