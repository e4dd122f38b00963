"""Integrations of rocjit's ops into libraries nobody here wrote (import the one you need:
``rocjit.integrations.transformers``)."""
