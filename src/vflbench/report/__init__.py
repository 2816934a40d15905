"""Reports built only from the tidy results of a sweep directory."""

from vflbench.report.build import build_report

__all__ = ["build_report"]
