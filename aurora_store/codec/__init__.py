"""Byte codecs for delta blocks. They transform arrays to bytes and back and never see a store."""
