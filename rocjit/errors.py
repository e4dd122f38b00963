"""Typed errors. Every message names what was wrong and what was expected."""
from __future__ import annotations

import re


class RocjitError(RuntimeError):
    pass


class PlatformError(RocjitError):
    """No usable GPU / driver / binding for the requested platform."""


class CompileError(RocjitError):
    """The vendor compiler rejected a source; shows the log and a numbered excerpt."""

    def __init__(self, log: str, source: str, filename: str = "<source>", target: str = "", compiler: str = ""):
        self.log, self.source, self.filename, self.target = log, source, filename, target
        super().__init__(self._format(log, source, filename, target, compiler))

    @staticmethod
    def first_error_line(log: str, filename: str):
        # only errors in the source itself: a line number inside an included header would point at the wrong text
        for pat in (rf"(?:^|[\s/]){re.escape(filename)}\((\d+)\): (?:catastrophic )?error",
                    rf"(?:^|[\s/]){re.escape(filename)}:(\d+):\d+: (?:fatal )?error"):
            m = re.search(pat, log, re.M)
            if m:
                return int(m.group(1))
        return None

    @classmethod
    def _format(cls, log, source, filename, target, compiler):
        head = f"compilation of {filename} for {target or '?'}" + (f" with {compiler}" if compiler else "") + " failed"
        parts = [head, "", (log or "<empty log>").rstrip()]
        line = cls.first_error_line(log or "", filename)
        if line is not None:
            lines = source.splitlines()
            lo, hi = max(1, line - 3), min(len(lines), line + 3)
            parts += ["", f"{filename} around line {line}:"]
            for i in range(lo, hi + 1):
                mark = ">>" if i == line else "  "
                parts.append(f"{mark}{i:5d} | {lines[i - 1]}")
        return "\n".join(parts)


class LaunchError(RocjitError):
    """A launch (or the kernel it started) failed; carries the vendor error name."""

    def __init__(self, message: str, error_name: str = ""):
        self.error_name = error_name
        super().__init__(f"{message}: {error_name}" if error_name else message)


class ArgumentError(TypeError, RocjitError):
    """A kernel argument does not match the kernel's parameter (named in the message)."""
