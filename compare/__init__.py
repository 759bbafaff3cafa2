"""Runs every backend as a subprocess and compares their run records. Imports no framework.

`check_twin` is the Python API (compare/api.py); the pytest plugin is compare/pytest_plugin.py.
"""

from compare.api import CompareError, Report, check_twin

__all__ = ["CompareError", "Report", "check_twin"]
