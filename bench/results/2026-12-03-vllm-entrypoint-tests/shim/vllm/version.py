# the served program's own version: minipaged's /version answers minipaged's, as vLLM's answers vLLM's
from importlib.metadata import version

__version__ = version("minipaged")


def _prev_minor_version():
    major, minor, *_ = __version__.split(".")
    return f"{major}.{max(int(minor) - 1, 0)}"
