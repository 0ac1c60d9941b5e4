"""Keeping a library and an engine healthy: fsck and repair, recompaction, doctor, selftest and its
recorded outcomes."""
