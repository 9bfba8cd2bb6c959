"""The entry point PyInstaller builds the bundle's executable from (scripts/build-bundle): the
command of ``pvisor/__main__.py``, imported from the installed package (this file lives outside
the package so that the build analyses the installed code, not the checkout)."""

import pvisor.__main__  # noqa: F401  (runs the command, or a helper process: core/helpers.py)
