"""Scale-out: the suite's launches as units of work, CI partitions, shard merging, executors.

The in-process executor is the default; ``perfkit[ray]`` adds a Ray executor. See
docs/scale-out.md.
"""
