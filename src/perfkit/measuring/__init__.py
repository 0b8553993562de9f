"""The measuring layer: one engine launch measured -> its rows and samples (launch_rows,
assemble (with shared launches), progress, profiled (with memory sites); nothing here names an investigation.
"""
