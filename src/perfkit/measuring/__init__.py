"""The measuring layer: one engine launch measured -> its rows and samples.

Between :mod:`perfkit.engine` / :mod:`perfkit.readings` (below) and :mod:`perfkit.scenarios`,
:mod:`perfkit.ab` (above): launch_rows.py (:func:`~perfkit.measuring.launch_rows.measure_launch`,
:class:`~perfkit.measuring.launch_rows.LaunchData`), assemble.py (launches -> a bundle; split parts
joined), reuse.py (a launch shared by several investigations), progress.py (per-launch and
per-request bars), profiled.py (the ``profile`` setting: profiled requests in an extra launch),
memsites.py (the ``snapshot`` setting: allocator snapshots -> the memory_sites table).
Nothing here names an investigation.
"""
