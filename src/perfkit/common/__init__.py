"""Leaf modules that both perfkit and its reference engine (:mod:`perfkit.refengine`) may import:
LTX frame rules, the per-request record format, the reference engine's presets, provenance.
They import nothing else from perfkit."""
