"""The service distribution's version, as installed (one source: pyproject.toml)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agenttx")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
