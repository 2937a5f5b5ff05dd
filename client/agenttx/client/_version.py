"""The client distribution's version, as installed (one source: client/pyproject.toml)."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("agenttx-client")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0+unknown"
