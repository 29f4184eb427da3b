"""Model parallelism inside a worker: a model's stages over a device axis
(`pipeline`)."""
