"""Test infrastructure other projects (and this one's tests) reuse: a moto S3 server, an
object-store contract suite, free ports, and damage that only tests may do to a store."""
