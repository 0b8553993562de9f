"""Engines: how to start one (:mod:`~perfkit.engine.spec`), under which memory caps
(:mod:`~perfkit.engine.caps`), its launch (:mod:`~perfkit.engine.launch`), the running engine,
its teardown and what a launch raises (:mod:`~perfkit.engine.handle`), the processes started
(:mod:`~perfkit.engine.owner`) and its HTTP client (:mod:`~perfkit.engine.client`)."""
