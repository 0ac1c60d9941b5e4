"""The runtime every use case stands on: paths, the model store, the engine runtime, errors in words, and
the one progress-and-cancel protocol."""
