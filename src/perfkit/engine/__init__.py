"""Engines: how to start one (:mod:`~perfkit.engine.spec`), under which memory caps
(:mod:`~perfkit.engine.caps`), its launch and teardown (:mod:`~perfkit.engine.launch`) and its
HTTP client (:mod:`~perfkit.engine.client`)."""
