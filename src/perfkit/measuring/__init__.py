"""One engine launch measured -> its rows and samples (launch_rows, assemble, progress,
profiled); nothing here names an investigation."""
