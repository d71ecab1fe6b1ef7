"""Stops an install on a Python older than localinfer supports, saying so (pip would
otherwise report only that numpy 2.4 cannot be found). The project is in pyproject.toml."""

import sys

from setuptools import setup

if sys.version_info < (3, 11):
    sys.exit(f"localinfer needs Python 3.11 or newer, not {sys.version.split()[0]} — install it "
             "with python3.11 (Ubuntu 22.04: apt install python3.11 python3.11-venv)")
setup()
