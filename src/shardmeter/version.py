"""The distribution's version, in the lowest layer so that reports can print it."""

__version__ = "0.1.0"
