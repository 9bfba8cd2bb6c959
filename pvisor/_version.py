"""The package version, a plain constant so that `pvisor --version` costs no metadata lookup."""

__version__ = "0.1.0"
