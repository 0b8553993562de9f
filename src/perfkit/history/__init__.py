"""Performance history across commits: the store (parquet files read by DuckDB), importers
(perfkit runs, sglang's nightly comparisons), change points (Apache Otava's E-Divisive),
the history gate and the data behind the offline site (rendered by perfkit.report)."""
