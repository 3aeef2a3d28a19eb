"""Object-store I/O: buckets as fsspec stores, verified reading, the run (publish and
materialize), replay, audit, attachments and the trainer's state objects."""
