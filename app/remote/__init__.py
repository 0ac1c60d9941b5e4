"""The team library on S3 storage: push, pull and verify a remote (docs/remote-format.md)."""
