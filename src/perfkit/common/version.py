"""perfkit's version, in a leaf module: the modules that record it (bundle meta, shard
manifests) read it here, never from the root package (whose API sits above every layer)."""

__version__ = "0.1.0"
