"""Engines: how to start one (:mod:`~perfkit.engine.spec`), under which memory caps
(:mod:`~perfkit.engine.caps`), its launch (:mod:`~perfkit.engine.launch`), the running engine and
its teardown (:mod:`~perfkit.engine.handle`), the processes started
(:mod:`~perfkit.engine.processes`), what a launch raises (:mod:`~perfkit.engine.errors`) and its
HTTP client (:mod:`~perfkit.engine.client`)."""
