"""Launching: params.py (the ParamSpec every path packs by), general.py (checks, staging, the error messages),
fast.py (the generated Python launcher and the native one, rocjit/launcher.c)."""
