"""Scale-out: the suite's launches as units of work, CI partitions, shard merging, executors
(in process; Ray with ``perfkit[ray]``). See docs/scale-out.md."""
